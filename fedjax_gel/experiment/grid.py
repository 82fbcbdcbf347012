"""A ``(client lr, server lr)`` grid: its cells, its outputs and its table (GeL's Fig. 7).

Every cell is its own run, started from the same initial model and trained on the same cohorts,
budgets and shuffles (the seed's), with its own pair of learning rates; the cells are one batch
of ``core.runs`` (the learning rates its data), trained by the one loop (``experiment.loop``)
into one work directory. A cell that diverges (its server model stops being finite) stops
there, as any run does; the others are unaffected.

Outputs in the work directory: ``config.json`` (with ``client_lr_grid, server_lr_grid``);
``metrics.jsonl`` and ``metrics.csv`` with each cell's records, told apart by ``client_lr,
server_lr``; ``grid.json`` with each cell's final and best value of the main metric (accuracy,
or the model's task's: ``models.tasks``), rounds to target and divergence; ``summary.json``, a
run's summary (``callbacks.run_summary``) of the cell ``best_cell`` picks, with the grid's own
fields under ``grid``; ``plots/grid.png``, the heat map of the final main metric. Its
checkpoints hold all cells, and the same command resumes an unfinished grid as it does a run.

Algorithms with per-client state (the store), power-of-d selection (which ranks clients by
each model's loss) and cohorts split over several devices are not supported in a grid, nor
are the algorithms with a server step of their own (FedDyn, AdaBest, FedExP, the FedGBO
family: ``AlgorithmSpec.own_server``), whose cells would not differ along the server learning
rates.
"""
from __future__ import annotations

import math
import os

import jax
import numpy as np

from fedjax_gel.experiment import callbacks, files, plots, report, workdir as workdir_lib
from fedjax_gel.experiment.callbacks import run_fields
from fedjax_gel.experiment.config import Config, ConfigError
from fedjax_gel.core.tasks import Metric


def check_grid(c: Config, exp=None):
  """The grid's incompatible settings, as a ConfigError naming the flag (``exp``: the prepared
  experiment, whose devices are checked too)."""
  if c.spec.stateful or (exp is not None and exp.algorithm.store_row is not None):
    raise ConfigError(
        f'--server_lr_grid: --algorithm={c.algorithm.name} keeps per-client state, which a '
        'learning-rate grid does not support; run its learning rates one by one')
  if c.spec.own_server:
    raise ConfigError(
        f'--server_lr_grid: --algorithm={c.algorithm.name} sets its own server step, which no '
        'server learning rate changes; use --client_lr_grid')
  if c.cohort.client_selection == 'power_of_d':
    raise ConfigError(
        '--server_lr_grid: --client_selection=power_of_d ranks clients by each model\'s loss, '
        'which a learning-rate grid does not support')
  if exp is not None and exp.mesh is not None and jax.process_count() > 1:
    raise ConfigError('--server_lr_grid: a grid runs in one process on one device; run it '
                      'without --num_processes')
  if exp is not None and exp.mesh is not None:
    raise ConfigError(
        f'--server_lr_grid: a grid runs on one device (got --num_devices={c.run.num_devices} or an '
        'automatic choice of several); pass --num_devices=1')


def cells(client_lrs, server_lrs) -> tuple[np.ndarray, np.ndarray]:
  """The grid's ``[I * J]`` client and server learning rates, client lr major (float32)."""
  lc, ls = np.meshgrid(np.asarray(client_lrs, np.float32), np.asarray(server_lrs, np.float32),
                       indexing='ij')
  return lc.reshape(-1), ls.reshape(-1)


def cell_tags(client_lrs, server_lrs) -> list[dict]:
  """Each cell's tags in its metrics records: ``{'client_lr', 'server_lr'}`` as float32 values."""
  lc, ls = cells(client_lrs, server_lrs)
  return [{'client_lr': float(a), 'server_lr': float(b)} for a, b in zip(lc, ls)]


def grid_fields(client_lrs, server_lrs) -> dict:
  """The grid's own fields of ``config.json`` (beside the Config's)."""
  return {'client_lr_grid': [float(x) for x in client_lrs],
          'server_lr_grid': [float(x) for x in server_lrs]}


class GridSummary(callbacks.Callback):
  """After the last round, in each grid's work directory: ``grid.json``, ``plots/grid.png``
  (where ``plots``) and ``summary.json`` (last: it marks the grid finished);
  ``results[workdir]`` holds ``grid.json``'s content."""

  def __init__(self, grids: dict, plots: bool = True):
    self.grids = grids    # workdir -> (client lrs, server lrs)
    self.plots = plots
    self.results = {}

  def on_end(self, loop):
    with loop.phases.time('report'):
      for w, idx in callbacks.groups(loop).items():
        if w in self.grids:
          self.results[w] = write_grid(loop, idx, w, *self.grids[w], self.plots)


def best_cell(cells: list[dict], metric: Metric = Metric()) -> dict | None:
  """The cell ``report.SELECTION_RULE`` picks: the best value of the main test metric, never
  a diverged cell (None when every cell diverged)."""
  best = f'best_{metric.name}'
  live = [x for x in cells if not x['diverged'] and x[best] is not None]
  return max(live, key=lambda x: metric.key(x[best])) if live else None


def write_grid(loop, idx, workdir: str, client_lrs, server_lrs, plot: bool = True) -> dict:
  c = loop.runs[idx[0]].config
  metric = loop.exp.model.task.metric
  cell_results = []
  for i in idx:
    run = loop.runs[i]
    fields = callbacks.metric_fields(run.records, c.run.target, metric)
    if run.diverged is not None:
      fields[f'final_{metric.name}'] = None
    cell_results.append({**run.tags, f'final_{metric.name}': fields[f'final_{metric.name}'],
                         f'best_{metric.name}': fields[f'best_{metric.name}'],
                         'rounds_to_target': fields['rounds_to_target'],
                         'diverged': run.diverged is not None})
  result = {
      **run_fields(c), 'metric': metric._asdict(), 'client_lrs': [float(x) for x in client_lrs],
      'server_lrs': [float(x) for x in server_lrs], f'target_{metric.name}': c.run.target,
      'cells': cell_results}
  write = loop.runtime.write   # process 0's files (several processes)
  write(files.write_json, os.path.join(workdir, 'grid.json'), result)
  shape = (len(client_lrs), len(server_lrs))
  final = np.array([np.nan if x[f'final_{metric.name}'] is None else x[f'final_{metric.name}']
                    for x in cell_results]).reshape(shape)
  diverged = np.array([x['diverged'] for x in cell_results]).reshape(shape)
  if plot:
    write(plots.grid_heatmap, np.nan_to_num(final), diverged, client_lrs, server_lrs,
          f'{c.run_name} on {c.data.dataset} ({c.model.name}): final {metric.label} after '
          f'{c.run.num_rounds} rounds', os.path.join(workdir, 'plots', 'grid.png'), metric)
  best = best_cell(cell_results, metric)
  chosen = idx[cell_results.index(best)] if best is not None else idx[0]
  summary = callbacks.run_summary(loop, chosen)
  summary['grid'] = {'cells': len(idx), 'diverged_cells': int(diverged.sum()),
                     'client_lr_grid': result['client_lrs'],
                     'server_lr_grid': result['server_lrs'],
                     'selection_rule': report.SELECTION_RULE}
  write(workdir_lib.write_summary, workdir, summary)   # last: finished
  write(workdir_lib.remove_checkpoints, workdir, keep=c.run.num_rounds)
  return result


def grid_table(result: dict) -> str:
  """The grid's final main test metric (accuracy in %) as Markdown: client lr rows, server lr
  columns; ``x`` marks a diverged cell and ``*`` the cell ``best_cell`` selects (by the best
  value over the evaluations, not the final one shown: the star was on the best final value,
  another cell than the selected one)."""
  m = Metric.of(result)
  by = {(cell['client_lr'], cell['server_lr']): cell for cell in result['cells']}
  chosen = best_cell(result['cells'], m)
  lines = [f'{result["algorithm"]}, seed {result["seed"]}: final {m.label}{m.unit} after '
           f'{result["rounds"]} rounds (rows: log10 client lr, columns: log10 server lr; x: '
           f'diverged, *: the selected cell, by {report.SELECTION_RULE})', '',
           '| | ' + ' | '.join(f'{round(math.log10(s), 2):g}' for s in result['server_lrs']) + ' |',
           '|---:|' + '---:|' * len(result['server_lrs'])]
  for lr in result['client_lrs']:
    row = []
    for s in result['server_lrs']:
      cell = by[(float(np.float32(lr)), float(np.float32(s)))]
      value = cell[f'final_{m.name}']
      row.append('x' if cell['diverged'] else f'{m.short(value)}{"*" if cell is chosen else ""}')
    lines.append(f'| {round(math.log10(lr), 2):g} | ' + ' | '.join(row) + ' |')
  return '\n'.join(lines)
