"""``launch/run.py`` as several processes of JAX's multi-controller runtime (CPU, gloo): the
same metrics as one process (to float summation order: rtol 1e-5; 2 processes of 3 devices,
SCAFFOLD's store split over all 6), only process 0 writes,
checkpoints resume under another process count, a killed process stops the run and the same
command resumes it; processes given other flags or data stop together with one line."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import types

import numpy as np
import pytest

import helpers  # pylint: disable=g-bad-import-order
from helpers import free_port, ours  # pylint: disable=g-bad-import-order

REPO = pathlib.Path(__file__).resolve().parents[2]
# GeL (FedAvgCM's client with guessed updates) and SCAFFOLD (a per-client store split over the
# processes' devices); FedAvgCM itself runs in every other multi-device test.
ALGORITHMS = ('gel', 'scaffold')


def records(workdir: pathlib.Path) -> list[dict]:
  return [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]


COMMON = ('launch/run.py', '--dataset=leaf', '--eval_every=2', '--clients_per_round=4',
          '--batch_size=2', '--budget_range=1,3')


def flags(data, workdir, *more) -> list[str]:
  return [sys.executable, *COMMON, f'--data_path={data}', f'--workdir={workdir}', *more]


def together(count: int, devices, data, workdir, *more, wait: bool = True,
             own: dict | None = None):
  """``helpers.together`` of ``COMMON``'s run on ``data`` into ``workdir``, with ``more``."""
  return helpers.together(count, devices, [*COMMON[1:], f'--data_path={data}',
                                           f'--workdir={workdir}', *more], wait=wait, own=own)


def alone(data, workdir, *more):
  out = subprocess.run(flags(data, workdir, *more), cwd=REPO, text=True, capture_output=True,
                       check=False)
  assert out.returncode == 0, out.stderr[-2000:]
  return out


@pytest.fixture(scope='module')
def one_process(tiny_leaf_file, tmp_path_factory):
  """One process's 6 rounds of every algorithm (its work directory)."""
  workdir = tmp_path_factory.mktemp('one') / 'run'
  alone(tiny_leaf_file, workdir, '--num_rounds=6', f'--algorithm={",".join(ALGORITHMS)}')
  return workdir


def assert_same_metrics(ours_dir, alone_dir, rounds, algorithms=ALGORITHMS):
  for name in algorithms:
    mine, theirs = records(ours_dir / name), records(alone_dir / name)
    assert [r['round'] for r in mine] == [r['round'] for r in theirs] == rounds
    for key in ('test_loss', 'train_loss', 'test_accuracy', 'grad_computations'):
      # equal up to the order of the sums over the devices (SCAFFOLD's store: 1e-7 at round 6)
      np.testing.assert_allclose([r[key] for r in mine], [r[key] for r in theirs],
                                 rtol=1e-5, err_msg=f'{name} {key}')


# The runs stopped (by kill -9 or a stop signal) and resumed, and the uninterrupted reference
# they are compared with to the bit (``whole``: one run shared by those tests)
STOPPED = ('--num_rounds=120', '--eval_every=40', '--checkpoint_every=40', '--algorithm=scaffold',
           '--noplots')


@pytest.fixture(scope='module')
def whole(tiny_leaf_file, tmp_path_factory):
  """Two processes' uninterrupted run of ``STOPPED`` (its work directory)."""
  workdir = tmp_path_factory.mktemp('whole') / 'run'
  for code, _, err in together(2, 1, tiny_leaf_file, workdir, *STOPPED):
    assert code == 0, err[-2000:]
  return workdir


def timeless(rows: list[dict]) -> list[dict]:
  """Records without their wall-clock times."""
  return [{k: v for k, v in r.items() if k != 'elapsed_s'} for r in rows]


def files(workdir: pathlib.Path) -> list[str]:
  return sorted(str(p.relative_to(workdir)) for p in workdir.rglob('*')
                if p.is_file() and 'tensorboard' not in p.parts and 'checkpoint-' not in str(p))


@pytest.mark.slow
def test_two_processes_give_the_metrics_of_one_and_one_process_resumes_them(
    tmp_path, tiny_leaf_file, one_process):
  """2 processes x 3 devices: 8 clients owned 2 a device by 4 of the 6 devices, SCAFFOLD's
  store padded to 12 rows. One process then extends both runs to 8 rounds from their
  checkpoints (the 6-device one read into one device's layout): the same metrics again."""
  two = tmp_path / 'two'
  runs = together(2, 3, tiny_leaf_file, two, '--num_rounds=6',
                  f'--algorithm={",".join(ALGORITHMS)}')
  for code, _, err in runs:
    assert code == 0, err[-2000:]
  (_, out0, _), (_, out1, err1) = runs
  assert ours(out1) == [] and 'all runs:' not in err1   # process 1 prints nothing
  assert 'outputs:' in out0 and str(two) in out0
  assert_same_metrics(two, one_process, [0, 2, 4, 6])
  for name in ALGORITHMS:
    assert json.loads((two / name / 'config.json').read_text())['algorithm']['name'] == name
    assert json.loads((two / name / 'summary.json').read_text())['status'] == 'finished'
  assert files(two) == files(one_process)
  one = tmp_path / 'one'
  shutil.copytree(one_process, one)
  for workdir in (one, two):
    alone(tiny_leaf_file, workdir, '--num_rounds=8', f'--algorithm={",".join(ALGORITHMS)}')
  assert_same_metrics(two, one, [0, 2, 4, 6, 8])


@pytest.mark.slow
def test_a_killed_process_stops_the_run_and_the_same_command_resumes_it(tmp_path,
                                                                        tiny_leaf_file, whole):
  """kill -9 of process 1 after the first checkpoint: process 0 stops with one line and a
  non-zero status; the same two commands then finish the run, bit-identical to an
  uninterrupted one."""
  # process 1 is killed right after the checkpoint of round 40: process 0 cannot pass the next
  # round's collectives, so the run is still under way whatever the number of rounds
  more = (*STOPPED, '--heartbeat_timeout=10')
  resumed = tmp_path / 'resumed'
  procs = together(2, 1, tiny_leaf_file, resumed, *more, wait=False)
  deadline = time.time() + 200
  while not list(resumed.glob('checkpoint-*[0-9]')) and procs[0].poll() is None:
    assert time.time() < deadline
    time.sleep(0.02)
  os.kill(procs[1].pid, signal.SIGKILL)
  _, err = procs[0].communicate(timeout=120)
  procs[1].communicate()
  assert procs[0].returncode == 3   # watchdog.EXIT_STALLED: the run can resume
  lines = ours(err)
  assert ('lost the other processes' in lines[-1] or 'sent no news' in lines[-1]) and (
      'same command to resume from the checkpoint of round 40' in lines[-1]), err[-2000:]
  for code, _, err in together(2, 1, tiny_leaf_file, resumed, *more):
    assert code == 0, err[-2000:]
  assert (resumed / 'metrics.jsonl').read_bytes() != b''
  assert timeless(records(resumed)) == timeless(records(whole))


@pytest.mark.parametrize('own, devices, line', [
    # another seed trained silently to another result, another --num_rounds hung
    ({1: ('--seed=1',)}, 1,
     "--seed: process 1 has 1, process 0 0; every process must run the same"),
    # a process refused at its flags stopped the others only after --heartbeat_timeout
    ({1: ('--num_rounds=0',)}, 1, 'process 1 of the run stopped: --num_rounds must be an integer'),
    # hosts without a shared file system: two fresh folders agreed, the first checkpoint failed
    ({1: ('--workdir={tmp}/elsewhere',)}, 1,
     "whose lock file the work directory holds (one folder for every process, a shared file "
     "system): process 1 has None, process 0 '"),
    # hosts with other core counts: a 45-line traceback from the processes' first gather
    ({}, (2, 1), 'devices of the process (on CPU: XLA_FLAGS=--xla_force_host_platform_device_'
     'count=N): process 1 has 1, process 0 2'),
], ids=['seed', 'refused', 'workdir', 'devices'])
@pytest.mark.slow
def test_processes_given_other_flags_stop_before_training_with_one_line(
    tmp_path, tiny_leaf_file, own, devices, line):
  """Every process stops with status 2 and one line (the refused process its own), nothing
  left in any work directory (a nested one's parents included), well within the heartbeat
  timeout."""
  own = {i: tuple(f.format(tmp=tmp_path) for f in fs) for i, fs in own.items()}
  start = time.time()
  runs = together(2, devices, tiny_leaf_file, tmp_path / 'run' / 'nested', '--num_rounds=4',
                  '--seed=0', '--heartbeat_timeout=300', own=own)
  assert time.time() - start < 200   # not the heartbeat's 300 s
  for i, (code, out, err) in enumerate(runs):
    lines = ours(err)
    assert code == 2 and len(lines) == 1 and ours(out) == [], (i, err[-2000:])
  assert line in ours(runs[0][2])[0]
  assert sorted(p.name for p in tmp_path.iterdir()) == []


# One process of two: joins the other, turns the compilation cache on in CACHE and runs a program
# over both processes' devices; prints its result and the cache hits JAX reported.
SHARED_PROGRAM = textwrap.dedent('''
import json, sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec
from fedjax_gel.core.backend import compilation_cache
from fedjax_gel.experiment import cluster
process, address, cache = int(sys.argv[1]), sys.argv[2], sys.argv[3]
cluster.initialize(address, 2, process)
compilation_cache.enable(cache)
hits = []
jax.monitoring.register_event_listener(
    lambda event, **_: hits.append(event) if event.endswith('/cache_hits') else None)
mesh = jax.make_mesh((2,), ('d',))
x = jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec('d')),
                                           np.arange(3.) + 3 * process)
y = jax.jit(lambda a: jnp.sum(jnp.sin(a) * a),
            out_shardings=NamedSharding(mesh, PartitionSpec()))(x)
print('RESULT ' + json.dumps({'hits': len(hits), 'value': float(y)}))
''')


@pytest.mark.slow
def test_every_process_reads_the_programs_process_0_wrote(tmp_path):
  """JAX keyed a CPU program by the calling process's own devices, so process 1 never found
  what process 0 wrote and compiled everything again at every start; it now finds it."""
  cache = tmp_path / 'cache'
  env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'PYTHONPATH': str(REPO),
         'XLA_FLAGS': f"{os.environ.get('XLA_FLAGS', '')} "
                      '--xla_force_host_platform_device_count=1'}
  starts = []
  for _ in range(2):
    address = f'127.0.0.1:{free_port()}'
    procs = [subprocess.Popen([sys.executable, '-c', SHARED_PROGRAM, str(i), address, str(cache)],
                              env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for i in (1, 0)]
    try:
      outs = [p.communicate(timeout=200) for p in procs]
    finally:
      for p in procs:
        p.kill()
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    starts.append([json.loads(next(l for l in out.splitlines() if l.startswith('RESULT '))[7:])
                   for out, _ in outs])
  (first1, first0), (again1, again0) = starts
  assert first0['hits'] == 0   # (process 1 may find what process 0 has just written)
  assert again1['hits'] >= 1 and again0['hits'] >= 1
  assert first0['value'] == first1['value'] == again0['value'] == again1['value']


def test_a_program_keeps_jaxs_key_unless_its_cpu_devices_span_processes(monkeypatch):
  from fedjax_gel.core.backend import compilation_cache  # pylint: disable=g-import-not-at-top
  device = lambda i, process, platform='cpu': types.SimpleNamespace(
      id=i, process_index=process, platform=platform, device_kind=platform)
  monkeypatch.setattr(compilation_cache, 'host_processor', lambda: 'model name: a CPU')
  both = np.array([device(0, 0), device(2048, 1)], dtype=object)
  key = json.loads(compilation_cache.across_processes(both))
  assert key == ['model name: a CPU', [[0, 0, 'cpu'], [2048, 1, 'cpu']]]
  one = np.array([device(0, 0), device(1, 0)], dtype=object)
  gpus = np.array([device(0, 0, 'gpu'), device(1, 1, 'gpu')], dtype=object)
  assert compilation_cache.across_processes(one) is None
  assert compilation_cache.across_processes(gpus) is None
  monkeypatch.setattr(compilation_cache, 'host_processor', lambda: '')   # a processor unnamed
  assert compilation_cache.across_processes(both) is None


@pytest.mark.slow
def test_a_work_directory_in_use_stops_every_process_with_one_line(tmp_path, tiny_leaf_file):
  """Process 0 alone takes the lock: refused, it left the others waiting for its record (the
  runtime then killed them, status 134)."""
  import fcntl  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / 'run'
  workdir.mkdir()
  fd = os.open(workdir, os.O_RDONLY)
  fcntl.flock(fd, fcntl.LOCK_EX)   # another command holds it
  try:
    runs = together(2, 1, tiny_leaf_file, workdir, '--num_rounds=4', '--heartbeat_timeout=300')
  finally:
    os.close(fd)
  for i, (code, out, err) in enumerate(runs):
    lines = ours(err)
    assert code == 2 and len(lines) == 1 and ours(out) == [], (i, err[-2000:])
    assert 'is in use by' in lines[0]
  assert ours(runs[1][2])[0].startswith('error: process 0 of the run stopped: ')


def test_a_lock_file_seen_late_is_waited_for(monkeypatch, tmp_path):
  """A shared file system may show process 0's new ``.lock`` to another host a few seconds
  late (NFS): the process looks again before it compares; one that never sees it gives None."""
  from fedjax_gel.experiment import api, runtime as runtime_lib  # pylint: disable=g-import-not-at-top
  from fedjax_gel.experiment import files as files_lib  # pylint: disable=g-import-not-at-top
  told, seen = [], iter([None, None, {'host': 'h', 'pid': 7}])

  class TwoProcesses(runtime_lib.Runtime):
    count = 2
    agree = staticmethod(told.append)
  monkeypatch.setattr(files_lib, 'holder', lambda w: next(seen))
  api.agree_on_workdir(str(tmp_path), TwoProcesses())
  assert told[0] == {} and list(told[1].values()) == ['h:7']
  monkeypatch.setattr(files_lib, 'holder', lambda w: None)
  monkeypatch.setattr(api, 'LOCK_VISIBLE_S', 0.3)
  start = time.monotonic()
  api.agree_on_workdir(str(tmp_path), TwoProcesses())
  assert list(told[3].values()) == [None] and time.monotonic() - start >= 0.3


@pytest.mark.parametrize('sig, target', [(signal.SIGTERM, 1), (signal.SIGINT, 0)],
                         ids=['sigterm-to-1', 'sigint-to-0'])
@pytest.mark.slow
def test_a_stop_signal_to_one_process_stops_every_process_after_the_same_round(
    tmp_path, tiny_leaf_file, whole, sig, target):
  """SIGTERM to any process (JAX's preemption service holds it; it was swallowed and the run
  went on to its end) or Ctrl-C (sent on to that service): every process stops after the same
  round with its checkpoint and status 130; the same command then finishes the run, its
  metrics those of an uninterrupted run to the bit."""
  more = (*STOPPED, '--heartbeat_timeout=30')
  stopped = tmp_path / 'stopped'
  procs = together(2, 1, tiny_leaf_file, stopped, *more, wait=False)
  deadline = time.time() + 200
  while not (stopped / 'metrics.jsonl').exists() and procs[0].poll() is None:
    assert time.time() < deadline
    time.sleep(0.02)
  os.kill(procs[target].pid, sig)
  outs = [p.communicate(timeout=200) for p in procs]
  lasts = [ours(err)[-1] for _, err in outs]
  assert [p.returncode for p in procs] == [130, 130], lasts
  assert lasts[0] == lasts[1] and lasts[0].startswith('interrupted after round '), lasts
  done = int(lasts[0].split()[3].rstrip(','))
  assert done < 120 and (stopped / f'checkpoint-{done}').is_dir()
  for code, _, err in together(2, 1, tiny_leaf_file, stopped, *more):
    assert code == 0, err[-2000:]
  assert timeless(records(stopped)) == timeless(records(whole))
  assert (stopped / 'model.msgpack').read_bytes() == (whole / 'model.msgpack').read_bytes()


@pytest.mark.slow
def test_two_processes_train_batch_norm_and_dropout_as_one(tmp_path, leaf_writer):
  """The CelebA CNN with LEAF's BatchNorm, its statistics a row per client (FedBN) split over
  the processes' devices, and dropout: 2 processes of 1 device give one process's metrics (the
  clients' keys and rows do not depend on where they train)."""
  data = leaf_writer(tmp_path / 'images.json', dim=16)   # 4 x 4 one-channel images
  # minibatches of 8 (of 2, the deepest BatchNorm normalises 2 values: a float's last bit from
  # another chunking changes the run, on one device as on several)
  more = ('--num_rounds=4', '--eval_every=4', '--model=celeba_cnn', '--batch_norm',
          '--model_state=local', '--dropout=0.3', '--algorithm=fedavg', '--noplots',
          '--batch_size=8')
  for code, _, err in together(2, 1, data, tmp_path / 'two', *more):
    assert code == 0, err[-2000:]
  alone = helpers.cli_run(*COMMON[1:], f'--data_path={data}', f'--workdir={tmp_path / "one"}',
                          *more)   # in this process, on its one device
  assert alone.returncode == 0, alone.stderr[-2000:]
  mine, theirs = records(tmp_path / 'two'), records(tmp_path / 'one')
  assert [r['round'] for r in mine] == [r['round'] for r in theirs] == [0, 4]
  for key in ('test_loss', 'train_loss', 'test_accuracy'):
    np.testing.assert_allclose([r[key] for r in mine], [r[key] for r in theirs], rtol=1e-5,
                               err_msg=key)
