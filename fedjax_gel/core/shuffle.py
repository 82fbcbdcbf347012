"""Per-client data order for one round: shuffle once, cycle when ``tau_i * B > n_i``; or, with
budgets in epochs, a new shuffle per epoch (``data_order``, ``minibatch_rows``).

``cycled_permutation(key, n, length)[t] = perm[t mod n]`` for a uniform random permutation
``perm`` of ``range(n)`` (the GeL protocol: each client shuffles its data every round and cycles
through it). Only the first ``length = tau_max * B`` positions are needed, so ``perm`` is a
*partial* Fisher-Yates shuffle: step ``t`` swaps positions ``t`` and ``j_t ~ U{t..n-1}``.

All of it is computed at once, whatever ``n`` (a client with 50,000 examples costs what one with
50 costs), without a loop over the swaps, in ``O(L)`` memory per client (``O(C L)`` for a
vmapped chunk of ``C`` clients): position ``t`` is final after step ``t``, and takes the
value position ``j_t`` held just before it. That value is ``j_t`` itself unless an earlier step
``s`` also drew ``j_s = j_t``, in which case (for the last such ``s``) it is ``f(s)``, the value
position ``s`` held before step ``s``. ``f(s)`` is ``s`` unless an earlier step ``r`` swapped
into ``s`` (``j_r = s``, ``r < s``), in which case it is ``f(r)`` for the last such ``r``: a
forest of pointers resolved by pointer jumping. The first "last earlier step" map comes from
one sort of the steps by ``(j_t, t)``, packed into one int32 key ``j_t L + t`` where it fits
(a single-operand sort, 2-3x faster on CPU than sorting the pairs), the second from a
scatter. ``tests/core`` checks it against the textbook sequential algorithm. (An earlier
version compared all ``L x L`` pairs of steps: faster below ``L = 32`` but ``O(C L^2)``
memory, 655 MB at 10,000 clients with ``L = 128``. A loop over the swaps, one after another,
is slower on CPU: each of its ``L`` steps runs a few small kernels over the whole chunk.)
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


def order_bytes(length: int) -> int:
  """Device bytes one client's order of ``length`` takes while it is computed: the sort's
  and the pointer jumping's ``O(L)`` buffers (XLA's memory analysis on CPU gives 36 bytes a
  position; this rounds up)."""
  return 56 * length


def sorted_by_target(draws: jax.Array, bound: int | None = None):
  """``(j, t)`` of the steps sorted by ``j`` then ``t``. ``bound``: a static bound on ``n``;
  the draws are below ``max(n, L)`` (steps ``t >= n - 1`` draw ``j_t = t``), so where
  ``max(bound, L) L`` fits in int32 the pairs are sorted as one packed key."""
  length = draws.shape[0]
  t = jnp.arange(length, dtype=jnp.int32)
  if bound is not None and max(bound, length) * length < 2**31:
    key = jnp.sort(draws * length + t)
    return key // length, key % length
  return jax.lax.sort((draws, t), num_keys=1, is_stable=True)


def partial_fisher_yates(draws: jax.Array, bound: int | None = None) -> jax.Array:
  """First ``L`` entries of the permutation the swaps ``(t, draws[t])`` produce; ``bound`` as
  in ``sorted_by_target``."""
  length = draws.shape[0]
  t = jnp.arange(length, dtype=jnp.int32)
  sorted_j, sorted_t = sorted_by_target(draws, bound)
  same = jnp.concatenate([jnp.zeros((1,), bool), sorted_j[1:] == sorted_j[:-1]])
  prev = jnp.zeros_like(t).at[sorted_t].set(jnp.where(same, jnp.roll(sorted_t, 1), -1),
                                            unique_indices=True)
  # j_r = s with r != s implies r < s (j_r >= r); length = out of range, dropped
  target = jnp.where(draws != t, draws, length)
  into = jnp.full((length,), -1, jnp.int32).at[target].max(t, mode='drop')
  return resolve(draws, prev, into)


def resolve(draws: jax.Array, prev: jax.Array, into: jax.Array) -> jax.Array:
  """The permutation's head from ``prev[t]`` (the last ``s < t`` with ``j_s = j_t``, else -1)
  and ``into[s]`` (the last ``r < s`` with ``j_r = s``, else -1), by pointer jumping: every
  pointer goes to an earlier step, so a chain has at most ``L - 1`` links and ``k`` jumps,
  ``f <- f[f]``, follow ``2^k`` of them."""
  length = draws.shape[0]
  t = jnp.arange(length, dtype=jnp.int32)
  f = jnp.where(into >= 0, into, t)
  for _ in range(math.ceil(math.log2(max(length - 1, 1)))):
    f = f[f]
  return jnp.where(prev >= 0, f[jnp.maximum(prev, 0)], draws)


def cycled_permutation(key: jax.Array, n, length: int, bound: int | None = None) -> jax.Array:
  """A uniform random permutation of ``range(n)``, cycled to ``length`` entries.

  Args:
    key: the PRNG key.
    n: the number of items (may be traced); a client with ``n = 0`` examples gets zeros (the
      engine gives it no steps).
    length: the entries returned (static).
    bound: a static upper bound on ``n`` (the round passes its pool's rows), for the faster
      sort; None: none known.

  Returns:
    ``[length]`` int32 ``perm[t mod n]``.

  Examples:
    >>> import jax
    >>> from fedjax_gel import core
    >>> perm = core.cycled_permutation(jax.random.key(0), 3, 7)
    >>> sorted(perm[:3].tolist()), bool((perm[3:6] == perm[:3]).all())
    ([0, 1, 2], True)
  """
  n = jnp.asarray(n, jnp.int32)
  head = partial_fisher_yates(fisher_yates_draws(key, n, length), bound)
  return head[jnp.arange(length, dtype=jnp.int32) % jnp.maximum(n, 1)]


def epoch_steps(n, batch_size: int):
  """``ceil(n / B)``: the minibatches of one epoch over ``n`` examples (0 for none)."""
  return -(-n // batch_size)


def data_order(spec, shuffle_keys, n, pool_rows: int) -> jax.Array:
  """Each client's example order for the round, ``[clients, max_budget B]`` (positions into
  its examples). Steps: one shuffle, cycled (``cycled_permutation``). Epochs: a new shuffle per
  epoch ``e`` (key ``fold_in(key, e)``), epoch ``e`` at ``e ceil(n_max / B) B`` onwards."""
  length = spec.max_budget * spec.batch_size
  permute = jax.vmap(cycled_permutation, in_axes=(0, 0, None, None))
  if spec.budget_unit == 'steps':
    return permute(shuffle_keys, n, length, pool_rows)
  epoch_len = spec.steps_per_epoch * spec.batch_size
  per_epoch = jax.vmap(lambda e: permute(
      jax.vmap(jax.random.fold_in, in_axes=(0, None))(shuffle_keys, e), n, epoch_len,
      pool_rows))(jnp.arange(spec.budget_range[1]))          # [epochs, clients, epoch_len]
  return jnp.moveaxis(per_epoch, 0, 1).reshape(n.shape[0], length)


def minibatch_rows(spec, rows, k, n):
  """``(rows of step k [clients, B], mask or None)``. Steps: positions ``k B .. k B + B - 1``.
  Epochs: step ``k`` is minibatch ``k mod s_i`` of epoch ``k div s_i`` (``s_i = ceil(n_i /
  B)``), its positions beyond ``n_i`` (the epoch's short last minibatch) masked."""
  b = spec.batch_size
  if spec.budget_unit == 'steps':
    return jax.lax.dynamic_slice_in_dim(rows, k * b, b, axis=1), None
  s = jnp.maximum(epoch_steps(n, b), 1)
  pos = (k % s)[:, None] * b + jnp.arange(b)[None, :]
  epoch_len = spec.steps_per_epoch * b
  at = (k // s)[:, None] * epoch_len + jnp.minimum(pos, epoch_len - 1)
  return jnp.take_along_axis(rows, at, axis=1), pos < n[:, None]


def examples_seen(spec, budgets, n) -> jax.Array:
  """Examples each client's ``tau_i`` steps put through a gradient: ``tau_i B``, or in epochs
  ``n_i`` per whole epoch and ``min(r B, n_i)`` for ``r`` steps of a partial one."""
  if spec.budget_unit == 'steps':
    return spec.batch_size * budgets
  s = jnp.maximum(epoch_steps(n, spec.batch_size), 1)
  return (budgets // s) * n + jnp.minimum((budgets % s) * spec.batch_size, n)
