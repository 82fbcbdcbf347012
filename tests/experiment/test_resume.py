"""Resuming after kill -9: the same outputs as an uninterrupted run, to the bit; reruns are
deterministic; damaged checkpoints and finished runs are handled."""
from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import pathlib
import random
import shutil
import signal
import subprocess
import sys
import threading
import time

import jax
import pytest

from absl import flags

import helpers

from fedjax_gel.experiment import api, cli, parsing
from fedjax_gel.experiment import callbacks as callbacks_lib
from fedjax_gel.experiment import config as config_lib
from fedjax_gel.experiment import runtime as runtime_lib
from fedjax_gel.experiment import workdir as workdir_lib
from fedjax_gel.experiment.sweep import Sweep

REPO = pathlib.Path(__file__).resolve().parents[2]


def command(data, workdir, *extra):
  return [sys.executable, 'launch/run.py', '--dataset=leaf', f'--data_path={data}',
          '--num_rounds=200', '--eval_every=2', '--checkpoint_every=50', '--clients_per_round=3',
          '--budget_range=1,3', '--batch_size=2', '--noplots', f'--workdir={workdir}', *extra]


def run(cmd):
  """``cmd`` (a ``command``) run to its end in this process (``helpers.cli_run``: no
  interpreter to start); the commands killed or signalled here are processes of their own."""
  return helpers.cli_run(*cmd[2:])


def quiet() -> dict:
  """``api.run``'s keywords for a command whose lines and plots no test reads."""
  return dict(out=io.StringIO(), err=io.StringIO(), plots=False)


def metrics(workdir):
  """metrics.jsonl's records without the wall-clock field."""
  records = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  for r in records:
    r.pop('elapsed_s')
  return records


def csv_rows(workdir):
  """metrics.csv's rows without the wall-clock column."""
  with open(workdir / 'metrics.csv', newline='') as f:
    return [{k: v for k, v in row.items() if k != 'elapsed_s'} for row in csv.DictReader(f)]


def snapshot(workdir):
  """Every file under ``workdir`` with its bytes."""
  return {p: p.read_bytes() for p in workdir.rglob('*') if p.is_file()}


def checkpoints(workdir) -> list[str]:
  """The names of the whole checkpoints in ``workdir`` (not what a killed save left)."""
  return sorted(p.name for p in workdir.glob('checkpoint-*') if not p.name.endswith('.tmp'))


def killed_then_resumed(cmd, workdir, checkpoints_dir):
  """Starts ``cmd``, kills it with SIGKILL at a random moment after its first checkpoint, then
  runs ``cmd`` again to the end; returns that second process."""
  proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 120
  while not checkpoints(checkpoints_dir) and proc.poll() is None:
    assert time.time() < deadline
    time.sleep(0.01)
  time.sleep(random.uniform(0, 0.4))
  if proc.poll() is None:
    os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  assert proc.returncode == -signal.SIGKILL, 'the run ended before it could be killed'
  return run(cmd)


@pytest.fixture(scope='module')
def uninterrupted(tiny_leaf_file, tmp_path_factory):
  workdir = tmp_path_factory.mktemp('whole')
  proc = run(command(tiny_leaf_file, workdir, '--algorithms=gel', '--seeds=0,1'))
  assert proc.returncode == 0, proc.stderr
  return workdir


@pytest.mark.slow
def test_a_finished_run_extended_equals_the_longer_run(tiny_leaf_file, uninterrupted, tmp_path):
  """--num_rounds raised on a finished run's work directory goes on from its final state: the
  records equal the longer run's (plus the shorter run's last evaluation, had it none there); a
  lower --num_rounds, or a diverged run, is one line."""
  short = tmp_path / 'short'
  cmd = lambda rounds: command(tiny_leaf_file, short, '--algorithms=gel', '--seeds=0,1',
                               f'--num_rounds={rounds}')
  assert run(cmd(120)).returncode == 0
  before = snapshot(short)
  lower = run(cmd(50))
  assert lower.returncode == 2 and '--num_rounds=120 there, 50 now' in lower.stderr
  assert snapshot(short) == before
  extended = run(cmd(200))
  assert extended.returncode == 0, extended.stderr
  assert '; resuming from the checkpoint of round 120' in extended.stderr
  for seed in ('seed0', 'seed1'):
    assert metrics(short / seed) == metrics(uninterrupted / seed)   # 120 is an evaluation round
    assert ((short / seed / 'model.msgpack').read_bytes() ==
            (uninterrupted / seed / 'model.msgpack').read_bytes())
    summary = json.loads((short / seed / 'summary.json').read_text())
    assert summary['rounds'] == 200 and summary['status'] == 'finished'
    assert json.loads((short / seed / 'config.json').read_text())['run']['num_rounds'] == 200
    assert checkpoints(short / seed) == ['checkpoint-200']
  summary = short / 'seed0' / 'summary.json'
  summary.write_text(summary.read_text().replace('"finished"', '"diverged"'))
  diverged = run(cmd(300))
  assert diverged.returncode == 2 and 'diverged and cannot be extended' in diverged.stderr


@pytest.mark.slow
def test_ctrl_c_stops_between_rounds_with_a_checkpoint_and_the_run_resumes(
    tiny_leaf_file, uninterrupted, tmp_path):
  """SIGTERM mid-run (what Ctrl-C's SIGINT does too: test_a_stop_signal_only_sets_the_flag):
  exit 130 with one line saying how to go on (no traceback), a checkpoint of the last whole
  round; the same command then finishes with the uninterrupted metrics."""
  workdir = tmp_path / 'interrupted'
  cmd = command(tiny_leaf_file, workdir, '--algorithms=gel', '--seeds=0,1')
  proc = subprocess.Popen(cmd, cwd=REPO, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)
  metrics_file, deadline = workdir / 'seed0' / 'metrics.jsonl', time.time() + 120
  while proc.poll() is None and (not metrics_file.exists() or
                                 len(metrics_file.read_text().splitlines()) < 3):
    assert time.time() < deadline
    time.sleep(0.005)
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 130, err
  assert 'Traceback' not in err
  last = err.strip().splitlines()[-1]
  assert last.startswith('interrupted after round ') and 'run the same command' in last, err
  done = int(last.split()[3].rstrip(','))
  for seed in ('seed0', 'seed1'):
    assert (workdir / seed / f'checkpoint-{done}').is_dir()
  resumed = run(cmd)
  assert resumed.returncode == 0, resumed.stderr
  assert 'gel, seeds 0, 1: the round compiled in ' in resumed.stderr
  assert f'; resuming from the checkpoint of round {done}' in resumed.stderr
  for seed in ('seed0', 'seed1'):
    assert metrics(workdir / seed) == metrics(uninterrupted / seed)


@pytest.mark.parametrize('extra', [[]], ids=['vmapped'])
@pytest.mark.slow
def test_resumed_run_equals_the_uninterrupted_one(tiny_leaf_file, uninterrupted, tmp_path, extra):
  """Two seeds vmapped in one program: kill -9, rerun the same command; every seed's metrics
  and final model are bit-identical to the uninterrupted run's, and only the final state's
  checkpoint is left (kept so that the run can be extended). (Runs of their own resume by the
  same checkpoints: tests/reliability/test_workdir_faults.py kills single runs at planted
  points.)"""
  workdir = tmp_path / 'killed'
  cmd = command(tiny_leaf_file, workdir, '--algorithms=gel', '--seeds=0,1', *extra)
  resumed = killed_then_resumed(cmd, workdir, workdir / 'seed0')
  assert resumed.returncode == 0, resumed.stderr
  for seed in ('seed0', 'seed1'):
    assert metrics(workdir / seed) == metrics(uninterrupted / seed)
    assert csv_rows(workdir / seed) == csv_rows(uninterrupted / seed)
    assert ((workdir / seed / 'model.msgpack').read_bytes() ==
            (uninterrupted / seed / 'model.msgpack').read_bytes())
    assert checkpoints(workdir / seed) == ['checkpoint-200']
    assert json.loads((workdir / seed / 'summary.json').read_text())['rounds'] == 200


@pytest.mark.slow
def test_same_command_twice_gives_the_same_metrics_bytes(tiny_leaf_file, uninterrupted, tmp_path):
  """Determinism: a second run of the command writes the same metrics.jsonl bytes, apart from
  the wall-clock field."""
  workdir = tmp_path / 'again'
  proc = run(command(tiny_leaf_file, workdir, '--algorithms=gel', '--seeds=0,1'))
  assert proc.returncode == 0, proc.stderr
  strip = lambda text: [line.split('"elapsed_s"')[0] for line in text.splitlines()]
  for seed in ('seed0', 'seed1'):
    assert strip((workdir / seed / 'metrics.jsonl').read_text()) == strip(
        (uninterrupted / seed / 'metrics.jsonl').read_text())


@pytest.mark.slow
def test_finished_runs_are_kept_and_a_damaged_checkpoint_is_one_line(tiny_leaf_file, tmp_path):
  workdir = tmp_path / 'run'
  cmd = command(tiny_leaf_file, workdir, '--num_rounds=20', '--algorithms=fedavg,gel')
  assert run(cmd).returncode == 0
  before = snapshot(workdir / 'gel')
  again = run(cmd)   # everything finished: nothing is trained again, nothing changes
  assert again.returncode == 0, again.stderr
  assert snapshot(workdir / 'gel') == before

  (workdir / 'gel' / 'summary.json').unlink()   # unfinished, with no intact checkpoint
  (workdir / 'gel' / 'checkpoint-10').mkdir()
  (workdir / 'gel' / 'checkpoint-10' / 'meta.msgpack').write_bytes(b'\x00not msgpack')
  meta = workdir / 'gel' / 'checkpoint-20' / 'meta.msgpack'
  meta.write_bytes(meta.read_bytes()[:40])   # cut
  damaged = run(cmd)
  assert damaged.returncode == 2 and 'Traceback' not in damaged.stderr
  assert len(damaged.stderr.splitlines()) == 1
  assert 'checkpoint-20: damaged' in damaged.stderr and '--overwrite' in damaged.stderr
  assert (workdir / 'gel' / 'metrics.jsonl').read_bytes() == before[workdir / 'gel' / 'metrics.jsonl']


@pytest.mark.parametrize('other,error', [
    ({'model': 'mlp'}, "holds another configuration's state"),
    ({'algorithm': 'fedadam'}, "holds another configuration's state"),
    ({}, 'metrics.jsonl is shorter than at the checkpoint')],
    ids=['another_model', 'another_algorithm', 'metrics_cut_short'])
@pytest.mark.slow
def test_a_checkpoint_of_another_configuration_is_one_line(tiny_leaf_file, tmp_path, other,
                                                           error):
  """An unfinished run whose checkpoint holds another model's (or server optimiser's) state, or
  counts more metrics than metrics.jsonl holds: one line naming the checkpoint, exit status 2,
  every file left as it was."""
  from fedjax_gel.experiment import checkpoint, factories  # pylint: disable=g-import-not-at-top
  from fedjax_gel.experiment.config import make  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / 'run'
  cmd = command(tiny_leaf_file, workdir, '--num_rounds=20', '--algorithm=fedavg')
  assert run(cmd).returncode == 0
  (workdir / 'summary.json').unlink()   # unfinished; its checkpoint from another configuration
  exp = factories.prepare(make(**{'dataset': 'leaf', 'data_path': str(tiny_leaf_file),
                                 'algorithm': 'fedavg', 'clients_per_round': 3, **other}))
  foreign = exp.algorithm.server_init(exp.model.init(jax.random.key(0)))
  checkpoint.save(str(workdir), 10, foreign,
                  {'metrics_bytes': 0 if other else 10**6,
                   'runs': [{'totals': {}, 'distance': 0., 'diverged': None}]},
                  runtime_lib.Runtime())
  before = snapshot(workdir)
  proc = run(cmd)
  assert proc.returncode == 2 and 'Traceback' not in proc.stderr, proc.stderr
  (line,) = proc.stderr.splitlines()
  assert 'checkpoint-10: ' in line and error in line and '--overwrite' in line
  assert snapshot(workdir) == before


@pytest.mark.slow
def test_a_resumed_grid_equals_the_uninterrupted_one(tiny_leaf_file, tmp_path):
  """A learning-rate grid killed with kill -9 and run again: its metrics.jsonl and grid.json
  are bit-identical to an uninterrupted grid's; a finished grid is kept on a third run."""
  grid_flags = ('--algorithm=gel', '--client_lr_grid=0.03,0.1', '--server_lr_grid=0.5,1',
                '--eval_every=9', '--checkpoint_every=10',   # checkpoints between evaluations too
                '--num_rounds=300')   # long enough to be killed before it ends
  whole, resumed = tmp_path / 'whole', tmp_path / 'resumed'
  assert run(command(tiny_leaf_file, whole, *grid_flags)).returncode == 0
  proc = killed_then_resumed(command(tiny_leaf_file, resumed, *grid_flags), resumed, resumed)
  assert proc.returncode == 0, proc.stderr
  assert metrics(resumed) == metrics(whole)   # the records, but for their elapsed_s
  assert csv_rows(resumed) == csv_rows(whole)
  assert (resumed / 'grid.json').read_bytes() == (whole / 'grid.json').read_bytes()
  assert checkpoints(resumed) == ['checkpoint-300']
  before = snapshot(resumed)
  again = run(command(tiny_leaf_file, resumed, *grid_flags))
  assert again.returncode == 0, again.stderr
  assert {p: b for p, b in snapshot(resumed).items() if p.name != 'report.md'} == {
      p: b for p, b in before.items() if p.name != 'report.md'}


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason='signal handlers live in the main thread')
@pytest.mark.parametrize('signum', runtime_lib.STOP_SIGNALS)
def test_a_stop_signal_only_sets_the_flag_and_a_second_one_interrupts(signum):
  before = signal.getsignal(signum)
  runtime, other = runtime_lib.Runtime(), runtime_lib.Runtime()
  with runtime.deferring():
    os.kill(os.getpid(), signum)
    time.sleep(0.01)
    assert runtime.stop.requests == 1
    assert not other.stop   # another command's token (a notebook's next run) is its own
    with pytest.raises(KeyboardInterrupt):
      os.kill(os.getpid(), signum)
      time.sleep(1)
    assert runtime.stop.requests == 2
  assert signal.getsignal(signum) == before


class SignalInLastRound(callbacks_lib.Callback):
  """Sends ``signum`` to this process during the last round of the first run it sees."""

  def __init__(self, signum):
    self.signum, self.sent = signum, False

  def on_round(self, loop, done):
    if not self.sent and done == loop.num_rounds:
      self.sent = True
      os.kill(os.getpid(), self.signum)
      time.sleep(0.01)


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason='signal handlers live in the main thread')
@pytest.mark.slow
def test_a_stop_signal_in_a_runs_last_round_finishes_it_and_starts_no_other(tiny_leaf_file,
                                                                           tmp_path):
  """The run whose last round was under way finishes; the command's next run does not start
  (it used to: the signal was dropped with the round loop's handler)."""
  c = config_lib.make(dataset='leaf', data_path=str(tiny_leaf_file), num_rounds=3,
                      eval_every=1, clients_per_round=3, batch_size=2, budget_range=(1, 3))
  sweep = Sweep(algorithms=['fedavgcm', 'gel'])
  runtime = runtime_lib.Runtime()
  with pytest.raises(KeyboardInterrupt):
    api.run(c, str(tmp_path), sweep, callbacks=[SignalInLastRound(signal.SIGTERM)],
            runtime=runtime, **quiet())
  assert not runtime.stop   # delivered: the KeyboardInterrupt that stopped the command
  summary = json.loads((tmp_path / 'fedavgcm' / 'summary.json').read_text())
  assert summary['status'] == 'finished' and summary['rounds'] == 3
  assert not (tmp_path / 'gel' / 'summary.json').exists()
  assert not (tmp_path / 'gel' / 'metrics.jsonl').exists() or not (
      tmp_path / 'gel' / 'metrics.jsonl').read_text()


@pytest.mark.parametrize('lost', ['after the runs', 'as another error'])
def test_a_stop_signal_whose_keyboard_interrupt_was_lost_ends_the_command_as_interrupted(
    monkeypatch, lost):
  """A KeyboardInterrupt that Python swallowed in a garbage-collection callback, or turned into
  another error inside an import: the signal's record still makes the exit status 130."""
  def lost_signal(*args, runtime, **kwargs):
    del args, kwargs
    runtime.stop.request()   # what the signal's handler records before raising
    if lost == 'as another error':
      raise RuntimeError('Error calling __set_name__ on ...')
    return []
  monkeypatch.setattr(api, 'run', lost_signal)
  values = flags.FlagValues()
  cli.define_flags(values)
  rest = parsing.parse(['run.py', '--num_rounds=2'], values)
  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    assert cli.execute(values, rest, runtime_lib.Runtime()) == 130
  assert err.getvalue().strip().splitlines()[-1].startswith('interrupted: run the same command')


@pytest.fixture(scope='module')
def finished(tiny_leaf_file, tmp_path_factory):
  """A finished run of 4 rounds (checkpointed every 2) and its config, trained in-process."""
  c = config_lib.make(dataset='leaf', data_path=str(tiny_leaf_file), num_rounds=4, eval_every=2,
                      checkpoint_every=2, clients_per_round=3, budget_range=(1, 3),
                      batch_size=2, algorithm='fedavg')
  workdir = tmp_path_factory.mktemp('finished') / 'run'
  api.run(c, str(workdir), **quiet())
  return c, workdir


def crlf(path):
  path.write_bytes(path.read_bytes().replace(b'\n', b'\r\n'))


def test_a_raised_num_rounds_with_another_change_names_the_other_flag(finished):
  """More rounds alone extend the run; with another flag changed too the line named
  --num_rounds, which is the change that is allowed."""
  c, workdir = finished
  before = snapshot(workdir)
  with pytest.raises(config_lib.ConfigError, match=r'--eval_every=2 there, 3 now'):
    api.run(c.replace(num_rounds=6, eval_every=3), str(workdir), **quiet())
  assert snapshot(workdir) == before


def edit_summary(**fields):
  def edit(path):
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))
  return edit


def cut(path):
  path.write_bytes(path.read_bytes()[:-7])


def tensorboard_file(workdir):
  shutil.rmtree(workdir / 'tensorboard', ignore_errors=True)
  (workdir / 'tensorboard').write_text('x')


def metrics_folder(workdir):
  (workdir / 'metrics.jsonl').unlink()
  (workdir / 'metrics.jsonl').mkdir()


@pytest.mark.parametrize('change,rounds,error', [
    (lambda w: crlf(w / 'metrics.jsonl'), 6, 'metrics.jsonl changed since the run finished'),
    (lambda w: cut(w / 'metrics.csv'), 6, 'metrics.csv changed since the run finished'),
    (lambda w: edit_summary(outputs_sha256='abc')(w / 'summary.json'), 4,
     'summary.json changed since the run finished'),
    (lambda w: edit_summary(final_accuracy='x')(w / 'summary.json'), 6,
     'summary.json changed since the run finished'),
    (tensorboard_file, 6, 'tensorboard is a file where a folder goes'),
    (metrics_folder, 4, 'metrics.jsonl is a folder where a file goes'),
    # unfinished: resumed from the checkpoint of round 4, whose records were re-saved since
    (lambda w: ((w / 'summary.json').unlink(), crlf(w / 'metrics.jsonl')), 4,
     "metrics.jsonl changed before the checkpoint's round"),
], ids=['crlf_extended', 'csv_cut', 'outputs_checksum_edited', 'summary_field_edited',
        'tensorboard_a_file', 'metrics_a_folder', 'crlf_resumed'])
def test_a_run_whose_outputs_changed_is_refused_before_anything_is_written(finished, tmp_path,
                                                                           change, rounds, error):
  """Rerun, extended (more rounds) or resumed: a work directory whose records were re-saved
  (other line endings), whose summary was edited, or where an output's name is of the wrong
  kind is one ConfigError naming the file, with every file left as it was (an extension used to
  cut the re-saved records mid-line and append to them)."""
  c, source = finished
  workdir = tmp_path / 'run'
  shutil.copytree(source, workdir)
  change(workdir)
  before = snapshot(workdir)
  with pytest.raises(config_lib.ConfigError) as e:
    api.run(c.replace(num_rounds=rounds), str(workdir), **quiet())
  assert error in str(e.value) and '\n' not in str(e.value), str(e.value)
  assert snapshot(workdir) == before


@pytest.fixture(scope='module')
def on_own_data(tmp_path_factory, leaf_writer):
  """A finished run of 4 rounds (checkpointed every 2) on a data file of its own, its config."""
  folder = tmp_path_factory.mktemp('own_data')
  data = leaf_writer(folder / 'data.json')
  c = config_lib.make(dataset='leaf', data_path=str(data), num_rounds=4, eval_every=2,
                      checkpoint_every=2, clients_per_round=3, budget_range=(1, 3),
                      batch_size=2, algorithm='fedavg')
  api.run(c, str(folder / 'run'), **quiet())
  return c, folder


def copied(on_own_data, tmp_path):
  """The run and its data file copied into ``tmp_path``: the config then reads the copy."""
  c, folder = on_own_data
  shutil.copytree(folder, tmp_path, dirs_exist_ok=True)
  c = c.replace(data_path=str(tmp_path / 'data.json'))
  config = json.loads((tmp_path / 'run' / 'config.json').read_text())
  config['data']['data_path'] = c.data.data_path
  (tmp_path / 'run' / 'config.json').write_text(json.dumps(config))
  return c, tmp_path / 'data.json', tmp_path / 'run'


@pytest.mark.parametrize('status', ['done', 'extended', 'resumed'])
def test_a_run_is_not_continued_on_other_data(on_own_data, leaf_writer, tmp_path, status):
  """The data file rewritten with other examples (same clients and shapes) under the same path:
  the run is neither taken as done, nor extended, nor resumed, in one line naming --data_path,
  every file left as it was. The same examples written differently (indented) are the same data."""
  c, data, workdir = copied(on_own_data, tmp_path)
  if status == 'done':
    data.write_text(json.dumps(json.loads(data.read_text()), indent=1))
    assert api.run(c, str(workdir), **quiet())[0]['rounds'] == 4
  if status == 'resumed':
    (workdir / 'summary.json').unlink()
  c = c.replace(num_rounds=6 if status == 'extended' else 4)
  leaf_writer(data, seed=1)
  before = snapshot(workdir)
  with pytest.raises(config_lib.ConfigError) as e:
    api.run(c, str(workdir), **quiet())
  message = str(e.value)
  assert message.startswith(f'--data_path={data}: the run in {workdir} was trained on other '
                            'data') and '\n' not in message, message
  assert snapshot(workdir) == before
  # the same from the command line: exit status 2, one line
  proc = helpers.cli_run('--dataset=leaf', f'--data_path={data}',
                         f'--num_rounds={c.run.num_rounds}', '--eval_every=2',
                         '--checkpoint_every=2', '--clients_per_round=3', '--budget_range=1,3',
                         '--batch_size=2', '--algorithm=fedavg', f'--workdir={workdir}')
  helpers.assert_one_line_error(proc, f'--data_path={data}', 'other data')
  assert snapshot(workdir) == before


@pytest.mark.parametrize('status', ['extended', 'resumed'])
@pytest.mark.slow
def test_a_run_recorded_without_its_datas_digest_goes_on_and_then_records_it(
    on_own_data, tmp_path, status):
  """A config.json of an earlier version (no data_sha256) is taken as it is; extended or
  resumed, the run's config.json records the digest of the data it goes on with."""
  c, _, workdir = copied(on_own_data, tmp_path)
  config = json.loads((workdir / 'config.json').read_text())
  digest = config.pop('data_sha256')
  (workdir / 'config.json').write_text(json.dumps(config))
  summary = json.loads((workdir / 'summary.json').read_text())
  del summary['settings_sha256']   # nor did that version checksum the settings
  summary['summary_sha256'] = workdir_lib.summary_sha256(summary)
  (workdir / 'summary.json').write_text(json.dumps(summary))
  if status == 'resumed':
    (workdir / 'summary.json').unlink()
  rounds = 6 if status == 'extended' else 4
  assert api.run(c.replace(num_rounds=rounds), str(workdir), **quiet())[0]['rounds'] == rounds
  assert json.loads((workdir / 'config.json').read_text()) == {**config, 'data_sha256': digest,
                                                               'run': {**config['run'],
                                                                       'num_rounds': rounds}}


@pytest.mark.parametrize('value,error', [
    (5, 'config.json: its data_sha256 is not a digest (edited?)'),
    (['a'], 'config.json: its data_sha256 is not a digest (edited?)'),
    ('ab\ncd', "was trained on other data than these (its config.json records data_sha256 "
                "'ab\\ncd', the data now '"),
])
def test_a_data_digest_edited_into_another_value_is_one_line(on_own_data, tmp_path, value,
                                                             error):
  """Finished, the edit breaks the checksum of config.json's settings; unfinished (no checksum
  yet), the digest itself is read."""
  c, _, workdir = copied(on_own_data, tmp_path)
  config = json.loads((workdir / 'config.json').read_text())
  (workdir / 'config.json').write_text(json.dumps({**config, 'data_sha256': value}))
  for what in ('config.json: its settings changed since the run finished', error):
    before = snapshot(workdir)
    with pytest.raises(config_lib.ConfigError) as e:
      api.run(c, str(workdir), **quiet())
    assert what in str(e.value) and '\n' not in str(e.value), str(e.value)
    assert snapshot(workdir) == before
    if (workdir / 'summary.json').exists():
      (workdir / 'summary.json').unlink()


@pytest.mark.slow
def test_a_run_is_not_continued_with_other_client_budgets(on_own_data, tmp_path):
  """--budget_draw=per_client: the budgets file rewritten with other budgets under the same path
  stops the run's extension in one line naming --client_budgets; the same budgets written as
  an object {client name: budget} instead of a list are the same budgets."""
  c, _, _ = copied(on_own_data, tmp_path)
  budgets = tmp_path / 'budgets.json'
  budgets.write_text(json.dumps([1, 2, 3, 1, 2, 3, 1, 2]))
  c = c.replace(budget_draw='per_client', client_budgets=str(budgets), num_rounds=2)
  workdir = tmp_path / 'per_client'
  api.run(c, str(workdir), **quiet())
  recorded = json.loads((workdir / 'config.json').read_text())['client_budgets_sha256']
  budgets.write_text(json.dumps({f'u{i}': b for i, b in enumerate([1, 2, 3, 1, 2, 3, 1, 2])}))
  assert api.run(c.replace(num_rounds=4), str(workdir), **quiet())[0]['rounds'] == 4
  assert json.loads((workdir / 'config.json').read_text())['client_budgets_sha256'] == recorded
  budgets.write_text(json.dumps([3, 2, 1, 1, 2, 3, 1, 2]))
  before = snapshot(workdir)
  with pytest.raises(config_lib.ConfigError) as e:
    api.run(c.replace(num_rounds=6), str(workdir), **quiet())
  assert str(e.value).startswith(f'--client_budgets={budgets}: the run in {workdir} was trained '
                                 'on other client budgets than these'), str(e.value)
  assert snapshot(workdir) == before


class Crash(callbacks_lib.Callback):
  """Ends the command as a kill would (no checkpoint of its own): after the library's
  callbacks of ``on_start`` (the resume done, the records cut back), or after round ``at``."""

  def __init__(self, at=None):
    self.at = at

  def on_start(self, loop):
    if self.at is None:
      raise RuntimeError('killed')

  def on_round(self, loop, done):
    if done == self.at:
      raise RuntimeError('killed')


@pytest.mark.slow
def test_a_group_resumed_from_its_common_checkpoint_and_killed_again_resumes(tiny_leaf_file,
                                                                            tmp_path):
  """Two vmapped seeds killed between their saves of round 20 (seed1's never written): the
  next command resumes both from round 10 and cuts their records back to it. Killed again at
  once, seed0's checkpoint of round 20 outlived its records and stopped every later command
  ("metrics.jsonl is shorter than at the checkpoint"); now it goes when the group resumes."""
  c = config_lib.make(dataset='leaf', data_path=str(tiny_leaf_file), num_rounds=30,
                      eval_every=2, checkpoint_every=10, clients_per_round=3,
                      budget_range=(1, 3), batch_size=2, algorithm='gel')
  seeds = Sweep(seeds=[0, 1])
  whole, workdir = tmp_path / 'whole', tmp_path / 'killed'
  api.run(c, str(whole), seeds, **quiet())
  with pytest.raises(RuntimeError, match='killed'):
    api.run(c, str(workdir), seeds, callbacks=[Crash(at=25)], **quiet())
  shutil.rmtree(workdir / 'seed1' / 'checkpoint-20')
  with pytest.raises(RuntimeError, match='killed'):
    api.run(c, str(workdir), seeds, callbacks=[Crash()], **quiet())
  assert checkpoints(workdir / 'seed0') == ['checkpoint-10']
  api.run(c, str(workdir), seeds, **quiet())
  for seed in ('seed0', 'seed1'):
    assert metrics(workdir / seed) == metrics(whole / seed)
    assert ((workdir / seed / 'model.msgpack').read_bytes() ==
            (whole / seed / 'model.msgpack').read_bytes())


@pytest.mark.slow
def test_a_stop_signal_while_starting_is_never_lost(tiny_leaf_file, tmp_path):
  """A signal at any moment of the start-up (imports, flags, data, compilation) ends the command
  with 130 and one line. Raised inside the imports, it crashed NumPy's or jaxlib's extension
  (status 139) or was dropped in a JAX callback, and the run trained to its end (status 0)."""
  sigs = (signal.SIGTERM, signal.SIGINT)
  for i, delay in enumerate((0.15, 0.25, 0.4, 0.6, 0.9, 1.3)):
    workdir = tmp_path / f'w{i}'
    proc = subprocess.Popen(command(tiny_leaf_file, workdir), cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(delay)
    proc.send_signal(sigs[i % 2])
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and 'Traceback' not in err, (delay, err[-2000:])
    assert err.strip().splitlines()[-1].startswith('interrupted'), (delay, err[-2000:])


@pytest.mark.slow
def test_a_start_up_blocked_on_a_pipe_stops_at_a_signal(tmp_path):
  """A flag file that is a pipe nobody writes: once the imports are done a signal stops the
  command at once (recorded only, it waited for the pipe forever)."""
  pipe = tmp_path / 'pipe.flags'
  os.mkfifo(pipe)
  proc = subprocess.Popen([sys.executable, 'launch/run.py', f'--flagfile={pipe}'], cwd=REPO,
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  time.sleep(3)   # the imports take about a second
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 130 and err.strip().startswith('interrupted while starting'), err
