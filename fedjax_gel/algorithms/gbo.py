"""FedGBO and its competitors: MFL, Mimelite, MimeXlite (seed 004, Algorithm 1, Tables 1-2).

All share global optimiser statistics ``S`` (``fedjax_gel.optim.gbo``; ``m = 0``, ``v = 1`` at
the start) that the server broadcasts with the model:

* **FedGBO**: clients step with ``S`` frozen; the server averages the models to ``x_bar``,
  recovers the average client gradient with the inverse step (old ``S``, ``K`` the weighted mean
  number of local steps), tracks ``S`` with it and sets ``x <- x_bar``.
* **MFL** (Liu et al.): clients run the ordinary optimiser from the downloaded ``S``, updating it
  every step; they upload model and statistics, and the server averages both.
* **Mimelite** (Karimireddy et al.): clients step with ``S`` frozen and also upload the full-batch
  gradient at ``x`` (computed by the engine before local training); the server averages the
  models and tracks ``S`` with the mean of those gradients. **MimeXlite** (FedGBO paper §5) uses
  one minibatch gradient at ``x`` instead.

Uploads (bytes per client, counted by the engine from the pytrees): FedGBO the model change and
its step count (4 bytes more than FedGBO's Table 1, which the server needs with heterogeneous
budgets); MFL the model change and ``S``; Mime the model change and a gradient.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_gel.algorithms.base import ClientContext, FederatedAlgorithm, RoundInfo
from fedjax_gel.algorithms.fedavg import ClientState
from fedjax_gel.optim.gbo import GlobalBiasedOptimizer

tree_map = jax.tree_util.tree_map


class GBOServerState(NamedTuple):
  params: Any
  stats: Any


class GBOUpload(NamedTuple):
  """``Delta_i = x - y_i`` and what the server needs besides: steps (FedGBO), the client's final
  statistics (MFL) or its gradient at ``x`` (Mime)."""
  delta: Any
  extra: Any


def _gbo_family(name: str, loss_fn: Callable, opt: GlobalBiasedOptimizer, *, frozen: bool,
                extra: Callable, server_stats: Callable, anchor: str = 'none') -> FederatedAlgorithm:
  """Shared body. ``frozen``: clients step with the broadcast statistics (kept out of the client
  state, so they are neither copied per client nor masked every step); otherwise they carry and
  update their own (MFL). ``extra(state, ctx)`` is the upload beyond Delta;
  ``server_stats(x, x_bar, stats, mean_extra)`` the new statistics."""
  client_opt = opt.client_optimizer if frozen else opt.tracking_optimizer

  def server_init(params):
    return GBOServerState(params, opt.init_stats(params))

  def client_init(bcast, ctx: ClientContext):
    del ctx
    x, stats = bcast
    return ClientState(x, None if frozen else stats)

  def client_step(state: ClientState, batch, bcast):
    loss, grads = jax.value_and_grad(loss_fn)(state.params, batch)
    stats = bcast[1] if frozen else state.opt_state
    updates, stats = client_opt(stats).update(grads, stats, state.params)
    return ClientState(optax.apply_updates(state.params, updates),
                       None if frozen else stats), loss

  def client_final(state: ClientState, bcast, ctx: ClientContext):
    return GBOUpload(optax.tree_utils.tree_sub(bcast[0], state.params), extra(state, ctx))

  def server_update(state: GBOServerState, upload: GBOUpload, info: RoundInfo):
    del info
    x = state.params
    x_bar = optax.tree_utils.tree_sub(x, upload.delta)
    return GBOServerState(x_bar, server_stats(x, x_bar, state.stats, upload.extra))

  def anchor_grad(bcast, batch):
    return jax.grad(loss_fn)(bcast[0], batch)

  return FederatedAlgorithm(name, server_init, lambda s: (s.params, s.stats), client_init,
                            client_step, client_final, server_update, lambda s: s.params,
                            anchor, anchor_grad if anchor != 'none' else None)


def fedgbo(loss_fn: Callable, opt: GlobalBiasedOptimizer) -> FederatedAlgorithm:
  """FedGBO: frozen global statistics on clients; inverse and tracking steps on the server.

  Rounds in which no client took a step leave the statistics as they are.
  """
  def server_stats(x, x_bar, stats, mean_steps):
    new = opt.server_update(x, x_bar, stats, jnp.maximum(mean_steps, 1e-30))
    return tree_map(lambda n, o: jnp.where(mean_steps > 0, n, o), new, stats)

  return _gbo_family(f'fedgbo_{opt.kind}', loss_fn, opt, frozen=True,
                     extra=lambda state, ctx: ctx.budget.astype(jnp.float32),
                     server_stats=server_stats)


def mfl(loss_fn: Callable, opt: GlobalBiasedOptimizer) -> FederatedAlgorithm:
  """MFL: clients update the downloaded statistics; the server averages models and statistics."""
  return _gbo_family(f'mfl_{opt.kind}', loss_fn, opt, frozen=False,
                     extra=lambda state, ctx: state.opt_state,
                     server_stats=lambda x, x_bar, stats, mean_stats: mean_stats)


def mime(loss_fn: Callable, opt: GlobalBiasedOptimizer, full_batch: bool = True
         ) -> FederatedAlgorithm:
  """Mimelite (``full_batch=True``) or MimeXlite (one minibatch): frozen statistics on clients,
  tracked on the server with the mean client gradient at ``x``."""
  name = 'mimelite' if full_batch else 'mimexlite'
  return _gbo_family(f'{name}_{opt.kind}', loss_fn, opt, frozen=True,
                     extra=lambda state, ctx: ctx.anchor,
                     server_stats=lambda x, x_bar, stats, mean_grad: opt.track(stats, mean_grad),
                     anchor='full_batch' if full_batch else 'minibatch')
