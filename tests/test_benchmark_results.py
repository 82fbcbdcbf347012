"""The benchmarks' results: what ``common.write_results`` writes, the tables the scripts print,
every option's help, and RESULTS.md as exactly what ``benchmarks/results_md.py`` makes of the
committed ``benchmarks/results/*.json``."""
import argparse
import glob
import importlib
import json
import os
import re
import shlex
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(REPO, 'benchmarks')
for path in (REPO, BENCHMARKS):
  if path not in sys.path:
    sys.path.insert(0, path)

import common  # pylint: disable=g-import-not-at-top,wrong-import-position
import results_md  # pylint: disable=g-import-not-at-top,wrong-import-position

SCRIPTS = ('round_throughput', 'end_to_end', 'startup', 'device_scaling', 'population_sharding',
           'heterogeneous_budgets', 'dropout_cost', 'vs_fedjax', 'vs_naive_vmap',
           'vs_torch_loop', 'profile_round', 'paired_checkouts', 'independent_table1')
COMMIT = re.compile(r'^([0-9a-f]{7,40}(\+dirty)?|unknown)$')
COLUMNS = [common.Column('clients', 'clients', format='{:,}', get=lambda r: r['cohort']),
           common.Column('round_ms', 'round ms', 'ms', 'lower', '{:.2f}',
                         get=lambda r: r['round_s'] * 1e3),
           common.Column('speedup', 'speedup', 'x', 'higher', 'times'),
           common.Column('process_s', 'process s, 10 / 40 rounds', 's', 'lower', '{:.2f}',
                         join=' / ')]
ROWS = [{'cohort': 2000, 'round_s': 0.0123456, 'speedup': 12.4, 'process_s': [1.0, 2.5]},
        {'cohort': 20, 'round_s': 0.0004, 'speedup': 1.44, 'process_s': None}]


def test_write_results_writes_the_documented_fields_and_replaces_a_settings_file(tmp_path):
  plot = tmp_path / 'plot.png'
  plot.write_bytes(b'')
  path = common.write_results('bench', COLUMNS, ROWS, variant_name='cohorts=20,2000',
                              results_dir=str(tmp_path), setting='a line', notes='quiet',
                              plot=str(plot), command='python benchmarks/bench.py --x 1')
  assert path == str(tmp_path / 'bench-cohorts=20,2000.json')
  with open(path) as f:
    result = json.load(f)
  assert set(results_md.FIELDS) <= set(result)
  assert (result['benchmark'], result['variant'], result['command'], result['setting'],
          result['notes']) == ('bench', 'cohorts=20,2000', 'python benchmarks/bench.py --x 1',
                               'a line', 'quiet')
  assert COMMIT.match(result['commit']) and result['commit'] != 'unknown'   # this checkout
  assert re.match(r'^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$', result['date'])
  assert 'cores' in result['machine'] and 'JAX' in result['machine']
  assert result['figures'] == [
      {'clients': 2000, 'round_ms': pytest.approx(12.3456), 'speedup': 12.4,
       'process_s': [1.0, 2.5]},
      {'clients': 20, 'round_ms': pytest.approx(0.4), 'speedup': 1.44, 'process_s': None}]
  assert result['columns'][1] == {'field': 'round_ms', 'heading': 'round ms', 'unit': 'ms',
                                  'better': 'lower', 'format': '{:.2f}'}
  assert result['columns'][3]['join'] == ' / '
  assert result['plot'] == os.path.relpath(str(plot), BENCHMARKS)
  assert 'source' not in result   # only transcribed figures say where they came from
  common.write_results('bench', COLUMNS, ROWS[:1], variant_name='cohorts=20,2000',
                       results_dir=str(tmp_path), command='again')
  with open(path) as f:
    again = json.load(f)
  assert again['command'] == 'again' and len(again['figures']) == 1 and 'plot' not in again
  assert common.write_results('bench', COLUMNS, ROWS, results_dir='') is None
  assert common.results_path('bench', '', 'd') == os.path.join('d', 'bench.json')


def test_a_table_says_its_units_and_which_way_is_better():
  table = common.markdown_table(COLUMNS, common.figures(COLUMNS, ROWS))
  assert table.splitlines() == [
      'Higher is better: "speedup"; lower is better: "round ms", "process s, 10 / 40 rounds".',
      '',
      '| clients | round ms | speedup | process s, 10 / 40 rounds |',
      '|---:|---:|---:|---:|',
      '| 2,000 | 12.35 | 12x | 1.00 / 2.50 |',
      '| 20 | 0.40 | 1.4x | - |']
  # A table in a results file reads its columns from the file's specs.
  specs = [c.spec() for c in COLUMNS]
  assert common.markdown_table(specs, common.figures(COLUMNS, ROWS)) == table
  code = [{'field': 'kernel', 'heading': 'kernel', 'format': '`{}`', 'left': True}]
  assert common.markdown_table(code, [{'kernel': 'fusion.1'}, {'kernel': ''}]).splitlines()[1:] == [
      '|---|', '| `fusion.1` |', '|  |']
  assert common.format_value('not printed', '{:.2f}') == 'not printed'
  assert common.format_value(0.109, '{:+.1%}') == '+10.9%'
  assert common.format_value(3e-08, '{:.1e}') == '3.0e-08'


def test_the_variant_names_the_settings_not_at_their_defaults():
  p = argparse.ArgumentParser()
  p.add_argument('--cohorts', default='20,200')
  p.add_argument('--repeats', type=int, default=10)
  p.add_argument('--fuse_dots', default='auto')
  p.add_argument('--xla_layers', action='store_true')
  p.add_argument('--before')
  p.add_argument('--single', help=argparse.SUPPRESS)
  common.results_flags(p)
  variant = lambda *argv, **kw: common.variant(p, p.parse_args(argv), **kw)
  assert variant() == ''
  assert variant('--repeats', '30', '--notes', 'busy', '--results_dir', '/x') == ''
  assert variant('--fuse_dots', 'false', '--cohorts', '20,200') == 'fuse_dots=false'
  assert variant('--xla_layers', '--cohorts', '1000') == 'cohorts=1000+xla_layers'
  assert variant('--before', '/tmp/old wt', '--single', '3') == 'before=-tmp-old-wt'
  assert variant('--before', '/tmp/old', ignore=('before',)) == ''


class Parsed(Exception):
  pass


def script_variant(script: str, argv: list[str], monkeypatch) -> str:
  """The variant ``benchmarks/<script>.py argv`` names its results by (its ``common.variant``
  call right after parsing; nothing is measured)."""
  from benchmarks import common as package_common  # pylint: disable=g-import-not-at-top
  def caught(*args, **kwargs):
    raise Parsed(common.variant.__wrapped__(*args, **kwargs))
  caught.__wrapped__ = common.variant
  for module in {common, package_common}:
    monkeypatch.setattr(module, 'variant', caught)
  with pytest.raises(Parsed) as e:
    importlib.import_module(script).main(argv)
  monkeypatch.undo()
  return e.value.args[0]


def test_a_scripts_variant_is_its_settings(monkeypatch):
  assert script_variant('startup', ['--processes', '2', '--repeats', '3'], monkeypatch) == (
      'processes=2')
  assert script_variant('vs_torch_loop', ['--model', 'lstm', '--cohorts', '20', '--processes',
                                          '3'], monkeypatch) == 'cohorts=20+model=lstm'
  assert script_variant('paired_checkouts', ['--before', '/tmp/a', '--after', '.', '--clients',
                                             '20'], monkeypatch) == 'clients=20'


@pytest.mark.parametrize('script', SCRIPTS)
def test_every_option_of_a_benchmark_says_what_it_does(script, monkeypatch, capsys):
  seen = []
  add = argparse.ArgumentParser.add_argument

  def recording(self, *args, **kwargs):
    seen.append((args, kwargs.get('help')))
    return add(self, *args, **kwargs)

  monkeypatch.setattr(argparse.ArgumentParser, 'add_argument', recording)
  module = importlib.import_module(script)
  with pytest.raises(SystemExit) as e:
    module.main(['--help'])
  assert e.value.code == 0
  assert '--results_dir' in capsys.readouterr().out
  assert [args for args, said in seen if not said] == []


def test_results_md_is_what_the_committed_results_give():
  with open(os.path.join(BENCHMARKS, 'RESULTS.md')) as f:
    committed = f.read()
  assert committed == results_md.render(), (
      'benchmarks/RESULTS.md is not what benchmarks/results/*.json give: run '
      'python benchmarks/results_md.py')


def test_every_committed_result_has_the_fields_and_its_figures_their_columns():
  paths = sorted(glob.glob(os.path.join(BENCHMARKS, 'results', '*.json')))
  assert paths
  for path in paths:
    with open(path) as f:
      result = json.load(f)
    name = os.path.basename(path)[:-len('.json')]
    assert set(results_md.FIELDS) <= set(result), path
    assert name == result['benchmark'] + (f'-{result["variant"]}' if result['variant'] else '')
    assert COMMIT.match(result['commit']), (path, result['commit'])
    assert result.get('source', results_md.TRANSCRIBED) == results_md.TRANSCRIBED, path
    assert os.path.exists(os.path.join(BENCHMARKS, f'{result["benchmark"]}.py')), path
    for table in [result] + result.get('tables', []):
      fields = [c['field'] for c in table['columns']]
      assert len(set(fields)) == len(fields), path
      for c in table['columns']:
        assert c.get('better', '') in ('', 'higher', 'lower') and c['heading'], (path, c)
      for row in table['figures']:
        assert set(row) <= set(fields), (path, set(row) - set(fields))
    if result.get('plot'):
      assert os.path.exists(os.path.join(BENCHMARKS, result['plot'])), path


def test_running_a_transcribed_command_again_replaces_its_file(monkeypatch):
  """A committed result's command, run again, names its results the same: the new figures
  replace the old (a GPU's file leads with ``gpu+``, which ``write_results`` adds)."""
  for path in sorted(glob.glob(os.path.join(BENCHMARKS, 'results', '*.json'))):
    with open(path) as f:
      result = json.load(f)
    argv = shlex.split(result['command'])
    if '\n' in result['command'] or argv[:2] != ['python', f'benchmarks/{result["benchmark"]}.py']:
      continue   # not one of this script's commands (independent_table1's pair of commands)
    variant = script_variant(result['benchmark'], argv[2:], monkeypatch)
    gpu = result['variant'].startswith('gpu')
    assert ('+'.join(p for p in ('gpu' if gpu else '', variant) if p) == result['variant']), path
