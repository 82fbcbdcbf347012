"""Client-level differential privacy on real LEAF FEMNIST (the shipped subset): what DP-FedAvg
(McMahan et al. 2018) and DP + GeL (Boukhari et al. 2023) reach at two noise levels, against
the epsilon they spend, over paired seeds.

Runs ``launch/run.py --flagfile=launch/configs/dp_femnist_subset.flags`` (Poisson-sampled
cohorts of 20 expected clients of 105, adaptive clipping towards the median update norm,
``delta = 1e-3``, 100 rounds) into ``--out`` (default ``benchmarks/reproductions/dp_femnist``),
one command per seed (``reproduction.Run``), for each of:

* ``clip_only``: clipping without noise (``z = 0``, epsilon infinite): the accuracy clipping
  alone costs, the reference of the noised runs;
* ``z0.3`` and ``z1``: noise multiplier ``z`` 0.3 and 1.

The levels were fixed before any run: ``z = 1`` is the usual DP-FedAvg setting, ``z = 0.3`` a
weaker privacy for the same rounds. The commands run seed after seed (every level's seed 0,
then every level's seed 1, ...), so a reproduction stopped half way has as many paired seeds at
every level. Without ``--overwrite`` a finished command is skipped and an interrupted one
resumes. Then ``README.md`` in ``--out``: per level and algorithm the
epsilon spent, the best and final test accuracy (mean +- 95% CI over the seeds), GeL's paired
difference from DP-FedAvg, and ``plots/<level>/accuracy_epsilon.png`` (test accuracy against
the epsilon spent, mean and 95% CI), ended by the hand-written ``discussion.md``.

Usage: ``python benchmarks/reproduce_dp_femnist.py [--out DIR] [--overwrite] [--report_only]
[--commit]``
"""
from __future__ import annotations

import math
import os

import reproduction
from fedjax_gel.experiment import plots, report

FLAGS = 'launch/configs/dp_femnist_subset.flags'
SEEDS = tuple(range(5))
LEVELS = {'clip_only': 0., 'z0.3': 0.3, 'z1': 1.}
RUNS = [reproduction.Run(name, [f'--flagfile={FLAGS}', f'--dp_noise_multiplier={z:g}'], SEEDS)
        for name, z in LEVELS.items()]
BASE, GEL = 'dp_fedavg', 'gel'


def epsilon_text(summaries: list[dict]) -> str:
  """The epsilon the level's longest run spent (a diverged run stops, and spends less)."""
  eps = [s.get('dp_epsilon') for s in summaries]
  if any(e is None or not math.isfinite(e) for e in eps):
    return 'inf'
  return f'{max(eps):.2f}'


def level_rows(out: str) -> list[str]:
  """Markdown lines: per noise level and algorithm, the seeds, the epsilon spent and the best
  and final test accuracy (mean +- 95% CI; the value alone for one seed); then GeL minus
  DP-FedAvg on the paired seeds (from two)."""
  rows = ['| noise | algorithm | seeds | epsilon after the rounds (delta 1e-3) | best test accuracy '
          '(mean +- 95% CI) | final test accuracy (a diverged run\'s last finite one) | clip norm '
          'at the last evaluation (mean) | GeL - DP-FedAvg, best (paired seeds) |',
          '|---|---|---:|---:|---:|---:|---:|---:|']
  for name, z in LEVELS.items():
    runs = {alg: reproduction.load(out, name, alg) for alg in (BASE, GEL)}
    for alg, seeds in runs.items():
      if not seeds:
        rows.append(f'| z = {z:g} | {alg} | 0 | - | {reproduction.NOT_RUN} | - | - | - |')
        continue
      summaries = [s for s, _ in seeds.values()]
      best = report.mean_ci_text([100 * s['best_accuracy'] for s in summaries], 1)
      final = report.mean_ci_text([100 * s['final_accuracy'] for s in summaries], 1)
      paired = [k for k in runs[BASE] if k in runs[GEL]]
      diff = '-'
      if alg == GEL and len(paired) >= 2:
        diff = report.mean_ci_text([100 * (runs[GEL][k][0]['best_accuracy'] -
                                           runs[BASE][k][0]['best_accuracy']) for k in paired], 1)
        diff = f'{diff} points ({len(paired)})'
      diverged = sum(s['status'] == 'diverged' for s in summaries)
      count = f'{len(seeds)}' + (f' ({diverged} diverged)' if diverged else '')
      clips = [r[-1]['dp_clip_norm'] for _, r in seeds.values() if r and r[-1]['dp_clip_norm']]
      clip = f'{sum(clips) / len(clips):.2f}' if clips else '-'
      rows.append(f'| z = {z:g} | {alg} | {count} | {epsilon_text(summaries)} | {best}% '
                  f'| {final}% | {clip} | {diff} |')
  return rows


def level_plots(out: str) -> list[str]:
  """Each level's accuracy plots (against rounds; against epsilon where noised), written
  under ``plots/<level>/``; the README lines that show them."""
  lines = []
  for name, z in LEVELS.items():
    results = reproduction.load_all(out, name)
    if not results:
      continue
    written = plots.metric_plots(results, os.path.join(reproduction.REPO, out, 'plots', name),
                                 setting=f'FEMNIST subset, DP, z = {z:g}')
    shown = [p for p in written if os.path.basename(p) in ('accuracy_epsilon.png',
                                                           'accuracy_rounds.png')]
    lines += [f'![z = {z:g}: {os.path.basename(p)[:-4].replace("_", " against ")}]'
              f'(plots/{name}/{os.path.basename(p)})' for p in shown]
  return lines


def readme_table(out: str) -> list[str]:
  """The table of this reproduction in docs/results.md."""
  return level_rows(out)


def summary_text(out: str, commands: list[str], minutes) -> str:
  return '\n'.join([
      *reproduction.header('Client-level differential privacy on real LEAF FEMNIST (the shipped '
                           'subset): DP-FedAvg and DP + GeL', 'reproduce_dp_femnist.py',
                           commands, minutes),
      'Wall time of the commands when they ran, on this project\'s 2-core CPU machine (no '
      f'accelerator): {reproduction.wall_minutes(out, RUNS)}.', '',
      'Epsilon is dp-accounting\'s RDP bound for Poisson sampling at q = 20 / 105 over the '
      'rounds run, adding or removing one client; the accuracies are on the test examples of '
      'the same 105 clients.', '', *level_rows(out), '', *level_plots(out),
      *reproduction.discussion(out), ''])


def main(argv=None):
  p = reproduction.arguments(__doc__, 'dp_femnist')
  p.add_argument('--overwrite', action='store_true', help='run every command again from round 0')
  a = p.parse_args(argv)
  reproduction.reproduce(a.out, RUNS, summary_text, a.overwrite, keep_records=True,
                         report_only=a.report_only, commit=a.commit,
                         table=reproduction.readme_table_of(a.out, 'dp_femnist', readme_table),
                         by_seed=True)


if __name__ == '__main__':
  main()
