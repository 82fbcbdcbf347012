"""``launch/run.py`` as several processes of JAX's multi-controller runtime (CPU, gloo): the
same metrics as one process, only process 0 writes."""
from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]
ALGORITHMS = ('fedavgcm', 'gel', 'scaffold')


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def records(workdir: pathlib.Path) -> list[dict]:
  return [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]


def test_two_processes_give_the_metrics_of_one(tmp_path, tiny_leaf_file):
  common = ['launch/run.py', '--dataset=leaf', f'--data_path={tiny_leaf_file}', '--num_rounds=6',
            '--eval_every=2', '--clients_per_round=4', '--batch_size=2', '--budget_range=1,3',
            f'--algorithm={",".join(ALGORITHMS)}']
  one = subprocess.run([sys.executable, *common, f'--workdir={tmp_path / "one"}'], cwd=REPO,
                       text=True, capture_output=True, check=False)
  assert one.returncode == 0, one.stderr[-2000:]
  port = free_port()
  env = {**os.environ, 'XLA_FLAGS': f"{os.environ.get('XLA_FLAGS', '')} "
         '--xla_force_host_platform_device_count=2'}   # 2 processes x 2 devices
  procs = [subprocess.Popen(
      [sys.executable, *common, f'--workdir={tmp_path / "two"}', '--num_processes=2',
       f'--process_id={i}', f'--coordinator_address=127.0.0.1:{port}'], cwd=REPO, env=env,
      text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in (1, 0)]
  outs = [p.communicate(timeout=300) for p in procs]
  for p, (_, err) in zip(procs, outs):
    assert p.returncode == 0, err[-2000:]
  second, first = outs
  ours = lambda text: [l for l in text.splitlines() if not l.startswith('[Gloo]')]  # gloo's own
  assert ours(second[0]) == [] and 'all runs:' not in second[1]   # process 1 prints nothing
  assert 'outputs:' in first[0] and str(tmp_path / 'two') in first[0]
  for name in ALGORITHMS:
    alone, together = records(tmp_path / 'one' / name), records(tmp_path / 'two' / name)
    assert [r['round'] for r in together] == [r['round'] for r in alone] == [0, 2, 4, 6]
    for key in ('test_loss', 'train_loss', 'test_accuracy', 'grad_computations'):
      # equal up to the order of the sums over 4 devices (SCAFFOLD's store: 1e-7 at round 6)
      np.testing.assert_allclose([r[key] for r in together], [r[key] for r in alone],
                                 rtol=1e-5, err_msg=f'{name} {key}')
    config = json.loads((tmp_path / 'two' / name / 'config.json').read_text())
    assert config['algorithm']['name'] == name
    assert json.loads((tmp_path / 'two' / name / 'summary.json').read_text())['status'] == (
        'finished')
  written = sorted(str(p.relative_to(tmp_path / 'two')) for p in (tmp_path / 'two').rglob('*')
                   if p.is_file() and 'tensorboard' not in p.parts)
  assert written == sorted(str(p.relative_to(tmp_path / 'one')) for p in
                           (tmp_path / 'one').rglob('*')
                           if p.is_file() and 'tensorboard' not in p.parts)
