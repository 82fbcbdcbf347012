"""Loss-aware client selection: power-of-d choices (Cho et al., AISTATS 2022).

1. ``d`` candidates are drawn without replacement with probability proportional to their data
   size (from the round's cohort key, so the candidates are paired by seed and round);
2. their local losses are estimated at the current global model: over all their training
   examples (``'full'``) or over one random minibatch of ``B`` of them (``'minibatch'``, the
   cheap variant);
3. the ``C`` candidates with the largest losses take part (a candidate without data only when
   fewer than ``C`` have any: with ``d`` above the clients that hold data, such clients are
   drawn too, last).

With ``d = C`` every candidate takes part (no loss is needed); larger ``d`` biases the selection
towards clients the model fits worst.
"""
from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp

from fedjax_gel.core import keys
from fedjax_gel.core.federated_data import FederatedData, gather_rows

LOSS_MODES = ('full', 'minibatch')


def candidates(key, counts, d: int) -> jax.Array:
  """``d`` distinct client ids, drawn with probability proportional to ``counts``."""
  p = counts.astype(jnp.float32) / jnp.sum(counts)
  return jax.random.choice(key, counts.shape[0], (d,), replace=False, p=p).astype(jnp.int32)


def client_losses(per_example_loss: Callable, params, data: FederatedData, ids, mode: str,
                  batch_size: int, key) -> jax.Array:
  """Mean loss of each client in ``ids`` at ``params``: over all its examples or one minibatch."""
  if mode == 'full':
    losses = per_example_loss(params, data.examples)                        # [P]
    rows = jnp.arange(losses.shape[0])   # a client's rows follow the offsets, which rise with it
    owner = jnp.searchsorted(data.offsets, rows, side='right') - 1
    inside = rows < data.offsets[owner] + data.counts[owner]   # not a split pool's padding
    sums = jax.ops.segment_sum(jnp.where(inside, losses, 0.), owner,
                               num_segments=data.counts.shape[0])
    return sums[ids] / jnp.maximum(data.counts[ids], 1)
  if mode == 'minibatch':
    n = data.counts[ids]
    rows = data.offsets[ids][:, None] + jax.random.randint(
        key, (ids.shape[0], batch_size), 0, jnp.maximum(n, 1)[:, None])
    batch = gather_rows(data.examples, rows.reshape(-1))
    return per_example_loss(params, batch).reshape(ids.shape[0], batch_size).mean(axis=1)
  raise ValueError(f'unknown power-of-d loss mode {mode!r}; known: {", ".join(LOSS_MODES)}')


@functools.partial(jax.jit, static_argnames=('per_example_loss', 'd', 'cohort_size', 'mode',
                                             'batch_size'))
def power_of_d(root, round_idx, params, data: FederatedData, *, per_example_loss: Callable,
               d: int, cohort_size: int, mode: str = 'full', batch_size: int = 1) -> jax.Array:
  """The ``cohort_size`` highest-loss clients of ``d`` data-weighted candidates, ``[C]`` int32."""
  if not cohort_size <= d <= data.counts.shape[0]:
    raise ValueError(f'power-of-d needs clients_per_round <= d <= population, got '
                     f'{cohort_size}, {d}, {data.counts.shape[0]}')
  key = keys.round_key(root, round_idx, keys.COHORT)
  cand = candidates(key, data.counts, d)
  if d == cohort_size:
    return cand
  losses = client_losses(per_example_loss, params, data, cand, mode, batch_size,
                         jax.random.fold_in(key, 1))
  losses = jnp.where(data.counts[cand] > 0, losses, -jnp.inf)   # 'minibatch' read others' rows
  return cand[jnp.argsort(-losses, stable=True)[:cohort_size]]
