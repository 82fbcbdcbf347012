"""FedNova (Wang et al. 2020) and FedNova + GeL (Boukhari et al. 2023, GeL, Table 3: SGDM clients).

``x <- x - tau_eff * sum_i p_i Delta_i / ||a_i||_1`` with ``tau_eff = sum_i p_i ||a_i||_1``, where
``a_i`` are the coefficients of the client's accumulated update ``-lr sum_k a_ik g_k``. For SGD
with momentum ``alpha`` and ``tau'_i`` zero-proxy guesses (GeL's Lemma 1):
``||a_i||_1 = [tau_i - alpha^(tau'_i+1) (1 - alpha^tau_i) / (1 - alpha)] / (1 - alpha)``; without
guesses ``tau'_i = 0``; plain SGD gives ``tau_i``. With equal budgets FedNova is FedAvg.
"""
from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
import optax

from fedjax_gel.core.algorithm import ClientContext, FederatedAlgorithm
from fedjax_gel.algorithms.fedavg import MOMENTUM, POSITIVE, check, local_sgd, static_zero
from fedjax_gel.algorithms.gel import GelHparams, GuessPolicy, check_guesses, checked_policy
from fedjax_gel.spec import AlgorithmSpec
from fedjax_gel.optim.guessed import gel_sgdm, momentum_coefficients_l1


def fednova(loss_fn: Callable, client_lr: float, momentum: float = 0.9,
            server_optimizer: optax.GradientTransformation | None = None) -> FederatedAlgorithm:
  """Builds FedNova with client SGD(M).

  FedNova (Wang et al. 2020, Tackling the Objective Inconsistency Problem in Heterogeneous Federated
  Optimization) averages normalised updates: ``x <- x - tau_eff * sum_i p_i Delta_i / ||a_i||_1``
  with ``tau_eff = sum_i p_i ||a_i||_1``, where ``a_i`` are the coefficients of the client's
  accumulated update ``-lr sum_k a_ik g_k``: ``||a_i||_1 = [tau_i - alpha (1 - alpha^tau_i) / (1 -
  alpha)] / (1 - alpha)`` for SGD with momentum ``alpha``, ``tau_i`` for plain SGD. With equal
  budgets FedNova is FedAvg.

  Args:
    loss_fn: ``(params, batch) -> scalar`` mean minibatch loss.
    client_lr: the clients' constant learning rate, positive and finite.
    momentum: ``alpha``, in ``[0, 1)``; 0: plain SGD.
    server_optimizer: applied to the normalised mean update; default ``optax.sgd(1.0)``.

  Returns:
    The ``FederatedAlgorithm``, named ``'fednova'``.

  Raises:
    ValueError: a concrete hyper-parameter outside its range.
    TypeError: a hyper-parameter that is no number.
  """
  check('fednova', 'client_lr', client_lr, POSITIVE)
  check('fednova', 'momentum', momentum, MOMENTUM)
  def normalizer(ctx: ClientContext):
    return momentum_coefficients_l1(ctx.budget, jnp.zeros_like(ctx.guesses), momentum)

  sgd = optax.sgd(client_lr, momentum=None if static_zero(momentum) else momentum)
  return local_sgd(loss_fn, sgd, server_optimizer,
                   normalizer=normalizer, name='fednova')


def fednova_gel(loss_fn: Callable, client_lr: float, momentum: float = 0.9,
                server_optimizer: optax.GradientTransformation | None = None,
                guess_policy: GuessPolicy = GuessPolicy()) -> FederatedAlgorithm:
  """Builds FedNova + GeL: SGDM clients with guessed steps, normalised (Boukhari et al. 2023, GeL).

  Clients take zero-proxy guesses (eq. 5) after their budget and upload ``Delta_i /
  ||a_i||_1`` with GeL's Lemma 1 norm for ``tau'_i`` guesses: ``||a_i||_1 = [tau_i -
  alpha^(tau'_i+1) (1 - alpha^tau_i) / (1 - alpha)] / (1 - alpha)``.

  Args:
    loss_fn: ``(params, batch) -> scalar`` mean minibatch loss.
    client_lr: the clients' learning rate, a constant (the normaliser assumes one).
    momentum: ``alpha``, in ``(0, 1)``.
    server_optimizer: applied to the normalised mean update; default ``optax.sgd(1.0)``.
    guess_policy: how many guesses each client takes (default GeL's ``tau' = b + 5 -
      tau_i``).

  Returns:
    The ``FederatedAlgorithm``, named ``'fednova_gel'``.

  Raises:
    ValueError: a concrete learning rate outside its range, a policy out of range, or guesses
      without momentum.
  """
  check('fednova_gel', 'client_lr', client_lr, POSITIVE)
  policy = checked_policy('fednova_gel', guess_policy, 'zero', momentum)

  def normalizer(ctx: ClientContext):
    return momentum_coefficients_l1(ctx.budget, ctx.guesses, momentum)

  return local_sgd(loss_fn, gel_sgdm(client_lr, momentum), server_optimizer,
                   normalizer=normalizer, client_guesses=policy.counts, name='fednova_gel')


_NOVA_SERVER = ('`--server_optimizer` on `tau_eff sum_i p_i Delta_i / ||a_i||_1` (`||a_i||_1` of '
                'Lemma 1)')
FEDNOVA = AlgorithmSpec(
    'fednova', lambda hp, s: fednova(s.loss, s.client_lr, s.client_momentum, s.server),
    client='SGDM', server=_NOVA_SERVER, momentum=True,
    paper='Wang et al. 2020, "Tackling the Objective '
    'Inconsistency Problem in Heterogeneous Federated Optimization"')
FEDNOVA_GEL = AlgorithmSpec(
    'fednova_gel', lambda hp, s: fednova_gel(s.loss, s.client_lr, s.client_momentum, s.server,
                                             hp.policy),
    GelHparams, client='SGDM + zero-proxy guesses', server=_NOVA_SERVER, guesses=True,
    momentum=True,
    check=check_guesses('fednova_gel', zero_proxy_only="Lemma 1's ||a_i||_1"),
    paired_with='fednova',
    paper='GeL Table 2, Lemma 1')
