"""Where a round's time goes: the compiled round's kernels ranked by time (``jax.profiler``).

FedAvgCM on LEAF Synthetic (logistic regression, client SGD lr 0.01 with momentum 0.9,
``tau = 13``, ``B = 5``), one chunk on one device. After a warm-up round, ``--rounds`` rounds run
under ``jax.profiler.trace``; the trace's events are summed per kernel name (thunk runtime events
on CPU; the wrappers of loops and whole executions are left out) and divided by the rounds.
``share`` is a kernel's time over the summed time of all kernels (on CPU two threads may run
kernels at once, so the sum can exceed the round's wall time, which is printed too).

Usage: ``python benchmarks/profile_round.py [--clients 200] [--fuse_dots true|false] [--top 12]``
"""
from __future__ import annotations

import argparse
import collections
import glob
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import common  # pylint: disable=g-import-not-at-top,wrong-import-position

TAU, BATCH = 13, 5
WRAPPERS = ('ThunkExecutor', 'while', 'PjitFunction', 'block_until_ready')


def profile(clients: int, fuse_dots: bool, rounds: int) -> tuple[float, list[tuple[str, float, float]]]:
  """``(median round ms, [(kernel, us per round, calls per round)])``, slowest first."""
  _, data, _, loss, root, params = common.synthetic_workload(cpu_devices=1)
  import jax
  import numpy as np

  from fedjax_gel import algorithms
  from fedjax_gel.core import round as round_lib, sampling

  alg = algorithms.fedavgcm(loss, 0.01, 0.9)
  state = alg.server_init(params)
  rf = round_lib.build_round(alg, batch_size=BATCH, max_budget=TAU, chunk_size=clients,
                             fuse_dots=fuse_dots)
  cohorts = [sampling.sample_cohort(root, r, data.counts, cohort_size=clients,
                                    budget_range=(TAU, TAU), replace=True, batch_size=BATCH)
             for r in range(rounds + 1)]
  compiled = rf.lower(state, cohorts[0], data, root, np.int32(0)).compile()
  jax.block_until_ready(compiled(state, cohorts[0], data, root, np.int32(0)))
  times = []
  for r in range(1, rounds + 1):
    t = time.perf_counter()
    jax.block_until_ready(compiled(state, cohorts[r], data, root, np.int32(r)))
    times.append(time.perf_counter() - t)
  total, calls = collections.Counter(), collections.Counter()
  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir):
      for r in range(1, rounds + 1):
        jax.block_until_ready(compiled(state, cohorts[r], data, root, np.int32(r)))
    path = glob.glob(os.path.join(trace_dir, '**', '*.xplane.pb'), recursive=True)[0]
    trace = jax.profiler.ProfileData.from_file(path)
    for plane in trace.planes:
      for line in plane.lines:
        if line.name == 'python':
          continue
        for event in line.events:
          if not event.name.startswith(WRAPPERS):
            total[event.name] += event.duration_ns
            calls[event.name] += 1
  ranked = [(k, v / rounds / 1e3, calls[k] / rounds) for k, v in total.most_common()]
  return statistics.median(times) * 1e3, ranked


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--clients', type=int, default=200)
  p.add_argument('--fuse_dots', default='true', choices=('true', 'false'),
                 help="the round's fused small products (core.small_dots) on or off")
  p.add_argument('--rounds', type=int, default=20)
  p.add_argument('--top', type=int, default=12)
  a = p.parse_args(argv)
  if min(a.clients, a.rounds, a.top) <= 0:
    p.exit(2, 'error: --clients, --rounds and --top must be positive\n')
  round_ms, ranked = profile(a.clients, a.fuse_dots == 'true', a.rounds)
  summed = sum(us for _, us, _ in ranked)
  print(f'{a.clients} clients, fuse_dots={a.fuse_dots}: round {round_ms:.2f} ms (median of '
        f'{a.rounds}); kernels sum to {summed / 1e3:.2f} ms a round\n')
  print('| kernel | us per round | calls per round | share |')
  print('|---|---:|---:|---:|')
  for name, us, n in ranked[:a.top]:
    print(f'| `{name}` | {us:,.0f} | {n:.0f} | {us / summed:.2f} |')


if __name__ == '__main__':
  main()
