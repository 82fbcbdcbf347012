"""Memory estimates made before compiling: one client's working set in a round.

A chunk of ``k`` clients takes about ``k x client_bytes(...)`` of device memory: the clients are
vmapped, so every per-client buffer is ``k`` times as large. One client holds

* its data order for the round (``shuffle.order_bytes(tau_max * B)``);
* the peak of the intermediates of one local step, the algorithm's ``client_step`` on one
  minibatch (``peak_bytes``: a linear scan of the step's jaxpr in program order, each value live
  from its definition to its last use; this counts activations, which the model's size does not
  tell, and the algorithm's own terms: momentum, proximal terms, control variates, guesses);
* the client's state (model and optimiser state), its starting model, its upload, the pre-pass
  value (a model-sized gradient) and store row it reads, and two minibatches;
* the algorithm's pre-pass (``pre_pass_bytes``: Mime's full-batch gradient, ``FULL_BATCH_ROWS``
  rows at a time), which runs before the local steps and so counts as their peak's
  alternative, not in addition.

Checked against XLA's own figures (``compiled.memory_analysis()``, the growth of the round's
temporary memory per client added to a chunk; ``tests/core/test_memory.py``) for every built-in
algorithm: on CPU the estimate lies between 1x and 4x of XLA's (1.5x to 3.7x with the MLP and a
short data order; FedAvgCM, GeL and SCAFFOLD with long orders and larger models within 3x), as
the program-order scan does not see the intermediates XLA fuses away.
It is meant as an upper bound that is not wasteful, to pick a chunk that fits.
"""
from __future__ import annotations

import math
import os
import resource

import jax
from jax.extend import core as jcore

from fedjax_gel.core.algorithm import ClientContext
from fedjax_gel.core.pre_pass import FULL_BATCH_ROWS
from fedjax_gel.core.round import tree_bytes
from fedjax_gel.core.shuffle import order_bytes


def host_bytes() -> int:
  """The host's physical memory in bytes."""
  return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')


def usable_bytes() -> int:
  """The memory this process may use, in bytes: the least of the host's physical memory
  (``host_bytes``), what its address-space limit leaves (``address_space_bytes``) and its
  cgroup's memory limit (``cgroup_bytes``). What the planner plans a host without accelerators
  with (``experiment.planning.memory_limit``)."""
  return min(x for x in (host_bytes(), address_space_bytes(), cgroup_bytes()) if x is not None)


# Address space a run takes beyond its peak when the planner asks: XLA's compiler and runtime
# threads (their stacks and malloc arenas), orbax's writers. The quickstart's run on 2 CPU cores
# peaked at 1.3 GiB of address space when planning and 1.7-1.8 GiB in all (VmPeak), and ran
# under a limit of 1.7 GiB.
ADDRESS_SPACE_MARGIN = 1 << 30


def address_space_bytes(status: str = '/proc/self/status') -> int | None:
  """What the process' address-space limit (``ulimit -v``: the soft ``RLIMIT_AS``) leaves for
  its data and programs: the limit less the process' peak address space so far (``status``'s
  ``VmPeak``: the interpreter, JAX's runtime and the libraries, which reserve far more than they
  touch, and the data loaded) and ``ADDRESS_SPACE_MARGIN``; None without a limit."""
  soft = resource.getrlimit(resource.RLIMIT_AS)[0]
  if soft == resource.RLIM_INFINITY:
    return None
  peak = 0
  try:
    with open(status) as f:
      peak = next((int(line.split()[1]) * 1024 for line in f if line.startswith('VmPeak:')), 0)
  except (OSError, ValueError, IndexError):
    pass
  return max(0, soft - peak - ADDRESS_SPACE_MARGIN)


def cgroup_bytes(cgroups: str = '/proc/self/cgroup', root: str = '/sys/fs/cgroup') -> int | None:
  """The memory limit of the process' cgroup (``cgroups`` names it, ``root`` is where the
  hierarchies are mounted): the least of its group's and those above it (each limits what it
  holds; a container that mounts its own group as the root sees that one), cgroup v2's
  ``memory.max`` ("max": none) or v1's ``memory/memory.limit_in_bytes`` (no limit reads as
  about 2**63); None without one."""
  try:
    with open(cgroups) as f:
      lines = f.read().splitlines()
  except OSError:
    return None
  limits = []
  for line in lines:
    fields = line.split(':', 2)   # ID:controllers:path; v2's has no controllers
    if len(fields) != 3:
      continue
    if not fields[1]:
      limits += _limits(root, fields[2], 'memory.max')
    elif 'memory' in fields[1].split(','):
      limits += _limits(os.path.join(root, 'memory'), fields[2], 'memory.limit_in_bytes')
  return min(limits, default=None)


def _limits(mount: str, group: str, name: str) -> list[int]:
  """The limits the files ``name`` of the cgroup ``group`` and the groups above it (in the
  hierarchy mounted at ``mount``) hold."""
  parts = [p for p in group.split('/') if p and p != '..']
  out = []
  for k in range(len(parts), -1, -1):
    try:
      with open(os.path.join(mount, *parts[:k], name)) as f:
        text = f.read().strip()
      if text != 'max':
        out.append(int(text))
    except (OSError, ValueError):
      pass
  return out


def _nbytes(v) -> int:
  aval = v.aval
  return math.prod(aval.shape) * aval.dtype.itemsize if hasattr(aval, 'shape') else 0


def _sub_jaxprs(eqn):
  for p in eqn.params.values():
    for sub in p if isinstance(p, (tuple, list)) else (p,):
      if isinstance(sub, jcore.ClosedJaxpr):
        yield sub.jaxpr
      elif isinstance(sub, jcore.Jaxpr):
        yield sub


def peak_bytes(jaxpr) -> int:
  """Peak bytes of the intermediates of ``jaxpr`` live at once (its inputs not counted).

  Each equation's outputs are live until their last use; an equation with inner programs
  (``pjit``, ``custom_vjp``, ``scan`` bodies) adds their own peak while it runs.
  """
  last = {}
  for i, eqn in enumerate(jaxpr.eqns):
    for v in eqn.invars:
      if isinstance(v, jcore.Var):
        last[v] = i
  for v in jaxpr.outvars:
    if isinstance(v, jcore.Var):
      last[v] = len(jaxpr.eqns)
  inputs = set(jaxpr.invars) | set(jaxpr.constvars)
  live = peak = 0
  for i, eqn in enumerate(jaxpr.eqns):
    inner = max((peak_bytes(s) for s in _sub_jaxprs(eqn)), default=0)
    peak = max(peak, live + inner + sum(_nbytes(v) for v in eqn.outvars))
    live += sum(_nbytes(v) for v in eqn.outvars if last.get(v, -1) > i)
    dead = {v for v in eqn.invars
            if isinstance(v, jcore.Var) and last.get(v) == i and v not in inputs}
    live -= sum(_nbytes(v) for v in dead)
  return peak


def _shapes(tree):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def client_bytes(algorithm, params, example_spec: dict, batch_size: int, max_budget: int) -> int:
  """Estimated device bytes one client of a chunk takes during a round of ``algorithm`` (a
  ``FederatedAlgorithm``; see the module doc). Traced with shapes only, nothing runs.
  ``example_spec``: one example's ``ShapeDtypeStruct`` per feature."""
  params = _shapes(params)
  scalar = lambda dtype: jax.ShapeDtypeStruct((), dtype)
  stored = None
  if algorithm.store_row is not None:   # this client's row of the store
    clients = jax.eval_shape(algorithm.server_init, params).clients
    stored = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), clients)
  extra = params if algorithm.pre_pass != 'none' else None
  ctx = ClientContext(scalar('int32'), scalar('int32'), scalar('int32'), scalar('float32'),
                      scalar('float32'), jax.eval_shape(lambda: jax.random.key(0)), extra,
                      stored)
  bcast = jax.eval_shape(algorithm.broadcast, jax.eval_shape(algorithm.server_init, params))
  state = jax.eval_shape(algorithm.client_init, bcast, ctx)
  upload = jax.eval_shape(algorithm.client_final, state, bcast, ctx)
  batch = {k: jax.ShapeDtypeStruct((batch_size,) + tuple(s.shape), s.dtype)
           for k, s in example_spec.items()}
  step = peak_bytes(jax.make_jaxpr(algorithm.client_step)(state, batch, bcast).jaxpr)
  return (order_bytes(max_budget * batch_size) + max(step, pre_pass_bytes(algorithm, bcast,
                                                                          batch))
          + tree_bytes((state, params, upload, extra, stored)) + 2 * tree_bytes(batch))


def pre_pass_bytes(algorithm, bcast, batch: dict) -> int:
  """The peak of the pre-pass (before the local steps, so not live with them): its rows
  (``FULL_BATCH_ROWS`` at a time for a full pass, else the first minibatch), their mask, the
  intermediates of ``pre_pass_fn`` on them and, for a full pass, the float32 running sum."""
  if algorithm.pre_pass == 'none':
    return 0
  rows = FULL_BATCH_ROWS if algorithm.pre_pass == 'full_batch' else None
  if rows is not None:
    batch = {k: jax.ShapeDtypeStruct((rows,) + s.shape[1:], s.dtype) for k, s in batch.items()}
  batch = dict(batch, mask=jax.ShapeDtypeStruct(next(iter(batch.values())).shape[:1], 'bool'))
  jaxpr = jax.make_jaxpr(algorithm.pre_pass_fn)(bcast, batch)
  value = jax.eval_shape(algorithm.pre_pass_fn, bcast, batch)
  running = sum(4 * math.prod(x.shape) for x in jax.tree.leaves(value)) if rows else 0
  return peak_bytes(jaxpr.jaxpr) + tree_bytes(batch) + tree_bytes(value) + running
