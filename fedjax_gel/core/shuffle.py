"""Per-client data order for one round: shuffle once, cycle when ``tau_i * B > n_i``.

``cycled_permutation(key, n, length)[t] = perm[t mod n]`` for a uniform random permutation
``perm`` of ``range(n)`` (the GeL protocol: each client shuffles its data every round and cycles
through it). Only the first ``length = tau_max * B`` positions are needed, so ``perm`` is a
*partial* Fisher-Yates shuffle: step ``t`` swaps positions ``t`` and ``j_t ~ U{t..n-1}``.

All of it is computed at once, whatever ``n`` (a client with 50,000 examples costs what one with
50 costs), without a loop over the swaps: position ``t`` is final after step ``t``, and takes the
value position ``j_t`` held just before it. That value is ``j_t`` itself unless an earlier step
``s`` also drew ``j_s = j_t``, in which case (for the last such ``s``) it is ``f(s)``, the value
position ``s`` held before step ``s``. ``f(s)`` is ``s`` unless an earlier step ``r`` swapped
into ``s`` (``j_r = s``, ``r < s``), in which case it is ``f(r)`` for the last such ``r``: a
forest of pointers resolved by pointer jumping. The two "last earlier step" maps come from
``L x L`` comparisons for short orders (``L <= 128``: one fused pass, vectorised across
clients) and from a stable sort and a scatter for longer ones. ``tests/core`` checks both
against the textbook sequential algorithm. (A loop over the swaps, one after another, is
slower on CPU: each of its ``L`` steps runs a few small kernels over the whole chunk.)
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


DENSE_MAX_LENGTH = 128


def order_bytes(length: int) -> int:
  """Device bytes one client's order of ``length`` takes while it is computed: the ``L x L``
  comparisons of short orders, the sort's buffers of long ones. XLA's memory analysis on CPU
  gives about ``8.8 L^2`` and ``45-50 L`` bytes; these round up."""
  return 10 * length * length if length <= DENSE_MAX_LENGTH else 56 * length


def partial_fisher_yates(draws: jax.Array) -> jax.Array:
  """First ``L`` entries of the permutation the swaps ``(t, draws[t])`` produce."""
  if draws.shape[0] <= DENSE_MAX_LENGTH:
    return swaps_dense(draws)
  return swaps_parallel(draws)


def resolve(draws: jax.Array, prev: jax.Array, into: jax.Array) -> jax.Array:
  """The permutation's head from ``prev[t]`` (the last ``s < t`` with ``j_s = j_t``, else -1)
  and ``into[s]`` (the last ``r < s`` with ``j_r = s``, else -1), by pointer jumping."""
  t = jnp.arange(draws.shape[0], dtype=jnp.int32)
  f = jnp.where(into >= 0, into, t)
  for _ in range(max(1, math.ceil(math.log2(draws.shape[0])) + 1)):
    f = f[f]
  return jnp.where(prev >= 0, f[jnp.maximum(prev, 0)], draws)


def swaps_dense(draws: jax.Array) -> jax.Array:
  """``prev`` and ``into`` from ``L x L`` comparisons (short orders), reduced over the major
  axis so that the reduction vectorises."""
  t = jnp.arange(draws.shape[0], dtype=jnp.int32)
  s = t[:, None]                                           # rows: the earlier step
  # Computed once, not fused into (and recomputed for) each of the L x L comparisons.
  draws = jax.lax.optimization_barrier(draws)
  prev = jnp.max(jnp.where((s < t) & (draws[:, None] == draws), s, -1), axis=0)
  # j_s = t with s != t implies s < t (j_s >= s).
  into = jnp.max(jnp.where((draws[:, None] == t) & (draws[:, None] != s), s, -1), axis=0)
  return resolve(draws, prev, into)


def swaps_parallel(draws: jax.Array) -> jax.Array:
  """``prev`` from a stable sort by target, ``into`` from a scatter (long orders)."""
  length = draws.shape[0]
  t = jnp.arange(length, dtype=jnp.int32)
  order = jnp.argsort(draws, stable=True)
  sorted_j = draws[order]
  same = jnp.concatenate([jnp.zeros((1,), bool), sorted_j[1:] == sorted_j[:-1]])
  prev_sorted = jnp.where(same, jnp.roll(order, 1), -1)
  prev = jnp.zeros_like(t).at[order].set(prev_sorted)
  target = jnp.where(draws != t, draws, length)          # length = out of range, dropped
  into = jnp.full((length,), -1, jnp.int32).at[target].max(t, mode='drop')
  return resolve(draws, prev, into)


def cycled_permutation(key: jax.Array, n, length: int) -> jax.Array:
  """``[length]`` int32 ``perm[t mod n]`` for a uniform random permutation of ``range(n)``.

  A client with ``n = 0`` examples gets zeros (the engine gives it no steps).
  """
  n = jnp.asarray(n, jnp.int32)
  head = partial_fisher_yates(fisher_yates_draws(key, n, length))
  return head[jnp.arange(length, dtype=jnp.int32) % jnp.maximum(n, 1)]
