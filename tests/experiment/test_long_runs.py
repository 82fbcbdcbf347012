"""Long runs as users start them: ``launch/run.py`` as a whole process, long stretches without
evaluation, checkpoints, on every device count the planner may choose (CPU devices forced to 2
and 4, and 2 processes), with the metrics of one device (to float summation order).

Before ``loop.Loop.step`` bounded the rounds in flight, every run here on 2 or 4 devices was
aborted by XLA's CPU runtime after its 16th to 18th round (a collective whose partner never
came: ``experiment.loop``'s doc); ``UNBOUNDED`` runs that loop again, which the watchdog
(``experiment.watchdog``) now ends with one line. A stalled run resumes from its checkpoint,
also on another device count."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from helpers import REPO, cli_run, together   # pylint: disable=g-bad-import-order

# Every algorithm family with a per-client store (SCAFFOLD's rows; ClusterFedVARP's rows shared
# by a cluster, the mean of their writes) or a pre-pass (Mimelite's full-batch gradient;
# power-of-d's candidates' losses, for all three), 60 rounds each without an evaluation and a
# checkpoint half-way: an unbounded loop queues 33 programs by round 17.
ALGORITHMS = ('scaffold', 'cluster_fedvarp', 'mimelite_sgdm')
LONG = ('--dataset=leaf_synthetic', '--model=logistic', '--clients_per_round=40',
        '--batch_size=5', '--budget_range=4,13', '--num_rounds=60', '--eval_every=60',
        '--checkpoint_every=30', '--client_selection=power_of_d',
        '--algorithm=scaffold,cluster_fedvarp,mimelite', '--noplots', '--notensorboard')
KEYS = ('test_loss', 'train_loss', 'test_accuracy', 'grad_computations', 'client_rounds')


def records(workdir) -> dict:
  """``{algorithm: [record]}`` of a command's runs."""
  return {name: [json.loads(line) for line in
                 (workdir / name / 'metrics.jsonl').read_text().splitlines()]
          for name in ALGORITHMS}


def assert_same_metrics(ours: dict, reference: dict):
  for name in ALGORITHMS:
    assert [r['round'] for r in ours[name]] == [r['round'] for r in reference[name]] == [0, 60]
    for key in KEYS:
      # the devices' partial sums added in another order, for 60 rounds
      np.testing.assert_allclose([r[key] for r in ours[name]], [r[key] for r in reference[name]],
                                 rtol=1e-4, err_msg=f'{name} {key}')


@pytest.fixture(scope='module')
def one_device(tmp_path_factory):
  """The runs on one device (in this process: its one CPU device)."""
  workdir = tmp_path_factory.mktemp('one') / 'run'
  out = cli_run(*LONG, '--num_devices=1', f'--workdir={workdir}')
  assert out.returncode == 0, out.stderr[-2000:]
  return records(workdir)


@pytest.mark.parametrize('count', [2, 4])
@pytest.mark.slow
def test_long_stretches_without_evaluation_finish_on_every_device_count(tmp_path, one_device,
                                                                         count):
  """``launch/run.py`` on ``count`` CPU devices (``--num_devices=0``: the planner's choice, all of
  them for this work? forced here, as on a many-core host) finishes every run with the metrics
  of one device."""
  env = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} "
             f'--xla_force_host_platform_device_count={count}')
  out = subprocess.run([sys.executable, 'launch/run.py', *LONG, f'--num_devices={count}',
                        f'--workdir={tmp_path}'], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=400, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  assert_same_metrics(records(tmp_path), one_device)


@pytest.mark.slow
def test_two_processes_run_long_stretches_with_the_metrics_of_one_device(tmp_path, one_device):
  """Two processes of one device each (a round waited for in each: ``loop``'s doc)."""
  for code, _, err in together(2, 1, [*LONG, f'--workdir={tmp_path}']):
    assert code == 0, err[-3000:]
  assert_same_metrics(records(tmp_path), one_device)


def run_script(script: str, count: int, workdir, *more):
  """``script`` (Python source that ends by running ``cli.main`` on ``sys.argv[1:]``) with
  ``LONG`` and ``more`` as its arguments, on ``count`` CPU devices."""
  env = dict(os.environ, PYTHONPATH=str(REPO),
             XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} "
             f'--xla_force_host_platform_device_count={count}')
  return subprocess.run([sys.executable, '-c', script, *LONG, f'--num_devices={count}',
                         f'--workdir={workdir}', *more], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=400, check=False)


COMMAND = """
import sys
from fedjax_gel.experiment import cli, loop
{patch}
sys.exit(cli.main(['run.py', *sys.argv[1:]]))
"""
# the loop as it was before its bound on the rounds in flight
UNBOUNDED = COMMAND.format(patch='loop.IN_FLIGHT_ROUNDS = 10**6')
# a round that never finishes: round 41 of the first run (after its checkpoint of round 30)
STALLS_AT_41 = COMMAND.format(patch="""
import time
step = loop.Loop.step
def stalling(self, r):
  if r == 40:
    time.sleep(10**6)
  step(self, r)
loop.Loop.step = stalling""")


@pytest.mark.slow
def test_the_unbounded_loop_stalls_and_the_watchdog_ends_it_with_one_line(tmp_path, one_device):
  """The loop without its bound deadlocks in XLA's CPU runtime (each try of it, 2 devices): the
  watchdog ends it with one line and status 3 instead of XLA's abort (status 134, a page of
  C++ stack traces); the same command then finishes with the metrics of one device."""
  out = run_script(UNBOUNDED, 2, tmp_path, '--stall_timeout=3')
  assert out.returncode == 3, out.stderr[-3000:]
  line = out.stderr.splitlines()[-1]
  assert line.startswith('error: round') and 'made no progress for' in line, line
  # where the deadlock strikes is XLA's (on a loaded machine it came after the checkpoint of 30)
  assert 'on cpu devices 0-1' in line and re.search(
      r'run the same command to resume from (the start|the checkpoint of round \d+)', line)
  out = run_script(COMMAND.format(patch=''), 2, tmp_path)
  assert out.returncode == 0, out.stderr[-3000:]
  assert_same_metrics(records(tmp_path), one_device)


@pytest.mark.slow
def test_a_stalled_run_resumes_from_its_checkpoint_under_another_device_count(tmp_path,
                                                                              one_device):
  """A round that never finishes (2 devices): one line naming it and the checkpoint the same
  command resumes from, status 3; resumed on one device (``--num_devices`` only changes the
  order of the sums), with a note, the config recording the count it went on with, and the
  metrics of one device."""
  out = run_script(STALLS_AT_41, 2, tmp_path, '--stall_timeout=3')
  assert out.returncode == 3, out.stderr[-3000:]
  line = out.stderr.splitlines()[-1]
  assert line.startswith('error: rounds 39-41 made no progress for'), line   # 41 dispatched
  assert line.endswith('run the same command to resume from the checkpoint of round 30'), line
  out = cli_run(*LONG, '--num_devices=1', f'--workdir={tmp_path}')
  assert out.returncode == 0, out.stderr[-2000:]
  notes = [l for l in out.stdout.splitlines() if 'resumed with --num_devices=1' in l]
  assert len(notes) == len(ALGORITHMS) and "ran with --num_devices=2" in notes[0], out.stdout
  for name in ALGORITHMS:
    config = json.loads((tmp_path / name / 'config.json').read_text())
    assert config['run']['num_devices'] == 1
  assert_same_metrics(records(tmp_path), one_device)
