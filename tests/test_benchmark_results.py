"""The benchmarks' results: what ``common.write_results`` writes, the tables the scripts print,
every option's help, and RESULTS.md as exactly what ``benchmarks/results_md.py`` makes of the
committed ``benchmarks/results/*.json``."""
import argparse
import glob
import importlib
import json
import os
import re
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHMARKS = os.path.join(REPO, 'benchmarks')
for path in (REPO, BENCHMARKS):
  if path not in sys.path:
    sys.path.insert(0, path)

import common  # pylint: disable=g-import-not-at-top,wrong-import-position

SCRIPTS = ('round_throughput', 'end_to_end', 'startup', 'device_scaling', 'population_sharding',
           'heterogeneous_budgets', 'dropout_cost', 'vs_fedjax', 'vs_naive_vmap',
           'vs_torch_loop', 'profile_round', 'paired_checkouts', 'independent_table1')
FIELDS = ('benchmark', 'variant', 'command', 'commit', 'machine', 'date', 'setting', 'columns',
          'figures', 'notes')
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
  assert set(FIELDS) <= set(result)
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
