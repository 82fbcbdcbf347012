"""FedProx (Li et al. 2020) and FedProx + GeL (seed 000, Table 3: proximal SGDM clients).

Client gradient ``g + mu (y - x)`` for the proximal objective ``f(y) + mu/2 ||y - x||^2``
(``mu = 0.01`` in GeL's experiments). With GeL, the guessed steps (eq. 5) use the momentum
alone: the guess ignores the proximal term.
"""
from __future__ import annotations

from typing import Callable

import optax

from fedjax_gel.algorithms.base import FederatedAlgorithm
from fedjax_gel.algorithms.fedavg import local_sgd
from fedjax_gel.algorithms.gel import gel_client_optimizer


def fedprox(loss_fn: Callable, client_lr: float, mu: float = 0.01, momentum: float = 0.9,
            server_optimizer: optax.GradientTransformation | None = None,
            guesses: bool = False, proxy: str = 'zero') -> FederatedAlgorithm:
  """FedProx with client SGD(M); ``guesses=True`` gives FedProx + GeL (zero proxy only: the
  last-gradient proxy would carry the proximal term into the guesses)."""
  if guesses and proxy != 'zero':
    raise ValueError('fedprox_gel guesses with the zero proxy only (the guess ignores the '
                     f'proximal term), got {proxy!r}')
  client = (gel_client_optimizer(client_lr, momentum, proxy) if guesses
            else optax.sgd(client_lr, momentum=momentum or None))
  return local_sgd(loss_fn, client, server_optimizer, prox_mu=mu,
                   name='fedprox_gel' if guesses else 'fedprox')
