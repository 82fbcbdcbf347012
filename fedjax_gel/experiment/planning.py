"""The memory and device planner: how many devices a run's cohort is spread over, how many
clients a chunk holds (``default_chunk_size``, the one chunk rule of runs, batches of runs and
benchmarks; the engine, ``core.round``, only lays a given chunk size out) and how many runs one
program trains, decided before anything compiles.

One rule for single runs, batches of runs (seeds, grids) and the benchmarks: a chunk's working
set (``core.memory.client_bytes`` per client) must fit in ``CHUNK_MEMORY_FRACTION`` of what each
device has left after the data, the server state and the per-client store.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import numpy as np

from fedjax_gel.core import backend, devices, federated_data, memory, shuffle, store
from fedjax_gel.core import round as round_lib
from fedjax_gel.experiment.config import CohortConfig, Config, ConfigError
from fedjax_gel.models.base import num_params


class MemoryPlan(NamedTuple):
  """What the memory guard knows before compiling (``fit_memory``)."""
  client_bytes: int   # one client's working set in a chunk (``core.memory.client_bytes``)
  free_bytes: int     # per device, after the data and the server state; the store not included
  devices: int        # devices a chunk is spread over with their own memory (1: shared, CPU)


def example_bytes(data: federated_data.FederatedData) -> int:
  """Bytes of one example (of every feature), from the pool's shapes."""
  return sum(math.prod(np.shape(v)[1:]) * np.dtype(v.dtype).itemsize
             for v in data.examples.values())


def pool_bytes(data: federated_data.FederatedData) -> int:
  """Bytes of the whole training pool: its rows, what a copy of it holds (clients tiled over
  the same rows count them once)."""
  return data.num_examples * example_bytes(data)


def replicate_pool(algorithm, data, mesh, memory_bytes: int | None = None) -> bool:
  """Whether the training pool goes whole on every device of ``mesh``
  (``federated_data.to_device(..., replicate=True)``), so that the round deals the cohort to
  the devices by budget (``core.round.deal``), rather than split by client with every client
  trained on the device that owns it: in one process, for an algorithm whose per-client store
  (if any) is not split by client, when the copies one memory holds (``devices_per_memory``)
  take at most ``REPLICATED_POOL_FRACTION`` of it (``memory_bytes``, default
  ``memory_limit()``). A large population stays split (``benchmarks/population_sharding.py``)."""
  if mesh is None or jax.process_count() > 1 or store.split_by_client(algorithm):
    return False
  budget = REPLICATED_POOL_FRACTION * (memory_bytes or memory_limit())
  return devices_per_memory(mesh.size) * pool_bytes(data) <= budget


def memory_limit(gib: float = 0.) -> int:
  """Bytes one device may use: ``gib`` (``--device_memory_gb``) when positive, else the
  accelerator's limit, or what the process may use of the host's memory
  (``core.memory.usable_bytes``: its physical memory, ``ulimit -v`` and the cgroup's limit)."""
  if gib > 0:
    return int(gib * 2**30)
  stats = jax.local_devices()[0].memory_stats() or {}
  if 'bytes_limit' in stats:
    return int(stats['bytes_limit'])
  return memory.usable_bytes()


# A chunk's working set may take this much of the memory left after the data, the server state
# and the per-client store (the rest: XLA's own buffers and the estimate's error).
CHUNK_MEMORY_FRACTION = 0.75
# A pool whose copies (one per device in a memory) take at most this fraction of it is placed
# whole on every device (``replicate_pool``): 1.5 GiB of copies on a 24 GiB host, where a
# split pool would take half of that on 2 CPU devices.
REPLICATED_POOL_FRACTION = 1 / 16


def memory_plan(c: Config, params, algorithm, train, pools, num_devices: int,
                replicated: bool = False) -> MemoryPlan:
  """The memory of one client of a chunk and what is free for chunks on each device
  (``params``: the model's parameters or their shapes; ``train``: the training pool).

  Resident on each device: its block of the training pool (split by client,
  ``federated_data.owner_layout``; ``replicated``: the whole pool, ``replicate_pool``), the
  evaluation pools (on the first device, counted on every one: the plan holds for the
  fullest) and about four copies of the server model (the state, its optimiser and the donated
  copy). CPU devices are one host's cores: there the host holds the blocks (or copies) of all
  of them and the evaluation pools once.
  """
  spec = {k: jax.ShapeDtypeStruct(np.shape(v)[1:], v.dtype) for k, v in train.examples.items()}
  per_client = memory.client_bytes(algorithm, params, spec, c.cohort.batch_size,
                                    c.cohort.spec(train.counts).max_budget)
  block = (pool_bytes(train) if replicated else
           federated_data.owner_blocks(train.counts, num_devices)[1] * example_bytes(train))
  sharing = devices_per_memory(num_devices)
  data = block * sharing + round_lib.tree_bytes(pools)
  free = memory_limit(c.run.device_memory_gb) - data - 4 * round_lib.tree_bytes(params)
  return MemoryPlan(per_client, free, 1 if sharing > 1 else num_devices)


def devices_per_memory(num_devices: int) -> int:
  """Devices of a mesh of ``num_devices`` whose blocks one memory holds: on CPU this process'
  devices (cores of one host), else 1."""
  if jax.default_backend() != 'cpu':
    return 1
  return max(1, num_devices // jax.process_count())


def chunk_capacity(plan: MemoryPlan, store_need: int) -> int:
  """Clients one chunk can hold, over all its devices."""
  room = int(CHUNK_MEMORY_FRACTION * (plan.free_bytes - store_need))
  return max(0, room // plan.client_bytes) * plan.devices


def fit_memory(exp):
  """The memory guard, before anything compiles: a per-client store that cannot fit
  fails (``check_store_memory``); a chunk larger than the memory left holds is shrunk to what
  fits, with a note; a single client that cannot fit fails with one line saying what it needs."""
  c, k = exp.config, exp.config.cohort
  params = jax.eval_shape(exp.model.init, jax.random.key(0))
  num_devices = 1 if exp.mesh is None else exp.mesh.size
  store_need = check_store_memory(c, exp.algorithm, params, num_devices)
  fits = chunk_capacity(exp.memory, store_need)
  gib = lambda b: f'{b / 2**30:.3g} GiB'
  if exp.memory.free_bytes - store_need <= 0:
    raise ConfigError(
        f'--dataset={c.data.dataset}: the data, the model and the client state take more than the '
        f'{gib(memory_limit(c.run.device_memory_gb))} of device memory; use a smaller dataset or '
        'model, or more processes or devices')
  if fits < 1:
    raise ConfigError(
        f'--budget_range={k.budget_range[0]},{k.budget_range[1]} with --batch_size='
        f'{k.batch_size}: one client needs about {gib(exp.memory.client_bytes)} in a round, but '
        f'only {gib(max(0, exp.memory.free_bytes - store_need))} of device memory is left after '
        'the data and model; lower the budgets or the batch size')
  if exp.chunk_size <= fits:
    return exp
  asked = f'--chunk_size={c.run.chunk_size}' if c.run.chunk_size else f'the automatic {exp.chunk_size}'
  note = (f'{asked} clients per chunk would need about '
          f'{exp.chunk_size * exp.memory.client_bytes / 2**30:.1f} GiB; running {fits} per chunk '
          'to fit the device memory')
  return exp._replace(chunk_size=fits, notes=exp.notes + (note,))


CPU_CHUNK_BYTES = 16 << 20   # per device: chunks about this size run fastest on CPU caches
# Heterogeneous budgets: at least this many budget-sorted chunks, each looping to its own
# largest tau_i (benchmarks/heterogeneous_budgets.py: 1 chunk wastes a third of the steps of
# tau_i ~ U{1..50}, 16 chunks 3%), but no chunk below MIN_CHUNK_PER_DEVICE clients per device.
HETEROGENEOUS_CHUNKS = 16
MIN_CHUNK_PER_DEVICE = 32


def default_chunk_size(cohort_size: int, params, example_bytes: int, batch_size: int,
                       num_devices: int = 1, state_copies: int = 8,
                       memory_bytes: int | None = None,
                       equal_budgets: bool = True) -> int:
  """Clients per chunk from the model size and the memory to hold them.

  A client holds about ``state_copies`` model-sized buffers (params, optimiser state, gradient,
  the masked and unmasked step results, the upload) and one minibatch. The chunk's working set
  may take a quarter of ``memory_bytes`` when given; otherwise a quarter of each accelerator's
  memory, or on CPU ``CPU_CHUNK_BYTES`` per device (cache-sized chunks are fastest there; larger
  ones only add memory traffic). With budgets that differ (``equal_budgets`` False) and each
  chunk looping to its own largest budget (the round's default on CPU,
  ``core.backend.default_static_steps``) the cohort is also cut into about
  ``HETEROGENEOUS_CHUNKS`` chunks, so that few masked steps are computed. On an accelerator every
  chunk loops to the largest budget, so more chunks only run more, smaller loops (on an H100 a
  10,000-client round took about three times as long in 16 chunks as in one, ``docs/speed.md``).
  """
  if memory_bytes is not None:
    budget = memory_bytes // 4
  elif jax.default_backend() == 'cpu':
    budget = CPU_CHUNK_BYTES * num_devices
  else:
    stats = jax.local_devices()[0].memory_stats() or {}
    budget = int(stats.get('bytes_limit', 4 << 30)) // 4 * num_devices
  model_bytes = round_lib.tree_bytes(params)
  per_client = state_copies * model_bytes + 2 * batch_size * example_bytes
  chunk = max(1, min(cohort_size, budget // max(per_client, 1)))
  if not backend.default_static_steps(equal_budgets):
    floor = MIN_CHUNK_PER_DEVICE * num_devices
    chunk = min(chunk, max(floor, math.ceil(cohort_size / HETEROGENEOUS_CHUNKS)))
  return chunk


def devices_and_chunk(algorithm, params, data, cohort_size: int, batch_size: int,
                      equal_budgets: bool, num_devices: int = 0,
                      chunk_size: int = 0, memory_bytes: int | None = None) -> tuple:
  """``(mesh, chunk)`` of one run's cohort: ``num_devices`` (0: ``auto_num_devices``) on the
  ``'clients'`` mesh (None for one), and ``chunk_size`` (0: ``default_chunk_size`` for the
  budgets: ``equal_budgets``, every client takes as many steps) clients per chunk, at most the
  cohort. The rule of every run, batch and benchmark;
  ``params``: the model's parameters or their shapes, ``data``: the training pool;
  ``memory_bytes``: each device's (default ``memory_limit()``)."""
  if jax.process_count() > 1:   # several processes: every program spans all their devices
    num_devices = jax.device_count()
  mesh = devices.client_mesh(num_devices or auto_num_devices(
      cohort_size, store_bytes(algorithm, params), memory_bytes or memory_limit(),
      jax.device_count(), shared_memory=jax.default_backend() == 'cpu',
      client_step_work=batch_size * num_params(params)))
  used = 1 if mesh is None else mesh.size
  chunk = chunk_size or default_chunk_size(
      cohort_size, params, example_bytes(data), batch_size, used, equal_budgets=equal_budgets)
  return mesh, min(chunk, cohort_size)


def store_bytes(algorithm, params, num_devices: int = 1) -> int:
  """Bytes of the per-client store on each device (0 for algorithms without client state)."""
  if algorithm.store_row is None:
    return 0
  clients = jax.eval_shape(algorithm.server_init, params).clients
  rows = -(-store.num_rows(clients) // num_devices)
  return rows * store.row_bytes(clients)


def auto_num_devices(cohort_size: int, store_size: int, memory: int, available: int,
                     shared_memory: bool = False, client_step_work: int = 0) -> int:
  """``--num_devices=0``: every device for cohorts with enough work
  (``core.devices.auto_num_devices``; ``client_step_work``: one client's local step, ``B`` x
  parameters) or for a per-client store that would take more than half of one device's memory,
  else one. ``shared_memory``: the devices share one memory (CPU cores), so spreading saves
  none."""
  if store_size > memory // 2 and not shared_memory:
    return available
  return devices.auto_num_devices(cohort_size, available, client_step_work)



def check_store_memory(c: Config, algorithm, params, num_devices: int) -> int:
  """Bytes of the per-client store in each memory, with the round's three cohort-sized copies
  of rows; fails early when they cannot fit in half of it.

  A store split by client (``core.store.by_client``) puts ``1 / num_devices`` of its rows on
  each device, another a whole copy; CPU devices are cores of one host, whose memory holds the
  rows of all of this process' devices (``devices_per_memory``).
  """
  if algorithm.store_row is None:
    return 0
  clients = jax.eval_shape(algorithm.server_init, params).clients
  row = store.row_bytes(clients)
  split = num_devices if store.split_by_client(algorithm) else 1
  sharing = devices_per_memory(num_devices)
  # The store's share of each memory, and the cohort's gathered, new and averaged rows.
  need = (-(-store.num_rows(clients) // split) * row * (sharing if split > 1 else 1) +
          3 * c.cohort.clients_per_round * row)
  have = memory_limit(c.run.device_memory_gb)
  if need > have // 2:
    where = f'{num_devices} device(s)' + (f' of {jax.process_count()} processes'
                                          if jax.process_count() > 1 else '')
    raise ConfigError(
        f'--algorithm={c.algorithm.name} keeps {row} bytes of state for each of '
        f'{store.num_rows(clients)} clients: {need / 2**30:.2f} GiB per memory on {where}, more '
        f'than half of the {have / 2**30:.2f} GiB available; use fewer clients or a smaller '
        'model, or split it over more devices or processes (--num_devices, --num_processes)')
  return need



def batchable(exp) -> bool:
  """Whether ``exp``'s runs can be vmapped together: one device (a mesh splits one run's
  cohort), no per-client store and no power-of-d selection (which reads each run's model)."""
  return (exp.mesh is None and exp.algorithm.store_row is None and
          exp.config.cohort.client_selection != 'power_of_d')


def runs_chunk_size(exp, num_runs: int, same_cohorts: bool = False) -> int:
  """Clients per chunk and run when ``num_runs`` runs of ``exp`` are one program. 0: not even
  one client per run fits the memory guard's capacity (``chunk_capacity``, shared among them).

  Runs with their own cohorts (other seeds) keep one run's chunk (``exp.chunk_size``, sized for
  one run's budgets), or less where the memory of one automatic chunk of all their cohorts
  together (``default_chunk_size`` of ``num_runs x C`` clients) holds fewer. Runs that
  share their cohorts (``same_cohorts``: a learning-rate grid's cells, one seed) share the budget
  of every slot too, so the whole batch is chunked as one cohort of ``num_runs x C`` clients with
  its budgets (on the GeL Fig. 7 grid, 100 cells of 20 clients: 1 client per cell and chunk,
  about 4x faster than one run's 13).
  """
  k = exp.config.cohort
  fits = chunk_capacity(exp.memory, 0) // num_runs
  if num_runs == 1 or fits < 1:
    return min(exp.chunk_size, fits)
  params = jax.eval_shape(exp.model.init, jax.random.key(0))
  spec = k.spec(exp.train.counts)
  total = default_chunk_size(
      spec.cohort_size * num_runs, params, example_bytes(exp.train), k.batch_size,
      equal_budgets=not same_cohorts or spec.equal_budgets)
  if same_cohorts:
    chunk = exp.config.run.chunk_size or total // num_runs   # --chunk_size: per cell
    return max(1, min(chunk, spec.cohort_size, fits))
  return max(1, min(exp.chunk_size, total // num_runs, fits))


def check_runs_fit(exp, num_runs: int, what: str) -> int:
  """``runs_chunk_size``, or a ConfigError saying that ``what`` (e.g. ``'--server_lr_grid'``)
  asks for more runs than one program can hold."""
  chunk = runs_chunk_size(exp, num_runs, same_cohorts=True)
  if chunk < 1:
    raise ConfigError(
        f'{what}: {num_runs} runs of one client each need about '
        f'{num_runs * exp.memory.client_bytes / 2**30:.2f} GiB in a round, more than the '
        f'{CHUNK_MEMORY_FRACTION * exp.memory.free_bytes / 2**30:.2f} GiB the device memory has '
        'for it; use fewer learning rates or seeds')
  return chunk


# A round of at most this many multiply-adds of a forward pass (clients x mean budget x batch x
# parameters; 20 clients of the quickstart: 260,000) is compiled for compile time
# (``core.backend.xla.QUICK_COMPILE``): it saves 0.3-0.5 s per program, and XLA's legacy emitters run
# a round this small as fast; larger rounds run up to 1.4x faster with XLA's defaults
# (docs/speed.md, start-up; jaxlib < 0.11, which has the legacy emitters: with a later
# one every program is compiled with XLA's defaults). The rule reads neither the rounds nor the
# runs of a program, so a run's numbers do not depend on how many rounds or runs it shares a
# program with.
QUICK_COMPILE_MAX_ROUND_WORK = 1_000_000


def quick_compile(k: CohortConfig, params, counts=None) -> bool:
  """Whether an experiment's programs are compiled for compile time: its round's work
  (``k``: the cohort section; ``params``: the model's parameters or their shapes; ``counts``:
  the clients' example counts, which set the steps of a budget in epochs) is small."""
  size = sum(math.prod(p.shape) for p in jax.tree.leaves(params))
  mean_budget = (k.budget_range[0] + k.budget_range[1]) / 2
  if k.budget_unit == 'epochs':
    mean_budget *= float(np.mean(shuffle.epoch_steps(np.asarray(counts), k.batch_size)))
  return k.clients_per_round * mean_budget * k.batch_size * size <= QUICK_COMPILE_MAX_ROUND_WORK
