"""FedMAX (Chen et al. 2020): FedAvg whose client loss adds a maximum-entropy term.

Client loss ``CE + beta * KL(U || softmax(a))`` over the model's penultimate activations ``a``
(``Model.features``); client SGD, any server optimiser. For logistic regression the penultimate
activations are the inputs themselves, which no parameter moves: FedMAX is then FedAvg.
"""
from __future__ import annotations

import dataclasses

import optax

from fedjax_gel.core.algorithm import FederatedAlgorithm
from fedjax_gel.spec import AlgorithmSpec, at_least, hparam
from fedjax_gel.algorithms.fedavg import AT_LEAST_ZERO, POSITIVE, check, local_sgd
from fedjax_gel.models.base import Model
from fedjax_gel.models.losses import max_entropy_loss


def fedmax(model: Model, client_lr: float, beta: float = 1.0,
           server_optimizer: optax.GradientTransformation | None = None) -> FederatedAlgorithm:
  """Builds FedMAX: FedAvg whose client loss adds a maximum-entropy term, client SGD.

  FedMAX (Chen et al. 2020, FedMAX: Mitigating Activation Divergence for Accurate and
  Communication-Efficient Federated Learning): the client loss is ``CE + beta * KL(U ||
  softmax(a))`` over the model's penultimate activations ``a`` (``Model.features``;
  ``models.max_entropy_loss``). For logistic regression they are the inputs, which no parameter
  moves: FedMAX is then FedAvg.

  Args:
    model: the ``Model`` (its ``features`` give the penultimate activations).
    client_lr: the clients' learning rate, positive and finite.
    beta: the entropy term's weight, at least 0.
    server_optimizer: applied to the mean update; default ``optax.sgd(1.0)``.

  Returns:
    The ``FederatedAlgorithm``, named ``'fedmax'``.

  Raises:
    ValueError: a concrete learning rate or ``beta`` outside its range.
  """
  check('fedmax', 'client_lr', client_lr, POSITIVE)
  check('fedmax', 'beta', beta, AT_LEAST_ZERO)
  return local_sgd(max_entropy_loss(model, beta), optax.sgd(client_lr), server_optimizer,
                   name='fedmax')


@dataclasses.dataclass(frozen=True)
class FedMaxHparams:
  fedmax_beta: float = hparam(1.0, 'FedMAX entropy weight beta.', at_least(0))


def _check(c):
  if c.model.name == 'logistic':
    return ('--algorithm=fedmax with --model=logistic is FedAvg (no hidden layer: the '
            'penultimate activations are the inputs); use --model=mlp')
  return None


FEDMAX = AlgorithmSpec('fedmax',
                       lambda hp, s: fedmax(s.model, s.client_lr, hp.fedmax_beta, s.server),
                       FedMaxHparams, check=_check, upload_delta=True,
                       client='SGD on cross-entropy + `beta KL(U || softmax(penultimate '
                       'activations))` (needs a hidden layer: `--model=mlp`)',
                       paper='Chen et al. 2020, "FedMAX"')
