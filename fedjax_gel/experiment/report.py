"""Paired-run summaries as Markdown tables: rounds to target per seed, GeL's Tables 1 and 2
(mean rounds with a 95% confidence interval, speedup, accuracy beyond the target, gradient
computations and network volume), FedGBO's cost table.

Every table is of the runs' main metric (``models.tasks.Metric``, named in each summary):
accuracy for classifiers, mse for regression; "best" and "reaching the target" follow its
direction."""
from __future__ import annotations

import math
import statistics
from typing import Optional, Sequence

from fedjax_gel.core.tasks import Metric

# Two-sided 95% quantiles of Student's t with 1..30 degrees of freedom (beyond: ``t_95``).
T_95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_95(n: int) -> float:
  """Student's two-sided 95% quantile for ``n`` values (``n - 1`` degrees of freedom): the
  table to 30, beyond it the Cornish-Fisher expansion in ``1 / nu`` (Abramowitz and Stegun
  26.7.5; within 1e-4 of the exact quantile from 30 on: 2.0227 at 39, where 1.96 made a 40-seed
  interval 3% too narrow)."""
  if n - 1 <= len(T_95):
    return T_95[n - 2]
  z, nu = 1.959963984540054, n - 1
  terms = ((z**3 + z) / 4, (5 * z**5 + 16 * z**3 + 3 * z) / 96,
           (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
           (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160)
  return z + sum(g / nu**(k + 1) for k, g in enumerate(terms))


def mean_ci(values: Sequence[float]) -> tuple[float, float]:
  """``(mean, half-width)`` of the 95% confidence interval ``mean +- t_{0.975, n-1} s / sqrt(n)``
  (Student's t over seeds; half-width NaN for one value)."""
  n = len(values)
  mean = statistics.mean(values)
  if n < 2:
    return mean, math.nan
  return mean, t_95(n) * statistics.stdev(values) / math.sqrt(n)


def speedup_ci(base: Sequence[float], rounds: Sequence[float]) -> tuple[float, float, float]:
  """GeL's speedup ``s = mean(R_base) / mean(R) - 1`` over paired seeds (``base[k]`` and
  ``rounds[k]`` from the same seed), with Fieller's 95% interval for a ratio of paired means.

  The interval holds every ``q = 1 + s`` whose paired differences ``d_k = R_base,k - q R_k``
  have a mean within Student's ``t_{0.975, n-1} sd(d) / sqrt(n)`` of 0, i.e. the roots of
  ``q^2 (n m_R^2 - t^2 S_RR) - 2 q (n m_b m_R - t^2 S_bR) + (n m_b^2 - t^2 S_bb) <= 0``
  (``m``: means, ``S``: sample (co)variances). Returns ``(s, low, high)``; the bounds are NaN
  for one seed and infinite when ``mean(R)`` is not clearly above 0 (the set is unbounded).
  Where every seed reached the target at round 0 (``mean(R) = 0``, the initial model already
  meets it) the speedup is undefined: all three are NaN.
  """
  n = len(base)
  if n != len(rounds) or n == 0:
    raise ValueError('speedup_ci needs the same seeds, at least one, on both sides')
  mb, mr = statistics.mean(base), statistics.mean(rounds)
  if mr == 0:
    return math.nan, math.nan, math.nan
  s = mb / mr - 1
  if n < 2:
    return s, math.nan, math.nan
  t2 = t_95(n) ** 2
  s_bb, s_rr = statistics.variance(base), statistics.variance(rounds)
  s_br = statistics.covariance(base, rounds)
  a = n * mr ** 2 - t2 * s_rr
  b = n * mb * mr - t2 * s_br
  c = n * mb ** 2 - t2 * s_bb
  if a <= 0:
    return s, -math.inf, math.inf
  # the quadratic is -t^2 var(d) <= 0 at q = m_b / m_R, so with a > 0 its roots are real
  root = math.sqrt(max(b * b - a * c, 0.))
  return s, (b - root) / a - 1, (b + root) / a - 1


def baseline_of(name: str, names: Sequence[str]) -> str:
  """The run ``name`` is compared with: the algorithm its spec pairs it with
  (``AlgorithmSpec.paired_with``: ``fedavgcm`` for ``gel``, ``X`` for ``X_gel``) when that ran,
  else the first algorithm."""
  from fedjax_gel.algorithms import registry   # pylint: disable=g-import-not-at-top
  base = registry.paired_with(name)
  return base if base and base != name and base in names else names[0]


def rounds_table(summaries: Sequence[dict]) -> str:
  """One row per algorithm (in first-seen order) over the seeds it ran.

  Columns: seeds, rounds to target per seed (``-`` where never reached), mean rounds to target
  over the seeds that reached it (with how many did), mean best and mean final value of the
  main metric; with differential privacy, the epsilon the runs spent (``dp_epsilon``).
  """
  by_alg: dict[str, list[dict]] = {}
  for s in summaries:
    by_alg.setdefault(s['algorithm'], []).append(s)
  m = Metric.of(summaries[0]) if summaries else Metric()
  target = m.format(summaries[0][f'target_{m.name}'] if summaries else None)
  private = any('dp_epsilon' in s for s in summaries)
  lines = [f'| algorithm | seeds | rounds to {target} per seed | mean rounds to {target} '
           f'| mean best {m.name} | mean final {m.name} |' + (' epsilon spent |' if private
                                                               else ''),
           '|---|---|---|---:|---:|---:|' + ('---:|' if private else '')]
  for alg, runs in by_alg.items():
    runs = sorted(runs, key=lambda s: s['seed'])
    reached = [s['rounds_to_target'] for s in runs if s['rounds_to_target'] is not None]
    per_seed = ', '.join('-' if s['rounds_to_target'] is None else str(s['rounds_to_target'])
                         for s in runs)
    mean = (f'{statistics.mean(reached):.1f}' if reached else '-') + (
        '' if len(reached) == len(runs) else f' ({len(reached)}/{len(runs)} reached)')
    best = statistics.mean(s[f'best_{m.name}'] for s in runs)
    final = statistics.mean(s[f'final_{m.name}'] for s in runs)
    seeds = ','.join(str(s['seed']) for s in runs)
    eps = ('' if not private else ' - |' if any('dp_epsilon' not in s for s in runs) else
           ' inf |' if any(s['dp_epsilon'] is None for s in runs) else   # no noise: null
           f' {statistics.mean(s["dp_epsilon"] for s in runs):.3g} |')
    lines.append(f'| {alg} | {seeds} | {per_seed} | {mean} | {best:.4f} | {final:.4f} |{eps}')
  return '\n'.join(lines)


CLIENT_SPREAD = ('p10', 'mean', 'p90', 'std')


def client_table(summaries: Sequence[dict]) -> str:
  """The spread of the clients' main test metric after the last round, per algorithm (means
  over its seeds): the 10th percentile, unweighted mean, 90th percentile and standard deviation
  over the clients with test examples. '' when the summaries have none (runs made before it)."""
  if not summaries:
    return ''
  m = Metric.of(summaries[0])
  by_alg: dict[str, list[dict]] = {}
  for s in summaries:
    if s.get(f'final_client_{m.name}_mean') is not None:
      by_alg.setdefault(s['algorithm'], []).append(s)
  if not by_alg:
    return ''
  lines = [f'Client {m.label} after the last round (over the clients with test examples; '
           'means over seeds):', '',
           '| algorithm | seeds | 10th percentile | mean | 90th percentile | std |',
           '|---|---:|---:|---:|---:|---:|']
  for alg, runs in by_alg.items():
    cells = [f'{statistics.mean(s[f"final_client_{m.name}_{k}"] for s in runs):.4f}'
             for k in CLIENT_SPREAD]
    lines.append(f'| {alg} | {len(runs)} | ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def best_record(records: Sequence[dict], metric: Metric = Metric()) -> dict:
  """The first evaluation record at a run's best test ``metric`` (default accuracy)."""
  return max(records, key=lambda r: metric.key(r[f'test_{metric.name}']))


def first_reaching(records: Sequence[dict], target: float, metric: Metric = Metric()):
  """The first evaluation record whose test ``metric`` (default accuracy) reaches ``target``
  (``>=``, or ``<=`` for a lower-is-better metric), else None."""
  key = f'test_{metric.name}'
  return next((r for r in records if metric.reaches(r[key], target)), None)


def rounds_to_target(records: Sequence[dict], target: float,
                     metric: Metric = Metric()) -> Optional[int]:
  """The first evaluated round whose test ``metric`` reaches ``target``, else None."""
  hit = first_reaching(records, target, metric)
  return None if hit is None else hit['round']


def beyond_target(records: Sequence[dict], rnd: int, target: float, metric: Metric = Metric()):
  """GeL's "accuracy beyond target" at the round ``rnd`` a baseline reaches it: ``acc(rnd) -
  target`` in percentage points; for another metric how far past the target it is, in its
  own units (``target - mse(rnd)``). None when ``records`` have no evaluation at ``rnd``."""
  at = next((r for r in records if r['round'] == rnd), None)
  if at is None:
    return None
  past = at[f'test_{metric.name}'] - target
  past = past if metric.higher_is_better else -past
  return 100 * past if metric.name == 'accuracy' else past


def cost_table(runs: Sequence[tuple[dict, Sequence[dict]]], baseline: str = 'fedavg') -> str:
  """FedGBO's Table 4 form: per algorithm, the best value of the main metric (the max
  accuracy) and the upload bytes and gradient computations spent to reach it; then the rounds,
  bytes and gradients to reach the baseline's best value. Means over seeds (the second group
  over the seeds that reached it).

  ``runs``: ``(summary, metrics records)`` pairs; ``baseline`` must be among them.
  """
  by_alg: dict[str, list] = {}
  for summary, records in runs:
    by_alg.setdefault(summary['algorithm'], []).append((summary, records))
  if baseline not in by_alg:
    raise ValueError(f'the cost table needs the baseline {baseline!r} among the runs')
  m = Metric.of(runs[0][0])
  target = statistics.mean(s[f'best_{m.name}'] for s, _ in by_alg[baseline])
  mib = 2 ** 20
  lines = ['| algorithm | client lr | KiB up / client / round | KiB down / client / round | '
           f'final client distance | best {m.name} | round of best | upload MiB to best | '
           f'gradients to best | rounds to {target:.4f} ({baseline} best) | upload MiB to it | '
           'gradients to it |', '|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|']
  for alg, group in by_alg.items():
    at_max = [best_record(rec, m) for _, rec in group]
    last = [rec[-1] for _, rec in group]
    per_client = lambda key: statistics.mean(r[key] / max(r['client_rounds'], 1) for r in last)
    hits = [first_reaching(rec, target, m) for _, rec in group]
    hits = [h for h in hits if h is not None]
    lr = ','.join(sorted({f'{s["client_lr"]:g}' for s, _ in group}))
    mean = lambda rows, key: statistics.mean(r[key] for r in rows)
    distances = [r.get('client_distance') for r in last]   # null unless --client_distance
    measured = all(isinstance(d, (int, float)) and math.isfinite(d) for d in distances)
    row = [alg, lr, f'{per_client("bytes_up") / 1024:.2f}', f'{per_client("bytes_down") / 1024:.2f}',
           f'{statistics.mean(distances):.2e}' if measured else '-',
           f'{statistics.mean(s[f"best_{m.name}"] for s, _ in group):.4f}',
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


# The one rule by which every grid (client learning rates, a hyper-parameter, a server x client
# learning-rate grid) picks its value: the best value of the main test metric over the run's
# evaluations (the highest accuracy, the lowest mse), averaged over seeds; a diverged run is
# never picked.
SELECTION_RULE = ('the best value of the main test metric over the evaluations (the highest '
                  'accuracy, the lowest mse; mean over seeds; on a tie, the first value given; '
                  'diverged runs never chosen)')


def best_values(results: Sequence[tuple[dict, Sequence[dict]]], key: str = 'client_lr') -> dict:
  """Per algorithm, the value of ``key`` (the client lr, or a tuned hyper-parameter; None for an
  algorithm without it) chosen by ``SELECTION_RULE``."""
  score: dict = {}
  m = Metric.of(results[0][0]) if results else Metric()
  for summary, _ in results:
    if summary.get('status') == 'diverged':
      continue
    score.setdefault((summary['algorithm'], summary.get(key)), []).append(
        summary[f'best_{m.name}'])
  best: dict = {}
  for (name, value), values in score.items():
    mean = statistics.mean(values)
    if name not in best or m.better(mean, best[name][1]):
      best[name] = (value, mean)
  return {name: value for name, (value, _) in best.items()}


def mean_ci_text(values: Sequence[float], digits: int = 1, signed: bool = False) -> str:
  """``mean +- half-width`` of the 95% interval (the mean alone for one value); ``signed``
  writes the mean's sign, as for a difference (``+0.5 +- 0.7``)."""
  mean, half = mean_ci(values)
  sign = '+' if signed else ''
  return f'{mean:{sign}.{digits}f}' + ('' if math.isnan(half) else f' +- {half:.{digits}f}')


def speedup_text(s: float, low: float, high: float, common: int, seeds: int) -> str:
  """``+17.1% (+12.0% to +24.0%; 38/40 seeds)``: a speedup, its 95% interval and the paired
  seeds it is computed over (those both algorithms reached) out of the seeds that ran; an
  undefined speedup (``speedup_ci``'s NaN: the target met at round 0) reads ``-``."""
  if math.isnan(s):
    return f'- (target met at round 0; {common}/{seeds} seeds)'
  if math.isnan(low):
    ci = ''
  elif math.isinf(low):
    ci = 'unbounded; '
  else:
    ci = f'{low:+.1%} to {high:+.1%}; '
  return f'{s:+.1%} ({ci}{common}/{seeds} seeds)'


def paired_table(results: Sequence[tuple[dict, Sequence[dict]]]) -> str:
  """GeL's Tables 1 and 2 over seeds: per algorithm, rounds to the target (mean +- the 95%
  confidence half-width over the seeds that reached it), the speedup over its baseline
  (``baseline_of``: ``(R_base - R) / R`` of the mean rounds, GeL's definition: 148 -> 112 is
  32.1%) over the seeds both reached, with its 95% interval (``speedup_ci``), the accuracy
  beyond the target at the round the baseline reaches it (paired by seed:
  ``acc(R_base) - target`` in percentage points, mean over the seeds where both have that
  evaluation), and the cumulative gradient computations and network volume (MiB uploaded and
  downloaded: parameters x bytes x clients x rounds) spent until the target.
  """
  by_alg: dict[str, dict[int, tuple[dict, Sequence[dict]]]] = {}
  for summary, records in results:
    by_alg.setdefault(summary['algorithm'], {})[summary['seed']] = (summary, records)
  names = list(by_alg)
  m = Metric.of(results[0][0])
  target = results[0][0][f'target_{m.name}']
  mib = 2 ** 20
  unit = ' (pp)' if m.name == 'accuracy' else ''
  lines = [f'| algorithm | baseline | seeds reaching {m.format(target)} | rounds to '
           f'{m.format(target)} (mean +- 95% CI) | speedup (95% CI; seeds both reached) | '
           f'{m.name} beyond target at baseline\'s round{unit} | '
           'gradient computations to target | MiB up to target | MiB down to target |',
           '|---|---|---:|---:|---:|---:|---:|---:|---:|']
  for name, runs in by_alg.items():
    base = baseline_of(name, names)
    hits = {seed: first_reaching(rec, target, m) for seed, (_, rec) in runs.items()}
    hits = {seed: h for seed, h in hits.items() if h is not None}
    row = [name, '-' if base == name else base, f'{len(hits)}/{len(runs)}']
    if hits:
      rounds = [h['round'] for h in hits.values()]
      row.append(mean_ci_text(rounds))
    else:
      row.append('-')
    base_hits = {seed: first_reaching(rec, target, m)
                 for seed, (_, rec) in by_alg[base].items()}
    common = sorted(k for k in hits if base_hits.get(k) is not None)
    if base != name and common:
      row.append(speedup_text(*speedup_ci([base_hits[k]['round'] for k in common],
                                          [hits[k]['round'] for k in common]),
                              len(common), len(runs)))
    else:
      row.append('-')
    beyond = [beyond_target(runs[seed][1], hit['round'], target, m)   # not at round 0: both
              for seed, hit in base_hits.items()                       # the same initial model
              if hit is not None and hit['round'] > 0 and seed in runs]
    beyond = [b for b in beyond if b is not None]
    row.append(mean_ci_text(beyond, 2) if base != name and beyond else '-')
    for key, scale, digits in (('grad_computations', 1, 0), ('bytes_up', mib, 2),
                               ('bytes_down', mib, 2)):
      row.append(f'{statistics.mean(h[key] for h in hits.values()) / scale:,.{digits}f}'
                 if hits else '-')
    lines.append('| ' + ' | '.join(row) + ' |')
  return '\n'.join(lines)


def kept_runs(results: Sequence[tuple[dict, Sequence[dict]]], tuned: str | None) -> list:
  """The runs a report shows: with a grid over ``tuned`` (``client_lr`` or a hyper-parameter),
  each algorithm's best value."""
  if tuned is None:
    return list(results)
  best = best_values(results, tuned)   # an algorithm whose every run diverged has none
  return [(s, r) for s, r in results
          if s['algorithm'] in best and best[s['algorithm']] == s.get(tuned)]


def report_text(results: Sequence[tuple[dict, Sequence[dict]]], tuned: str | None) -> str:
  """``report.md``: with a grid over ``tuned`` (the client lr or a hyper-parameter), the best
  value per algorithm is kept; the rounds per seed, GeL's paired table, and FedGBO's cost table
  when FedAvg is among the runs."""
  out = []
  if tuned is not None:
    best = {name: v for name, v in best_values(results, tuned).items() if v is not None}
    what = 'Client learning rate' if tuned == 'client_lr' else f'--{tuned}'
    lost = [n for n in dict.fromkeys(s['algorithm'] for s, _ in results)
            if n not in best_values(results, tuned)]   # every value diverged: not in the tables
    out.append(f'{what} per algorithm ({SELECTION_RULE}): ' +
               ', '.join([f'{name} {v:g}' for name, v in best.items()] +
                         [f'{name}: every value diverged (left out below)' for name in lost]))
  results = kept_runs(results, tuned)
  if not results:   # every value of every algorithm diverged
    return '\n\n'.join(out + ['No table: every run diverged.'])
  out.append(rounds_table([s for s, _ in results]))
  out.append(paired_table(results))
  clients = client_table([s for s, _ in results])
  if clients:
    out.append(clients)
  if any(s['algorithm'] == 'fedavg' for s, _ in results):
    out.append(cost_table(results))
  return '\n\n'.join(out)
