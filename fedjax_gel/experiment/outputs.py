"""What a command writes after its runs: a line per run or grid on stdout, ``report.md`` and
``plots/`` at the top of the work directory (``api.run``'s last step)."""
from __future__ import annotations

import os

from fedjax_gel.experiment import factories, grid as grid_lib, plots, report
from fedjax_gel.experiment import workdir as workdir_lib


def write_report(p, workdir: str, summaries: list[dict], out):
  """One line per run, ``report.md`` and ``plots/`` (``p``: the ``api.Plan`` that ran)."""
  results = []
  for x, w, summary in zip(p.configs, p.workdirs, summaries):
    results.append((summary, workdir_lib.read_metrics(w)))
    target = summary['rounds_to_target']
    final, best = summary['final_accuracy'], summary['best_accuracy']
    flag = p.levels[3]
    value = f', {flag} {x.flags()[flag]:g}' if flag in factories.tunable_flags(x) else ''
    print(f'{x.run_name} on {x.data.dataset}, seed {x.run.seed}, client lr '
          f'{x.algorithm.client_lr:g}{value}: final test accuracy {fmt(final)}, best '
          f'{fmt(best)}, rounds to {report.percent(x.run.target_accuracy)}: '
          f'{target if target is not None else "not reached"}', file=out)
  tuned = 'client_lr' if p.levels[2] else p.levels[3]
  text = report.report_text(results, tuned)
  if len(results) > 1:
    print(text, file=out)
  workdir_lib.write_text(os.path.join(workdir, 'report.md'), text + '\n')
  plotted = plots.accuracy_plots(report.kept_runs(results, tuned),
                                 os.path.join(workdir, 'plots'), p.configs[0].run.target_accuracy)
  if plotted and tuned == 'client_lr':
    plots.lr_heatmap(results, os.path.join(workdir, 'plots', 'lr_grid.png'))
  if not plotted:
    print("note: plots/ not written: matplotlib is not installed (pip install -e '.[plot]')",
          file=out)
  print(f'outputs: {os.path.abspath(workdir)} (config.json, metrics.jsonl, metrics.csv, '
        f'summary.json, model.msgpack{"" if len(p.configs) == 1 else " per run"}; report.md'
        f'{"; plots/" if plotted else ""})', file=out)


def fmt(value) -> str:
  return 'n/a' if value is None else f'{value:.4f}'


def write_grid_report(p, workdir: str, results: list[dict], out):
  """One line per grid and ``report.md`` with the grids' tables."""
  tables = []
  for x, w, result in zip(p.configs, p.workdirs, results):
    diverged = sum(cell['diverged'] for cell in result['cells'])
    finals = [(cell['final_accuracy'], cell) for cell in result['cells']
              if cell['final_accuracy'] is not None]
    best = max(finals, key=lambda t: t[0])[1] if finals else None
    print(f'{x.run_name} on {x.data.dataset}, seed {x.run.seed}: {len(result["cells"])} cells, '
          f'{diverged} diverged' + (f', best final test accuracy {best["final_accuracy"]:.4f} '
                                    f'at client lr {best["client_lr"]:g}, server lr '
                                    f'{best["server_lr"]:g}' if best else ''), file=out)
    tables.append(grid_lib.grid_table(result) + f'\n\nHeat map: `{os.path.relpath(w, workdir)}/'
                  'plots/grid.png`')
  workdir_lib.write_text(os.path.join(workdir, 'report.md'), '\n\n'.join(tables) + '\n')
  print(f'outputs: {os.path.abspath(workdir)} (config.json, metrics.jsonl, metrics.csv, '
        'grid.json, summary.json, plots/grid.png per grid; report.md)', file=out)
