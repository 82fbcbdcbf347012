"""FedExP (Jhunjhunwala et al., ICLR 2023): FedAvg with an extrapolated server step.

Clients run SGD as in FedAvg and also upload ``||Delta_i||^2``; the server steps
``x <- x - eta_g Delta`` with ``Delta = sum_i p_i Delta_i`` and

    eta_g = max(1, sum_i p_i ||Delta_i||^2 / (2 (||Delta||^2 + eps))),

so ``eta_g >= 1`` always, and grows when the client updates disagree (the extrapolated parallel
projection method). ``eps = 1e-3`` as in the paper's experiments. Each round reports ``eta_g``
(``FederatedAlgorithm.diagnostics``; in the experiment's metrics records).
"""
from __future__ import annotations

import dataclasses

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_gel.core.algorithm import FederatedAlgorithm
from fedjax_gel.core.spec import AlgorithmSpec, hparam, positive
from fedjax_gel.algorithms.fedavg import ServerState, local_sgd


class FedExPUpload(NamedTuple):
  delta: Any
  sq_norm: jax.Array


def sq_norm(tree) -> jax.Array:
  return sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree_util.tree_leaves(tree))


def server_step_size(mean_sq_norm, delta, eps: float) -> jax.Array:
  """``eta_g = max(1, sum_i p_i ||Delta_i||^2 / (2 (||Delta||^2 + eps)))``."""
  return jnp.maximum(1., mean_sq_norm / (2. * (sq_norm(delta) + eps)))


def fedexp(loss_fn: Callable, client_lr: float, eps: float = 1e-3) -> FederatedAlgorithm:
  """FedExP with client SGD."""
  base = local_sgd(loss_fn, optax.sgd(client_lr), name='fedexp')

  def client_final(state, x, ctx):
    delta = base.client_final(state, x, ctx)
    return FedExPUpload(delta, sq_norm(delta))

  def server_update(state: ServerState, upload: FedExPUpload, info):
    del info
    eta = server_step_size(upload.sq_norm, upload.delta, eps)
    params = jax.tree_util.tree_map(lambda x, d: x - (eta * d).astype(x.dtype), state.params,
                                    upload.delta)
    return ServerState(params, state.opt_state)

  def diagnostics(state, upload: FedExPUpload, info):
    del state, info
    return {'eta_g': server_step_size(upload.sq_norm, upload.delta, eps)}

  return base._replace(client_final=client_final, server_update=server_update,
                       diagnostics=diagnostics)


@dataclasses.dataclass(frozen=True)
class FedExPHparams:
  fedexp_eps: float = hparam(1e-3, 'FedExP eps in its server step size eta_g.', positive)


FEDEXP = AlgorithmSpec('fedexp', lambda hp, s: fedexp(s.loss, s.client_lr, hp.fedexp_eps),
                       FedExPHparams, own_server=True,
                       server='`x - eta_g Delta`, `eta_g = max(1, sum_i p_i ||Delta_i||^2 / '
                       '(2(||Delta||^2 + eps)))`',
                       paper='Jhunjhunwala et al. 2023, "FedExP: Speeding Up Federated '
                       'Averaging via Extrapolation"')
