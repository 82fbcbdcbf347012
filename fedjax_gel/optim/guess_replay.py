"""Replaying an optimiser's update with a proxy gradient, as GeL's generic guessed steps do
(``guessing``, and ``guess(..., optimizer=tx)``): ``replay`` calls the update ``count`` times,
``count`` traced and per client under ``vmap``, or infinite, running until the sum of the updates
settles in its dtype.
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_gel.optim.guess_wrappers import GuessRefusedError

MAX_INFINITE_GUESSES = 10_000
"""The steps an infinite count of ``guessing``'s guesses may take before it is declared NaN."""
ZERO_RUN = 128   # exact-zero steps in a row that settle an infinite count (see ``replay``)


def _needs_extra_args(err: TypeError, who: str, instead: str) -> GuessRefusedError | None:
  """The refusal for an ``update`` that needs a keyword argument a guessed step cannot give
  (``reduce_on_plateau``'s loss ``value``), else None."""
  missing = re.search(r'required keyword-only arguments?: (.*)', str(err))
  if missing is None:
    return None
  refusal = GuessRefusedError(
      f'guess: {who} needs {missing.group(1)} in its update, which a guessed step cannot give '
      f'(it computes no loss, e.g. for optax.contrib.reduce_on_plateau\'s value){instead}')
  refusal.replayable = False   # replaying the whole optimiser needs it too
  return refusal


def replay(update, state, params, proxy, count, who: str, instead: str = ''):
  """``count`` calls ``update(proxy, state, params)``, the params advanced by each update as a
  step applies it; returns ``(summed updates, state)``.

  ``count`` may be traced (per client under ``vmap``) and ``inf``: then it runs until the sum
  settles, at most ``MAX_INFINITE_GUESSES`` steps, else NaN (never a silent number). A step
  whose update, not all zero, leaves the sum unchanged settles it (the terms fell below its
  rounding); steps applying exact zeros (``MultiSteps`` accumulating, ``apply_every``) settle it
  only after ``ZERO_RUN`` of them in a row. A NaN ``count`` gives NaN. ``who`` names the
  optimiser in the refusal of an ``update`` needing an argument a guess cannot give, ``instead``
  (``'; ...'``) what to do."""
  count = jnp.asarray(count, jnp.float32)
  infinite = jnp.isposinf(count)
  trips = jnp.where(infinite, MAX_INFINITE_GUESSES,
                    jnp.clip(jnp.nan_to_num(count), 0, np.iinfo(np.int32).max)).astype(jnp.int32)

  def cond(carry):
    i, _, _, _, _, settled = carry
    return (i < trips) & ~settled

  def body(carry):
    i, total, state, p, zero_run, _ = carry
    u, state = update(proxy, state, p)
    new_total = jax.tree.map(lambda t, u: (t + u).astype(t.dtype), total, u)
    unchanged = all_equal(new_total, total)
    zero = all_equal(u, optax.tree_utils.tree_zeros_like(u))
    zero_run = jnp.where(unchanged & zero, zero_run + 1, 0)
    settled = infinite & unchanged & (~zero | (zero_run >= ZERO_RUN))
    return i + 1, new_total, state, optax.apply_updates(p, u), zero_run, settled

  zeros = optax.tree_utils.tree_zeros_like(params)
  try:
    _, total, state, _, _, settled = jax.lax.while_loop(
        cond, body, (jnp.int32(0), zeros, state, params, jnp.int32(0), jnp.bool_(False)))
  except TypeError as err:
    refusal = _needs_extra_args(err, who, instead)
    if refusal is None:
      raise
    raise refusal from err
  unknown = (infinite & ~settled) | jnp.isnan(count)   # NaN, as gel_sgdm's closed form gives
  total = jax.tree.map(lambda t: jnp.where(unknown, jnp.nan, t).astype(t.dtype), total)
  return total, state


def all_equal(a, b) -> jax.Array:
  """Whether two trees of one structure hold equal arrays (True for trees without leaves)."""
  return jnp.all(jnp.stack([jnp.bool_(True)] + [jnp.all(x == y) for x, y in zip(
      jax.tree.leaves(a), jax.tree.leaves(b))]))
