"""Paired-run summaries as a Markdown table (rounds to target per seed, means)."""
from __future__ import annotations

import statistics
from typing import Sequence


def rounds_table(summaries: Sequence[dict]) -> str:
  """One row per algorithm (in first-seen order) over the seeds it ran.

  Columns: seeds, rounds to target per seed (``-`` where never reached), mean rounds to target
  over the seeds that reached it (with how many did), mean best and mean final accuracy.
  """
  by_alg: dict[str, list[dict]] = {}
  for s in summaries:
    by_alg.setdefault(s['algorithm'], []).append(s)
  target = summaries[0]['target_accuracy'] if summaries else 0.
  lines = [f'| algorithm | seeds | rounds to {target:.0%} per seed | mean rounds to {target:.0%} '
           '| mean best accuracy | mean final accuracy |',
           '|---|---|---|---:|---:|---:|']
  for alg, runs in by_alg.items():
    runs = sorted(runs, key=lambda s: s['seed'])
    reached = [s['rounds_to_target'] for s in runs if s['rounds_to_target'] is not None]
    per_seed = ', '.join('-' if s['rounds_to_target'] is None else str(s['rounds_to_target'])
                         for s in runs)
    mean = (f'{statistics.mean(reached):.1f}' if reached else '-') + (
        '' if len(reached) == len(runs) else f' ({len(reached)}/{len(runs)} reached)')
    best = statistics.mean(s['best_accuracy'] for s in runs)
    final = statistics.mean(s['final_accuracy'] for s in runs)
    seeds = ','.join(str(s['seed']) for s in runs)
    lines.append(f'| {alg} | {seeds} | {per_seed} | {mean} | {best:.4f} | {final:.4f} |')
  return '\n'.join(lines)


def first_reaching(records: Sequence[dict], accuracy: float):
  """The first evaluation record with ``test_accuracy >= accuracy``, else None."""
  return next((r for r in records if r['test_accuracy'] >= accuracy), None)


def cost_table(runs: Sequence[tuple[dict, Sequence[dict]]], baseline: str = 'fedavg') -> str:
  """FedGBO's Table 4 form: per algorithm, the max accuracy and the upload bytes and gradient
  computations spent to reach it; then the rounds, bytes and gradients to reach the baseline's
  max accuracy. Means over seeds (the second group over the seeds that reached it).

  ``runs``: ``(summary, metrics records)`` pairs; ``baseline`` must be among them.
  """
  by_alg: dict[str, list] = {}
  for summary, records in runs:
    by_alg.setdefault(summary['algorithm'], []).append((summary, records))
  if baseline not in by_alg:
    raise ValueError(f'the cost table needs the baseline {baseline!r} among the runs')
  target = statistics.mean(s['best_accuracy'] for s, _ in by_alg[baseline])
  mib = 2 ** 20
  lines = ['| algorithm | client lr | KiB up / client / round | KiB down / client / round | '
           'final client distance | max accuracy | round of max | upload MiB to max | '
           f'gradients to max | rounds to {target:.4f} ({baseline} max) | upload MiB to it | '
           'gradients to it |', '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|']
  for alg, group in by_alg.items():
    at_max = [max(rec, key=lambda r: r['test_accuracy']) for _, rec in group]
    last = [rec[-1] for _, rec in group]
    per_client = lambda key: statistics.mean(r[key] / max(r['client_rounds'], 1) for r in last)
    hits = [first_reaching(rec, target) for _, rec in group]
    hits = [h for h in hits if h is not None]
    lr = ','.join(sorted({f'{s["client_lr"]:g}' for s, _ in group}))
    mean = lambda rows, key: statistics.mean(r[key] for r in rows)
    row = [alg, lr, f'{per_client("bytes_up") / 1024:.2f}', f'{per_client("bytes_down") / 1024:.2f}',
           f'{mean(last, "client_distance"):.2e}',
           f'{statistics.mean(s["best_accuracy"] for s, _ in group):.4f}',
           f'{mean(at_max, "round"):.0f}', f'{mean(at_max, "bytes_up") / mib:.2f}',
           f'{mean(at_max, "grad_computations"):,.0f}']
    if hits:
      reached = '' if len(hits) == len(group) else f' ({len(hits)}/{len(group)})'
      row += [f'{mean(hits, "round"):.0f}{reached}', f'{mean(hits, "bytes_up") / mib:.2f}',
              f'{mean(hits, "grad_computations"):,.0f}']
    else:
      row += ['-', '-', '-']
    lines.append('| ' + ' | '.join(row) + ' |')
  return '\n'.join(lines)


def best_learning_rates(results: Sequence[tuple[dict, Sequence[dict]]]) -> dict:
  """Per algorithm, the client lr with the highest mean best accuracy over seeds."""
  score: dict = {}
  for summary, _ in results:
    score.setdefault((summary['algorithm'], summary['client_lr']), []).append(
        summary['best_accuracy'])
  best: dict = {}
  for (name, lr), accs in score.items():
    mean = statistics.mean(accs)
    if name not in best or mean > best[name][1]:
      best[name] = (lr, mean)
  return {name: lr for name, (lr, _) in best.items()}


def report_text(results: Sequence[tuple[dict, Sequence[dict]]], grid: bool) -> str:
  """``report.md`` for several runs; with a learning-rate grid, the best lr per algorithm is
  kept. Ends with the cost table when FedAvg is among the runs."""
  out = []
  if grid:
    best = best_learning_rates(results)
    out.append('Client learning rate per algorithm (best mean max accuracy over the grid): ' +
               ', '.join(f'{name} {lr:g}' for name, lr in best.items()))
    results = [(s, r) for s, r in results if best[s['algorithm']] == s['client_lr']]
  out.append(rounds_table([s for s, _ in results]))
  if any(s['algorithm'] == 'fedavg' for s, _ in results):
    out.append(cost_table(results))
  return '\n\n'.join(out)
