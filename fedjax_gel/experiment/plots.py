"""The work directory's ``plots/*.png`` (matplotlib, optional: ``pip install -e '.[plot]'``).

Each plot shows the runs' main test metric (``models.tasks.Metric``: accuracy for classifiers,
whose files are named below; ``mse_rounds.png`` and so on for a regression model).

* ``accuracy_rounds.png``: test accuracy against communication rounds, per algorithm the mean
  over seeds with its 95% confidence band (GeL Fig. 4, rows 1-2);
* ``accuracy_gradients.png``: the same means against the cumulative gradient computations of
  all clients (GeL Fig. 4, row 3);
* ``accuracy_upload.png``: the same means against the cumulative MiB uploaded by all clients
  (FedGBO's Table 4 costs as curves);
* ``train_loss_rounds.png``: the training loss (on ``--train_eval_examples`` training
  examples) against rounds, the same means and bands, on a log scale;
* ``accuracy_epsilon.png``: with differential privacy (``--dp_clip_norm``), test accuracy
  against the epsilon the rounds spent (``dp_epsilon``; runs without noise have none);
* ``lr_grid.png``: with a client learning-rate grid, each algorithm's mean best test accuracy
  per learning rate (the grid the report picks from);
* ``grid.png`` (in each grid's own folder): a client x server learning-rate grid's final test
  accuracy as a heat map (GeL Fig. 7), diverged cells marked.
"""
from __future__ import annotations

import io
import math
import importlib.util
import os
from typing import Sequence

import numpy as np

from fedjax_gel.experiment import files
from fedjax_gel.experiment.report import mean_ci
from fedjax_gel.core.tasks import Metric


def available() -> bool:
  """Whether matplotlib is installed (plots can be written)."""
  return importlib.util.find_spec('matplotlib') is not None


def _pyplot():
  """``matplotlib.pyplot`` with the file-only backend, or None when matplotlib is missing."""
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def save(fig, path: str):
  """Lays ``fig`` out tightly and writes it as a PNG at ``path`` whole, never through a link
  (``files.write_atomic``). The layout is computed once: ``tight_layout`` leaves a placeholder
  layout engine on the figure, for which ``savefig`` would draw the whole figure once more
  before drawing it into the PNG (without it: the same bytes, one draw less)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  fig.tight_layout()
  with matplotlib.rc_context({'figure.autolayout': False, 'figure.constrained_layout.use': False}):
    fig.set_layout_engine(None)   # no engine (with these settings None means none)
  data = io.BytesIO()
  fig.savefig(data, format='png', dpi=110)
  files.write_atomic(path, data.getvalue())


def curves(results: Sequence[tuple[dict, Sequence[dict]]]) -> dict:
  """Per run name: ``(rounds, mean main metric, 95% half-width, mean gradient computations,
  mean MiB uploaded, mean train loss, its 95% half-width, mean dp_epsilon)`` over the
  evaluations every seed has (seeds share the evaluation schedule); the epsilon NaN without
  differential privacy or without noise (an infinite epsilon, null in the records)."""
  by_alg: dict[str, list[Sequence[dict]]] = {}
  for summary, records in results:
    by_alg.setdefault(summary['algorithm'], []).append(records)
  out = {}
  key = f'test_{Metric.of(results[0][0]).name}' if results else 'test_accuracy'
  for name, runs in by_alg.items():
    common = sorted(set.intersection(*({r['round'] for r in rec} for rec in runs)))
    at = [{r['round']: r for r in rec} for rec in runs]
    value = lambda r, k: math.nan if r[k] is None else r[k]   # null: not finite (a gap)
    acc = [[value(a[t], key) for a in at] for t in common]
    stats = [mean_ci(v) for v in acc]
    loss = [mean_ci([value(a[t], 'train_loss') for a in at]) for t in common]
    half = lambda st: np.array([0. if math.isnan(h) else h for _, h in st])
    out[name] = (np.array(common), np.array([m for m, _ in stats]), half(stats),
                 np.array([np.mean([a[t]['grad_computations'] for a in at]) for t in common]),
                 np.array([np.mean([a[t]['bytes_up'] for a in at]) for t in common]) / 2 ** 20,
                 np.array([m for m, _ in loss]), half(loss),
                 np.array([np.mean([value(a[t], 'dp_epsilon') if 'dp_epsilon' in a[t] else
                                    math.nan for a in at]) for t in common]))
  return out


def metric_plots(results: Sequence[tuple[dict, Sequence[dict]]], plot_dir: str,
                 target: float | None = None, setting: str = '',
                 labels: dict | None = None) -> list[str]:
  """Writes the three plots of the main metric (four with differential privacy) and the
  training-loss plot; returns their paths ([] without matplotlib or runs). ``setting`` (e.g. dataset, model, learning rates)
  heads every title; ``labels``: an algorithm's legend entry where it is not its name (e.g.
  with the learning rate a grid chose for it)."""
  labels = labels or {}
  plt = _pyplot()
  if plt is None or not results:
    return []
  m = Metric.of(results[0][0])
  os.makedirs(plot_dir, exist_ok=True)
  data = curves(results)
  seeds = max(sum(1 for s, _ in results if s['algorithm'] == name) for name in data)
  paths = []
  band = f', mean and 95% CI over {seeds} seeds' if seeds > 1 else ''
  head = f'{setting}\n' if setting else ''
  private = all(np.isfinite(c[7][1:]).all() and len(c[7]) > 1 for c in data.values())
  for x_key, y_key, xlabel, ylabel, file in (
      (0, 1, 'communication rounds', m.label, f'{m.name}_rounds.png'),
      (3, 1, 'cumulative gradient computations', m.label, f'{m.name}_gradients.png'),
      (4, 1, 'cumulative MiB uploaded by the clients', m.label, f'{m.name}_upload.png'),
      (0, 5, 'communication rounds', 'training loss', 'train_loss_rounds.png'),
      *([(7, 1, 'epsilon spent (differential privacy, at --dp_delta)', m.label,
          f'{m.name}_epsilon.png')] if private else [])):
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for name, c in data.items():
      x, mean, half = c[x_key], c[y_key], c[y_key + 1]
      ax.plot(x, mean, label=labels.get(name, name))
      if half.any():
        low, high = mean - half, mean + half
        if y_key == 1 and m.name == 'accuracy':   # few seeds' t intervals left [0, 1]
          low, high = np.clip(low, 0, 1), np.clip(high, 0, 1)
        ax.fill_between(x, low, high, alpha=0.2)
    if target is not None and ylabel == m.label:
      ax.axhline(target, color='gray', linestyle=':', linewidth=1,
                 label=f'target {m.format(target)}')
    if ylabel == 'training loss' and all((c[5] > 0).all() for c in data.values()):
      ax.set_yscale('log')
    ax.set(xlabel=xlabel, ylabel=ylabel)
    ax.set_title(f'{head}{ylabel}{band}', fontsize='medium')
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize='small')
    path = os.path.join(plot_dir, file)
    save(fig, path)
    plt.close(fig)
    paths.append(path)
  return paths


def grid_heatmap(values: np.ndarray, diverged: np.ndarray, client_lrs: Sequence[float],
                 server_lrs: Sequence[float], title: str, path: str,
                 metric: Metric = Metric()) -> str | None:
  """``values[i, j]`` (the final value of ``metric``) of client lr ``i`` and server lr ``j``
  as a heat map with the values written in; diverged cells are grey and marked ``x``. Returns
  the path (None without matplotlib)."""
  plt = _pyplot()
  if plt is None:
    return None
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  shown = np.ma.masked_where(diverged, values)
  fig, ax = plt.subplots(figsize=(max(4.8, 1.8 + 0.75 * len(server_lrs)),
                                  max(3.2, 1.4 + 0.45 * len(client_lrs))))
  cmap = plt.get_cmap('viridis').with_extremes(bad='lightgrey')
  live = values[~diverged] if (~diverged).any() else np.array([0., 1.])
  low, high = float(live.min()), float(live.max())
  high = high if high > low else low + 1e-6       # the colour scale from the data
  im = ax.imshow(shown, origin='lower', cmap=cmap, vmin=low, vmax=high, aspect='auto')
  for i in range(len(client_lrs)):
    for j in range(len(server_lrs)):
      text = 'x' if diverged[i, j] else metric.short(values[i, j])
      light = diverged[i, j] or values[i, j] > low + 0.6 * (high - low)
      ax.text(j, i, text, ha='center', va='center', fontsize=7,
              color='black' if light else 'white')
  ax.set_xticks(range(len(server_lrs)), [f'{v:g}' for v in server_lrs], fontsize=7)
  ax.set_yticks(range(len(client_lrs)), [f'{v:g}' for v in client_lrs], fontsize=7)
  ax.set(xlabel='server learning rate', ylabel='client learning rate')
  ax.set_title(title, fontsize='medium', wrap=True)
  fig.colorbar(im, ax=ax, label=f'final {metric.label}' + (' (cells: %)' if metric.unit else ''))
  save(fig, path)
  plt.close(fig)
  return path


def lr_grid_values(results: Sequence[tuple[dict, Sequence[dict]]]):
  """``lr_heatmap``'s cells: ``(algorithms, client lrs, [A, L] mean best value over the runs
  that did not diverge (NaN: none), [A][L] whether every run there diverged)``."""
  m = Metric.of(results[0][0])
  best: dict = {}
  for summary, _ in results:   # a diverged run counts for nothing, as in the selection rule
    by_lr = best.setdefault(summary['algorithm'], {}).setdefault(summary['client_lr'], [])
    if summary.get('status') != 'diverged':
      by_lr.append(summary[f'best_{m.name}'])
  names = list(best)
  lrs = sorted({lr for by_lr in best.values() for lr in by_lr})
  acc = np.array([[np.mean(best[n][lr]) if best[n].get(lr) else np.nan for lr in lrs]
                  for n in names])
  return names, lrs, acc, [[lr in best[n] and not best[n][lr] for lr in lrs] for n in names]


def lr_heatmap(results: Sequence[tuple[dict, Sequence[dict]]], path: str) -> str | None:
  """Each algorithm's (rows) mean best value of the main test metric over seeds at each client
  learning rate (columns) of a grid, the values written in and the colour scale from the data;
  diverged runs left out, as the selection rule leaves them (``x``: every run diverged).
  Returns the path (None without matplotlib or runs)."""
  plt = _pyplot()
  if plt is None or not results:
    return None
  m = Metric.of(results[0][0])
  names, lrs, acc, diverged = lr_grid_values(results)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig, ax = plt.subplots(figsize=(2.6 + 0.8 * len(lrs), 1.2 + 0.4 * len(names)))
  shown = np.ma.masked_invalid(acc)
  im = ax.imshow(shown, cmap=plt.get_cmap('viridis').with_extremes(bad='lightgrey'),
                 aspect='auto')
  finite = acc[np.isfinite(acc)]
  middle = finite.min() + 0.5 * (finite.max() - finite.min()) if finite.size else 0.
  for i in range(len(names)):
    for j in range(len(lrs)):
      if not np.isnan(acc[i, j]):
        ax.text(j, i, m.short(acc[i, j]), ha='center', va='center', fontsize=8,
                color='black' if acc[i, j] > middle else 'white')
      elif diverged[i][j]:
        ax.text(j, i, 'x', ha='center', va='center', fontsize=8)
  ax.set_xticks(range(len(lrs)), [f'{lr:g}' for lr in lrs])
  ax.set_yticks(range(len(names)), names)
  ax.set(xlabel='client learning rate',
         title=f'best {m.label} per learning rate (x: every run diverged)')
  fig.colorbar(im, ax=ax, label=f'best {m.label}' + (' (cells: %)' if m.unit else ''))
  save(fig, path)
  plt.close(fig)
  return path
