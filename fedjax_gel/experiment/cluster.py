"""Runs over several processes: JAX's multi-controller runtime, and which process writes.

Every process runs the same command; ``initialize`` joins them before JAX starts (JAX's
distributed runtime, with gloo collectives on CPU), after which ``jax.devices()`` lists every
process' devices and the experiment's mesh spans them (``planning.devices_and_chunk``). Every
process runs every program and every callback, so that the programs stay in step; only process
0 writes files and prints (``writes``), and every process reads the same work directory when a
run resumes (on several hosts it must be a shared file system).

Process count and id come from ``--num_processes``/``--process_id``/``--coordinator_address``,
or, with ``--num_processes=0``, from the environment as JAX detects it (SLURM, Open MPI, TPU
pods, Kubernetes).

Every process plans its runs from its own flags and files, so before the first round they
compare what they planned (``agree``): a process given another ``--seed`` or ``--num_rounds``,
other data or another view of the work directory would otherwise train a different program in
step with the others (a silently wrong result, or a hang in a collective). A process that
stops before that point tells the others (``stop_others``), which stop with its reason instead
of waiting for it.
"""
from __future__ import annotations

import contextlib
import itertools
import json

from fedjax_gel.experiment.config import ConfigError, first_line


def initialize(coordinator_address: str, num_processes: int, process_id: int,
               heartbeat_timeout: int = 100) -> None:
  """Joins the processes (before JAX starts its backends); one process does nothing.

  ``num_processes=0``: the cluster's own variables (JAX's detection); else
  ``coordinator_address`` (``host:port`` of process 0) and ``process_id`` are needed.
  ``heartbeat_timeout``: seconds without a heartbeat from a process after which the others
  give up on it (a process blocked in a collective with a dead peer waits this long).
  Raises ``ValueError`` (one line naming the flag) for settings that cannot work.
  """
  if num_processes == 1 and process_id != 0:
    raise ValueError(f'--process_id={process_id}: must be 0 with --num_processes=1')
  if num_processes == 1 and not coordinator_address:
    return
  if num_processes < 0:
    raise ValueError(f'--num_processes={num_processes}: must be 0 (detect) or a count')
  if num_processes > 1:
    if not coordinator_address:
      raise ValueError(f'--num_processes={num_processes} needs --coordinator_address=HOST:PORT '
                       '(process 0\'s)')
    if not 0 <= process_id < num_processes:
      raise ValueError(f'--process_id={process_id}: must be in 0..{num_processes - 1}')
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')   # CPU collectives
  if num_processes == 0:
    jax.distributed.initialize(heartbeat_timeout_seconds=heartbeat_timeout)
  else:
    jax.distributed.initialize(coordinator_address, num_processes, process_id,
                               heartbeat_timeout_seconds=heartbeat_timeout)


def writes() -> bool:
  """Whether this process writes outputs (process 0; the only one when there is one)."""
  import jax  # pylint: disable=g-import-not-at-top
  return jax.process_index() == 0


def lost_peer(error: BaseException) -> bool:
  """Whether ``error`` is a collective or the coordination service failing because another
  process of the run is gone (several processes only)."""
  import jax  # pylint: disable=g-import-not-at-top
  return jax.process_count() > 1 and isinstance(error, jax.errors.JaxRuntimeError)


def sync(name: str) -> None:
  """Waits until every process has reached ``sync(name)`` (nothing with one process)."""
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices(name)


# How long a process waits at ``gather`` for the others (they may still be loading data); a
# dead one is noticed sooner, through its missed heartbeats.
GATHER_TIMEOUT_MS = 24 * 3600 * 1000
_gathers = itertools.count()   # every process gathers in the same order: the same numbers


def gather(record) -> list:
  """Every process's ``record`` (JSON-serialisable), in process order; a barrier. Through the
  coordination service's key-value store (JAX's distributed client), not a collective of the
  devices, so that processes with different device counts still meet (and are told so)."""
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_count() == 1:
    return [record]
  # JAX's own client of the coordination service, as jax.experimental.multihost_utils and
  # orbax reach it (JAX exports no public handle)
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  client = distributed.global_state.client
  key = f'fedjax_gel/gather/{next(_gathers)}'
  client.key_value_set(f'{key}/{jax.process_index()}', json.dumps(record, sort_keys=True))
  return [json.loads(client.blocking_key_value_get(f'{key}/{i}', GATHER_TIMEOUT_MS))
          for i in range(jax.process_count())]


_refused = []   # a refusal every process shares (stop_others, agree): they leave together


def stop_others(reason: str) -> None:
  """This process stops for ``reason`` before the runs' first collective: with several
  processes, the others' ``agree`` raise with that reason instead of waiting for this one."""
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_count() > 1:
    gather({'error': reason})
    _refused.append(reason)


@contextlib.contextmanager
def telling_others():
  """An error raised inside stops the other processes too, with its first line
  (``stop_others``), and so does Ctrl-C or a stop signal; for the steps before the runs' first
  collective."""
  try:
    yield
  except KeyboardInterrupt:
    stop_others(INTERRUPTED)
    raise
  except Exception as e:
    stop_others(first_line(e))
    raise


INTERRUPTED = 'interrupted (Ctrl-C or a stop signal)'


def agrees_on_stops() -> bool:
  """Whether the processes stop together on a stop signal (``stop_agreed``): several
  processes with JAX's preemption service (``jax_enable_preemption_service``, on by default)."""
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  # not jax.process_count() first: it starts JAX's backends, which one process must not do
  # before ``devices.configure_cpu``
  if distributed.global_state.client is None:
    return False
  import jax  # pylint: disable=g-import-not-at-top
  return (jax.process_count() > 1 and
          distributed.global_state.preemption_sync_manager is not None)


_rounds = itertools.count(1)   # the rounds stepped by this process (every process: the same)


def stop_agreed() -> bool:
  """Called after every round: whether every process stops after this one. With several
  processes JAX's preemption service holds SIGTERM (the loop sends it Ctrl-C too): a signal to
  any process starts its protocol, which picks the next round every process reaches (the
  largest round any has dispatched, plus one) and makes this true there in all of them, so
  that they write the same checkpoint and stop together. Only where ``agrees_on_stops``."""
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  if multihost_utils.reached_preemption_sync_point(next(_rounds)):
    _refused.append(INTERRUPTED)   # every process stops: they leave the runtime together
    return True
  return False


def leave() -> None:
  """After a refusal or a stop every process shares, leaves JAX's distributed runtime with the others
  (``jax.distributed.shutdown``: process 0's coordination service stays up until every process
  has left; a process still running when it went was killed by the runtime, status 134)."""
  if _refused:
    import jax  # pylint: disable=g-import-not-at-top
    jax.distributed.shutdown()


def agree(record: dict) -> None:
  """Several processes: every process's ``record`` (``{what: value}``, e.g. ``{'--seed': 0}``)
  equals process 0's, else a ConfigError in every process naming the first entry that differs;
  a process that stopped (``stop_others``) stops them all with its reason."""
  records = gather({'record': record})
  problem = next((f'process {i} of the run stopped: {r["error"]}'
                  for i, r in enumerate(records) if 'error' in r), None)
  problem = problem or difference([r['record'] for r in records])
  if problem is not None:
    _refused.append(problem)
    raise ConfigError(problem)


def difference(records: list[dict]) -> str | None:
  """The first entry in which a process's record differs from process 0's, as one line."""
  first = records[0]
  for i, theirs in enumerate(records[1:], 1):
    for k in dict.fromkeys([*first, *theirs]):
      if first.get(k) != theirs.get(k):
        return (f'{k}: process {i} has {theirs.get(k)!r}, process 0 {first.get(k)!r}; every '
                'process must run the same command (but --process_id) on the same data and '
                'work directory')
  return None
