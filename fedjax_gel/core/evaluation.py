"""Vectorised evaluation of the global model over a whole example pool."""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_gel.core.federated_data import FederatedData


class EvalPool(NamedTuple):
  """Examples padded to ``[num_batches, batch, ...]`` with a validity mask and, for a whole
  pool, each example's client (``[num_batches, batch]`` int32) and every client's number of
  examples (``[num_clients]``); None for a sample of the pool."""
  examples: dict
  mask: jax.Array
  clients: jax.Array | None = None
  client_counts: jax.Array | None = None


def make_eval_pool(data: FederatedData, batch_size: int = 4096, max_examples: int = 0,
                   seed: int = 0) -> EvalPool:
  """Pads the pool (host side, once) so evaluation is ``lax.map`` over fixed-size batches.

  ``max_examples`` > 0 and smaller than the pool: a fixed sample of that many of its examples,
  drawn uniformly without replacement with ``seed`` (kept in pool order).
  """
  examples, total = data.examples, data.num_examples
  if 0 < max_examples < total:
    keep = np.sort(np.random.default_rng(seed).choice(total, max_examples, replace=False))
    examples, total = {k: np.asarray(v)[keep] for k, v in examples.items()}, max_examples
  batch = max(1, min(batch_size, total))
  num_batches = -(-total // batch)
  pad = num_batches * batch - total

  def shape(a):
    a = np.asarray(a)
    a = np.concatenate([a, np.zeros((pad,) + a.shape[1:], a.dtype)])
    return jax.device_put(a.reshape((num_batches, batch) + a.shape[1:]))

  mask = np.arange(num_batches * batch) < total
  clients = counts = None
  if total == data.num_examples:   # the whole pool: per-client metrics
    counts = np.asarray(data.counts, np.int32)
    clients = shape(np.repeat(np.arange(len(counts), dtype=np.int32), counts))
    counts = jax.device_put(counts)
  return EvalPool({k: shape(v) for k, v in examples.items()},
                  jax.device_put(mask.reshape(num_batches, batch)), clients, counts)


def build_evaluate(apply_fn: Callable) -> Callable:
  """``evaluate(params, pool) -> {'loss', 'accuracy', 'count'}``, example-weighted over the pool;
  for a pool that names its examples' clients, also ``client_correct`` and ``client_count``
  (``[num_clients]``: each client's correct predictions and examples)."""

  @jax.jit
  def evaluate(params, pool: EvalPool):
    def one(args):
      batch, mask = args
      logits = apply_fn(params, batch['x'])
      loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch['y'])
      correct = jnp.argmax(logits, -1) == batch['y']
      return jnp.sum(jnp.where(mask, loss, 0.)), jnp.sum(mask & correct), mask & correct

    losses, corrects, each = jax.lax.map(one, (pool.examples, pool.mask))
    count = jnp.sum(pool.mask)
    out = {'loss': jnp.sum(losses) / count, 'accuracy': jnp.sum(corrects) / count,
           'count': count}
    if pool.clients is not None:
      out['client_correct'] = jax.ops.segment_sum(
          each.reshape(-1).astype(jnp.int32), pool.clients.reshape(-1),
          pool.client_counts.shape[0])
      out['client_count'] = pool.client_counts
    return out

  return evaluate


def client_spread(correct, count) -> dict:
  """The spread of client accuracy over the clients with test examples (host side): the
  unweighted mean, 10th and 90th percentiles (linear interpolation) and standard deviation,
  as FL papers report for fairness; ``None`` values without clients."""
  has = np.asarray(count) > 0
  acc = np.asarray(correct)[has] / np.asarray(count)[has]
  if not acc.size:
    return {'mean': None, 'p10': None, 'p90': None, 'std': None}
  return {'mean': float(acc.mean()), 'p10': float(np.percentile(acc, 10)),
          'p90': float(np.percentile(acc, 90)), 'std': float(acc.std())}
