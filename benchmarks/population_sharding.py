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


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--what', default='memory,throughput,padding')
  parser.add_argument('--population', type=int, default=10_000)
  parser.add_argument('--cohorts', default='2000,10000')
  parser.add_argument('--padding_cohort', type=int, default=1000)
  parser.add_argument('--rounds', type=int, default=10)
  parser.add_argument('--repeats', type=int, default=2)
  parser.add_argument('--worker', action='store_true')
  parser.add_argument('--processes', type=int, default=1)
  parser.add_argument('--process_id', type=int, default=0)
  parser.add_argument('--port', type=int, default=0)
  parser.add_argument('--devices', type=int, default=1)
  parser.add_argument('--cohort', type=int, default=0)
  parser.add_argument('--algorithm', default='fedavg')
  args = parser.parse_args()
  if args.worker:
    return worker(args)
  from benchmarks import common  # pylint: disable=g-import-not-at-top
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
    print('| processes x devices | pool bytes per process | per device | whole pool (padded) | '
          'SCAFFOLD store bytes per process | per device |\n|---|---|---|---|---|---|')
    for p, d in [(1, 1), (1, 2), (2, 1), (4, 1)]:
      for r in launch(p, d, population=args.population, algorithm='scaffold', rounds=0):
        print(f'| {p} x {d} (process {r["process"]}) | {r["pool_bytes_process"]:,} | '
              f'{r["pool_bytes_device"]:,} | {r["pool_bytes_whole"]:,} | '
              f'{r["store_bytes_process"]:,} | {r["store_bytes_device"]:,} |', flush=True)
    print()
  if 'throughput' in what:
    print('| cohort | 2 processes x 1 device (s/round) | 1 process x 2 devices | ratio |\n'
          '|---|---|---|---|')
    for cohort in cohorts:
      times = {(2, 1): [], (1, 2): []}
      for _ in range(args.repeats):   # alternately, so both see the same load
        for p, d in times:
          times[p, d].append(launch(p, d, population=args.population, cohort=cohort,
                                    rounds=args.rounds)[0]['round_s'])
      two, one = min(times[2, 1]), min(times[1, 2])
      print(f'| {cohort:,} | {two:.4f} | {one:.4f} | {two / one:.2f} |', flush=True)
    print()
  if 'padding' in what:
    (r,) = launch(1, 4, population=1000, cohort=args.padding_cohort, rounds=args.rounds)
    print(f'{args.padding_cohort:,} clients of 1,000 over 4 devices, {r["chunk_per_device"]} a '
          f'chunk on each: real slots {r["real_fraction"]:.3f} of those computed, '
          f'{r["slowest_fraction"]:.3f} of the slowest device\'s times 4 '
          f'(mean of {args.rounds} rounds)')


if __name__ == '__main__':
  main()
