"""``python -m fedjax_gel.report``: one report over runs made by separate commands, equal to the
report of one command over the same runs; runs that cannot be compared are one-line errors."""
import io
import json
import pathlib
import subprocess
import sys

import pytest

from fedjax_gel import report as report_cli
from fedjax_gel.experiment import api, compare
from fedjax_gel.experiment import workdir as workdir_lib
from fedjax_gel.experiment import config_json
from fedjax_gel.experiment.config import ConfigError, make
from fedjax_gel.experiment.sweep import Sweep

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope='module')
def made(tiny_leaf_file, tmp_path_factory):
  """FedAvgCM (seeds 0, 1) and GeL (seeds 0, 1) made by two separate commands, and both
  algorithms made by one command (the reference)."""
  base = make(dataset='leaf', data_path=str(tiny_leaf_file), num_rounds=6, eval_every=2,
              clients_per_round=3, batch_size=2, budget_range=(1, 3), client_lr=0.1,
              target=0.5)
  root = tmp_path_factory.mktemp('compare')
  quiet = dict(out=io.StringIO(), err=io.StringIO(), plots=False)
  seeds = Sweep(seeds=[0, 1])
  api.run(base, str(root / 'cm'), seeds, **quiet)
  api.run(base.replace(algorithm='gel'), str(root / 'gel'), seeds, **quiet)
  api.run(base, str(root / 'both'), Sweep(seeds=[0, 1], algorithms=['fedavgcm', 'gel']),
          **quiet)
  return base, root


def tables(text):
  """The report's tables after its header (which names folders and the time)."""
  return text[text.index('\n| algorithm |'):]


@pytest.mark.slow
def test_separate_commands_give_the_report_of_one(made):
  _, root = made
  line = compare.compare([str(root / 'cm'), str(root / 'gel')], str(root / 'out'))
  assert line.startswith(f'report: {root / "out" / "report.md"} (4 runs from 2 folder(s)')
  text = (root / 'out' / 'report.md').read_text()
  assert text.startswith('# fedavgcm, gel on leaf (logistic)')
  assert '| `--algorithm` | fedavgcm, gel |' in text and '| `--seed` | 0, 1 |' in text
  assert '[../cm/seed0](../cm/seed0/config.json)' in text
  assert tables(text) == tables((root / 'both' / 'report.md').read_text())
  summary = json.loads((root / 'cm' / 'seed1' / 'summary.json').read_text())
  assert (summary['model'], summary['settings']['batch_size'], summary['settings']['server_lr'],
          summary['settings']['budget_range']) == ('logistic', 2, 1.0, [1, 3])


def test_the_command_line(made, capsys):
  _, root = made
  assert report_cli.main([str(root / 'cm'), str(root / 'gel'), '--out', str(root / 'cli')]) == 0
  assert (root / 'cli' / 'report.md').exists()
  assert report_cli.main([str(root / 'nowhere')]) == 2
  assert capsys.readouterr().err.strip() == f'error: {root / "nowhere"}: no such directory'
  assert report_cli.main([str(root / 'cm'), '--out', '']) == 2   # said 'error: : No such file'
  assert capsys.readouterr().err.strip() == ('error: --out is empty: name the folder for '
                                             'report.md and plots/')
  (root / 'file').write_text('')
  assert report_cli.main([str(root / 'cm'), '--out', str(root / 'file' / 'r')]) == 2
  assert capsys.readouterr().err.strip().startswith(f'error: --out={root / "file" / "r"}: cannot '
                                                    'make it (')


@pytest.mark.slow
def test_incomparable_duplicate_and_damaged_runs(made, tmp_path):
  base, root = made
  other = tmp_path / 'other'
  api.run(base.replace(target=0.6, num_rounds=2), str(other), out=io.StringIO(),
          err=io.StringIO())
  # runs of other rounds, cohorts or evaluations were compared (a paired "speedup" of runs of
  # 20 and 40 clients a round); the first setting that differs is named
  with pytest.raises(ConfigError, match=r'the runs differ in --num_rounds: 6 in .*, 2 in .*; a '
                     'report compares runs of the same data, model, cohort, rounds, '
                     'evaluations and target'):
    compare.compare([str(root / 'cm'), str(other)], str(tmp_path / 'r1'))
  with pytest.raises(ConfigError, match='the same run twice'):
    compare.compare([str(root / 'cm'), str(root / 'both')], str(tmp_path / 'r2'))
  # a run's files checked as the command that made it checks them (workdir.check_finished),
  # with a remedy the report can give: an edited record or summary was reported as it read
  leave = r'; leave the run out of the report, or train it again \(launch/run\.py --overwrite\)$'
  records, summary = (other / 'metrics.jsonl').read_text(), (other / 'summary.json').read_text()
  (other / 'metrics.jsonl').write_text(records.replace('"round": 0', '"round": 1', 1))
  with pytest.raises(ConfigError, match=r'metrics\.jsonl changed since the run finished .*' + leave):
    compare.compare([str(other)], str(tmp_path / 'r3'))
  (other / 'metrics.jsonl').write_text(records)
  edited = json.loads(summary)
  edited['final_accuracy'] = 0.99
  (other / 'summary.json').write_text(json.dumps(edited))
  with pytest.raises(ConfigError, match=r'summary\.json changed since the run finished .*' + leave):
    compare.compare([str(other)], str(tmp_path / 'r3'))
  (other / 'summary.json').write_text('{"final_acc')
  with pytest.raises(ConfigError, match=r'summary\.json is damaged \(unreadable or cut\)' + leave):
    compare.compare([str(other)], str(tmp_path / 'r3'))
  (other / 'summary.json').write_text(summary)
  config = json.loads((other / 'config.json').read_text())
  config['algorithm']['client_lr'] *= 2   # a setting edited by hand: the report would show it
  (other / 'config.json').write_text(json.dumps(config))
  with pytest.raises(ConfigError, match=r'config\.json: its settings changed since the run '
                     r'finished .*' + leave):
    compare.compare([str(other)], str(tmp_path / 'r3'))
  config['algorithm']['client_lr'] = 'abc'
  (other / 'config.json').write_text(json.dumps(config))
  with pytest.raises(ConfigError, match=r'config\.json: its settings changed since the run '
                     r'finished .*' + leave):
    compare.compare([str(other)], str(tmp_path / 'r3'))
  # a summary of a version that did not checksum the settings: config.json is read by type
  older = json.loads(summary)
  del older['settings_sha256']
  older['summary_sha256'] = workdir_lib.summary_sha256(older)
  (other / 'summary.json').write_text(json.dumps(older))
  with pytest.raises(ConfigError, match=r"config\.json: not a fedjax_gel config \(--client_lr: "
                     r"'abc' is not of type float\)"):
    compare.compare([str(other)], str(tmp_path / 'r3'))
  empty = tmp_path / 'empty'
  empty.mkdir()
  with pytest.raises(ConfigError, match='no finished run'):
    compare.compare([str(empty)], str(tmp_path / 'r4'))
  (empty / 'grid.json').write_text(json.dumps({}))
  with pytest.raises(ConfigError, match='a learning-rate grid'):
    compare.compare([str(empty)], str(tmp_path / 'r5'))
  assert not (tmp_path / 'r1').exists()   # nothing written for a refused report


@pytest.mark.slow
def test_runs_on_other_data_under_the_same_flags(made, leaf_writer, tmp_path):
  """Two runs of one data path whose file was rewritten between them (other examples, the same
  clients and shapes) are not compared; a config.json that is not an object is one line."""
  base, _ = made
  data = leaf_writer(tmp_path / 'data.json')
  c = base.replace(data_path=str(data), num_rounds=2)
  api.run(c, str(tmp_path / 'a'), out=io.StringIO(), err=io.StringIO())
  leaf_writer(data, seed=1)
  api.run(c.replace(seed=1), str(tmp_path / 'b'), out=io.StringIO(), err=io.StringIO())
  with pytest.raises(ConfigError, match=r'the runs were trained on different data '
                     r"\(data_sha256 '\w{12}' in .*a, '\w{12}' in .*b\)"):
    compare.compare([str(tmp_path / 'a'), str(tmp_path / 'b')], str(tmp_path / 'r'))
  assert not (tmp_path / 'r').exists()
  (tmp_path / 'b' / 'config.json').write_text('[1, 2]')
  with pytest.raises(ConfigError, match=r'config\.json: its settings changed since the run'):
    compare.compare([str(tmp_path / 'b')], str(tmp_path / 'r'))
  summary = json.loads((tmp_path / 'b' / 'summary.json').read_text())
  del summary['settings_sha256']   # as a version before the settings' checksum wrote it
  summary['summary_sha256'] = workdir_lib.summary_sha256(summary)
  (tmp_path / 'b' / 'summary.json').write_text(json.dumps(summary))
  with pytest.raises(ConfigError, match=r'config\.json: not a fedjax_gel config'):
    compare.compare([str(tmp_path / 'b')], str(tmp_path / 'r'))


def test_the_report_never_writes_into_a_run_or_a_command(made, tmp_path, capsys):
  """``--out`` at a command's work directory replaced its report.md and plots/ with another
  report; at a file it was a raw ``[Errno 17]``."""
  _, root = made
  before = (root / 'both' / 'report.md').read_text()
  (tmp_path / 'afile').write_text('x')
  run = root / 'cm' / 'seed0'
  for out, words in ((root / 'both', 'the folder of a run or of a command (runs.json)'),
                     (run, 'the folder of a run or of a command (config.json)'),
                     (tmp_path / 'afile', 'a file, not a folder'),
                     # inside a run: a report in its final checkpoint damaged it (not extendable)
                     (run / 'checkpoint-6' / 'new', f'inside {run}, the folder of a run'),
                     (run / 'plots', f'inside {run}, the folder of a run'),
                     (root / 'both' / 'somewhere' / 'deeper', f'inside {root / "both"}')):
    assert report_cli.main([str(root / 'cm'), str(root / 'gel'), '--out', str(out)]) == 2
    assert capsys.readouterr().err.strip().startswith(f'error: --out={out}: {words}')
  assert (root / 'both' / 'report.md').read_text() == before
  assert not (run / 'checkpoint-6' / 'new').exists() and not (root / 'both' / 'somewhere').exists()


@pytest.mark.slow
def test_the_command_lines_help_is_plain_text(capsys):
  """--help of both commands (-h for launch/run.py): their usage, without the docstrings'
  reST markup, and status 0."""
  with pytest.raises(SystemExit) as e:
    report_cli.main(['--help'])
  assert e.value.code == 0
  text = capsys.readouterr().out
  assert text.startswith('usage: python -m fedjax_gel.report') and '``' not in text
  launcher = subprocess.run([sys.executable, 'launch/run.py', '-h'], cwd=REPO, text=True,
                            capture_output=True, check=False)   # absl: no -h, --help exits 1
  assert launcher.returncode == 0, launcher.stderr
  assert launcher.stdout.startswith('Runs federated experiments: python launch/run.py '
                                    '--flagfile=') and '``' not in launcher.stdout


@pytest.mark.slow
def test_budget_files_are_compared_by_content(made, tmp_path):
  """Runs whose --client_budgets files hold the same budgets under other paths are compared
  (a moved file is the same input); the same path rewritten with other budgets is refused."""
  base, _ = made
  c = base.replace(budget_draw='per_client', num_rounds=2)
  budgets = [1, 2, 3] * 3
  quiet = dict(out=io.StringIO(), err=io.StringIO(), plots=False)
  for name, seed in (('a', 0), ('b', 1)):
    path = tmp_path / f'budgets_{name}.json'
    path.write_text(json.dumps(budgets[:8]))
    api.run(c.replace(client_budgets=str(path), seed=seed), str(tmp_path / name), **quiet)
  assert compare.compare([str(tmp_path / 'a'), str(tmp_path / 'b')],
                         str(tmp_path / 'r1')).startswith('report:')
  (tmp_path / 'budgets_a.json').write_text(json.dumps(budgets[1:9]))
  api.run(c.replace(client_budgets=str(tmp_path / 'budgets_a.json'), seed=2),
          str(tmp_path / 'c'), **quiet)
  with pytest.raises(ConfigError, match=r"the runs were trained on different client budgets "
                     r"\(client_budgets_sha256 '\w{12}' in .*a, '\w{12}' in .*c\)"):
    compare.compare([str(tmp_path / 'a'), str(tmp_path / 'c')], str(tmp_path / 'r2'))


def test_runs_of_a_dataset_this_process_does_not_know_are_read_back_and_compared():
  """A report of runs of a registered dataset, made by a process that did not register it:
  their settings are read back as the file holds them (both layouts of config.json)."""
  from fedjax_gel.data import registry as data_registry   # pylint: disable=g-import-not-at-top
  from fedjax_gel.spec import DatasetSpec, hparam   # pylint: disable=g-import-not-at-top
  import dataclasses   # pylint: disable=g-import-not-at-top

  @dataclasses.dataclass(frozen=True)
  class Own:
    spread: float = hparam(1.0, 'gone: a setting.')

  data_registry.register_dataset(DatasetSpec('gone', lambda d, hp: None, Own))
  try:
    saved = make(dataset='gone', spread=0.5).to_json()
  finally:
    data_registry.unregister('gone')
  c = config_json.read(saved)
  assert c.data.hparams.spread == 0.5 and c.flags()['spread'] == 0.5
  assert compare.comparable_flags(c)['spread'] == 0.5
  flat = {**saved, 'data': {k: v for k, v in saved['data'].items() if k != 'hparams'}}
  assert config_json.read(flat).data.dataset == 'gone'
  compare.check_comparable([c, c], ['ra', 'rb'], [{}, {}])


def test_runs_compare_without_the_settings_they_do_not_read_and_by_path_without_digests():
  """A setting neither run reads (--split_gap with LEAF Synthetic, recorded by an earlier
  version) does not keep them apart; a run of an earlier version, which records no digest of
  its data, is compared by its data path (other data was accepted)."""
  a = make(dataset='leaf_synthetic')   # an earlier version's flat data section held it
  b = config_json.read({**a.to_json(), 'data': {**config_json.flat_data(a.data), 'split_gap': 5}})
  compare.check_comparable([a, b], ['ra', 'rb'], [{'data_sha256': 'x'}, {'data_sha256': 'x'}])
  x = make(dataset='leaf', data_path='one.json')
  y = x.replace(data_path='two.json')
  compare.check_comparable([x, y], ['rx', 'ry'], [{'data_sha256': 'd'}, {'data_sha256': 'd'}])
  with pytest.raises(ConfigError, match=r'the runs differ in --data_path=one.json \(rx\) and '
                     r'--data_path=two.json \(ry\), and a run of an earlier version records no '
                     r'digest of its data'):
    compare.check_comparable([x, y], ['rx', 'ry'], [{'data_sha256': 'd'}, {}])
  compare.check_comparable([x, x], ['rx', 'ry'], [{'data_sha256': 'd'}, {}])
