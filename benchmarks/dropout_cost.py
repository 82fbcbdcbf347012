"""What dropout costs a round, through the user's command: GeL's FEMNIST CNN with and without.

The published GeL FEMNIST configuration (``launch/configs/gel_table1_femnist_subset.flags``:
``gel_femnist_cnn`` on the 5% FEMNIST subset, 20 clients a round, ``tau_i ~ U{4..20}`` steps of
``B = 20``), FedAvgCM on seed 0, as a user runs it::

  python launch/run.py --flagfile=launch/configs/gel_table1_femnist_subset.flags \\
      --algorithm=fedavgcm --seeds=0 --eval_every=50 --noplots --num_rounds=N \\
      [--dropout=RATE] --workdir=<a fresh one>

on the planner's default devices, with the compilation cache users have (one untimed run of
each variant first fills it). For each variant, runs of ``N1`` and ``N2`` rounds alternate over
``--repeats``; ``ms/round = (median wall at N2 - median wall at N1) / (N2 - N1)`` (start-up,
compilation and the report cancel out; the evaluations every 50 rounds stay in). ``ratio =
ms/round with dropout / without`` (target: at most 1.1). Without dropout the run is the
published program (no key is drawn, the algorithm is not wrapped); with it every local step
draws a key and a Bernoulli mask over the classifier's 512 inputs (``models.cnn.TwoConvCNN``)
for every client.

Usage: ``python benchmarks/dropout_cost.py [--rate 0.5] [--rounds 10,40] [--repeats 3]
[--json PATH]``; the results go to ``benchmarks/results/dropout_cost[-<variant>].json``
(``common.write_results``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import common  # pylint: disable=g-import-not-at-top,wrong-import-position
import end_to_end  # pylint: disable=g-import-not-at-top,wrong-import-position

FLAGFILE = 'launch/configs/gel_table1_femnist_subset.flags'


def launch(rate: float, rounds: int, workdir: str) -> float:
  """Wall seconds of the command as a fresh process (``rate`` 0: no ``--dropout`` flag)."""
  flags = [f'--flagfile={FLAGFILE}', '--algorithm=fedavgcm', '--seeds=0', '--eval_every=50',
           '--noplots', f'--num_rounds={rounds}', f'--workdir={workdir}']
  if rate:
    flags.append(f'--dropout={rate}')
  return common.timed_processes([[sys.executable, 'launch/run.py', *flags]],
                                f'launch/run.py --dropout={rate} --num_rounds={rounds}', REPO)


def measure(rates, n1: int, n2: int, repeats: int) -> dict:
  """Each variant's runs of ``n1`` and ``n2`` rounds, the variants and counts interleaved."""
  walls = {(r, n): [] for r in rates for n in (n1, n2)}
  with tempfile.TemporaryDirectory() as tmp:
    for r in rates:
      launch(r, n1, os.path.join(tmp, f'first-{r}'))   # fills the compilation cache
    for i in range(repeats):
      for r in rates if i % 2 == 0 else rates[::-1]:
        for n in (n1, n2) if i % 2 == 0 else (n2, n1):
          walls[r, n].append(launch(r, n, os.path.join(tmp, f'{r}-{n}-{i}')))
  rows = [{'rate': r, 'rounds': [n1, n2], 'repeats': repeats,
           'round_s': end_to_end.per_round(n1, walls[r, n1], n2, walls[r, n2]),
           'process_s': {str(n): statistics.median(walls[r, n]) for n in (n1, n2)},
           'walls_s': {str(n): walls[r, n] for n in (n1, n2)}} for r in rates]
  device = end_to_end.device_name()
  for row in rows:
    row.update(ratio=row['round_s'] / rows[0]['round_s'], device=device)
  return rows


def columns(n1: int, n2: int) -> list:
  return [
      common.Column('dropout', 'dropout', 'rate', '', '{:g}', get=lambda r: r['rate']),
      common.Column('process_s', f'process s, {n1} / {n2} rounds', 's', 'lower', '{:.2f}',
                    join=' / ', get=lambda r: [r['process_s'][str(n1)], r['process_s'][str(n2)]]),
      common.Column('ms_per_round', 'ms/round through the loop', 'ms', 'lower', '{:.1f}',
                    get=lambda r: r['round_s'] * 1e3),
      common.Column('ratio', 'ratio (to no dropout; target at most 1.1)', 'ratio', 'lower',
                    '{:.3f}'),
  ]


def setting(rows: list[dict]) -> str:
  n1, n2 = rows[0]['rounds']
  return (f'GeL FEMNIST CNN, FedAvgCM, 20 clients, tau ~ U{{4..20}}, B = 20; runs of {n1} and '
          f'{n2} rounds, medians of {rows[0]["repeats"]} each')


def table(rows: list[dict]) -> str:
  cols = columns(*rows[0]['rounds'])
  return setting(rows) + '\n\n' + common.markdown_table(cols, common.figures(cols, rows))


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--rate', type=float, default=0.5, help='the dropout rate compared with none')
  p.add_argument('--rounds', default='10,40', help='N1,N2: the two round counts differenced')
  p.add_argument('--repeats', type=int, default=3, help='runs of each variant and round count')
  p.add_argument('--json', help="also write the script's own rows (seconds) to this JSON file")
  common.results_flags(p)
  a = p.parse_args(argv)
  variant = common.variant(p, a)
  a.json = common.json_flag(p, a.json)
  a.results_dir = common.check_results_dir(p, a.results_dir)
  rounds = common.int_list(p, 'rounds', a.rounds)
  common.at_least(p, 1, rounds=rounds, repeats=a.repeats)
  if len(rounds) != 2 or rounds[0] >= rounds[1]:
    p.exit(2, f'error: --rounds must be N1,N2 with N1 < N2 (got {a.rounds!r})\n')
  if not 0 < a.rate < 1:
    p.exit(2, f'error: --rate must lie in (0, 1) (got {a.rate})\n')
  rows = measure([0.0, a.rate], *rounds, a.repeats)
  common.report(rows, table(rows), a.json)
  common.write_results('dropout_cost', columns(*rounds), rows, variant_name=variant,
                       results_dir=a.results_dir, setting=setting(rows), notes=a.notes)


if __name__ == '__main__':
  main()
