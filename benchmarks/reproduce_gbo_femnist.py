"""Reproduces the FedGBO paper's FEMNIST comparison (Mills et al. 2022, Fig. 2 with K = 10 and
SGDm, and Table 4) on the real LEAF FEMNIST subset shipped with fedjax_gel.

Runs ``launch/run.py --flagfile=launch/configs/gbo_femnist_subset.flags`` into
``--out``/``fig2_table4`` (FedAvg, FedProx, FedGBO, MFL, Mimelite and MimeXlite, each over the
client learning rates 0.01, 0.03 and 0.1 as one program), then the same with the rates 0.3 and
1 into ``fig2_table4_upper``, then FedGBO and MFL with the rate 3 into ``fig2_table4_top``. The
rule: while an algorithm's best rate is the grid's largest, the grid is extended upwards for it
(0.1 was the best rate of the first algorithms to finish, and 1 FedGBO's and MFL's). The grid
is the union. Then each algorithm at the rate the grid kept, 5 paired seeds over 300 rounds, a
command per seed into ``seeds/<algorithm>/seed<S>`` (``reproduction.Run``); those rates are
fixed in ``KEPT``, and the script stops before the seeds when the finished grid keeps others
(or gives targets beyond the seeds' every-round evaluation, ``WINDOW``). The seeds run seed
after seed (every algorithm's seed 0, then every algorithm's seed 1, ...), so that a
reproduction stopped half way has paired seeds of every algorithm. A finished command is
skipped, an interrupted one resumes. Then writes into ``--out``:

* ``plots/lr_grid.png``: every algorithm's best test accuracy per learning rate of the grid;
* ``plots/accuracy_rounds.png``, ``plots/accuracy_upload.png``: test accuracy of each
  algorithm at its best learning rate against rounds and against the MiB its clients uploaded
  (Fig. 2 and Table 4 as curves);
* ``plots/speedup_vs_target.png``: each algorithm's speedup over FedAvg in rounds to a
  target, with its 95% interval, across targets;
* ``README.md``: the commands, the best rate per algorithm, Table 4's costs (``report.md``'s
  table) against the paper's, the seeds' max accuracies and rounds to FedAvg's max with their
  95% intervals and verdicts, the speedups across targets, and the hand-written
  ``discussion.md``.

Usage: ``python benchmarks/reproduce_gbo_femnist.py [--out DIR] [--overwrite] [--report_only]``
"""
from __future__ import annotations

import functools
import os
import sys
from typing import Optional

import numpy as np

import reproduction
from fedjax_gel.experiment import plots, report

FLAGS = 'launch/configs/gbo_femnist_subset.flags'
GRID = [reproduction.Run('fig2_table4', [f'--flagfile={FLAGS}']),
        reproduction.Run('fig2_table4_upper', [f'--flagfile={FLAGS}', '--client_lr_grid=0.3,1']),
        reproduction.Run('fig2_table4_top', [f'--flagfile={FLAGS}', '--algorithm=fedgbo,mfl',
                                             '--client_lr_grid=3'])]
# Each algorithm at the client learning rate the grid kept (seed 0, 150 rounds; fixed before
# these runs), 5 paired seeds over 300 rounds, twice the grid's, to see whether they converge
# to one accuracy as the paper finds after 5,000
KEPT = {'fedavg': 0.1, 'fedprox': 0.1, 'fedgbo': 1, 'mfl': 1, 'mimelite': 0.1, 'mimexlite': 0.1}
LONG_ROUNDS = 300
LAST = 50   # the rounds whose mean accuracy is where a run settles (``settled_accuracy``)
# The seeds evaluate every round from 65% test accuracy until 83% (fixed before they ran), so
# that their rounds to every target of ``targets`` are exact: the targets come from the grid's
# FedAvg (83.3% max in its older runs: targets 71% to 81%), and the accuracy climbs up to 6
# points in 5 rounds below 75%; the train loss on 512 examples, as GeL's FEMNIST runs
WINDOW = (0.65, 0.83)
SEEDS = [reproduction.Run(f'seeds/{alg}', [f'--flagfile={FLAGS}', f'--algorithm={alg}',
                                           f'--client_lr_grid={lr:g}',
                                           f'--num_rounds={LONG_ROUNDS}',
                                           f'--eval_every_round_from={WINDOW[0]:g}',
                                           f'--eval_every_round_until={WINDOW[1]:g}',
                                           '--train_eval_examples=512'], tuple(range(5)))
         for alg, lr in KEPT.items()]
RUNS = GRID + SEEDS
ORDER = ['fedavg', 'fedprox', 'fedgbo_sgdm', 'mfl_sgdm', 'mimelite_sgdm', 'mimexlite_sgdm']
# --algorithm -> the name its runs carry (fedgbo_sgdm for --algorithm=fedgbo)
NAMES = dict(zip(KEPT, ORDER))
# each algorithm's seeds against FedAvg's, in rounds to each target (``targets``)
PAIRS = [(('seeds/fedavg', 'fedavg'), (f'seeds/{alg}', NAMES[alg])) for alg in KEPT
         if alg != 'fedavg']
# The paper's FEMNIST max test accuracies (Table 4, full FEMNIST, K = 10, SGDm; %), where legible
PAPER_MAX = {'fedavg': 86.6, 'fedprox': 86.6, 'fedgbo_sgdm': 86.4}
# FedGBO's results no command here runs yet (``reproduction.verdict_lines``)
NOT_ATTEMPTED = ['FedGBO on CIFAR-100', 'FedGBO on Sent140', 'FedGBO on Shakespeare',
                 'FedGBO with K = 50 local steps', 'FedGBO with RMSProp and Adam on real data']


def grid(out: str) -> list:
  """Every run of the grid, ``(summary, records)``, by algorithm and learning rate."""
  return sorted((r for run in GRID for r in reproduction.load_all(out, run.name)),
                key=lambda r: (ORDER.index(r[0]['algorithm']), r[0]['client_lr']))


def kept_by_name(out: str) -> dict:
  """The summary of each algorithm's run at the rate the grid kept, by run name."""
  return {s['algorithm']: s for s, _ in report.kept_runs(grid(out), 'client_lr')}


def kept_table(out: str, verdicts: Optional[dict] = None) -> list[str]:
  """Markdown lines: each algorithm's kept learning rate and max accuracy against the paper's,
  with the verdict (one seed: inconclusive), also docs/results.md's table; appends to
  ``verdicts``."""
  results = grid(out)
  best = report.best_values(results, 'client_lr')
  rows = ['| algorithm | client lr kept | max test accuracy here | paper\'s max (full FEMNIST) | '
          'verdict |', '|---|---:|---:|---:|---|']
  kept = kept_by_name(out)
  for name in ORDER:
    paper = f'{PAPER_MAX[name]:.1f}%' if name in PAPER_MAX else '-'
    if name not in kept:   # the grid has not run it (at the current code) yet
      rows.append(f'| {name} | - | - | {paper} | '
                  f'{reproduction.NOT_RUN if name in PAPER_MAX else "-"} |')
      continue
    summary = kept[name]
    said = reproduction.INCONCLUSIVE if name in PAPER_MAX else '-'   # one seed: no interval
    rows.append(f'| {name} | {best[name]:g} | {100 * summary["best_accuracy"]:.1f}% | {paper} | '
                f'{said} |')
    if name in PAPER_MAX and verdicts is not None:
      verdicts[said].append(
          f'{name}: max test accuracy {100 * summary["best_accuracy"]:.1f}% in '
          f'{summary["rounds"]} rounds, the paper\'s {PAPER_MAX[name]:.1f}% after 5,000 rounds '
          '(one seed here: no interval)')
  return rows


def seed_runs(out: str) -> dict:
  """``{algorithm: {seed: (summary, records)}}`` of the finished seeds at the kept rates."""
  return {alg: reproduction.load(out, f'seeds/{alg}', NAMES[alg]) for alg in KEPT}


def seeds_table(out: str, verdicts: Optional[dict] = None) -> list[str]:
  """Markdown lines: each algorithm at its kept rate over the paired seeds, its max test
  accuracy (mean +- 95% CI, judged against the paper's) and its rounds to FedAvg's max accuracy
  on the same seed (mean +- 95% CI over the seeds that reached it); appends to ``verdicts``."""
  runs = seed_runs(out)
  rows = [f'| algorithm | client lr | seeds | max test accuracy in {LONG_ROUNDS} rounds (mean +- '
          "95% CI) | paper's max (5,000 rounds) | verdict | rounds to FedAvg's max (mean +- 95% "
          'CI; seeds reaching) |', '|---|---:|---:|---:|---:|---|---:|']
  fedavg = runs['fedavg']
  for alg, lr in KEPT.items():
    seeds = runs[alg]
    name = NAMES[alg]
    paper = PAPER_MAX.get(name)
    paper_text = '-' if paper is None else f'{paper:.1f}%'
    if len(seeds) < 2:
      said = '-' if paper is None else reproduction.INCONCLUSIVE if seeds else reproduction.NOT_RUN
      rows.append(f'| {name} | {lr:g} | {len(seeds)} | - | {paper_text} | {said} | - |')
      continue
    best = [100 * s['best_accuracy'] for s, _ in seeds.values()]
    mean, half = report.mean_ci(best)
    said = '-' if paper is None else reproduction.verdict(paper, mean - half, mean + half)
    if verdicts is not None and paper is not None:
      verdicts[said].append(f'{name}: max test accuracy {mean:.1f}% +- {half:.1f} over '
                            f'{len(seeds)} seeds in {LONG_ROUNDS} rounds, the paper\'s '
                            f'{paper:.1f}% after 5,000 rounds')
    reach = [reproduction.rounds_at(records, fedavg[k][0]['best_accuracy'])[0]
             for k, (_, records) in seeds.items() if k in fedavg]
    hit = [r for r in reach if r is not None]
    to_max = (f'{report.mean_ci_text(hit, 1)} ({len(hit)}/{len(reach)})' if len(hit) >= 2
              else f'- ({len(hit)}/{len(reach)})')
    rows.append(f'| {name} | {lr:g} | {len(seeds)} | {mean:.1f}% +- {half:.1f} | {paper_text} | '
                f'{"-" if said == "-" else reproduction.shown(said)} | {to_max} |')
  return rows


def settled_accuracy(run: tuple) -> Optional[float]:
  """A run's mean test accuracy over the evaluations of its last ``LAST`` rounds, where it
  settles (the max alone is one evaluation's noise above it); None for a run that diverged
  before ``LONG_ROUNDS`` (it settles nowhere)."""
  summary, records = run
  if summary['diverged_round'] is not None:
    return None
  return float(np.mean([r['test_accuracy'] for r in records
                        if 'test_accuracy' in r and r['round'] > LONG_ROUNDS - LAST]))


def diverged_text(runs: dict) -> str:
  """``1/5 (round 126)``: of a row's seeds, those that diverged and when."""
  found = sorted(s['diverged_round'] for s, _ in runs.values() if s['diverged_round'] is not None)
  rounds = f' (round {", ".join(map(str, found))})' if found else ''
  return f'{len(found)}/{len(runs)}{rounds}'


def against_fedavg_table(out: str, verdicts: Optional[dict] = None) -> list[str]:
  """Markdown lines: each algorithm's max test accuracy, and its settled accuracy
  (``settled_accuracy``, over the seeds neither diverged on), minus FedAvg's on the same seed
  (points, mean +- 95% CI over the paired seeds), the max's difference judged against the
  paper's (Table 4), the round of each max and the seeds that diverged; appends to
  ``verdicts``. Paired differences answer the paper's question, whether the algorithms
  converge to one accuracy, more precisely than the max accuracies' own intervals."""
  runs = seed_runs(out)
  fedavg = runs['fedavg']
  rows = ['| algorithm | paired seeds | max accuracy - FedAvg\'s (points; mean +- 95% CI) | '
          f"paper's (Table 4) | verdict | last {LAST} rounds' accuracy - FedAvg's (points; "
          'seeds neither diverged on) | round of the max (mean +- 95% CI) | diverged |',
          '|---|---:|---:|---:|---|---:|---:|---:|']
  for alg in KEPT:
    name, own = NAMES[alg], runs[alg]
    paired = [k for k in own if k in fedavg]
    paper = (PAPER_MAX[name] - PAPER_MAX['fedavg'] if name in PAPER_MAX and alg != 'fedavg'
             else None)
    paper_text = '-' if paper is None else f'{paper:+.1f}'
    tail = (f'{report.mean_ci_text([report.best_record(r)["round"] for _, r in own.values()])} | '
            f'{diverged_text(own)} |' if own else '- | - |')
    if alg == 'fedavg' or len(paired) < 2:
      said = '-' if paper is None else reproduction.INCONCLUSIVE if paired else reproduction.NOT_RUN
      rows.append(f'| {name} | {len(paired)} | - | {paper_text} | {said} | - | {tail}')
      continue
    best = [100 * (own[k][0]['best_accuracy'] - fedavg[k][0]['best_accuracy']) for k in paired]
    mean, half = report.mean_ci(best)
    settled = [(settled_accuracy(own[k]), settled_accuracy(fedavg[k])) for k in paired]
    settled = [100 * (a - b) for a, b in settled if a is not None and b is not None]
    settled_text = (f'{report.mean_ci_text(settled, signed=True) if len(settled) >= 2 else "-"} '
                    f'({len(settled)}/{len(paired)})')
    said = '-' if paper is None else reproduction.verdict(paper, mean - half, mean + half)
    if verdicts is not None and paper is not None:
      verdicts[said].append(f'{name}: max test accuracy {mean:+.1f} +- {half:.1f} points from '
                            f'FedAvg\'s over {len(paired)} paired seeds in {LONG_ROUNDS} rounds, '
                            f'the paper\'s {paper:+.1f} after 5,000 rounds')
    rows.append(f'| {name} | {len(paired)} | {report.mean_ci_text(best, signed=True)} | '
                f'{paper_text} | {"-" if said == "-" else reproduction.shown(said)} | '
                f'{settled_text} | {tail}')
  return rows


def readme_table(out: str) -> list[str]:
  """The tables of this reproduction in docs/results.md: the grid's kept rates, the seeds at
  them, their paired differences from FedAvg."""
  return [*kept_table(out), '', *seeds_table(out), '', *against_fedavg_table(out)]


def summary_text(out: str, commands: list[str], minutes: float) -> str:
  results = grid(out)
  kept = report.kept_runs(results, 'client_lr')
  if kept:
    plot_dir = os.path.join(reproduction.REPO, out, 'plots')
    plots.lr_heatmap(results, os.path.join(plot_dir, 'lr_grid.png'))
    plots.metric_plots(kept, plot_dir, kept[0][0]['target_accuracy'])
    shown = ['![learning-rate grid](plots/lr_grid.png)', '']
    curves = ['![accuracy against rounds](plots/accuracy_rounds.png)',
              '![accuracy against uploaded MiB](plots/accuracy_upload.png)', '',
              'Table 4\'s form at the kept rates (upload and gradient computations until each '
              'algorithm\'s max accuracy, and until FedAvg\'s max):', '',
              report.cost_table(kept)]
  else:
    shown = ['The grid has not run at the current code yet (its runs from older code are in '
             'git history); the seeds run at the rates `KEPT` fixes, which the finished grid '
             'must keep.', '']
    curves = []
  verdicts = reproduction.no_verdicts()
  rows = kept_table(out, verdicts)
  return '\n'.join([
      *reproduction.header('FedGBO on real LEAF FEMNIST (the shipped subset): Fig. 2 (K = 10, '
                           'SGDm) and Table 4', 'reproduce_gbo_femnist.py', commands, minutes),
      'Wall time of the command when it ran, on this project\'s 2-core CPU machine (no '
      f'accelerator): {reproduction.wall_minutes(out, RUNS)}. The grid: one seed (0).', '',
      'Each algorithm ran every client learning rate of the grid; the kept rate is the one with '
      'the highest max test accuracy (evaluated every 5 rounds):', '',
      *shown, *rows, '', *curves, '',
      f'## At the kept rates, 5 paired seeds, {LONG_ROUNDS} rounds', '',
      *seeds_table(out, verdicts), '',
      f'The same seeds against FedAvg on each seed (the last {LAST} rounds\' accuracy is the '
      'mean of their evaluations, where a run settles; a seed that diverged settles nowhere and '
      'is left out of it):', '',
      *against_fedavg_table(out, verdicts), '',
      *reproduction.verdict_lines(verdicts, NOT_ATTEMPTED), '',
      *targets_section(out), '',
      'The tables of each command\'s part of the grid: '
      + ', '.join(f'[{r.name}/report.md]({r.name}/report.md)' for r in GRID) + '; each seed\'s '
      'in `seeds/<algorithm>/seed<S>/report.md`.',
      *reproduction.discussion(out), ''])


def targets(out: str) -> Optional[list[float]]:
  """The targets the seeds' speedups over FedAvg are shown across: ``targets_around`` FedAvg's
  max test accuracy in the grid at its kept rate (seed 0, 150 rounds; fixed before the
  seeds); None before the grid has run it."""
  kept = kept_by_name(out)
  return (reproduction.targets_around(kept['fedavg']['best_accuracy']) if 'fedavg' in kept
          else None)


def targets_section(out: str) -> list[str]:
  """The README's section of each algorithm's speedup over FedAvg across ``targets``."""
  fedavg = reproduction.load(out, *PAIRS[0][0])
  found = targets(out)
  if len(fedavg) < 2 or found is None:
    return ['## Across targets', '', 'Each algorithm\'s speedup over FedAvg in rounds to every '
            'target from 85% to 97.5% of FedAvg\'s max in the grid: '
            f'{reproduction.NOT_RUN} (the seeds run after the grid).']
  return reproduction.targets_section(
      out, PAIRS, found, '85% to 97.5% of FedAvg\'s max test accuracy in the grid at its kept '
      'rate, a range fixed before the seeds ran; the seeds evaluate every round from '
      f'{WINDOW[0]:.0%} test accuracy until {WINDOW[1]:.0%}, so each seed\'s round is exact')


def grid_disagrees(out: str) -> Optional[str]:
  """The line to stop on when the finished grid keeps other rates than ``KEPT``, at which the
  seeds run (fixed from the grid's first run, before the seeds), or gives targets above
  ``WINDOW``'s end, where the seeds no longer evaluate every round; None when neither."""
  kept = report.best_values(grid(out), 'client_lr')
  wanted = {NAMES[alg]: lr for alg, lr in KEPT.items()}
  script = os.path.basename(__file__)
  if kept != wanted:
    return (f'error: the grid in {out} keeps the client learning rates {kept}, where the seeds '
            f'are fixed at {wanted} (KEPT in {script}): decide the seeds\' rates before they run')
  if (top := targets(out)[-1]) >= WINDOW[1]:
    return (f'error: the grid in {out} gives targets up to {top:.1%}, where the seeds evaluate '
            f'every round only until {WINDOW[1]:.0%} (WINDOW in {script}): decide the seeds\' '
            'window before they run')
  return None


def main(argv=None):
  p = reproduction.arguments(__doc__, 'gbo_femnist')
  p.add_argument('--overwrite', action='store_true', help='run the command again from round 0')
  a = p.parse_args(argv)
  # the records (a few KB per run) are kept: they are what the tables come from
  reproduce = functools.partial(
      reproduction.reproduce, a.out, summary_text=summary_text, overwrite=a.overwrite,
      keep_records=True, report_only=a.report_only, commit=a.commit,
      table=reproduction.readme_table_of(a.out, 'gbo_femnist', readme_table))
  if not a.report_only:   # the grid first: the seeds run only at the rates it keeps
    reproduce(GRID)
    if (said := grid_disagrees(a.out)) is not None:
      sys.exit(said)
  reproduce(RUNS, by_seed=True)


if __name__ == '__main__':
  main()
