"""Cohort and budget samplers, paired across algorithms by (seed, round)."""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_gel.core import keys

WEIGHTINGS = ('samples_seen', 'num_examples', 'uniform')


GUESS_POLICIES = ('none', 'remaining', 'cohort_max', 'inf', 'fixed', 'percent')


class Cohort(NamedTuple):
  """The clients of one round; every field has leading axis ``C`` (cohort size).

  Attributes:
    client_ids: ``[C]`` int32 ids into the population.
    budgets: ``[C]`` int32 local gradient steps ``tau_i``.
    weights: ``[C]`` float32 unnormalised aggregation weights (``p_i`` after normalising).
    guesses: ``[C]`` float32 guessed steps ``tau'_i`` after the budget (GeL; ``inf`` allowed);
      zeros for algorithms without guesses.
  """
  client_ids: jax.Array
  budgets: jax.Array
  weights: jax.Array
  guesses: jax.Array


class GuessPolicy(NamedTuple):
  """How many guessed steps ``tau'_i`` each client takes (GeL, seed 000 §3.1 and App. F).

  ``kind``:
    ``none``: 0.
    ``remaining``: ``max(tau - tau_i, 0)``, ``tau`` the steps the server asks for (seed 000:
      the remaining work; GeL's Synthetic runs use ``tau = b + 5`` for budgets ``U{a..b}``).
    ``cohort_max``: ``max_j tau_j + k - tau_i`` over the round's cohort (the authors' code).
    ``inf``: infinitely many (the ``alpha / (1 - alpha)`` nudge; zero proxy only).
    ``fixed``: ``count`` for every client.
    ``percent``: ``floor(percent / 100 * tau_i)`` (seed 001's "x% guesses").
  """
  kind: str = 'none'
  tau: int = 0
  k: int = 0
  count: int = 0
  percent: float = 0.0


def guess_counts(policy: GuessPolicy, budgets: jax.Array) -> jax.Array:
  """``tau'_i`` for every client of a cohort, float32 ``[C]``."""
  b = budgets.astype(jnp.float32)
  if policy.kind == 'none':
    return jnp.zeros_like(b)
  if policy.kind == 'remaining':
    return jnp.maximum(policy.tau - b, 0.)
  if policy.kind == 'cohort_max':
    return jnp.max(b) + policy.k - b
  if policy.kind == 'inf':
    return jnp.full_like(b, jnp.inf)
  if policy.kind == 'fixed':
    return jnp.full_like(b, policy.count)
  if policy.kind == 'percent':
    return jnp.floor(policy.percent / 100. * b)
  raise ValueError(f'unknown guess policy {policy.kind!r}; known: {", ".join(GUESS_POLICIES)}')


def sample_clients(key, num_clients: int, cohort_size: int, replace: bool) -> jax.Array:
  """Uniform client ids, ``[cohort_size]``, with or without replacement."""
  if replace:
    return jax.random.randint(key, (cohort_size,), 0, num_clients, dtype=jnp.int32)
  if cohort_size > num_clients:
    raise ValueError(f'cohort of {cohort_size} exceeds the population of {num_clients} '
                     'clients without replacement')
  return jax.random.choice(key, num_clients, (cohort_size,), replace=False).astype(jnp.int32)


def sample_clients_cyclic(key, num_clients: int, cohort_size: int, replace: bool, groups: int,
                          round_idx) -> jax.Array:
  """Cyclic participation (Cho et al., ICML 2023; seed 002): the clients form ``groups`` groups
  (client ``i`` in group ``i mod K``) and round ``t`` samples uniformly from group ``t mod K``."""
  per_group = num_clients // groups   # the smallest group's size
  if per_group == 0:
    raise ValueError(f'{groups} cyclic groups exceed the population of {num_clients} clients')
  if not replace and cohort_size > per_group:
    raise ValueError(f'cohort of {cohort_size} exceeds the smallest cyclic group ({per_group} '
                     'clients) without replacement')
  g = jnp.asarray(round_idx, jnp.int32) % groups
  size = (num_clients - g + groups - 1) // groups          # members g, g + K, g + 2K, ...
  if replace:
    j = jax.random.randint(key, (cohort_size,), 0, size, dtype=jnp.int32)
  else:
    longest = -(-num_clients // groups)
    u = jax.random.uniform(key, (longest,))
    j = jnp.argsort(jnp.where(jnp.arange(longest) < size, u, jnp.inf))[:cohort_size]
  return (g + groups * j).astype(jnp.int32)


def sample_budgets(key, cohort_size: int, low: int, high: int) -> jax.Array:
  """``tau_i ~ U{low..high}`` (both ends included), ``[cohort_size]``."""
  return jax.random.randint(key, (cohort_size,), low, high + 1, dtype=jnp.int32)


def aggregation_weights(weighting: str, budgets, num_examples, batch_size: int) -> jax.Array:
  """Unnormalised aggregation weights.

  ``samples_seen``: ``min(tau_i * B, n_i)``, the examples a client touched (GeL code's default);
  ``num_examples``: ``n_i`` (FedAvg paper); ``uniform``: 1.
  """
  if weighting == 'samples_seen':
    w = jnp.minimum(budgets * batch_size, num_examples)
  elif weighting == 'num_examples':
    w = num_examples
  elif weighting == 'uniform':
    w = jnp.ones_like(budgets)
  else:
    raise ValueError(f'unknown aggregation weighting {weighting!r}; known: {", ".join(WEIGHTINGS)}')
  return jnp.asarray(w, jnp.float32)


@functools.partial(jax.jit, static_argnames=(
    'cohort_size', 'budget_range', 'replace', 'batch_size', 'weighting', 'guess_policy',
    'selection', 'groups'))
def sample_cohort(root, round_idx, counts, *, cohort_size: int, budget_range: tuple[int, int],
                  replace: bool, batch_size: int, weighting: str = 'samples_seen',
                  guess_policy: GuessPolicy = GuessPolicy(), selection: str = 'uniform',
                  groups: int = 1, client_ids=None) -> Cohort:
  """The cohort of round ``round_idx``.

  Clients and budgets depend on (seed, round) only, never on the algorithm; guess counts are a
  function of the budgets. ``selection``: ``'uniform'`` or ``'cyclic'`` (over ``groups``);
  ``client_ids`` given (e.g. by ``selection.power_of_d``) replace the sampled clients.
  """
  cohort_key = keys.round_key(root, round_idx, keys.COHORT)
  if client_ids is not None:
    ids = jnp.asarray(client_ids, jnp.int32)
  elif selection == 'cyclic':
    ids = sample_clients_cyclic(cohort_key, counts.shape[0], cohort_size, replace, groups,
                                round_idx)
  elif selection == 'uniform':
    ids = sample_clients(cohort_key, counts.shape[0], cohort_size, replace)
  else:
    raise ValueError(f'unknown client selection {selection!r}; known: uniform, cyclic')
  budgets = sample_budgets(keys.round_key(root, round_idx, keys.BUDGET), cohort_size,
                           *budget_range)
  weights = aggregation_weights(weighting, budgets, counts[ids], batch_size)
  return Cohort(ids, budgets, weights, guess_counts(guess_policy, budgets))
