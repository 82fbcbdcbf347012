"""Cohort and budget samplers, paired across algorithms by (seed, round)."""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedjax_gel.core import keys

WEIGHTINGS = ('samples_seen', 'num_examples', 'uniform')


class Cohort(NamedTuple):
  """The clients of one round; every field has leading axis ``C`` (cohort size).

  Attributes:
    client_ids: ``[C]`` int32 ids into the population.
    budgets: ``[C]`` int32 local gradient steps ``tau_i``.
    weights: ``[C]`` float32 unnormalised aggregation weights (``p_i`` after normalising).
  """
  client_ids: jax.Array
  budgets: jax.Array
  weights: jax.Array


def sample_clients(key, num_clients: int, cohort_size: int, replace: bool) -> jax.Array:
  """Uniform client ids, ``[cohort_size]``, with or without replacement."""
  if replace:
    return jax.random.randint(key, (cohort_size,), 0, num_clients, dtype=jnp.int32)
  if cohort_size > num_clients:
    raise ValueError(f'cohort of {cohort_size} exceeds the population of {num_clients} '
                     'clients without replacement')
  return jax.random.choice(key, num_clients, (cohort_size,), replace=False).astype(jnp.int32)


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
    'cohort_size', 'budget_range', 'replace', 'batch_size', 'weighting'))
def sample_cohort(root, round_idx, counts, *, cohort_size: int, budget_range: tuple[int, int],
                  replace: bool, batch_size: int, weighting: str = 'samples_seen') -> Cohort:
  """The cohort of round ``round_idx``: depends on (seed, round) only, not on the algorithm."""
  ids = sample_clients(keys.round_key(root, round_idx, keys.COHORT), counts.shape[0],
                       cohort_size, replace)
  budgets = sample_budgets(keys.round_key(root, round_idx, keys.BUDGET), cohort_size,
                           *budget_range)
  weights = aggregation_weights(weighting, budgets, counts[ids], batch_size)
  return Cohort(ids, budgets, weights)
