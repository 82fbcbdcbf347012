"""Tests for launch/run.py as a command: bad input, outputs, and the shipped flag files.

Most commands run in this process (``cli.main``, what launch/run.py runs); a few start
launch/run.py itself, where the process is what is tested.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
from absl import flags

import helpers
from fedjax_gel.algorithms import registry
from fedjax_gel.core.backend import xla
from fedjax_gel.data import registry as data_registry
from fedjax_gel.experiment import cli, parsing
from fedjax_gel.experiment import config as config_lib
from fedjax_gel.experiment import report
from fedjax_gel.experiment.sweep import Sweep, expand

REPO = pathlib.Path(__file__).resolve().parents[2]


def process(*args):
  """launch/run.py as a new process."""
  return subprocess.run([sys.executable, 'launch/run.py', *args], cwd=REPO, text=True,
                        capture_output=True, check=False)


run = helpers.cli_run


def parsed(*args) -> list:
  """The validated configs of ``launch/run.py args``."""
  values = flags.FlagValues()
  cli.define_flags(values)
  parsing.parse(['run.py', *args], values)
  return expand(*cli.from_flags(values))


assert_one_line_error = helpers.assert_one_line_error


# Malformed LEAF files: name -> a change to a valid file's parsed JSON (returning a replacement
# or changing it in place).
def _set(d, key, value):
  d[key] = value


MALFORMED_LEAF = {
    'xy_mismatch': lambda r: _set(r['user_data']['u1'], 'y', r['user_data']['u1']['y'][:-1]),
    'ragged': lambda r: r['user_data']['u2']['x'][3].append(0.5),
    'float_label': lambda r: _set(r['user_data']['u0']['y'], 2, 1.5),
    'nan_feature': lambda r: _set(r['user_data']['u0']['x'][0], 0, None),
    'num_samples_type': lambda r: _set(r, 'num_samples', 12),
    'num_samples_wrong': lambda r: _set(r['num_samples'], 3, 11),
    'not_object': lambda r: [r],
    'missing_user': lambda r: r['user_data'].pop('u4'),
    'users_not_names': lambda r: _set(r, 'users', [['u0']]),
}
FLAGFILES = {
    'noflag': 'num_rounds=3\n',
    'spaced': '# a comment\n--num_rounds 3\n',
    'badvalue': '--dataset=leaf\n--num_rounds=three\n',
    'binary': b'\xff\xfe--num_rounds=3\n',
    'comment_after': '--dataset=leaf\n--num_rounds=3 # three rounds\n',
    'bare_include': '--flagfile\n',
    'includes_missing': '--num_rounds=3\n--flagfile=no_such.flags\n',
    'huge': '#' + 'x' * (1 << 20) + '\n',
}


@pytest.fixture(scope='module')
def paths(tmp_path_factory, tiny_leaf_file):
  d = tmp_path_factory.mktemp('cli')
  malformed = d / 'malformed.json'
  malformed.write_text('{"users": ["a"], "user_data": {')
  out = {'dir': d, 'data': str(tiny_leaf_file), 'malformed': str(malformed),
         'missing': str(d / 'missing.json')}
  for name, change in MALFORMED_LEAF.items():
    raw = json.loads(pathlib.Path(tiny_leaf_file).read_text())
    replaced = change(raw)
    out[name] = d / f'{name}.json'
    out[name].write_text(json.dumps(replaced if isinstance(replaced, list) else raw))
  twice = d / 'twice'   # a directory of two files holding the same users
  twice.mkdir()
  for name in ('a.json', 'b.json'):
    (twice / name).write_bytes(pathlib.Path(tiny_leaf_file).read_bytes())
  out['twice'] = twice
  split = d / 'split'   # LEAF's split output: train/ and test/
  for side in ('train', 'test'):
    (split / side).mkdir(parents=True)
    (split / side / 'a.json').write_bytes(pathlib.Path(tiny_leaf_file).read_bytes())
  out['split'] = split
  for name, text in FLAGFILES.items():
    out[name] = d / f'{name}.flags'
    write = out[name].write_bytes if isinstance(text, bytes) else out[name].write_text
    write(text)
  out['dangling'] = d / 'dangling'   # a link to a folder that does not exist
  out['dangling'].symlink_to(d / 'nowhere')
  out['circular'] = d / 'circular'   # a link to itself
  out['circular'].symlink_to(d / 'circular')
  out['loop'] = d / 'loop.flags'
  out['loop'].write_text(f'--num_rounds=3\n--flagfile={out["loop"]}\n')
  return out


LEAF = '--dataset=leaf --data_path={data} --clients_per_round=3'   # of its 8 clients
# (arguments, texts the error line must contain); {name} is filled from ``paths``.
BAD_INPUT = [
    ('--num_rounds=0', '--num_rounds'),
    ('--num_rounds=-3', '--num_rounds'),
    ('--budget_range=9,4', '--budget_range', 'a must not exceed b'),
    ('--budget_range=0,3', '--budget_range', 'at least 1'),
    ('--dataset=nope', '--dataset'),
    ('--algorithm=nope', '--algorithm'),
    ('--model=nope', '--model'),
    ('--dataset=leaf --data_path={missing}', '{missing}'),
    ('--dataset=leaf --data_path={malformed}', '{malformed}'),
    (f'{LEAF} --sample_with_replacement=false --clients_per_round=9', '--clients_per_round'),
    ('--no_such_flag=1', 'no_such_flag'),
    (f'{LEAF} --num_processes=2', '--num_processes=2', '--coordinator_address'),
    (f'{LEAF} --num_processes=2 --coordinator_address=127.0.0.1:1 --process_id=2', '--process_id=2'),
    ('--num_rounds=abc', '--num_rounds'),
    ('--client_lr=inf', '--client_lr must be a finite number'),
    ('--client_lr=1e39', '--client_lr', "float32's range"),
    ('--client_lr=1e-320', '--client_lr is 0 in float32'),   # passed as positive; nothing trained
    (f'{LEAF} --model=femnist_cnn', '--model=femnist_cnn does not take the examples of {data}',
     'expected images'),
    ('--workdir=', '--workdir is empty'),
    ('--workdir={dangling}', '--workdir={dangling} is a symbolic link to', 'does not exist'),
    ('--workdir={circular}', '--workdir={circular} is a symbolic link', 'loop of links'),
    ('--flagfile={missing}', '{missing}'),
    (f'{LEAF} --num_devices=4096', '--num_devices'),
    (f'{LEAF} --device_memory_gb=0.000001', '--dataset=leaf', 'more processes or devices'),
    (f'{LEAF} --device_memory_gb=-1', '--device_memory_gb'),
    ('--leaf_sample=niid', '--leaf_sample', 'only read with LEAF datasets'),
    (f'{LEAF} --leaf_fraction=0', '--leaf_fraction'),
    (f'{LEAF} --leaf_sample=niid --leaf_fraction=0.01', '{data}', 'no user left'),
    ('--data_path={data}', '--data_path'),
    (f'{LEAF} --budget_range=1,1000000000', '--budget_range', 'exceeds the int32 limit'),
    (f'{LEAF} --budget_range=1,1000000 --device_memory_gb=0.05', '--budget_range',
     'one client needs about'),
    (f'{LEAF} --workdir=/proc/no/such', '/proc/no/such'),
    (f'{LEAF} --seeds=1,x', '--seeds'),
    (f'{LEAF} --algorithm=gel,gel', '--algorithm'),
    (f'{LEAF} --algorithm=fedavg_gel --guess_policy=inf', '--guess_policy=inf', 'diverge'),
    (f'{LEAF} --algorithm=fedavg_gel --guess_proxy=zero', '--guess_proxy=zero', 'do nothing'),
    # FedNova's normaliser ||a_i||_1 (Lemma 1) covers zero-proxy guesses only
    (f'{LEAF} --algorithm=fednova_gel --guess_proxy=last_gradient', '--guess_proxy=last_gradient',
     'fednova_gel'),
    (f'{LEAF} --algorithm=fedyogi --server_optimizer=adam', '--server_optimizer=adam'),
    (f'{LEAF} --algorithm=fedavg --server_optimizer=fedadam', '--server_optimizer=fedadam',
     '--algorithm=fedadam'),
    (f'{LEAF} --algorithm=fedmax', '--algorithm=fedmax'),
    (f'{LEAF} --algorithm=feddyn,fedexp --server_lr=0.5', '--server_lr=0.5',
     '--algorithm=feddyn,fedexp sets its own server step'),
    (f'{LEAF} --server_lr_grid=1,2 --algorithm=fedexp', '--server_lr_grid',
     '--algorithm=fedexp sets its own server step'),
    ('--dataset=celeba --data_path={data}', '--image_dir'),
    ('--dataset=mnist --data_dir={dir}/no_tfds_here', 'mnist'),
    ('--dataset=shakespeare --data_path={data}', 'no user has both train and test'),
    ('--dataset=shakespeare --data_path={data} --split_gap=0', 'must be strings'),
    (f'{LEAF} --model=shakespeare_lstm', '--model=shakespeare_lstm'),
    (f'{LEAF} --partition=pachinko', '--partition=pachinko'),
    (f'{LEAF} --server_lr_grid=0.1,-1', '--server_lr_grid'),
    (f'{LEAF} --server_lr_grid=1 --client_lr_grid=0.1,0.1', '--client_lr_grid'),
    (f'{LEAF} --server_lr_grid=1,2 --algorithm=scaffold', '--algorithm=scaffold'),
    (f'{LEAF} --server_lr_grid=1,inf', '--server_lr_grid', 'finite'),
    (f'{LEAF} --server_lr_grid=1 --client_lr_grid=0.1,1e39', '--client_lr_grid', 'below 3e38'),
    # malformed LEAF JSON files
    ('--dataset=leaf --data_path={xy_mismatch}', '{xy_mismatch}', "user 'u1' has 12 samples in x "
     'but 11 in y'),
    ('--dataset=leaf --data_path={ragged}', '{ragged}', "user 'u2' has ragged"),
    ('--dataset=leaf --data_path={float_label}', '{float_label}', 'non-integer label 1.5'),
    ('--dataset=leaf --data_path={nan_feature}', '{nan_feature}', 'null, NaN or infinite'),
    ('--dataset=leaf --data_path={num_samples_type}', '{num_samples_type}',
     "'num_samples' must be a list of integers"),
    ('--dataset=leaf --data_path={num_samples_wrong}', '{num_samples_wrong}',
     "'num_samples' says 11 for user 'u3' but it has 12"),
    ('--dataset=leaf --data_path={not_object}', '{not_object}', 'expected a JSON object'),
    ('--dataset=leaf --data_path={missing_user}', '{missing_user}', "user 'u4' has no 'x'/'y'"),
    ('--dataset=leaf --data_path={users_not_names}', '{users_not_names}',
     "'users' must be a list of user names"),
    ('--dataset=leaf --data_path={twice}', 'b.json', "user 'u0' already appears in"),
    # flag files
    ('--flagfile={noflag}', '--flagfile={noflag} line 1', "'num_rounds=3' is not a flag"),
    ('--flagfile={spaced}', '--flagfile={spaced} line 2', "'--num_rounds 3' is not a flag"),
    ('--flagfile={badvalue}', '--num_rounds=three'),
    ('--flagfile={binary}', '--flagfile={binary}', 'not a text file'),
    ('--flagfile={loop}', '--flagfile={loop} includes itself'),
    ('--flagfile={comment_after}', '--flagfile={comment_after} line 2',
     '--num_rounds=3 # three rounds'),
    ('--flagfile={bare_include}', '--flagfile={bare_include} line 1',
     '--flagfile needs a file name'),
    ('--flagfile={includes_missing}', '--flagfile=no_such.flags (included by '
     '{includes_missing})', 'cannot be read', "a flag file's --flagfile is read from the current "
     'directory'),
    ('--flagfile={huge}', '--flagfile={huge}', 'larger than a flag file can be'),
    ('--flagfile=/dev/zero', '--flagfile=/dev/zero', 'larger than a flag file can be'),
    ('--flagfile={dir}', 'a directory, not a flag file'),
    (f'{LEAF} --process_id=5', '--process_id=5', 'must be 0 with --num_processes=1'),
    (f'{LEAF} --image_dir={{dir}}', '--image_dir is only read with --dataset=celeba'),
    # settings no run reads: they changed nothing, and config.json and report.md listed them
    (f'{LEAF} --algorithm=fedavg --client_momentum=0.5', '--client_momentum=0.5: '
     '--algorithm=fedavg does not read it (its clients take steps without momentum)'),
    (f'{LEAF} --fedprox_iid=true', '--fedprox_iid=True: --dataset=leaf does not read it'),
    (f'{LEAF} --power_d=5', '--power_d=5: read only with --client_selection=power_of_d'),
    (f'{LEAF} --server_momentum=0.5', '--server_momentum=0.5: --server_optimizer=sgd does not'),
    # epochs: the steps depend on the largest client (a traceback once the data was loaded)
    (f'{LEAF} --budget_unit=epochs --budget_range=1,100000000 --batch_size=1',
     '--budget_unit and --batch_size: a round of', 'exceeds the int32 limit'),
    ('--dataset=leaf --data_path=/dev/zero', '/dev/zero', 'not a regular file'),
    ('--dataset=leaf --data_path={split} --clients_per_round=3 --train_fraction=0.5',
     '--train_fraction=0.5: --data_path={split} holds train/ and test/',
     'leave --train_fraction at its default (0.9)'),
    (f'{LEAF} --compilation_cache={{data}}', '--compilation_cache', 'a file, not a folder'),
]


EARLIER_RUN = {   # what an earlier run left in the work directory (odd cases: with --overwrite)
    'config.json': b'{"algorithm": "fedavg"}', 'metrics.jsonl': b'{"round": 0}\n',
    'summary.json': b'{"status": "finished"}', 'checkpoint-5.msgpack': b'\x81\xa1a\x01',
    'plots/accuracy_rounds.png': b'\x89PNG'}


def earlier_run(workdir):
  for name, data in EARLIER_RUN.items():
    (workdir / name).parent.mkdir(parents=True, exist_ok=True)
    (workdir / name).write_bytes(data)


@pytest.fixture(scope='module')
def bad_runs(paths):
  """All bad-input commands; index -> (finished command, workdir or None). Even cases name a
  fresh work directory; odd ones one that holds an earlier run, with ``--overwrite``."""
  out = []
  for i, case in enumerate(BAD_INPUT):
    args = case[0].format(**paths).split()
    workdir = None
    if not any(a.startswith('--workdir=') for a in args):
      workdir = paths['dir'] / f'workdir{i}'
      args.append(f'--workdir={workdir}')
      if i % 2:
        earlier_run(workdir)
        args.append('--overwrite')
    out.append((run(*args), workdir))
  return out


@pytest.mark.parametrize('i', range(len(BAD_INPUT)), ids=[case[0] for case in BAD_INPUT])
def test_bad_input_is_one_line_and_nothing_is_written_or_lost(bad_runs, paths, i):
  proc, workdir = bad_runs[i]
  assert_one_line_error(proc, *(text.format(**paths) for text in BAD_INPUT[i][1:]))
  assert proc.stdout == ''
  if workdir is not None and i % 2:
    assert {str(p.relative_to(workdir)): p.read_bytes()
            for p in workdir.rglob('*') if p.is_file()} == EARLIER_RUN
  elif workdir is not None:
    assert not workdir.exists()


def test_several_processes_need_a_named_workdir(paths):
  """A default work directory is named by each process' clock: refused before anything."""
  proc = run('--dataset=leaf', f'--data_path={paths["data"]}', '--num_processes=2',
             '--process_id=1', '--coordinator_address=127.0.0.1:1')
  assert_one_line_error(proc, '--num_processes=2 needs --workdir')


@pytest.mark.parametrize('flag,texts', [
    ('--stderrthreshold=bogus', ['--stderrthreshold must be one of']),
    ('--logger_levels=jax:LOUD', ["Unknown level: 'LOUD'", '--logger_levels'])],
    ids=['stderrthreshold', 'logger_levels'])
@pytest.mark.slow
def test_a_bad_value_of_absls_own_logging_flags_is_one_line(paths, tmp_path, flag, texts):
  """launch/run.py also takes absl's logging flags, whose values absl checks itself."""
  proc = process('--dataset=leaf', f'--data_path={paths["data"]}', flag,
                 f'--workdir={tmp_path / "w"}')
  assert_one_line_error(proc, *texts)
  assert not (tmp_path / 'w').exists()


@pytest.mark.slow
def test_more_runs_than_the_open_file_limit_is_one_line_and_leaves_nothing(paths, tmp_path):
  """Each run's folder is locked (an open file each): past the process' limit, one line naming
  the limit, and none of the folders the command created is left."""
  limit = 256
  workdir = tmp_path / 'many'
  launch = ('import resource, runpy, sys; '
            f'resource.setrlimit(resource.RLIMIT_NOFILE, ({limit}, {limit})); '
            'sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name="__main__")')
  proc = subprocess.run(
      [sys.executable, '-c', launch, 'launch/run.py', '--dataset=leaf',
       f'--data_path={paths["data"]}', '--algorithm=fedavg', '--num_rounds=1',
       '--clients_per_round=3',
       f'--seeds={",".join(map(str, range(300)))}', f'--workdir={workdir}'],
      cwd=REPO, text=True, capture_output=True, check=False)
  assert_one_line_error(proc, f'--workdir={workdir}/seed', 'run folders locked',
                        f'(ulimit -n: {limit})', 'fewer --seeds')
  assert not workdir.exists()


@pytest.mark.slow
def test_compilation_cache_is_filled_once_and_changes_no_result(paths, tmp_path):
  cache = tmp_path / 'cache'
  common = ['--flagfile=launch/configs/quickstart.flags', '--dataset=leaf', '--algorithm=gel',
            f'--data_path={paths["data"]}', '--num_rounds=3', '--eval_every=1',
            '--clients_per_round=3', '--budget_range=1,2', f'--compilation_cache={cache}']
  first = process(*common, f'--workdir={tmp_path / "a"}')
  assert first.returncode == 0, first.stderr
  entries = sorted(p.name for p in cache.iterdir())
  assert entries   # the programs of the run
  second = process(*common, f'--workdir={tmp_path / "b"}')
  assert second.returncode == 0, second.stderr
  assert not any(w in second.stderr for w in ('arning', 'rror', 'Traceback')), second.stderr
  assert sorted(p.name for p in cache.iterdir()) == entries   # every program found, none new

  def metrics(run_dir):
    return [{k: v for k, v in json.loads(line).items() if k != 'elapsed_s'}
            for line in (run_dir / 'metrics.jsonl').read_text().splitlines()]
  assert metrics(tmp_path / 'b') == metrics(tmp_path / 'a')
  not_a_folder = tmp_path / 'file'
  not_a_folder.write_text('x')
  assert_one_line_error(process(*common, f'--workdir={tmp_path / "c"}',
                            f'--compilation_cache={not_a_folder}'), '--compilation_cache')
  assert not (tmp_path / 'c').exists()
  # the same folder from the environment, not asked for by a flag: the run goes on without it
  unasked = subprocess.run(
      [sys.executable, 'launch/run.py', *common[:-1], f'--workdir={tmp_path / "d"}'], cwd=REPO,
      text=True, capture_output=True, check=False,
      env={**os.environ, 'FEDJAX_GEL_COMPILATION_CACHE': str(not_a_folder)})
  assert unasked.returncode == 0, unasked.stderr
  assert (f'note: no compilation cache in {not_a_folder} (a file, not a folder); every program '
          'is compiled afresh') in unasked.stdout.splitlines()
  assert metrics(tmp_path / 'd') == metrics(tmp_path / 'a')


@pytest.mark.slow
def test_run_outputs_and_nothing_already_written_is_lost(paths, tmp_path):
  workdir = tmp_path / 'run'
  common = ['--flagfile=launch/configs/quickstart.flags', '--dataset=leaf',
            f'--data_path={paths["data"]}', '--num_rounds=3', '--eval_every=2',
            '--clients_per_round=3', '--budget_range=1,2', f'--workdir={workdir}']
  first = process(*common, '--algorithm=fedavg', '--target=0.01')   # the command itself
  assert first.returncode == 0, first.stderr
  assert 'Traceback' not in first.stderr and str(workdir) in first.stdout
  last = first.stderr.splitlines()[-1]   # the whole process by phase, the report included
  assert re.fullmatch(r'all runs: imports \S+ s, data \S+ s, compile \S+ s, train \S+ s, '
                      r'eval \S+ s, report \S+ s, total \S+ s', last), last

  config = json.loads((workdir / 'config.json').read_text())
  assert config['algorithm']['name'] == 'fedavg' and config['run']['num_rounds'] == 3
  assert config['cohort']['budget_range'] == [1, 2]
  assert config['cohort']['batch_size'] == 5  # from the flag file
  records = [json.loads(l) for l in (workdir / 'metrics.jsonl').read_text().splitlines()]
  assert [r['round'] for r in records] == [0, 2, 3]
  assert all(r['algorithm'] == 'fedavg' for r in records)
  grads = [r['grad_computations'] for r in records]
  assert grads[0] == 0 and grads == sorted(grads) and 3 * 3 <= grads[-1] <= 3 * 3 * 2
  summary = json.loads((workdir / 'summary.json').read_text())
  acc = [r['test_accuracy'] for r in records]
  assert summary['final_accuracy'] == acc[-1] and summary['best_accuracy'] == max(acc)
  assert summary['rounds_to_target'] == next(r['round'] for r in records
                                             if r['test_accuracy'] >= 0.01)

  assert '| fedavg | - | 1/1 |' in (workdir / 'report.md').read_text()   # the paired table
  if importlib.util.find_spec('matplotlib') is not None:   # an optional dependency ('.[plot]')
    assert sorted(p.name for p in (workdir / 'plots').iterdir()) == [
        'accuracy_gradients.png', 'accuracy_rounds.png', 'accuracy_upload.png',
        'train_loss_rounds.png']
  else:
    assert 'plots/ not written: matplotlib is not installed' in first.stdout

  before = {p.relative_to(workdir): p.read_bytes() for p in workdir.rglob('*') if p.is_file()}
  again = run(*common, '--algorithm=fedavgcm')
  assert_one_line_error(again, '--workdir', '--overwrite')
  assert {p.relative_to(workdir): p.read_bytes()
          for p in workdir.rglob('*') if p.is_file()} == before

  replaced = run(*common, '--algorithm=fedavg', '--seed=1', '--overwrite')
  assert replaced.returncode == 0, replaced.stderr
  assert json.loads((workdir / 'summary.json').read_text())['seed'] == 1
  assert (workdir / 'metrics.jsonl').read_bytes() != before[pathlib.Path('metrics.jsonl')]


@pytest.mark.slow
def test_grid_run_writes_its_grids_and_report(paths, tmp_path):
  workdir = tmp_path / 'grid'
  proc = run('--dataset=leaf', f'--data_path={paths["data"]}', '--algorithms=fedavgcm,gel',
             '--num_rounds=2', '--clients_per_round=3', '--budget_range=1,2',
             '--client_lr_grid=0.01,0.1', '--server_lr_grid=0.5,1,2', f'--workdir={workdir}')
  assert proc.returncode == 0, proc.stderr
  for name in ('fedavgcm', 'gel'):
    result = json.loads((workdir / name / 'grid.json').read_text())
    assert len(result['cells']) == 6 and result['algorithm'] == name
  text = (workdir / 'report.md').read_text()
  assert 'fedavgcm, seed 0: final test accuracy' in text and '`gel/plots/grid.png`' in text
  before = {p: p.read_bytes() for p in workdir.rglob('*') if p.is_file()}
  plain = run('--dataset=leaf', f'--data_path={paths["data"]}', '--algorithms=fedavgcm,gel',
              '--num_rounds=2', '--clients_per_round=3', '--budget_range=1,2',
              f'--workdir={workdir}')   # the same runs, not as grids: another configuration
  assert_one_line_error(plain, 'already holds a learning-rate grid')
  assert {p: p.read_bytes() for p in workdir.rglob('*') if p.is_file()} == before
  # a kill while a grid's heat map was written left its temporary copy: the next command goes
  (workdir / 'gel' / 'plots' / '.grid.png.ab12cd34.tmp').write_bytes(b'half a png')
  again = run('--dataset=leaf', f'--data_path={paths["data"]}', '--algorithms=fedavgcm,gel',
              '--num_rounds=2', '--clients_per_round=3', '--budget_range=1,2',
              '--client_lr_grid=0.01,0.1', '--server_lr_grid=0.5,1,2', f'--workdir={workdir}')
  assert again.returncode == 0, again.stderr
  assert not list(workdir.rglob('*.tmp'))


@pytest.mark.slow
def test_noplots_writes_the_reports_and_metrics_without_a_plot(paths, tmp_path):
  """--noplots: no ``plots/`` for a learning-rate grid's report (its curves and lr_grid.png) or
  a server-rate grid (grid.png), and neither report links one; the metrics are a plotted run's."""
  common = ['--dataset=leaf', f'--data_path={paths["data"]}', '--num_rounds=2',
            '--clients_per_round=3', '--budget_range=1,2', '--client_lr_grid=0.01,0.1']
  plotted, bare = tmp_path / 'plotted', tmp_path / 'bare'
  assert run(*common, f'--workdir={plotted}').returncode == 0
  proc = run(*common, f'--workdir={bare}', '--noplots')
  assert proc.returncode == 0, proc.stderr
  assert 'plots/' not in proc.stdout and not list(bare.rglob('*.png'))
  assert 'Plots:' not in (bare / 'report.md').read_text()
  assert 'Plots:' in (plotted / 'report.md').read_text() and (plotted / 'plots').is_dir()
  for metrics in bare.rglob('metrics.jsonl'):
    mine = [{k: v for k, v in json.loads(l).items() if k != 'elapsed_s'}
            for l in metrics.read_text().splitlines()]
    theirs = [{k: v for k, v in json.loads(l).items() if k != 'elapsed_s'}
              for l in (plotted / metrics.relative_to(bare)).read_text().splitlines()]
    assert mine == theirs and mine
  grid = tmp_path / 'grid'
  proc = run(*common, '--server_lr_grid=0.5,1', f'--workdir={grid}', '--noplots')
  assert proc.returncode == 0, proc.stderr
  assert 'plots/' not in proc.stdout and not list(grid.rglob('*.png'))
  assert 'Heat map' not in (grid / 'report.md').read_text()
  assert json.loads((grid / 'grid.json').read_text())['server_lrs'] == [0.5, 1.]


@pytest.mark.parametrize('flagfile', sorted((REPO / 'launch' / 'configs').glob('*.flags')),
                         ids=lambda p: p.name)
def test_shipped_flag_files_are_valid_configs(flagfile):
  assert parsed(f'--flagfile={flagfile}')


def test_paper_flag_files_hold_the_paper_settings():
  cm, gel = parsed(f'--flagfile={REPO / "launch/configs/gel_table1_synthetic.flags"}')
  cm, gel = cm.flags(), gel.flags()
  assert (cm['algorithm'], gel['algorithm']) == ('fedavgcm', 'gel')
  assert (gel['clients_per_round'], gel['batch_size'], gel['budget_range']) == (20, 5, (4, 13))
  assert (gel['client_lr'], gel['client_momentum'], gel['server_optimizer'],
          gel['server_lr']) == (0.01, 0.9, 'sgd', 1.0)
  assert (gel['guess_policy'], gel['guess_tau'], gel['eval_every'],
          gel['target']) == ('remaining', 18, 5, 0.85)


@pytest.mark.slow
def test_gel_synthetic_fedavgcm_setting_reaches_85_percent(tmp_path):
  """The engine's acceptance run: the GeL paper's Synthetic FedAvgCM setting, 300 rounds.

  The paper reports about 148 rounds to 85% test accuracy.
  """
  workdir = tmp_path / 'cm'
  proc = run('--flagfile=launch/configs/fedavgcm_synthetic.flags', '--num_rounds=300',
             '--noplots', f'--workdir={workdir}')
  assert proc.returncode == 0, proc.stderr[-2000:]
  summary = json.loads((workdir / 'summary.json').read_text())
  assert summary['best_accuracy'] >= 0.85
  assert summary['rounds_to_target'] is not None and summary['rounds_to_target'] <= 300


@pytest.mark.slow
def test_stateful_acceptance_runs_on_all_synthetic_clients(tmp_path):
  """Issue 5's acceptance: SCAFFOLD and AdaBest with state for all 1,000 LEAF Synthetic clients
  reach 85%; FedVARP keeps a memory for every client (1,000 rows of the 305-float model)."""
  workdir = tmp_path / 'st'
  proc = run('--flagfile=launch/configs/stateful_synthetic.flags', '--seeds=0',
             '--algorithm=scaffold,adabest,fedvarp', '--noplots', f'--workdir={workdir}')
  assert proc.returncode == 0, proc.stderr[-2000:]
  summaries = {name: json.loads((workdir / name / 'summary.json').read_text())
               for name in ('scaffold', 'adabest', 'fedvarp')}
  for name in ('scaffold', 'adabest'):
    assert summaries[name]['rounds_to_target'] is not None, summaries[name]
  assert summaries['fedvarp']['client_state_bytes'] == 1000 * 305 * 4


@pytest.mark.slow
def test_seeds_and_algorithms_run_paired_into_subdirectories(tmp_path, tiny_leaf_file):
  workdir = tmp_path / 'pair'
  proc = run('--dataset=leaf', f'--data_path={tiny_leaf_file}', '--algorithm=fedavgcm,gel',
             '--seeds=3,4', '--num_rounds=3', '--eval_every=3', '--clients_per_round=3',
             '--batch_size=2', '--budget_range=1,3', '--noplots', f'--workdir={workdir}')
  assert proc.returncode == 0, proc.stderr[-2000:]
  first = {}
  for seed in (3, 4):
    for name in ('fedavgcm', 'gel'):
      run_dir = workdir / f'seed{seed}' / name
      config = json.loads((run_dir / 'config.json').read_text())
      assert (config['algorithm']['name'], config['run']['seed']) == (name, seed)
      first[seed, name] = json.loads((run_dir / 'metrics.jsonl').read_text().splitlines()[0])
      assert f'{name} on leaf, seed {seed}' in proc.stdout
    # Same seed: the same initial model, so the same round-0 evaluation.
    assert first[seed, 'fedavgcm']['test_loss'] == first[seed, 'gel']['test_loss']
  assert first[3, 'gel']['test_loss'] != first[4, 'gel']['test_loss']
  assert '| fedavgcm | 3,4 |' in proc.stdout and '| gel | 3,4 |' in proc.stdout
  # compile_s and train_s are the program's own; phases_s the process's totals so far.
  cm, gel = (json.loads((workdir / 'seed3' / n / 'summary.json').read_text())
             for n in ('fedavgcm', 'gel'))
  # each of the three is rounded to the millisecond: the sum may exceed the total by 1.5 ms
  assert cm['compile_s'] + gel['compile_s'] <= gel['phases_s']['compile'] + 2e-3
  assert 0 < gel['compile_s'] < gel['phases_s']['compile']


# Every algorithm from the command line, in four commands (one test each, so that the test
# workers share them); logistic regression (cheaper to compile) for all but FedMAX, which needs
# a hidden layer; the differentially private ones with their clip (it applies to a command's
# every algorithm).
_PRIVATE = [a for a in registry.names() if registry.get(a).private]
_LOGISTIC = [a for a in registry.names() if a != 'fedmax' and a not in _PRIVATE]
ALGORITHM_GROUPS = {'first_half': ('logistic', _LOGISTIC[:len(_LOGISTIC) // 2], ()),
                    'second_half': ('logistic', _LOGISTIC[len(_LOGISTIC) // 2:], ()),
                    'fedmax': ('mlp', ['fedmax'], ()),
                    'private': ('logistic', _PRIVATE, ('--dp_clip_norm=1',))}


def test_the_groups_cover_every_algorithm():
  names = [a for _, group, _ in ALGORITHM_GROUPS.values() for a in group]
  assert sorted(names) == sorted(registry.names())


@pytest.mark.parametrize('group', sorted(ALGORITHM_GROUPS))
@pytest.mark.slow
def test_every_algorithm_runs_from_the_launcher(tmp_path, tiny_leaf_file, group):
  model, names, extra = ALGORITHM_GROUPS[group]
  proc = run('--dataset=leaf', f'--data_path={tiny_leaf_file}', '--num_rounds=2',
             '--eval_every=2', '--clients_per_round=3', '--batch_size=2', '--budget_range=1,3',
             '--server_lr=0.1', '--fedvarp_clusters=2', f'--model={model}', *extra,
             f'--algorithm={",".join(names)}', '--noplots', f'--workdir={tmp_path}')
  assert proc.returncode == 0, proc.stderr[-2000:]
  for name in names:
    run_name = name + ('_sgdm' if registry.get(name).run_name else '')
    run_dir = tmp_path / run_name if len(names) > 1 else tmp_path
    summary = json.loads((run_dir / 'summary.json').read_text())
    assert summary['algorithm'] == run_name and summary['final_accuracy'] is not None


@pytest.mark.slow
def test_gbo_family_and_learning_rate_grid(tmp_path, tiny_leaf_file):
  workdir = tmp_path / 'grid'
  proc = run('--dataset=leaf', f'--data_path={tiny_leaf_file}', '--algorithm=fedavg,fedgbo',
             '--gbo_optimizer=sgdm,adam', '--client_lr_grid=0.05,0.2', '--num_rounds=2',
             '--eval_every=2', '--clients_per_round=3', '--batch_size=2', '--budget_range=1,3',
             f'--workdir={workdir}')
  assert proc.returncode == 0, proc.stderr[-2000:]
  for name in ('fedavg', 'fedgbo_sgdm', 'fedgbo_adam'):
    for lr in ('0.05', '0.2'):
      summary = json.loads((workdir / name / f'lr{lr}' / 'summary.json').read_text())
      assert summary['algorithm'] == name and summary['client_lr'] == float(lr)
  text = (workdir / 'report.md').read_text()
  assert 'Client learning rate per algorithm' in text and '(fedavg best)' in text
  tables = text[text.index('Client learning rate per algorithm'):]   # after the header
  assert tables.strip() in proc.stdout
  if importlib.util.find_spec('matplotlib') is not None:
    assert (workdir / 'plots' / 'lr_grid.png').stat().st_size > 0


def test_best_learning_rate_is_the_best_mean_over_seeds():
  s = lambda lr, acc: ({'algorithm': 'a', 'client_lr': lr, 'best_accuracy': acc}, [])
  assert report.best_values([s(0.1, 0.9), s(0.1, 0.5), s(0.3, 0.8), s(0.3, 0.7)]) == {
      'a': 0.3}


@pytest.mark.slow
def test_text_datasets_run_from_the_launcher(tmp_path):
  """Shakespeare ids into the stacked LSTM, Sent140 word counts into the linear model, from
  generated LEAF files (the shipped subset's 30-round run is in docs/results.md)."""
  rng = np.random.default_rng(0)
  users = {}
  for u in range(3):
    line = ''.join(rng.choice(list('abc de'), size=140))
    users[f's{u}'] = {'x': [line[i:i + 80] for i in range(60)], 'y': [line[i + 80] for i in range(60)]}
  shakespeare = tmp_path / 'shakespeare.json'
  shakespeare.write_text(json.dumps({'users': list(users), 'num_samples': [60] * 3,
                                     'user_data': users}))
  tweets = {f't{u}': {'x': [['1', 'd', 'q', f't{u}', f'good day {j}'] for j in range(6)],
                      'y': ['4', '0'] * 3} for u in range(3)}
  sent140 = tmp_path / 'sent140.json'
  sent140.write_text(json.dumps({'users': list(tweets), 'num_samples': [6] * 3,
                                 'user_data': tweets}))
  common = ['--num_rounds=2', '--eval_every=2', '--clients_per_round=2', '--batch_size=4',
            '--budget_range=1,2', '--algorithm=fedavgcm']
  proc = run('--dataset=shakespeare', f'--data_path={shakespeare}', '--model=shakespeare_lstm',
             '--split_gap=0', f'--workdir={tmp_path / "sh"}', *common)
  assert proc.returncode == 0, proc.stderr[-2000:]
  config = json.loads((tmp_path / 'sh' / 'config.json').read_text())
  assert config['data']['hparams']['leaf_split'] == 'default'
  assert config['data']['hparams']['char_vocabulary'] == 'leaf'
  proc = run('--dataset=sent140', f'--data_path={sent140}', '--model=logistic',
             '--vocab_size=5', f'--workdir={tmp_path / "st"}', *common)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert json.loads((tmp_path / 'st' / 'summary.json').read_text())['final_accuracy'] is not None


def test_every_config_field_and_hyper_parameter_is_a_flag_with_its_help_and_default():
  values = flags.FlagValues()
  cli.define_flags(values)
  fields = [f for cls in config_lib.SECTIONS.values() for f in dataclasses.fields(cls)
            if 'help' in f.metadata]
  fields += [f for spec in registry.specs() for f in dataclasses.fields(spec.hparams)]
  fields += [f for spec in data_registry.specs() for f in dataclasses.fields(spec.hparams)]
  for field in fields:
    name = field.metadata['flag'] or field.name
    flag = values[name]
    assert flag.help.startswith(field.metadata['help']) and flag.help.strip()
    default = flag.default[0] if name in cli.lists() else flag.default
    if name == 'budget_range':
      default = config_lib.parse_budget_range(default)
    assert default == field.default, name
  values(['run.py'])
  config, sweep = cli.from_flags(values)
  assert config == config_lib.Config()
  assert sweep == Sweep(seeds=[], algorithms=[config.algorithm],
                        variants={'gbo_optimizer': ['sgdm']}, client_lrs=[], server_lrs=[])


def test_each_algorithm_of_a_command_gets_its_own_hyper_parameters_from_the_flags():
  values = flags.FlagValues()
  cli.define_flags(values)
  values(['run.py', '--algorithm=fedprox,gel,fedgbo', '--prox_mu=0.5', '--guess_tau=20',
          '--gbo_beta=0.5', '--client_lr=0.2'])
  config, sweep = cli.from_flags(values)
  prox, gel, gbo = expand(config, sweep)
  assert prox.algorithm.hparams.prox_mu == 0.5 and gel.algorithm.hparams.guess_tau == 20
  assert gbo.algorithm.hparams.gbo_beta == 0.5
  assert {x.algorithm.client_lr for x in (prox, gel, gbo)} == {0.2}


@pytest.mark.parametrize('form', ['--flagfile={}', '--flagfile {}'])
def test_a_flag_file_from_a_pipe_is_read_once(tiny_leaf_file, form):
  """``--flagfile=<(...)`` (a pipe, readable once): its flags count, and a bad value names the
  pipe and the line."""
  def pipe(text):
    read, write = os.pipe()
    os.write(write, text.encode())
    os.close(write)
    return read, f'/dev/fd/{read}'

  fd, path = pipe(f'--dataset=leaf\n--data_path={tiny_leaf_file}\n--num_rounds=7\n')
  try:
    (config,) = parsed(*form.format(path).split())
  finally:
    os.close(fd)
  assert config.run.num_rounds == 7
  fd, path = pipe('--dataset=leaf\n--num_rounds=seven\n')
  try:
    with pytest.raises(config_lib.ConfigError, match=f'--flagfile={path} line 2: '):
      parsed(*form.format(path).split())
  finally:
    os.close(fd)


def test_the_server_flags_go_to_the_algorithms_that_apply_a_server_optimiser(tiny_leaf_file):
  avg, dyn = parsed('--dataset=leaf', f'--data_path={tiny_leaf_file}',
                    '--algorithm=fedavgcm,feddyn', '--server_optimizer=momentum',
                    '--server_momentum=0.5', '--server_lr=0.3')
  assert (avg.server.optimizer, avg.server.momentum, avg.server.lr) == ('momentum', 0.5, 0.3)
  assert dyn.server == config_lib.ServerConfig()   # FedDyn's server step is its own


@pytest.mark.slow
def test_a_grid_extended_by_a_value_and_rounds_resumes_the_old_runs_alone(tmp_path,
                                                                          tiny_leaf_file):
  """The two runs extended from their final state and the new one train as two programs: no
  run restarts from round 0 and no record is written twice."""
  common = ['--dataset=leaf', f'--data_path={tiny_leaf_file}', '--algorithm=fedprox',
            '--eval_every=1', '--clients_per_round=3', '--batch_size=2', '--budget_range=1,3',
            f'--workdir={tmp_path}']
  assert run(*common, '--num_rounds=2', '--hparam_grid=prox_mu:0.01,0.1').returncode == 0
  proc = run(*common, '--num_rounds=3', '--hparam_grid=prox_mu:0.01,0.1,1')
  assert proc.returncode == 0, proc.stderr[-2000:]
  for mu in ('0.01', '0.1', '1'):
    lines = (tmp_path / f'prox_mu{mu}' / 'metrics.jsonl').read_text().splitlines()
    assert [json.loads(l)['round'] for l in lines] == [0, 1, 2, 3], mu


@pytest.mark.slow
def test_a_grid_over_a_hyper_parameter_from_the_command_line(tmp_path, tiny_leaf_file):
  """--hparam_grid: FedProx once per mu (one program), FedAvgCM (no mu) once; the records and
  summaries carry mu and the report keeps FedProx's best."""
  workdir = tmp_path / 'mu'
  proc = run('--dataset=leaf', f'--data_path={tiny_leaf_file}', '--algorithm=fedavgcm,fedprox',
             '--hparam_grid=prox_mu:0.001,1', '--num_rounds=2', '--eval_every=2',
             '--clients_per_round=3', '--batch_size=2', '--budget_range=1,3',
             f'--workdir={workdir}')
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert 'prox_mu' not in json.loads((workdir / 'fedavgcm' / 'summary.json').read_text())
  for mu in ('0.001', '1'):
    run_dir = workdir / 'fedprox' / f'prox_mu{mu}'
    summary = json.loads((run_dir / 'summary.json').read_text())
    assert summary['prox_mu'] == float(mu) and summary['runs_in_program'] == 2
    records = [json.loads(l) for l in (run_dir / 'metrics.jsonl').read_text().splitlines()]
    assert [r['prox_mu'] for r in records] == [float(mu)] * 2
    assert f'fedprox on leaf, seed 0, client lr 0.01, prox_mu {mu}:' in proc.stdout
  rule = ('the best value of the main test metric over the evaluations (the highest accuracy, '
          'the lowest mse; mean over seeds; on a tie, the first value given; diverged runs never '
          'chosen)')
  assert f'--prox_mu per algorithm ({rule}): fedprox ' in (workdir / 'report.md').read_text()


@pytest.mark.parametrize('args,message', [
    (['--hparam_grid=prox_mu'], '--hparam_grid must be NAME:v1,v2,...'),
    (['--hparam_grid=prox_mu:a,b'], '--hparam_grid must hold floats'),
    (['--hparam_grid=prox_mu:0.1,0.2', '--algorithm=gel'],
     '--hparam_grid: --prox_mu is no float hyper-parameter of --algorithm=gel'),
    (['--hparam_grid=guess_tau:1,2', '--algorithm=gel'], '--guess_tau is no float'),
    (['--hparam_grid=client_lr:0.1,0.2'], '--hparam_grid=client_lr: use --client_lr_grid'),
    (['--hparam_grid=prox_mu:0.1,0.1', '--algorithm=fedprox'], 'distinct'),
    (['--hparam_grid=prox_mu:0.1,-1', '--algorithm=fedprox'], '--prox_mu must be >= 0'),
    (['--hparam_grid=prox_mu:0.1,0.2', '--algorithm=fedprox', '--client_lr_grid=0.1,0.2'],
     'one grid at a time'),
    (['--hparam_grid=budget_range:1,2'], '--budget_range is no float hyper-parameter'),
    (['--hparam_grid=client_momentum:0.1,0.9', '--algorithm=fedavg,scaffold'],
     '--client_momentum is no float hyper-parameter of --algorithm=fedavg,scaffold'),
    (['--hparam_grid=prox_mu:0.1,0.1000001', '--algorithm=fedprox'], 'told apart'),
    (['--hparam_grid=gbo_eps:0.001,0.1', '--algorithm=fedgbo'],
     '--gbo_eps is no float hyper-parameter of --algorithm=fedgbo'),   # SGDm reads no eps
])
def test_bad_hyper_parameter_grids_are_one_line(tmp_path, args, message):
  proc = run(*args, f'--workdir={tmp_path / "w"}')
  assert proc.returncode == 2 and proc.stderr.count('\n') == 1, proc.stderr
  assert message in proc.stderr, proc.stderr
  assert not (tmp_path / 'w').exists()


@pytest.mark.parametrize('text', ['[]', '{"data": 3}', '"x"'])
def test_a_config_json_that_is_no_configuration_is_one_line(tmp_path, text):
  (tmp_path / 'config.json').write_text(text)
  proc = run('--num_rounds=2', f'--workdir={tmp_path}')
  assert_one_line_error(proc, 'config.json', '--overwrite')
  assert (tmp_path / 'config.json').read_text() == text


def test_an_unknown_flag_in_a_flag_file_names_the_file_and_line(tmp_path):
  """absl's 'Unknown command line flag' did not say where it came from, every other flag-file
  error did."""
  path = tmp_path / 'x.flags'
  path.write_text('--dataset=leaf_synthetic\n# a comment\n--nonsense_flag=3\n')
  with pytest.raises(config_lib.ConfigError,
                     match=f"--flagfile={path} line 3: Unknown command line flag 'nonsense_flag'"):
    parsed(f'--flagfile={path}')
  with pytest.raises(config_lib.ConfigError, match="^Unknown command line flag 'nonsense'"):
    parsed('--nonsense=1')   # on the command line: nothing to add


@pytest.mark.slow
def test_the_command_presents_the_cores_as_devices(tiny_leaf_file, tmp_path):
  """In a fresh process without XLA_FLAGS: the command configures JAX's CPU backend before it
  starts (a check of the processes' stop signals had started it first: every run trained on
  one device, without the small-loop option)."""
  script = (f"import os, jax\nfrom fedjax_gel.experiment import cli\n"
            f"code = cli.main(['run.py', '--dataset=leaf', '--data_path={tiny_leaf_file}', "
            f"'--num_rounds=1', '--clients_per_round=3', '--batch_size=2', '--budget_range=1,3', "
            f"'--noplots', '--workdir={tmp_path / 'w'}'])\n"
            "print(code, jax.device_count(), os.environ.get('XLA_FLAGS'))\n")
  env = {k: v for k, v in os.environ.items() if k != 'XLA_FLAGS'}
  out = subprocess.run([sys.executable, '-c', script], cwd=REPO, env=env, text=True,
                       capture_output=True, check=False)
  code, count, xla_flags = out.stdout.strip().splitlines()[-1].split(' ', 2)
  assert code == '0', out.stderr[-2000:]
  assert int(count) == (os.cpu_count() or 1) and xla.SMALL_LOOP_FLAG in xla_flags



def test_help_flags_are_told_apart_from_other_flags():
  assert parsing.HELP.fullmatch('--helpfull') and parsing.HELP.fullmatch('-?')
  assert parsing.HELP.fullmatch('--helpfull=1') and not parsing.HELP.fullmatch('--helper')


def test_help_lists_the_main_flags_by_section_one_line_each_with_defaults():
  values = flags.FlagValues()
  cli.define_flags(values)
  text = cli.overview(values)
  lines = text.splitlines()
  for section in (*config_lib.SECTIONS, 'command'):
    assert f'{section}:' in lines, section
  for name in config_lib.section_flag_names():
    line = next(l for l in lines if l.startswith(f'  --{name}='))
    default = (values[name].default_as_str or '').strip("'")
    assert line.startswith(f'  --{name}={default}') and len(line.split()) > 1, line
  assert '  --clients_per_round=20' in text and '  --workdir=' in text
  assert '--guess_policy' in text and '--leaf_sample' in text   # named, in --helpfull
  assert all(len(l) <= cli.HELP_WIDTH for l in lines if '--compilation_cache' not in l)
  assert cli.first_sentence('One. Two.', 80) == 'One. Two'   # a short first sentence: more
  assert cli.first_sentence('x' * 50 + '. y', 20) == 'x' * 17 + '...'


@pytest.mark.parametrize('flag', ['--help', '--helpfull', '--helpfull=1', '-?'])
@pytest.mark.slow
def test_help_exits_0(flag):
  """absl's help exits with status 1; the command's with 0, also given a value."""
  done = subprocess.run([sys.executable, str(REPO / 'launch' / 'run.py'), flag], cwd=REPO,
                        capture_output=True, text=True, timeout=120, check=False)
  assert done.returncode == 0 and 'Runs federated experiments' in done.stdout, done.stderr[-2000:]
  assert '\ncohort:\n  --clients_per_round=20' in done.stdout   # the main flags, grouped
