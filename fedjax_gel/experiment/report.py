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
