"""FedProx (Li et al. 2020) and FedProx + GeL (Boukhari et al. 2023, GeL, Table 3: proximal SGDM
clients).

Client gradient ``g + mu (y - x)`` for the proximal objective ``f(y) + mu/2 ||y - x||^2``
(``mu = 0.01`` in GeL's experiments). With GeL, the guessed steps (eq. 5) use the momentum
alone: the guess ignores the proximal term.
"""
from __future__ import annotations

from typing import Callable

import optax

from fedjax_gel.core.algorithm import FederatedAlgorithm
from fedjax_gel.algorithms.fedavg import local_sgd
from fedjax_gel.algorithms.gel import GuessPolicy, checked_policy
from fedjax_gel.optim.guessed import gel_sgdm


def fedprox(loss_fn: Callable, client_lr: optax.ScalarOrSchedule, mu: float = 0.01,
            momentum: float = 0.9, server_optimizer: optax.GradientTransformation | None = None
            ) -> FederatedAlgorithm:
  """FedProx with client SGD(M)."""
  return local_sgd(loss_fn, optax.sgd(client_lr, momentum=momentum or None), server_optimizer,
                   prox_mu=mu, name='fedprox')


def fedprox_gel(loss_fn: Callable, client_lr: optax.ScalarOrSchedule, mu: float = 0.01,
                momentum: float = 0.9,
                server_optimizer: optax.GradientTransformation | None = None,
                guess_policy: GuessPolicy = GuessPolicy()) -> FederatedAlgorithm:
  """FedProx + GeL: proximal SGDM with zero-proxy guesses (the last-gradient proxy would carry
  the proximal term into the guesses); ``guess_policy`` defaults to GeL's ``tau' = b + 5 -
  tau_i``."""
  policy = checked_policy('fedprox_gel', guess_policy, 'zero', momentum)
  return local_sgd(loss_fn, gel_sgdm(client_lr, momentum), server_optimizer, prox_mu=mu,
                   client_guesses=policy.counts, name='fedprox_gel')
