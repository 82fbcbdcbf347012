"""Start-up: the README's quickstart command as a user runs it, timed by phase.

Runs ``python launch/run.py --flagfile=launch/configs/quickstart.flags`` as a new process, first
with an empty compilation cache and data cache (a first run) and then ``--repeats`` times with
the caches it filled (the next runs), each into a fresh work directory. Prints, per run, the process' wall
time and the phases of the last summary it wrote (``phases_s``: imports, data, compile, train,
eval, report); the wall time beyond their sum is the interpreter's start and exit and the report
and plots written after the last summary.

``--processes N`` starts the same command as N processes of one run (``--num_processes``, on
this host, each presenting ``cores / N`` CPU devices) and times them until the last one exits;
the phases are process 0's.

Usage: ``python benchmarks/startup.py [--repeats 3] [--processes 1] [--json out.json]``; the
results go to ``benchmarks/results/startup[-<variant>].json`` (``common.write_results``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from benchmarks import common  # pylint: disable=wrong-import-position

COMMAND = [sys.executable, 'launch/run.py', '--flagfile=launch/configs/quickstart.flags']


def timed_run(cache: str, workdir: str, processes: int = 1) -> dict:
  env = {**os.environ, 'FEDJAX_GEL_DATA_CACHE': os.path.join(cache, 'data')}
  command = COMMAND + [f'--workdir={workdir}', f'--compilation_cache={cache}']
  if processes > 1:
    address = common.coordinator_address()
    devices = max(1, (os.cpu_count() or 1) // processes)
    env['XLA_FLAGS'] = (f"{env.get('XLA_FLAGS', '')} "
                        f'--xla_force_host_platform_device_count={devices}').strip()
    command += [f'--num_processes={processes}', f'--coordinator_address={address}']
  wall = common.timed_processes(
      [command + ([f'--process_id={i}'] if processes > 1 else []) for i in range(processes)],
      'the quickstart', REPO, env)
  with open(os.path.join(workdir, 'gel', 'summary.json')) as f:   # the last run's summary
    phases = json.load(f)['phases_s']
  return {'wall_s': round(wall, 2), **{k: round(v, 2) for k, v in phases.items()}}


PHASES = ('imports', 'data', 'compile', 'train', 'eval', 'report')
COLUMNS = [common.Column('run', 'run', left=True),
           common.Column('wall_s', 'wall s', 's', 'lower', '{:.2f}')] + [
               common.Column(f'{k}_s', f'{k} s', 's', 'lower', '{:.2f}',
                             get=lambda r, k=k: r.get(k))
               for k in PHASES]


def setting(processes: int) -> str:
  return ('the quickstart (launch/configs/quickstart.flags) as a new process'
          + (f'es: {processes} processes of one run' if processes > 1 else '')
          + '; phases: the last summary.json\'s phases_s (process 0\'s)')


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--repeats', type=int, default=3,
                      help='runs after the first, each with the caches the first filled')
  parser.add_argument('--processes', type=int, default=1,
                      help='processes of one run (--num_processes), on this host')
  parser.add_argument('--json', help="also write the script's own rows to this JSON file")
  common.results_flags(parser)
  args = parser.parse_args(argv)
  variant = common.variant(parser, args)
  args.json = common.json_flag(parser, args.json)
  args.results_dir = common.check_results_dir(parser, args.results_dir)
  common.at_least(parser, 0, repeats=args.repeats)
  common.at_least(parser, 1, processes=args.processes)
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    cache = os.path.join(tmp, 'cache')
    for i in range(1 + args.repeats):
      row = timed_run(cache, os.path.join(tmp, f'run{i}'), args.processes)
      rows.append({'run': 'first (empty cache)' if i == 0 else f'again {i} (cache filled)',
                   **row})
  import jax  # pylint: disable=g-import-not-at-top  # after the runs: the device they used
  for row in rows:
    row['device'] = f'{jax.devices()[0].device_kind} ({jax.default_backend()})'
    row['processes'] = args.processes
  table = common.markdown_table(COLUMNS, common.figures(COLUMNS, rows))
  common.report(rows, setting(args.processes) + '\n\n' + table, args.json)
  common.write_results('startup', COLUMNS, rows, variant_name=variant,
                       results_dir=args.results_dir, setting=setting(args.processes),
                       notes=args.notes)


if __name__ == '__main__':
  main()
