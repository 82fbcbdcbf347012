"""The routing stage of a round: which chunk, and on a mesh which device, trains each client of the
cohort, and the loop over the chunks.

* One device (``on_one_device``): the cohort, padded and sorted by budget (``pad_and_sort``), is
  cut into equal chunks and a scan runs over them, adding each chunk's ``ChunkTotals``.
* A mesh (``on_mesh``, owner computes): each device trains, chunk by chunk, the clients whose
  examples (and store rows) it holds (``route``), or, with the pool whole on every device, its
  share of the cohort dealt by budget (``deal``); the devices' totals meet in one ``psum``.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from fedjax_gel.core import federated_data
from fedjax_gel.core import store as store_lib
from fedjax_gel.core.chunk import upload_types
from fedjax_gel.core.devices import CLIENT_AXIS
from fedjax_gel.core.federated_data import FederatedData
from fedjax_gel.core.sampling import Cohort

tree_map = jax.tree_util.tree_map

# On a mesh each device cuts its share of the cohort into chunks of at most 1/ROUTED_CHUNKS of
# the mean share, so that the shares' imbalance and the padding of each device's last chunk
# cost little: 1,000 clients over 4 devices (16 a chunk) computed 0.97 real slots, against 0.67
# with one 250-client chunk a device (benchmarks/population_sharding.py).
ROUTED_CHUNKS = 16


class Clients(NamedTuple):
  """The per-client inputs of the chunks, each ``[num_chunks, chunk_size]``."""
  client_ids: jax.Array
  budgets: jax.Array
  weights: jax.Array
  guesses: jax.Array
  slots: jax.Array     # positions in the sampled cohort (for the clients' keys)
  valid: jax.Array     # real clients (not padding)


def pad_and_sort(cohort: Cohort, guesses, num_chunks: int, chunk_size: int) -> Clients:
  """Pads the cohort to ``num_chunks * chunk_size`` with empty clients, sorts it by budget and
  cuts it into ``[num_chunks, chunk_size]``. Padding clients and absent slots
  (``Cohort.present``) have budget 0 and weight 0, so they sort into the first (cheapest)
  chunk; neither is valid."""
  size = cohort.budgets.shape[0]
  pad = num_chunks * chunk_size - size
  fields = [jnp.pad(a, (pad, 0)) for a in (cohort.client_ids, cohort.budgets, cohort.weights,
                                            guesses)]
  slots = jnp.arange(-pad, size, dtype=jnp.int32)
  valid = jnp.pad(cohort.taking_part, (pad, 0))
  order = jnp.argsort(fields[1], stable=True)
  shape = (num_chunks, chunk_size)
  return Clients(*(a[order].reshape(shape) for a in fields),
                 jnp.maximum(slots[order], 0).reshape(shape), valid[order].reshape(shape))


def route(cohort: Cohort, guesses, owned: int, num_clients: int, num_devices: int,
          capacity: int) -> Clients:
  """Sends each client of the cohort to the device that owns it (device ``d`` owns clients
  ``d owned .. (d + 1) owned - 1``, ``federated_data.clients_per_owner``): leaves
  ``[num_devices, capacity]``, row ``d`` holding device ``d``'s clients sorted by budget, then
  padding slots (budget 0, weight 0, not valid) naming a client the device owns. Absent slots
  (``Cohort.present``) go to no device."""
  size = cohort.budgets.shape[0]
  owner = jnp.where(cohort.taking_part, jnp.minimum(cohort.client_ids // owned,
                                                    num_devices - 1), num_devices)
  order = jnp.lexsort((cohort.budgets, owner))          # by owner, then by budget; absent last
  share = jnp.zeros((num_devices,), jnp.int32).at[owner].add(1, mode='drop')
  slot = jnp.arange(capacity)[None, :]
  valid = slot < share[:, None]
  src = order[jnp.minimum((jnp.cumsum(share) - share)[:, None] + slot, size - 1)]
  own = jnp.minimum(jnp.arange(num_devices, dtype=jnp.int32) * owned, num_clients - 1)
  return device_slots(cohort, guesses, src, valid, own[:, None])


def deal(cohort: Cohort, guesses, num_devices: int, capacity: int) -> Clients:
  """The cohort sorted by budget and dealt to the devices like cards (``[num_devices,
  capacity]``): device ``d`` gets the clients at sorted positions ``d, d + D, d + 2D, ...``, so
  every device trains the same number of clients (one more at most) with about the same steps,
  each row still sorted by budget; then padding slots (client 0, budget 0, weight 0, not valid).
  Absent slots (``Cohort.present``) are dealt to no device. For a pool every device holds
  whole (``to_device(data, mesh, replicate=True)``)."""
  size = cohort.budgets.shape[0]
  present = cohort.taking_part
  # absent slots last: one past any budget
  order = jnp.argsort(jnp.where(present, cohort.budgets, jnp.iinfo(jnp.int32).max), stable=True)
  pos = jnp.arange(capacity)[None, :] * num_devices + jnp.arange(num_devices)[:, None]
  valid = pos < jnp.sum(present)
  return device_slots(cohort, guesses, order[jnp.minimum(pos, size - 1)], valid, 0)


def device_slots(cohort: Cohort, guesses, src, valid, pad_id) -> Clients:
  """The devices' slots ``[num_devices, capacity]``: cohort client ``src`` where ``valid``,
  else a padding slot naming client ``pad_id`` (budget 0, weight 0, not valid)."""
  pick = lambda a, pad: jnp.where(valid, a[src], pad)
  return Clients(pick(cohort.client_ids, pad_id), pick(cohort.budgets, 0),
                 pick(cohort.weights, 0.), pick(guesses, 0.),
                 pick(jnp.arange(cohort.budgets.shape[0], dtype=jnp.int32), 0), valid)


def chunk_layout(cohort_size: int, chunk_size: int, num_devices: int = 1) -> tuple[int, int]:
  """``(clients per chunk, chunks)``: equal chunks of at most ``chunk_size`` clients, rounded up
  to a multiple of ``num_devices``."""
  chunk = math.ceil(cohort_size / math.ceil(cohort_size / min(chunk_size, cohort_size)))
  chunk = math.ceil(chunk / num_devices) * num_devices
  return chunk, math.ceil(cohort_size / chunk)


def routed_chunk(cohort_size: int, chunk_size: int, num_devices: int) -> int:
  """Clients per chunk on each device of a mesh: a device's slice of ``chunk_layout``'s chunk,
  at most ``1 / ROUTED_CHUNKS`` of its mean share of the cohort."""
  return min(chunk_layout(cohort_size, chunk_size, num_devices)[0] // num_devices,
             max(1, -(-cohort_size // (num_devices * ROUTED_CHUNKS))))


def on_one_device(algorithm, chunk_size: int, server_state, cohort: Cohort, guesses, bcast,
                  data: FederatedData, client_key_root, train_chunk, chunk_totals):
  """The chunks one after another on one device (a scan, adding each chunk's ``ChunkTotals``).
  Returns ``(totals, written, clients, uploads)``: the round's totals, the chunks' new rows
  and real-client masks (stateful algorithms, else None), the clients ``[chunks, chunk]`` and
  one client's upload (``upload_types``)."""
  stateful = algorithm.store_row is not None
  clients = pad_and_sort(cohort, guesses, *chunk_layout(cohort.budgets.shape[0], chunk_size)[::-1])
  chunks = (clients, store_lib.rows_of(algorithm, server_state, clients.client_ids))

  def body(acc, chunk):
    add, rows = chunk_totals(bcast, data, client_key_root, chunk)
    return tree_map(jnp.add, acc, add), rows if stateful else None

  first = tree_map(lambda a: a[0], chunks)   # a chunk as the loop traces it
  acc0 = jax.eval_shape(chunk_totals, bcast, data, client_key_root, first)[0]
  acc0 = tree_map(lambda s: jnp.zeros(s.shape, s.dtype), acc0)
  totals, written = jax.lax.scan(body, acc0, chunks)
  return totals, written, clients, upload_types(train_chunk, bcast, data, client_key_root, first)


def mesh_slots(algorithm, mesh, chunk_size: int, server_state, cohort: Cohort, guesses,
               num_clients: int, replicated: bool) -> tuple[Clients, int, bool]:
  """The cohort's slots on the devices (``[devices, capacity]``: ``route``d to their owners, or
  ``deal``t where the pool is whole on every device), the clients per chunk on each device, and
  whether the store is split by client; refuses a store that cannot be read that way."""
  num_devices = mesh.shape[CLIENT_AXIS]
  owned = federated_data.clients_per_owner(num_clients, num_devices)
  size = cohort.budgets.shape[0]
  per_device = routed_chunk(size, chunk_size, num_devices)
  capacity = -(-size // per_device) * per_device
  routed = (deal(cohort, guesses, num_devices, capacity) if replicated else
            route(cohort, guesses, owned, num_clients, num_devices, capacity))
  # computed whole on every device (a few integers per client): else XLA splits the routing's
  # prefix sum over the devices, a collective every round
  routed = jax.lax.with_sharding_constraint(routed, jax.sharding.NamedSharding(mesh, P()))
  split = algorithm.store_row is not None and store_lib.split_by_client(algorithm)
  if split and replicated:
    raise ValueError(f'round_fn: {algorithm.name} keeps its per-client store split by client, '
                     'which needs the pool split by client too; pass '
                     'fedjax_gel.to_device(data, mesh) without replicate')
  if split and store_lib.num_rows(server_state.clients) != owned * num_devices:
    raise ValueError(f'round_fn: a store of {store_lib.num_rows(server_state.clients)} rows '
                     f'for {num_clients} clients on {num_devices} devices; place the state '
                     'with fedjax_gel.core.store.place_state(state, algorithm, mesh)')
  return routed, per_device, split


def on_mesh(algorithm, mesh, chunk_size: int, server_state, cohort: Cohort, guesses, bcast,
            data: FederatedData, client_key_root, train_chunk, chunk_totals, replicated: bool):
  """Owner computes: each device trains, chunk by chunk, its slots of ``mesh_slots``; the
  totals meet in one ``psum``. Returns ``on_one_device``'s four, ``written``'s leaves
  ``[devices, capacity, ...]`` and the clients ``[devices, capacity]``."""
  stateful = algorithm.store_row is not None
  num_clients = data.counts.shape[0]
  routed, per_device, split = mesh_slots(algorithm, mesh, chunk_size, server_state, cohort,
                                         guesses, num_clients, replicated)
  owned = federated_data.clients_per_owner(num_clients, mesh.shape[CLIENT_AXIS])
  capacity = routed.valid.shape[1]
  uploads = []

  def device(bcast, examples, offsets, counts, key_root, routed, store):
    d = jax.lax.axis_index(CLIENT_AXIS)
    # this device's first pool row: its block's, or the whole pool's
    base = 0 if replicated else jax.tree.leaves(examples)[0].shape[0] * d
    local = FederatedData(examples, offsets - base, counts)
    chunks = tree_map(lambda a: a.reshape(-1, per_device), routed)   # [chunks, per_device]

    def stored_rows(ids):
      if not stateful:
        return None
      return store_lib.gather(store, ids - d * owned if split else algorithm.store_row(ids))

    def body(c, carry):
      acc, written = carry
      chunk = tree_map(lambda a: a[c], chunks)
      add, rows = chunk_totals(bcast, local, key_root, (chunk, stored_rows(chunk.client_ids)))
      if stateful:
        written = tree_map(lambda w, r: w.at[c].set(r), written, rows)
      return tree_map(jnp.add, acc, add), written

    first = tree_map(lambda a: a[0], chunks)
    first = (first, stored_rows(first.client_ids))   # a chunk as ``body`` passes it
    shapes = jax.eval_shape(chunk_totals, bcast, local, key_root, first)
    # read where the devices trace their chunks (the trace ``chunk_totals`` just made)
    uploads.append(upload_types(train_chunk, bcast, local, key_root, first))
    zeros = lambda tree, lead=(): tree_map(lambda x: jnp.zeros(lead + x.shape, x.dtype), tree)
    written = zeros(shapes[1], (chunks.valid.shape[0],)) if stateful else None
    trips = -(-jnp.sum(routed.valid) // per_device)     # this device's chunks with clients
    acc, written = jax.lax.fori_loop(0, trips, body, (zeros(shapes[0]), written))
    written = tree_map(lambda w: w.reshape((1, capacity) + w.shape[2:]), written)
    return jax.lax.psum(acc, CLIENT_AXIS), written

  run = jax.shard_map(
      device, mesh=mesh, check_vma=False,
      in_specs=(P(), P() if replicated else P(CLIENT_AXIS), P(), P(), P(), P(CLIENT_AXIS),
                P(CLIENT_AXIS) if split else P()),
      out_specs=(P(), P(CLIENT_AXIS)))
  totals, written = run(bcast, data.examples, data.offsets, data.counts, client_key_root,
                        routed, server_state.clients if stateful else None)
  return totals, written, routed, uploads[0]
