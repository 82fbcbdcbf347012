"""FedNova (Wang et al. 2020) and FedNova + GeL (seed 000, Table 3: SGDM clients).

``x <- x - tau_eff * sum_i p_i Delta_i / ||a_i||_1`` with ``tau_eff = sum_i p_i ||a_i||_1``, where
``a_i`` are the coefficients of the client's accumulated update ``-lr sum_k a_ik g_k``. For SGD
with momentum ``alpha`` and ``tau'_i`` zero-proxy guesses (Lemma 1 of seed 000):
``||a_i||_1 = [tau_i - alpha^(tau'_i+1) (1 - alpha^tau_i) / (1 - alpha)] / (1 - alpha)``; without
guesses ``tau'_i = 0``; plain SGD gives ``tau_i``. With equal budgets FedNova is FedAvg.
"""
from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
import optax

from fedjax_gel.algorithms.base import ClientContext, FederatedAlgorithm
from fedjax_gel.algorithms.fedavg import local_sgd
from fedjax_gel.optim.guessed import gel_sgdm, momentum_coefficients_l1


def fednova(loss_fn: Callable, client_lr: float, momentum: float = 0.9,
            server_optimizer: optax.GradientTransformation | None = None,
            guesses: bool = False) -> FederatedAlgorithm:
  """FedNova with client SGD(M); ``guesses=True`` gives FedNova + GeL (zero proxy, eq. 5)."""
  def normalizer(ctx: ClientContext):
    tau_prime = ctx.guesses if guesses else jnp.zeros_like(ctx.guesses)
    return momentum_coefficients_l1(ctx.budget, tau_prime, momentum)

  client = (gel_sgdm(client_lr, momentum) if guesses
            else optax.sgd(client_lr, momentum=momentum or None))
  return local_sgd(loss_fn, client, server_optimizer, normalizer=normalizer,
                   name='fednova_gel' if guesses else 'fednova')
