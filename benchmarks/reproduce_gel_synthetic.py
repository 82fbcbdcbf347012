"""Reproduces GeL's Synthetic results (Boukhari et al. 2023) and compares them with the paper.

Runs, into ``--out`` (default ``benchmarks/reproductions/gel_synthetic``):

* ``table1_lr0.01``, ``table1_lr0.005``: Table 1's Synthetic rows, FedAvgCM against GeL with the
  tuned and the untuned client learning rate, 5 paired seeds;
* ``table2``: Table 2's Synthetic row, FedProx and FedNova with and without GeL, 5 paired seeds;
* ``fig7_grid``: Fig. 7's learning-rate grid on Synthetic (the paper's is on FEMNIST), FedAvgCM,
  GeL, FedYogi and FedYogi + GeL, each 10 x 10 cells as one program.

Each is ``launch/run.py`` with a shipped flag file (printed as it runs); each work directory
keeps its ``report.md``, ``plots/`` and per-run summaries (the records, ``metrics.jsonl``,
``metrics.csv`` and ``tensorboard/``, are not committed). Then ``README.md`` in ``--out`` sets
the mean rounds to 85% against the paper's (within 25%, the reproduction's bar), the GeL
speedups (positive?) and, per grid, how many cells end at 80% test accuracy or more.

Usage: ``python benchmarks/reproduce_gel_synthetic.py [--out DIR] [--seeds 0,1,2,3,4]``
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE1 = 'launch/configs/gel_table1_synthetic.flags'
TABLE2 = 'launch/configs/gel_table2_synthetic.flags'
FIG7 = 'launch/configs/gel_fig7_synthetic.flags'
# (run, algorithm) -> the paper's rounds to 85% (Boukhari et al. 2023, Tables 1 and 2)
PAPER = {('table1_lr0.01', 'fedavgcm'): 148, ('table1_lr0.01', 'gel'): 112,
         ('table1_lr0.005', 'fedavgcm'): 176, ('table1_lr0.005', 'gel'): 135,
         ('table2', 'fedprox'): 157, ('table2', 'fedprox_gel'): 112,
         ('table2', 'fednova'): 118, ('table2', 'fednova_gel'): 103}
PAIRS = [('table1_lr0.01', 'fedavgcm', 'gel'), ('table1_lr0.005', 'fedavgcm', 'gel'),
         ('table2', 'fedprox', 'fedprox_gel'), ('table2', 'fednova', 'fednova_gel')]
GOOD = 0.80   # a grid cell "performs well" at this final test accuracy


def runs(seeds: str) -> list[tuple[str, list[str]]]:
  s = f'--seeds={seeds}'
  return [('table1_lr0.01', [f'--flagfile={TABLE1}', s]),
          ('table1_lr0.005', [f'--flagfile={TABLE1}', '--client_lr=0.005', s]),
          ('table2', [f'--flagfile={TABLE2}', s]),
          ('fig7_grid', [f'--flagfile={FIG7}'])]


def rounds(out: str, run: str, alg: str) -> tuple[list, int]:
  """The seeds' rounds to target (None: not reached) and the number of seeds."""
  paths = sorted(glob.glob(os.path.join(out, run, 'seed*', alg, 'summary.json')))
  values = [json.load(open(p))['rounds_to_target'] for p in paths]
  return values, len(values)


def mean_reached(values):
  reached = [v for v in values if v is not None]
  return statistics.mean(reached) if reached else None


def summary_text(out: str, commands: list[str], minutes: float) -> str:
  lines = ['# GeL on LEAF Synthetic: Tables 1 and 2 and the Fig. 7 grid, reproduced', '',
           'Written by `python benchmarks/reproduce_gel_synthetic.py`, which ran '
           f'({minutes:.1f} minutes on this project\'s 2-core CPU machine):', '', '```bash',
           *commands, '```', '',
           'Rounds to 85% test accuracy (mean over the seeds that reached it), against the GeL '
           'paper (Boukhari et al. 2023, Tables 1 and 2):', '',
           '| run | algorithm | paper | here | seeds reaching | difference | within 25% |',
           '|---|---|---:|---:|---:|---:|---|']
  for (run, alg), paper in PAPER.items():
    values, n = rounds(out, run, alg)
    here = mean_reached(values)
    reached = sum(v is not None for v in values)
    if here is None:
      lines.append(f'| {run} | {alg} | {paper} | - | 0/{n} | - | no |')
      continue
    diff = (here - paper) / paper
    lines.append(f'| {run} | {alg} | {paper} | {here:.1f} | {reached}/{n} | {diff:+.1%} | '
                 f'{"yes" if abs(diff) <= 0.25 else "**no**"} |')
  lines += ['', 'GeL speedups, `(R_base - R_gel) / R_gel` of the mean rounds (the paper\'s '
            'definition):', '', '| run | baseline -> with GeL | paper | here | positive |',
            '|---|---|---:|---:|---|']
  differences = []
  for run, base, gel in PAIRS:
    rb, rg = (mean_reached(rounds(out, run, a)[0]) for a in (base, gel))
    paper = (PAPER[(run, base)] - PAPER[(run, gel)]) / PAPER[(run, gel)]
    here = None if rb is None or rg is None else (rb - rg) / rg
    lines.append(f'| {run} | {base} -> {gel} | {paper:+.1%} | '
                 f'{"-" if here is None else f"{here:+.1%}"} | '
                 f'{"-" if here is None else ("yes" if here > 0 else "**no**")} |')
    if here is not None and not paper / 2 <= here <= 2 * paper:
      differences.append(f'- {run}: the speedup of {gel} over {base} is {here:+.1%}, the paper\'s '
                         f'{paper:+.1%}.')
  lines += ['', f'Fig. 7 on Synthetic: cells of the 10 x 10 grid that end at {GOOD:.0%} test '
            'accuracy or more, and diverged cells:', '',
            f'| algorithm | cells at {GOOD:.0%}+ | diverged | best cell (client lr, server lr) | '
            'best final accuracy | heat map |', '|---|---:|---:|---|---:|---|']
  good_cells = {}
  for path in sorted(glob.glob(os.path.join(out, 'fig7_grid', '*', 'grid.json'))):
    g = json.load(open(path))
    finals = [c for c in g['cells'] if c['final_accuracy'] is not None]
    best = max(finals, key=lambda c: c['final_accuracy'])
    good = sum(c['final_accuracy'] >= GOOD for c in finals)
    name = g['algorithm']
    good_cells[name] = good
    lines.append(f'| {name} | {good}/{len(g["cells"])} | {len(g["cells"]) - len(finals)} | '
                 f'{best["client_lr"]:.3g}, {best["server_lr"]:.3g} | '
                 f'{best["final_accuracy"]:.4f} | [grid.png](fig7_grid/{name}/plots/grid.png) |')
  for base, gel in (('fedavgcm', 'gel'), ('fedyogi', 'fedyogi_gel')):
    if base in good_cells and gel in good_cells and good_cells[gel] <= good_cells[base]:
      differences.append(
          f'- Fig. 7: {gel} ends at {GOOD:.0%} or more in {good_cells[gel]} cells, {base} in '
          f'{good_cells[base]}; the paper (on FEMNIST) finds GeL enlarging the region of good '
          'learning rates.')
  lines += ['', 'Where this differs from the paper:', ''] + (differences or ['- nowhere beyond '
                                                                            'the tables above.'])
  lines += ['', 'The full tables: [table1_lr0.01](table1_lr0.01/report.md), '
            '[table1_lr0.005](table1_lr0.005/report.md), [table2](table2/report.md), '
            '[fig7_grid](fig7_grid/report.md); accuracy curves in each `plots/`.', '']
  return '\n'.join(lines)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--out', default=os.path.join('benchmarks', 'reproductions', 'gel_synthetic'))
  p.add_argument('--seeds', default='0,1,2,3,4')
  a = p.parse_args(argv)
  out = a.out if os.path.isabs(a.out) else os.path.join(REPO, a.out)
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, '.gitignore'), 'w') as f:   # the records, in their three forms
    f.write('metrics.jsonl\nmetrics.csv\ntensorboard/\n')
  commands = []
  t = time.perf_counter()
  for name, args in runs(a.seeds):
    cmd = ['python', 'launch/run.py', *args, f'--workdir={os.path.join(a.out, name)}',
           '--overwrite']
    commands.append(' '.join(cmd))
    print('$ ' + commands[-1], flush=True)
    proc = subprocess.run([sys.executable, *cmd[1:]], cwd=REPO, check=False)
    if proc.returncode:
      sys.exit(proc.returncode)
  text = summary_text(out, commands, (time.perf_counter() - t) / 60)
  with open(os.path.join(out, 'README.md'), 'w') as f:
    f.write(text)
  print(text)


if __name__ == '__main__':
  main()
