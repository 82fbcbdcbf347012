"""Per-client data order for one round: shuffle once, cycle when ``tau_i * B > n_i``.

``cycled_permutation(key, n, length)[t] = perm[t mod n]`` for a uniform random permutation
``perm`` of ``range(n)`` (the GeL protocol: each client shuffles its data every round and cycles
through it). Only the first ``length`` positions are ever needed (``length = tau_max * B``), so
the permutation is drawn with a *partial* Fisher-Yates shuffle whose swaps beyond ``length`` are
kept in a sparse map: O(length^2) work and O(length) memory per client, independent of ``n``
(a client with 50,000 examples costs no more than one with 50).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def cycled_permutation(key: jax.Array, n, length: int) -> jax.Array:
  """``[length]`` int32 ``perm[t mod n]`` for a uniform permutation of ``range(n)``, ``n >= 1``.

  Fisher-Yates step ``t`` swaps positions ``t`` and ``j ~ U{t..n-1}`` for ``t < n - 1``.
  Positions ``< length`` live in a dense buffer; a swap that reaches ``j >= length`` records
  ``j -> value`` in slot ``t`` of a sparse map (the newest slot for a key wins).
  """
  n = jnp.asarray(n, jnp.int32)
  steps = jnp.arange(length, dtype=jnp.int32)
  draws = jax.random.randint(key, (length,), 0, jnp.maximum(n - steps, 1), dtype=jnp.int32)

  def swap(carry, t_r):
    buf, map_keys, map_vals = carry
    t, r = t_r
    j = t + r
    active = t < n - 1
    in_buf = j < length
    newest = jnp.max(jnp.where(map_keys == j, steps, -1))
    val_j = jnp.where(in_buf, buf[jnp.minimum(j, length - 1)],
                      jnp.where(newest >= 0, map_vals[jnp.maximum(newest, 0)], j))
    val_t = buf[t]
    new_buf = jnp.where(steps == t, val_j, jnp.where((steps == j) & in_buf, val_t, buf))
    store = active & ~in_buf
    map_keys = jnp.where((steps == t) & store, j, map_keys)
    map_vals = jnp.where((steps == t) & store, val_t, map_vals)
    return (jnp.where(active, new_buf, buf), map_keys, map_vals), None

  init = (steps, jnp.full((length,), -1, jnp.int32), jnp.zeros((length,), jnp.int32))
  (buf, _, _), _ = jax.lax.scan(swap, init, (steps, draws))
  return buf[steps % n]
