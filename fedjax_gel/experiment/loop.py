"""The one round loop: R runs trained as one program, with everything around the rounds done by
callbacks (in the manner of CLU's periodic actions and pfl-research's training callbacks).

A single run, a group of seeds, a learning-rate grid and the benchmarks all go through
``train``: the runs are a batch of ``core.runs`` (a batch of one for a single run), and the
callbacks (``experiment.callbacks``) evaluate, write metrics, checkpoint, guard against
divergence, report progress and write summaries. The loop itself only steps the rounds, keeps
each run's totals and tells the callbacks what happened:

* ``on_start(loop)``: before the first round (a resumed run's state is restored here);
* ``on_round(loop, done)``: after each round, ``done`` rounds trained;
* ``on_evaluate(loop, done, records)``: an evaluation's records ``{run index: record}``;
* ``on_interrupt(loop, done)``: Ctrl-C during round ``done``; the loop then raises
  ``Interrupted`` (after ``on_end`` is *not* called: the runs are unfinished); during the last
  round or ``on_end``, the runs finish, and the next ``train`` of the command raises
  KeyboardInterrupt before it starts (the command's ``runtime.StopToken``);
* ``on_end(loop)``: after the last round, or when every run has diverged.

Round metrics stay on the device until a callback needs them (``Loop.sync``), so the loop does
not wait on the device between rounds, but it never lets more than two rounds run ahead
(``Loop.step``, ``in_flight``):

* **Several devices of one process** (the planner's default on a many-core CPU): at most
  ``IN_FLIGHT_ROUNDS`` rounds are dispatched and unfinished. XLA's CPU runtime admits at most
  32 programs per device in flight (its ``max_inflight_computations_per_device``); the launch
  of a 33rd blocks in one of its thread-pool threads until an older one finishes. A round on a
  mesh is one program per device whose shares meet in all-reduces (the in-process
  rendezvous), and with the limit reached XLA starts one device's share of a queued round while
  the other device's launch is still blocked on the limit: the started share waits in the
  all-reduce for a partner that never comes, and XLA aborts the process (a warning after 20 s,
  the abort 40 s later: "Expected 2 threads to join the rendezvous, but only 1 of them arrived
  on time", status 134). A loop that
  dispatched more than about 16 rounds (two programs each: the cohort's draw and the round)
  without a host sync hit it: 1,000 clients on 2 CPU devices with ``--eval_every=105``.
  In a plain JAX loop of a ``shard_map`` program with one ``psum``, 32 dispatched rounds
  between waits ran and 48 aborted, every time. Waiting for round ``r - IN_FLIGHT_ROUNDS``
  once round ``r`` is dispatched keeps a handful of programs queued, far below the limit, and
  still the next round queued behind the one running, so the devices never wait for the host.
* **Several processes:** each round is waited for (``in_flight`` 0). XLA's CPU client runs a
  process's programs as soon as their inputs are ready, so a round and the program after it
  (the next cohort's draw, an evaluation, a barrier) could run at once, their collectives in
  one order in one process and in the other in another; gloo then pairs the wrong all-reduces
  and every process hangs (1 run in 4 of 400 rounds, two processes).
* **One device:** no collectives, but the same bound, so that the rounds the loop reports
  (``on_round``) are rounds the device finished, give or take two: the watchdog
  (``experiment.watchdog``) times them, and XLA's own limit let the host run 32 programs ahead.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_gel.core import devices, keys, runs as runs_lib, store as store_lib
from fedjax_gel.experiment import runtime as runtime_lib
from fedjax_gel.experiment.config import Config

# (total, RoundMetrics field) summed over a run's rounds.
TOTALS = (('grad_computations', 'grad_computations'), ('examples', 'examples'),
          ('bytes_up', 'uploaded_bytes'), ('bytes_down', 'downloaded_bytes'),
          ('client_rounds', 'num_clients'))
PHASES = ('imports', 'data', 'compile', 'train', 'eval', 'report')
# Rounds a loop over several devices of one process may have dispatched and unfinished (the
# module's doc): far below XLA's CPU limit of 32 programs per device in flight, and enough that
# the next round is always queued behind the one running.
IN_FLIGHT_ROUNDS = 2


@dataclasses.dataclass
class Run:
  """One run's bookkeeping, as the callbacks see it.

  ``tags``: the fields its metrics records carry besides ``round, algorithm, seed`` (a grid
  cell's learning rates; the runs sharing a work directory differ in them).
  """
  config: Config
  workdir: str
  tags: dict = dataclasses.field(default_factory=dict)
  records: list = dataclasses.field(default_factory=list)
  totals: dict = dataclasses.field(default_factory=lambda: {t: 0 for t, _ in TOTALS})
  distance: float = 0.   # the last round's mean pairwise cosine distance of client models
  diagnostics: dict = dataclasses.field(default_factory=dict)   # the algorithm's, last round
  diverged: int | None = None   # the first round whose server model was not finite


class Phases:
  """Seconds spent per phase (``PHASES``); ``time(name)`` adds a block's wall time, and
  ``active`` is ``(name, time.monotonic() at its start)`` of the block under way (None between
  blocks: the watchdog's view of what the loop waits on)."""

  def __init__(self, **seconds):
    self.seconds = {p: 0. for p in PHASES}
    self.seconds.update(seconds)
    self.active = None

  @contextlib.contextmanager
  def time(self, name: str):
    t, outer = time.perf_counter(), self.active
    self.active = (name, time.monotonic())
    try:
      yield
    finally:
      self.seconds[name] += time.perf_counter() - t
      self.active = outer

  def rounded(self) -> dict:
    return {k: round(v, 3) for k, v in self.seconds.items()}

  def line(self, since: dict | None = None) -> str:
    """``phase seconds, ...``: all of them, or (``since``: an earlier copy of ``seconds``)
    those spent since then, e.g. by one run of the process."""
    if since is None:
      return ', '.join(f'{k} {v:.1f} s' for k, v in self.seconds.items())
    spent = {k: v - since.get(k, 0.) for k, v in self.seconds.items()}
    return ', '.join(f'{k} {v:.1f} s' for k, v in spent.items() if v >= 0.05) or 'no time'


class Loop:
  """R runs of one experiment trained together: their state, the program, their bookkeeping.

  ``state`` holds every run's server state (a leading run axis when ``program.batched``);
  ``hparams`` the hyper-parameters that differ between them (``{}`` for a group of seeds).
  """

  def __init__(self, exp, runs: Sequence[Run], program: runs_lib.RunsProgram, hparams: dict,
               chunk_size: int, phases: Phases | None, runtime: runtime_lib.Runtime):
    self.exp, self.runs, self.program = exp, list(runs), program
    self.hparams = hparams
    self.chunk_size = chunk_size
    self.phases = phases or Phases()   # the process's (shared by the loops of one command)
    self.runtime = runtime   # the command's: its stop token, writer and agreements
    self.phases_before = dict(self.phases.seconds)
    self.num_rounds = self.runs[0].config.run.num_rounds
    seeds = [r.config.run.seed for r in self.runs]
    self.shared_key = len(set(seeds)) == 1   # one seed: one key, one cohort for all the runs
    self.roots = devices.replicate(   # on the run's devices (several processes': a global array)
        keys.root_key(seeds[0]) if self.shared_key else
        jnp.stack([keys.root_key(s) for s in seeds]), exp.mesh)
    self.state = self.placed(program.init(self.roots, hparams))
    self.start = 0          # the round the rounds start from (a resumed run's checkpoint)
    self.done = 0           # rounds trained so far
    self.stop = False       # set by a callback to end the loop after the round under way
    self.round_fn = None
    self.pending = []       # (done, device metrics) of the rounds not yet synced
    self.cohort = None      # the last round's cohort and metrics (on the device)
    self.metrics = None
    self.newly_diverged = []
    self.callbacks = []
    self.t0 = time.perf_counter()
    # rounds ``step`` may leave unfinished (the module's doc): none with several processes
    self.in_flight = 0 if runtime.count > 1 else IN_FLIGHT_ROUNDS

  def placed(self, state):
    """``state`` as the round keeps it on the experiment's mesh (``core.store.place_state``):
    the per-client store split over the devices with the clients."""
    return store_lib.place_state(state, self.exp.algorithm, self.exp.mesh)

  # what callbacks use
  def seconds(self, phase: str) -> float:
    """Seconds this loop spent in ``phase`` (``phases`` holds the process's totals)."""
    return self.phases.seconds[phase] - self.phases_before[phase]

  def run_state(self, i: int):
    return runs_lib.run_slice(self.state, i, self.program.batched)

  def run_params(self, i: int):
    """Run ``i``'s server model (on the device)."""
    return runs_lib.run_slice(self.program.server_params(self.state, self.hparams), i,
                              self.program.batched)

  def live(self) -> list[int]:
    """The runs that have not diverged."""
    return [i for i, r in enumerate(self.runs) if r.diverged is None]

  def sync(self):
    """Adds the rounds since the last sync to the runs' totals (a host sync), and marks a run
    diverged at the first round whose server model is not finite (``newly_diverged``)."""
    for done, m in self.pending:
      m = devices.to_host(m)
      for i in self.live():
        mi = runs_lib.run_slice(m, i, self.program.batched)
        if not bool(mi.finite):
          self.runs[i].diverged = done
          self.newly_diverged.append(i)
          continue
        for total, field in TOTALS:
          self.runs[i].totals[total] += int(getattr(mi, field))
    if self.pending:
      last = devices.to_host(self.pending[-1][1])
      for i in self.live():
        mi = runs_lib.run_slice((last.client_distance, last.diagnostics), i,
                                self.program.batched)
        self.runs[i].distance = float(mi[0])
        self.runs[i].diagnostics = {k: float(v) for k, v in mi[1].items()}
    self.pending.clear()

  def emit(self, event: str, *args):
    for callback in self.callbacks:
      getattr(callback, event)(self, *args)

  # the loop
  def compile(self):
    """Compiles the sampler and the round for the runs' state (timed as ``compile``); a
    sampler that does not read the model is compiled once per experiment and batch size."""
    with self.phases.time('compile'):
      r = np.int32(self.start)
      self.reads_model = self.exp.config.cohort.client_selection == 'power_of_d'
      if self.reads_model:
        self.sample_fn = self.program.sample
      else:
        key = ('sample', not self.shared_key and len(self.runs))
        if key not in self.exp.compiled:
          self.exp.compiled[key] = self.program.sample.lower(self.roots, r, None).compile()
        self.sample_fn = self.exp.compiled[key]
      self.cohort0 = self.sample(self.start)
      lowered = self.program.round.lower(
          self.state, self.hparams, self.cohort0, self.exp.train, self.roots, r)
      for run in self.runs:   # the algorithm's diagnostics: NaN (null) until a round ran
        run.diagnostics = dict.fromkeys(lowered.out_info[1].diagnostics, float('nan'))
      self.round_fn = lowered.compile()

  def sample(self, r: int):
    reads = ((self.program.server_params(self.state, self.hparams), self.exp.train)
             if self.reads_model else None)
    return self.sample_fn(self.roots, np.int32(r), reads)

  def step(self, r: int):
    cohort = self.cohort0 if r == self.start else self.sample(r)
    self.state, metrics = self.round_fn(self.state, self.hparams, cohort, self.exp.train,
                                        self.roots, np.int32(r))
    self.pending.append((r + 1, metrics))
    if len(self.pending) > self.in_flight:   # at most ``in_flight`` rounds unfinished (module
      # doc): round r - in_flight finished, so did every round before it (each reads the last's
      # state), and those ``sync`` took off ``pending`` had finished
      jax.block_until_ready(self.pending[-1 - self.in_flight][1])
    self.done, self.cohort, self.metrics = r + 1, cohort, metrics


class Interrupted(KeyboardInterrupt):
  """Ctrl-C stopped the loop after a whole round, whose checkpoint was written (the same run
  resumes from it)."""

  def __init__(self, round_idx: int):
    super().__init__(f'interrupted after round {round_idx}')
    self.round = round_idx


def train(loop: Loop, callbacks: Sequence) -> Loop:
  """Trains ``loop``'s runs from ``loop.start`` to ``num_rounds``, calling the callbacks' hooks
  (see the module's docstring); returns the loop for the callers' summaries. Ctrl-C ends it
  after the round under way with ``on_interrupt`` and raises ``Interrupted``
  (``runtime.Runtime.deferring``)."""
  loop.callbacks = list(callbacks)
  runtime = loop.runtime
  try:
    if runtime.stop:   # a stop asked for before (in an earlier run's last round, or lost)
      raise KeyboardInterrupt
    loop.emit('on_start')
    if loop.round_fn is None:
      loop.compile()
    loop.emit('on_compiled')
    agreeing = runtime.agrees_on_stops()   # several processes stop after one round
    with runtime.deferring():
      for r in range(loop.start, loop.num_rounds):
        with loop.phases.time('train'):
          loop.step(r)
        loop.emit('on_round', r + 1)
        if agreeing and runtime.stop_agreed():   # a stop signal to any process, this round
          runtime.stop.request()
        if runtime.stop and r + 1 < loop.num_rounds:
          loop.emit('on_interrupt', r + 1)
          raise Interrupted(r + 1)
        if loop.stop:
          break
      jax.block_until_ready(loop.state)
      loop.emit('on_end')   # a first stop signal lets the finished runs be written whole
  except KeyboardInterrupt:   # delivered: the stop asked for is under way
    runtime.stop.clear()
    raise
  return loop
