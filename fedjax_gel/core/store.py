"""The per-client state store: one device-resident pytree with leaves ``[rows, ...]``.

SCAFFOLD's ``c_i``, FedDyn's and AdaBest's ``h_i`` and FedVARP's memory ``y_i`` live here, a
row per client (or per cluster: ClusterFedVARP). The round gathers the cohort's rows, hands each
client its row, and writes back the rows the clients return, all inside the compiled round:
nothing goes through the host.

* **Writes are means.** When several real clients of a round write one row (a client sampled
  twice with replacement; the clients of one cluster), the row becomes the mean of what they
  wrote. Every duplicate writes the same value, so the scatter is deterministic.
* **Sharding.** With a mesh, :func:`place` pads the rows to a multiple of the devices and shards
  them over the ``'clients'`` axis; the round keeps that sharding. Padding rows are never read.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from fedjax_gel.core.devices import CLIENT_AXIS

tree_map = jax.tree_util.tree_map


def zeros(row, rows: int):
  """A store of ``rows`` zero rows shaped like ``row`` (a pytree of arrays or shape structs)."""
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


def sharding(mesh):
  """Rows split over the mesh's ``'clients'`` axis."""
  return NamedSharding(mesh, P(CLIENT_AXIS))


def place(store, mesh):
  """The store on the mesh: rows padded with zeros to a multiple of the devices and sharded.

  ``mesh=None`` returns it unchanged (one device).
  """
  if mesh is None:
    return store
  devices = mesh.shape[CLIENT_AXIS]
  pad = -num_rows(store) % devices
  padded = tree_map(lambda s: jnp.pad(s, [(0, pad)] + [(0, 0)] * (s.ndim - 1)), store)
  return jax.device_put(padded, sharding(mesh))


def constrain(store, mesh):
  """Keeps a store sharded inside a jitted function (no-op without a mesh)."""
  if mesh is None or num_rows(store) % mesh.shape[CLIENT_AXIS]:
    return store
  return jax.lax.with_sharding_constraint(store, sharding(mesh))
