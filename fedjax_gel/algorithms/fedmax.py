"""FedMAX (Chen et al. 2020): FedAvg whose client loss adds a maximum-entropy term.

Client loss ``CE + beta * KL(U || softmax(a))`` over the model's penultimate activations ``a``
(``Model.features``); client SGD, any server optimiser. For logistic regression the penultimate
activations are the inputs themselves, which no parameter moves: FedMAX is then FedAvg.
"""
from __future__ import annotations

import optax

from fedjax_gel.core.algorithm import FederatedAlgorithm
from fedjax_gel.algorithms.fedavg import local_sgd
from fedjax_gel.models.base import Model, max_entropy_loss


def fedmax(model: Model, client_lr: float, beta: float = 1.0,
           server_optimizer: optax.GradientTransformation | None = None) -> FederatedAlgorithm:
  """FedMAX with client SGD and entropy weight ``beta``."""
  return local_sgd(max_entropy_loss(model, beta), optax.sgd(client_lr), server_optimizer,
                   name='fedmax')
