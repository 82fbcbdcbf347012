"""The process's part in a command: ``Runtime`` holds its role among the run's processes, its
stop token, the writer (process 0 writes, the others do nothing) and the agreements between
processes.

``launch/run.py`` creates one as the command starts and hands it to ``cli.execute``, which
passes it to ``experiment.run``; ``experiment.run`` called alone (a notebook) makes its own.
Every signal handler, refusal and counter of a command lives in its runtime, none in a module:
two commands in one process (tests, notebooks, ``cli.main``) never see each other's stops.

Stop signals (Ctrl-C, SIGTERM) take three forms over a command's life:

* outside the rounds (imports, flags, data, compilation; ``Runtime.guarding``): recorded in the
  ``StopToken`` and raised at once as a KeyboardInterrupt, which the command line prints as one
  line. Where Python drops that KeyboardInterrupt (it landed in a garbage-collection callback)
  or it turned into another error inside an import, the token still holds it and the command
  ends as interrupted;
* within the rounds (``Runtime.deferring``): a first one is only recorded, and the loop stops
  after the round under way with a checkpoint; a second one interrupts at once;
* several processes (``Runtime.agrees_on_stops``): JAX's preemption service holds SIGTERM and
  Ctrl-C is sent on to it (``StopToken.forward``), so that every process stops after one and
  the same round (``Runtime.stop_agreed``).
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys

from fedjax_gel.experiment import cluster
from fedjax_gel.experiment.config import ConfigError
from fedjax_gel.experiment.messages import first_line

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)   # Ctrl-C, and a scheduler's or kill's request
INTERRUPTED = 'interrupted (Ctrl-C or a stop signal)'


class StopToken:
  """The stop signals of a command not yet delivered as a KeyboardInterrupt (true while one
  is pending). A KeyboardInterrupt leaving the rounds clears it (``clear``): the stop asked for
  is under way. ``forwarded``: the Ctrl-Cs sent on to JAX's preemption service."""

  def __init__(self, requests: int = 0):
    self.requests = requests
    self.forwarded = 0

  def __bool__(self) -> bool:
    return self.requests > 0

  def request(self):
    self.requests += 1

  def clear(self):
    self.requests = 0

  def interrupt(self, signum, frame):
    """The handler outside the rounds: recorded, then a KeyboardInterrupt."""
    del signum, frame
    self.request()
    raise KeyboardInterrupt

  def defer(self, signum, frame):
    """The handler within the rounds: a first stop recorded, a second one interrupts."""
    if self:
      self.interrupt(signum, frame)
    self.request()

  def forward(self, signum, frame):
    """Several processes' Ctrl-C handler: sent on as SIGTERM to JAX's preemption service,
    which stops every process after one and the same round; a process that stopped on its own
    would leave the others in that round's collectives. A second one interrupts at once."""
    if self.forwarded:
      self.interrupt(signum, frame)
    self.forwarded += 1
    os.kill(os.getpid(), signal.SIGTERM)


@contextlib.contextmanager
def handling(handlers: dict):
  """``{signal: handler}`` installed within it, the previous ones restored after; outside the
  main thread a no-op (signals stay as they are)."""
  try:
    previous = {s: signal.signal(s, h) for s, h in handlers.items()}
  except ValueError:   # not the main thread
    yield
    return
  try:
    yield
  finally:
    for s, h in previous.items():
      signal.signal(s, h)


def _unraisable(report):
  """A KeyboardInterrupt Python could not raise (in a garbage-collection callback) is not
  printed: the stop token holds it, and the command ends as interrupted."""
  if not isinstance(report.exc_value, KeyboardInterrupt):
    sys.__unraisablehook__(report)


class Runtime:
  """One process's part in one command: its stop token, writer and agreements between processes.

  See the module docstring. The role (``index``, ``count``, ``writes``) is JAX's, read when
  first asked: creating a runtime starts no backend (``xla.configure_cpu`` must come first). The
  numbers of the gathers and rounds told to JAX's services are the process's (``cluster``), as
  those services are.

  Attributes:
    stop: its ``StopToken``.
    refused: the refusals and stops every process shares (they leave together: ``leave``).
  """

  def __init__(self):
    self.stop = StopToken()
    self.refused = []   # a refusal or stop every process shares: they leave together (``leave``)

  # the role
  @property
  def index(self) -> int:
    import jax  # pylint: disable=g-import-not-at-top
    return jax.process_index()

  @property
  def count(self) -> int:
    import jax  # pylint: disable=g-import-not-at-top
    return jax.process_count()

  @property
  def writes(self) -> bool:
    """Whether this process writes outputs and prints (process 0; the only one alone)."""
    return self.index == 0

  def write(self, fn, *args, **kwargs):
    """The writer: ``fn(*args, **kwargs)`` on the writing process, nothing (None) on the
    others, which run the same command on the same files."""
    return fn(*args, **kwargs) if self.writes else None

  # agreement between processes
  def gather(self, record) -> list:
    """Every process's ``record`` (JSON-serialisable), in process order; a barrier
    (``cluster.gather``)."""
    if self.count == 1:
      return [record]
    return cluster.gather(record)

  def from_writer(self, value):
    """Process 0's ``value`` in every process (a decision every process must take alike, e.g.
    whether a file process 0 writes is there: another process may see a shared file system
    late)."""
    return self.gather(value)[0]

  def sync(self, name: str) -> None:
    """Waits until every process has reached ``sync(name)`` (nothing with one process)."""
    if self.count > 1:
      cluster.sync(name)

  def agree(self, record: dict) -> None:
    """Several processes: every process's ``record`` (``{what: value}``, e.g.
    ``{'--seed': 0}``) equals process 0's, else a ConfigError in every process naming the first
    entry that differs; a process that stopped (``stop_others``) stops them all with its
    reason."""
    records = self.gather({'record': record})
    problem = next((f'process {i} of the run stopped: {r["error"]}'
                    for i, r in enumerate(records) if 'error' in r), None)
    problem = problem or cluster.difference([r['record'] for r in records])
    if problem is not None:
      self.refused.append(problem)
      raise ConfigError(problem)

  def stop_others(self, reason: str) -> None:
    """This process stops for ``reason`` before the runs' first collective: with several
    processes, the others' ``agree`` raise with that reason instead of waiting for this one."""
    if self.count > 1:
      self.gather({'error': reason})
      self.refused.append(reason)

  @contextlib.contextmanager
  def telling_others(self):
    """An error raised inside stops the other processes too, with its first line
    (``stop_others``), and so does Ctrl-C or a stop signal; for the steps before the runs'
    first collective."""
    try:
      yield
    except KeyboardInterrupt:
      self.stop_others(INTERRUPTED)
      raise
    except Exception as e:
      self.stop_others(first_line(e))
      raise

  def leave(self) -> None:
    """After a refusal or a stop every process shares, leaves JAX's distributed runtime with
    the others (process 0's coordination service stays up until every process has left; a
    process still running when it went was killed by the runtime, status 134)."""
    if self.refused:
      cluster.shutdown()

  def lost_peer(self, error: BaseException) -> bool:
    """Whether ``error`` is a collective or the coordination service failing because another
    process of the run is gone (several processes only)."""
    import jax  # pylint: disable=g-import-not-at-top
    return self.count > 1 and isinstance(error, jax.errors.JaxRuntimeError)

  # stops
  @contextlib.contextmanager
  def guarding(self):
    """The command's stop handlers outside the rounds (``StopToken.interrupt``), and Python's
    report of a KeyboardInterrupt it could not raise silenced (the token holds it)."""
    hook, sys.unraisablehook = sys.unraisablehook, _unraisable
    try:
      with handling(dict.fromkeys(STOP_SIGNALS, self.stop.interrupt)):
        yield
    finally:
      sys.unraisablehook = hook

  def share_stops(self) -> None:
    """Once several processes joined (``agrees_on_stops``): Ctrl-C goes to
    ``StopToken.forward`` for the rest of the command, SIGTERM stays with JAX's preemption
    service. Outside the main thread: a no-op."""
    if self.agrees_on_stops():
      try:
        signal.signal(signal.SIGINT, self.stop.forward)
      except ValueError:
        pass

  def deferring(self):
    """Within it (the rounds), a first Ctrl-C or SIGTERM is only recorded in ``stop``, so that
    the loop stops between rounds with a checkpoint; a second one interrupts at once. Several
    processes: Ctrl-C forwarded, the stop recorded in every process after the same round
    (``stop_agreed``)."""
    return handling({signal.SIGINT: self.stop.forward} if self.agrees_on_stops() else
                    dict.fromkeys(STOP_SIGNALS, self.stop.defer))

  def agrees_on_stops(self) -> bool:
    """Whether the processes stop together on a stop signal: several processes with JAX's
    preemption service (``jax_enable_preemption_service``, on by default)."""
    return cluster.has_preemption_service()

  def stop_agreed(self) -> bool:
    """Called after every round where ``agrees_on_stops``: whether every process stops after
    this one. A signal to any process starts the preemption service's protocol, which picks the
    next round every process reaches (the largest any has dispatched, plus one) and makes this
    true there in all of them, so that they write the same checkpoint and stop together."""
    if cluster.reached_sync_point():
      self.refused.append(INTERRUPTED)   # every process stops: they leave the runtime together
      return True
    return False
