"""The spread of a round's client models: FedGBO's (Mills et al. 2022) Fig. 1 measure of client
drift, the mean pairwise cosine distance of the clients' final models, computed chunk by chunk
from two running sums (``model_spread``, ``mean_pairwise_cosine_distance``) without the ``C x C``
pairs."""
from __future__ import annotations

import jax
import jax.numpy as jnp

tree_map = jax.tree_util.tree_map


def unit_rows(models):
  """``model_i / ||model_i||`` (norm over all leaves), leaf by leaf, float32."""
  leaves = jax.tree_util.tree_leaves(models)
  sq = sum(jnp.sum(jnp.square(x.astype(jnp.float32)).reshape(x.shape[0], -1), axis=1)
           for x in leaves)
  inv = 1. / jnp.maximum(jnp.sqrt(sq), 1e-30)
  return tree_map(lambda x: inv.reshape((-1,) + (1,) * (x.ndim - 1)) * x.astype(jnp.float32),
                  models)


def model_spread(models, starts, real):
  """``(sum_i e_i, sum_i ||e_i||^2)`` over real clients, ``e_i = u_i - r_i`` with ``u_i`` the
  unit final model and ``r_i`` the unit model the client started from (the broadcast one)."""
  e = tree_map(jnp.subtract, unit_rows(models), unit_rows(starts))
  e = tree_map(lambda x: jnp.where(real.reshape((-1,) + (1,) * (x.ndim - 1)), x, 0.), e)
  sq = sum(jnp.sum(jnp.square(x)) for x in jax.tree_util.tree_leaves(e))
  return tree_map(lambda x: jnp.sum(x, axis=0), e), sq


def mean_pairwise_cosine_distance(e_sum, e_sq, count):
  """``mean_{i<j} (1 - cos(y_i, y_j)) = mean_{i<j} ||u_i - u_j||^2 / 2``, FedGBO's (Mills et al.
  2022) Fig. 1 measure of client drift; 0 for fewer than two clients.

  With every ``u_i = r + e_i`` (one broadcast model), ``sum_{i<j} ||e_i - e_j||^2 =
  C sum_i ||e_i||^2 - ||sum_i e_i||^2``: small terms, no cancellation of ``O(C^2)`` ones.
  """
  sq_sum = sum(jnp.sum(jnp.square(x)) for x in jax.tree_util.tree_leaves(e_sum))
  pairs = count * (count - 1.)
  return jnp.where(pairs > 0, (count * e_sq - sq_sum) / jnp.maximum(pairs, 1.), 0.)
