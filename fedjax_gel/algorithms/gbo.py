"""FedGBO and its competitors: MFL, Mimelite, MimeXlite (Mills, Hu, Min 2022, "Accelerating
Federated Learning with a Global Biased Optimiser", Algorithm 1, Tables 1-2).

All share global optimiser statistics ``S`` (``fedjax_gel.optim.gbo``; ``m = 0``, ``v = 1`` at
the start) that the server broadcasts with the model; every step below is one of
``GlobalBiasedOptimizer``'s optax transformations:

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

import dataclasses

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_gel.core import model_state
from fedjax_gel.core.algorithm import ClientContext, FederatedAlgorithm, RoundInfo
from fedjax_gel.algorithms.fedavg import ClientState
from fedjax_gel.spec import AlgorithmSpec, at_least, hparam, one_of, within
from fedjax_gel.optim.gbo import KINDS, GlobalBiasedOptimizer, gbo_adam, gbo_rmsprop, gbo_sgdm


class GBOServerState(NamedTuple):
  """The global model and the state of the server's transformation (its ``stats`` field, or
  itself for Mime and MFL, is ``S``)."""
  params: Any
  opt_state: Any


class GBOUpload(NamedTuple):
  """``Delta_i = x - y_i`` and what the server needs besides: steps (FedGBO), the client's final
  statistics (MFL) or its gradient at ``x`` (Mime)."""
  delta: Any
  extra: Any


def _gbo_family(name: str, loss_fn: Callable, opt: GlobalBiasedOptimizer, *, frozen: bool,
                extra: Callable, server: optax.GradientTransformationExtraArgs,
                stats_of: Callable, server_step: Callable, pre_pass: str = 'none'
                ) -> FederatedAlgorithm:
  """Shared body. ``frozen``: clients step with ``opt.client`` and the broadcast statistics as
  its extra argument (kept out of the client state, so they are neither copied per client nor
  masked every step); otherwise with ``opt.adaptive`` started from them (MFL).
  ``extra(state, ctx)`` is the upload beyond Delta; ``server`` the server's transformation,
  ``stats_of(server_opt_state) -> S`` and ``server_step(opt_state, delta, mean_extra, x) ->
  (updates, opt_state)``."""
  def server_init(params):
    return GBOServerState(params, server.init(params))

  def broadcast(state):
    return state.params, stats_of(state.opt_state)

  def client_init(bcast, ctx: ClientContext):
    del ctx
    x, stats = bcast
    if frozen:
      return ClientState(x, opt.client.init(x))
    return ClientState(x, opt.adaptive.init(x)._replace(stats=stats))

  def client_step(state: ClientState, batch, bcast):
    loss, grads = model_state.value_and_grad(loss_fn)(state.params, batch)
    if frozen:
      updates, opt_state = opt.client.update(grads, state.opt_state, state.params, stats=bcast[1])
    else:
      updates, opt_state = opt.adaptive.update(grads, state.opt_state, state.params)
    return ClientState(optax.apply_updates(state.params, updates), opt_state), loss

  def client_final(state: ClientState, bcast, ctx: ClientContext):
    return GBOUpload(optax.tree_utils.tree_sub(bcast[0], state.params), extra(state, ctx))

  def server_update(state: GBOServerState, upload: GBOUpload, info: RoundInfo):
    del info
    updates, opt_state = server_step(state.opt_state, upload.delta, upload.extra, state.params)
    return GBOServerState(optax.apply_updates(state.params, updates), opt_state)

  def pre_pass_fn(bcast, batch):
    return model_state.grad(loss_fn)(bcast[0], batch)

  return FederatedAlgorithm(name, server_init, broadcast, client_init, client_step, client_final,
                            server_update, lambda s: s.params, pre_pass,
                            pre_pass_fn if pre_pass != 'none' else None)


def fedgbo(loss_fn: Callable, opt: GlobalBiasedOptimizer) -> FederatedAlgorithm:
  """Builds FedGBO: clients step with the global optimiser's statistics frozen.

  FedGBO (Mills et al. 2022, Accelerating Federated Learning with a Global Biased Optimiser,
  Algorithm 1): clients step with ``opt.client`` and the broadcast statistics ``S`` frozen;
  the server runs ``opt.server`` on the mean model change ``Delta = x - x_bar`` with ``K`` the
  weighted mean number of local steps: the inverse step (old ``S``) recovers the mean client
  gradient, ``S`` tracks it, and ``x <- x_bar``. Rounds in which no client took a step leave
  the statistics as they are. Clients upload their model change and step count.

  Args:
    loss_fn: ``(params, batch) -> scalar`` mean minibatch loss.
    opt: the global optimiser (``optim.gbo_sgdm``, ``gbo_rmsprop``, ``gbo_adam``), with a
      constant learning rate: the inverse step needs the one the clients stepped with, and a
      schedule would be evaluated at each client's step count there, at the round here.

  Returns:
    The ``FederatedAlgorithm``, named ``'fedgbo_<kind>'``.

  Raises:
    ValueError: a learning-rate schedule.

  Examples:
    >>> import fedjax_gel as fg
    >>> from fedjax_gel import optim
    >>> model = fg.get_model('logistic', (60,), 5)
    >>> alg = fg.algorithms.fedgbo(fg.cross_entropy_loss(model),
    ...                            optim.gbo_adam(0.01, b1=0.9, b2=0.99, eps=1e-3))
    >>> alg.name
    'fedgbo_adam'
  """
  if callable(opt.learning_rate):
    raise ValueError('fedgbo: the learning rate must be a constant, not a schedule: the '
                     "server's inverse step recovers the clients' gradients with the learning "
                     'rate they stepped with (MFL and Mime take schedules)')

  def server_step(opt_state, delta, mean_steps, x):
    return opt.server.update(delta, opt_state, x, num_steps=mean_steps)

  return _gbo_family(f'fedgbo_{opt.kind}', loss_fn, opt, frozen=True,
                     extra=lambda state, ctx: ctx.budget.astype(jnp.float32), server=opt.server,
                     stats_of=lambda opt_state: opt_state.stats, server_step=server_step)


def _average(opt_state, delta, mean_stats, x):
  """MFL's server: ``x <- x_bar``, ``S <-`` the mean of the clients' statistics."""
  del opt_state, x
  return jax.tree.map(jnp.negative, delta), mean_stats


def mfl(loss_fn: Callable, opt: GlobalBiasedOptimizer) -> FederatedAlgorithm:
  """Builds MFL: clients update the downloaded statistics; the server averages both.

  MFL (Liu et al. 2020, Accelerating Federated Learning via Momentum Gradient Descent), as
  FedGBO compares with it (Mills et al. 2022): clients run the ordinary optimiser
  (``opt.adaptive``) from the downloaded statistics ``S``, updating them every step; they
  upload model change and statistics, and the server averages both (``x <- x_bar``).

  Args:
    loss_fn: ``(params, batch) -> scalar`` mean minibatch loss.
    opt: the global optimiser (``optim.gbo_sgdm``, ``gbo_rmsprop``, ``gbo_adam``); its
      learning rate may be a schedule.

  Returns:
    The ``FederatedAlgorithm``, named ``'mfl_<kind>'``.
  """
  return _gbo_family(f'mfl_{opt.kind}', loss_fn, opt, frozen=False,
                     extra=lambda state, ctx: state.opt_state.stats, server=opt.track,
                     stats_of=lambda stats: stats, server_step=_average)


def mime(loss_fn: Callable, opt: GlobalBiasedOptimizer, full_batch: bool = True
         ) -> FederatedAlgorithm:
  """Builds Mimelite or MimeXlite: frozen statistics on clients, tracked by the server.

  Mimelite (Karimireddy et al. 2021, Breaking the Centralized Barrier for Cross-Device
  Federated Learning): clients step with ``S`` frozen (``opt.client``) and also upload their
  gradient at the broadcast model ``x`` (the engine's pre-pass, before local training); the
  server sets ``x <- x_bar`` and tracks ``S`` (``opt.track``) with the mean of those
  gradients. MimeXlite (Mills et al. 2022, §5) uses one minibatch gradient at ``x`` instead.

  Args:
    loss_fn: ``(params, batch) -> scalar`` mean minibatch loss.
    opt: the global optimiser (``optim.gbo_sgdm``, ``gbo_rmsprop``, ``gbo_adam``); its
      learning rate may be a schedule.
    full_batch: Mimelite, the gradient over all the client's examples (``ceil(n_i / B)``
      gradient computations more); False: MimeXlite, its first local minibatch's.

  Returns:
    The ``FederatedAlgorithm``, named ``'mimelite_<kind>'`` or ``'mimexlite_<kind>'``.
  """
  def server_step(stats, delta, mean_grad, x):
    _, stats = opt.track.update(mean_grad, stats, x)
    return jax.tree.map(jnp.negative, delta), stats

  name = 'mimelite' if full_batch else 'mimexlite'
  return _gbo_family(f'{name}_{opt.kind}', loss_fn, opt, frozen=True,
                     extra=lambda state, ctx: ctx.pre_pass, server=opt.track,
                     stats_of=lambda stats: stats, server_step=server_step,
                     pre_pass='full_batch' if full_batch else 'minibatch')


@dataclasses.dataclass(frozen=True)
class GboHparams:
  """The global optimiser of the FedGBO family (``fedjax_gel.optim.gbo``)."""
  gbo_optimizer: str = hparam(
      'sgdm', 'Global optimiser(s) of fedgbo, mfl, mimelite, mimexlite: sgdm, rmsprop, adam '
      '(several: each of those algorithms runs once per optimiser).', one_of(*KINDS))
  gbo_beta: float = hparam(0.9, 'FedGBO family: SGDm/RMSProp decay, Adam beta1.',
                           within(0, 1, open_high=True))
  gbo_beta2: float = hparam(0.99, 'FedGBO family: Adam beta2.', within(0, 1))
  gbo_eps: float = hparam(1e-3, 'FedGBO family: RMSProp/Adam eps (adaptivity).', at_least(0))

  def reads(self, flag: str) -> bool:
    """Whether the chosen optimiser reads ``flag`` (SGDm no ``eps``, only Adam a ``beta2``)."""
    return {'gbo_eps': self.gbo_optimizer != 'sgdm',
            'gbo_beta2': self.gbo_optimizer == 'adam'}.get(flag, True)

  def optimizer(self, learning_rate) -> GlobalBiasedOptimizer:
    """The optimiser ``gbo_optimizer`` names (``gbo_beta``: SGDm's and RMSProp's decay, Adam's
    beta1)."""
    if self.gbo_optimizer == 'sgdm':
      return gbo_sgdm(learning_rate, b1=self.gbo_beta)
    if self.gbo_optimizer == 'rmsprop':
      return gbo_rmsprop(learning_rate, decay=self.gbo_beta, eps=self.gbo_eps)
    return gbo_adam(learning_rate, b1=self.gbo_beta, b2=self.gbo_beta2, eps=self.gbo_eps)


def _spec(name: str, build, **properties) -> AlgorithmSpec:
  return AlgorithmSpec(name, lambda hp, s: build(s.loss, hp.optimizer(s.client_lr)), GboHparams,
                       run_name=lambda hp: f'{name}_{hp.gbo_optimizer}', own_server=True,
                       variants=('gbo_optimizer',),
                       **properties)


_GBO = 'Mills et al. 2022, "Accelerating Federated Learning with a Global Biased Optimiser"'
_FROZEN = '`--gbo_optimizer` (SGDm, RMSProp or Adam) with the global statistics frozen'
FEDGBO = _spec('fedgbo', fedgbo, client=_FROZEN, paper=f'{_GBO}, Alg. 1, Table 2',
               server='model average; the inverse step recovers the mean client gradient, '
               'which tracks the statistics')
MFL = _spec('mfl', mfl, paper=f'Liu et al.; {_GBO}, Table 1',
            client='the same optimiser, starting from and updating the global statistics',
            server='averages models and statistics')
MIMELITE = _spec('mimelite', lambda loss, opt: mime(loss, opt, full_batch=True),
                 client=f'{_FROZEN}; also the full-batch gradient at `x`', pre_pass='full_batch',
                 server='model average; statistics track the mean of those gradients',
                 paper=f'Karimireddy et al.; {_GBO}, §5')
MIMEXLITE = _spec('mimexlite', lambda loss, opt: mime(loss, opt, full_batch=False),
                  client=f'{_FROZEN}; also one minibatch gradient at `x`', pre_pass='minibatch',
                  server='model average; statistics track the mean of those gradients',
                  paper=f'{_GBO}, §5')
