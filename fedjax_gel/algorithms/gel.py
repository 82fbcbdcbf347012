"""GeL, guess and learn (Dhasade et al., AAAI; seed 000 Algorithm 1, Table 3).

Clients run SGD with momentum for their ``tau_i`` gradient steps, then take ``tau'_i`` guessed
steps (``ClientContext.guesses``, set by the cohort's guess policy). With the zero proxy the
guesses are eq. 5's nudge ``alpha (1 - alpha^tau') / (1 - alpha) v`` in closed form; with the
last-gradient proxy (seed 001) the client optimiser is re-applied with the last gradient.

* ``gel``: FedAvgCM + GeL (client SGDM with guesses, server SGD or any optax server optimiser;
  FedYogi + GeL is ``gel`` with ``fedjax_gel.optim.fedyogi`` on the server).
* ``fedavg_gel``: FedAvg's plain client SGD with guesses. Table 3 of seed 000 lists FedAvg's GeL
  version as SGDM with guesses, which is ``gel`` itself; with SGD the zero proxy guesses nothing,
  so ``fedavg_gel`` uses the last-gradient proxy of seed 001 by default.
"""
from __future__ import annotations

from typing import Callable

import optax

from fedjax_gel.algorithms.base import FederatedAlgorithm
from fedjax_gel.algorithms.fedavg import local_sgd
from fedjax_gel.optim.guessed import gel_sgdm, guessing


def gel_client_optimizer(client_lr: float, momentum: float, proxy: str = 'zero'):
  """GeL's ClientOpt: SGDM whose guesses are eq. 5 (zero proxy) or last-gradient steps."""
  if proxy == 'zero':
    return gel_sgdm(client_lr, momentum)
  return guessing(optax.sgd(client_lr, momentum=momentum or None), proxy)


def gel(loss_fn: Callable, client_lr: float, momentum: float = 0.9,
        server_optimizer: optax.GradientTransformation | None = None, proxy: str = 'zero',
        name: str = 'gel') -> FederatedAlgorithm:
  """FedAvgCM + GeL."""
  return local_sgd(loss_fn, gel_client_optimizer(client_lr, momentum, proxy), server_optimizer,
                   name=name)


def fedavg_gel(loss_fn: Callable, client_lr: float,
               server_optimizer: optax.GradientTransformation | None = None,
               proxy: str = 'last_gradient') -> FederatedAlgorithm:
  """FedAvg + GeL: client SGD with guessed steps (last-gradient proxy by default)."""
  if proxy == 'zero':
    raise ValueError('fedavg_gel: plain SGD has no momentum, so zero-proxy guesses are no-ops; '
                     'use the last_gradient proxy, or gel for SGDM with guesses')
  return local_sgd(loss_fn, guessing(optax.sgd(client_lr), proxy), server_optimizer,
                   name='fedavg_gel')
