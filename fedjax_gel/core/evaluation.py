"""Vectorised evaluation of the global model over a whole example pool."""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_gel.core.federated_data import FederatedData


class EvalPool(NamedTuple):
  """Examples padded to ``[num_batches, batch, ...]`` with a validity mask."""
  examples: dict
  mask: jax.Array


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
  return EvalPool({k: shape(v) for k, v in examples.items()},
                  jax.device_put(mask.reshape(num_batches, batch)))


def build_evaluate(apply_fn: Callable) -> Callable:
  """``evaluate(params, pool) -> {'loss', 'accuracy', 'count'}``, example-weighted over the pool."""

  @jax.jit
  def evaluate(params, pool: EvalPool):
    def one(args):
      batch, mask = args
      logits = apply_fn(params, batch['x'])
      loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch['y'])
      correct = jnp.argmax(logits, -1) == batch['y']
      return jnp.sum(jnp.where(mask, loss, 0.)), jnp.sum(mask & correct)

    losses, corrects = jax.lax.map(one, (pool.examples, pool.mask))
    count = jnp.sum(pool.mask)
    return {'loss': jnp.sum(losses) / count, 'accuracy': jnp.sum(corrects) / count,
            'count': count}

  return evaluate
