"""What the paper-reproduction scripts share: running their ``launch/run.py`` commands, reading
the per-seed results back, and setting them against the paper's numbers with 95% intervals.

Every row with a paper value gets one of three verdicts (``verdict``), a rule fixed before the
runs, on the 95% interval measured here (Student's t for mean rounds to the target over the
seeds that reached it; Fieller's interval for a speedup ``mean(R_base) / mean(R) - 1`` over the
seeds both algorithms reached, ``fedjax_gel.experiment.report.speedup_ci``):

* *reproduced*: the interval excludes 0, contains the paper's value, and its half-width is at
  most half the paper's value (precise enough to tell the paper's effect from none and from
  half of it);
* *not reproduced*: the interval excludes the paper's value;
* *inconclusive*: otherwise (the paper's value inside an interval too wide to decide, or fewer
  than 2 seeds to make one).

For rounds to a target the "effect" is the paper's rounds. Rows the paper has and no command
here ran are listed as *not attempted* (each script's ``NOT_ATTEMPTED``). The papers' own values
are means over 5 seeds, so a value outside the interval may still be what a 5-seed experiment
draws: the tables also give the range (2.5 to 97.5 percentiles) of the same figure over 5-seed
subsets of the seeds run here, and a *not reproduced* line says when the paper's value lies in
it.
"""
from __future__ import annotations

import argparse
import functools
import glob
import itertools
import json
import os
import subprocess
import sys
import time
from typing import NamedTuple, Optional

import numpy as np

from fedjax_gel.experiment import report
from fedjax_gel.core.tasks import Metric

ACCURACY = Metric()   # the reproductions are of classifiers

PAPER_SEEDS = 5   # the GeL paper's seeds per experiment
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What a reproduction leaves out of git by default: the records in their three forms, the models,
# the checkpoints and a running command's lock (config.json, summary.json, report.md and plots/
# are committed).
GITIGNORE = 'metrics.jsonl\nmetrics.csv\ntensorboard/\nmodel.msgpack\ncheckpoint-*/\n.lock\n'


class Run(NamedTuple):
  """A ``launch/run.py`` command into ``--out``/``name``; with ``seeds``, one command per seed
  ``S`` into ``name/seed<S>`` (``--seeds=S``, no plots: the README has the row's), each
  finished on its own, so that a long reproduction continues where it stopped: on the same
  machine from the interrupted seed's checkpoint, on another from the seeds committed."""
  name: str
  flags: list[str]
  seeds: tuple = ()

  def commands(self) -> list[tuple[str, list[str]]]:
    """``(work directory under --out, flags)`` of each command, in order."""
    if not self.seeds:
      return [(self.name, self.flags)]
    return [(f'{self.name}/seed{s}', [*self.flags, f'--seeds={s}', '--noplots'])
            for s in self.seeds]

  def shown(self, out: str, overwrite: bool) -> str:
    """The commands as a README lists them (one line for a run of seeds)."""
    more = ' --overwrite' if overwrite else ''
    if not self.seeds:
      return f'python launch/run.py {" ".join(self.flags)} --workdir={out}/{self.name}{more}'
    return (f'python launch/run.py {" ".join(self.flags)} --seeds=S --noplots '
            f'--workdir={out}/{self.name}/seedS{more}   # for S in {seed_text(self.seeds)}')


def seed_text(seeds) -> str:
  """``0-19`` for consecutive seeds, else ``0,2,5``."""
  seeds = list(seeds)
  if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
    return f'{seeds[0]}-{seeds[-1]}'
  return ','.join(map(str, seeds))


# --out's help: the commands run from the repository root and are recorded as typed there
OUT_HELP = ('folder of the runs and their README.md; a relative path is taken from the '
            'repository root, where the commands it records run')


def arguments(doc: str, name: str) -> argparse.ArgumentParser:
  """A reproduction script's command line: ``--out`` (default
  ``benchmarks/reproductions/<name>``) and ``--report_only``."""
  p = argparse.ArgumentParser(description=doc.split('\n\n')[0])
  p.add_argument('--out', default=os.path.join('benchmarks', 'reproductions', name),
                 help=OUT_HELP)
  p.add_argument('--report_only', action='store_true',
                 help='run nothing: write README.md and the pages of its table again from the '
                      'finished commands\' outputs (e.g. while a long reproduction is stopped '
                      'half way)')
  p.add_argument('--commit', action='store_true',
                 help='after each command, write the README and the pages of its table again '
                      'and git-commit them with its outputs (and nothing else), so a long '
                      'reproduction\'s finished seeds are in git as they complete')
  return p


def reproduce(out: str, runs: list[Run], summary_text, overwrite: bool,
              keep_records: bool = False, report_only: bool = False,
              table: Optional[tuple] = None, commit: bool = False,
              by_seed: bool = False) -> None:
  """A reproduction script's whole job: ``run_all`` (nothing with ``report_only``), then
  ``out/README.md`` from ``summary_text(out, commands, minutes)`` (minutes None: nothing ran),
  printed too, and with ``table = (name, lines_of)`` the block ``name`` of every page that holds
  it (``block_pages``: README.md, the documentation's pages) from ``lines_of(out)``
  (``readme_block``). ``keep_records``: commit each run's ``metrics.jsonl`` (a few KB per run)
  with its summaries. ``commit``: after each command, ``out/README.md`` and those pages written
  again and committed with its outputs (``commit_finished``), so that a long reproduction's
  finished seeds are in git as they complete and another machine continues from them."""
  gitignore = GITIGNORE.replace('metrics.jsonl\n', '') if keep_records else GITIGNORE
  shown = [run.shown(out, overwrite) for run in runs]

  def write(commands, minutes) -> list[str]:
    """Writes ``out/README.md`` and the pages of the table from the finished commands; the
    files written."""
    _read.cache_clear()   # a command finished since they were last read
    text = summary_text(out, commands, minutes)
    with open(os.path.join(REPO, out, 'README.md'), 'w') as f:
      f.write(text)
    written = [os.path.join(out, 'README.md'), os.path.join(out, 'plots')]
    if table is not None:
      name, lines_of = table
      lines = lines_of(out)
      for page in block_pages(name):
        text = readme_block(name, lines, page)
        with open(os.path.join(REPO, page), 'w') as f:
          f.write(text)
        written.append(page)
    return written

  finished = None
  if commit and not report_only:
    finished = lambda name: commit_finished(
        [os.path.join(out, name), *write(shown, None)],
        f'Add {os.path.basename(os.path.normpath(out))} {name}')
  commands, minutes = ((shown, None) if report_only else
                       run_all(out, runs, overwrite, gitignore, finished, by_seed))
  write(commands, minutes)
  with open(os.path.join(REPO, out, 'README.md')) as f:
    print(f.read())


def commit_finished(paths: list[str], subject: str) -> None:
  """Commits ``paths`` (relative to the repository) as they are, and nothing else that is
  staged or changed; nothing when they hold no change. A failure is said, not fatal: the run
  goes on."""
  git = lambda *args: subprocess.run(['git', *args], cwd=REPO, capture_output=True, text=True)
  existing = [p for p in paths if os.path.exists(os.path.join(REPO, p))]
  added = git('add', '-A', '--', *existing)
  if added.returncode == 0 and not git('diff', '--cached', '--quiet', '--', *existing).returncode:
    return   # nothing new
  done = git('commit', '-q', '-m', subject, '--', *existing) if added.returncode == 0 else added
  if done.returncode:
    print(f'note: not committed ({subject}): {done.stderr.strip() or done.stdout.strip()}',
          flush=True)


def in_order(runs: list[Run], by_seed: bool = False) -> list[tuple[str, list[str]]]:
  """Every run's commands (``Run.commands``), run after run, or with ``by_seed`` seed after
  seed (each run's first seed, then each run's second, ...): a reproduction stopped half way
  then has as many paired seeds in every run."""
  if not by_seed:
    return [c for run in runs for c in run.commands()]
  lists = [run.commands() for run in runs]
  return [c for row in itertools.zip_longest(*lists) for c in row if c is not None]


def run_all(out: str, runs: list[Run], overwrite: bool, gitignore: str = GITIGNORE,
            finished=None, by_seed: bool = False) -> tuple[list[str], float]:
  """Runs the commands from the repository root (``out`` relative to it or absolute), in
  ``in_order(runs, by_seed)``; without ``overwrite`` a command whose ``report.md`` exists
  (written once all its runs finished) is skipped and an interrupted one resumes;
  ``finished(name)`` is called after each command that ran. Returns the commands as a user
  would type them and the minutes they took; exits with a failed run's status."""
  try:
    os.makedirs(os.path.join(REPO, out), exist_ok=True)
    with open(os.path.join(REPO, out, '.gitignore'), 'w') as f:
      f.write(gitignore)
  except OSError as e:
    sys.exit(f'error: --out={out}: cannot write there ({e.strerror or e})')
  start = time.perf_counter()
  for run in runs:
    if run.seeds and os.path.exists(os.path.join(REPO, out, run.name, 'report.md')):
      sys.exit(f'error: {os.path.join(out, run.name)} holds one command\'s runs of several '
               'seeds (its report.md), where this script runs a command per seed: move it away '
               'or delete it first')
  for name, flags in in_order(runs, by_seed):
    cmd = ['launch/run.py', *flags, f'--workdir={os.path.join(out, name)}']
    cmd += ['--overwrite'] if overwrite else []
    report_md = os.path.join(REPO, out, name, 'report.md')
    if not overwrite and os.path.exists(report_md):
      print(f'finished before: python {" ".join(cmd)}', flush=True)
      continue
    if os.path.exists(report_md):   # not finished again until it is
      os.remove(report_md)
    print(f'$ python {" ".join(cmd)}', flush=True)
    status = subprocess.run([sys.executable, *cmd], cwd=REPO, check=False).returncode
    if status:
      sys.exit(status)
    if finished is not None:
      finished(name)
  return [run.shown(out, overwrite) for run in runs], (time.perf_counter() - start) / 60


@functools.lru_cache(maxsize=None)
def _read(out: str, run: str) -> tuple[tuple[dict, Optional[list]], ...]:
  """Every ``summary.json`` of a finished command under ``out/run`` (one whose folder holds
  ``report.md``, written once all its runs finished: the seeds still running are left out) with
  its ``metrics.jsonl`` records (None where they were not kept), in path order; read once per
  process (the tables ask for a run many times, after ``run_all`` has finished writing it)."""
  found = []
  top = os.path.join(REPO, out, run)
  for path in sorted(glob.glob(os.path.join(top, '**', 'summary.json'), recursive=True)):
    if not _finished(os.path.dirname(path), top):
      continue
    with open(path) as f:
      summary = json.load(f)
    metrics = os.path.join(os.path.dirname(path), 'metrics.jsonl')
    records = None
    if os.path.exists(metrics):
      with open(metrics) as f:
        records = [json.loads(line) for line in f]
    found.append((summary, records))
  return tuple(found)


def _finished(run: str, top: str) -> bool:
  """Whether the run in folder ``run`` is one of a finished command's: the nearest folder from
  ``run`` up to ``top`` that holds a ``report.md`` (the command's, written once all its runs
  finished) lists it in its ``runs.json`` (where there is one: a run left from an earlier
  command with other seeds is not this one's)."""
  folder = run
  while not os.path.exists(os.path.join(folder, 'report.md')):
    if os.path.samefile(folder, top) or os.path.dirname(folder) == folder:
      return False
    folder = os.path.dirname(folder)
  listed = os.path.join(folder, 'runs.json')
  if not os.path.exists(listed):
    return True
  with open(listed) as f:
    return os.path.relpath(run, folder) in json.load(f)


def paired_seeds(base: dict, other: dict) -> tuple[list, list]:
  """Of two ``load`` results, the seeds both ran and, sorted, those both reached the target
  in."""
  ran = [k for k in base if k in other]
  return ran, sorted(k for k in ran if base[k][0]['rounds_to_target'] is not None
                     and other[k][0]['rounds_to_target'] is not None)


def load(out: str, run: str, algorithm: str) -> dict[int, tuple[dict, Optional[list]]]:
  """Per seed, ``(summary, metrics records or None)`` of ``algorithm`` in ``out/run`` (one run
  or several, in ``seed<S>/`` and ``<algorithm>/`` folders)."""
  return {s['seed']: (s, r) for s, r in _read(out, run) if s.get('algorithm') == algorithm}


def load_all(out: str, run: str) -> list[tuple[dict, list]]:
  """Every run's ``(summary, metrics records)`` in ``out/run`` (those with records kept)."""
  return [(s, r) for s, r in _read(out, run) if r is not None]


def _inside(value: float, low: float, high: float) -> bool:
  return low <= value <= high


REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = 'reproduced', 'not reproduced', 'inconclusive'
VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE)
NOT_RUN = 'not run yet'   # a row whose commands have no finished seed (a long reproduction)


def verdict(paper: float, low: float, high: float) -> str:
  """The module's three-valued verdict on the paper's ``paper`` against the 95% interval
  ``[low, high]`` measured here."""
  if not (np.isfinite(low) and np.isfinite(high)):   # no interval (too few seeds) or unbounded
    return INCONCLUSIVE
  if not _inside(paper, low, high):
    return NOT_REPRODUCED
  if not _inside(0., low, high) and (high - low) / 2 <= abs(paper) / 2:
    return REPRODUCED
  return INCONCLUSIVE


def no_verdicts() -> dict:
  """``{verdict: [lines]}`` for the tables to fill."""
  return {v: [] for v in VERDICTS}


def subset_range(base: list, other: Optional[list] = None, draws: int = 20_000):
  """The 2.5 and 97.5 percentiles, over ``draws`` subsets of ``PAPER_SEEDS`` seeds (drawn
  without replacement by a fixed generator), of the subset's mean of ``base`` or, with
  ``other`` (paired), of its speedup ``mean(base) / mean(other) - 1``; None for too few
  seeds."""
  b = np.asarray(base, float)
  if len(b) <= PAPER_SEEDS:
    return None
  pick = np.argsort(np.random.default_rng(0).random((draws, len(b))), axis=1)[:, :PAPER_SEEDS]
  values = b[pick].mean(1)
  if other is not None:
    values = values / np.asarray(other, float)[pick].mean(1) - 1
  return tuple(np.percentile(values, [2.5, 97.5]))


def _verdict(verdicts: dict, said: str, text: str, value: float, draws, fmt: str) -> None:
  if said == NOT_REPRODUCED and draws is not None:
    low, high = draws
    text += (f' (5-seed subsets here range {low:{fmt}} to {high:{fmt}}: '
             + ('a 5-seed draw explains it)' if _inside(value, low, high) else 'outside)'))
  verdicts[said].append(text)


def rounds_table(out: str, paper: dict, target: float,
                 judge: bool = True) -> tuple[list[str], dict]:
  """Markdown lines: per ``(run, algorithm)`` of ``paper`` (its rounds to the target), the mean
  rounds here +- the 95% interval and the seeds reaching; with ``judge`` (the paper's target
  is this target), the verdict and the range of 5-seed subsets. Returns the lines and the
  verdicts (``no_verdicts``)."""
  lines = [f'| run | algorithm | paper | here: rounds to {ACCURACY.format(target)} (mean +- 95% '
           'CI) | seeds reaching |' + (' verdict | means of 5-seed subsets (95% range) |'
                                       if judge else ''),
           '|---|---|---:|---:|---:|' + ('---|---:|' if judge else '')]
  verdicts = no_verdicts()
  for (run, alg), value in paper.items():
    runs = load(out, run, alg)
    reached = [s['rounds_to_target'] for s, _ in runs.values() if s['rounds_to_target'] is not None]
    row = f'| {run} | {alg} | {value} | '
    if len(reached) < 2:
      said = INCONCLUSIVE if runs else NOT_RUN
      lines.append(row + f'- | {len(reached)}/{len(runs)} |' +
                   (f' {said} | - |' if judge else ''))
      if judge and runs:
        verdicts[INCONCLUSIVE].append(f'{run} {alg}: {len(reached)} seed(s) reached the target')
      continue
    mean, half = report.mean_ci(reached)
    row += f'{mean:.1f} +- {half:.1f} | {len(reached)}/{len(runs)} |'
    if not judge:
      lines.append(row)
      continue
    said = verdict(value, mean - half, mean + half)
    draws = subset_range(reached)
    lines.append(row + f' {shown(said)} | '
                 f'{"-" if draws is None else f"{draws[0]:.0f} to {draws[1]:.0f}"} |')
    _verdict(verdicts, said, f'{run} {alg}: {mean:.1f} +- {half:.1f} rounds, the paper\'s {value}',
             value, draws, '.0f')
  return lines, verdicts


def speedup_table(out: str, pairs: list, paper: dict, target: float,
                  verdicts: dict) -> list[str]:
  """Markdown lines: per ``((run, baseline), (run, compared))`` pair, the speedup over the seeds
  both reached with Fieller's 95% interval, the paper's (from ``paper``'s rounds, when it has
  both), whether the interval lies above 0, and the compared run's accuracy beyond the target
  at the round the baseline reaches it (percentage points, paired by seed, over the seeds whose
  records hold an evaluation at that round, counted), and the verdict where the paper has
  both. Appends to ``verdicts``."""
  lines = ['| baseline -> compared | paper | here (95% CI; seeds both reached) | verdict | '
           '5-seed subsets (95% range) | faster (interval above 0) | accuracy beyond target at '
           'baseline\'s round (pp) |', '|---|---:|---:|---|---:|---|---:|']
  for b, c in pairs:
    base, other = load(out, *b), load(out, *c)
    ran, common = paired_seeds(base, other)
    name = f'{" ".join(b)} -> {" ".join(c)}'
    value = paper[b] / paper[c] - 1 if b in paper and c in paper else None
    paper_text = '-' if value is None else f'{value:+.1%}'
    if len(common) < 2:
      said = '-' if value is None else INCONCLUSIVE if ran else NOT_RUN
      lines.append(f'| {name} | {paper_text} | - ({len(common)}/{len(ran)} seeds) | {said} | - '
                   '| - | - |')
      if said == INCONCLUSIVE:
        verdicts[INCONCLUSIVE].append(f'{name}: {len(common)} seed(s) where both reached the '
                                      'target')
      continue
    rb = [base[k][0]['rounds_to_target'] for k in common]
    rc = [other[k][0]['rounds_to_target'] for k in common]
    s, low, high = report.speedup_ci(rb, rc)
    draws = subset_range(rb, rc)
    beyond = [report.beyond_target(other[k][1] or [], base[k][0]['rounds_to_target'], target)
              for k in common]
    beyond = [b for b in beyond if b is not None]
    beyond_text = (f'{report.mean_ci_text(beyond, 2)} ({len(beyond)}/{len(common)} seeds)'
                   if beyond else '-')
    faster = 'yes' if low > 0 else ('**slower**' if high < 0 else 'not shown')
    said = None if value is None else verdict(value, low, high)
    lines.append(f'| {name} | {paper_text} | '
                 f'{report.speedup_text(s, low, high, len(common), len(ran))}'
                 f' | {"-" if said is None else shown(said)} | '
                 f'{"-" if draws is None else f"{draws[0]:+.1%} to {draws[1]:+.1%}"} | {faster} | '
                 f'{beyond_text} |')
    if said is not None:
      _verdict(verdicts, said, f'{name}: {s:+.1%} ({low:+.1%} to {high:+.1%}), the paper\'s '
               f'{value:+.1%}', value, draws, '+.1%')
  return lines


def target_range(out: str, pilot: str = 'pilot', algorithm: Optional[str] = None) -> list[float]:
  """``targets_around`` the pilot's mean best accuracy (the runs in ``out/pilot``, which fix the
  target at 95% of it, or those of ``algorithm`` in another run)."""
  found = [s['best_accuracy'] for s, _ in _read(out, pilot)
           if algorithm in (None, s['algorithm'])]
  if not found:
    raise ValueError(f'{out}/{pilot} has no finished runs: the targets come from the pilot')
  return targets_around(float(np.mean(found)))


def targets_around(best: float) -> list[float]:
  """The targets each speedup is shown across, by one rule for every reproduction: every half
  point from 85% to 97.5% of a reference best accuracy fixed before the runs, rounded
  inwards."""
  low, high = int(np.ceil(0.85 * best * 200)), int(np.floor(0.975 * best * 200))
  return [k / 200 for k in range(low, high + 1)]


def rounds_at(records: list, target: float) -> tuple[Optional[int], bool]:
  """The first round a run's records reach ``target`` (None: never) and whether it is exact:
  the round before it was evaluated too (``--eval_every_round_from``), or it is round 0."""
  hit = report.first_reaching(records, target, ACCURACY)
  if hit is None:
    return None, True
  return hit['round'], hit['round'] == 0 or any(r['round'] == hit['round'] - 1 for r in records)


def across_targets(out: str, pairs: list, targets: list[float]) -> dict:
  """``{(pair, target): (speedup, low, high, seeds both reached, seeds, exact)}`` of each pair
  at each target, from the runs' records (``rounds_at``); pairs without records are left
  out."""
  found = {}
  for b, c in pairs:
    base, other = load(out, *b), load(out, *c)
    seeds = sorted(k for k in base if k in other)
    if not seeds or any(base[k][1] is None or other[k][1] is None for k in seeds):
      continue
    for t in targets:
      rb = {k: rounds_at(base[k][1], t) for k in seeds}
      rc = {k: rounds_at(other[k][1], t) for k in seeds}
      both = [k for k in seeds if rb[k][0] is not None and rc[k][0] is not None]
      exact = all(rb[k][1] and rc[k][1] for k in both)
      value = (report.speedup_ci([rb[k][0] for k in both], [rc[k][0] for k in both])
               if len(both) >= 2 else (np.nan,) * 3)
      found[(b, c), t] = (*value, len(both), len(seeds), exact)
  return found


def targets_table(out: str, pairs: list, targets: list[float]) -> list[str]:
  """Markdown lines: per target (rows) and pair (columns) the speedup with Fieller's 95%
  interval over the seeds both reached, and how many; ``inexact`` where a seed's round was
  not evaluated every round up to it (the interval would be too narrow); plus the plot
  ``plots/speedup_vs_target.png``."""
  found = across_targets(out, pairs, targets)
  shown_pairs = [p for p in pairs if (p, targets[0]) in found]
  if not shown_pairs:
    return ['(no records here: the speedups across targets need each run\'s metrics.jsonl)']
  lines = ['| target | ' + ' | '.join(f'{" ".join(b)} -> {" ".join(c)}' for b, c in shown_pairs)
           + ' |', '|---:|' + '---:|' * len(shown_pairs)]
  for t in targets:
    cells = []
    for p in shown_pairs:
      s, low, high, n, seeds, exact = found[p, t]
      cells.append('-' if n < 2 else report.speedup_text(s, low, high, n, seeds)
                   + ('' if exact else ' inexact'))
    lines.append(f'| {ACCURACY.format(t)} | ' + ' | '.join(cells) + ' |')
  plot_targets(os.path.join(REPO, out, 'plots', 'speedup_vs_target.png'), found, shown_pairs,
               targets)
  return lines


def targets_section(out: str, pairs: list, targets: list[float], how: str) -> list[str]:
  """A README's section of the speedups across ``targets`` (``targets_table``); ``how``: a
  sentence on where the range comes from and how the rounds were evaluated."""
  table = targets_table(out, pairs, targets)
  plotted = len(table) > 1   # a table, not the note that there are no records
  return ['## Across targets', '',
          f'The same speedups at every target from {ACCURACY.format(targets[0])} to '
          f'{ACCURACY.format(targets[-1])} ({how}), over the seeds both reached (of those run):',
          '', *table, *(['', '![speedup against the target](plots/speedup_vs_target.png)']
                        if plotted else [])]


def real_data_sections(out: str, runs: list, pairs: list, paper: dict, target: float,
                       paper_rounds: str, not_attempted: list[str]) -> list[str]:
  """What the README of a reproduction on a real-data subset holds between its header and its
  discussion: the wall times, the rounds to ``target`` (``paper_rounds``: a sentence on the
  paper's rounds, which are not judged), the speedups with their verdicts, the speedups across
  the pilot's targets and where each seed's tables are."""
  rounds, verdicts = rounds_table(out, paper, target, judge=False)
  return [
      'Wall time of each run\'s commands when they ran, on this project\'s 2-core CPU machine '
      '(no accelerator; `launch/run.py`\'s default devices and chunks: both cores split each '
      f'round\'s clients, the seeds one after another): {wall_minutes(out, runs)}.', '',
      f'Rounds to {ACCURACY.format(target)} test accuracy here. {paper_rounds} The targets '
      'differ, so the rounds are not judged; the speedups and the orderings are what compare.',
      '', *rounds, '',
      'Speedups `mean(R_base) / mean(R) - 1` over the seeds both reached, with Fieller\'s 95% '
      'interval (`fedjax_gel.experiment.report.speedup_ci`); runs of the same seed share '
      'cohorts, budgets, initial models and shuffles, so runs of different commands pair.', '',
      *speedup_table(out, pairs, paper, target, verdicts), '',
      *verdict_lines(verdicts, not_attempted), '',
      *targets_section(out, pairs, target_range(out), PILOT_RANGE), '',
      'Each seed\'s tables (gradient computations and MiB to the target, best and final '
      'accuracy) are in `<run>/seed<S>/report.md`, its records in `metrics.jsonl`; the pilot\'s '
      'in `pilot/report.md`.']


# The range and evaluation of the real-data reproductions (``target_range``, their flag files)
PILOT_RANGE = ('85% to 97.5% of the pilot\'s mean best, a range fixed before the runs; the runs '
               'evaluate every round in it, so each seed\'s round is exact')


def plot_targets(path: str, found: dict, pairs: list, targets: list[float]) -> None:
  """Speedup against the target, one line per pair with its 95% interval as a band."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(7, 4.5))
  xs = [100 * t for t in targets]
  for p in pairs:
    s, low, high = (np.array([found[p, t][i] for t in targets]) for i in range(3))
    low, high = np.where(np.isinf(low), np.nan, low), np.where(np.isinf(high), np.nan, high)
    line, = ax.plot(xs, 100 * s, marker='.', label=f'{" ".join(p[0])} -> {" ".join(p[1])}')
    ax.fill_between(xs, 100 * low, 100 * high, color=line.get_color(), alpha=0.15)
  ax.axhline(0, color='black', linewidth=0.8)
  ax.set(xlabel='target test accuracy (%)', ylabel='speedup (%), 95% interval',
         title='Speedup in rounds to the target, across targets')
  ax.grid(True, alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)


def headline(out: str, pairs: list, paper: dict, target: float) -> list[str]:
  """Markdown lines of a reproduction's table on its pages (``block_pages``): each pair the
  paper has, the mean rounds here, the speedup with its interval and the seeds both reached, the
  paper's, and the verdict; from the committed summaries alone (``readme_block``)."""
  lines = [f'| baseline -> compared | rounds to {ACCURACY.format(target)} here, over the seeds '
           'both reached (mean +- 95% CI) | speedup here (95% CI; seeds both reached of those '
           'both ran) | paper: rounds, speedup | verdict |', '|---|---:|---:|---:|---|']
  for b, c in pairs:
    if b not in paper or c not in paper:
      continue
    base, other = load(out, *b), load(out, *c)
    ran, common = paired_seeds(base, other)
    value = paper[b] / paper[c] - 1
    name = f'{" ".join(b)} -> {" ".join(c)}'
    if len(common) < 2:
      lines.append(f'| {name} | - | - ({len(common)}/{len(ran)} seeds) | {paper[b]} -> '
                   f'{paper[c]}, {value:+.1%} | {INCONCLUSIVE if ran else NOT_RUN} |')
      continue
    rb = [base[k][0]['rounds_to_target'] for k in common]
    rc = [other[k][0]['rounds_to_target'] for k in common]
    s, low, high = report.speedup_ci(rb, rc)
    (mb, hb), (mc, hc) = report.mean_ci(rb), report.mean_ci(rc)
    lines.append(f'| {name} | {mb:.1f} +- {hb:.1f} -> {mc:.1f} +- {hc:.1f} | '
                 f'{report.speedup_text(s, low, high, len(common), len(ran))} | '
                 f'{paper[b]} -> {paper[c]}, {value:+.1%} | {shown(verdict(value, low, high))} |')
  return lines


def pages() -> list[str]:
  """The pages that may show a reproduction's table, relative to the repository: README.md
  (the headline table) and the documentation's, docs/**/*.md (docs/results.md: the others)."""
  docs = glob.glob(os.path.join(REPO, 'docs', '**', '*.md'), recursive=True)
  return ['README.md', *sorted(os.path.relpath(p, REPO) for p in docs)]


def block_pages(name: str) -> list[str]:
  """The pages (``pages``) that hold the block ``name``: its marker ``<!-- <name> -->`` on a
  line of its own; a ValueError when none does."""
  found = []
  for page in pages():
    with open(os.path.join(REPO, page)) as f:
      if f'<!-- {name} -->\n' in f.read().splitlines(keepends=True):
        found.append(page)
  if not found:
    raise ValueError(f'neither README.md nor a page under docs/ has a <!-- {name} --> block')
  return found


def readme_block(name: str, lines: list[str], page: str = 'README.md') -> str:
  """The text of ``page`` (relative to the repository: README.md, a page under docs/) with
  the lines between the markers ``<!-- <name> -->`` and ``<!-- /<name> -->`` (each on a line of
  its own) replaced by ``lines``."""
  with open(os.path.join(REPO, page)) as f:
    text = f.read()
  begin, end = f'<!-- {name} -->\n', f'<!-- /{name} -->'
  head, found, rest = text.partition(begin)
  if not found or end not in rest:
    raise ValueError(f'{page} has no {begin.strip()} ... {end} block')
  return head + begin + '\n'.join(lines) + '\n' + end + rest.partition(end)[2]


def readme_table_of(out: str, name: str, lines_of) -> Optional[tuple]:
  """``reproduce``'s ``table``: the block ``name`` of the pages that hold it
  (``block_pages``) from ``lines_of(out)``, for the reproduction in its default folder only
  (the pages describe that one)."""
  default = os.path.join(REPO, 'benchmarks', 'reproductions', name)
  return (name, lines_of) if os.path.abspath(os.path.join(REPO, out)) == default else None


def shown(said: str) -> str:
  """A verdict as a table shows it (*not reproduced* in bold)."""
  return f'**{said}**' if said == NOT_REPRODUCED else said


RULE = ('Verdicts, by a rule fixed before the runs (`benchmarks/reproduction.py`): *reproduced* '
        'when the 95% interval excludes 0, contains the paper\'s value and its half-width is at '
        'most half the paper\'s value; *not reproduced* when it excludes the paper\'s value; '
        '*inconclusive* otherwise.')


def verdict_lines(verdicts: dict, not_attempted: list[str]) -> list[str]:
  """The lists a reproduction's README ends its numbers with: the rule, each verdict's rows,
  and the paper's rows no command here ran (``not_attempted``)."""
  lines = [RULE]
  for v in VERDICTS:
    lines += ['', f'{v.capitalize()}:', '']
    lines += [f'- {t}' for t in verdicts[v]] or ['- none']
  lines += ['', 'Not attempted (the paper has them; no command here ran them yet):', '']
  lines += [f'- {t}' for t in not_attempted] or ['- none']
  return lines


def header(title: str, script: str, commands: list[str], minutes: Optional[float],
           resumed: bool = True) -> list[str]:
  """A reproduction README's opening lines: ``title``, the script and the commands it ran, and
  how long they took this time (``resumed``: finished commands were skipped, not re-run;
  ``minutes`` None: written from the finished commands' outputs, by ``--report_only`` or
  after each command with ``--commit``)."""
  skipped = '; a command already finished is not run again' if resumed else ''
  when = ('this time written from their finished outputs' if minutes is None
          else f'{minutes:.1f} minutes this time{skipped}')
  return [f'# {title}', '', f'Written by `python benchmarks/{script}`, which ran these commands '
          f'({when}):', '', '```bash', *commands, '```', '']


def flag_value(flagfile: str, name: str) -> str:
  """The value of ``--name=`` in ``flagfile`` (relative to the repository): reproduction
  scripts read a target fixed before the reported runs from the flag file that holds it,
  so that the two cannot disagree."""
  with open(os.path.join(REPO, flagfile)) as f:
    for line in f:
      if line.startswith(f'--{name}='):
        return line.split('=', 1)[1].strip()
  raise ValueError(f'{flagfile} sets no --{name}')


def discussion(out: str) -> list[str]:
  """``out/discussion.md``, written by hand after reading the tables, when there is one."""
  path = os.path.join(REPO, out, 'discussion.md')
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return ['', f.read().rstrip('\n')]


def wall_minutes(out: str, runs: list[Run]) -> str:
  """``name: minutes`` of each run's commands as they ran (per command the largest sum of a
  summary's ``phases_s``: a command's summaries carry its phases so far), whatever a later
  re-run took; a run of seeds adds its finished commands and counts them."""
  parts = []
  for run in runs:
    done = [max(sum(s.get('phases_s', {}).values()) for s, _ in _read(out, name))
            for name, _ in run.commands() if _read(out, name)]
    seeds = f' ({len(done)} seeds)' if run.seeds else ''
    parts.append(f'{run.name} {sum(done) / 60:.1f} min{seeds}' if done else f'{run.name} -')
  return ', '.join(parts)
