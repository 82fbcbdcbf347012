"""The client axis split over 1, 2, 4, ... devices: round time, speedup and equality.

LEAF Synthetic logistic regression, FedAvg (client SGD lr 0.01), ``tau = 13``, ``B = 5``, cohorts
drawn with replacement from the 1,000 LEAF Synthetic clients. For each cohort size the same
cohorts run with the client axis sharded over each device count (a ``'clients'`` mesh, data
and server state placed on it once, as ``launch/run.py`` does); round times are medians of
``--repeats`` rounds, the device counts timed alternately in one process. ``max |diff|`` is the
largest difference of the new server model from the one-device round's (the psum adds the
devices' partial sums in another order, so it is float rounding, not zero).

On CPU the script presents ``max(--devices)`` CPU devices before JAX starts
(``--xla_force_host_platform_device_count``); they share the host's cores, so beyond the core
count the speedup stops. On GPU or TPU hosts the real devices are used.

Usage: ``python benchmarks/device_scaling.py [--devices 1,2,4,8] [--cohorts 2000,10000]
[--plot benchmarks/plots/device_scaling.png]``; the results go to
``benchmarks/results/device_scaling[-<variant>].json`` (``common.write_results``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import common  # pylint: disable=g-import-not-at-top,wrong-import-position

TAU, BATCH = 13, 5


def measure(cohorts: list[int], counts: list[int], repeats: int) -> list[dict]:
  _, data, _, loss, root, params = common.synthetic_workload(cpu_devices=max(counts))
  import jax
  import numpy as np
  import optax

  from fedjax_gel import algorithms
  from fedjax_gel.core import federated_data, round as round_lib, sampling, store
  from fedjax_gel.experiment import planning

  if max(counts) > jax.device_count():
    print(f'error: --devices asks for {max(counts)} devices, {jax.device_count()} present',
          file=sys.stderr)
    sys.exit(2)
  alg = algorithms.fedavg(loss, optax.sgd(0.01))
  rows = []
  for cohort in cohorts:
    spec = sampling.CohortSpec(cohort, (TAU, TAU), BATCH,
                               replace=True, weighting='samples_seen')   # the GeL code's
    samples = [sampling.sample_cohort(root, r, data.counts, spec) for r in range(repeats + 1)]
    runs = {}
    for n in counts:
      mesh, chunk = planning.devices_and_chunk(alg, params, data, cohort, BATCH, True,
                                               num_devices=n)
      state = store.place_state(alg.server_init(params), alg, mesh)
      pool = federated_data.to_device(data, mesh)
      t = time.perf_counter()
      compiled = common.built_round(round_lib, alg, chunk, mesh).lower(
          state, samples[0], pool, root, np.int32(0)).compile()
      compile_s = time.perf_counter() - t
      out = jax.block_until_ready(compiled(state, samples[0], pool, root, np.int32(0))[0])
      runs[n] = dict(compiled=compiled, state=state, pool=pool, compile_s=compile_s,
                     chunk=common.device_chunk(cohort, chunk, mesh), out=out, times=[])
    for r in range(1, repeats + 1):   # alternately, so every device count sees the same load
      for n in counts:
        run = runs[n]
        t = time.perf_counter()
        jax.block_until_ready(run['compiled'](run['state'], samples[r], run['pool'], root,
                                              np.int32(r)))
        run['times'].append(time.perf_counter() - t)
    base = statistics.median(runs[counts[0]]['times'])
    reference = jax.tree_util.tree_leaves(runs[counts[0]]['out'])
    for n in counts:
      run = runs[n]
      round_s = statistics.median(run['times'])
      diff = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                 for a, b in zip(jax.tree_util.tree_leaves(run['out']), reference))
      rows.append({'cohort': cohort, 'devices': n, 'chunk_size': run['chunk'],
                   'compile_s': run['compile_s'], 'round_s': round_s,
                   'examples_per_s': cohort * TAU * BATCH / round_s,
                   'speedup': base / round_s, 'max_abs_diff': diff,
                   'device': f'{jax.devices()[0].platform}: {jax.devices()[0].device_kind}'})
      print(f'{cohort} clients, {n} devices: {round_s * 1e3:.2f} ms', file=sys.stderr)
  return rows


COLUMNS = [
    common.CLIENTS, common.DEVICES, common.CHUNK, common.COMPILE_S, common.ROUND_MS,
    common.Column('examples_per_s', 'examples/s', 'examples/s', 'higher', '{:,.0f}'),
    common.Column('speedup', 'speedup (over the first device count)', 'x', 'higher', '{:.2f}'),
    common.Column('max_abs_diff', 'max abs diff vs first', '', 'lower', '{:.1e}'),
]
SETTING = (f'FedAvg on LEAF Synthetic, tau = {TAU}, B = {BATCH}; round: median, the device '
           'counts timed alternately in one process')


def table(rows: list[dict]) -> str:
  return SETTING + '\n\n' + common.markdown_table(COLUMNS, common.figures(COLUMNS, rows))


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--devices', default='1,2,4,8', help='device counts to compare (first: base)')
  p.add_argument('--cohorts', default='2000,10000',
                 help='clients per round, comma-separated')
  p.add_argument('--repeats', type=int, default=10, help='rounds timed per device count')
  p.add_argument('--json', help="also write the script's own rows (seconds) to this JSON file")
  p.add_argument('--plot', help='also plot the speedup against the device count (PNG)')
  common.results_flags(p)
  a = p.parse_args(argv)
  variant = common.variant(p, a)
  a.json = common.json_flag(p, a.json)
  a.results_dir = common.check_results_dir(p, a.results_dir)
  counts = common.int_list(p, 'devices', a.devices)
  cohorts = common.int_list(p, 'cohorts', a.cohorts)
  common.at_least(p, 1, devices=counts, cohorts=cohorts, repeats=a.repeats)
  if len(set(counts)) < len(counts) or len(set(cohorts)) < len(cohorts):
    p.exit(2, 'error: --devices and --cohorts must not repeat a value\n')
  rows = measure(cohorts, counts, a.repeats)
  common.report(rows, table(rows), a.json)
  common.plot(a.plot, 'Client axis over devices (LEAF Synthetic, FedAvg)', 'devices',
              f'speedup over {counts[0]} device(s)',
              {f'{c:,} clients': ([r['devices'] for r in rows if r['cohort'] == c],
                                  [r['speedup'] for r in rows if r['cohort'] == c])
               for c in cohorts})
  common.write_results('device_scaling', COLUMNS, rows, variant_name=variant,
                       results_dir=a.results_dir, setting=SETTING, notes=a.notes, plot=a.plot)


if __name__ == '__main__':
  main()
