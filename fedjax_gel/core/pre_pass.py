"""The pre-pass stage of a round: each client's ``pre_pass_fn`` at the broadcast model, before its
local steps (``FederatedAlgorithm.pre_pass``: Mime's full-batch gradient, FedGBO's first
minibatch, ...)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_gel.core.algorithm import FederatedAlgorithm
from fedjax_gel.core.federated_data import FederatedData, gather_rows

tree_map = jax.tree_util.tree_map

FULL_BATCH_ROWS = 128   # rows per step of a full-batch pre-pass


def pre_pass_values(algorithm: FederatedAlgorithm, spec, bcast, data: FederatedData, n, offsets,
                    rows, real, client_keys):
  """Each client's ``pre_pass_fn`` at the broadcast model (the algorithm's per-client extra,
  e.g. Mime's gradient): ``(values, gradient computations, examples)``. Its batches carry the
  client's key (``ClientContext.key``) as ``batch['key']``, for a model's draws.

  ``'minibatch'``: the client's first minibatch (for a gradient, that of its first local step,
  which a real client reuses; recomputed here, so it is not counted again). ``'full'``: the mean
  over all of the client's examples, ``FULL_BATCH_ROWS`` rows of every client at a time."""
  batch_size, epochs = spec.batch_size, spec.budget_unit == 'epochs'
  keyed = jax.vmap(lambda b, batch, k: algorithm.pre_pass_fn(b, dict(batch, key=k)),
                   in_axes=(None, 0, 0))
  fn = lambda b, batch: keyed(b, batch, client_keys)
  if algorithm.pre_pass == 'minibatch':
    batch = gather_rows(data.examples, rows[:, :batch_size])
    first = jnp.arange(batch_size)[None, :] < (n[:, None] if epochs else batch_size)
    batch['mask'] = jnp.broadcast_to(first, rows[:, :batch_size].shape)
    return fn(bcast, batch), jnp.int32(0), jnp.int32(0)

  pos = jnp.arange(FULL_BATCH_ROWS)

  def add_rows(b, acc):   # rows b*R .. b*R + R - 1 of every client, masked beyond n_i
    p = b * FULL_BATCH_ROWS + pos
    mask = p[None, :] < n[:, None]
    idx = offsets[:, None] + jnp.minimum(p[None, :], jnp.maximum(n - 1, 0)[:, None])
    batch = dict(gather_rows(data.examples, idx), mask=mask)
    count = jnp.sum(mask, axis=1).astype(jnp.float32)
    g = fn(bcast, batch)
    return tree_map(lambda a, u: a + count.reshape((-1,) + (1,) * (u.ndim - 1)) * u, acc, g)

  shapes = jax.eval_shape(lambda: fn(bcast, dict(
      tree_map(lambda a: a[jnp.zeros((n.shape[0], 1), jnp.int32)], data.examples),
      mask=jnp.ones((n.shape[0], 1), bool))))
  zeros = tree_map(lambda s: jnp.zeros(s.shape, jnp.float32), shapes)
  n_real = jnp.where(real, n, 0)
  trips = -(-jnp.max(n_real) // FULL_BATCH_ROWS)
  total = jax.lax.fori_loop(0, trips, add_rows, zeros)
  scale = 1. / jnp.maximum(n_real, 1).astype(jnp.float32)
  values = tree_map(
      lambda t, s: (scale.reshape((-1,) + (1,) * (t.ndim - 1)) * t).astype(s.dtype),
      total, shapes)
  return values, jnp.sum(-(-n_real // batch_size)), jnp.sum(n_real)
