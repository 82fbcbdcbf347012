"""Resuming after kill -9: the same outputs as an uninterrupted run, to the bit; reruns are
deterministic; damaged checkpoints and finished runs are handled."""
from __future__ import annotations

import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def command(data, workdir, *extra):
  return [sys.executable, 'launch/run.py', '--dataset=leaf', f'--data_path={data}',
          '--num_rounds=400', '--eval_every=2', '--checkpoint_every=10', '--clients_per_round=3',
          '--budget_range=1,3', '--batch_size=2', f'--workdir={workdir}', *extra]


def run(cmd):
  return subprocess.run(cmd, cwd=REPO, text=True, capture_output=True, check=False)


def metrics(workdir):
  """metrics.jsonl's records without the wall-clock field."""
  records = [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]
  for r in records:
    r.pop('elapsed_s')
  return records


def killed_then_resumed(cmd, workdir, checkpoints_dir):
  """Starts ``cmd``, kills it with SIGKILL at a random moment after its first checkpoint, then
  runs ``cmd`` again to the end; returns that second process."""
  proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 120
  while not list(checkpoints_dir.glob('checkpoint-*.msgpack')) and proc.poll() is None:
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


@pytest.mark.parametrize('extra', [[], ['--vmap_seeds=false']], ids=['vmapped', 'sequential'])
def test_resumed_run_equals_the_uninterrupted_one(tiny_leaf_file, uninterrupted, tmp_path, extra):
  """Two seeds, vmapped or one after another: kill -9, rerun the same command; every seed's
  metrics and final model are bit-identical to the uninterrupted run's, and no checkpoint is
  left."""
  workdir = tmp_path / 'killed'
  cmd = command(tiny_leaf_file, workdir, '--algorithms=gel', '--seeds=0,1', *extra)
  resumed = killed_then_resumed(cmd, workdir, workdir / 'seed0')
  assert resumed.returncode == 0, resumed.stderr
  for seed in ('seed0', 'seed1'):
    assert metrics(workdir / seed) == metrics(uninterrupted / seed)
    assert ((workdir / seed / 'model.msgpack').read_bytes() ==
            (uninterrupted / seed / 'model.msgpack').read_bytes())
    assert not list((workdir / seed).glob('checkpoint-*'))
    assert json.loads((workdir / seed / 'summary.json').read_text())['rounds'] == 400


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


def test_finished_runs_are_kept_and_a_damaged_checkpoint_is_one_line(tiny_leaf_file, tmp_path):
  workdir = tmp_path / 'run'
  cmd = command(tiny_leaf_file, workdir, '--num_rounds=20', '--algorithms=fedavg,gel')
  assert run(cmd).returncode == 0
  before = {p: p.read_bytes() for p in (workdir / 'gel').iterdir()}
  again = run(cmd)   # everything finished: nothing is trained again, nothing changes
  assert again.returncode == 0, again.stderr
  assert {p: p.read_bytes() for p in (workdir / 'gel').iterdir()} == before

  (workdir / 'gel' / 'summary.json').unlink()   # unfinished, with a damaged checkpoint
  (workdir / 'gel' / 'checkpoint-10.msgpack').write_bytes(b'\x00not msgpack')
  damaged = run(cmd)
  assert damaged.returncode == 2 and 'Traceback' not in damaged.stderr
  assert len(damaged.stderr.splitlines()) == 1
  assert 'checkpoint-10.msgpack' in damaged.stderr and '--overwrite' in damaged.stderr
  assert (workdir / 'gel' / 'metrics.jsonl').read_bytes() == before[workdir / 'gel' / 'metrics.jsonl']
