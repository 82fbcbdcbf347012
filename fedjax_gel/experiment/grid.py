"""A ``(client lr, server lr)`` grid trained as one vmapped program (GeL's Fig. 7).

Every cell is its own run: its own server model and optimiser state, started from the same
initial model and trained on the same cohorts, budgets and shuffles (the seed's), with its own
pair of learning rates. The algorithm is built *inside* the vmapped function from traced
learning rates (optax takes arrays as learning rates), so the whole grid is one compiled round:
``jax.vmap`` over the cells of the engine's round. A cell that diverges (a non-finite server
model or test loss) is marked and keeps running on its own NaNs; the other cells are unaffected.

Outputs in the work directory: ``config.json``; ``metrics.jsonl`` with one record per cell and
evaluation (``round, algorithm, seed, client_lr, server_lr, test_accuracy, best_test_accuracy,
test_loss, train_loss`` (the round's mean client minibatch loss), ``diverged``);
``grid.json`` with each cell's final and best accuracy, rounds to target and divergence;
``summary.json``; ``plots/grid.png``, the heat map of final test accuracy. Every
``checkpoint_every`` rounds all cells' states and the grid's bookkeeping go into one
checkpoint, and the same command resumes an unfinished grid as it does a run.

Algorithms with per-client state (the store) and power-of-d selection (which ranks clients by
each model's loss) are not supported in a grid. FedExP and the FedGBO family set their own server
step: their grid's server learning rates change nothing.
"""
from __future__ import annotations

import dataclasses
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_gel.core import keys, round as round_lib
from fedjax_gel.experiment import config as config_lib
from fedjax_gel.experiment import checkpoint, plots, runner
from fedjax_gel.experiment.progress import Progress


def check_grid(c: config_lib.Config):
  """The grid's incompatible settings, as a ConfigError naming the flag."""
  if c.algorithm in config_lib.STATEFUL_ALGORITHMS:
    raise config_lib.ConfigError(
        f'--server_lr_grid: --algorithm={c.algorithm} keeps per-client state, which a '
        'learning-rate grid does not support; run its learning rates one by one')
  if c.client_selection == 'power_of_d':
    raise config_lib.ConfigError(
        '--server_lr_grid: --client_selection=power_of_d ranks clients by each model\'s loss, '
        'which a learning-rate grid does not support')


def cells(client_lrs, server_lrs) -> tuple[np.ndarray, np.ndarray]:
  """The grid's ``[I * J]`` client and server learning rates, client lr major."""
  lc, ls = np.meshgrid(np.asarray(client_lrs, np.float32), np.asarray(server_lrs, np.float32),
                       indexing='ij')
  return lc.reshape(-1), ls.reshape(-1)


def grid_chunk_size(exp: runner.Experiment, num_cells: int) -> int:
  """Clients per chunk and cell: the automatic chunk of a cohort of ``C x cells`` clients,
  shared among the cells (``--chunk_size`` when given), within the memory guard's capacity
  (``runner.chunk_capacity``) shared among the cells."""
  c = exp.config
  fits = runner.chunk_capacity(exp.memory, 0) // num_cells
  if fits < 1:
    raise config_lib.ConfigError(
        f'--server_lr_grid: {num_cells} cells of one client each need about '
        f'{num_cells * exp.memory.client_bytes / 2**30:.2f} GiB in a round, more than the '
        f'{runner.CHUNK_MEMORY_FRACTION * exp.memory.free_bytes / 2**30:.2f} GiB the device '
        'memory has for it; use fewer learning rates')
  if c.chunk_size:
    return min(c.chunk_size, c.clients_per_round, fits)
  params = jax.eval_shape(exp.model.init, jax.random.key(0))
  total = round_lib.default_chunk_size(
      c.clients_per_round * num_cells, params, runner.example_bytes(exp.train), c.batch_size,
      budget_range=tuple(c.budget_range))
  return max(1, min(total // num_cells, c.clients_per_round, fits))


def build_grid_fns(exp: runner.Experiment, chunk: int):
  """``(init(lc, ls), round(states, lc, ls, cohort, data, root, r), evaluate(states, lc, ls))``,
  each jitted and vmapped over the cells."""
  c = exp.config
  counts = np.asarray(exp.train.counts)
  params0 = exp.model.init(keys.init_key(keys.root_key(c.seed)))

  def algorithm(lc, ls):   # traced learning rates: built inside the vmapped function
    return runner.make_algorithm(dataclasses.replace(c, client_lr=lc, server_lr=ls), exp.model,
                                 counts)

  def cell_round(state, lc, ls, cohort, data, root, r):
    round_fn = round_lib.build_round(algorithm(lc, ls), chunk_size=chunk)
    return round_fn(state, cohort, data, root, r)

  from fedjax_gel.core import evaluation  # pylint: disable=g-import-not-at-top
  evaluate = evaluation.build_evaluate(exp.model.apply)

  def cell_eval(state, lc, ls):
    params = algorithm(lc, ls).server_params(state)
    test = evaluate(params, exp.test_pool)
    finite = round_lib.all_finite(params) & jnp.isfinite(test['loss'])
    return test['accuracy'], test['loss'], ~finite

  init = jax.jit(jax.vmap(lambda lc, ls: algorithm(lc, ls).server_init(params0)))
  round_fn = jax.jit(jax.vmap(cell_round, in_axes=(0, 0, 0, None, None, None, None)),
                     donate_argnums=(0,))
  return init, round_fn, jax.jit(jax.vmap(cell_eval))


# The grid's bookkeeping per cell, kept in its checkpoints' meta.
TRACKED = ('best', 'diverged', 'reached', 'accuracy', 'train_loss')


def grid_fields(client_lrs, server_lrs) -> dict:
  """The grid's own fields of ``config.json`` (beside the Config's)."""
  return {'client_lr_grid': [float(x) for x in client_lrs],
          'server_lr_grid': [float(x) for x in server_lrs]}


def check_resume(exp: runner.Experiment, client_lrs, server_lrs, workdir: str):
  """The checkpoints of an unfinished grid in ``workdir`` hold this grid's states (read before
  anything is written; another configuration's is a one-line ``CheckpointError``)."""
  lc, ls = cells(client_lrs, server_lrs)
  init = build_grid_fns(exp, 1)[0]
  checkpoint.check(workdir, jax.eval_shape(init, lc, ls), TRACKED)


def train_grid(exp: runner.Experiment, client_lrs, server_lrs, workdir: str,
               progress: Progress | None = None, resume: bool = False) -> dict:
  """Trains every cell of the grid for ``num_rounds`` rounds as one program, evaluating every
  ``eval_every`` rounds and after the last; returns (and writes) ``grid.json``'s content.

  Every ``checkpoint_every`` rounds the cells' states and the grid's bookkeeping are
  checkpointed as a run's are (``experiment.checkpoint``); ``resume`` continues from the last
  checkpoint (``runner.run_status`` said ``'resume'``), with ``metrics.jsonl`` cut back to it.
  """
  c = exp.config
  check_grid(c)
  lc, ls = cells(client_lrs, server_lrs)
  chunk = grid_chunk_size(exp, lc.size)
  runner.make_workdir(workdir)
  metrics_path = os.path.join(workdir, 'metrics.jsonl')
  start = checkpoint.rounds(workdir)[-1] if resume and checkpoint.rounds(workdir) else 0
  if not start:
    runner.remove_checkpoints(workdir)
    runner.write_json(os.path.join(workdir, 'config.json'),
                      {**c.to_json(), **grid_fields(client_lrs, server_lrs)})
    open(metrics_path, 'w').close()
  root = keys.root_key(c.seed)
  sample = runner.make_sampler(exp, root)

  num = lc.size
  progress = progress or Progress(c.num_rounds)
  progress.label = f'{c.run_name} grid of {num} cells, seed {c.seed}'
  progress.note(f'{progress.label}: compiling')
  t0 = time.perf_counter()
  init, round_fn, evaluate = build_grid_fns(exp, chunk)
  track = {'best': np.full(num, -np.inf), 'diverged': np.zeros(num, bool),
           'reached': np.full(num, -1), 'accuracy': np.full(num, np.nan),
           'train_loss': np.full(num, np.nan)}   # TRACKED, per cell; checkpointed
  if start:   # the cells' states and the grid's bookkeeping as they stood then
    states, meta = checkpoint.restore(workdir, start, jax.eval_shape(init, lc, ls))
    states = jax.device_put(states)
    track = {k: np.asarray(meta[k], v.dtype) for k, v in track.items()}
  else:
    states = init(lc, ls)
  cohort0 = sample(start, None)
  compiled = round_fn.lower(states, lc, ls, cohort0, exp.train, root, jnp.int32(start)).compile()
  compile_s = time.perf_counter() - t0

  def record(done):
    track['train_loss'] = np.asarray(track['train_loss'])
    acc, loss, diverged = (np.asarray(a) for a in evaluate(states, lc, ls))
    ever = track['diverged'] = track['diverged'] | diverged
    acc = track['accuracy'] = np.where(ever, np.nan, acc)
    best = track['best'] = np.where(ever, track['best'], np.maximum(track['best'], acc))
    reached = track['reached']
    track['reached'] = np.where((reached < 0) & (acc >= c.target_accuracy), done, reached)
    lines = []
    for i in range(num):
      lines.append(runner.json_line({
          'round': done, 'algorithm': c.run_name, 'seed': c.seed, 'client_lr': float(lc[i]),
          'server_lr': float(ls[i]), 'test_accuracy': float(acc[i]),
          'best_test_accuracy': float(best[i]), 'test_loss': float(loss[i]),
          'train_loss': float(track['train_loss'][i]), 'diverged': bool(ever[i])}))
    with open(metrics_path, 'a') as f:
      f.write(''.join(lines))
    alive = acc[~ever]
    progress.update(done, f'{alive.size}/{num} cells finite, best test acc '
                    f'{alive.max() if alive.size else float("nan"):.4f}', force=True)

  progress.compiled(compile_s, start)

  def step(r):
    nonlocal states
    cohort = cohort0 if r == start else sample(r, None)
    states, metrics = compiled(states, lc, ls, cohort, exp.train, root, jnp.int32(r))
    track['train_loss'] = metrics.train_loss   # fetched only when evaluated

  def save(done):
    track['train_loss'] = np.asarray(track['train_loss'])
    checkpoint.save(workdir, done, states,
                    {'metrics_bytes': os.path.getsize(metrics_path), **track})

  train_s = runner.run_rounds(c, start, progress, step, record, save)

  best, ever_diverged, reached, final = (track[k] for k in ('best', 'diverged', 'reached',
                                                            'accuracy'))
  shape = (len(client_lrs), len(server_lrs))
  result = {
      'algorithm': c.run_name, 'dataset': c.dataset, 'seed': c.seed, 'rounds': c.num_rounds,
      'client_lrs': [float(x) for x in client_lrs], 'server_lrs': [float(x) for x in server_lrs],
      'target_accuracy': c.target_accuracy,
      'cells': [{'client_lr': float(lc[i]), 'server_lr': float(ls[i]),
                 'final_accuracy': None if ever_diverged[i] else float(final[i]),
                 'best_accuracy': None if not math.isfinite(best[i]) else float(best[i]),
                 'rounds_to_target': None if reached[i] < 0 else int(reached[i]),
                 'diverged': bool(ever_diverged[i])} for i in range(num)],
  }
  runner.write_json(os.path.join(workdir, 'grid.json'), result)
  plots.grid_heatmap(np.nan_to_num(final.reshape(shape)), ever_diverged.reshape(shape),
                     client_lrs, server_lrs,
                     f'{c.run_name}: final test accuracy, {c.num_rounds} rounds',
                     os.path.join(workdir, 'plots', 'grid.png'))
  finite = np.where(ever_diverged, -np.inf, final)
  top = int(np.argmax(finite))
  runner.write_json(os.path.join(workdir, 'summary.json'), {   # last: the grid is finished
      'algorithm': c.run_name, 'dataset': c.dataset, 'seed': c.seed, 'rounds': c.num_rounds,
      'cells': num, 'diverged_cells': int(ever_diverged.sum()),
      'best_cell': result['cells'][top], 'chunk_size': chunk,
      'compile_s': round(compile_s, 3), 'train_s': round(train_s, 3),
      'rounds_per_s': round(c.num_rounds / train_s, 3) if train_s > 0 else None})
  runner.remove_checkpoints(workdir)   # replaced by grid.json and summary.json
  return result


def grid_table(result: dict) -> str:
  """The grid's final test accuracy (%) as Markdown: client lr rows, server lr columns; ``x``
  marks a diverged cell and ``*`` the best."""
  by = {(cell['client_lr'], cell['server_lr']): cell for cell in result['cells']}
  finals = [cell['final_accuracy'] for cell in result['cells'] if cell['final_accuracy'] is not None]
  top = max(finals) if finals else None
  lines = [f'{result["algorithm"]}, seed {result["seed"]}: final test accuracy (%) after '
           f'{result["rounds"]} rounds (rows: log10 client lr, columns: log10 server lr; x: '
           'diverged, *: best)', '',
           '| | ' + ' | '.join(f'{round(math.log10(s), 2):g}' for s in result['server_lrs']) + ' |',
           '|---:|' + '---:|' * len(result['server_lrs'])]
  for lr in result['client_lrs']:
    row = []
    for s in result['server_lrs']:
      cell = by[(float(np.float32(lr)), float(np.float32(s)))]
      acc = cell['final_accuracy']
      row.append('x' if cell['diverged'] else f'{100 * acc:.1f}{"*" if acc == top else ""}')
    lines.append(f'| {round(math.log10(lr), 2):g} | ' + ' | '.join(row) + ' |')
  return '\n'.join(lines)
