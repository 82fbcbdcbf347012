"""The library's entry point: ``run(config, workdir)`` trains what a config (and a sweep over
seeds, algorithms and learning rates) asks for and writes every output; ``launch/run.py`` is
its command line, and notebooks and tests call it in-process.

Layout of ``workdir``: one run per ``WORKDIR[/seed<S>][/<run name>][/lr<lr>]`` (each level only
where the runs differ in it; a single run writes into ``WORKDIR`` itself), ``report.md`` and
``plots/`` at the top. A work directory already holding runs of this configuration keeps the
finished ones, resumes the others from their last checkpoint and extends finished ones whose
``num_rounds`` was raised; another configuration's runs are refused (``overwrite`` replaces
them). Bad input raises ``ConfigError`` (or ``DataError`` for data files) before anything is
written.

``experiment.sweep`` expands a config and a sweep into one config per run. Runs that differ
only in the seed, the learning rates and other ``config.batched_flags`` train as one program
(``core.runs``) where they fit one device's memory (``vmap=False``: one by one); the numbers are
those of their separate runs.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import time
from typing import Sequence

import jax

from fedjax_gel.core import checks, keys
from fedjax_gel.experiment import callbacks as callbacks_lib, factories, grid as grid_lib
from fedjax_gel.experiment import files, loop as loop_lib, outputs, planning, sinks
from fedjax_gel.experiment import runtime as runtime_lib
from fedjax_gel.experiment import config as config_lib, config_json, workdir as workdir_lib
from fedjax_gel.experiment.config import Config
from fedjax_gel.experiment.progress import Progress
from fedjax_gel.experiment.sweep import Sweep, checked_configs, expand, tuned_flag


def run_dir(workdir: str, c: Config, levels: tuple) -> str:
  """``WORKDIR[/seed<S>][/<run name>][/lr<lr> or /<flag><value>]``, each level only where runs
  differ in it (``levels``: seeds, names, client lrs, and the ``hparam_grid`` flag or None)."""
  seeds, names, lrs, flag = levels
  parts = [workdir] + ([f'seed{c.run.seed}'] if seeds else []) + (
      [c.run_name] if names else []) + ([f'lr{c.algorithm.client_lr:g}'] if lrs else []) + (
      [f'{flag}{c.flags()[flag]:g}'] if flag in config_lib.tunable_flags(c) else [])
  return os.path.join(*parts)


# Run settings that earlier versions did not record, left out of a folder's name at their defaults.
NEWER_RUN_SETTINGS = ('fuse_small_dots', 'client_distance', 'eval_every_round_from',
                      'eval_every_round_until')


def settings_of_earlier_versions(c) -> dict:
  """``c.to_json()`` as earlier versions wrote it, so that the command of a run they wrote finds
  its folder: the data section flat, as before datasets had settings of their own
  (``config_json.flat_data``), and without the newer run settings at their defaults nor the privacy
  section without differential privacy."""
  record = c.to_json()
  run = {k: v for k, v in record['run'].items() if k not in NEWER_RUN_SETTINGS or v}
  if not c.privacy.on:   # a section newer than them, read only with differential privacy
    record.pop('privacy')
  return {**record, 'data': config_json.flat_data(c.data), 'run': run}


def default_workdir(configs, sweep: Sweep = Sweep()) -> str:
  """``runs/<algorithms>_<dataset>_<digest>``: the digest (12 hex digits of SHA-256) of every
  run's settings and the grid, so the same command finds its own runs again (and resumes them,
  or says they are finished) and another command gets a folder of its own."""
  names = '_'.join(dict.fromkeys(x.algorithm.name for x in configs))
  runs = [settings_of_earlier_versions(x) for x in configs]
  settings = {'runs': runs, 'server_lrs': list(sweep.server_lrs)}
  text = json.dumps(settings, sort_keys=True, default=str)
  digest = hashlib.sha256(text.encode()).hexdigest()[:12]
  return os.path.join('runs', f'{names}_{configs[0].data.dataset}_{digest}')


@dataclasses.dataclass
class Plan:
  """What ``run`` will do, decided and checked before anything is written."""
  configs: list
  workdirs: list
  status: list          # workdir_lib.run_status per run
  levels: tuple         # run_dir's
  grid: tuple | None    # (client lrs, server lrs)
  base: factories.Experiment
  notes: list
  digests: dict         # workdir_lib.input_digests of the runs' inputs (one data, one budgets)
  plots: bool = True    # write plots/ (``run``'s ``plots``)


def plan(c: Config, workdir: str, sweep: Sweep = Sweep(), overwrite: bool = False,
         phases: loop_lib.Phases | None = None, plots: bool = True, writes: bool = True) -> Plan:
  """Validates everything and loads the data; raises ``ConfigError``/``DataError`` with one
  line, having written nothing. ``writes``: whether this process writes the runs (process 0),
  whose folders must then be writable."""
  configs = checked_configs(c, sweep)
  grid = None
  if sweep.server_lrs:
    grid = (list(sweep.client_lrs or [c.algorithm.client_lr]), list(sweep.server_lrs))
  names = list(dict.fromkeys(x.run_name for x in configs))
  levels = (len({x.run.seed for x in configs}) > 1, len(names) > 1,
            len({x.algorithm.client_lr for x in configs}) > 1, tuned_flag(sweep))
  workdirs = [run_dir(workdir, x, levels) for x in configs]
  for w in dict.fromkeys([workdir] + workdirs):
    files.check_outputs(w, workdir)
  workdir_lib.check_top(workdir, workdirs, overwrite)
  extra = None if grid is None else grid_lib.grid_fields(*grid)
  status = [workdir_lib.run_status(w, x, overwrite, extra) for x, w in zip(configs, workdirs)]
  for w, st in zip(workdirs, status):
    if st != 'done' and writes:
      files.check_writable(w)
  notes = []
  phases = phases or loop_lib.Phases()
  with phases.time('data'):
    base = factories.prepare(configs[0], grid is not None)   # data, model, chunks: shared
  notes += base.notes
  digests = workdir_lib.input_digests(base)
  for x, w, st in zip(configs, workdirs, status):   # algorithms, memory, checkpoints first
    exp = factories.with_config(base, x)
    notes += exp.notes
    if grid is not None:
      grid_lib.check_grid(x, exp)
      planning.check_runs_fit(exp, len(grid[0]) * len(grid[1]), '--server_lr_grid')
    if st != 'new':   # a run on other data is not resumed, extended or taken as done
      workdir_lib.check_inputs(w, x, digests)
    if st in ('resume', 'extend'):
      notes += workdir_lib.placement_notes(w, x)
      notes += workdir_lib.check_resume(w, checkpoint_target(exp, 1 if grid is None else
                                                             len(grid[0]) * len(grid[1])))
  return Plan(configs, workdirs, status, levels, grid, base, list(dict.fromkeys(notes)),
              digests, plots)


def checkpoint_target(exp: factories.Experiment, num_runs: int):
  """The shapes of a work directory's checkpointed state: one run's, or ``num_runs`` stacked."""
  one = jax.eval_shape(
      lambda: exp.algorithm.server_init(exp.model.init(keys.init_key(keys.root_key(0)))))
  if num_runs == 1:
    return one
  return jax.tree.map(lambda s: jax.ShapeDtypeStruct((num_runs,) + s.shape, s.dtype), one)


def check_run_arguments(c, sweep, callbacks, out, err):
  """``run``'s arguments are of the kinds it takes, else a TypeError of one line before anything
  is written (they failed as AttributeErrors, some after the runs had trained)."""
  if not isinstance(c, Config):
    raise TypeError(f'experiment.run: c must be a Config (experiment.make(...) builds one), got '
                    f'{type(c).__name__}')
  if not isinstance(sweep, Sweep):
    raise TypeError(f'experiment.run: sweep must be an experiment.Sweep, got '
                    f'{type(sweep).__name__}')
  if not checks.is_listed(callbacks):
    raise TypeError(f'experiment.run: callbacks must be a list of callbacks, got '
                    f'{type(callbacks).__name__}')
  hooks = [h for h in vars(callbacks_lib.Callback) if h.startswith('on_')]
  for cb in callbacks:
    if not all(callable(getattr(cb, h, None)) for h in hooks):
      raise TypeError(f'experiment.run: a callback must have the hooks of '
                      f'experiment.callbacks.Callback ({", ".join(hooks)}; subclass it), got '
                      f'{type(cb).__name__}')
  for name, stream in (('out', out), ('err', err)):
    if stream is not None and not callable(getattr(stream, 'write', None)):
      raise TypeError(f'experiment.run: {name} must be a text stream (with write), got '
                      f'{type(stream).__name__}')


def run(c: Config, workdir: str | None = None, sweep: Sweep = Sweep(), *,
        overwrite: bool = False, vmap: bool = True, plots: bool = True,
        callbacks: Sequence = (), out=None, err=None,
        phases: loop_lib.Phases | None = None,
        runtime: runtime_lib.Runtime | None = None) -> list[dict]:
  """Trains every run of a ``Config`` and a ``Sweep`` into a work directory, with its report.

  What ``launch/run.py`` does, in-process. A work directory already holding runs of this
  configuration keeps the finished ones, resumes the others from their last checkpoint and
  extends finished ones whose ``num_rounds`` was raised (see the module docstring for its
  layout). Runs that differ only in the seed, the learning rates and other batched flags train
  as one program where they fit.

  Args:
    c: the ``Config`` (``make``).
    workdir: where the runs, ``report.md`` and ``plots/`` go; None: ``default_workdir`` (the
      same settings, the same folder).
    sweep: the seeds, algorithms, learning rates, ... to run over (``expand``).
    overwrite: replace another configuration's runs in ``workdir`` (else refused).
    vmap: train runs that can share one program together (``--vmap_seeds``); False: one by
      one. The numbers are those of their separate runs either way.
    plots: write ``plots/`` (``--plots``); False: ``report.md`` and the metrics alone.
    callbacks: more loop callbacks (``experiment.callbacks.Callback``) for every program, after
      the library's own.
    out: where the results' lines go (default stdout).
    err: where the progress lines go (default stderr).
    phases: the clock of a caller that timed its imports (``Phases(imports=...)``).
    runtime: the command's ``Runtime`` (its stop token, writer and agreements between
      processes; ``launch/run.py``'s); None: one of its own.

  Returns:
    The runs' summaries (``summary.json``; a grid's ``grid.json``), in ``expand``'s order.
    Every process returns them; only process 0's hold the checksums of the files it wrote.

  Raises:
    TypeError: a ``Config`` or ``Sweep`` that is not one, callbacks that are not a list of
      callbacks, or ``out``/``err`` that are not streams, before anything is written.
    ConfigError: bad input (``DataError`` for data files), before anything is written; a work
      directory holding another configuration's runs without ``overwrite``.

  Examples:
    >>> import io, tempfile
    >>> from fedjax_gel import experiment
    >>> config = experiment.make(algorithm='gel', num_rounds=10, eval_every=5)
    >>> summaries = experiment.run(config, tempfile.mkdtemp(), experiment.Sweep(seeds=[0, 1]),
    ...                            out=io.StringIO(), err=io.StringIO())
    >>> [(s['seed'], s['status'], s['rounds']) for s in summaries]
    [(0, 'finished', 10), (1, 'finished', 10)]
  """
  check_run_arguments(c, sweep, callbacks, out, err)
  runtime = runtime or runtime_lib.Runtime()
  out = out or sys.stdout
  if not runtime.writes:   # another process than 0: the same work, nothing written or printed
    out = err = open(os.devnull, 'w')  # pylint: disable=consider-using-with
  phases = phases or loop_lib.Phases()
  workdir = workdir or default_workdir(expand(c, sweep), sweep)
  locked = []
  try:
    # One writer: the work directory is locked before anything in it is read, so that the plan
    # cannot go stale; a command refused (or whose input is bad) leaves nothing it created.
    created, made = [], []
    try:
      with runtime.telling_others():   # a refusal of one (process 0's lock too) stops all
        if runtime.writes:
          created = workdir_lib.make_workdir(workdir)
          files.lock(workdir)
          locked.append(workdir)
          files.name_holder(workdir)   # named at once: a command refused meanwhile names it
        p = plan(c, workdir, sweep, overwrite, phases, plots, runtime.writes)
      # every process planned the same runs, and read the work directory before it changes
      runtime.agree(plan_record(p, workdir, vmap, overwrite))
      with runtime.telling_others():
        if runtime.writes:
          for w in sorted(set(p.workdirs) - {workdir}):   # a command on a run of this one is refused
            made += workdir_lib.make_workdir(w)
            files.lock(w)
            locked.append(w)
      agree_on_workdir(workdir, runtime)
    except BaseException:   # refused (e.g. too many open files): nothing it created is left
      for w in locked:
        files.unlock(w)
      locked.clear()
      workdir_lib.remove_if_empty(sorted(made, key=lambda f: f.count(os.sep)))
      workdir_lib.remove_if_empty(created)
      raise
    return run_plan(p, workdir, vmap, callbacks, out, err, phases, runtime)
  finally:
    for w in locked:
      files.unlock(w)


def plan_record(p: 'Plan', workdir: str, vmap: bool, overwrite: bool = False) -> dict:
  """What the processes of a run must agree on (``Runtime.agree``): the runs' flags but the
  paths of their inputs (which may differ between hosts; a flag's value is one value where
  every run has it, else the runs'), the inputs' digests, and what the work directory holds."""
  paths = {name for _, name in config_lib.PATH_FIELDS}
  runs = [{f'--{k}': v for k, v in x.flags().items() if k not in paths} for x in p.configs]
  grid = {} if p.grid is None else grid_lib.grid_fields(*p.grid)
  record = {'--vmap_seeds': vmap, '--overwrite': overwrite,
            **{f'--{k}': v for k, v in grid.items()},
            'devices of the process (on CPU: XLA_FLAGS=--xla_force_host_platform_device_count'
            '=N)': jax.local_device_count()}
  for k in dict.fromkeys(k for r in runs for k in r):
    values = [r.get(k) for r in runs]
    record[k] = values[0] if all(v == values[0] for v in values) else values
  for field, digest in p.digests.items():
    record[f"the {workdir_lib.INPUT_FIELDS[field]}'s SHA-256"] = digest[:12]
  record['what the work directory holds'] = [
      [os.path.relpath(w, workdir), st] for w, st in zip(p.workdirs, p.status)]
  return record


# Seconds a process waits to see the lock file process 0 wrote: a shared file system may show
# another host's new file late (NFS caches a folder's entries and a file's absence a few seconds).
LOCK_VISIBLE_S = 10.


def agree_on_workdir(workdir: str, runtime: runtime_lib.Runtime) -> None:
  """Several processes: each sees, in its own ``workdir``, the lock file process 0 wrote there
  (``files.name_holder``), so that they share one work directory (on several hosts a shared
  file system: fresh folders of the same name on each host agree on everything else, and the
  first checkpoint failed); else a ConfigError in every process. A process that does not see
  one yet looks again for up to ``LOCK_VISIBLE_S``."""
  if runtime.count > 1:
    runtime.agree({})   # process 0 has written it, or stopped and says why
    h, deadline = files.holder(workdir), time.monotonic() + LOCK_VISIBLE_S
    while h is None and time.monotonic() < deadline:
      time.sleep(0.25)
      h = files.holder(workdir)
    runtime.agree({'whose lock file the work directory holds (one folder for every process, '
                   'a shared file system)': h and f'{h["host"]}:{h["pid"]}'})


def run_plan(p: 'Plan', workdir: str, vmap: bool, callbacks: Sequence, out, err,
             phases: loop_lib.Phases, runtime: runtime_lib.Runtime) -> list[dict]:
  """``run``'s writes and training, once ``p`` is checked and the work directory locked."""
  write = runtime.write   # process 0's files (several processes)
  if runtime.writes:   # what a kill inside a write left
    for w in dict.fromkeys([workdir] + p.workdirs):   # a grid's heat map is in its run's plots/
      files.remove_temporaries(w)
      files.remove_temporaries(os.path.join(w, 'plots'))
  extra = None if p.grid is None else grid_lib.grid_fields(*p.grid)
  for i, (x, w) in enumerate(zip(p.configs, p.workdirs)):
    record = workdir_lib.config_record(x, p.digests, extra)
    if p.status[i] == 'extend':   # --num_rounds raised: go on from the final state
      write(workdir_lib.extend, w, record)
      p.status[i] = 'resume'
    elif p.status[i] == 'new':
      write(workdir_lib.start, w, record)
    elif p.status[i] == 'resume':   # an earlier version's record gains the data's digest
      write(workdir_lib.record_inputs, w, record)
  if p.grid is None:
    for note in p.notes:   # a grid sizes its own chunks
      print(f'note: {note}', file=out)
  results = train_all(p, vmap, list(callbacks), err, phases, runtime)
  if runtime.writes:   # only process 0 writes (several processes)
    with phases.time('report'):
      write = outputs.write_report if p.grid is None else outputs.write_grid_report
      write(p, workdir, results, out)
  return results


def program_groups(p: Plan, vmap: bool) -> list[list[int]]:
  """The runs still to train, grouped into programs: a grid per config; else the runs of one
  ``batch_key`` and status (new or resuming) together where ``vmap`` and they fit one device
  (``planning``), one by one otherwise."""
  todo = [i for i, st in enumerate(p.status) if st != 'done']
  if p.grid is not None:
    return [[i] for i in todo]
  by_key: dict = {}
  for i in todo:   # a run that resumes never shares a program with one that starts afresh
    by_key.setdefault((config_lib.batch_key(p.configs[i]), p.status[i]), []).append(i)
  out = []
  for group in by_key.values():
    exp = factories.with_config(p.base, p.configs[group[0]])
    size = len(group) if vmap and planning.batchable(exp) else 1
    while size > 1 and planning.runs_chunk_size(exp, size) < 1:
      size //= 2
    out += [group[k:k + size] for k in range(0, len(group), size)]
  return out


def train_all(p: Plan, vmap: bool, extra: list, err, phases, runtime) -> list[dict]:
  """Trains the runs ``run_status`` did not find finished; a finished run's summary is read."""
  results = {}
  for i, st in enumerate(p.status):
    if st == 'done':   # finished earlier: kept (checkpoints a kill left behind removed)
      name = 'summary.json' if p.grid is None else 'grid.json'
      results[i] = files.read_json_as(os.path.join(p.workdirs[i], name), dict,
                                      'is damaged; pass --overwrite to train it again')
      runtime.write(workdir_lib.remove_checkpoints, p.workdirs[i],   # the rounds it ran (a
                    keep=results[i].get('rounds', p.configs[i].run.num_rounds))   # DP budget's)
      print(f'{p.configs[i].run_name}, seed {p.configs[i].run.seed}: finished earlier in '
            f'{p.workdirs[i]}; its outputs are kept (--overwrite trains it again)',
            file=err or sys.stderr)
  for group in program_groups(p, vmap):
    results.update(train_group(p, group, extra, err, phases, runtime))
  return [results[i] for i in range(len(p.configs))]


def train_group(p: Plan, group: list[int], extra: list, err, phases, runtime) -> dict:
  """One program: the runs ``group`` (a grid's cells for one config of a grid plan)."""
  first = p.configs[group[0]]
  exp = factories.with_config(p.base, first)
  resume = any(p.status[i] == 'resume' for i in group)
  if p.grid is None:
    configs = [p.configs[i] for i in group]
    flag = p.levels[3]
    tags = [{flag: x.flags()[flag]} if flag in config_lib.tunable_flags(x) else {} for x in configs]
    summaries = train(exp, [p.workdirs[i] for i in group], configs, resume=resume,
                      callbacks=extra, err=err, phases=phases, tags=tags, runtime=runtime)
    return dict(zip(group, summaries))
  w = p.workdirs[group[0]]
  tags = grid_lib.cell_tags(*p.grid)
  runs = [loop_lib.Run(first.replace(client_lr=t['client_lr'], server_lr=t['server_lr']), w, t)
          for t in tags]
  grids = grid_lib.GridSummary({w: p.grid}, p.plots)
  train_runs(exp, runs, f'{first.run_name} grid of {len(runs)} cells, seed {first.run.seed}',
             resume, grids, extra, err, phases, runtime)
  return {group[0]: grids.results[w]}


def train(exp: factories.Experiment, workdirs: Sequence[str] | str,
          configs: Sequence[Config] | None = None, *, resume: bool = False,
          callbacks: Sequence = (), err=None, phases: loop_lib.Phases | None = None,
          tags: Sequence[dict] | None = None,
          runtime: runtime_lib.Runtime | None = None) -> list[dict]:
  """Trains ``configs`` (default ``[exp.config]``; they may differ only in the seed and the
  ``config.batched_flags``) on ``exp``'s data and model as one program, run ``i`` into
  ``workdirs[i]``; returns their summaries. ``resume``: continue from the work directories'
  last common checkpoint (else they are started afresh). What ``run`` does for each group of
  runs, for a caller that prepared the experiment itself (``factories.prepare``). ``tags``:
  each run's fields in its records and summary (``loop.Run.tags``). ``runtime``: as ``run``'s."""
  runtime = runtime or runtime_lib.Runtime()
  configs = list(configs or [exp.config])
  workdirs = [workdirs] if isinstance(workdirs, str) else list(workdirs)
  if not resume and runtime.writes:
    digests = workdir_lib.input_digests(exp)
    for x, w in zip(configs, workdirs):
      workdir_lib.make_workdir(w)
      workdir_lib.start(w, workdir_lib.config_record(x, digests))
  first = configs[0]
  seeds = list(dict.fromkeys(x.run.seed for x in configs))
  label = f'{first.run_name}, seed{"s" if len(seeds) > 1 else ""} {", ".join(map(str, seeds))}'
  lrs = list(dict.fromkeys(x.algorithm.client_lr for x in configs))
  if len(lrs) > 1:
    label += f', client lr {", ".join(f"{lr:g}" for lr in lrs)}'
  tags = list(tags or [{} for _ in configs])
  for key in dict.fromkeys(k for t in tags for k in t):
    label += f', {key} {", ".join(f"{v:g}" for v in dict.fromkeys(t[key] for t in tags))}'
  summary = callbacks_lib.RunSummary()
  runs = [loop_lib.Run(x, w, t) for x, w, t in zip(configs, workdirs, tags)]
  train_runs(exp, runs, label, resume, summary, list(callbacks), err, phases, runtime)
  return [summary.summaries[i] for i in range(len(configs))]


def train_runs(exp, runs: list, label: str, resume: bool, summary, extra: list, err, phases,
               runtime: runtime_lib.Runtime) -> loop_lib.Loop:
  """The loop of ``runs``: the library's callbacks with ``summary`` (``RunSummary`` or
  ``GridSummary``), then ``extra``."""
  first = runs[0].config
  same_cohorts = len({r.config.run.seed for r in runs}) == 1
  chunk = planning.runs_chunk_size(exp, len(runs), same_cohorts)
  program, hparams = factories.make_runs(exp, [r.config for r in runs], chunk)
  progress = Progress(first.run.num_rounds, stream=err, label=label)
  loop = loop_lib.Loop(exp, runs, program, hparams, chunk, phases, runtime)
  sinks_used = [sinks.JsonlWriter(), sinks.CsvWriter()] if runtime.writes else []
  if first.run.tensorboard and runtime.writes:
    sinks_used.append(sinks.TensorBoardWriter())
  return loop_lib.train(loop, [
      callbacks_lib.PrivacyBudget(progress),   # the rounds first: the others read them
      # a round's records are written before its checkpoint, which counts them
      callbacks_lib.Evaluate(first.run.eval_every, exp.test_pool, exp.train_pool,
                             together=same_cohorts and len(runs) > 1,
                             every_round=(first.run.eval_every_round_from,
                                          first.run.eval_every_round_until)),
      callbacks_lib.Checkpointer(first.run.checkpoint_every, resume),
      *sinks_used,
      callbacks_lib.DivergenceGuard(progress.note),
      summary,   # after the final checkpoint, before the progress' last line
      callbacks_lib.ProgressReport(progress),
      *extra])
