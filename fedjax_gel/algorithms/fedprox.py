"""FedProx (Li et al. 2020) and FedProx + GeL (Boukhari et al. 2023, GeL, Table 3: proximal SGDM
clients).

Client gradient ``g + mu (y - x)`` for the proximal objective ``f(y) + mu/2 ||y - x||^2``
(``mu = 0.01`` in GeL's experiments). With GeL, the guessed steps (eq. 5) use the momentum
alone: the guess ignores the proximal term.
"""
from __future__ import annotations

import dataclasses

from typing import Callable

import optax

from fedjax_gel.core.algorithm import FederatedAlgorithm
from fedjax_gel.algorithms.fedavg import (AT_LEAST_ZERO, MOMENTUM, POSITIVE, check, local_sgd,
                                          static_zero)
from fedjax_gel.algorithms.gel import GelHparams, GuessPolicy, check_guesses, checked_policy
from fedjax_gel.spec import AlgorithmSpec, at_least, hparam
from fedjax_gel.optim.guessed import gel_sgdm


def fedprox(loss_fn: Callable, client_lr: optax.ScalarOrSchedule, mu: float = 0.01,
            momentum: float = 0.9, server_optimizer: optax.GradientTransformation | None = None
            ) -> FederatedAlgorithm:
  """Builds FedProx with client SGD(M).

  FedProx (Li et al. 2020, Federated Optimization in Heterogeneous Networks): clients step on
  the gradient ``g + mu (y - x)`` of the proximal objective ``f(y) + mu/2 ||y - x||^2``.

  Args:
    loss_fn: ``(params, batch) -> scalar`` mean minibatch loss.
    client_lr: the clients' learning rate (or an optax schedule), positive and finite.
    mu: the proximal weight, at least 0 (``0.01`` in GeL's experiments).
    momentum: the clients' momentum in ``[0, 1)``; 0: plain SGD.
    server_optimizer: applied to the mean update; default ``optax.sgd(1.0)``.

  Returns:
    The ``FederatedAlgorithm``, named ``'fedprox'``.

  Raises:
    ValueError: a concrete hyper-parameter outside its range.
    TypeError: a hyper-parameter that is no number.

  Examples:
    >>> import fedjax_gel as fg
    >>> model = fg.get_model('logistic', (60,), 5)
    >>> alg = fg.algorithms.fedprox(fg.cross_entropy_loss(model), client_lr=0.01, mu=0.01)
  """
  check('fedprox', 'client_lr', client_lr, POSITIVE)
  check('fedprox', 'mu', mu, AT_LEAST_ZERO)
  check('fedprox', 'momentum', momentum, MOMENTUM)
  sgd = optax.sgd(client_lr, momentum=None if static_zero(momentum) else momentum)
  return local_sgd(loss_fn, sgd, server_optimizer,
                   prox_mu=mu, name='fedprox')


def fedprox_gel(loss_fn: Callable, client_lr: optax.ScalarOrSchedule, mu: float = 0.01,
                momentum: float = 0.9,
                server_optimizer: optax.GradientTransformation | None = None,
                guess_policy: GuessPolicy = GuessPolicy()) -> FederatedAlgorithm:
  """Builds FedProx + GeL: proximal SGDM clients with guessed steps (Boukhari et al. 2023, GeL).

  GeL's Table 3 version of FedProx: the clients' gradient is ``g + mu (y - x)``, and their
  guessed steps (eq. 5) use the momentum alone, with the zero proxy: the guess ignores the
  proximal term (the last-gradient proxy would carry it into the guesses).

  Args:
    loss_fn: ``(params, batch) -> scalar`` mean minibatch loss.
    client_lr: the clients' learning rate (or an optax schedule), positive and finite.
    mu: the proximal weight, at least 0.
    momentum: ``alpha``, in ``[0, 1)``; above 0 (zero-proxy guesses need momentum).
    server_optimizer: applied to the mean update; default ``optax.sgd(1.0)``.
    guess_policy: how many guesses each client takes (default GeL's ``tau' = b + 5 -
      tau_i``).

  Returns:
    The ``FederatedAlgorithm``, named ``'fedprox_gel'``.

  Raises:
    ValueError: a concrete hyper-parameter outside its range, a policy out of range, or
      guesses without momentum.
  """
  check('fedprox_gel', 'client_lr', client_lr, POSITIVE)
  check('fedprox_gel', 'mu', mu, AT_LEAST_ZERO)
  policy = checked_policy('fedprox_gel', guess_policy, 'zero', momentum)
  return local_sgd(loss_fn, gel_sgdm(client_lr, momentum), server_optimizer, prox_mu=mu,
                   client_guesses=policy.counts, name='fedprox_gel')


@dataclasses.dataclass(frozen=True)
class ProxHparams:
  prox_mu: float = hparam(0.01, 'FedProx proximal weight mu (fedprox, fedprox_gel).', at_least(0))


@dataclasses.dataclass(frozen=True)
class ProxGelHparams(GelHparams, ProxHparams):
  """FedProx's ``mu`` and GeL's guesses."""


FEDPROX = AlgorithmSpec(
    'fedprox', lambda hp, s: fedprox(s.loss, s.client_lr, hp.prox_mu, s.client_momentum,
                                     s.server),
    ProxHparams, client='proximal SGDM', momentum=True, upload_delta=True,
    paper='Li et al. 2020, "Federated Optimization in '
    'Heterogeneous Networks"')
FEDPROX_GEL = AlgorithmSpec(
    'fedprox_gel', lambda hp, s: fedprox_gel(s.loss, s.client_lr, hp.prox_mu,
                                             s.client_momentum, s.server, hp.policy),
    ProxGelHparams, client='proximal SGDM + zero-proxy guesses that ignore the proximal term',
    guesses=True, momentum=True,
    check=check_guesses('fedprox_gel', zero_proxy_only='the guess ignores the proximal term'),
    paired_with='fedprox', upload_delta=True,
    paper='GeL Table 2')
