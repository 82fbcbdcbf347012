"""The work directory under faults: a second writer, an interrupted --overwrite, another
command's report, flipped bits, changed outputs, planted links, a full disk, Ctrl-C.

Each case asserts one line (or a clean resume) and that nothing written earlier changed. Runs
are short LEAF Synthetic runs in this process (``helpers.cli_run``).
"""
from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import numpy as np
import pytest
from absl import flags as absl_flags

import helpers
from fedjax_gel.experiment import api, checkpoint, cli, files, parsing
from fedjax_gel.experiment import runtime as runtime_lib
from fedjax_gel.experiment import workdir as workdir_lib
from fedjax_gel.experiment.config import ConfigError

BASE = ('--flagfile=launch/configs/quickstart.flags', '--algorithm=fedavgcm',
        '--clients_per_round=5', '--eval_every=2', '--tensorboard=false', '--noplots')


def run(workdir, *extra, rounds=4):
  return helpers.cli_run(*BASE, f'--num_rounds={rounds}', f'--workdir={workdir}', *extra)


def snapshot(folder) -> dict:
  """Every file under ``folder`` and its bytes (links as their target's name)."""
  out = {}
  for root, dirs, names in os.walk(folder):
    for n in names + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
      p = os.path.join(root, n)
      out[os.path.relpath(p, folder)] = (os.readlink(p) if os.path.islink(p) else
                                         open(p, 'rb').read())
  return out


def model_bytes(workdir) -> bytes:
  return (workdir / 'model.msgpack').read_bytes()


@pytest.fixture(scope='module')
def finished(tmp_path_factory):
  """A finished 4-round run (its work directory) and its model, the reference for resumes."""
  workdir = tmp_path_factory.mktemp('ref') / 'run'
  proc = run(workdir, '--checkpoint_every=1')
  assert proc.returncode == 0, proc.stderr
  return workdir, model_bytes(workdir)


def hold_lock(folder, name_it=False):
  """Another process holding ``folder``'s lock (and, ``name_it``, naming itself in ``.lock``),
  once it has it; kill it to release the lock."""
  name = (f"json.dump({{'pid': os.getpid(), 'host': 'here', 'since': 'now', 'command': "
          f"'run.py'}}, open(os.path.join({str(folder)!r}, '.lock'), 'w'))" if name_it else '')
  holder = subprocess.Popen([sys.executable, '-c', textwrap.dedent(f'''
      import fcntl, json, os, time
      fd = os.open({str(folder)!r}, os.O_RDONLY)
      fcntl.flock(fd, fcntl.LOCK_EX)
      {name}
      print('locked', flush=True)
      time.sleep(120)''')], stdout=subprocess.PIPE, text=True)
  assert holder.stdout.readline().strip() == 'locked'
  return holder


@pytest.mark.slow
def test_a_second_writer_is_refused_and_a_killed_one_leaves_no_lock(finished, tmp_path):
  workdir = tmp_path / 'run'
  workdir.mkdir()
  holder = hold_lock(workdir, name_it=True)
  try:
    before = snapshot(workdir)
    helpers.assert_one_line_error(run(workdir), 'is in use by process', str(holder.pid))
    assert snapshot(workdir) == before
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  proc = run(workdir, '--checkpoint_every=1')   # the dead holder's lock went with it
  assert proc.returncode == 0, proc.stderr
  assert model_bytes(workdir) == finished[1]


@pytest.mark.slow
def test_a_command_started_while_another_plans_names_it_for_the_top_and_the_run_folders(
    tmp_path):
  """The first command names itself in ``.lock`` as soon as it holds a folder (it used to write
  it after planning, so a second command started meanwhile said "another process"; a run
  folder's lock was never named)."""
  workdir = tmp_path / 'top'
  args = [*BASE, '--num_rounds=2', '--seeds=0,1', '--vmap_seeds=false', f'--workdir={workdir}']
  first = subprocess.Popen([sys.executable, '-c', textwrap.dedent(f'''
      import sys, time
      from fedjax_gel.experiment import api, cli
      planned = api.plan
      def plan(*args, **kwargs):
        print('planning', flush=True)
        sys.stdin.readline()
        return planned(*args, **kwargs)
      def run_plan(*args, **kwargs):
        print('running', flush=True)
        time.sleep(120)
      api.plan, api.run_plan = plan, run_plan
      cli.main(['run.py', *{args!r}])''')], cwd=helpers.REPO, stdin=subprocess.PIPE,
      stdout=subprocess.PIPE, text=True)
  try:
    assert first.stdout.readline().strip() == 'planning'
    helpers.assert_one_line_error(run(workdir, '--seeds=0,1', '--vmap_seeds=false'),
                                  f'--workdir={workdir} is in use by process {first.pid}')
    first.stdin.write('\n')
    first.stdin.flush()
    assert first.stdout.readline().strip() == 'running'
    seed = next(p for p in workdir.iterdir() if p.is_dir())
    helpers.assert_one_line_error(run(seed), f'{seed} is in use by process {first.pid}')
  finally:
    first.send_signal(signal.SIGKILL)
    first.wait()


class Crash(Exception):
  """Stands for a kill at a planted point (raised by a callback)."""


class CrashAt:
  """A loop callback raising ``Crash`` at ``hook`` (and round ``done``)."""

  def __init__(self, hook, done=None):
    self.hook, self.done = hook, done

  def __getattr__(self, name):
    if name.startswith('on_'):
      def hook(loop, *args):
        if name == self.hook and (self.done is None or args[0] == self.done):
          raise Crash(name)
      return hook
    raise AttributeError(name)


def config(workdir, **changes):
  """``(config, sweep)`` of the command ``run(workdir)`` with ``changes`` to its flags."""
  values = absl_flags.FlagValues()
  cli.define_flags(values)
  args = [f'--{k}={v}' for k, v in changes.items()]
  with contextlib.chdir(helpers.REPO):
    parsing.parse(['run.py', *BASE, '--num_rounds=4', f'--workdir={workdir}', *args], values)
    return cli.from_flags(values)


@pytest.mark.slow
def test_an_interrupted_overwrite_is_never_taken_for_the_earlier_run(finished, tmp_path):
  workdir = tmp_path / 'run'
  assert run(workdir, '--client_lr=0.05').returncode == 0   # an earlier run, finished
  c, sweep = config(workdir)
  with pytest.raises(Crash):   # --overwrite with another lr, killed before its first round
    api.run(c, str(workdir), sweep, overwrite=True, callbacks=[CrashAt('on_compiled')],
            out=open(os.devnull, 'w'), err=open(os.devnull, 'w'))
  assert not (workdir / 'summary.json').exists()
  proc = run(workdir, '--checkpoint_every=1')   # without --overwrite: this run, trained
  assert proc.returncode == 0 and 'finished earlier' not in proc.stderr, proc.stderr
  assert json.loads((workdir / 'summary.json').read_text())['client_lr'] == 0.01
  assert model_bytes(workdir) == finished[1]


@pytest.mark.slow
def test_a_command_never_replaces_another_commands_report(tmp_path):
  single, sweep = tmp_path / 'single', tmp_path / 'sweep'
  assert run(single, rounds=1).returncode == 0
  before = snapshot(single)
  helpers.assert_one_line_error(run(single, '--seeds=0,1', rounds=1), 'holds a single run')
  assert snapshot(single) == before
  assert run(sweep, '--seeds=0,1', rounds=1).returncode == 0
  before = snapshot(sweep)
  helpers.assert_one_line_error(run(sweep, rounds=1), 'runs.json', 'leaves out')
  assert snapshot(sweep) == before
  proc = run(sweep, '--seeds=0,1,2', rounds=1)   # more seeds: the earlier runs are kept
  assert proc.returncode == 0, proc.stderr
  assert json.loads((sweep / 'runs.json').read_text()) == ['seed0', 'seed1', 'seed2']


def unfinished(workdir, crash_round=3):
  """A run of 4 rounds with a checkpoint after every round, killed after round ``crash_round``
  (its checkpoints: ``crash_round - 1`` and ``crash_round``)."""
  c, sweep = config(workdir, checkpoint_every=1)
  with pytest.raises(Crash):
    api.run(c, str(workdir), sweep, callbacks=[CrashAt('on_round', crash_round)],
            out=open(os.devnull, 'w'), err=open(os.devnull, 'w'))


def flip_a_bit(folder):
  """Flips one bit in the middle of the largest file under ``folder``."""
  files_ = [os.path.join(r, n) for r, _, ns in os.walk(folder) for n in ns]
  big = max(files_, key=os.path.getsize)
  data = bytearray(open(big, 'rb').read())
  data[len(data) // 2] ^= 0x10
  open(big, 'wb').write(bytes(data))


@pytest.mark.slow
def test_a_flipped_bit_in_a_checkpoint_is_caught(finished, tmp_path):
  workdir = tmp_path / 'run'
  unfinished(workdir)
  flip_a_bit(workdir / 'checkpoint-3' / 'state')
  proc = run(workdir, '--checkpoint_every=1')   # resumes from round 2, the last intact one
  assert proc.returncode == 0, proc.stderr
  assert 'checkpoint-3 is damaged' in proc.stdout
  assert model_bytes(workdir) == finished[1]
  assert (workdir / 'checkpoint-3.damaged').is_dir()   # set aside, kept once the run finished
  assert run(workdir, '--checkpoint_every=1', '--overwrite').returncode == 0
  assert not (workdir / 'checkpoint-3.damaged').exists()   # a fresh start removes it
  other = tmp_path / 'other'
  unfinished(other)
  for r in (2, 3):   # none intact: one line, nothing changed
    flip_a_bit(other / f'checkpoint-{r}' / ('state' if r == 2 else ''))
  before = snapshot(other)
  helpers.assert_one_line_error(run(other, '--checkpoint_every=1'), 'checkpoint-3', 'damaged')
  assert snapshot(other) == before


@pytest.mark.slow
def test_a_checkpoint_under_another_rounds_name_is_set_aside_like_a_damaged_one(finished,
                                                                                tmp_path):
  """A checkpoint folder copied or renamed to a later round's name held round 1's state under
  round 3's: resumed, rounds 2 and 3 were skipped without a word. It is damaged like a flipped
  bit: with an intact one left, a note, it is set aside and the run resumes from the intact one
  (the same final model); alone, one line and nothing changed. A name ``save`` never writes
  (``checkpoint-02``, the same round as ``checkpoint-2``) is not a checkpoint: left as it is
  (it made the run remove ``checkpoint-2`` twice and stop half-way)."""
  workdir = tmp_path / 'run'
  unfinished(workdir, crash_round=2)
  shutil.copytree(workdir / 'checkpoint-1', workdir / 'checkpoint-3')
  shutil.copytree(workdir / 'checkpoint-2', workdir / 'checkpoint-02')
  proc = run(workdir, '--checkpoint_every=1')
  assert proc.returncode == 0, proc.stderr
  assert 'checkpoint-3 is damaged (it holds the state of round 1)' in proc.stdout
  assert model_bytes(workdir) == finished[1]
  assert (workdir / 'checkpoint-3.damaged').is_dir()   # kept for inspection once finished
  assert (workdir / 'checkpoint-02').is_dir()
  alone = tmp_path / 'alone'
  unfinished(alone, crash_round=1)
  os.rename(alone / 'checkpoint-1', alone / 'checkpoint-3')
  before = snapshot(alone)
  helpers.assert_one_line_error(run(alone, '--checkpoint_every=1'), 'checkpoint-3',
                                'it holds the state of round 1')
  assert snapshot(alone) == before


@pytest.mark.parametrize('damage, words', [
    ('append', ('metrics.jsonl', 'changed since the run finished')),
    ('remove', ('metrics.jsonl', 'missing')),
    ('cut', ('summary.json', 'damaged')),
])
def test_a_finished_run_whose_outputs_changed_is_reported(finished, tmp_path, damage, words):
  workdir = tmp_path / 'run'
  os.system(f'cp -r {finished[0]} {workdir}')
  if damage == 'append':
    with open(workdir / 'metrics.jsonl', 'a') as f:
      f.write('{"round": 99}\n')
  elif damage == 'remove':
    os.remove(workdir / 'metrics.jsonl')
  else:
    text = (workdir / 'summary.json').read_text()
    (workdir / 'summary.json').write_text(text[:len(text) // 2])
  before = snapshot(workdir)
  helpers.assert_one_line_error(run(workdir, '--checkpoint_every=1'), *words)
  assert snapshot(workdir) == before


@pytest.mark.slow
def test_a_garbage_line_in_metrics_is_one_line(tmp_path):
  workdir = tmp_path / 'run'
  unfinished(workdir)
  with open(workdir / 'metrics.jsonl', 'r+') as f:
    f.seek(3)
    f.write('\x00garbage')
  helpers.assert_one_line_error(run(workdir, '--checkpoint_every=1'),
                                "metrics.jsonl changed before the checkpoint's round")


def test_metrics_read_back_name_a_garbage_line(tmp_path):
  """What a checkpoint of a version before its metrics checksum resumes on: the records read
  back, a line that is no record named."""
  (tmp_path / 'metrics.jsonl').write_text('{"round": 0}\n\x00garbage\n')
  with pytest.raises(ConfigError, match='metrics.jsonl line 2 is not a record'):
    workdir_lib.read_metrics(str(tmp_path))


def test_a_checkpoint_that_is_a_file_is_refused_before_anything_is_written(tmp_path):
  workdir = tmp_path / 'run'
  unfinished(workdir)
  (workdir / 'checkpoint-9').write_text('x')
  before = snapshot(workdir)
  helpers.assert_one_line_error(run(workdir, '--checkpoint_every=1'), 'checkpoint-9',
                                "a file where a checkpoint's folder goes")
  assert snapshot(workdir) == before


@pytest.mark.parametrize('name', ['metrics.jsonl', 'checkpoint-4.tmp', 'plots', 'summary.json'])
@pytest.mark.slow
def test_a_planted_link_is_refused_and_nothing_outside_is_written(finished, tmp_path, name):
  workdir, outside = tmp_path / 'run', tmp_path / 'outside'
  outside.mkdir()
  (outside / 'secret').write_text('keep')
  unfinished(workdir)
  target = outside if name in ('plots', 'checkpoint-4.tmp') else outside / 'secret'
  if os.path.lexists(workdir / name):
    os.remove(workdir / name)   # the run's own file swapped for a link
  os.symlink(target, workdir / name)
  before = snapshot(outside)
  helpers.assert_one_line_error(run(workdir, '--checkpoint_every=1'), name, 'symbolic link')
  assert snapshot(outside) == before


def test_a_link_planted_while_the_run_writes_is_never_followed(tmp_path):
  outside = tmp_path / 'outside'
  outside.mkdir()
  (outside / 'secret').write_text('keep')
  path = tmp_path / 'metrics.jsonl'
  os.symlink(outside / 'secret', path)
  with pytest.raises(OSError) as e:
    with files.open_append(str(path)):
      pass
  assert e.value.errno == errno.ELOOP
  files.write_atomic(str(path), b'new')   # replaces the link itself
  assert (outside / 'secret').read_text() == 'keep' and path.read_bytes() == b'new'
  umask = os.umask(0o022)
  os.umask(umask)
  assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask   # as open() creates files


@pytest.mark.slow
def test_a_full_disk_is_one_line_and_the_same_command_resumes(finished, tmp_path, monkeypatch):
  workdir = tmp_path / 'run'
  calls = []
  real = files.open_append

  def full(path, *args, **kwargs):   # the disk fills up at the third evaluation's records
    calls.append(path)
    if len(calls) == 3:
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
    return real(path, *args, **kwargs)

  monkeypatch.setattr(files, 'open_append', full)
  proc = run(workdir, '--checkpoint_every=1')   # mid-run: after the progress lines, one line
  assert proc.returncode == 2 and 'Traceback' not in proc.stderr, proc.stderr
  last = proc.stderr.splitlines()[-1]
  assert last.startswith('error: ') and 'metrics.jsonl' in last and 'no space left' in last
  monkeypatch.setattr(files, 'open_append', real)
  proc = run(workdir, '--checkpoint_every=1')
  assert proc.returncode == 0, proc.stderr
  assert model_bytes(workdir) == finished[1]


def test_orbax_is_quiet_while_it_writes_and_its_failure_is_raised(tmp_path):
  """A disk that fills up during a save: orbax's writer threads logged pages of tracebacks
  before the one line. Its log is quiet within ``_orbax`` (the error itself still raised) and as
  it was after."""
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  before, seen = absl_logging.get_verbosity(), []

  def args_of(ocp):
    seen.append(absl_logging.get_verbosity())
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / 'state'))
  with pytest.raises(OSError, match='No space left'):
    checkpoint._orbax('save', str(tmp_path / 'state'), args_of)
  assert seen == [absl_logging.FATAL] and absl_logging.get_verbosity() == before


@pytest.mark.skipif(not os.path.exists('/dev/full'), reason='no /dev/full')
def test_a_write_that_fails_on_a_full_device_names_the_file():
  """A full disk fails a write at its flush or close, with an OSError that names no file: the
  one line said 'a file: no space left' (the report, the plots, runs.json). (``open_append``
  itself opens regular files only: the device is opened as it would open a file.)"""
  with pytest.raises(OSError) as e:
    with files.naming('/dev/full'), open('/dev/full', 'a') as f:
      f.write('x')
  assert e.value.errno == errno.ENOSPC and e.value.filename == '/dev/full'
  assert cli.os_error(e.value).startswith('/dev/full: no space left on the device')


def test_a_full_disk_under_a_checkpoint_is_an_oserror_naming_it(tmp_path, monkeypatch):
  """Orbax's writer threads failed on a full disk with pages of tracebacks and exit status 1:
  too little room is refused before orbax starts, and orbax's own failure is converted."""
  state = {'w': np.zeros((4, 3), np.float32)}
  saved = []
  monkeypatch.setattr(checkpoint, '_orbax', lambda *args: saved.append(args))
  usage = shutil.disk_usage(tmp_path)
  monkeypatch.setattr(checkpoint.shutil, 'disk_usage',
                      lambda path: usage._replace(free=checkpoint.SAVE_SLACK_BYTES + 95))
  with pytest.raises(OSError) as e:   # 2 x 48 bytes of arrays do not fit beside the slack
    checkpoint._save_state(str(tmp_path / 'state'), state, [state['w']])
  assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / 'state')
  assert not saved
  monkeypatch.setattr(checkpoint.shutil, 'disk_usage', lambda path: usage)

  def exhausted(*args):
    raise ValueError('RESOURCE_EXHAUSTED: Error writing local file "x/manifest.ocdbt": Failed to '
                     "write 166 bytes to file 20: No space left on device [os_error_code='28']")
  monkeypatch.setattr(checkpoint, '_orbax', exhausted)
  with pytest.raises(OSError) as e:
    checkpoint._save_state(str(tmp_path / 'state'), state, [state['w']])
  assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / 'state')
  monkeypatch.setattr(checkpoint, '_orbax', lambda *args: (_ for _ in ()).throw(
      ValueError('another failure')))
  with pytest.raises(ValueError, match='another failure'):   # the others pass as they are
    checkpoint._save_state(str(tmp_path / 'state'), state, [state['w']])


def test_a_refused_write_names_the_file_not_its_temporary(tmp_path, monkeypatch):
  """A folder that refuses writes (permissions, an immutable folder): the line names the file
  being written, not the temporary it is written through first (``files.write_atomic``)."""
  def refused(prefix, suffix, dir):  # pylint: disable=redefined-builtin
    raise OSError(errno.EPERM, os.strerror(errno.EPERM),
                  os.path.join(dir, f'{prefix}k3j9x2ab{suffix}'))
  monkeypatch.setattr(files, 'tempfile', type('T', (), {'mkstemp': staticmethod(refused)}))
  workdir = tmp_path / 'run'
  proc = run(workdir)
  assert proc.returncode == 2 and 'Traceback' not in proc.stderr, proc.stderr
  assert proc.stderr.splitlines()[-1] == (
      f'error: {workdir / files.LOCK}: {os.strerror(errno.EPERM)}')
  assert files.target_of('/w/.metrics.jsonl.ab12cd34.tmp') == '/w/metrics.jsonl'
  assert files.target_of('/w/metrics.jsonl') == '/w/metrics.jsonl'
  assert files.target_of('/w/.x.v2.tmp') == '/w/.x.v2.tmp'   # not one of write_atomic's


def test_ctrl_c_outside_the_rounds_is_one_line(tmp_path, monkeypatch):
  def interrupt(*args, **kwargs):
    raise KeyboardInterrupt
  monkeypatch.setattr(api, 'train_all', interrupt)   # e.g. while compiling
  proc = run(tmp_path / 'run')
  assert proc.returncode == 130 and 'Traceback' not in proc.stderr
  assert len(proc.stderr.splitlines()) == 1 and 'run the same command' in proc.stderr


class Starts:
  """Records the round each program starts from (``loop.start``)."""

  def __init__(self):
    self.rounds = []

  def __getattr__(self, name):
    if name.startswith('on_'):
      return lambda loop, *args: (self.rounds.append(loop.start) if name == 'on_compiled'
                                  else None)
    raise AttributeError(name)


@pytest.mark.slow
def test_vmapped_runs_with_a_diverged_one_resume_from_their_last_checkpoint(tmp_path):
  """Two runs in one program, one diverging at once: killed after round 6, the group resumes
  from its checkpoint of round 6, not from the start."""
  workdir = tmp_path / 'grid'
  c, sweep = config(workdir, checkpoint_every=2, client_lr_grid='0.01,3e37', num_rounds=8)
  quiet = dict(out=open(os.devnull, 'w'), err=open(os.devnull, 'w'), plots=False)
  with pytest.raises(Crash):
    api.run(c, str(workdir), sweep, callbacks=[CrashAt('on_round', 6)], **quiet)
  starts = Starts()
  summaries = api.run(c, str(workdir), sweep, callbacks=[starts], **quiet)
  assert starts.rounds == [6]
  assert [s['status'] for s in summaries] == ['finished', 'diverged']


@pytest.mark.parametrize('name', ['meta.msgpack'])   # a checkpoint's last write
@pytest.mark.slow
def test_a_kill_inside_a_write_resumes_bit_identically(finished, tmp_path, monkeypatch, name):
  """The process dies between writing a file's temporary copy and renaming it: the next run
  removes the copy and ends as an uninterrupted one."""
  workdir = tmp_path / 'run'
  real = files.write_atomic

  def dies(path, data):
    if os.path.basename(path) == name:
      fd, _ = tempfile.mkstemp(prefix=f'.{name}.', suffix='.tmp',
                                dir=os.path.dirname(path))
      os.write(fd, data[:len(data) // 2])
      raise Crash(path)
    return real(path, data)

  monkeypatch.setattr(files, 'write_atomic', dies)
  with pytest.raises(Crash):
    run(workdir, '--checkpoint_every=1')
  monkeypatch.setattr(files, 'write_atomic', real)
  proc = run(workdir, '--checkpoint_every=1')
  assert proc.returncode == 0, proc.stderr
  assert model_bytes(workdir) == finished[1]
  assert not [p for p in snapshot(workdir) if p.endswith('.tmp')]


def test_a_command_on_a_run_folder_of_a_running_command_is_refused(tmp_path):
  """Command A holds its runs' folders too: B with --workdir=A's seed1 is refused (and A, had
  B come first, would be refused at B's folder)."""
  top = tmp_path / 'sweep'
  (top / 'seed1').mkdir(parents=True)
  holder = hold_lock(top / 'seed1')
  try:
    helpers.assert_one_line_error(run(top, '--seeds=1,2', rounds=1), 'seed1', 'is in use')
    assert sorted(os.listdir(top)) == ['seed1'] and not os.listdir(top / 'seed1')
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()


def test_a_link_between_the_workdir_and_a_run_folder_is_refused(tmp_path):
  top, outside = tmp_path / 'sweep', tmp_path / 'outside'
  top.mkdir()
  outside.mkdir()
  os.symlink(outside, top / 'seed1')
  helpers.assert_one_line_error(run(top, '--seeds=1,2', rounds=1), 'seed1', 'symbolic link')
  assert not os.listdir(outside)


@pytest.mark.slow
def test_a_cut_meta_falls_back_to_the_last_intact_checkpoint(finished, tmp_path):
  workdir = tmp_path / 'run'
  unfinished(workdir)
  meta = workdir / 'checkpoint-3' / 'meta.msgpack'
  meta.write_bytes(meta.read_bytes()[:30])
  proc = run(workdir, '--checkpoint_every=1')
  assert proc.returncode == 0, proc.stderr
  assert 'checkpoint-3 is damaged' in proc.stdout
  assert model_bytes(workdir) == finished[1]


def test_a_deeply_nested_config_json_is_one_line(tmp_path):
  workdir = tmp_path / 'run'
  workdir.mkdir()
  (workdir / 'config.json').write_text('[' * 200_000)
  helpers.assert_one_line_error(run(workdir), 'config.json', 'unreadable')


def guarded(work):
  """``cli.guarded(work)``'s exit status and stderr (``work`` takes the runtime)."""
  err = io.StringIO()
  runtime = runtime_lib.Runtime()
  with contextlib.redirect_stderr(err):
    return cli.guarded(runtime, work, runtime), err.getvalue()


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason='signal handlers live in the main thread')
def test_sigterm_before_the_rounds_is_one_line():
  def work(runtime):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(1)
    return 0
  code, err = guarded(work)
  assert code == 130
  assert len(err.splitlines()) == 1 and 'run the same command' in err


def test_a_keyboard_interrupt_python_cannot_raise_is_recorded_not_printed():
  """Where a stop signal's KeyboardInterrupt lands in a garbage-collection callback, Python
  drops it and prints "Exception ignored": under the command line nothing is printed (the
  signal's record ends the command as interrupted, test_resume); other such errors still are."""
  class Drops:
    def __init__(self, error):
      self.error = error

    def __del__(self):
      raise self.error

  def work(runtime):
    runtime.stop.request()   # what the signal handler records before raising
    Drops(KeyboardInterrupt())
    Drops(ValueError('shown'))
    return 0
  code, err = guarded(work)
  assert code == 0
  assert 'KeyboardInterrupt' not in err and 'ValueError: shown' in err

def test_a_lock_file_that_cannot_be_removed_does_not_hide_the_error_under_way(
    tmp_path, monkeypatch):
  """A work directory turned read-only mid-run: the failed write is the error to tell, not the
  ``.lock`` that ``unlock`` could not remove; the lock itself is released."""
  files.lock(str(tmp_path))
  files.name_holder(str(tmp_path))

  def refuse(path):
    raise PermissionError(errno.EPERM, 'Operation not permitted', path)
  monkeypatch.setattr(files.os, 'remove', refuse)
  with pytest.raises(OSError, match='report.md'):
    try:
      raise OSError(errno.EROFS, 'Read-only file system', str(tmp_path / 'report.md'))
    finally:
      files.unlock(str(tmp_path))
  monkeypatch.undo()
  files.lock(str(tmp_path))   # released: taken again at once
  files.unlock(str(tmp_path))
