"""Two checkouts of fedjax_gel on the same round, in alternating fresh processes.

For a change whose effect is smaller than this machine's noise between processes (10-60% on
sub-millisecond rounds), and larger than what one process can show without bias: two executables
compiled in one process do not run equally fast (in A/A runs the one built later ran 3-8%
faster), so an in-process A/B favours whichever is built second. Here each process imports one
checkout (``--before``, ``--after``: repository roots, e.g. a ``git worktree`` of an earlier
commit), builds the FedAvgCM round (client lr 0.01, momentum 0.9) of ``--workload``: LEAF
Synthetic (``B = 5``), GeL's FEMNIST CNN (``B = 20``) or LEAF's Shakespeare LSTM (``B = 10``) on
random clients of their shapes (``common.round_workload``), with ``tau_i ~ U{a..b}`` from
``--budget_range`` (default: the workload's ``tau``, 13, 8 and 4), the planner's chunk and
compile options, as ``launch/run.py`` sets them, on one device (or, with ``--launch_devices``,
on the devices ``launch/run.py``'s planner picks, every core presented as one:
``common.launch_round``), for ``--clients``; compiles it, runs ``--rounds`` rounds of fresh
cohorts (drawn with replacement, as the GeL code draws them) and prints, over the processes of
each checkout, the mean of their fastest rounds, of their median rounds and of their compile
times; the two checkouts' processes alternate ``--pairs`` times. The fastest round is the
figure least moved by other load.

A change can help one layout and not the other: GeL's FEMNIST CNN round with a faster local
step was 1.12x faster on one device and 0.89x on the planner's two (``docs/speed.md``),
so a change meant for the shipped runs is measured with ``--launch_devices`` too.

Usage: ``python benchmarks/paired_checkouts.py --before /tmp/old --after . [--workload
synthetic|cnn|lstm] [--clients 20,200] [--budget_range 13,13] [--pairs 6] [--rounds 300]
[--launch_devices]``; the results go to ``benchmarks/results/paired_checkouts[-<variant>].json``
(``common.write_results``; the checkouts are in its command, not in its name).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time


def measure(repo: str, workload: str, clients: int, rounds: int,
            budgets: tuple[int, int], launch_devices: bool = False) -> dict:
  """In this process: one round of ``repo``'s engine (``repo`` first on the path; the workload
  and the timing are this script's ``benchmarks/common.py``), timed; ``launch_devices``: on
  the planner's devices, placed by ``repo``'s own ``common.launch_round`` (as its launcher
  places them), else on one."""
  sys.path.insert(0, repo)
  import common  # pylint: disable=g-import-not-at-top   # this script's folder comes first
  batch = common.ROUND_WORKLOADS[workload][1]
  data, loss, root, params = common.round_workload(
      workload, clients, cpu_devices=None if launch_devices else 1)
  import numpy as np  # pylint: disable=g-import-not-at-top

  from fedjax_gel import algorithms  # pylint: disable=g-import-not-at-top
  from fedjax_gel.core import round as round_lib, sampling  # pylint: disable=g-import-not-at-top
  from fedjax_gel.experiment import planning  # pylint: disable=g-import-not-at-top
  alg = algorithms.fedavgcm(loss, 0.01, 0.9)
  if launch_devices:   # the round placed as the checkout's own launch/run.py places it
    module_spec = importlib.util.spec_from_file_location(
        'checkout_common', os.path.join(repo, 'benchmarks', 'common.py'))
    checkout = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(checkout)
    ran = checkout.launch_round(alg, params, data, root, clients, budgets, batch, True)
    cohorts = [ran['sample'](r) for r in range(rounds + 1)]
    times = common.time_rounds(ran['compiled'], ran['state'], cohorts, ran['pool'], root)
    return {'min_ms': min(times) * 1e3, 'median_ms': statistics.median(times) * 1e3,
            'compile_s': ran['compile_s'], 'chunk': ran['chunk'], 'devices': ran['devices']}
  state = alg.server_init(params)
  spec = sampling.CohortSpec(clients, budgets, batch,
                             replace=True, weighting='samples_seen')   # the GeL code's
  cohorts = [sampling.sample_cohort(root, r, data.counts, spec) for r in range(rounds + 1)]
  chunk = planning.default_chunk_size(clients, params, planning.example_bytes(data), batch,
                                      equal_budgets=spec.equal_budgets)
  rf = common.built_round(round_lib, alg, chunk, None,
                          common.launch_compiler_options(params, clients, budgets, batch))
  t = time.perf_counter()
  compiled = rf.lower(state, cohorts[0], data, root, np.int32(0)).compile()
  compile_s = time.perf_counter() - t
  times = common.time_rounds(compiled, state, cohorts, data, root)
  return {'min_ms': min(times) * 1e3, 'median_ms': statistics.median(times) * 1e3,
          'compile_s': compile_s, 'chunk': chunk, 'devices': 1}


def columns():
  import common  # pylint: disable=g-import-not-at-top   # this script's folder
  C = common.Column
  return [C('clients', 'clients', format='{:,}'), C('budgets', 'budgets', left=True),
          C('devices', 'devices'), C('chunk', 'chunk', format='{:,}'),
          C('checkout', 'checkout', left=True),
          C('fastest_round_ms', 'fastest round ms (mean over processes)', 'ms', 'lower',
            '{:.3f}'),
          C('median_round_ms', 'median round ms (mean)', 'ms', 'lower', '{:.3f}'),
          C('compile_s', 'compile s (mean)', 's', 'lower', '{:.2f}')]


def main(argv=None):
  import common  # pylint: disable=g-import-not-at-top   # this script's folder
  COLUMNS = columns()  # pylint: disable=invalid-name
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--before', required=True, help='repository root of the earlier checkout')
  p.add_argument('--after', required=True, help='repository root of the later checkout')
  p.add_argument('--workload', default='synthetic', choices=tuple(common.ROUND_WORKLOADS),
                 help="LEAF Synthetic, GeL's FEMNIST CNN or the Shakespeare LSTM")
  p.add_argument('--clients', default='20,200', help='clients per round, comma-separated')
  p.add_argument('--budget_range', help="a,b: tau_i ~ U{a..b} (default: the workload's tau)")
  p.add_argument('--pairs', type=int, default=6,
                 help="alternations of the two checkouts' processes")
  p.add_argument('--rounds', type=int, default=300, help='rounds each process times')
  p.add_argument('--launch_devices', action='store_true',
                 help="time the round on launch/run.py's devices (every core a device, the "
                      "planner's choice) instead of one")
  common.results_flags(p)
  p.add_argument('--single', nargs=3, help=argparse.SUPPRESS)   # repo clients rounds
  a = p.parse_args(argv)
  variant = common.variant(p, a, ignore=('before', 'after'))
  tau = common.ROUND_WORKLOADS[a.workload][0]
  a.budget_range = a.budget_range or f'{tau},{tau}'
  budgets = common.budget_range(p, a.budget_range)
  if a.single:
    print(json.dumps(measure(a.single[0], a.workload, int(a.single[1]), int(a.single[2]),
                             budgets, a.launch_devices)))
    return
  clients_list = common.int_list(p, 'clients', a.clients)
  common.at_least(p, 1, clients=clients_list, pairs=a.pairs, rounds=a.rounds)
  for repo in (a.before, a.after):
    if not os.path.isdir(os.path.join(repo, 'fedjax_gel')):
      p.exit(2, f'error: {repo}: not a fedjax_gel checkout (no fedjax_gel/ folder)\n')
  a.results_dir = common.check_results_dir(p, a.results_dir)
  kind = f'tau = {budgets[0]}' if budgets[0] == budgets[1] else 'U{%d..%d}' % budgets
  table = []
  for clients in clients_list:
    runs = {'before': [], 'after': []}
    for _ in range(a.pairs):
      for name, repo in (('before', a.before), ('after', a.after)):
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), '--before', a.before,
                               '--after', a.after, '--workload', a.workload,
                               '--budget_range', a.budget_range,
                               '--single', os.path.abspath(repo),
                               str(clients), str(a.rounds)] +
                              (['--launch_devices'] if a.launch_devices else []),
                              check=False, capture_output=True, text=True)
        if proc.returncode:
          sys.exit(f'error: the {name} checkout\'s {clients}-client process failed:\n'
                   f'{proc.stderr[-3000:]}')
        runs[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    for name, rows in runs.items():
      mean = lambda k, rows=rows: statistics.mean(r[k] for r in rows)
      table.append({'clients': clients, 'budgets': kind, 'devices': rows[0]['devices'],
                    'chunk': rows[0]['chunk'], 'checkout': name, 'fastest_round_ms':
                    mean('min_ms'), 'median_round_ms': mean('median_ms'),
                    'compile_s': mean('compile_s')})
      print(f'{clients:,} clients, {name}: fastest round {mean("min_ms"):.3f} ms',
            file=sys.stderr, flush=True)
  setting = (f'FedAvgCM, {a.workload}, {a.pairs} pairs of processes of {a.rounds} rounds; '
             f'before: {a.before}, after: {a.after}')
  print(setting + '\n\n' + common.markdown_table(COLUMNS, table))
  common.write_results('paired_checkouts', COLUMNS, table, variant_name=variant,
                       results_dir=a.results_dir, setting=setting, notes=a.notes)


if __name__ == '__main__':
  main()
