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

import functools
import glob
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
# What a reproduction leaves out of git by default: the records in their three forms, the models
# and checkpoints (config.json, summary.json, report.md and plots/ are committed).
GITIGNORE = 'metrics.jsonl\nmetrics.csv\ntensorboard/\nmodel.msgpack\ncheckpoint-*/\n'


class Run(NamedTuple):
  """One ``launch/run.py`` command into ``--out``/``name``."""
  name: str
  flags: list[str]


# --out's help: the commands run from the repository root and are recorded as typed there
OUT_HELP = ('folder of the runs and their README.md; a relative path is taken from the '
            'repository root, where the commands it records run')


def reproduce(out: str, runs: list[Run], summary_text, overwrite: bool,
              keep_records: bool = False) -> None:
  """A reproduction script's whole job: ``run_all``, then ``out/README.md`` from
  ``summary_text(out, commands, minutes)``, printed too. ``keep_records``: commit each run's
  ``metrics.jsonl`` (a few KB per run) with its summaries."""
  gitignore = GITIGNORE.replace('metrics.jsonl\n', '') if keep_records else GITIGNORE
  commands, minutes = run_all(out, runs, overwrite, gitignore)
  text = summary_text(out, commands, minutes)
  with open(os.path.join(REPO, out, 'README.md'), 'w') as f:
    f.write(text)
  print(text)


def run_all(out: str, runs: list[Run], overwrite: bool,
            gitignore: str = GITIGNORE) -> tuple[list[str], float]:
  """Runs the commands from the repository root (``out`` relative to it or absolute); without
  ``overwrite`` a command whose ``report.md`` exists (written once all its runs finished) is
  skipped and an interrupted one resumes. Returns the commands as a user would type them and
  the minutes they took; exits with a failed run's status."""
  try:
    os.makedirs(os.path.join(REPO, out), exist_ok=True)
    with open(os.path.join(REPO, out, '.gitignore'), 'w') as f:
      f.write(gitignore)
  except OSError as e:
    sys.exit(f'error: --out={out}: cannot write there ({e.strerror or e})')
  commands = []
  start = time.perf_counter()
  for run in runs:
    cmd = ['python', 'launch/run.py', *run.flags, f'--workdir={os.path.join(out, run.name)}']
    cmd += ['--overwrite'] if overwrite else []
    commands.append(' '.join(cmd))
    if not overwrite and os.path.exists(os.path.join(REPO, out, run.name, 'report.md')):
      print(f'finished before: {commands[-1]}', flush=True)
      continue
    print('$ ' + commands[-1], flush=True)
    status = subprocess.run([sys.executable, *cmd[1:]], cwd=REPO, check=False).returncode
    if status:
      sys.exit(status)
  return commands, (time.perf_counter() - start) / 60


@functools.lru_cache(maxsize=None)
def _read(out: str, run: str) -> tuple[tuple[dict, Optional[list]], ...]:
  """Every ``summary.json`` under ``out/run`` with its ``metrics.jsonl`` records (None where
  they were not kept), in path order; read once per process (the tables ask for a run many
  times, after ``run_all`` has finished writing it)."""
  found = []
  for path in sorted(glob.glob(os.path.join(REPO, out, run, '**', 'summary.json'),
                               recursive=True)):
    with open(path) as f:
      summary = json.load(f)
    metrics = os.path.join(os.path.dirname(path), 'metrics.jsonl')
    records = None
    if os.path.exists(metrics):
      with open(metrics) as f:
        records = [json.loads(line) for line in f]
    found.append((summary, records))
  return tuple(found)


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


def verdict(paper: float, low: float, high: float) -> str:
  """The module's three-valued verdict on the paper's ``paper`` against the 95% interval
  ``[low, high]`` measured here."""
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
      lines.append(row + f'- | {len(reached)}/{len(runs)} |' +
                   (f' {INCONCLUSIVE} | - |' if judge else ''))
      if judge:
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
  at the round the baseline reaches it (percentage points, paired by seed, where the records
  are kept), and the verdict where the paper has both. Appends to ``verdicts``."""
  lines = ['| baseline -> compared | paper | here (95% CI; seeds both reached) | verdict | '
           '5-seed subsets (95% range) | faster (interval above 0) | accuracy beyond target at '
           'baseline\'s round (pp) |', '|---|---:|---:|---|---:|---|---:|']
  for b, c in pairs:
    base, other = load(out, *b), load(out, *c)
    common = sorted(k for k in base if base[k][0]['rounds_to_target'] is not None
                    and k in other and other[k][0]['rounds_to_target'] is not None)
    name = f'{" ".join(b)} -> {" ".join(c)}'
    value = paper[b] / paper[c] - 1 if b in paper and c in paper else None
    paper_text = '-' if value is None else f'{value:+.1%}'
    if len(common) < 2:
      lines.append(f'| {name} | {paper_text} | - | {"-" if value is None else INCONCLUSIVE} | - '
                   '| - | - |')
      if value is not None:
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
    faster = 'yes' if low > 0 else ('**slower**' if high < 0 else 'not shown')
    said = None if value is None else verdict(value, low, high)
    lines.append(f'| {name} | {paper_text} | '
                 f'{report.speedup_text(s, low, high, len(common), len(base))}'
                 f' | {"-" if said is None else shown(said)} | '
                 f'{"-" if draws is None else f"{draws[0]:+.1%} to {draws[1]:+.1%}"} | {faster} | '
                 f'{report.mean_ci_text(beyond, 2) if beyond else "-"} |')
    if said is not None:
      _verdict(verdicts, said, f'{name}: {s:+.1%} ({low:+.1%} to {high:+.1%}), the paper\'s '
               f'{value:+.1%}', value, draws, '+.1%')
  return lines


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


def header(title: str, script: str, commands: list[str], minutes: float,
           resumed: bool = True) -> list[str]:
  """A reproduction README's opening lines: ``title``, the script and the commands it ran, and
  how long they took this time (``resumed``: finished commands were skipped, not re-run)."""
  skipped = '; a command already finished is not run again' if resumed else ''
  return [f'# {title}', '', f'Written by `python benchmarks/{script}`, which ran these commands '
          f'({minutes:.1f} minutes this time{skipped}):', '', '```bash', *commands, '```', '']


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
  """``name: minutes`` of each command as it ran (the largest sum of a summary's ``phases_s``:
  a command's summaries carry its phases so far), whatever a later re-run took."""
  parts = []
  for run in runs:
    totals = [sum(s.get('phases_s', {}).values()) for s, _ in _read(out, run.name)]
    parts.append(f'{run.name} {max(totals) / 60:.1f} min' if totals else f'{run.name} -')
  return ', '.join(parts)
