"""Randomness: every draw is ``fold_in(fold_in(root, round), purpose)``.

Client sampling, budgets and the initial model depend only on the seed and the round, never on the
algorithm, so runs of different algorithms with the same seed see the same clients, budgets and
initial model (the pairing the GeL reports ask for).
"""
from __future__ import annotations

import jax

from fedjax_gel.core.checks import is_whole

# Purposes: fixed small integers, part of the reproducibility contract; never renumber.
INIT = 0      # initial model (round-independent)
COHORT = 1    # which clients take part
BUDGET = 2    # local step budgets tau_i
CLIENT = 3    # per-client randomness (data shuffle, algorithm draws)
SERVER = 4    # the server's randomness (differential privacy's noise)


SEED_MAX = 2**32 - 1   # a key holds 32 bits of the seed: 2**32 and 0 gave the same key


def root_key(seed: int) -> jax.Array:
  """The run's key of ``seed``, an integer in ``[0, SEED_MAX]`` (else a ValueError: seeds
  beyond it, or negative ones, collided with others without a word); a traced seed as it is."""
  if not isinstance(seed, jax.core.Tracer) and not (
      is_whole(seed) and 0 <= int(seed) <= SEED_MAX):
    raise ValueError(f'root_key: seed must be an integer in [0, {SEED_MAX}], got {seed!r}')
  return jax.random.key(seed)


def init_key(root: jax.Array) -> jax.Array:
  """Key of the initial model: depends on the seed only."""
  return round_key(root, 0, INIT)


def round_key(root: jax.Array, round_idx, purpose: int) -> jax.Array:
  """``fold_in(fold_in(root, round), purpose)``."""
  return jax.random.fold_in(jax.random.fold_in(root, round_idx), purpose)


def client_key(round_client_key: jax.Array, client_id, slot) -> jax.Array:
  """Per-client key: folds in the client id, then its cohort slot.

  The slot (position in the sampled cohort, before any sorting) keeps two draws of the same client
  in one round (sampling with replacement) from sharing a data shuffle.
  """
  return jax.random.fold_in(jax.random.fold_in(round_client_key, client_id), slot)
