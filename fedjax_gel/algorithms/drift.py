"""Client-drift correction with per-client state: SCAFFOLD, FedDyn and AdaBest (Varno et al.
2022, AdaBest).

All three run local SGD on a corrected gradient, with a correction that is fixed for the round
and comes from the client's row of the per-client store (``ClientContext.stored``)::

    SCAFFOLD (option II):  g = grad L_i(y) + c - c_i
    FedDyn:                g = grad L_i(y) - h_i + mu (y - x)
    AdaBest:               g = grad L_i(y) - h_i

``Delta_i = x - y_i`` after ``tau_i`` steps; ``Delta = sum_i p_i Delta_i`` (the engine's weighted
mean) is AdaBest's ``g_bar^t`` and ``x - Delta`` its ``theta_bar^t``. ``|P^t|`` is the number of
real clients of the round and ``N = num_clients`` the population.

SCAFFOLD (Karimireddy et al. 2020, Alg. 1 with option II)::

    c_i+ = c_i - c + Delta_i / (tau_i lr)          (a client without steps keeps c_i)
    x   <- server_optimizer(Delta)                 (default SGD(1): x - Delta)
    c    = sum_j q_j c_j                           (q_j = 1/N by default)

The paper keeps ``c`` by the recursion ``c <- c + (1/N) sum_{i in P} (c_i+ - c_i)``, which holds
``c = (1/N) sum_j c_j`` when every sampled client is distinct. Here ``c`` is that mean itself,
read from the store when the round starts, so it stays the clients' mean when a client is
sampled twice (its row takes the mean of its two ``c_i+``) and for any weights ``q``. Clients
still upload ``(Delta_i, c_i+ - c_i)`` as in the paper, so the bytes counted are SCAFFOLD's
(twice the model each way); the server reads only ``Delta``.

FedDyn (Acar et al. 2021, in AdaBest's notation, Varno et al. 2022, Alg. 2)::

    h_i <- h_i + mu Delta_i
    h   <- h + |P^t| / N * Delta;    x <- (x - Delta) - h

AdaBest (Varno et al. 2022, Alg. 2)::

    h_i <- h_i / (t - t_i') + mu Delta_i;   t_i' <- t      (t_i' = 0 before the first round)
    h   <- beta (theta_bar^{t-1} - theta_bar^t);   x <- theta_bar^t - h

so ``h^t = sum_{s<=t} beta^(t-s+1) g_bar^s`` (Remark 3), ``beta = mu = 0`` is FedAvg (Remark 4)
and ``beta = 1`` is FedDyn's server with ``|P^t| = N`` (Remark 5).

Choices: the papers write uniform means over the cohort; here they are the engine's weighted
means (``--aggregation_weights``; ``uniform`` without replacement gives the papers' form; with
replacement a client sampled twice counts twice in ``Delta`` and ``|P^t|`` and once, averaged, in
its row). AdaBest's running average of samples per client for unbalanced data (Varno et al. 2022,
AdaBest, App. B) is not applied: the weights already carry the data sizes. Client state rows are
float32 like the model.
"""
from __future__ import annotations

import dataclasses

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_gel.core.algorithm import ClientContext, FederatedAlgorithm, RoundInfo
from fedjax_gel.algorithms.fedavg import AT_LEAST_ZERO, POSITIVE, UNIT, check, static_zero
from fedjax_gel.core import model_state, store
from fedjax_gel.core.checks import positive_int
from fedjax_gel.spec import AlgorithmSpec, at_least, hparam, within

tree_map = jax.tree_util.tree_map


class DriftClient(NamedTuple):
  params: Any
  correction: Any   # added to every gradient of the round


class ScaffoldState(NamedTuple):
  params: Any
  opt_state: Any
  clients: Any      # c_i, one row per client


class ScaffoldUpload(NamedTuple):
  delta: Any          # x - y_i
  control_delta: Any  # c_i+ - c_i (what a real client sends; c is read from the store here)


class FedDynState(NamedTuple):
  params: Any
  h: Any
  clients: Any      # h_i


class AdaBestRow(NamedTuple):
  h: Any            # h_i
  last_round: jax.Array   # t_i', 0 before the client's first round


class AdaBestState(NamedTuple):
  params: Any
  average: Any      # theta_bar^{t-1}
  round: jax.Array  # rounds done, t - 1
  clients: Any      # AdaBestRow


def corrected_sgd(loss_fn: Callable, lr: float, mu: float = 0.0):
  """``client_step`` of ``y <- y - lr (grad L(y) + correction + mu (y - x))``; with ``mu`` the
  broadcast must be ``x`` itself."""
  def client_step(state: DriftClient, batch, bcast):
    loss, grads = model_state.value_and_grad(loss_fn)(state.params, batch)
    grads = tree_map(jnp.add, grads, state.correction)
    if not static_zero(mu):
      grads = tree_map(lambda g, y, x: g + mu * (y - x), grads, state.params, bcast)
    return state._replace(params=tree_map(lambda y, g: y - lr * g, state.params, grads)), loss
  return client_step


def server_model(params, delta):
  """``theta_bar = x - Delta``."""
  return tree_map(lambda x, d: x - d.astype(x.dtype), params, delta)


def mean_row(clients, weights: np.ndarray):
  """``sum_j q_j row_j`` over a store (rows past ``len(q)`` are a sharded store's padding)."""
  q = jnp.pad(jnp.asarray(weights, jnp.float32), (0, store.num_rows(clients) - len(weights)))
  return tree_map(lambda y: jnp.tensordot(q, y.astype(jnp.float32), axes=1).astype(y.dtype),
                  clients)


def client_weights(where: str, weights, num_clients: int | None = None) -> np.ndarray:
  """``q_j`` (float64) of an objective over the clients: one finite, non-negative weight per
  client (``num_clients`` of them, where given) summing to 1; else a ValueError naming
  ``where``."""
  q = np.asarray(weights, np.float64)
  if not (q.ndim == 1 and len(q) and len(q) == (num_clients or len(q)) and
          np.isfinite(q).all() and (q >= 0).all() and abs(q.sum() - 1) <= 1e-4):
    raise ValueError(f'{where} must be one finite, non-negative weight per client'
                     f'{f" ({num_clients})" if num_clients else ""} summing to 1 (got shape '
                     f'{q.shape}{f", sum {q.sum():g}" if q.ndim == 1 and len(q) else ""})')
  return q


def scaffold(loss_fn: Callable, client_lr: float, num_clients: int,
             server_optimizer: Optional[optax.GradientTransformation] = None,
             weights=None, name: str = 'scaffold') -> FederatedAlgorithm:
  """Builds SCAFFOLD with option II control variates, client SGD.

  SCAFFOLD (Karimireddy et al. 2020, SCAFFOLD: Stochastic Controlled Averaging for Federated
  Learning, Alg. 1): clients step on ``g = grad L_i(y) + c - c_i`` and update their control
  variate ``c_i+ = c_i - c + Delta_i / (tau_i lr)`` (a client without steps keeps ``c_i``),
  kept in the per-client store; ``c = sum_j q_j c_j`` is read from the store when the round
  starts (see the module docstring).

  Args:
    loss_fn: ``(params, batch) -> scalar`` mean minibatch loss.
    client_lr: the clients' learning rate, positive and finite.
    num_clients: ``N``, the population: the store's rows (the round refuses a pool of another
      size).
    server_optimizer: steps on ``Delta`` (its learning rate is SCAFFOLD's global ``eta_g``);
      default ``optax.sgd(1.0)``.
    weights: ``q_j``, ``[num_clients]`` non-negative, summing to 1; None: ``1/N``.
    name: display name.

  Returns:
    The stateful ``FederatedAlgorithm``.

  Raises:
    ValueError: a concrete learning rate outside its range, ``num_clients`` not a positive
      integer, or ``weights`` not one non-negative value per client summing to 1.

  Examples:
    >>> import fedjax_gel as fg
    >>> model = fg.get_model('logistic', (60,), 5)
    >>> alg = fg.algorithms.scaffold(fg.cross_entropy_loss(model), client_lr=0.1,
    ...                              num_clients=1000)
  """
  check(name, 'client_lr', client_lr, POSITIVE)
  server_optimizer = server_optimizer or optax.sgd(1.0)
  num_clients = positive_int(name, 'num_clients', num_clients)
  q = (np.full(num_clients, 1. / num_clients) if weights is None else
       client_weights(f'{name}: weights', weights, num_clients))

  def server_init(params):
    return ScaffoldState(params, server_optimizer.init(params), store.zeros(params, num_clients))

  def broadcast(state: ScaffoldState):
    return state.params, mean_row(state.clients, q)

  def client_init(bcast, ctx: ClientContext):
    x, c = bcast
    return DriftClient(x, tree_map(jnp.subtract, c, ctx.stored))

  def client_final(state: DriftClient, bcast, ctx: ClientContext):
    x, c = bcast
    delta = tree_map(jnp.subtract, x, state.params)
    scale = 1. / (jnp.maximum(ctx.budget, 1) * client_lr)
    new = tree_map(lambda ci, c0, d: jnp.where(ctx.budget > 0, ci - c0 + scale * d, ci),
                   ctx.stored, c, delta)
    return ScaffoldUpload(delta, tree_map(jnp.subtract, new, ctx.stored)), new

  def server_update(state: ScaffoldState, upload: ScaffoldUpload, info: RoundInfo):
    del info
    updates, opt_state = server_optimizer.update(upload.delta, state.opt_state, state.params)
    return ScaffoldState(optax.apply_updates(state.params, updates), opt_state, state.clients)

  return FederatedAlgorithm(name, server_init, broadcast, client_init,
                            corrected_sgd(loss_fn, client_lr), client_final, server_update,
                            lambda s: s.params, store_row=store.by_client)


def feddyn(loss_fn: Callable, client_lr: float, mu: float, num_clients: int,
           name: str = 'feddyn') -> FederatedAlgorithm:
  """Builds FedDyn, client SGD on a dynamically regularised loss.

  FedDyn (Acar et al. 2021, Federated Learning Based on Dynamic Regularization; in AdaBest's
  notation, Varno et al. 2022, Alg. 2): clients step on ``g = grad L_i(y) - h_i + mu (y -
  x)``, then ``h_i <- h_i + mu Delta_i`` (the per-client store); the server keeps ``h <- h +
  |P^t| / N * Delta`` and sets ``x <- (x - Delta) - h``.

  Args:
    loss_fn: ``(params, batch) -> scalar`` mean minibatch loss.
    client_lr: the clients' learning rate, positive and finite.
    mu: the dynamic regulariser's weight (FedDyn's ``alpha``), at least 0.
    num_clients: ``N``, the population: the store's rows.
    name: display name.

  Returns:
    The stateful ``FederatedAlgorithm``.

  Raises:
    ValueError: a concrete hyper-parameter outside its range, or ``num_clients`` not a
      positive integer.
  """
  check(name, 'client_lr', client_lr, POSITIVE)
  check(name, 'mu', mu, AT_LEAST_ZERO)
  num_clients = positive_int(name, 'num_clients', num_clients)
  def server_init(params):
    return FedDynState(params, tree_map(jnp.zeros_like, params), store.zeros(params, num_clients))

  def client_init(x, ctx: ClientContext):
    return DriftClient(x, tree_map(jnp.negative, ctx.stored))

  def client_final(state: DriftClient, x, ctx: ClientContext):
    delta = tree_map(jnp.subtract, x, state.params)
    return delta, tree_map(lambda h, d: h + mu * d, ctx.stored, delta)

  def server_update(state: FedDynState, delta, info: RoundInfo):
    frac = info.num_clients / num_clients
    h = tree_map(lambda h, d: h + (frac * d).astype(h.dtype), state.h, delta)
    params = tree_map(jnp.subtract, server_model(state.params, delta), h)
    return FedDynState(params, h, state.clients)

  return FederatedAlgorithm(name, server_init, lambda s: s.params, client_init,
                            corrected_sgd(loss_fn, client_lr, mu), client_final, server_update,
                            lambda s: s.params, store_row=store.by_client)


def adabest(loss_fn: Callable, client_lr: float, mu: float, beta: float, num_clients: int,
            name: str = 'adabest') -> FederatedAlgorithm:
  """Builds AdaBest, client SGD corrected by adaptive bias estimates.

  AdaBest (Varno et al. 2022, AdaBest: Minimizing Client Drift in Federated Learning via
  Adaptive Bias Estimation, Alg. 2): clients step on ``g = grad L_i(y) - h_i``, then ``h_i <-
  h_i / (t - t_i') + mu Delta_i`` and ``t_i' <- t`` (the per-client store); the server sets
  ``h <- beta (theta_bar^{t-1} - theta_bar^t)`` and ``x <- theta_bar^t - h``. ``beta = mu =
  0`` is FedAvg, ``beta = 1`` FedDyn's server with every client sampled.

  Args:
    loss_fn: ``(params, batch) -> scalar`` mean minibatch loss.
    client_lr: the clients' learning rate, positive and finite.
    mu: the local estimates' weight, at least 0.
    beta: the server's decay, in ``[0, 1]``.
    num_clients: ``N``, the population: the store's rows.
    name: display name.

  Returns:
    The stateful ``FederatedAlgorithm``.

  Raises:
    ValueError: a concrete hyper-parameter outside its range, or ``num_clients`` not a
      positive integer.
  """
  check(name, 'client_lr', client_lr, POSITIVE)
  check(name, 'mu', mu, AT_LEAST_ZERO)
  check(name, 'beta', beta, UNIT)
  num_clients = positive_int(name, 'num_clients', num_clients)
  def server_init(params):
    row = AdaBestRow(tree_map(jnp.zeros_like, params), jnp.zeros((), jnp.int32))
    average = tree_map(jnp.array, params)   # theta_bar^0 = theta^0 (h^0 = 0), its own buffer
    return AdaBestState(params, average, jnp.zeros((), jnp.int32), store.zeros(row, num_clients))

  def client_init(bcast, ctx: ClientContext):
    x, _ = bcast
    return DriftClient(x, tree_map(jnp.negative, ctx.stored.h))

  def client_final(state: DriftClient, bcast, ctx: ClientContext):
    x, t = bcast
    delta = tree_map(jnp.subtract, x, state.params)
    gap = (t - ctx.stored.last_round).astype(jnp.float32)
    h = tree_map(lambda h, d: h / gap + mu * d, ctx.stored.h, delta)
    return delta, AdaBestRow(h, t)

  def server_update(state: AdaBestState, delta, info: RoundInfo):
    del info
    average = server_model(state.params, delta)
    h = tree_map(lambda a, b: beta * (a - b), state.average, average)
    return AdaBestState(tree_map(jnp.subtract, average, h), average, state.round + 1,
                        state.clients)

  return FederatedAlgorithm(name, server_init, lambda s: (s.params, s.round + 1), client_init,
                            corrected_sgd(loss_fn, client_lr), client_final, server_update,
                            lambda s: s.params, store_row=store.by_client)


@dataclasses.dataclass(frozen=True)
class FedDynHparams:
  feddyn_mu: float = hparam(0.02, "FedDyn's regulariser weight (its paper's alpha).", at_least(0))


@dataclasses.dataclass(frozen=True)
class AdaBestHparams:
  adabest_mu: float = hparam(0.02, "AdaBest's local estimate weight mu.", at_least(0))
  adabest_beta: float = hparam(0.9, "AdaBest's server decay beta (0 and --adabest_mu=0: FedAvg).",
                               within(0, 1))


_ADABEST = ('Varno et al. 2022, "AdaBest: Minimizing Client Drift in Federated Learning via '
            'Adaptive Bias Estimation"')
SCAFFOLD = AlgorithmSpec(
    'scaffold', lambda hp, s: scaffold(s.loss, s.client_lr, len(s.counts), s.server),
    stateful=True, paper='Karimireddy et al. 2020, "SCAFFOLD"',
    client='SGD on `g + c - c_i`; option II: `c_i <- c_i - c + Delta_i / (tau_i lr)` (client '
    'state `c_i`)',
    server='`--server_optimizer` on `Delta`; `c = (1/N) sum_j c_j` over the store')
FEDDYN = AlgorithmSpec(
    'feddyn', lambda hp, s: feddyn(s.loss, s.client_lr, hp.feddyn_mu, len(s.counts)),
    FedDynHparams, stateful=True, own_server=True, paper=f'Acar et al. 2021, in the notation of {_ADABEST}',
    client='SGD on `g - h_i + mu (y - x)`; `h_i <- h_i + mu Delta_i` (client state `h_i`)',
    server='`h <- h + |P|/N Delta`, `x <- x - Delta - h`')
ADABEST = AlgorithmSpec(
    'adabest', lambda hp, s: adabest(s.loss, s.client_lr, hp.adabest_mu, hp.adabest_beta,
                                     len(s.counts)),
    AdaBestHparams, stateful=True, own_server=True, paper=f'{_ADABEST}, Alg. 2',
    client="SGD on `g - h_i`; `h_i <- h_i / (t - t_i') + mu Delta_i` (client state `h_i, t_i'`)",
    server='`h <- beta (theta_bar^{t-1} - theta_bar^t)`, `x <- theta_bar^t - h`, '
    '`theta_bar^t = x - Delta`')
