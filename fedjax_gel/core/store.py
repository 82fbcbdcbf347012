"""The per-client state store: one device-resident pytree with leaves ``[rows, ...]``.

SCAFFOLD's ``c_i``, FedDyn's and AdaBest's ``h_i`` and FedVARP's memory ``y_i`` live here, a
row per client (or per cluster: ClusterFedVARP). The round gathers the cohort's rows, hands each
client its row, and writes back the rows the clients return, all inside the compiled round:
nothing goes through the host.

* **Writes are means.** When several real clients of a round write one row (a client sampled
  twice with replacement; the clients of one cluster), the row becomes the mean of what they
  wrote. Every duplicate writes the same value, so the scatter is deterministic.
* **Sharding.** With a mesh, a store of one row per client (``store_row=by_client``) is split
  like the clients' data: :func:`place` pads its rows to a multiple of the devices and splits
  them over the ``'clients'`` axis, and each device reads and writes the rows of its own clients
  (``core.round``). Other stores stay whole on every device. Padding rows are never read.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from fedjax_gel.core import devices
from fedjax_gel.core.checks import positive_int
from fedjax_gel.core.devices import CLIENT_AXIS

tree_map = jax.tree_util.tree_map


def zeros(row, rows: int):
  """A store of ``rows`` zero rows shaped like ``row`` (a pytree of arrays or shape structs)."""
  rows = positive_int('store', 'rows', rows)
  return tree_map(lambda x: jnp.zeros((rows,) + tuple(x.shape), x.dtype), row)


def num_rows(store) -> int:
  return jax.tree_util.tree_leaves(store)[0].shape[0]


def row_bytes(store) -> int:
  """Bytes of one row."""
  return sum(math.prod(x.shape[1:]) * jnp.dtype(x.dtype).itemsize
             for x in jax.tree_util.tree_leaves(store))


def gather(store, idx):
  """Rows ``store[idx]``, any index shape."""
  return tree_map(lambda s: s[idx], store)


def rows_of(algorithm, server_state, client_ids):
  """The clients' rows of the server state's store (``algorithm.store_row``; any index shape),
  or None for an algorithm without one."""
  if algorithm.store_row is None:
    return None
  return gather(server_state.clients, algorithm.store_row(client_ids))


def write_mean(store, idx, new, writes):
  """Writes the mean of ``new`` over the writers of each row; other rows keep their values.

  Args:
    store: leaves ``[rows, ...]``.
    idx: int ``[W]`` row of each writer.
    new: leaves ``[W, ...]``, what each writer wrote.
    writes: bool ``[W]``; False drops the writer (padding, clients that did no work).
  """
  rows, count = num_rows(store), idx.shape[0]
  idx = jnp.where(writes, idx, rows)                   # dropped writers go past the end
  order = jnp.argsort(idx, stable=True)
  sorted_idx = idx[order]
  first = jnp.concatenate([jnp.ones((1,), bool), sorted_idx[1:] != sorted_idx[:-1]])
  segment = jnp.cumsum(first) - 1                      # writers of one row share a segment
  writers = jax.ops.segment_sum(jnp.ones((count,), jnp.float32), segment, count,
                                indices_are_sorted=True)

  def put(s, n):
    n = jnp.where(writes.reshape((-1,) + (1,) * (n.ndim - 1)), n, 0)[order].astype(jnp.float32)
    sums = jax.ops.segment_sum(n, segment, count, indices_are_sorted=True)
    scale = (1. / jnp.maximum(writers, 1.)).reshape((-1,) + (1,) * (n.ndim - 1))
    means = (sums * scale)[segment]
    if jnp.issubdtype(s.dtype, jnp.integer):
      means = jnp.round(means)
    return s.at[sorted_idx].set(means.astype(s.dtype), mode='drop')

  return tree_map(put, store, new)



def write_back(algorithm, mesh, store, written, ids):
  """The store with the rows a round's clients returned written (``written``: their rows and
  real-client masks, leading axes matching ``ids``; ``write_mean``): on a mesh with the store
  split by client, each device into its own rows."""
  new_rows, real = written
  if mesh is None or not split_by_client(algorithm):
    flat = lambda a: a.reshape((-1,) + a.shape[ids.ndim:])
    new = write_mean(store, algorithm.store_row(ids).reshape(-1), tree_map(flat, new_rows),
                     flat(real))
    return constrain(new, mesh, split=False)
  owned = num_rows(store) // mesh.shape[CLIENT_AXIS]

  def device(part, ids, new_rows, real):
    rows = ids[0] - jax.lax.axis_index(CLIENT_AXIS) * owned
    return write_mean(part, rows, tree_map(lambda a: a[0], new_rows), real[0])
  return jax.shard_map(device, mesh=mesh, in_specs=P(CLIENT_AXIS), out_specs=P(CLIENT_AXIS),
                       check_vma=False)(store, ids, new_rows, real)

def by_client(ids):
  """``store_row`` of a store with one row per client, row ``i`` client ``i``'s. On a mesh the
  engine splits such a store's rows as it splits the clients' data
  (``federated_data.clients_per_owner``): each device holds, reads and writes only the rows of
  the clients it owns. A store indexed any other way (e.g. by cluster) is kept whole on every
  device."""
  return ids


class ByTable:
  """``store_row`` of a store with a row per group (ClusterFedVARP's clusters): client ``i``
  reads and writes row ``table[i]``; the table has one entry per client of the population.
  ``where`` names the argument in the ValueError for a table that is not one non-negative
  integer per client."""

  def __init__(self, table, where: str = 'store: the row table'):
    table = np.asarray(table)
    if (table.ndim != 1 or not len(table) or not np.issubdtype(table.dtype, np.integer) or
        table.min() < 0):
      raise ValueError(f'{where} must give one non-negative integer row per client (got '
                       f'{table.dtype} {table.shape}{f", min {table.min()}" if table.size else ""})')
    self.table, self.rows = table.astype(np.int32), int(table.max()) + 1

  def __call__(self, ids):
    return jnp.asarray(self.table)[ids]


def check_rows(algorithm, clients_store, num_clients: int, mesh=None):
  """A stateful algorithm's store against the population of ``num_clients`` clients the round
  draws from, else a ValueError (one line): a row past the store's end would be read as its last
  row, and a mean over rows no client owns would be diluted. A store of one row per client
  (``by_client``) has ``num_clients`` rows (on a mesh, the padded rows of ``place``, which
  ``core.round`` checks); a ``ByTable`` store has a table entry per client and a row for every
  entry. Other ``store_row`` functions are the algorithm's own and are not checked."""
  rows, row_of = num_rows(clients_store), algorithm.store_row
  if row_of is by_client and mesh is None and rows != num_clients:
    raise ValueError(f'round_fn: {algorithm.name} keeps a row per client, and its store has '
                     f'{rows} rows for a population of {num_clients} clients; build it for the '
                     f"pool's {num_clients} clients")
  if isinstance(row_of, ByTable) and (len(row_of.table) != num_clients or row_of.rows > rows):
    raise ValueError(f'round_fn: {algorithm.name} maps {len(row_of.table)} clients to rows '
                     f'0..{row_of.rows - 1} of a store of {rows} rows, for a population of '
                     f'{num_clients} clients; give one row (cluster) per client')


def split_by_client(algorithm) -> bool:
  """Whether ``algorithm``'s store is split over a mesh with the clients (``by_client``)."""
  return algorithm.store_row is by_client


def sharding(mesh, split: bool):
  """Rows split over the mesh's ``'clients'`` axis (``split``), or whole on every device."""
  return NamedSharding(mesh, P(CLIENT_AXIS) if split else P())


def padded_rows(rows: int, mesh) -> int:
  """Rows of a split store: ``rows`` padded to a multiple of the devices."""
  devices = mesh.shape[CLIENT_AXIS]
  return -(-rows // devices) * devices


def place(store, mesh, split: bool = True):
  """The store as the round keeps it on ``mesh``: rows padded with zeros to ``padded_rows`` and
  split over the devices (``split``), or whole on every device; ``mesh=None`` returns it
  unchanged. Padding rows are never read."""
  if mesh is None:
    return store

  def pad(s):
    extra = padded_rows(num_rows(s), mesh) - num_rows(s) if split else 0
    return tree_map(lambda x: jnp.pad(x, [(0, extra)] + [(0, 0)] * (x.ndim - 1)), s)
  return jax.jit(pad, out_shardings=sharding(mesh, split))(store)


def place_state(state, algorithm, mesh):
  """A server state as ``build_round``'s round on ``mesh`` keeps it: whole on every device, its
  per-client store (stateful algorithms) placed (``place``); ``mesh=None``: unchanged."""
  if mesh is None:
    return state
  if algorithm.store_row is None:
    return devices.replicate(state, mesh)
  rest = devices.replicate(state._replace(clients=None), mesh)
  return rest._replace(clients=place(state.clients, mesh, split_by_client(algorithm)))


def constrain(store, mesh, split: bool):
  """Keeps a placed store's sharding inside a jitted function (no-op without a mesh)."""
  if mesh is None:
    return store
  return jax.lax.with_sharding_constraint(store, sharding(mesh, split))
