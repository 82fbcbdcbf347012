"""Several processes of one run when something goes wrong: a frozen peer, stop signals to every
process, a coordinator nobody serves, two processes 0. Each ends with one line and a clean exit,
a run under way resumable; none waits for JAX's own timeouts (heartbeat, start-up) or ends in
its abort (status 134)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from fedjax_gel.experiment import checkpoint
from helpers import REPO, cli_run, free_port, ours, together   # pylint: disable=g-bad-import-order

TINY = ('--dataset=leaf_synthetic', '--model=logistic', '--clients_per_round=4',
        '--batch_size=5', '--budget_range=1,3', '--noplots', '--notensorboard')


def wait_for(condition, seconds: float, procs=()):
  deadline = time.time() + seconds
  while not condition():
    assert time.time() < deadline and all(p.poll() is None for p in procs)
    time.sleep(0.05)


@pytest.mark.slow
def test_a_frozen_process_stops_the_others_with_one_line_before_the_heartbeat_timeout(tmp_path):
  """Process 1 stopped (SIGSTOP) after a checkpoint: process 0 notices its silence (the
  watchdog's beats, half of --heartbeat_timeout) and ends with one line naming it and the
  checkpoint to resume from, status 3, long before JAX's heartbeat timeout would abort it."""
  procs = together(2, 1, [*TINY, '--num_rounds=100000', '--eval_every=1000',
                          '--checkpoint_every=20', '--heartbeat_timeout=20',
                          f'--workdir={tmp_path}'], wait=False)
  try:
    wait_for(lambda: list(tmp_path.glob('checkpoint-*[0-9]')), 200, procs)
    os.kill(procs[1].pid, signal.SIGSTOP)
    start = time.time()
    _, err = procs[0].communicate(timeout=120)
    took = time.time() - start
  finally:
    procs[1].kill()
    procs[1].communicate()
  lines = ours(err)
  assert procs[0].returncode == 3, err[-2000:]
  assert lines[-1].startswith('error: process 1 of the run sent no news for '), lines[-1]
  assert 'gone or frozen' in lines[-1] and 'resume from the checkpoint of round' in lines[-1]
  assert took < 20   # half the heartbeat timeout: before JAX's own abort


@pytest.mark.slow
def test_sigterm_to_every_process_stops_them_after_one_round_with_one_checkpoint(tmp_path):
  """A scheduler's SIGTERM to both processes of a run that checkpoints every round (process 1
  once saw the checkpoint of the stop's round late, entered a second save's barrier alone and
  both waited forever): both stop after the same round, status 130, its checkpoint intact (the
  resumed run's bit-identity: test_processes.py)."""
  flags = [*TINY, '--num_rounds=100000', '--eval_every=10', '--checkpoint_every=1',
           f'--workdir={tmp_path}']
  procs = together(2, 1, flags, wait=False)
  wait_for(lambda: len(list(tmp_path.glob('checkpoint-*[0-9]'))) >= 2, 200, procs)
  for p in procs:
    p.send_signal(signal.SIGTERM)
  outs = [p.communicate(timeout=120) for p in procs]
  lasts = [ours(err)[-1] for _, err in outs]
  assert [p.returncode for p in procs] == [130, 130], lasts
  assert lasts[0] == lasts[1] and lasts[0].startswith('interrupted after round '), lasts
  done = int(lasts[0].split()[3].rstrip(','))
  assert done in checkpoint.intact_rounds(str(tmp_path))   # the same command resumes from it


def start_alone(process_id: int, port: int, *more):
  return subprocess.Popen(
      [sys.executable, 'launch/run.py', *TINY, '--num_rounds=5', '--num_processes=2',
       f'--process_id={process_id}', f'--coordinator_address=127.0.0.1:{port}', *more],
      cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.slow
def test_sigterm_while_waiting_for_a_coordinator_nobody_serves_is_one_line(tmp_path):
  """Process 1 waits for a process 0 that never starts: SIGTERM ends the wait at once (it was
  ignored until JAX's start-up timeout, then a C++ abort), status 130, nothing written."""
  proc = start_alone(1, free_port(), f'--workdir={tmp_path / "run"}')
  time.sleep(3)
  start = time.time()
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=60)
  assert proc.returncode == 130 and time.time() - start < 20, err[-2000:]
  assert ours(err) == [ours(err)[-1]] and ours(err)[-1].startswith('interrupted'), err
  assert not (tmp_path / 'run').exists()


@pytest.mark.slow
def test_processes_that_never_meet_stop_with_one_line_at_the_initialization_timeout(tmp_path):
  """Process 1 alone: one line naming --coordinator_address and what to start, status 2, after
  --initialization_timeout (JAX's own expiry aborted the process)."""
  proc = start_alone(1, free_port(), '--initialization_timeout=3', f'--workdir={tmp_path}')
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 2, err[-2000:]
  (line,) = ours(err)
  assert line.startswith('error: --coordinator_address=127.0.0.1:') and (
      'had not all started within 3 s' in line and '--process_id 0 to' in line), line


def listening(port: int) -> bool:
  with socket.socket() as probe:
    return probe.connect_ex(('127.0.0.1', port)) == 0


@pytest.mark.slow
def test_a_second_process_0_is_refused_with_one_line(tmp_path):
  """Two processes given --process_id=0 (both waited, then were aborted without a word): the
  one that comes second finds the coordinator's port taken and says so; the first stops at
  --initialization_timeout with its own line."""
  port = free_port()
  first = start_alone(0, port, '--initialization_timeout=6', f'--workdir={tmp_path}')
  try:
    wait_for(lambda: listening(port), 60, [first])   # the first one's coordinator
    out = cli_run(*TINY, '--num_processes=2', '--process_id=0',
                  f'--coordinator_address=127.0.0.1:{port}', f'--workdir={tmp_path}')
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1, out.stderr
    assert f'--coordinator_address=127.0.0.1:{port}: port {port} is in use' in out.stderr
  finally:
    _, err = first.communicate(timeout=120)
  assert first.returncode == 2 and 'did not meet' in ours(err)[-1], err[-2000:]


@pytest.mark.parametrize('address', ['127.0.0.1', '127.0.0.1:http'])
def test_a_coordinator_address_without_a_port_number_is_one_line(address):
  out = cli_run(*TINY, '--num_processes=2', '--process_id=0', f'--coordinator_address={address}',
                '--workdir=unused')
  assert out.returncode == 2 and out.stderr.startswith('error: --coordinator_address='), out.stderr
  assert 'must be HOST:PORT' in out.stderr and len(out.stderr.splitlines()) == 1
