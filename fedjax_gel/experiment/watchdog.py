"""No silent hang: a run that stops making progress, or loses a process, ends with one line.

A program that waits forever in XLA's runtime (a collective whose partner never arrives, a
peer process that died or froze) cannot be interrupted from Python: the main thread is inside
a C++ wait. ``Watchdog`` runs a thread of its own that notices it and ends the process with one
line on stderr and exit status ``EXIT_STALLED``; the checkpoints are written atomically
(``experiment.checkpoint``), so the last one stays intact and the same command resumes from it.
The command line adds it (``cli.execute``; ``cli.main`` in a notebook too, whose process a stall
then ends as well: the wait cannot be interrupted otherwise); ``experiment.run`` alone has none.

* **Rounds** (a loop callback): what the loop waits on is its active phase
  (``loop.Phases.active``): a round (``train``: the next round's dispatch and the wait for the
  round two before it, ``loop.Loop.step``) or an evaluation (``eval``). A stall is such a wait
  longer than ``stall_limit``: ``--stall_timeout`` seconds when given, else the larger of
  ``MIN_STALL_S`` and ``STALL_ROUNDS`` mean rounds (or ``GAP_FACTOR`` times the longest
  evaluation seen), and ``FIRST_S`` until ``MEASURED_ROUNDS`` rounds (or one evaluation) have
  been timed: a first round may wait for another process's compilation. Checkpoints, reports
  and compilation are not watched (a process that dies meanwhile is, below).
* **Processes** (several processes, from the start of the command to its end): every
  ``BEAT_S`` each process publishes a beat counter, its last round and its state through the
  coordination service's key-value store (the one JAX's multi-controller runtime already runs),
  and reads the others'. A process whose counter has not moved for ``peer_timeout`` seconds is
  gone or frozen; the others stop before JAX's own heartbeat timeout would abort them
  (``--heartbeat_timeout``, status 134). A process that stops on its own (a stall) says why,
  and the others stop at once with its reason. (When process 0, which hosts the coordination
  service, dies, JAX's runtime ends the others at once with its own message: its error
  callback cannot be replaced from Python in JAX 0.10.)
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time

from fedjax_gel.core.backend import jax_private
from fedjax_gel.experiment import callbacks, checkpoint

EXIT_STALLED = 3   # the run stopped making progress (or lost a process): resumable
MIN_STALL_S = 60.
STALL_ROUNDS = 20   # a stall: a wait of this many mean rounds ...
GAP_FACTOR = 3      # ... or this many times the longest evaluation seen
FIRST_S = 600.      # the limit until MEASURED_ROUNDS rounds (or one evaluation) were timed
MEASURED_ROUNDS = 3
BEAT_S = 1.         # how often the watchdog looks, and a process tells the others it lives
PEER_TIMEOUT_S = 30.   # a process silent this long is gone (at most half the heartbeat timeout)
KEY = 'fedjax_gel/alive'
# XLA's CPU runtime ends a process whose collective waited for a partner 20 s plus this many
# seconds (default 40), with a page of C++ stack traces and status 134, before the watchdog
# could say which round stalled: the command raises it (``defer_xla_abort``) to an hour, or
# twice --stall_timeout when that is longer, so that the watchdog's limit decides within the
# rounds and a collective that hangs outside them (a barrier at the end) still ends. Checked
# with jaxlib 0.10, whose XLA has the option; other versions keep XLA's own (an option XLA
# does not know stops it at start).
XLA_ABORT_FLAG = '--xla_cpu_collective_call_terminate_timeout_seconds'
XLA_ABORT_S = 3600


def defer_xla_abort(stall_timeout: float = 0.) -> None:
  """Sets ``XLA_ABORT_FLAG`` in ``XLA_FLAGS`` (before JAX starts its backends; jaxlib 0.10
  only; an ``XLA_FLAGS`` that sets it already is left as it is)."""
  import jaxlib  # pylint: disable=g-import-not-at-top
  flags = os.environ.get('XLA_FLAGS', '')
  seconds = int(max(XLA_ABORT_S, 2 * stall_timeout))
  if jaxlib.__version__.startswith('0.10.') and XLA_ABORT_FLAG not in flags:
    os.environ['XLA_FLAGS'] = f'{flags} {XLA_ABORT_FLAG}={seconds}'.strip()


def stall_limit(timeout: float, typical: float | None, factor: float) -> float:
  """Seconds a wait may last: ``timeout`` when positive; ``FIRST_S`` while ``typical`` (the
  mean round, the longest evaluation) is not measured yet (None); else
  ``max(MIN_STALL_S, factor x typical)``."""
  if timeout > 0:
    return timeout
  if typical is None:
    return FIRST_S
  return max(MIN_STALL_S, factor * typical)


def peer_timeout(heartbeat_timeout: float) -> float:
  """Seconds of silence after which a process is taken for gone: ``PEER_TIMEOUT_S``, at most
  half of JAX's heartbeat timeout (which aborts every process), at least two beats."""
  return max(2 * BEAT_S, min(PEER_TIMEOUT_S, heartbeat_timeout / 2))


def resume_from(workdirs) -> str:
  """Where the same command resumes ``workdirs``' runs: the last checkpoint they all have
  (``workdirs`` empty: not known yet)."""
  if not workdirs:
    return 'from its last checkpoint'
  common = set.intersection(*(set(checkpoint.rounds(w)) for w in workdirs))
  return (f'from the checkpoint of round {max(common)}' if common else
          'from the start (no checkpoint yet)')


def leave(message: str) -> None:
  """The watchdog's end of the process: ``message`` as one line, exit ``EXIT_STALLED``."""
  try:
    sys.stdout.flush()
    print(f'error: {message}', file=sys.stderr, flush=True)
  finally:
    os._exit(EXIT_STALLED)  # pylint: disable=protected-access


class Peers:
  """The other processes of a run, as the coordination service's key-value store shows them:
  each process's record ``{'beat', 'round', 'state', 'reason'}`` under ``KEY/<process>``."""

  def __init__(self, client, me: int, count: int, timeout: float):
    self.client, self.me, self.count, self.timeout = client, me, count, timeout
    self.beats = 0
    self.seen = {}   # process -> (its last beat, when it changed)

  def publish(self, done: int, state: str = 'running', reason: str = ''):
    self.beats += 1
    self.client.key_value_set(f'{KEY}/{self.me}', json.dumps(
        {'beat': self.beats, 'round': done, 'state': state, 'reason': reason}),
        allow_overwrite=True)

  def records(self) -> dict:
    """``{process: record}`` of the other processes that have published one."""
    out = {}
    for i in range(self.count):
      if i != self.me:
        try:
          out[i] = json.loads(self.client.key_value_try_get(f'{KEY}/{i}'))
        except Exception:  # pylint: disable=broad-except  # none yet (NOT_FOUND)
          pass
    return out

  def check(self, now: float, done: int) -> str | None:
    """Why this process must stop (a process stopped, or fell silent), or None. A process
    that has not published yet is silent since this process first looked."""
    records = self.records()
    for i in range(self.count):
      if i == self.me:
        continue
      r = records.get(i, {'beat': None, 'round': '?', 'state': 'running'})
      if r['state'] == 'stopped':
        return f'process {i} of the run stopped: {r["reason"]}'
      if r['state'] == 'done':
        continue
      if i not in self.seen or self.seen[i][0] != r['beat']:   # first seen, or a new beat
        self.seen[i] = (r['beat'], now)
      elif now - self.seen[i][1] > self.timeout:
        since = self.seen[i][1]
        return (f'process {i} of the run sent no news for {now - since:.0f} s (its last round '
                f'{r["round"]}, this process\'s {done}): it is gone or frozen; this process '
                'stops too')
    return None

  def settled(self, now: float) -> bool:
    """Whether every other process has left (published 'done' or 'stopped') or fell silent
    (``check``: it will not leave)."""
    records = self.records()
    return all(records.get(i, {}).get('state') in ('done', 'stopped') or
               i in self.seen and now - self.seen[i][1] > self.timeout
               for i in range(self.count) if i != self.me)

  def rounds(self) -> str:
    """``process i at round r`` of the other processes, for a stall's line."""
    return ', '.join(f'process {i} at round {r["round"]}'
                     for i, r in sorted(self.records().items()))


def for_command(stall_timeout: float, heartbeat_timeout: float) -> 'Watchdog':
  """The command's watchdog, started (with several processes it watches them from now on)."""
  import jax  # pylint: disable=g-import-not-at-top
  peers = None
  if jax.process_count() > 1:
    peers = Peers(jax_private.distributed_client(), jax.process_index(), jax.process_count(),
                  peer_timeout(heartbeat_timeout))
  watch = Watchdog(stall_timeout, peers)
  if peers is not None:
    watch.start()
  return watch


def devices_of(mesh) -> str:
  """The devices a loop's rounds run on, for a stall's line."""
  import jax  # pylint: disable=g-import-not-at-top
  devices = list(mesh.devices.flat) if mesh is not None else jax.local_devices()[:1]
  ids = [d.id for d in devices]
  span = f'{ids[0]}-{ids[-1]}' if ids == list(range(ids[0], ids[-1] + 1)) and len(ids) > 1 else (
      ', '.join(map(str, ids)))
  return f'{devices[0].platform} device{"s" * (len(ids) > 1)} {span}'


class Watchdog(callbacks.Callback):
  """Ends a run that stops making progress with one line (the module's doc). A loop callback;
  one for the whole command: ``start`` begins watching (the processes, and each loop's waits
  from its ``on_compiled`` to its ``on_end``), ``finish`` tells the other processes how this
  one left.

  ``timeout``: ``--stall_timeout`` (0: derived, ``stall_limit``); ``peers``: a ``Peers`` (several
  processes) or None; ``stop``: called with the line's text in the watchdog's thread
  (``leave``: print it and exit).
  """

  def __init__(self, timeout: float = 0., peers: Peers | None = None, stop=leave):
    self.timeout, self.peers, self.stop = timeout, peers, stop
    self.loop = None     # the loop whose waits are watched (None: between loops)
    self.done = 0        # its rounds done
    self.evaluations = 0   # its evaluation phase's seconds at the last evaluation
    self.longest_eval = None
    self.devices = ''
    self.workdirs = []
    self.thread = None
    self.stopped = threading.Event()
    self.lock = threading.Lock()   # one publication at a time; the last is final
    self.final = False

  def start(self):
    if self.thread is None:
      self.thread = threading.Thread(target=self.watch, name='fedjax_gel-watchdog', daemon=True)
      self.thread.start()

  def publish(self, state: str = 'running', reason: str = '') -> bool:
    """This process's record for the others (``state`` other than 'running': the last);
    whether it was published (not after the last)."""
    with self.lock:
      if self.final:
        return False
      self.final = state != 'running'
      try:
        self.peers.publish(self.done, state, reason)
      except Exception:  # pylint: disable=broad-except  # the coordinator is gone
        pass
      return True

  def finish(self, state: str = 'done', reason: str = ''):
    """Stops watching; with several processes, tells the others how this one left ('done',
    or 'stopped' with ``reason``: they stop too), unless it told them already. Process 0, which hosts the coordination
    service, then waits a few beats for the others to leave (its exit ends theirs, status 134)."""
    self.stopped.set()
    self.loop = None
    if self.peers is None or not self.publish(state, reason):
      return
    if self.peers.me == 0 and state == 'stopped':
      deadline = time.monotonic() + 3 * BEAT_S + 1
      while time.monotonic() < deadline and not self.peers.settled(time.monotonic()):
        time.sleep(0.1)

  # the loop's hooks
  def on_start(self, loop):
    self.workdirs = list(dict.fromkeys(r.workdir for r in loop.runs))

  def on_compiled(self, loop):
    self.devices = devices_of(loop.exp.mesh)
    self.evaluations = loop.seconds('eval')
    if self.evaluations > 0:   # round 0's evaluation
      self.longest_eval = max(self.longest_eval or 0., self.evaluations)
    self.done, self.loop = loop.start, loop
    self.start()

  def on_round(self, loop, done):
    self.done = done

  def on_evaluate(self, loop, done, records):
    seconds = loop.seconds('eval')
    self.longest_eval = max(self.longest_eval or 0., seconds - self.evaluations)
    self.evaluations = seconds

  def on_interrupt(self, loop, done):
    self.loop = None

  def on_end(self, loop):
    self.loop = None

  # the watchdog's thread
  def stalled(self, now: float) -> str | None:
    """The line of a stall at ``now`` (the loop's active wait too long), or None."""
    loop = self.loop
    active = loop.phases.active if loop is not None else None
    if active is None or active[0] not in ('train', 'eval'):
      return None
    name, since = active
    rounds = self.done - loop.start
    if name == 'train':
      typical = (loop.seconds('train') / rounds if rounds >= MEASURED_ROUNDS else None)
      limit = stall_limit(self.timeout, typical, STALL_ROUNDS)
      first = max(loop.start, self.done - loop.in_flight) + 1   # the oldest unfinished round
      what = (f'round {first}' if first == self.done + 1 else
              f'rounds {first}-{self.done + 1}')   # dispatched, and not all finished
      took = f'a round took {typical * 1e3:.1f} ms; ' if typical else ''
    else:
      limit = stall_limit(self.timeout, self.longest_eval, GAP_FACTOR)
      what, took = f'the evaluation after round {self.done}', ''
    if now - since <= limit:
      return None
    where = self.peers.rounds() if self.peers is not None else ''
    return (f'{what} made no progress for {now - since:.0f} s ({took}limit {limit:.0f} s, '
            f'--stall_timeout) on {self.devices}{"; " + where if where else ""}; stopped: run '
            f'the same command to resume {resume_from(self.workdirs)}')

  def look(self, now: float) -> str | None:
    """What ends the process at ``now`` (a stall, a process stopped or gone), or None; with
    several processes, this one's beat is published first."""
    message = self.stalled(now)
    if self.peers is None or message is not None:
      return message
    self.publish()
    lost = self.peers.check(now, self.done)
    return lost and (f'{lost}: start every process again with the same command to resume '
                     f'{resume_from(self.workdirs)}')

  def watch(self):
    while not self.stopped.wait(BEAT_S):
      try:
        message = self.look(time.monotonic())
      except Exception:  # pylint: disable=broad-except  # a store that failed: look again
        continue
      if message is not None and not self.stopped.is_set():
        self.finish('stopped', message.split(' (')[0].split(': start every')[0])
        self.stop(message)
        return
