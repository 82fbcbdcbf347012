"""JAX's multi-controller runtime: joining the processes of a run, and the primitives the
command's ``runtime.Runtime`` builds its agreements on (a gather through the coordination
service, a barrier, JAX's preemption service, leaving).

Every process runs the same command; ``initialize`` joins them before JAX starts (JAX's
distributed runtime, with gloo collectives on CPU), after which ``jax.devices()`` lists every
process' devices and the experiment's mesh spans them (``planning.devices_and_chunk``). Every
process runs every program and every callback, so that the programs stay in step; only process
0 writes files and prints (``Runtime.writes``), and every process reads the same work directory
when a run resumes (on several hosts it must be a shared file system).

Process count and id come from ``--num_processes``/``--process_id``/``--coordinator_address``,
or, with ``--num_processes=0``, from the environment as JAX detects it (SLURM, Open MPI, TPU
pods, Kubernetes).

Every process plans its runs from its own flags and files, so before the first round they
compare what they planned (``Runtime.agree``, each entry that differs named by ``difference``):
a process given another ``--seed`` or ``--num_rounds``, other data or another view of the work
directory would otherwise train a different program in step with the others (a silently wrong
result, or a hang in a collective). A process that stops before that point tells the others
(``Runtime.stop_others``), which stop with its reason instead of waiting for it.
"""
from __future__ import annotations

import errno
import itertools
import json
import time

from fedjax_gel.core.backend import jax_private
from fedjax_gel.experiment.messages import first_line


def initialize(coordinator_address: str, num_processes: int, process_id: int,
               heartbeat_timeout: int = 100, timeout: int = 300) -> None:
  """Joins the processes (before JAX starts its backends); one process does nothing.

  ``num_processes=0``: the cluster's own variables (JAX's detection); else
  ``coordinator_address`` (``host:port`` of process 0) and ``process_id`` are needed.
  ``heartbeat_timeout``: seconds without a heartbeat from a process after which the others
  give up on it (a process blocked in a collective with a dead peer waits this long).
  ``timeout``: seconds to wait for the other processes (``joining``).
  Raises ``ValueError`` (one line naming the flag) for settings that cannot work, or when the
  processes do not meet within ``timeout``; Ctrl-C or SIGTERM while waiting interrupt it.
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
    if process_id == 0:
      check_port(coordinator_address)
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')   # CPU collectives
  # JAX's own deadline comes later than ours: its expiry aborts the process (status 134)
  args = dict(heartbeat_timeout_seconds=heartbeat_timeout,
              initialization_timeout=timeout + JOIN_GRACE_S)
  if num_processes != 0:
    args.update(coordinator_address=coordinator_address, num_processes=num_processes,
                process_id=process_id)
  joining(lambda: jax.distributed.initialize(**args), timeout,
          f'--coordinator_address={coordinator_address or "(detected)"}')


JOIN_GRACE_S = 30   # JAX's deadline to join, beyond ours


def check_port(address: str) -> None:
  """Process 0's ``address`` (``host:port``) is free on this host, else a ValueError: the
  coordinator's server (gRPC) would share a port another server holds (a second process 0 of
  the run: both waited and were aborted without a word)."""
  import socket  # pylint: disable=g-import-not-at-top
  host, _, port = address.rpartition(':')
  try:
    number = int(port)
  except ValueError:
    raise ValueError(f'--coordinator_address={address}: must be HOST:PORT') from None
  try:
    with socket.socket(socket.AF_INET6 if ':' in host.strip('[]') else socket.AF_INET) as s:
      s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # a closed run's port is free
      s.bind(('', number))
  except OSError as e:
    if e.errno != errno.EADDRINUSE:   # no such socket here (e.g. no IPv4): JAX's bind decides
      return
    raise ValueError(
        f'--coordinator_address={address}: port {number} is in use on this host: another '
        'process 0 of this run (give each process its own --process_id, 0 to '
        '--num_processes - 1) or another program; choose a free port') from None


def joining(join, timeout: float, what: str) -> None:
  """``join()`` (JAX's, which waits in C++ for the other processes and then blocks stop
  signals) in a thread of its own, so that Ctrl-C or SIGTERM interrupt the wait (the handlers
  of the main thread run); a ValueError naming ``what`` when the processes have not met within
  ``timeout`` seconds or JAX gave up."""
  import threading  # pylint: disable=g-import-not-at-top
  failed = []

  def run():
    try:
      join()
    except Exception as e:  # pylint: disable=broad-except
      failed.append(e)
  thread = threading.Thread(target=run, name='fedjax_gel-join', daemon=True)
  thread.start()
  deadline = time.monotonic() + timeout
  while thread.is_alive() and time.monotonic() < deadline:
    thread.join(0.1)
  if thread.is_alive() or failed:
    why = (f'they had not all started within {timeout:.0f} s' if not failed else
           first_line(failed[0]))
    raise ValueError(f'{what}: the processes of the run did not meet ({why}); start every '
                     'process with the same command, --process_id 0 to --num_processes - 1 '
                     'once each, process 0 at that address')


def sync(name: str) -> None:
  """Waits until every process has reached ``sync(name)``."""
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  multihost_utils.sync_global_devices(name)


# How long a process waits at ``gather`` for the others (they may still be loading data); a
# dead one is noticed sooner, through its missed heartbeats.
GATHER_TIMEOUT_MS = 24 * 3600 * 1000
# The numbers of the gathers and of the rounds told to JAX's preemption service, counted for
# the process as the services they number are: the key-value store refuses a key set before,
# and the preemption service's steps only grow (a second command in one process goes on
# counting; every process counts alike, as they run the same commands).
_gathers = itertools.count()
_steps = itertools.count(1)


def gather(record) -> list:
  """Every process's ``record`` (JSON-serialisable), in process order; a barrier. Through
  the coordination service's key-value store (JAX's distributed client), not a collective of
  the devices, so that processes with different device counts still meet (and are told so)."""
  import jax  # pylint: disable=g-import-not-at-top
  client = jax_private.distributed_client()   # JAX's own (it exports no public handle)
  key = f'fedjax_gel/gather/{next(_gathers)}'
  client.key_value_set(f'{key}/{jax.process_index()}', json.dumps(record, sort_keys=True))
  return [json.loads(client.blocking_key_value_get(f'{key}/{i}', GATHER_TIMEOUT_MS))
          for i in range(jax.process_count())]


def has_preemption_service() -> bool:
  """Whether several processes joined with JAX's preemption service
  (``jax_enable_preemption_service``, on by default), which can stop them all after one
  round (``reached_sync_point``)."""
  # not jax.process_count() first: it starts JAX's backends, which one process must not do
  # before ``xla.configure_cpu``
  if jax_private.distributed_client() is None:
    return False
  import jax  # pylint: disable=g-import-not-at-top
  return jax.process_count() > 1 and jax_private.preemption_sync_manager() is not None


def reached_sync_point() -> bool:
  """Called after every round: JAX's preemption service's answer for it (the process's
  rounds, counted from 1): whether a stop signal to any process makes every process stop after
  this one."""
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return multihost_utils.reached_preemption_sync_point(next(_steps))


def shutdown() -> None:
  """Leaves JAX's distributed runtime (``jax.distributed.shutdown``)."""
  import jax  # pylint: disable=g-import-not-at-top
  jax.distributed.shutdown()


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
