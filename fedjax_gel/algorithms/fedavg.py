"""FedAvg and FedAvgCM: client optax optimiser for ``tau_i`` steps, server optax step on Delta.

``Delta_i = x - y_i``; the server applies any optax transformation to the weighted mean
``Delta = sum_i p_i Delta_i`` as if it were a gradient, so ``optax.sgd(1.0)`` gives
``x <- sum_i p_i y_i`` (FedAvg, McMahan et al. 2017). FedAvgCM is client SGD with momentum
``v <- alpha v - lr g; y <- y + v`` (== ``optax.sgd(lr, momentum=alpha)``), reset every round.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import optax

from fedjax_gel.algorithms.base import ClientContext, FederatedAlgorithm, RoundInfo


class ServerState(NamedTuple):
  params: Any
  opt_state: Any


class ClientState(NamedTuple):
  params: Any
  opt_state: Any


def fedavg(loss_fn: Callable, client_optimizer: optax.GradientTransformation,
           server_optimizer: optax.GradientTransformation | None = None,
           name: str = 'fedavg') -> FederatedAlgorithm:
  """Federated averaging with an arbitrary client and server optax optimiser.

  Args:
    loss_fn: ``(params, batch) -> scalar`` mean minibatch loss.
    client_optimizer: e.g. ``optax.sgd(lr)`` (FedAvg) or ``optax.sgd(lr, momentum=0.9)``
      (FedAvgCM); its state starts from ``init`` every round (stateless clients).
    server_optimizer: applied to ``Delta``; default ``optax.sgd(1.0)``.
  """
  server_optimizer = server_optimizer or optax.sgd(1.0)

  def server_init(params):
    return ServerState(params, server_optimizer.init(params))

  def client_init(x, ctx: ClientContext):
    del ctx
    return ClientState(x, client_optimizer.init(x))

  def client_step(state: ClientState, batch, x):
    del x
    loss, grads = jax.value_and_grad(loss_fn)(state.params, batch)
    updates, opt_state = client_optimizer.update(grads, state.opt_state, state.params)
    return ClientState(optax.apply_updates(state.params, updates), opt_state), loss

  def client_final(state: ClientState, x, ctx: ClientContext):
    del ctx
    return optax.tree_utils.tree_sub(x, state.params)

  def server_update(state: ServerState, delta, info: RoundInfo):
    del info
    updates, opt_state = server_optimizer.update(delta, state.opt_state, state.params)
    return ServerState(optax.apply_updates(state.params, updates), opt_state)

  return FederatedAlgorithm(name, server_init, lambda s: s.params, client_init, client_step,
                            client_final, server_update, lambda s: s.params)


def fedavgcm(loss_fn: Callable, client_lr: float, momentum: float = 0.9,
             server_optimizer: optax.GradientTransformation | None = None) -> FederatedAlgorithm:
  """FedAvg with client momentum (GeL's FedAvgCM baseline): client ``optax.sgd(lr, momentum)``."""
  return fedavg(loss_fn, optax.sgd(client_lr, momentum=momentum), server_optimizer, 'fedavgcm')
