"""FedAvg and FedAvgCM, and the local-SGD builder the other algorithms are made from.

``Delta_i = x - y_i``; the server applies any optax transformation to the weighted mean
``Delta = sum_i p_i Delta_i`` as if it were a gradient, so ``optax.sgd(1.0)`` gives
``x <- sum_i p_i y_i`` (FedAvg, McMahan et al. 2017). FedAvgCM is client SGD with momentum
``v <- alpha v - lr g; y <- y + v`` (== ``optax.sgd(lr, momentum=alpha)``), reset every round.

``local_sgd`` adds the three ingredients the GeL paper combines (Boukhari et al. 2023, GeL,
Table 3): guessed steps after the budget (a guess policy and a client optimiser holding a GeL
state, taken through ``fedjax_gel.optim.guess``), a proximal term (FedProx) and normalised
averaging (FedNova).
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_gel.core import model_state
from fedjax_gel.core.algorithm import ClientContext, FederatedAlgorithm, RoundInfo
from fedjax_gel.spec import AlgorithmSpec
from fedjax_gel.optim import guessed, hyperparams


class ServerState(NamedTuple):
  params: Any
  opt_state: Any


class ClientState(NamedTuple):
  params: Any
  opt_state: Any


class NormalizedUpload(NamedTuple):
  """FedNova's upload: ``Delta_i / ||a_i||_1`` and ``||a_i||_1``."""
  delta: Any
  norm: jax.Array


# Rules of ``check`` for the builders' numeric arguments, as the command line's ranges.
POSITIVE = (lambda x: 0 < x < math.inf, 'positive and finite')
AT_LEAST_ZERO = (lambda x: 0 <= x < math.inf, '>= 0 and finite')
UNIT = (lambda x: 0 <= x <= 1, 'in [0, 1]')
MOMENTUM = (lambda m: 0 <= m < 1, 'in [0, 1)')


def check(where: str, name: str, value, rule) -> None:
  """A known ``value`` outside ``rule`` (``POSITIVE``, ...) is a ValueError, a non-number a
  TypeError, each naming ``where`` and ``name``; schedules and traced values pass
  (``hyperparams.check_hyperparameter``): a learning rate of -1 or NaN, or a string, failed deep
  inside optax or trained a non-finite model."""
  hyperparams.check_hyperparameter(f'{where}: {name}', value, *rule)


def static_zero(value) -> bool:
  """Whether ``value`` is a known number 0 (Python, NumPy or a concrete JAX scalar: a term it
  weighs can be left out); a traced weight (runs batched over it, ``core.runs``) is never known
  to be 0."""
  return hyperparams.concrete_scalar(value) == 0


def local_sgd(loss_fn: Callable, client_optimizer, server_optimizer=None, *,
              prox_mu: float = 0.0,
              normalizer: Callable[[ClientContext], jax.Array] | None = None,
              client_guesses: Callable[[jax.Array, int], jax.Array] | None = None,
              name: str = 'local_sgd') -> FederatedAlgorithm:
  """Builds local SGD: clients run ``client_optimizer`` for ``tau_i`` steps, the server steps.

  Each client uploads ``Delta_i = x - y_i``; the server applies ``server_optimizer`` to the
  weighted mean ``Delta = sum_i p_i Delta_i`` as if it were a gradient. The three ingredients
  the GeL paper combines (Boukhari et al. 2023, GeL, Table 3) are options: guessed steps,
  FedProx's proximal term and FedNova's normalised averaging.

  Args:
    loss_fn: ``(params, batch) -> scalar`` mean minibatch loss.
    client_optimizer: an optax ``GradientTransformation``, restarted every round (stateless
      clients).
    server_optimizer: optax transformation applied to the aggregate; default ``optax.sgd(1.0)``.
    prox_mu: FedProx (Li et al. 2020): the client gradient is ``g + mu (y - x)``; guessed steps
      use the optimiser's state only and so ignore the proximal term.
    normalizer: FedNova (Wang et al. 2020): ``ctx -> ||a_i||_1``; clients upload
      ``Delta_i / ||a_i||_1`` and the server steps on ``tau_eff * sum_i p_i Delta_i / ||a_i||_1``
      with ``tau_eff = sum_i p_i ||a_i||_1``.
    client_guesses: GeL (``FederatedAlgorithm.client_guesses``, e.g. a ``GuessPolicy``'s
      ``counts``): after its budget each client takes ``ctx.guesses`` guessed steps with
      ``fedjax_gel.optim.guess`` (GeL, Alg. 1 lines 19-20), which needs a GeL state in the client
      optimiser's state (``gel_sgdm``, ``guessing``; at any depth of ``optax.chain`` and co.).
      Where that state does not say what a wrapper does to a guessed update (``optax.scale`` or
      a stateless ``masked`` member after the GeL one, ``MultiSteps``, ``lookahead``, ...), the
      client optimiser itself is replayed with the proxy (``guess``'s ``optimizer=``); refused
      (when the first round is traced) only where a replay cannot give it either: the
      last-gradient proxy with members before the GeL transformation, whose stored gradient is
      then not the optimiser's input.
    name: display name.

  Returns:
    The ``FederatedAlgorithm``.

  Raises:
    ValueError: from ``server_init``, before any round: ``client_guesses`` is given but the
      client optimiser holds no GeL state, or it holds one but ``client_guesses`` is ``None``
      (its guesses would silently never be taken).
    optim.GuessRefusedError: from ``server_init``: ``optim.guess`` cannot take its guesses
      (``check_guessable``).

  Examples:
    FedProx with GeL's guessed steps (what ``algorithms.fedprox_gel`` builds):

    >>> import optax
    >>> import fedjax_gel as fg
    >>> from fedjax_gel import algorithms, optim
    >>> model = fg.get_model('logistic', (60,), 5)
    >>> alg = algorithms.local_sgd(
    ...     fg.cross_entropy_loss(model), optim.gel_sgdm(0.01, momentum=0.9), prox_mu=0.01,
    ...     client_guesses=fg.GuessPolicy().counts, name='fedprox_gel')
  """
  server_optimizer = server_optimizer or optax.sgd(1.0)

  def server_init(params):
    opt_state = jax.eval_shape(client_optimizer.init, params)
    holds_gel = guessed.has_guess_state(opt_state)
    if client_guesses is not None and not holds_gel:
      raise ValueError(f'{name}: guessed steps need a GeL client optimiser '
                       '(fedjax_gel.optim.gel_sgdm or guessing(...)); this one holds no GeL state')
    if client_guesses is None and holds_gel:
      raise ValueError(f'{name}: the client optimiser takes guessed steps but the algorithm has '
                       'no guess policy, so none would be taken; use fedjax_gel.algorithms.gel '
                       '(or local_sgd(..., client_guesses=GuessPolicy(...).counts))')
    if holds_gel:   # a wrapper guess cannot follow is refused here, not in the first round
      guessed.check_guessable(opt_state, params, optimizer=client_optimizer)
    return ServerState(params, server_optimizer.init(params))

  def client_init(x, ctx: ClientContext):
    del ctx
    return ClientState(x, client_optimizer.init(x))

  def client_step(state: ClientState, batch, x):
    loss, grads = model_state.value_and_grad(loss_fn)(state.params, batch)
    if not static_zero(prox_mu):
      grads = jax.tree_util.tree_map(lambda g, y, x0: g + prox_mu * (y - x0), grads,
                                     state.params, x)
    updates, opt_state = client_optimizer.update(grads, state.opt_state, state.params)
    return ClientState(optax.apply_updates(state.params, updates), opt_state), loss

  def client_final(state: ClientState, x, ctx: ClientContext):
    y = state.params
    if client_guesses is not None:
      updates, _ = guessed.guess(state.opt_state, y, ctx.guesses, optimizer=client_optimizer)
      y = optax.apply_updates(y, updates)
    delta = optax.tree_utils.tree_sub(x, y)
    if normalizer is None:
      return delta
    norm = normalizer(ctx)
    safe = jnp.where(norm > 0, norm, 1.)   # a client without steps uploads zeros, never NaN
    return NormalizedUpload(jax.tree_util.tree_map(lambda d: d / safe, delta), norm)

  def server_update(state: ServerState, upload, info: RoundInfo):
    del info
    if normalizer is None:
      delta = upload
    else:
      delta = jax.tree_util.tree_map(lambda d: upload.norm * d, upload.delta)
    updates, opt_state = server_optimizer.update(delta, state.opt_state, state.params)
    return ServerState(optax.apply_updates(state.params, updates), opt_state)

  return FederatedAlgorithm(name, server_init, lambda s: s.params, client_init, client_step,
                            client_final, server_update, lambda s: s.params,
                            client_guesses=client_guesses)


def fedavg(loss_fn: Callable, client_optimizer: optax.GradientTransformation,
           server_optimizer: optax.GradientTransformation | None = None,
           name: str = 'fedavg') -> FederatedAlgorithm:
  """Builds federated averaging with any client and server optax optimiser.

  FedAvg (McMahan et al. 2017, Communication-Efficient Learning of Deep Networks from
  Decentralized Data): clients take local steps from the server model ``x`` and upload
  ``Delta_i = x - y_i``; the server applies ``server_optimizer`` to ``Delta = sum_i p_i
  Delta_i`` as if it were a gradient, so ``optax.sgd(1.0)`` gives ``x <- sum_i p_i y_i``.

  Args:
    loss_fn: ``(params, batch) -> scalar`` mean minibatch loss.
    client_optimizer: e.g. ``optax.sgd(lr)`` (FedAvg) or ``optax.sgd(lr, momentum=0.9)``
      (FedAvgCM), restarted every round.
    server_optimizer: applied to the mean update; default ``optax.sgd(1.0)``.
    name: display name.

  Returns:
    The ``FederatedAlgorithm``.

  Examples:
    >>> import optax
    >>> import fedjax_gel as fg
    >>> model = fg.get_model('logistic', (60,), 5)
    >>> alg = fg.fedavg(fg.cross_entropy_loss(model), optax.sgd(0.01),
    ...                 server_optimizer=fg.optim.fedadam(0.01))
  """
  return local_sgd(loss_fn, client_optimizer, server_optimizer, name=name)


def fedavgcm(loss_fn: Callable, client_lr: float, momentum: float = 0.9,
             server_optimizer: optax.GradientTransformation | None = None) -> FederatedAlgorithm:
  """Builds FedAvg with client momentum, GeL's FedAvgCM baseline (Boukhari et al. 2023, GeL).

  Clients take SGD steps with momentum ``v <- alpha v - lr g; y <- y + v``
  (``optax.sgd(lr, momentum=alpha)``), reset every round.

  Args:
    loss_fn: ``(params, batch) -> scalar`` mean minibatch loss.
    client_lr: the clients' learning rate, positive and finite.
    momentum: ``alpha``, in ``[0, 1)``.
    server_optimizer: applied to the mean update; default ``optax.sgd(1.0)``.

  Returns:
    The ``FederatedAlgorithm``, named ``'fedavgcm'``.

  Raises:
    ValueError: a concrete learning rate or momentum outside its range (as for GeL's
      ``gel_sgdm``).
    TypeError: a hyper-parameter that is no number.

  Examples:
    >>> import optax
    >>> import fedjax_gel as fg
    >>> model = fg.get_model('logistic', (60,), 5)
    >>> alg = fg.fedavgcm(fg.cross_entropy_loss(model), client_lr=0.01, momentum=0.9,
    ...                   server_optimizer=optax.sgd(1.0))
  """
  check('fedavgcm', 'client_lr', client_lr, POSITIVE)
  check('fedavgcm', 'momentum', momentum, MOMENTUM)
  return fedavg(loss_fn, optax.sgd(client_lr, momentum=momentum), server_optimizer, 'fedavgcm')


def _fedavg(name: str):
  return lambda hp, s: fedavg(s.loss, optax.sgd(s.client_lr), s.server, name)


FEDAVG = AlgorithmSpec('fedavg', _fedavg('fedavg'), paper='McMahan et al. 2017',
                       upload_delta=True)
FEDAVGCM = AlgorithmSpec(
    'fedavgcm', lambda hp, s: fedavgcm(s.loss, s.client_lr, s.client_momentum, s.server),
    client='SGD with momentum (`--client_momentum`), reset each round', momentum=True,
    paper='Boukhari et al. 2023 (GeL) baseline', upload_delta=True)
# DP-FedAvg (McMahan, Ramage, Talwar and Zhang 2018, "Learning Differentially Private Recurrent
# Language Models"): FedAvg whose clipped deltas the server averages with noise
# (fedjax_gel.privacy); every other delta-uploading algorithm takes the same --dp_* flags.
DP_FEDAVG = AlgorithmSpec(
    'dp_fedavg', _fedavg('dp_fedavg'), upload_delta=True, private=True,
    server='the noised fixed-denominator mean of the clipped deltas (`--dp_*`), then '
    '`--server_optimizer`', paper='McMahan et al. 2018, "Learning Differentially Private '
    'Recurrent Language Models"')
# FedOpt (Reddi et al. 2021, "Adaptive Federated Optimization"): SGD clients, the server
# optimiser fixed to the paper's form (--server_optimizer may only repeat it); FedAvg with it
# is refused in their favour.
FEDADAM, FEDYOGI, FEDADAGRAD = (
    AlgorithmSpec(name, _fedavg(name), server_optimizer=name, base='fedavg', upload_delta=True,
                  server=f'{name} (the paper\'s form; tune `--server_lr`, whose default 1.0 is '
                  'SGD\'s)', paper='Reddi et al. 2021, "Adaptive Federated Optimization"')
    for name in ('fedadam', 'fedyogi', 'fedadagrad'))
