"""The population split by client over processes and devices (owner computes).

Three measurements, each a set of real processes of JAX's multi-controller runtime on this host
(CPU devices, gloo collectives), the run's mesh spanning all their devices:

* ``memory``: bytes of the training pool (LEAF Synthetic tiled to ``--population`` clients, each
  with its own copy of its rows, laid out by owner) and of SCAFFOLD's per-client store that each process and each device holds, for
  1 process x 1 device, 1 x 2, 2 x 1 and 4 x 1.
* ``throughput``: FedAvg rounds (``tau = 5``, ``B = 10``) of ``--cohorts`` clients as 2 processes
  x 1 device and as 1 process x 2 devices, alternately ``--repeats`` times; each process times
  the median of its ``--rounds`` rounds and the table shows the least of the repeats' medians
  and their ratio.
* ``padding``: the fraction of computed client slots that held a real client when
  ``--padding_cohort`` clients of LEAF Synthetic's 1,000 are routed to 4 devices (the engine's own ``grad_computations / computed_steps`` with
  equal budgets), and the slowest device's: real clients over 4 x its slots.

    python benchmarks/population_sharding.py --what=memory,throughput,padding

The results go to ``benchmarks/results/population_sharding[-<variant>].json``
(``common.write_results``): the first measurement asked for as the main table, the others as
further tables.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TAU, BATCH = 5, 10


def worker(args):
  """One process: prints one JSON line of what it holds and how fast its rounds ran."""
  from fedjax_gel.experiment import cluster  # pylint: disable=g-import-not-at-top
  if args.processes > 1:
    cluster.initialize(f'127.0.0.1:{args.port}', args.processes, args.process_id)
  from benchmarks import common  # pylint: disable=g-import-not-at-top
  _, data, _, loss, root, params = common.synthetic_workload(args.population, args.devices)
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top

  from fedjax_gel import algorithms  # pylint: disable=g-import-not-at-top
  from fedjax_gel.core import devices, federated_data, round as round_lib, routing, sampling, store  # pylint: disable=g-import-not-at-top,line-too-long
  from fedjax_gel.experiment import planning  # pylint: disable=g-import-not-at-top

  data = federated_data.owner_layout(data, 1)   # each client its own rows, as a real population
  population = data.num_clients
  alg = (algorithms.scaffold(loss, 0.01, population) if args.algorithm == 'scaffold' else
         algorithms.fedavg(loss, optax.sgd(0.01)))
  mesh = devices.client_mesh(0)
  num = 1 if mesh is None else mesh.size
  pool = federated_data.to_device(data, mesh)
  state = store.place_state(alg.server_init(params), alg, mesh)
  local = lambda tree: sum(s.data.nbytes for a in jax.tree.leaves(tree)
                           for s in a.addressable_shards)
  per_device = lambda tree: sum(max(s.data.nbytes for s in a.addressable_shards)
                                for a in jax.tree.leaves(tree))
  out = dict(process=jax.process_index(), processes=jax.process_count(), devices=num,
             pool_bytes_process=local(pool.examples), pool_bytes_device=per_device(pool.examples),
             pool_bytes_whole=round_lib.tree_bytes(pool.examples),
             store_bytes_process=local(state.clients) if alg.store_row else 0,
             store_bytes_device=per_device(state.clients) if alg.store_row else 0)
  if args.rounds:
    _, chunk = planning.devices_and_chunk(alg, params, data, args.cohort, BATCH, True,
                                          num_devices=num)
    round_fn = common.built_round(round_lib, alg, chunk, mesh)
    spec = sampling.CohortSpec(args.cohort, (TAU, TAU), BATCH,
                               replace=True, weighting='samples_seen')   # the GeL code's
    cohorts = [devices.replicate(sampling.sample_cohort(root, r, pool.counts, spec), mesh)
               for r in range(args.rounds + 1)]
    t = time.perf_counter()
    compiled = round_fn.lower(state, cohorts[0], pool, root, np.int32(0)).compile()
    out['compile_s'] = time.perf_counter() - t
    state, m = compiled(state, cohorts[0], pool, root, np.int32(0))
    jax.block_until_ready(state)
    times, real, slots, slowest = [], 0, 0, []
    for r in range(1, args.rounds + 1):
      t = time.perf_counter()
      state, m = compiled(state, cohorts[r], pool, root, np.int32(r))
      jax.block_until_ready(state)
      times.append(time.perf_counter() - t)
      m = devices.to_host(m)
      real += int(m.grad_computations) // TAU
      slots += int(m.computed_steps) // TAU
      counts = np.bincount(np.minimum(np.asarray(devices.to_host(cohorts[r].client_ids)) //
                                      federated_data.clients_per_owner(population, num),
                                      num - 1), minlength=num)
      per = routing.routed_chunk(args.cohort, chunk, num)
      slowest.append(args.cohort / (num * int(np.max(-(-counts // per))) * per))
    out.update(round_s=float(np.median(times)), real_fraction=real / slots,
               slowest_fraction=float(np.mean(slowest)), chunk_per_device=per)
  print('RESULT ' + json.dumps(out), flush=True)


def launch(processes: int, devices: int, **kw) -> list[dict]:
  """Runs ``processes`` workers of ``devices`` CPU devices each; their RESULT lines."""
  from benchmarks import common  # pylint: disable=g-import-not-at-top
  port = common.coordinator_address().rsplit(':', 1)[1]
  env = {**os.environ, 'XLA_FLAGS': f'--xla_force_host_platform_device_count={devices}'}
  extra = [f'--{k}={v}' for k, v in kw.items()]
  procs = [subprocess.Popen([sys.executable, __file__, '--worker', f'--processes={processes}',
                             f'--process_id={i}', f'--port={port}', f'--devices={devices}',
                             *extra], env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE) for i in reversed(range(processes))]
  results = []
  for p in procs:
    out, err = p.communicate(timeout=1800)
    if p.returncode:
      sys.exit(f'error: a worker failed: {err.strip().splitlines()[-1] if err.strip() else ""}')
    results += [json.loads(l[7:]) for l in out.splitlines() if l.startswith('RESULT ')]
  return sorted(results, key=lambda r: r['process'])


def columns():
  """``(memory, throughput, padding)`` columns (``common`` is importable only after the
  worker's set-up, so they are built when asked)."""
  from benchmarks import common  # pylint: disable=g-import-not-at-top
  C = common.Column
  memory = [C('layout', 'processes x devices', left=True),
            C('pool_bytes_process', 'pool bytes per process', 'bytes', 'lower', '{:,}'),
            C('pool_bytes_device', 'per device', 'bytes', 'lower', '{:,}'),
            C('pool_bytes_whole', 'whole pool (padded)', 'bytes', '', '{:,}'),
            C('store_bytes_process', 'SCAFFOLD store bytes per process', 'bytes', 'lower', '{:,}'),
            C('store_bytes_device', 'per device', 'bytes', 'lower', '{:,}')]
  throughput = [C('cohort', 'cohort', format='{:,}'),
                C('two_processes_s', '2 processes x 1 device (s/round)', 's', 'lower', '{:.4f}'),
                C('one_process_s', '1 process x 2 devices', 's', 'lower', '{:.4f}'),
                C('ratio', 'ratio (two processes / one)', 'ratio', 'lower', '{:.2f}')]
  padding = [C('cohort', 'clients (of 1,000)', format='{:,}'),
             C('devices', 'devices'),
             C('chunk', 'chunk a device', get=lambda r: r['chunk_per_device']),
             C('real_fraction', 'real client slots (of those computed)', 'fraction', 'higher',
               '{:.3f}'),
             C('slowest_fraction', "of the slowest device's slots times 4", 'fraction',
               'higher', '{:.3f}'),
             C('rounds', 'rounds (mean over)')]
  return memory, throughput, padding


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--what', default='memory,throughput,padding',
                      help='the measurements, comma-separated: memory, throughput, padding')
  parser.add_argument('--population', type=int, default=10_000,
                      help="clients of the pool (LEAF Synthetic's 1,000 repeated)")
  parser.add_argument('--cohorts', default='2000,10000',
                      help='clients per round of the throughput rounds, comma-separated')
  parser.add_argument('--padding_cohort', type=int, default=1000,
                      help='clients per round routed to 4 devices for the padding figure')
  parser.add_argument('--rounds', type=int, default=10, help='rounds each process times')
  parser.add_argument('--repeats', type=int, default=2,
                      help='alternations of the two layouts (the least median is kept)')
  parser.add_argument('--results_dir', default=os.path.join(os.path.dirname(
      os.path.abspath(__file__)), 'results'), help='folder of the results JSON (benchmarks/'
                      'results, from which benchmarks/results_md.py writes RESULTS.md); empty: '
                      'none written')
  parser.add_argument('--notes', default='',
                      help="a line the results keep with the figures (the machine's load, what "
                           'else ran)')
  for name, kind, default in (('worker', None, False), ('processes', int, 1),
                              ('process_id', int, 0), ('port', int, 0), ('devices', int, 1),
                              ('cohort', int, 0), ('algorithm', str, 'fedavg')):
    if kind is None:   # a worker's own options, set by launch()
      parser.add_argument(f'--{name}', action='store_true', help=argparse.SUPPRESS)
    else:
      parser.add_argument(f'--{name}', type=kind, default=default, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.worker:
    return worker(args)
  from benchmarks import common  # pylint: disable=g-import-not-at-top
  variant = common.variant(parser, args)
  args.results_dir = common.check_results_dir(parser, args.results_dir)
  memory_columns, throughput_columns, padding_columns = columns()
  found = []
  what = args.what.split(',')
  unknown = sorted(set(what) - {'memory', 'throughput', 'padding'})
  if unknown:
    parser.exit(2, f'error: --what: unknown {", ".join(unknown)} (memory, throughput, padding)\n')
  cohorts = common.int_list(parser, 'cohorts', args.cohorts)
  common.at_least(parser, 1, cohorts=cohorts, population=args.population,
                  padding_cohort=args.padding_cohort, rounds=args.rounds, repeats=args.repeats)
  print(f'host: {common.host()}; memory and throughput: population {args.population:,} '
        '(LEAF Synthetic\'s 1,000 clients repeated, each client with its own rows)\n')
  if 'memory' in what:
    rows = [dict(r, layout=f'{p} x {d} (process {r["process"]})')
            for p, d in [(1, 1), (1, 2), (2, 1), (4, 1)]
            for r in launch(p, d, population=args.population, algorithm='scaffold', rounds=0)]
    found.append(('memory', memory_columns, rows))
    print(common.markdown_table(memory_columns, common.figures(memory_columns, rows)) + '\n',
          flush=True)
  if 'throughput' in what:
    rows = []
    for cohort in cohorts:
      times = {(2, 1): [], (1, 2): []}
      for _ in range(args.repeats):   # alternately, so both see the same load
        for p, d in times:
          times[p, d].append(launch(p, d, population=args.population, cohort=cohort,
                                    rounds=args.rounds)[0]['round_s'])
      two, one = min(times[2, 1]), min(times[1, 2])
      rows.append({'cohort': cohort, 'two_processes_s': two, 'one_process_s': one,
                   'ratio': two / one})
      print(f'{cohort:,} clients: {two:.4f} s/round as 2 processes, {one:.4f} as one',
            file=sys.stderr, flush=True)
    found.append(('throughput', throughput_columns, rows))
    print(common.markdown_table(throughput_columns, common.figures(throughput_columns, rows))
          + '\n', flush=True)
  if 'padding' in what:
    (r,) = launch(1, 4, population=1000, cohort=args.padding_cohort, rounds=args.rounds)
    rows = [dict(r, cohort=args.padding_cohort, devices=4, rounds=args.rounds)]
    found.append(('padding', padding_columns, rows))
    print(common.markdown_table(padding_columns, common.figures(padding_columns, rows)))
  titles = {'memory': f'Memory: population {args.population:,} (LEAF Synthetic\'s 1,000 clients '
                      'repeated, each client its own rows)',
            'throughput': 'Throughput: FedAvg rounds (tau = 5, B = 10), the least of the '
                          'repeats\' medians',
            'padding': 'Padding: clients routed to their owners on 4 devices, the real share of '
                       'the computed client slots'}
  (first, cols, rows), *more = found
  common.write_results('population_sharding', cols, rows, variant_name=variant,
                       results_dir=args.results_dir, setting=titles[first], notes=args.notes,
                       tables=[common.table_results(titles[k], c, r) for k, c, r in more])


if __name__ == '__main__':
  main()
