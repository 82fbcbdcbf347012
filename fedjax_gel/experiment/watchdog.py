"""No silent hang: a run that stops making progress, or loses a process, ends with one line.

A program that waits forever in XLA's runtime (a collective whose partner never arrives, a
peer process that died or froze) cannot be interrupted from Python: the main thread is inside
a C++ wait. ``Watchdog`` runs a thread of its own that notices it and ends the process with one
line on stderr and exit status ``EXIT_STALLED``; the checkpoints are written atomically
(``experiment.checkpoint``), so the last one stays intact and the same command resumes from it.
The command line adds it (``cli.execute``; ``cli.main`` in a notebook too, whose process a stall
then ends as well: the wait cannot be interrupted otherwise); ``experiment.run`` alone has none.

* **Rounds** (a loop callback): a stall is no finished round for longer than
  ``stall_limit``: ``--stall_timeout`` seconds when given, else the largest of
  ``MIN_STALL_S``, ``STALL_ROUNDS`` median rounds and ``GAP_FACTOR`` times the longest gap
  between two rounds seen so far (an evaluation or a checkpoint included; the first evaluation,
  at round 0, counts too). The loop lets at most a few rounds run ahead (``loop.Loop.step``),
  so the rounds it reports are rounds the devices finished.
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

import collections
import json
import os
import statistics
import sys
import threading
import time

from fedjax_gel.experiment import callbacks, checkpoint

EXIT_STALLED = 3   # the run stopped making progress (or lost a process): resumable
MIN_STALL_S = 60.
STALL_ROUNDS = 20   # a stall: no round for this many median rounds ...
GAP_FACTOR = 3      # ... and this many times the longest gap between rounds seen so far
BEAT_S = 1.         # how often the watchdog looks, and a process tells the others it lives
PEER_TIMEOUT_S = 30.   # a process silent this long is gone (at most half the heartbeat timeout)
KEY = 'fedjax_gel/alive'
# XLA's CPU runtime ends a process whose collective waited for a partner 20 s plus this many
# seconds (default 40), with a page of C++ stack traces and status 134, before the watchdog
# could say which round stalled: the command raises it to a day (``defer_xla_abort``), and
# the watchdog's limit decides. Checked with jaxlib 0.10, whose XLA has the option; other
# versions keep XLA's own (an option XLA does not know stops it at start).
XLA_ABORT_FLAG = '--xla_cpu_collective_call_terminate_timeout_seconds'
XLA_ABORT_S = 24 * 3600


def defer_xla_abort() -> None:
  """Sets ``XLA_ABORT_FLAG`` to ``XLA_ABORT_S`` in ``XLA_FLAGS`` (before JAX starts its
  backends; jaxlib 0.10 only; an ``XLA_FLAGS`` that sets it already is left as it is)."""
  import jaxlib  # pylint: disable=g-import-not-at-top
  flags = os.environ.get('XLA_FLAGS', '')
  if jaxlib.__version__.startswith('0.10.') and XLA_ABORT_FLAG not in flags:
    os.environ['XLA_FLAGS'] = f'{flags} {XLA_ABORT_FLAG}={XLA_ABORT_S}'.strip()


def stall_limit(timeout: float, gaps, longest: float) -> float:
  """Seconds without a finished round that make a stall: ``timeout`` when positive, else
  ``max(MIN_STALL_S, STALL_ROUNDS x median(gaps), GAP_FACTOR x longest)``."""
  if timeout > 0:
    return timeout
  median = statistics.median(gaps) if gaps else 0.
  return max(MIN_STALL_S, STALL_ROUNDS * median, GAP_FACTOR * longest)


def peer_timeout(heartbeat_timeout: float) -> float:
  """Seconds of silence after which a process is taken for gone: ``PEER_TIMEOUT_S``, at most
  half of JAX's heartbeat timeout (which aborts every process), at least two beats."""
  return max(2 * BEAT_S, min(PEER_TIMEOUT_S, heartbeat_timeout / 2))


def resume_from(workdirs) -> str:
  """Where the same command resumes ``workdirs``' runs: the last checkpoint they all have."""
  common = set.intersection(*(set(checkpoint.rounds(w)) for w in workdirs)) if workdirs else set()
  return (f'from the checkpoint of round {max(common)}' if common else
          'from the start (no checkpoint yet)')


def leave(message: str) -> None:
  """The watchdog's end of the process: ``message`` as one line, exit ``EXIT_STALLED``."""
  sys.stdout.flush()
  print(f'error: {message}', file=sys.stderr, flush=True)
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
    out = {}
    for i in range(self.count):
      if i != self.me:
        text = self.client.key_value_try_get(f'{KEY}/{i}')   # raises while there is none
        out[i] = json.loads(text)
    return out

  def check(self, now: float, done: int) -> str | None:
    """Why this process must stop (a process stopped, or fell silent), or None."""
    try:
      records = self.records()
    except Exception:  # pylint: disable=broad-except  # a process that has not published yet
      return None
    for i, r in records.items():
      if r['state'] == 'stopped':
        return f'process {i} of the run stopped: {r["reason"]}'
      if r['state'] == 'done':
        continue
      beat, since = self.seen.get(i, (None, now))
      if beat != r['beat']:
        self.seen[i] = (r['beat'], now)
      elif now - since > self.timeout:
        return (f'process {i} of the run sent no news for {now - since:.0f} s (its last round '
                f'{r["round"]}, this process\'s {done}): it is gone or frozen; this process '
                'stops too')
    return None

  def rounds(self) -> str:
    """``process: round`` of every process, for a stall's line."""
    try:
      records = self.records()
    except Exception:  # pylint: disable=broad-except
      return ''
    return ', '.join(f'process {i} at round {r["round"]}' for i, r in sorted(records.items()))


def for_command(stall_timeout: float, heartbeat_timeout: float) -> 'Watchdog':
  """The command's watchdog, started (with several processes it watches them from now on)."""
  import jax  # pylint: disable=g-import-not-at-top
  peers = None
  if jax.process_count() > 1:
    from jax._src import distributed  # pylint: disable=g-import-not-at-top
    peers = Peers(distributed.global_state.client, jax.process_index(), jax.process_count(),
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
  """Ends a run that stops making progress with one line (the module's doc). A loop callback,
  last in the list (a round's gap then holds its evaluation and checkpoint); one for the whole
  command: ``start`` begins watching the processes, the loops' hooks arm it for their rounds,
  ``finish`` tells the other processes this one is done.

  ``timeout``: ``--stall_timeout`` (0: derived, ``stall_limit``); ``peers``: a ``Peers`` (several
  processes) or None; ``stop``: called with the line's text in the watchdog's thread
  (``leave``: print it and exit).
  """

  def __init__(self, timeout: float = 0., peers: Peers | None = None, stop=leave):
    self.timeout, self.peers, self.stop = timeout, peers, stop
    self.devices = ''   # the loop's, for the line
    self.gaps = collections.deque(maxlen=256)
    self.longest = 0.
    self.last = None     # when the last round finished (None: not watching rounds)
    self.done = 0        # the last round finished
    self.workdirs = []
    self.thread = None
    self.stopped = threading.Event()

  def start(self):
    if self.thread is None:
      self.thread = threading.Thread(target=self.watch, name='fedjax_gel-watchdog', daemon=True)
      self.thread.start()

  def finish(self, state: str = 'done', reason: str = ''):
    """Stops watching; with several processes, tells the others (``state`` 'done' or
    'stopped' with ``reason``)."""
    self.stopped.set()
    self.last = None
    if self.peers is not None:
      try:
        self.peers.publish(self.done, state, reason)
      except Exception:  # pylint: disable=broad-except  # the coordinator is gone
        pass

  # the loop's hooks
  def on_compiled(self, loop):
    self.workdirs = list(dict.fromkeys(r.workdir for r in loop.runs))
    self.devices = devices_of(loop.exp.mesh)
    self.longest = max(self.longest, loop.seconds('eval'))   # round 0's evaluation
    self.done = loop.start
    self.last = time.monotonic()
    self.start()

  def on_round(self, loop, done):
    now = time.monotonic()
    if self.last is not None:
      gap = now - self.last
      self.gaps.append(gap)
      self.longest = max(self.longest, gap)
    self.last, self.done = now, done

  def on_interrupt(self, loop, done):
    self.last = None

  def on_end(self, loop):
    self.last = None

  # the watchdog's thread
  def stalled(self, now: float) -> str | None:
    """The line of a stall at ``now``, or None."""
    last = self.last
    limit = stall_limit(self.timeout, self.gaps, self.longest)
    if last is None or now - last <= limit:
      return None
    took = (f'a round took {statistics.median(self.gaps) * 1e3:.1f} ms, the longest gap '
            f'{self.longest:.1f} s; ' if self.gaps else '')
    where = self.peers.rounds() if self.peers is not None else ''
    return (f'round {self.done + 1} made no progress for {now - last:.0f} s ({took}limit '
            f'{limit:.0f} s, --stall_timeout){" on " + self.devices if self.devices else ""}'
            f'{"; " + where if where else ""}; stopped: run the same command to resume '
            f'{resume_from(self.workdirs)}')

  def look(self, now: float) -> str | None:
    """What ends the process at ``now`` (a stall, a process stopped or gone), or None; with
    several processes, this one's beat is published first, and a stall tells the others."""
    message = self.stalled(now)
    if self.peers is None:
      return message
    if message is not None:   # the others stop at once, with its reason
      self.finish('stopped', message.split(' (')[0])
      return message
    try:
      self.peers.publish(self.done)
    except Exception:  # pylint: disable=broad-except  # the coordinator is gone: JAX ends us
      return None
    lost = self.peers.check(now, self.done)
    return lost and (f'{lost}: start every process again with the same command to resume '
                     f'{resume_from(self.workdirs)}')

  def watch(self):
    while not self.stopped.wait(BEAT_S):
      message = self.look(time.monotonic())
      if message is not None:
        self.stop(message)
        return
