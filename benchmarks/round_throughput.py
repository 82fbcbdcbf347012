"""Round throughput of the vectorised engine vs the batched limit, LEAF Synthetic logistic regression.

For each cohort size C (default 20, 200, 2,000, 10,000 clients; sampled with replacement from the
1,000 LEAF Synthetic clients), every client runs ``tau`` SGD steps of batch ``B`` of FedAvg, or of
SCAFFOLD or FedVARP (``--algorithm``: the same local work plus the per-client store, 1,000 rows
gathered and written inside the round). Reported:

* compile time of the round (separately, never inside throughput); the round is compiled with
  the options ``launch/run.py`` gives it (``experiment.planning.quick_compile``: XLA's legacy
  emitters for a round as small as 20 clients here, whose local-step loop XLA then compiles as
  one kernel, ``core.backend.xla.configure_cpu``; XLA's defaults from 200 clients);
* round time, two ways, each round's state fed to the next (``common.chained_rounds``): each
  round waited for (``block_until_ready``) before the next is dispatched, the median round
  (its latency; ``launch/run.py``'s loop runs so with several processes), and *in a row*, the
  rounds dispatched while earlier ones run, as the loop runs in one process (a block's time
  over its rounds, the median over the blocks: the throughput); ``BLOCKS`` blocks of
  ``--repeats`` rounds of fresh cohorts each way, after a warm-up round;
* useful examples/s ``= sum_i tau_i B / round time`` (each round waited for) and
  client-steps/s;
* the *batched limit*, measured in the same process: the time of one jitted SGD step of a single
  model on all ``C tau B`` examples gathered from the same pool (one big batch, the most efficient
  way to push that many examples through the model), timed the same two ways, alternately with
  the rounds so both see the same machine load, and ``ratio = batched time / round time``;
* on CPU each core is presented as a device and cohorts of at least 200 clients per device are
  split over them (``fedjax_gel.core.devices``); the batched step uses XLA's own threads;
* peak memory: the process's peak resident set (each cohort size runs in its own process), and
  the device's peak bytes where the backend reports them (GPU/TPU).

Usage: ``python benchmarks/round_throughput.py [--cohorts 20,200,2000,10000] [--repeats 10]
[--algorithm fedavg|scaffold|fedvarp] [--fuse_dots auto|true|false] [--plot PNG]``
(``pip install -e '.[bench]'`` adds psutil, used to name the host's memory). The results go to
``benchmarks/results/round_throughput[-<variant>].json`` (``common.write_results``).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import common  # pylint: disable=g-import-not-at-top,wrong-import-position


ALGORITHMS = ('fedavg', 'scaffold', 'fedvarp')
BLOCKS = 3   # alternations of the round and the batched step, each way of timing them


def measure(cohort: int, tau: int, batch: int, repeats: int, chunk_size: int,
            num_devices: int, algorithm: str = 'fedavg', population: int = 0,
            fuse_dots: bool | None = None) -> dict:
  """Runs in a fresh process: one cohort size, engine round vs batched limit."""
  _, data, _, loss, root, params = common.synthetic_workload(population)
  import jax
  import numpy as np
  import optax

  from fedjax_gel import algorithms
  from fedjax_gel.core import devices, federated_data, round as round_lib, sampling, store
  from fedjax_gel.experiment import planning  # pylint: disable=g-import-not-at-top

  population = data.num_clients
  alg = {'fedavg': lambda: algorithms.fedavg(loss, optax.sgd(0.01)),
         'scaffold': lambda: algorithms.scaffold(loss, 0.01, population),
         'fedvarp': lambda: algorithms.fedvarp(loss, 0.01, np.full(population, 1 / population)),
         }[algorithm]()
  state = alg.server_init(params)
  try:
    mesh = devices.client_mesh(num_devices or devices.auto_num_devices(cohort,
                                                                       jax.device_count()))
  except ValueError as e:
    sys.exit(f'--num_devices={num_devices}: {e}')
  state = store.place_state(state, alg, mesh)   # as launch/run.py places them
  pool = federated_data.to_device(data, mesh)
  num_used = 1 if mesh is None else mesh.size
  if chunk_size == 0:
    chunk_size = planning.default_chunk_size(cohort, params, planning.example_bytes(data),
                                             batch, num_used)
  rf = common.built_round(round_lib, alg, chunk_size, mesh,
                          common.launch_compiler_options(params, cohort, (tau, tau), batch),
                          fuse_small_dots=fuse_dots)
  spec = sampling.CohortSpec(cohort, (tau, tau), batch,
                             replace=True, weighting='samples_seen')   # the GeL code's
  cohorts = [sampling.sample_cohort(root, r, data.counts, spec) for r in range(repeats + 1)]

  t = time.perf_counter()
  compiled = rf.lower(state, cohorts[0], pool, root, np.int32(0)).compile()
  compile_s = time.perf_counter() - t
  mem = compiled.memory_analysis()
  temp_bytes = getattr(mem, 'temp_size_in_bytes', None) if mem is not None else None

  @jax.jit
  def batched_step(p, examples, rows):
    b = {k: v[rows] for k, v in examples.items()}
    return jax.tree_util.tree_map(lambda w, g: w - 0.01 * g, p, jax.grad(loss)(p, b))

  out, metrics = compiled(state, cohorts[0], pool, root, np.int32(0))   # warm-up
  useful = int(metrics.examples)
  rows = jax.random.randint(jax.random.key(1), (useful,), 0, data.num_examples)
  jax.block_until_ready((out, batched_step(params, data.examples, rows)))

  def round_step(carry, r):
    return compiled(carry[0], cohorts[r], pool, root, np.int32(r))

  def batched_chain(p, r):
    del r
    return batched_step(p, data.examples, rows)

  timed = {(side, wait): [] for side in ('round', 'batched') for wait in (True, False)}
  for _ in range(BLOCKS):   # alternated, so both see the same machine load
    for wait in (True, False):
      timed['round', wait] += common.chained_rounds(round_step, (state, metrics), repeats,
                                                    wait)[1]
      timed['batched', wait] += common.chained_rounds(batched_chain, params, repeats, wait)[1]
  median = {k: statistics.median(v) for k, v in timed.items()}
  round_s, batched_s = median['round', True], median['batched', True]
  chained_s, batched_chained_s = median['round', False], median['batched', False]
  computed = int(metrics.computed_steps) * batch

  device_peak = None
  stats = jax.devices()[0].memory_stats() or {}
  if 'peak_bytes_in_use' in stats:
    device_peak = int(stats['peak_bytes_in_use'])
  return {
      'algorithm': algorithm, 'population': data.num_clients, 'cohort': cohort, 'tau': tau,
      'fuse_dots': jax.default_backend() == 'cpu' if fuse_dots is None else fuse_dots,
      'batch': batch,
      'devices': num_used,
      'chunk_size': common.device_chunk(cohort, chunk_size, mesh),
      'compile_s': compile_s, 'round_s': round_s, 'examples_per_s': useful / round_s,
      'client_steps_per_s': useful / batch / round_s, 'useful_fraction': useful / computed,
      'batched_s': batched_s, 'ratio_to_batched': batched_s / round_s,
      'chained_round_s': chained_s, 'batched_chained_s': batched_chained_s,
      'chained_ratio_to_batched': batched_chained_s / chained_s,
      'peak_rss_bytes': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
      'xla_temp_bytes': temp_bytes, 'device_peak_bytes': device_peak,
      'device': f'{jax.devices()[0].platform}: {jax.devices()[0].device_kind}',
  }


def mib(b):
  return None if b is None else b / 2**20


COLUMNS = [
    common.Column('algorithm', 'algorithm', left=True,
                  get=lambda r: r['algorithm'] + ('' if r.get('fuse_dots', True)
                                                  else ' (unfused products)')),
    common.CLIENTS, common.DEVICES, common.CHUNK, common.COMPILE_S, common.ROUND_MS,
    common.Column('useful_examples_per_s', 'useful examples/s', 'examples/s', 'higher',
                  '{:,.0f}', get=lambda r: r['examples_per_s']),
    common.Column('client_steps_per_s', 'client-steps/s', 'client-steps/s', 'higher',
                  '{:,.0f}'),
    common.Column('useful_steps', 'useful steps (of those computed)', 'fraction', 'higher',
                  '{:.2f}', get=lambda r: r['useful_fraction']),
    common.Column('batched_limit_ms', 'batched limit ms', 'ms', '', '{:.2f}',
                  get=lambda r: r['batched_s'] * 1e3),
    common.Column('ratio_to_batched', 'ratio to batched (<1: slower than the batched step)',
                  'ratio', 'higher', '{:.2f}'),
    common.Column('round_ms_in_a_row', 'round ms, in a row', 'ms', 'lower', '{:.2f}',
                  get=lambda r: r['chained_round_s'] * 1e3),
    common.Column('batched_limit_ms_in_a_row', 'batched limit ms, in a row', 'ms', '',
                  '{:.2f}', get=lambda r: r['batched_chained_s'] * 1e3),
    common.Column('ratio_to_batched_in_a_row', 'ratio to batched, in a row', 'ratio', 'higher',
                  '{:.2f}', get=lambda r: r['chained_ratio_to_batched']),
    common.Column('peak_rss_mib', 'peak RSS MiB', 'MiB', 'lower', '{:,.0f}',
                  get=lambda r: mib(r['peak_rss_bytes'])),
    common.Column('xla_temp_mib', 'XLA temp MiB', 'MiB', 'lower', '{:,.0f}',
                  get=lambda r: mib(r['xla_temp_bytes'])),
    common.Column('device_peak_mib', 'device peak MiB', 'MiB', 'lower', '{:,.0f}',
                  get=lambda r: mib(r['device_peak_bytes'])),
]


def setting(rows: list[dict]) -> str:
  r = rows[0]
  return (f'{r["algorithm"]} on LEAF Synthetic (population {r["population"]:,}), tau = '
          f'{r["tau"]}, B = {r["batch"]}; round and batched limit: medians, each round waited '
          'for, and in a row')


def table(rows: list[dict]) -> str:
  return setting(rows) + '\n\n' + common.markdown_table(COLUMNS, common.figures(COLUMNS, rows))


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--cohorts', default='20,200,2000,10000',
                 help='clients per round, comma-separated; each size in a process of its own')
  p.add_argument('--tau', type=int, default=13, help='local steps of every client')
  p.add_argument('--batch_size', type=int, default=5, help='examples per local step (B)')
  p.add_argument('--repeats', type=int, default=10,
                 help='rounds per block; the round and the batched step alternate in '
                      f'{BLOCKS} blocks of this many rounds each way of timing')
  p.add_argument('--chunk_size', type=int, default=0,
                 help="clients per chunk; 0: the planner's, as launch/run.py")
  p.add_argument('--num_devices', type=int, default=0,
                 help='devices the cohort is split over; 0: automatic (on CPU, one per core)')
  p.add_argument('--algorithm', default='fedavg',
                 help=f'the algorithm of the measured rounds: {", ".join(ALGORITHMS)}')
  p.add_argument('--population', type=int, default=0,
                 help='clients to sample from (copies of the 1,000 LEAF Synthetic clients); '
                      '0: the 1,000 themselves')
  p.add_argument('--fuse_dots', default='auto', choices=('auto', 'true', 'false'),
                 help="the round's fused small products (core.backend.small_dots); auto: on CPU, as "
                 'the published configurations run them')
  p.add_argument('--json', help="also write the script's own rows (seconds, bytes) to this "
                                'JSON file')
  p.add_argument('--plot', help='also plot examples/s of the round and of the batched limit '
                                'against the cohort size (PNG)')
  common.results_flags(p)
  p.add_argument('--single', type=int, help=argparse.SUPPRESS)
  a = p.parse_args(argv)
  variant = common.variant(p, a)
  a.json = common.json_flag(p, a.json)
  a.results_dir = common.check_results_dir(p, a.results_dir) if not a.single else ''
  cohorts = common.int_list(p, 'cohorts', a.cohorts)
  if a.algorithm not in ALGORITHMS:
    p.exit(2, f'error: --algorithm must be one of {", ".join(ALGORITHMS)} (got {a.algorithm!r})\n')
  common.at_least(p, 1, cohorts=cohorts, tau=a.tau, batch_size=a.batch_size, repeats=a.repeats)
  common.at_least(p, 0, chunk_size=a.chunk_size, population=a.population,
                  num_devices=a.num_devices)
  if a.single:
    fuse = {'auto': None, 'true': True, 'false': False}[a.fuse_dots]
    print(json.dumps(measure(a.single, a.tau, a.batch_size, a.repeats, a.chunk_size,
                             a.num_devices, a.algorithm, a.population, fuse)))
    return
  rows = []
  for c in cohorts:   # one process per cohort size: its peak memory is its own
    rows.append(common.in_fresh_process(__file__, c, [
        '--tau', str(a.tau), '--batch_size', str(a.batch_size), '--repeats', str(a.repeats),
        '--chunk_size', str(a.chunk_size), '--num_devices', str(a.num_devices),
        '--algorithm', a.algorithm, '--population', str(a.population),
        '--fuse_dots', a.fuse_dots]))
    r = rows[-1]
    print(f'{c} clients: {r["round_s"] * 1e3:.2f} ms/round, ratio to batched '
          f'{r["ratio_to_batched"]:.2f} (each waited for); {r["chained_round_s"] * 1e3:.2f} ms, '
          f'{r["chained_ratio_to_batched"]:.2f} in a row', file=sys.stderr)
  common.report(rows, table(rows), a.json)
  xs = [r['cohort'] for r in rows]
  common.plot(a.plot, f'{a.algorithm} round, LEAF Synthetic, tau={a.tau}, B={a.batch_size}',
              'clients per round', 'useful examples/s',
              {'round': (xs, [r['examples_per_s'] for r in rows]),
               'batched limit': (xs, [r['examples_per_s'] * r['ratio_to_batched'] ** -1
                                      for r in rows])}, log='xy')
  common.write_results('round_throughput', COLUMNS, rows, variant_name=variant,
                       results_dir=a.results_dir, setting=setting(rows), notes=a.notes,
                       plot=a.plot)


if __name__ == '__main__':
  main()
