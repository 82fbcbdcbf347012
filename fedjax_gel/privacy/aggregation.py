"""Client-level DP aggregation of a cohort's model deltas (DP-FedAvg, McMahan, Ramage, Talwar
and Zhang 2018, "Learning Differentially Private Recurrent Language Models"), with adaptive
clipping (Andrew, Thakkar, McMahan and Ramaswamy 2021, "Differentially Private Learning with
Adaptive Clipping"). Pure functions of arrays, to be called inside the compiled round.

Each client's delta is clipped to L2 norm ``C`` (``clip``); the server takes the fixed-denominator
estimate of the mean (uniform weights: a client's influence is bounded by ``C / W`` whatever the
cohort)::

    Delta = (sum_i m_i clip(Delta_i, C) + N(0, (z C)^2 I)) / W

with ``m_i`` 1 for a client present in the round (0 for an empty slot of a Poisson cohort), ``W``
the expected cohort size and ``z`` the noise multiplier. Adaptive clipping moves ``C`` towards
the ``gamma`` quantile of the clients' update norms from a noised count of those at or below it::

    b = (sum_i m_i ([||Delta_i|| <= C] - 1/2) + N(0, sigma_b^2)) / W + 1/2,
    C <- C exp(-eta_C (b - gamma))

and spends part of the privacy budget on that count: for a total noise multiplier ``z`` the
deltas get ``z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)`` (the paper's Theorem 1), so that the two
queries together are as private as one Gaussian query of multiplier ``z``.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


def global_norm(tree) -> jax.Array:
  """The L2 norm of a pytree's leaves taken together (float32)."""
  return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32)))
                      for x in jax.tree.leaves(tree)))


def clip(delta, clip_norm):
  """``(delta scaled to L2 norm at most clip_norm, its norm before)``."""
  norm = global_norm(delta)
  scale = jnp.minimum(1., clip_norm / jnp.maximum(norm, 1e-30))
  return jax.tree.map(lambda x: (x * scale).astype(x.dtype), delta), norm


def noised(total, clip_norm, noise_multiplier, expected_count, key):
  """``(total + N(0, (noise_multiplier clip_norm)^2 I)) / expected_count``: the server's step on
  the sum of the cohort's clipped deltas, noised once (after the sum over every chunk and
  device)."""
  leaves, treedef = jax.tree.flatten(total)
  keys = jax.random.split(key, len(leaves))
  std = noise_multiplier * clip_norm
  out = [((x.astype(jnp.float32) + std * jax.random.normal(k, x.shape, jnp.float32))
          / expected_count).astype(x.dtype) for x, k in zip(leaves, keys)]
  return jax.tree.unflatten(treedef, out)


def noised_mean(deltas, present, clip_norm, noise_multiplier, expected_count, key):
  """The fixed-denominator DP mean of the stacked ``deltas`` (leading client axis) with
  ``present`` (``[K]``, 1 for a client in the round, 0 for an empty slot): each clipped to
  ``clip_norm`` (``clip``), summed, ``noised``. Returns ``(mean, norms)``, the clients' norms
  before clipping."""
  clipped, norms = jax.vmap(clip, in_axes=(0, None))(deltas, clip_norm)
  present = present.astype(jnp.float32)
  total = jax.tree.map(lambda x: jnp.tensordot(present, x.astype(jnp.float32), axes=1)
                       .astype(x.dtype), clipped)
  return noised(total, clip_norm, noise_multiplier, expected_count, key), norms


class AdaptiveClip(NamedTuple):
  """Adaptive clipping's settings.

  Andrew et al. 2021, Differentially Private Learning with Adaptive Clipping: the clip norm moves
  towards the ``gamma`` quantile of the clients' update norms: ``C <- C exp(-eta_C (b - gamma))``
  with ``b`` the noised fraction of clients at or below ``C``.

  Attributes:
    target_quantile: ``gamma``.
    clip_lr: ``eta_C``, the clip's learning rate.
    count_noise_std: ``sigma_b``, the count's noise std.
  """
  target_quantile: float
  clip_lr: float
  count_noise_std: float


def noised_fraction(centred_sum, expected_count, count_noise_std, key):
  """``b = (sum_i m_i ([||Delta_i|| <= C] - 1/2) + N(0, sigma_b^2)) / W + 1/2``, from the sum of
  the present clients' centred bits, whose sum one client moves by at most 1/2 (added or
  removed), as the paper counts them."""
  noise = count_noise_std * jax.random.normal(key, (), jnp.float32)
  return (centred_sum + noise) / expected_count + 0.5


def next_clip(clip_norm, fraction, adaptive: AdaptiveClip):
  """``C exp(-eta_C (b - gamma))``: the clip moves towards the ``gamma`` quantile of the norms."""
  return clip_norm * jnp.exp(-adaptive.clip_lr * (fraction - adaptive.target_quantile))


def adapted_clip(clip_norm, norms, present, expected_count, adaptive: AdaptiveClip, key):
  """The next round's clip norm from the clients' update ``norms`` (``[K]``) and ``present``:
  ``next_clip`` of the ``noised_fraction`` of those at most ``clip_norm``."""
  bits = present.astype(jnp.float32) * ((norms <= clip_norm).astype(jnp.float32) - 0.5)
  return next_clip(clip_norm, noised_fraction(jnp.sum(bits), expected_count,
                                              adaptive.count_noise_std, key), adaptive)


def delta_noise_multiplier(noise_multiplier: float, count_noise_std: float) -> float:
  """``z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)``: the deltas' share of a total noise multiplier
  ``z`` when the clip count takes noise ``sigma_b`` (Andrew et al. 2021, Theorem 1); a
  ValueError when ``sigma_b`` leaves nothing for the deltas (``2 sigma_b <= z``); 0 without
  noise (no privacy claimed)."""
  if noise_multiplier == 0:
    return 0.
  rest = noise_multiplier ** -2 - (2 * count_noise_std) ** -2
  if rest <= 0:
    raise ValueError(f'--dp_clip_count_noise={count_noise_std:g} is too small for '
                     f'--dp_noise_multiplier={noise_multiplier:g}: it must exceed half of it')
  return rest ** -0.5
