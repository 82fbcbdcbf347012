"""What a command writes after its runs: a line per run or grid on stdout, ``report.md`` and
``plots/`` at the top of the work directory (``api.run``'s last step)."""
from __future__ import annotations

import os
import time

from fedjax_gel.experiment import config as config_lib, files, grid as grid_lib, plots, report
from fedjax_gel.experiment import workdir as workdir_lib
from fedjax_gel.core.tasks import Metric

# Settings every report shows, in this order; any other flag shows when the runs differ in it
# or it is not at its default.
MAIN_FLAGS = ('dataset', 'data_path', 'model', 'algorithm', 'client_lr', 'client_momentum',
              'server_optimizer', 'server_lr', 'num_rounds', 'clients_per_round', 'batch_size',
              'budget_range', 'budget_unit', 'budget_draw', 'seed', 'target')


def settings_table(configs) -> str:
  """Markdown table of the runs' settings: the main flags, then every other flag that is not
  at its default or differs among the runs (an algorithm's own hyper-parameter names the
  algorithms that have it); several values are listed in order."""
  from fedjax_gel.experiment.config import make   # pylint: disable=g-import-not-at-top
  values, owners, changed, defaults = {}, {}, set(), {}
  for c in configs:
    name = c.algorithm.name, c.data.dataset
    defaults.setdefault(name, make(algorithm=name[0], dataset=name[1]).flags())
    for flag, v in c.flags().items():
      v = ','.join(map(str, v)) if isinstance(v, (tuple, list)) else v
      if v not in values.setdefault(flag, []):
        values[flag].append(v)
      owners.setdefault(flag, []).append(c.run_name)
      if v != defaults[name].get(flag):
        changed.add(flag)
  shown = [f for f in MAIN_FLAGS if f in values] + sorted(
      f for f in values if f not in MAIN_FLAGS and f not in workdir_lib.NOT_SETTINGS and
      (len(values[f]) > 1 or f in changed))
  rows = ['| setting | value |', '|---|---|']
  for f in shown:
    some = len(owners[f]) < len(configs)
    whose = f' ({", ".join(dict.fromkeys(owners[f]))})' if some else ''
    rows.append(f'| `--{f}` | {", ".join(str(v) for v in values[f])}{whose} |')
  return '\n'.join(rows)


def header(configs, workdirs, report_dir: str, plotted: list[str]) -> str:
  """The top of ``report.md``: a title, when and with what it was made, the settings, and
  links to the plots and to every run's config."""
  from fedjax_gel import __version__   # pylint: disable=g-import-not-at-top
  names = ', '.join(dict.fromkeys(c.run_name for c in configs))
  c = configs[0]
  seeds = sorted({x.run.seed for x in configs})
  lines = [f'# {names} on {c.data.dataset} ({c.model.name})', '',
           f'{len(configs)} run(s), seeds {", ".join(map(str, seeds))}; report written '
           f'{time.strftime("%Y-%m-%d %H:%M %Z")} by fedjax_gel {__version__}.', '',
           settings_table(configs), '']
  if plotted:
    lines.append('Plots: ' + ', '.join(
        f'[{os.path.basename(q)}]({os.path.relpath(q, report_dir)})' for q in plotted) + '\n')
  lines.append('Runs: ' + ', '.join(
      f'[{os.path.relpath(w, report_dir) or "."}]'
      f'({os.path.join(os.path.relpath(w, report_dir), "config.json")})' for w in workdirs))
  return '\n'.join(lines)


def plot_setting(configs, tuned: str | None = None) -> str:
  """What a plot's title names: dataset, model and the learning rates (with a grid over
  ``tuned``, the values tried: each algorithm's choice is in the legend, ``chosen_labels``)."""
  lrs = lambda values: '/'.join(f'{v:g}' for v in dict.fromkeys(values))
  c = configs[0]
  client = lrs(x.algorithm.client_lr for x in configs)
  if tuned == 'client_lr':
    client = f'the best of {client} (legend)'
  text = f'{c.data.dataset}, {c.model.name}, client lr {client}, server lr ' + lrs(
      x.server.lr for x in configs)
  if tuned is not None and tuned != 'client_lr':
    text += f', --{tuned} the best of the grid (legend)'
  return text


def chosen_labels(results, tuned: str | None) -> dict:
  """With a grid over ``tuned``: each algorithm's legend entry, its name and its chosen value."""
  if tuned is None:
    return {}
  what = 'lr' if tuned == 'client_lr' else tuned
  return {name: f'{name} ({what} {v:g})'
          for name, v in report.best_values(results, tuned).items() if v is not None}


def write_runs_report(configs, workdirs, results, tuned, report_dir: str,
                      plot: bool = True) -> tuple[str, list]:
  """``report.md`` and (where ``plot``) ``plots/`` in ``report_dir`` for finished runs
  (``results``: their ``(summary, records)``); returns the report's tables (without its
  header) and the plots written ([] without matplotlib or ``plot``)."""
  plotted = []
  if plot:
    plotted = plots.metric_plots(report.kept_runs(results, tuned),
                                 os.path.join(report_dir, 'plots'), configs[0].run.target,
                                 plot_setting(configs, tuned), chosen_labels(results, tuned))
  if plotted and tuned == 'client_lr':
    plotted.append(plots.lr_heatmap(results, os.path.join(report_dir, 'plots', 'lr_grid.png')))
  text = report.report_text(results, tuned)
  files.write_text(os.path.join(report_dir, 'report.md'),
                   header(configs, workdirs, report_dir, plotted) + '\n\n' + text + '\n')
  return text, plotted


def write_report(p, workdir: str, summaries: list[dict], out):
  """One line per run, ``report.md`` and ``plots/`` (``p``: the ``api.Plan`` that ran)."""
  results = []
  for x, w, summary in zip(p.configs, p.workdirs, summaries):
    results.append((summary, workdir_lib.read_metrics(w)))
    m = Metric.of(summary)
    target = summary['rounds_to_target']
    final, best = summary[f'final_{m.name}'], summary[f'best_{m.name}']
    flag = p.levels[3]
    value = f', {flag} {x.flags()[flag]:g}' if flag in config_lib.tunable_flags(x) else ''
    diverged = (f' (diverged after round {summary["diverged_round"]}: its last finite '
                'evaluation)' if summary.get('status') == 'diverged' else '')
    print(f'{x.run_name} on {x.data.dataset}, seed {x.run.seed}, client lr '
          f'{x.algorithm.client_lr:g}{value}: final {m.label} {fmt(final)}{diverged}, best '
          f'{fmt(best)}, rounds to {m.format(x.run.target)}: '
          f'{target if target is not None else "not reached"}', file=out)
  tuned = 'client_lr' if p.levels[2] else p.levels[3]
  text, plotted = write_runs_report(p.configs, p.workdirs, results, tuned, workdir, p.plots)
  files.write_json(os.path.join(workdir, 'runs.json'),
                   workdir_lib.run_names(workdir, p.workdirs))
  if len(results) > 1:
    print(text, file=out)
  if not plotted and p.plots:   # (--noplots asked for none)
    why = ('every run diverged' if plots.available() else
           "matplotlib is not installed (pip install -e '.[plot]')")
    print(f'note: plots/ not written: {why}', file=out)
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
    m = Metric.of(result)
    best = grid_lib.best_cell(result['cells'], m)
    print(f'{x.run_name} on {x.data.dataset}, seed {x.run.seed}: {len(result["cells"])} cells, '
          f'{diverged} diverged' + (f', best cell client lr {best["client_lr"]:g}, server lr '
                                    f'{best["server_lr"]:g} (best {m.label} '
                                    f'{best[f"best_{m.name}"]:.4f}, final '
                                    f'{fmt(best[f"final_{m.name}"])})' if best else ''),
          file=out)
    tables.append(grid_lib.grid_table(result) + (
        f'\n\nHeat map: `{os.path.relpath(w, workdir)}/plots/grid.png`' if p.plots else ''))
  files.write_text(os.path.join(workdir, 'report.md'), '\n\n'.join(tables) + '\n')
  files.write_json(os.path.join(workdir, 'runs.json'),
                   workdir_lib.run_names(workdir, p.workdirs))
  print(f'outputs: {os.path.abspath(workdir)} (config.json, metrics.jsonl, metrics.csv, '
        f'grid.json, summary.json{", plots/grid.png" if p.plots else ""} per grid; report.md)',
        file=out)
