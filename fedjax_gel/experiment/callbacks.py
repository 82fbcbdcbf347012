"""The loop's callbacks: evaluation, checkpoints, the divergence guard, progress and summaries.

Each is a small object with the hooks of ``experiment.loop`` it needs (``Callback`` gives the
others as no-ops). Metric files are written by the sinks of ``experiment.sinks``. The order of a
callback list matters where one reads what another did: ``Evaluate`` comes first, so that a
round's records are written before its checkpoint counts them; ``Checkpointer`` restores a
resumed run (``on_start``) before the sinks read its records, and writes the final state before
``RunSummary`` marks the run finished.
"""
from __future__ import annotations

import os
import time
from typing import Optional

import jax
import numpy as np
from flax import serialization

from fedjax_gel.core import devices, evaluation, round as round_lib, runs as runs_lib
from fedjax_gel.experiment import checkpoint, dp, files, report, workdir as workdir_lib
from fedjax_gel.experiment.config import ConfigError
from fedjax_gel.experiment.progress import Progress


class Callback:
  """A loop callback; override the hooks you need (see ``experiment.loop``)."""

  def on_start(self, loop):
    pass

  def on_compiled(self, loop):
    pass

  def on_round(self, loop, done: int):
    pass

  def on_evaluate(self, loop, done: int, records: dict):
    pass

  def on_interrupt(self, loop, done: int):
    pass

  def on_end(self, loop):
    pass


def groups(loop) -> dict:
  """``workdir -> [run index]``: the runs writing into each work directory (a grid's cells share
  one)."""
  out: dict = {}
  for i, run in enumerate(loop.runs):
    out.setdefault(run.workdir, []).append(i)
  return out


class Evaluate(Callback):
  """Every test metric of the model's task (``test_<name>``; ``best_test_<name>`` of its main
  metric), the test and train loss, and the spread of the main metric over the test clients,
  of every live run: at round 0 (unless resuming), every ``every`` rounds and after the last
  round; with ``every_round = (start, end)``, also every round from the first evaluation at
  which a live run's best of the main metric reaches ``start`` (``Metric.reaches``) until
  every live run's reaches ``end`` (None: to the last round), so that the rounds to a target
  in between are exact (an evaluation of round ``r - 1`` below the target before ``r`` at it):
  what a comparison across targets needs, at the cost of those evaluations alone. The rule
  reads the records, so a resumed run evaluates the same rounds.

  ``train_pool``: the training examples the train loss is measured on (``make_eval_pool``'s
  sample of ``--train_eval_examples``, or the whole pool). Each run's model is evaluated on its
  own, so the numbers are those of its separate run to the bit; ``together``: all runs in one
  vmapped call instead (a grid's many cells; equal to separate runs up to float order).
  The evaluation runs on the pools' device (this process' first) also when the rounds run on a
  mesh: it reads that device's copy of the replicated server model (``devices.local_copy``), so
  it runs once, as on one device, and not on every device of the mesh (on CPU the same cores:
  an LSTM's evaluation took twice as long).
  """

  def __init__(self, every: int, test_pool, train_pool, together: bool = False,
               every_round: tuple[Optional[float], Optional[float]] = (None, None)):
    self.every, self.test_pool, self.train_pool = every, test_pool, train_pool
    self.start, self.end = every_round
    self.together = together
    self.fn = None
    mask = test_pool.mask   # the pools' device (a pool of host arrays: this process' first)
    self.device = (next(iter(mask.devices())) if isinstance(mask, jax.Array)
                   else jax.local_devices()[0])

  def on_compiled(self, loop):
    with loop.phases.time('compile'):   # once per experiment: it depends on the model only
      together = self.together and loop.program.batched
      shape = jax.eval_shape(lambda: loop.program.server_params(loop.state, loop.hparams)
                             if together else loop.run_params(0))
      key = ('evaluate', together, jax.tree.structure(shape), tuple(jax.tree.leaves(shape)))
      if key not in loop.exp.compiled:
        evaluate = evaluation.build_evaluate(loop.exp.model.apply, loop.exp.model.task)
        both = lambda params, test, train: (evaluate(params, test), evaluate(params, train))
        if together:
          both = jax.vmap(both, in_axes=(0, None, None))
        loop.exp.compiled[key] = loop.exp.backend.jit(both).lower(
            shape, self.test_pool, self.train_pool).compile()
      self.fn, self.fn_together = loop.exp.compiled[key], together
    if not loop.start:
      self.evaluate(loop, 0)

  def on_round(self, loop, done):
    if done % self.every == 0 or done == loop.num_rounds or self.every_round(loop):
      self.evaluate(loop, done)

  def every_round(self, loop) -> bool:
    """Whether the live runs' bests so far lie in the window: one reached ``start``, not all
    ``end``."""
    if self.start is None:
      return False
    metric = loop.exp.model.task.metric
    best = [loop.runs[i].records[-1][f'best_test_{metric.name}'] for i in loop.live()
            if loop.runs[i].records]
    return (any(metric.reaches(b, self.start) for b in best) and
            (self.end is None or not all(metric.reaches(b, self.end) for b in best)))

  def results(self, loop) -> list:
    """``[(test, train)]`` of the live runs, on the host."""
    params = devices.local_copy(loop.program.server_params(loop.state, loop.hparams),
                                self.device)
    live = loop.live()
    if self.fn_together:
      both = devices.to_host(self.fn(params, self.test_pool, self.train_pool))
      return [jax.tree.map(lambda a, i=i: a[i], both) for i in live]
    return [devices.to_host(self.fn(runs_lib.run_slice(params, i, loop.program.batched),
                                    self.test_pool, self.train_pool)) for i in live]

  def evaluate(self, loop, done: int):
    with loop.phases.time('train'):   # the rounds dispatched so far finish first
      jax.block_until_ready(loop.state)
    with loop.phases.time('eval'):
      loop.sync()
      records = {}
      task = loop.exp.model.task
      metric = task.metric
      for i, (test, train) in zip(loop.live(), self.results(loop)):
        run = loop.runs[i]
        value = float(test[metric.name])
        best = metric.best([value] + [r[f'best_test_{metric.name}'] for r in run.records])
        record = {'round': done, 'algorithm': run.config.run_name, 'seed': run.config.run.seed,
                  **run.tags, **{f'test_{k}': float(test[k]) for k in task.metrics},
                  f'best_test_{metric.name}': best,
                  'test_loss': float(test['loss']), 'train_loss': float(train['loss']),
                  **client_fields(test, metric),
                  **run.totals, 'client_distance': run.distance, **run.diagnostics,
                  **dp.record_fields(run.config, population(loop), done),
                  'elapsed_s': round(time.perf_counter() - loop.t0, 3)}
        run.records.append(record)
        records[i] = record
    loop.emit('on_evaluate', done, records)


class PrivacyBudget(Callback):
  """Differential privacy's budget (``--dp_target_epsilon``): before the first round, the loop's
  last round becomes the last whose epsilon stays within it (``dp.affordable_rounds``), said in
  a line; the last round is then evaluated and checkpointed as any run's."""

  def __init__(self, progress: Progress):
    self.progress = progress

  def on_compiled(self, loop):
    c = loop.runs[0].config   # a program's runs differ in seed and learning rate only
    allowed = dp.affordable_rounds(c, population(loop), loop.num_rounds)
    if allowed == 0:
      one = dp.record_fields(c, population(loop), 1)['dp_epsilon']
      raise ConfigError(f'--dp_target_epsilon={c.privacy.target_epsilon:g}: one round already '
                        f'spends epsilon {one:.3g} (at --dp_delta={c.privacy.delta:g}); raise '
                        'the budget or --dp_noise_multiplier')
    if allowed < loop.num_rounds:
      spent = dp.record_fields(c, population(loop), allowed)['dp_epsilon']
      self.progress.note(
          f'{c.run_name}: --dp_target_epsilon={c.privacy.target_epsilon:g} allows {allowed} of '
          f'its {loop.num_rounds} rounds (epsilon {spent:.3g} at --dp_delta={c.privacy.delta:g}); '
          f'it stops after round {allowed}')
      loop.num_rounds = self.progress.total = allowed


class DivergenceGuard(Callback):
  """A line for each run whose server model stopped being finite (it stops there: no more
  records, its last good checkpoint kept); the loop ends when every run has diverged."""

  def __init__(self, note):
    self.note = note

  def on_round(self, loop, done):
    for i in loop.newly_diverged:
      run = loop.runs[i]
      c = run.config
      tags = ''.join(f', {k} {v:g}' for k, v in run.tags.items())
      self.note(f'{c.run_name} on {c.data.dataset}, seed {c.run.seed}{tags}: diverged (the '
                f'server model is not finite after round {run.diverged}); stopped, its last '
                'good checkpoint kept')
    loop.newly_diverged.clear()
    if not loop.live():
      loop.stop = True


def group_state(loop, idx: list[int]):
  """The states of the runs ``idx`` of one work directory: one run's unstacked, several stacked."""
  if len(idx) == 1:
    return loop.run_state(idx[0])
  if idx == list(range(len(loop.runs))):
    return loop.state
  return jax.tree.map(lambda a: a[np.asarray(idx)], loop.state)


class Checkpointer(Callback):
  """Every ``every`` rounds (0: never), on Ctrl-C and after the last round, each work
  directory's runs (their states and bookkeeping) in one checkpoint (``experiment.checkpoint``);
  a run alone that diverged keeps its last good one; among others it is saved with them.
  ``resume``: ``on_start`` continues from the last round every work directory has a checkpoint
  of, with ``metrics.jsonl`` cut back to it."""

  META = ('runs',)

  def __init__(self, every: int, resume: bool):
    self.every, self.resume = every, resume
    self.saved = None   # the round this loop saved last (a stop after it saves nothing more)

  def on_start(self, loop):
    dirs, write = groups(loop), loop.runtime.write
    start = resume_round(list(dirs), loop.runtime.writes) if self.resume else 0
    for w in dirs if self.resume else ():
      # a directory's checkpoints past the common round (a kill between the directories' saves)
      # would outlive the records cut back to it, and stop the next resume; they go first
      write(checkpoint.remove_after, w, start)
      if not start:   # none common to the directories: the run starts again, so do its records
        write(checkpoint.cut_metrics, w, 0)
    if not start:
      return
    states = {}
    for w, idx in dirs.items():   # read into the shapes and shardings of the fresh state
      state, meta = checkpoint.load(w, start, group_state(loop, idx))
      # the records of the rounds after the checkpoint are written again as the run resumes
      write(checkpoint.cut_metrics, w, meta['metrics_bytes'])
      records = workdir_lib.read_metrics(w)
      for i, saved in zip(idx, meta['runs']):
        run = loop.runs[i]
        run.records = [r for r in records if all(r.get(k) == v for k, v in run.tags.items())]
        run.totals, run.distance = dict(saved['totals']), saved['distance']
        run.diverged = saved['diverged']
      states[w] = (idx, state)
    loop.state = loop.placed(assemble(loop, states.values()))
    loop.start = loop.done = start

  def save(self, loop, done: int):
    if done == self.saved:
      return
    self.saved = done
    loop.sync()
    for w, idx in groups(loop).items():
      if len(loop.runs) == 1 and loop.runs[0].diverged is not None:
        continue   # a run alone: its last good checkpoint stays the last one
      # a diverged run among others is saved as it stands (marked diverged, never trained on
      # again), so that the group keeps a checkpoint common to all its work directories
      metrics = os.path.join(w, 'metrics.jsonl')
      written = os.path.exists(metrics)
      meta = {'metrics_bytes': os.path.getsize(metrics) if written else 0,
              # what check_resume compares: the records a resumed run keeps are as written
              # (only the writing process's meta is kept)
              'metrics_sha256': files.digest(metrics) if written and loop.runtime.writes else '',
              'runs': [{'totals': loop.runs[i].totals, 'distance': loop.runs[i].distance,
                        'diverged': loop.runs[i].diverged} for i in idx]}
      checkpoint.save(w, done, group_state(loop, idx), meta, loop.runtime)

  def on_round(self, loop, done):
    if self.every and done % self.every == 0 and done < loop.num_rounds:
      self.save(loop, done)

  def on_interrupt(self, loop, done):
    self.save(loop, done)

  def on_end(self, loop):
    # the final states: a later run with more rounds extends them
    self.save(loop, loop.done)


def assemble(loop, parts):
  """The loop's state from the work directories' restored ``(run indices, state)``."""
  parts = list(parts)
  if not loop.program.batched:   # read onto the run's devices
    return parts[0][1]
  order, slices = [], []
  for idx, state in parts:
    order += idx
    slices += ([state] if len(idx) == 1 else
               [jax.tree.map(lambda a, k=k: a[k], state) for k in range(len(idx))])
  by_run = [s for _, s in sorted(zip(order, slices), key=lambda t: t[0])]
  return jax.tree.map(lambda *a: jax.numpy.stack(a), *by_run)


def resume_round(workdirs, set_aside: bool = True) -> int:
  """The last round every one of ``workdirs`` has an intact checkpoint of (0: none); the
  damaged ones set aside where ``set_aside`` (``checkpoint.intact_rounds``)."""
  common = set.intersection(*(set(checkpoint.intact_rounds(w, set_aside)) for w in workdirs))
  return max(common, default=0)


class ProgressReport(Callback):
  """The progress line (``experiment.progress``): a line when compiling starts and one with its
  time (and the round a resumed run starts from), the rate and ETA, a status line at each
  evaluation, and the seconds of each phase these runs spent, at the end (the process' totals
  close the command: ``cli``)."""

  def __init__(self, progress: Progress):
    self.progress = progress
    self.since = {}

  def on_start(self, loop):
    self.since = dict(loop.phases.seconds)
    self.progress.note(f'{self.progress.label}: compiling')

  def on_compiled(self, loop):
    self.progress.compiled(loop.seconds('compile'), loop.start)
    self.progress.begin(loop.start)

  def on_round(self, loop, done):
    self.progress.update(done)

  def on_evaluate(self, loop, done, records):
    metric = loop.exp.model.task.metric
    short = 'acc' if metric.name == 'accuracy' else metric.name
    if len(loop.runs) == 1:
      last = loop.runs[0].records[-1] if loop.runs[0].records else None
      status = (f'test {short} {last[f"test_{metric.name}"]:.4f} (best '
                f'{last[f"best_test_{metric.name}"]:.4f})' if last else 'diverged')
    else:
      live = loop.live()
      best = metric.best(loop.runs[i].records[-1][f'best_test_{metric.name}'] for i in live)
      status = (f'{len(live)}/{len(loop.runs)} runs finite, best test {short} '
                f'{float("nan") if best is None else best:.4f}')
    self.progress.update(done, status, force=True)

  def on_interrupt(self, loop, done):
    self.progress.close()

  def on_end(self, loop):
    self.progress.close()
    self.progress.note(f'{self.progress.label}: {loop.phases.line(self.since)}')


def client_fields(test: dict, metric) -> dict:
  """``client_<metric>_{mean,p10,p90,std}`` of an evaluation of the test pool (its clients'
  values of the main metric, ``evaluation.client_spread``); {} for a pool without clients."""
  if 'client_weight' not in test:
    return {}
  spread = evaluation.client_spread(test['client_sum'], test['client_weight'])
  return {f'client_{metric.name}_{k}': v for k, v in spread.items()}


def run_fields(c) -> dict:
  """What names a run in its summaries (runs and grids alike): algorithm (run name), dataset,
  model, seed, rounds, and ``settings``, every flag of its config (hyper-parameters included)."""
  return {'algorithm': c.run_name, 'dataset': c.data.dataset, 'model': c.model.name,
          'seed': c.run.seed, 'rounds': c.run.num_rounds,
          'settings': {k: list(v) if isinstance(v, tuple) else v for k, v in c.flags().items()}}


def metric_fields(records, target: float, metric) -> dict:
  """What a summary says of a run's main metric (``<name>``: ``accuracy``, ``mse``, ...):
  ``metric`` (name and direction), ``final_<name>``, ``best_<name>``, the final spread over
  the test clients (``final_client_<name>_*``), ``target_<name>`` and ``rounds_to_target``."""
  name = metric.name
  return {
      'metric': metric._asdict(),
      f'final_{name}': records[-1][f'test_{name}'] if records else None,
      f'best_{name}': metric.best(r[f'test_{name}'] for r in records),
      **{f'final_{k}': v for k, v in (records[-1] if records else {}).items()
         if k.startswith(f'client_{name}_')},
      f'target_{name}': target,
      'rounds_to_target': report.rounds_to_target(records, target, metric)}


def population(loop) -> int:
  """The training clients the cohorts are drawn from."""
  return int(loop.exp.train.counts.shape[0])


def run_summary(loop, i: int) -> dict:
  """Run ``i``'s ``summary.json``: the schema of every ``summary.json`` (runs, seeds and grids;
  a grid fills ``grid`` and reports its selected cell)."""
  run, c = loop.runs[i], loop.runs[i].config
  records = run.records
  train_s = loop.seconds('train')
  return {
      **run_fields(c), 'rounds': loop.num_rounds,   # a privacy budget's, when it is fewer
      'client_lr': c.algorithm.client_lr, 'server_lr': c.server.lr, **run.tags,
      **metric_fields(records, c.run.target, loop.exp.model.task.metric),
      # the privacy spent by the rounds run (a diverged run's too: its noise was released)
      **dp.record_fields(c, population(loop), run.diverged or loop.done),
      'status': 'diverged' if run.diverged else 'finished',
      'diverged_round': run.diverged,
      **run.totals,
      'compile_s': round(loop.seconds('compile'), 3), 'train_s': round(train_s, 3),
      'rounds_per_s': (round((loop.done - loop.start) / train_s, 3) if train_s > 0 else None),
      'chunk_size': loop.chunk_size, 'runs_in_program': len(loop.runs),
      'client_state_bytes': (0 if loop.exp.algorithm.store_row is None else
                             round_lib.tree_bytes(loop.run_state(i).clients)),
      'phases_s': loop.phases.rounded(),
      'grid': None,   # a grid's summary.json: its own fields (experiment.grid)
      'outputs_sha256': None,   # written with the summary (workdir.write_summary)
      'settings_sha256': None,   # the same
      'summary_sha256': None,   # the same
  }


class RunSummary(Callback):
  """After the last round, in each work directory of one run: ``model.msgpack`` (the final
  server model; none for a diverged run) and ``summary.json``, written last (it marks the run
  finished); the checkpoints but the final state's go."""

  def __init__(self):
    self.summaries = {}

  def on_end(self, loop):
    with loop.phases.time('report'):
      self.write(loop)

  def write(self, loop):
    write = loop.runtime.write   # process 0's files (several processes)
    for w, idx in groups(loop).items():
      if len(idx) != 1:
        continue
      i = idx[0]
      run = loop.runs[i]
      finished = run.diverged is None
      if finished:
        params = devices.to_host(loop.run_params(i))
        write(files.write_atomic, os.path.join(w, 'model.msgpack'),
              serialization.to_bytes(params))
      summary = run_summary(loop, i)
      write(workdir_lib.write_summary, w, summary)   # after the metrics and the model
      if finished:
        write(workdir_lib.remove_checkpoints, w, keep=loop.num_rounds)
      self.summaries[i] = summary
