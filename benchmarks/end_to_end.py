"""End to end: the user's command as a fresh process, against its compiled round and FedJAX.

The FedAvgCM workload of ``vs_fedjax.py`` (LEAF Synthetic logistic regression on its 1,000
clients, every client ``tau = 13`` steps of ``B = 5``, cohorts drawn with replacement as the
flag file sets) as a user runs it, for each cohort size C of ``--cohorts``::

  python launch/run.py --flagfile=launch/configs/fedavgcm_synthetic.flags --budget_range=13,13 \\
      --eval_every=50 --noplots --clients_per_round=C --num_rounds=N --workdir=<a fresh one>

on the planner's default devices (no ``--num_devices``) and with the compilation cache users
have (the default; one untimed run of each size first fills it). Reported per cohort size:

* **through the loop**: the command with ``--num_rounds`` N1 and N2 (``--rounds N1,N2``),
  alternated over ``--repeats``; ``ms/round = (median wall at N2 - median wall at N1) /
  (N2 - N1)``. Start-up, compilation, the evaluation of round 0 and the report are in both and
  cancel out; what the loop adds to its rounds stays in: each round's cohort draw, dispatch and
  bookkeeping, and the evaluations, metrics and checkpoints every 50 rounds. Also the median
  whole-process wall times, and the same difference of the runs' ``train`` phase
  (``summary.json``: the rounds as the loop steps them, without evaluations and checkpoints).
* **compiled round**: the experiment's own round (``factories.prepare`` and
  ``factories.make_runs`` on the same flags, compiled as ``loop.Loop.compile`` compiles it, on
  the devices the planner chose), ``N2 - N1`` rounds dispatched back to back, each round's
  state fed to the next, a wait every ``WAIT_EVERY`` rounds; their cohorts drawn beforehand by
  the experiment's sampler. A fresh process after the runs of each repeat; the median over the
  repeats. ``loop overhead = through the loop / compiled round - 1`` (target: at most 5%).
* **FedJAX** 0.0.17 at ``--fedjax_cohorts`` (default 1,000; empty: none): ``vs_fedjax.py``'s
  round (the cohort's client datasets fetched, then ``apply``), the median of
  ``--fedjax_rounds`` rounds after a warm-up round, in a fresh process; ``speedup = FedJAX
  ms/round / through the loop ms/round`` (target: at least 50x at 1,000 clients on CPU), only
  where both sides were measured at that size. Without fedjax installed (``pip install
  fedjax``) that column is skipped with one line.

The devices and each device's chunk are the planner's (``factories.prepare``), checked against
the chunk the runs' ``summary.json`` records. Prints a markdown table.

Usage: ``python benchmarks/end_to_end.py [--cohorts 1000,10000] [--rounds 50,200]
[--repeats 3] [--fedjax_cohorts 1000] [--fedjax_rounds 3] [--json PATH]``; the results go to
``benchmarks/results/end_to_end[-<variant>].json`` (``common.write_results``).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import common  # pylint: disable=g-import-not-at-top,wrong-import-position

FLAGFILE = 'launch/configs/fedavgcm_synthetic.flags'
TAU, BATCH = common.ROUND_WORKLOADS['synthetic']
WAIT_EVERY = 5   # compiled rounds dispatched between two waits


def command_flags(cohort: int, rounds: int, workdir: str) -> list[str]:
  """``launch/run.py``'s flags for ``cohort`` clients a round and ``rounds`` rounds."""
  return [f'--flagfile={FLAGFILE}', f'--budget_range={TAU},{TAU}', '--eval_every=50',
          '--noplots', f'--clients_per_round={cohort}', f'--num_rounds={rounds}',
          f'--workdir={workdir}']


def per_round(n1: int, walls1: list[float], n2: int, walls2: list[float]) -> float:
  """Seconds a round adds to the same command: ``(median(walls2) - median(walls1)) / (n2 - n1)``,
  ``walls1`` the times of runs of ``n1`` rounds and ``walls2`` of ``n2``."""
  return (statistics.median(walls2) - statistics.median(walls1)) / (n2 - n1)


def ratios(loop_s: float | None, compiled_s: float | None,
           fedjax_s: float | None) -> dict:
  """``loop_overhead = loop_s / compiled_s - 1`` and ``speedup = fedjax_s / loop_s``; None
  where a side was not measured."""
  both = lambda a, b: a is not None and b is not None
  return {'loop_overhead': loop_s / compiled_s - 1 if both(loop_s, compiled_s) else None,
          'speedup': fedjax_s / loop_s if both(loop_s, fedjax_s) else None}


def device_name() -> str:
  """The device the runs use: the CPU's model and core count, else the accelerators' kind."""
  import jax  # pylint: disable=g-import-not-at-top
  d = jax.devices()[0]
  if d.platform != 'cpu':
    return f'{jax.device_count()} x {d.device_kind} ({d.platform})'
  model = 'unknown CPU'
  try:
    with open('/proc/cpuinfo') as f:
      model = next((line.split(':', 1)[1].strip() for line in f
                    if line.startswith('model name')), model)
  except OSError:
    pass
  return f'{model}, {os.cpu_count()} cores (cpu)'


def launch(cohort: int, rounds: int, workdir: str) -> tuple[float, dict]:
  """Wall seconds of ``launch/run.py`` as a fresh process, and the run's ``summary.json``."""
  wall = common.timed_processes(
      [[sys.executable, 'launch/run.py', *command_flags(cohort, rounds, workdir)]],
      f'launch/run.py with {cohort} clients and {rounds} rounds', REPO)
  with open(os.path.join(workdir, 'summary.json')) as f:
    return wall, json.load(f)


def compiled_round(cohort: int, rounds: int) -> dict:
  """Runs in a fresh process: the experiment's own round, ``rounds`` rounds back to back."""
  os.chdir(REPO)   # the flag file's path is the repository's
  from fedjax_gel.core.backend import xla  # pylint: disable=g-import-not-at-top
  xla.configure_cpu()   # as launch/run.py, before JAX starts
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top

  from fedjax_gel.core.backend import compilation_cache  # pylint: disable=g-import-not-at-top
  from fedjax_gel.experiment import cli, factories, parsing  # pylint: disable=g-import-not-at-top
  from fedjax_gel.experiment import loop as loop_lib, planning, sweep  # pylint: disable=g-import-not-at-top
  from fedjax_gel.experiment.runtime import Runtime  # pylint: disable=g-import-not-at-top

  compilation_cache.enable(compilation_cache.default_dir())
  values = flags.FlagValues()
  cli.define_flags(values)
  with tempfile.TemporaryDirectory() as tmp:
    parsing.parse(['run.py', *command_flags(cohort, rounds, tmp)], values)
  config = sweep.checked_configs(*cli.from_flags(values))[0]
  exp = factories.with_config(factories.prepare(config), config)
  chunk = planning.runs_chunk_size(exp, 1, True)   # as api.train_runs, for one run
  program, hparams = factories.make_runs(exp, [config], chunk)
  loop = loop_lib.Loop(exp, [loop_lib.Run(config, '')], program, hparams, chunk, None, Runtime())
  loop.compile()
  blocks = -(-rounds // WAIT_EVERY)
  cohorts = [loop.sample(r) for r in range(blocks * WAIT_EVERY + 1)]

  def step(carry, r):
    return loop.round_fn(carry[0], hparams, cohorts[r], exp.train, loop.roots, np.int32(r))

  carry = jax.block_until_ready(step((loop.state,), 0))   # warm-up
  seconds = []
  for b in range(blocks):
    carry, s = common.chained_rounds(lambda c, r, b=b: step(c, b * WAIT_EVERY + r), carry,
                                     WAIT_EVERY, False)
    seconds += s
  return {'devices': 1 if exp.mesh is None else exp.mesh.size, 'run_chunk': chunk,
          'chunk': common.device_chunk(cohort, chunk, exp.mesh),
          'compiled_round_s': statistics.median(seconds), 'device': device_name()}


def fedjax_rounds(cohort: int, rounds: int) -> dict:
  """Runs in a fresh process: ``vs_fedjax.py``'s FedJAX round, a warm-up and ``rounds``."""
  import vs_fedjax  # pylint: disable=g-import-not-at-top
  host, data, loss, root, params = vs_fedjax.workload('synthetic', [cohort])
  algorithm, clients = vs_fedjax.fedjax_setup(host, loss, TAU, BATCH)
  import numpy as np  # pylint: disable=g-import-not-at-top

  from fedjax_gel.core import sampling  # pylint: disable=g-import-not-at-top
  spec = sampling.CohortSpec(cohort, (TAU, TAU), BATCH, replace=True, weighting='samples_seen')
  ids = [np.asarray(sampling.sample_cohort(root, r, data.counts, spec).client_ids)
         for r in range(rounds + 1)]
  state = algorithm.init(params)
  first = vs_fedjax.fedjax_round(algorithm, state, clients, ids[0], 0)[0]
  times = [vs_fedjax.fedjax_round(algorithm, state, clients, ids[r], r)[0]
           for r in range(1, rounds + 1)]
  return {'fedjax_first_round_s': first, 'fedjax_round_s': statistics.median(times),
          'fedjax_rounds': rounds}


def measure(cohort: int, n1: int, n2: int, repeats: int) -> dict:
  """One cohort size: the runs of ``n1`` and ``n2`` rounds alternated, and a compiled-round
  process after each repeat's two runs."""
  walls, train, compiled = {n1: [], n2: []}, {n1: [], n2: []}, []
  with tempfile.TemporaryDirectory() as tmp:
    first_s, _ = launch(cohort, n1, os.path.join(tmp, 'first'))   # fills the cache
    for i in range(repeats):
      for n in (n1, n2) if i % 2 == 0 else (n2, n1):
        wall, summary = launch(cohort, n, os.path.join(tmp, f'{n}-{i}'))
        walls[n].append(wall)
        train[n].append(summary['phases_s']['train'])
      compiled.append(common.in_fresh_process(__file__, cohort,
                                              ['--part', 'round', '--rounds', f'{n1},{n2}']))
  if summary['chunk_size'] != compiled[0]['run_chunk']:
    sys.exit(f'error: at {cohort} clients the runs chunked by {summary["chunk_size"]} and the '
             f'compiled round by {compiled[0]["run_chunk"]}: not the same plan')
  loop_s = per_round(n1, walls[n1], n2, walls[n2])
  compiled_s = statistics.median(c['compiled_round_s'] for c in compiled)
  return {'cohort': cohort, 'tau': TAU, 'batch': BATCH, 'rounds': [n1, n2], 'repeats': repeats,
          'devices': compiled[0]['devices'], 'chunk': compiled[0]['chunk'],
          'device': compiled[0]['device'], 'first_run_s': first_s,
          'process_s': {str(n): statistics.median(w) for n, w in walls.items()},
          'walls_s': {str(n): w for n, w in walls.items()},
          'loop_round_s': loop_s, 'train_phase_round_s': per_round(n1, train[n1], n2, train[n2]),
          'compiled_round_s': compiled_s, 'compiled_rounds_s': [c['compiled_round_s'] for c in
                                                                 compiled]}


def columns(n1: int, n2: int) -> list:
  """The table's columns for runs of ``n1`` and ``n2`` rounds."""
  ms = lambda key: lambda r: None if r.get(key) is None else r[key] * 1e3
  ours = lambda key: lambda r: r.get(key) if 'rounds' in r else None
  return [
      common.CLIENTS,
      common.Column('devices', 'devices', get=ours('devices')),
      common.Column('chunk', 'chunk', format='{:,}', get=ours('chunk')),
      common.Column('process_s', f'process s, {n1} / {n2} rounds', 's', 'lower', '{:.2f}',
                    join=' / ', get=lambda r: [r['process_s'][str(n1)], r['process_s'][str(n2)]]
                    if 'rounds' in r else None),
      common.Column('loop_ms_per_round', 'ms/round through the loop', 'ms', 'lower', '{:.2f}',
                    get=ms('loop_round_s')),
      common.Column('train_phase_ms_per_round', 'of it in the train phase', 'ms', 'lower',
                    '{:.2f}', get=ms('train_phase_round_s')),
      common.Column('compiled_round_ms', 'compiled round ms', 'ms', 'lower', '{:.2f}',
                    get=ms('compiled_round_s')),
      common.Column('loop_overhead', 'loop overhead (through the loop / compiled round - 1)',
                    'fraction', 'lower', '{:+.1%}'),
      common.Column('fedjax_ms_per_round', 'FedJAX ms/round', 'ms', '', '{:.1f}',
                    get=ms('fedjax_round_s')),
      common.Column('speedup', 'speedup (FedJAX / through the loop)', 'x', 'higher', '{:.0f}x'),
  ]


def setting(rows: list[dict]) -> str:
  r0 = next(r for r in rows if 'rounds' in r)
  n1, n2 = r0['rounds']
  return (f'FedAvgCM, LEAF Synthetic, tau = {TAU}, B = {BATCH}, cohorts with replacement; runs '
          f'of {n1} and {n2} rounds, medians of {r0["repeats"]} each')


def table(rows: list[dict]) -> str:
  n1, n2 = next(r for r in rows if 'rounds' in r)['rounds']
  cols = columns(n1, n2)
  return setting(rows) + '\n\n' + common.markdown_table(cols, common.figures(cols, rows))


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--cohorts', default='1000,10000', help='clients per round of the runs')
  p.add_argument('--rounds', default='50,200', help='N1,N2: the two round counts differenced')
  p.add_argument('--repeats', type=int, default=3, help='runs of each round count')
  p.add_argument('--fedjax_cohorts', default='1000', help='FedJAX\'s cohort sizes; empty: none')
  p.add_argument('--fedjax_rounds', type=int, default=3, help='FedJAX rounds timed per size')
  p.add_argument('--json', help="also write the script's own rows (seconds) to this JSON file")
  common.results_flags(p)
  p.add_argument('--single', type=int, help=argparse.SUPPRESS)
  p.add_argument('--part', choices=('round', 'fedjax'), help=argparse.SUPPRESS)
  a = p.parse_args(argv)
  variant = common.variant(p, a)
  a.json = common.json_flag(p, a.json)
  a.results_dir = common.check_results_dir(p, a.results_dir) if not a.single else ''
  cohorts = common.int_list(p, 'cohorts', a.cohorts)
  rounds = common.int_list(p, 'rounds', a.rounds)
  fedjax_cohorts = (common.int_list(p, 'fedjax_cohorts', a.fedjax_cohorts) if a.fedjax_cohorts
                    else [])
  common.at_least(p, 1, cohorts=cohorts, rounds=rounds, repeats=a.repeats,
                  fedjax_cohorts=fedjax_cohorts, fedjax_rounds=a.fedjax_rounds)
  if len(rounds) != 2 or rounds[0] >= rounds[1]:
    p.exit(2, f'error: --rounds must be N1,N2 with N1 < N2 (got {a.rounds!r})\n')
  n1, n2 = rounds
  if a.single:
    print(json.dumps(compiled_round(a.single, n2 - n1) if a.part == 'round' else
                     fedjax_rounds(a.single, a.fedjax_rounds)))
    return
  if fedjax_cohorts and importlib.util.find_spec('fedjax') is None:
    print('note: fedjax is not installed (pip install fedjax): the FedJAX column is skipped',
          file=sys.stderr)
    fedjax_cohorts = []
  rows = {}
  for c in cohorts:
    rows[c] = measure(c, n1, n2, a.repeats)
    r = rows[c]
    print(f'{c} clients: {r["loop_round_s"] * 1e3:.2f} ms/round through the loop, compiled '
          f'round {r["compiled_round_s"] * 1e3:.2f} ms', file=sys.stderr)
  for c in fedjax_cohorts:
    theirs = common.in_fresh_process(__file__, c, ['--part', 'fedjax',
                                                   '--fedjax_rounds', str(a.fedjax_rounds)])
    rows.setdefault(c, {'cohort': c}).update(theirs)
    print(f'{c} clients: FedJAX {theirs["fedjax_round_s"] * 1e3:.1f} ms/round', file=sys.stderr)
  rows = [rows[c] for c in sorted(rows)]
  for r in rows:
    r.update(ratios(r.get('loop_round_s'), r.get('compiled_round_s'), r.get('fedjax_round_s')))
  device = next(r['device'] for r in rows if 'device' in r)
  for r in rows:
    r['device'] = device
  common.report(rows, table(rows), a.json)
  common.write_results('end_to_end', columns(n1, n2), rows, variant_name=variant,
                       results_dir=a.results_dir, setting=setting(rows), notes=a.notes)


if __name__ == '__main__':
  main()
