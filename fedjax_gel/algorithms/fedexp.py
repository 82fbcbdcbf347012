"""FedExP (Jhunjhunwala et al., ICLR 2023): FedAvg with an extrapolated server step.

Clients run SGD as in FedAvg and also upload ``||Delta_i||^2``; the server steps
``x <- x - eta_g Delta`` with ``Delta = sum_i p_i Delta_i`` and

    eta_g = max(1, sum_i p_i ||Delta_i||^2 / (2 (||Delta||^2 + eps))),

so ``eta_g >= 1`` always, and grows when the client updates disagree (the extrapolated parallel
projection method). ``eps = 1e-3`` as in the paper's experiments. Each round reports ``eta_g``
(``FederatedAlgorithm.diagnostics``; in the experiment's metrics records).

Extrapolated iterates oscillate, so the paper evaluates the mean of the last two,
``(x^t + x^{t-1}) / 2`` (its code does too); ``average_last_two`` (default) makes that the
model evaluated and saved (``server_params``; ``x^{-1} = x^0``), while the clients always
receive ``x^t``.
"""
from __future__ import annotations

import dataclasses

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_gel.core.algorithm import FederatedAlgorithm
from fedjax_gel.spec import AlgorithmSpec, hparam, positive
from fedjax_gel.algorithms.fedavg import POSITIVE, check, local_sgd


class FedExPState(NamedTuple):
  """``x^t`` (broadcast), the base's server optimiser state (unused by FedExP's own step) and
  ``x^{t-1}``."""
  params: Any
  opt_state: Any
  previous: Any


class FedExPUpload(NamedTuple):
  delta: Any
  sq_norm: jax.Array


def sq_norm(tree) -> jax.Array:
  return sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree_util.tree_leaves(tree))


def server_step_size(mean_sq_norm, delta, eps: float) -> jax.Array:
  """``eta_g = max(1, sum_i p_i ||Delta_i||^2 / (2 (||Delta||^2 + eps)))``."""
  return jnp.maximum(1., mean_sq_norm / (2. * (sq_norm(delta) + eps)))


def fedexp(loss_fn: Callable, client_lr: float, eps: float = 1e-3,
           average_last_two: bool = True) -> FederatedAlgorithm:
  """Builds FedExP: FedAvg with an extrapolated server step, client SGD.

  FedExP (Jhunjhunwala et al. 2023, FedExP: Speeding Up Federated Averaging via
  Extrapolation): clients also upload ``||Delta_i||^2`` and the server steps ``x <- x - eta_g
  Delta`` with ``eta_g = max(1, sum_i p_i ||Delta_i||^2 / (2 (||Delta||^2 + eps)))``, reported
  each round as the diagnostic ``eta_g``.

  Args:
    loss_fn: ``(params, batch) -> scalar`` mean minibatch loss.
    client_lr: the clients' learning rate, positive and finite.
    eps: the step size's ``eps``, positive (``1e-3`` as in the paper's experiments).
    average_last_two: the model evaluated and saved (``server_params``) is ``(x^t + x^{t-1}) /
      2``, as the paper and its code evaluate (extrapolated iterates oscillate); else ``x^t``.
      The clients always receive ``x^t``.

  Returns:
    The ``FederatedAlgorithm``, named ``'fedexp'``.

  Raises:
    ValueError: a concrete learning rate or ``eps`` not positive and finite.
  """
  check('fedexp', 'client_lr', client_lr, POSITIVE)
  check('fedexp', 'eps', eps, POSITIVE)
  base = local_sgd(loss_fn, optax.sgd(client_lr), name='fedexp')

  def server_init(params):
    return FedExPState(params, base.server_init(params).opt_state, params)

  def client_final(state, x, ctx):
    delta = base.client_final(state, x, ctx)
    return FedExPUpload(delta, sq_norm(delta))

  def server_update(state: FedExPState, upload: FedExPUpload, info):
    del info
    eta = server_step_size(upload.sq_norm, upload.delta, eps)
    params = jax.tree_util.tree_map(lambda x, d: x - (eta * d).astype(x.dtype), state.params,
                                    upload.delta)
    return FedExPState(params, state.opt_state, state.params)

  def server_params(state: FedExPState):
    if not average_last_two:
      return state.params
    return jax.tree_util.tree_map(lambda x, x0: ((x + x0) / 2).astype(x.dtype), state.params,
                                  state.previous)

  def diagnostics(state, upload: FedExPUpload, info):
    del state, info
    return {'eta_g': server_step_size(upload.sq_norm, upload.delta, eps)}

  return base._replace(server_init=server_init, client_final=client_final,
                       server_update=server_update, server_params=server_params,
                       diagnostics=diagnostics)


@dataclasses.dataclass(frozen=True)
class FedExPHparams:
  fedexp_eps: float = hparam(1e-3, 'FedExP eps in its server step size eta_g.', positive)
  fedexp_average: bool = hparam(
      True, 'FedExP: evaluate and save the mean of the last two server models, (x^t + x^{t-1}) '
      "/ 2, as the paper and its code do (its extrapolated iterates oscillate); the clients "
      'always receive x^t.')


FEDEXP = AlgorithmSpec('fedexp', lambda hp, s: fedexp(s.loss, s.client_lr, hp.fedexp_eps,
                                                      hp.fedexp_average),
                       FedExPHparams, own_server=True,
                       server='`x - eta_g Delta`, `eta_g = max(1, sum_i p_i ||Delta_i||^2 / '
                       '(2(||Delta||^2 + eps)))`; the model evaluated and saved '
                       '`(x^t + x^{t-1}) / 2` with `--fedexp_average`, the clients\' `x^t`',
                       paper='Jhunjhunwala et al. 2023, "FedExP: Speeding Up Federated '
                       'Averaging via Extrapolation"')
