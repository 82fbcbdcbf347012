"""Per-client data order for one round: shuffle once, cycle when ``tau_i * B > n_i``.

``cycled_permutation(key, n, length)[t] = perm[t mod n]`` for a uniform random permutation
``perm`` of ``range(n)`` (the GeL protocol: each client shuffles its data every round and cycles
through it). Only the first ``length = tau_max * B`` positions are needed, so ``perm`` is a
*partial* Fisher-Yates shuffle: step ``t`` swaps positions ``t`` and ``j_t ~ U{t..n-1}``.

Two exact implementations of the same swaps, whatever ``n`` (a client with 50,000 examples costs
what one with 50 costs): for short orders (``L <= 128``) the swaps run one after another over a
dense buffer of the first ``L`` positions plus a sparse map for swaps beyond it, O(L^2) simple
vector work per client that vectorises well across clients; for longer orders they are resolved
in parallel in O(L log L):
position ``t`` is final after step ``t``, and takes the value position ``j_t`` held just before
it. That value is ``j_t`` itself unless an earlier step ``s`` also drew ``j_s = j_t``, in which
case (for the last such ``s``) it is ``f(s)``, the value position ``s`` held before step ``s``.
``f(s)`` is ``s`` unless an earlier step ``r`` swapped into ``s`` (``j_r = s``, ``r < s``), in
which case it is ``f(r)`` for the last such ``r``: a forest of pointers resolved by pointer
jumping. ``tests/core`` checks this against the sequential algorithm.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def fisher_yates_draws(key: jax.Array, n, length: int) -> jax.Array:
  """``j_t ~ U{t..n-1}`` for the active steps ``t < n - 1``; ``j_t = t`` (no swap) otherwise."""
  n = jnp.asarray(n, jnp.int32)
  t = jnp.arange(length, dtype=jnp.int32)
  r = jax.random.randint(key, (length,), 0, jnp.maximum(n - t, 1), dtype=jnp.int32)
  return jnp.where(t < n - 1, t + r, t)


SEQUENTIAL_MAX_LENGTH = 128


def partial_fisher_yates(draws: jax.Array) -> jax.Array:
  """First ``L`` entries of the permutation the swaps ``(t, draws[t])`` produce."""
  if draws.shape[0] <= SEQUENTIAL_MAX_LENGTH:
    return swaps_sequential(draws)
  return swaps_parallel(draws)


def swaps_sequential(draws: jax.Array) -> jax.Array:
  """The swaps one after another: positions ``< L`` in a buffer, later ones in a sparse map.

  Step ``t`` writes map slot ``t`` when ``j_t >= L``; the newest slot holding a key wins.
  """
  length = draws.shape[0]
  pos = jnp.arange(length, dtype=jnp.int32)

  def swap(carry, t):
    buf, map_keys, map_vals = carry
    j = draws[t]
    in_buf = j < length
    newest = jnp.max(jnp.where(map_keys == j, pos, -1))
    val_j = jnp.where(in_buf, jnp.sum(jnp.where(pos == j, buf, 0)),
                      jnp.where(newest >= 0, jnp.sum(jnp.where(pos == newest, map_vals, 0)), j))
    val_t = buf[t]
    buf = jnp.where(pos == j, val_t, buf).at[t].set(val_j)
    map_keys = map_keys.at[t].set(jnp.where(in_buf, -1, j))
    map_vals = map_vals.at[t].set(val_t)
    return (buf, map_keys, map_vals), None

  init = (pos, jnp.full((length,), -1, jnp.int32), jnp.zeros((length,), jnp.int32))
  return jax.lax.scan(swap, init, pos)[0][0]


def swaps_parallel(draws: jax.Array) -> jax.Array:
  """The swaps resolved at once with a stable sort and pointer jumping (see the module doc)."""
  length = draws.shape[0]
  t = jnp.arange(length, dtype=jnp.int32)
  # prev[t]: the last step s < t with draws[s] == draws[t], else -1 (stable sort by target).
  order = jnp.argsort(draws, stable=True)
  sorted_j = draws[order]
  same = jnp.concatenate([jnp.zeros((1,), bool), sorted_j[1:] == sorted_j[:-1]])
  prev_sorted = jnp.where(same, jnp.roll(order, 1), -1)
  prev = jnp.zeros_like(t).at[order].set(prev_sorted)
  # into[s]: the last step r < s that swapped into position s < L (draws[r] == s, r != s).
  target = jnp.where(draws != t, draws, length)          # length = out of range, dropped
  into = jnp.full((length,), -1, jnp.int32).at[target].max(t, mode='drop')
  # f(s) = f(into[s]) or s: follow the pointers to their roots.
  f = jnp.where(into >= 0, into, t)
  for _ in range(max(1, math.ceil(math.log2(length)) + 1)):
    f = f[f]
  return jnp.where(prev >= 0, f[jnp.maximum(prev, 0)], draws)


def cycled_permutation(key: jax.Array, n, length: int) -> jax.Array:
  """``[length]`` int32 ``perm[t mod n]`` for a uniform random permutation of ``range(n)``.

  A client with ``n = 0`` examples gets zeros (the engine gives it no steps).
  """
  n = jnp.asarray(n, jnp.int32)
  head = partial_fisher_yates(fisher_yates_draws(key, n, length))
  return head[jnp.arange(length, dtype=jnp.int32) % jnp.maximum(n, 1)]
