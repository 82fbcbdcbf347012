"""A disk that fills up in the middle of a run, under each writer: the metric sinks
(``metrics.jsonl``, ``metrics.csv``, the TensorBoard events), a checkpoint (its meta, its
state) and the report. Each is one line and exit status 2, and the same command run again
resumes and ends with the outputs of an uninterrupted run.

The disk fills up where every write goes through (``fill_disk``): from a given point of the
run on (the checkpoint of round 1 written), the files of a given name have their descriptors
replaced by one of ``/dev/full``, whose writes fail with ENOSPC as a full disk's do (at a
write, a flush or a close). The earlier full-disk tests raised ENOSPC inside
``files.open_append`` with TensorBoard off, so tensorboardX's writer thread, which died of it
and left the command hanging, was never reached.
"""
from __future__ import annotations

import builtins
import csv
import fnmatch
import io
import json
import os
import subprocess
import sys

import pytest

import helpers
from fedjax_gel.experiment import checkpoint, files

pytestmark = pytest.mark.skipif(not os.path.exists('/dev/full') or
                                not os.path.isdir('/proc/self/fd'),
                                reason='needs /dev/full and /proc/self/fd')

BASE = ('--flagfile=launch/configs/quickstart.flags', '--algorithm=fedavgcm',
        '--clients_per_round=5', '--eval_every=1', '--checkpoint_every=1', '--num_rounds=12',
        '--tensorboard', '--noplots')
# 12 rounds: tensorboardX's writer thread met the full disk (its 8 KiB buffer full) before the
# last evaluation's flush did, and then the command hung
HANG_S = 300   # a command that has not ended by then hangs


def fill_disk(monkeypatch, name: str, once=None):
  """Once the path ``once`` exists (None: at once), the writes to files named ``name`` (an
  ``fnmatch`` pattern; a temporary of ``files.write_atomic`` goes by its file's name) fail with
  ENOSPC: their descriptors are replaced by one of ``/dev/full``, those opened for writing (by
  ``open`` or ``os.fdopen``) from then on and, at the next file opened, those open then."""
  real, full, held = io.open, os.open('/dev/full', os.O_WRONLY), []

  def opened(file, mode='r', *args, **kwargs):
    f = real(file, mode, *args, **kwargs)
    path = os.readlink(f'/proc/self/fd/{file}') if isinstance(file, int) else os.fsdecode(file)
    if set(mode) & set('wax+') and fnmatch.fnmatch(os.path.basename(files.target_of(path)), name):
      held.append(f)
    if once is None or os.path.exists(once):
      for g in held:
        if not g.closed:
          os.dup2(full, g.fileno())
      held.clear()
    return f
  monkeypatch.setattr(builtins, 'open', opened)
  monkeypatch.setattr(io, 'open', opened)   # os.fdopen's


def outputs(workdir) -> dict:
  """A run's records (``metrics.jsonl``, ``metrics.csv``, its TensorBoard scalars) but their
  times, and its model (a resumed run's records may hold their fields in another order)."""
  records = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  with open(workdir / 'metrics.csv', newline='') as f:
    rows = list(csv.DictReader(f))
  (events,) = (workdir / 'tensorboard').glob('events.out.tfevents.*')
  for r in records + rows:
    r.pop('elapsed_s')
  return {'metrics.jsonl': records, 'metrics.csv': rows,
          'tensorboard': sorted(e for e in helpers.read_events(events) if e[0] != 'elapsed_s'),
          'model.msgpack': (workdir / 'model.msgpack').read_bytes()}


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory) -> dict:
  workdir = tmp_path_factory.mktemp('ref') / 'run'
  proc = helpers.cli_run(*BASE, f'--workdir={workdir}')
  assert proc.returncode == 0, proc.stderr
  return outputs(workdir)


def assert_full_disk_line(proc, name):
  """Exit status 2 and, after the progress lines, one line naming ``name`` and the full disk;
  no traceback (a writer thread's included)."""
  assert proc.returncode == 2, proc.stderr
  assert 'Traceback' not in proc.stdout + proc.stderr and 'Exception' not in proc.stderr
  lines = proc.stderr.splitlines()
  assert [x for x in lines if x.startswith('error')] == lines[-1:], proc.stderr
  assert name in lines[-1] and 'no space left on the device' in lines[-1], lines[-1]


def assert_resumes(workdir, uninterrupted, where='resuming from the checkpoint of round 1'):
  proc = helpers.cli_run(*BASE, f'--workdir={workdir}')
  assert proc.returncode == 0, proc.stderr
  assert where in proc.stderr, proc.stderr
  assert outputs(workdir) == uninterrupted
  assert not list(workdir.glob('checkpoint-*.tmp')) and not list(workdir.glob('.*.tmp'))


@pytest.mark.parametrize('name, named', [
    ('metrics.jsonl', 'metrics.jsonl'),   # round 2's records
    ('metrics.csv', 'metrics.csv'),
    ('meta.msgpack', os.path.join('checkpoint-2.tmp', 'meta.msgpack')),   # round 2's checkpoint
])
@pytest.mark.slow
def test_a_full_disk_mid_run_is_one_line_and_the_same_command_resumes(
    uninterrupted, tmp_path, monkeypatch, name, named):
  workdir = tmp_path / 'run'
  fill_disk(monkeypatch, name, once=workdir / 'checkpoint-1')
  assert_full_disk_line(helpers.cli_run(*BASE, f'--workdir={workdir}'), named)
  monkeypatch.undo()
  if name == 'metrics.jsonl':   # a real disk can take part of a write: half a record is left
    with open(workdir / name, 'a') as f:
      f.write('{"round": 2, "algorithm": "fed')
  assert_resumes(workdir, uninterrupted)


@pytest.mark.slow
def test_a_full_disk_under_tensorboard_is_one_line_and_never_hangs(uninterrupted, tmp_path):
  """tensorboardX's writer thread died of the full disk and the run waited forever for room in
  its queue (holding the work directory's lock, so the same command was refused): in a process
  of its own, which must end."""
  workdir = tmp_path / 'run'
  folders = [str(helpers.REPO / 'tests'), os.path.dirname(__file__)]
  script = (f'import sys; sys.path[:0] = {folders}\n'
            'import pytest, test_full_disk\n'
            "test_full_disk.fill_disk(pytest.MonkeyPatch(), 'events.out.tfevents.*', "
            f"{str(workdir / 'checkpoint-1')!r})\n"
            'from fedjax_gel.experiment import cli\n'
            f'sys.exit(cli.main({["run.py", *BASE, f"--workdir={workdir}"]}))\n')
  try:
    proc = subprocess.run([sys.executable, '-c', script], cwd=helpers.REPO, capture_output=True,
                          text=True, timeout=HANG_S)
  except subprocess.TimeoutExpired:
    pytest.fail(f'a full disk under the TensorBoard events: the command hung ({HANG_S} s)')
  assert_full_disk_line(proc, os.path.join(workdir, 'tensorboard', 'events.out.tfevents.'))
  assert_resumes(workdir, uninterrupted)


@pytest.mark.slow
def test_a_full_disk_under_a_checkpoints_state_is_one_line_and_the_same_command_resumes(
    uninterrupted, tmp_path, monkeypatch):
  """Orbax's writer threads fail half-way through the state of round 2: what they wrote stays
  in ``checkpoint-2.tmp`` and is never read."""
  workdir = tmp_path / 'run'
  real, saves = checkpoint._orbax, []

  def orbax(method, directory, args_of):
    out = real(method, directory, args_of)
    saves.append(directory)
    if len(saves) == 2:
      os.truncate(os.path.join(directory, 'manifest.ocdbt'), 10)
      raise ValueError('RESOURCE_EXHAUSTED: Error writing local file "manifest.ocdbt": No space '
                       "left on device [os_error_code='28']")
    return out
  monkeypatch.setattr(checkpoint, '_orbax', orbax)
  assert_full_disk_line(helpers.cli_run(*BASE, f'--workdir={workdir}'),
                        os.path.join('checkpoint-2.tmp', 'state'))
  monkeypatch.undo()
  assert (workdir / 'checkpoint-2.tmp').is_dir()
  assert_resumes(workdir, uninterrupted)


@pytest.mark.slow
def test_a_full_disk_under_the_report_is_one_line_and_the_same_command_writes_it(
    uninterrupted, tmp_path, monkeypatch):
  workdir = tmp_path / 'run'
  fill_disk(monkeypatch, 'report.md')
  assert_full_disk_line(helpers.cli_run(*BASE, f'--workdir={workdir}'), 'report.md')
  monkeypatch.undo()
  assert not (workdir / 'report.md').exists()
  assert_resumes(workdir, uninterrupted, where='finished earlier')
  assert (workdir / 'report.md').is_file()
