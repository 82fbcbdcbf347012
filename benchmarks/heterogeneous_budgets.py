"""Heterogeneous budgets: a round with ``tau_i ~ U{1..50}`` against homogeneous rounds of the same
mean work (``tau = 25`` and ``tau = 26``, mean 25.5), LEAF Synthetic logistic regression, FedAvg.

The engine sorts the cohort by budget and cuts it into chunks, each looping only to its own
largest ``tau_i``; masked steps happen only inside a chunk. More chunks waste fewer steps but
vmap fewer clients at a time. For each chunk size the script reports, in one process with one
compiled round per chunk size (the budgets are data, not constants):

* the heterogeneous and the two homogeneous round times (medians of ``--repeats`` rounds, timed
  alternately, ``block_until_ready``), and ``ratio = heterogeneous / mean(homogeneous)``;
* the useful fraction of computed client-steps (``sum_i tau_i / computed``).

``--static_steps``: the local-step loop's trip count (``core.round.build_round``'s
``static_steps``): ``auto`` the engine's default (each chunk's own largest budget on CPU, the
range's largest ``b`` on an accelerator, where a data-dependent loop may read its condition back
on the host once per step), ``true`` ``b`` for every chunk, ``false`` each chunk's own largest.

Devices: the planner's, as ``launch/run.py`` (on CPU one per core from 1,000 clients), or
``--num_devices``. On several devices each device cuts its share of the cohort into chunks of
at most 1/16 of that share (``core.round.routed_chunk``), so a requested chunk size above it runs
as that; the table shows the chunk each device runs and its number of chunks for a mean share.
``--num_devices 1`` sweeps the chunk sizes as asked.

Usage: ``python benchmarks/heterogeneous_budgets.py [--cohort 2000] [--chunk_sizes 0,500,250]
[--num_devices 1] [--plot PNG]`` (``0``: the engine's default chunk size); the results go to
``benchmarks/results/heterogeneous_budgets[-<variant>].json`` (``common.write_results``).
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import common  # pylint: disable=g-import-not-at-top,wrong-import-position


def measure(cohort: int, chunk_sizes: list[int], repeats: int, low: int, high: int,
            batch: int, static_steps: bool | None = None, num_devices: int = 0) -> list[dict]:
  _, data, _, loss, root, params = common.synthetic_workload()
  import jax
  import numpy as np
  import optax

  from fedjax_gel import algorithms
  from fedjax_gel.core import devices, federated_data, round as round_lib, sampling
  from fedjax_gel.core.backend import Backend
  from fedjax_gel.experiment import planning

  alg = algorithms.fedavg(loss, optax.sgd(0.01))
  state = alg.server_init(params)
  plan = lambda chunk_size: planning.devices_and_chunk(alg, params, data, cohort, batch,
                                                       low == high, chunk_size=chunk_size)
  try:   # the planner's devices, as launch/run.py's, or --num_devices
    mesh = plan(0)[0] if not num_devices else devices.client_mesh(num_devices)
  except ValueError as e:
    sys.exit(f'error: --num_devices={num_devices}: {e}')
  state = devices.replicate(state, mesh)   # as launch/run.py places them
  data = federated_data.to_device(data, mesh)
  num_used = 1 if mesh is None else mesh.size
  mean_tau = (low + high) / 2
  lo, hi = math.floor(mean_tau), math.ceil(mean_tau)
  kinds = {'heterogeneous': (low, high), 'homogeneous_lo': (lo, lo), 'homogeneous_hi': (hi, hi)}
  # Every kind runs in the round compiled for U{low..high}: its cohorts carry that spec (the
  # round reads B and the largest budget from it), their budgets are still the kind's own.
  spec = sampling.CohortSpec(cohort, (low, high), batch,
                             replace=True, weighting='samples_seen')   # the GeL code's
  cohorts = {k: [dataclasses.replace(
      sampling.sample_cohort(root, r, data.counts, dataclasses.replace(spec, budget_range=b)),
      spec=spec) for r in range(repeats + 1)] for k, b in kinds.items()}
  rows = []
  for chunk_size in chunk_sizes:
    chunk = plan(chunk_size)[1]
    rf = round_lib.build_round(alg, chunk_size=chunk, mesh=mesh, backend=Backend(
        fuse_small_dots=jax.default_backend() == 'cpu', static_steps=static_steps))
    t = time.perf_counter()
    compiled = rf.lower(state, cohorts['heterogeneous'][0], data, root, np.int32(0)).compile()
    compile_s = time.perf_counter() - t
    times = {k: [] for k in kinds}
    useful = computed = 0
    for k in kinds:   # warm-up
      jax.block_until_ready(compiled(state, cohorts[k][0], data, root, np.int32(0)))
    for r in range(1, repeats + 1):
      for k in kinds:   # alternately, so all kinds see the same machine load
        t = time.perf_counter()
        out, m = compiled(state, cohorts[k][r], data, root, np.int32(r))
        jax.block_until_ready(out)
        times[k].append(time.perf_counter() - t)
        if k == 'heterogeneous':
          useful += int(m.grad_computations)
          computed += int(m.computed_steps)
    med = {k: statistics.median(v) for k, v in times.items()}
    homogeneous = (med['homogeneous_lo'] + med['homogeneous_hi']) / 2
    per_device = common.device_chunk(cohort, chunk, mesh)
    rows.append({
        'cohort': cohort, 'devices': num_used, 'budgets': f'{low}..{high}',
        'static_steps': {None: 'auto', True: 'true', False: 'false'}[static_steps],
        'chunk_size': per_device,
        'chunks': -(-(-(-cohort // num_used)) // per_device),   # for a mean share
        'compile_s': compile_s, 'heterogeneous_s': med['heterogeneous'],
        'homogeneous_lo_s': med['homogeneous_lo'], 'homogeneous_hi_s': med['homogeneous_hi'],
        'ratio': med['heterogeneous'] / homogeneous, 'useful_fraction': useful / computed,
        'device': f'{jax.devices()[0].platform}: {jax.devices()[0].device_kind}',
    })
  return rows


def columns(low: int, high: int) -> list:
  lo, hi = math.floor((low + high) / 2), math.ceil((low + high) / 2)
  ms = lambda key: lambda r: r[key] * 1e3
  return [
      common.CLIENTS,
      common.DEVICES,
      common.Column('chunk', 'chunk a device', format='{:,}', get=lambda r: r['chunk_size']),
      common.Column('chunks', 'chunks a device'),
      common.Column('static_steps', 'static steps', left=True),
      common.COMPILE_S,
      common.Column('heterogeneous_ms', f'U{{{low}..{high}}} ms', 'ms', 'lower', '{:.1f}',
                    get=ms('heterogeneous_s')),
      common.Column('homogeneous_lo_ms', f'tau={lo} ms', 'ms', '', '{:.1f}',
                    get=ms('homogeneous_lo_s')),
      common.Column('homogeneous_hi_ms', f'tau={hi} ms', 'ms', '', '{:.1f}',
                    get=ms('homogeneous_hi_s')),
      common.Column('ratio', 'ratio to homogeneous (target at most 1.2)', 'ratio', 'lower',
                    '{:.2f}'),
      common.Column('useful_steps', 'useful steps (of those computed)', 'fraction', 'higher',
                    '{:.2f}', get=lambda r: r['useful_fraction']),
  ]


def setting(low: int, high: int, batch: int) -> str:
  return (f'FedAvg on LEAF Synthetic, tau_i ~ U{{{low}..{high}}} against the homogeneous rounds '
          f'of the same mean work, B = {batch}; medians, the three timed alternately')


def table(rows: list[dict], low: int, high: int, batch: int = 5) -> str:
  cols = columns(low, high)
  return (setting(low, high, batch) + '\n\n'
          + common.markdown_table(cols, common.figures(cols, rows)))


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--cohort', type=int, default=2000, help='clients per round')
  p.add_argument('--chunk_sizes', default='0,500,250,125',
                 help="chunk sizes compared, comma-separated; 0: the planner's")
  p.add_argument('--budget_range', default='1,50',
                 help='a,b: tau_i ~ U{a..b}, against equal budgets of its mean')
  p.add_argument('--batch_size', type=int, default=5, help='examples per local step (B)')
  p.add_argument('--repeats', type=int, default=10, help='rounds timed of each kind')
  p.add_argument('--static_steps', default='auto', choices=('auto', 'true', 'false'),
                 help="the local-step loop's trip count: the engine's default, the largest "
                      "budget for every chunk, or each chunk's own largest")
  p.add_argument('--num_devices', type=int, default=0,
                 help="devices the cohort is split over; 0: the planner's, as launch/run.py")
  p.add_argument('--json', help="also write the script's own rows (seconds) to this JSON file")
  p.add_argument('--plot', help='also plot the ratio and the useful fraction against the '
                                'number of chunks (PNG)')
  common.results_flags(p)
  a = p.parse_args(argv)
  variant = common.variant(p, a)
  a.json = common.json_flag(p, a.json)
  a.results_dir = common.check_results_dir(p, a.results_dir)
  chunk_sizes = common.int_list(p, 'chunk_sizes', a.chunk_sizes)
  low, high = common.budget_range(p, a.budget_range)
  common.at_least(p, 1, cohort=a.cohort, repeats=a.repeats, batch_size=a.batch_size)
  common.at_least(p, 0, chunk_sizes=chunk_sizes, num_devices=a.num_devices)
  static = {'auto': None, 'true': True, 'false': False}[a.static_steps]
  rows = measure(a.cohort, chunk_sizes, a.repeats, low, high, a.batch_size, static,
                 a.num_devices)
  common.report(rows, table(rows, low, high, a.batch_size), a.json)
  by_chunks = sorted(rows, key=lambda r: r['chunks'])
  xs = [r['chunks'] for r in by_chunks]
  common.plot(a.plot, f'tau_i ~ U{{{low}..{high}}}, {a.cohort:,} clients', 'budget-sorted chunks',
              'ratio / fraction',
              {'round time / homogeneous': (xs, [r['ratio'] for r in by_chunks]),
               'useful steps': (xs, [r['useful_fraction'] for r in by_chunks])}, log='x')
  common.write_results('heterogeneous_budgets', columns(low, high), rows, variant_name=variant,
                       results_dir=a.results_dir, setting=setting(low, high, a.batch_size),
                       notes=a.notes, plot=a.plot)


if __name__ == '__main__':
  main()
