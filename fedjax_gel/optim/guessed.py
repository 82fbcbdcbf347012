"""Guessed updates (GeL): gradient-free extra steps for an optax optimiser.

After exhausting its budget of ``tau_i`` gradient steps, a GeL client takes ``tau'_i`` *guessed*
steps, each an optimiser update with a proxy in place of the gradient it cannot afford
(Boukhari, Dhasade, Kermarrec, Pires, Safsafi, Sharma 2023, "Boosting Federated Learning in
Resource-Constrained Networks", GeL; §3.1, Algorithm 1):

* proxy *zero* with SGD momentum (``v <- alpha v - lr g; y <- y + v``, eqs. 1-2): each guess is
  ``v <- alpha v; y <- y + v``, so ``tau'`` of them add up to the nudge (eq. 5)

      y <- y + alpha (1 - alpha^tau') / (1 - alpha) * v,

  ``alpha / (1 - alpha) * v`` for ``tau' = inf``.
* proxy *last gradient* (Dhasade et al. 2021, "GeL: guess and learn", the earlier report): the
  optimiser is re-applied ``tau'`` times with the last computed gradient.

The transformations are ordinary ``optax.GradientTransformationExtraArgs``; their *state* says how
to guess. ``guess(opt_state, params, count)`` finds every GeL state inside an optimiser state,
takes ``count`` guessed steps with each and returns the summed updates the optimiser would apply
for them, following the wrappers around it whose states say what they do to a guessed update
(``optax.chain``, ``named_chain``, ``masked``, ``partition``, ``inject_hyperparams``,
``apply_if_finite``; ``contrib.reduce_on_plateau`` after it) and refusing the others in one line
(``GuessRefusedError``; ``guess_wrappers`` says which and why), or, given the optimiser too
(``guess(..., optimizer=tx)``), replaying ``tx`` itself with the proxy where its state would be
refused. It raises ``NoGuessStateError`` when there is no GeL state. ``count`` may be a traced
float, differ per call and per client under ``vmap``, and be ``inf``:

* ``gel_sgdm`` (SGDM, either proxy): closed forms, any ``count``. Its state keeps the momentum and
  the last step's learning rate as data, so ``inject_hyperparams(gel_sgdm)`` works under ``jit``.
* ``guessing(inner, proxy)`` (any optax optimiser): ``inner`` re-applied ``count`` times. An
  infinite count runs until the sum stops changing in floating point (at most
  ``MAX_INFINITE_GUESSES`` steps; a sum that does not settle, e.g. the last-gradient proxy, is
  returned as NaN: never a silent zero; steps applying exact zeros, e.g. ``MultiSteps``
  accumulating, settle it only ``ZERO_RUN`` in a row). Its state holds ``inner`` as static
  pytree data, so hyper-parameters are injected into ``inner`` (``guessing(optax.
  inject_hyperparams(optax.adam)(learning_rate=...))``), not around ``guessing``. Replaying
  ``inner`` as it is, it follows any wrapper inside it (``guessing(optax.MultiSteps(...))``,
  ``guessing(optax.contrib.schedule_free(...))``) but one whose ``update`` needs an extra
  argument a guess cannot give (``reduce_on_plateau``'s loss ``value``: put it after
  ``guessing`` in the chain instead).

Lemma 1 (GeL, eq. 6): with momentum and zero proxy, the accumulated client update is
``-lr * sum_k a_k g_k`` with ``a_k = (1 - alpha^(tau' + tau_i - k)) / (1 - alpha)``;
``momentum_coefficients`` returns ``a`` and ``momentum_coefficients_l1`` its sum (FedNova's
``||a_i||_1``).
"""
from __future__ import annotations

import dataclasses
import math
import operator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import serialization

from fedjax_gel.optim import guess_wrappers
from fedjax_gel.optim.guess_replay import replay
from fedjax_gel.optim.hyperparams import check_hyperparameter, value_at
from fedjax_gel.optim.guess_wrappers import GuessRefusedError

PROXIES = ('zero', 'last_gradient')
"""The proxies a guessed step uses in place of the gradient."""


def check_proxy(proxy: str, where: str = '') -> None:
  """Raises ``ValueError`` (``where`` its prefix, e.g. ``'gel: '``) unless ``proxy`` is one of
  ``PROXIES``."""
  if proxy not in PROXIES:
    raise ValueError(f'{where}unknown guess proxy {proxy!r}; known: {", ".join(PROXIES)}')


class NoGuessStateError(ValueError):
  """Raised by ``guess`` for an optimiser state that holds no GeL state (a ``ValueError``)."""


def _f32(x) -> jax.Array:
  return jnp.asarray(x, jnp.float32)


class GeLSGDMState(NamedTuple):
  """``gel_sgdm``'s state.

  Attributes:
    count: gradient steps taken (the step a learning-rate schedule is evaluated at).
    velocity: ``v``, like params.
    last_grad: the last gradient (last-gradient proxy), else ``None``.
    learning_rate: float32, the learning rate of the last gradient step (used by guesses).
    momentum: float32 ``alpha``.
  """
  count: jax.Array
  velocity: Any
  last_grad: Any
  learning_rate: jax.Array
  momentum: jax.Array


def gel_sgdm(learning_rate: optax.ScalarOrSchedule, momentum: float = 0.9,
             proxy: str = 'zero') -> optax.GradientTransformationExtraArgs:
  """SGD with momentum whose guessed steps are taken in closed form (GeL, eqs. 1, 2, 5).

  Boukhari et al. 2023, GeL. ``update``: ``v <- alpha v - lr_t g``, updates ``= v``
  (``optax.sgd(lr, momentum)`` for a constant ``lr``; optax scales the trace instead, which
  differs under a schedule).

  Guesses (``guess``), ``c`` of them, with ``lr`` the last step's learning rate (a schedule is
  not advanced by guesses):

  * zero proxy: updates ``alpha (1 - alpha^c) / (1 - alpha) v``, ``v <- alpha^c v``;
  * last gradient ``g``: updates ``alpha (1 - alpha^c)/(1 - alpha) v - lr g [c - alpha (1 -
    alpha^c)/(1 - alpha)] / (1 - alpha)`` and ``v <- alpha^c v - lr g (1 - alpha^c)/(1 - alpha)``
    (``-lr c g`` when ``alpha = 0``); infinite for ``c = inf``.

  Args:
    learning_rate: ``lr`` >= 0 and finite, or an optax schedule evaluated at the gradient steps
      taken.
    momentum: ``alpha``, in ``[0, 1)``.
    proxy: one of ``PROXIES``: ``'zero'`` or ``'last_gradient'``.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose state is a ``GeLSGDMState``.

  Raises:
    ValueError: an unknown proxy, or a concrete hyper-parameter outside its range.
    TypeError: a hyper-parameter that is no number.

  Examples:
    >>> import jax, jax.numpy as jnp, optax
    >>> from fedjax_gel import optim
    >>> tx = optax.chain(optax.clip_by_global_norm(1.0), optim.gel_sgdm(0.05, momentum=0.9))
    >>> params = jnp.ones(3)
    >>> state = tx.init(params)
    >>> updates, state = tx.update(jax.grad(lambda p: jnp.sum(p ** 2))(params), state, params)
    >>> params = optax.apply_updates(params, updates)
    >>> updates, state = optim.guess(state, params, 2)   # two guessed steps, no gradient
    >>> params = optax.apply_updates(params, updates)
  """
  check_proxy(proxy)
  check_hyperparameter('gel_sgdm momentum', momentum, lambda a: 0 <= a < 1, 'in [0, 1)')
  check_hyperparameter('gel_sgdm learning_rate', learning_rate, lambda x: 0 <= x < math.inf,
                       '>= 0 and finite')
  keep_last = proxy == 'last_gradient'

  def init(params):
    zeros = optax.tree_utils.tree_zeros_like(params)
    count = jnp.zeros([], jnp.int32)
    return GeLSGDMState(count, zeros, zeros if keep_last else None,
                        _f32(value_at(learning_rate, count)), _f32(momentum))

  def update(grads, state, params=None, **extra_args):
    del params, extra_args
    lr = value_at(learning_rate, state.count)
    v = jax.tree.map(lambda v, g: (momentum * v - lr * g).astype(v.dtype), state.velocity, grads)
    last = jax.tree.map(lambda l, g: jnp.asarray(g, l.dtype), state.last_grad, grads) if keep_last \
        else None
    return v, GeLSGDMState(optax.safe_increment(state.count), v, last, _f32(lr), _f32(momentum))

  return optax.GradientTransformationExtraArgs(init, update)


def _guess_sgdm(state: GeLSGDMState, params, count):
  """Closed forms of ``count`` guessed SGDM steps (see ``gel_sgdm``)."""
  del params
  a, c = state.momentum, jnp.maximum(_f32(count), 0.)
  decay = jnp.power(a, c)                      # alpha^c (1 for c = 0, 0 for c = inf)
  nudge = a * (1. - decay) / (1. - a)          # sum_{j=1..c} alpha^j
  updates = jax.tree.map(lambda v: (nudge * v).astype(v.dtype), state.velocity)
  velocity = jax.tree.map(lambda v: (decay * v).astype(v.dtype), state.velocity)
  if state.last_grad is not None:
    lr = state.learning_rate
    drift = (c - nudge) / (1. - a)             # sum_{j=1..c} (1 - alpha^j) / (1 - alpha)
    pull = (1. - decay) / (1. - a)
    updates = jax.tree.map(lambda u, g: (u - lr * drift * g).astype(u.dtype), updates,
                           state.last_grad)
    velocity = jax.tree.map(lambda v, g: (v - lr * pull * g).astype(v.dtype), velocity,
                            state.last_grad)
  return updates, state._replace(velocity=velocity)


@dataclasses.dataclass(frozen=True, eq=False)
class GuessState:
  """``guessing``'s state.

  Attributes:
    inner_state: the wrapped optimiser's state.
    proxy_grad: the proxy, like params: the last gradient (last-gradient proxy) or one float32
      zero per parameter leaf (zero proxy; broadcast to the leaf's shape).
    inner: the wrapped ``optax`` transformation (static pytree data).
    proxy: ``'zero'`` or ``'last_gradient'`` (static).
  """
  inner_state: Any
  proxy_grad: Any
  inner: Any
  proxy: str


jax.tree_util.register_dataclass(GuessState, data_fields=['inner_state', 'proxy_grad'],
                                 meta_fields=['inner', 'proxy'])


def _state_dict(state: GuessState) -> dict:
  return {name: serialization.to_state_dict(getattr(state, name))
          for name in ('inner_state', 'proxy_grad')}


def _from_state_dict(target: GuessState, saved: dict) -> GuessState:
  return dataclasses.replace(target, **{
      name: serialization.from_state_dict(getattr(target, name), saved[name], name=name)
      for name in ('inner_state', 'proxy_grad')})


# Flax's checkpoints (``flax.serialization.to_bytes``/``from_bytes``) save the arrays; the static
# fields (the wrapped optimiser, the proxy) come from the target state restored into.
serialization.register_serialization_state(GuessState, _state_dict, _from_state_dict)


def guessing(inner: optax.GradientTransformation, proxy: str = 'zero'
             ) -> optax.GradientTransformationExtraArgs:
  """Gives any optax optimiser guessed steps: ``inner`` re-applied with a proxy gradient.

  Boukhari et al. 2023, GeL; the last-gradient proxy from Dhasade et al. 2021, GeL: guess and
  learn. ``update`` is ``inner``'s; ``guess`` runs ``count`` updates of ``inner`` with the
  proxy, moving a copy of the params along, and returns their sum. A learning-rate schedule
  inside ``inner`` therefore advances with every guessed step, as it would with computed ones
  (``gel_sgdm``'s closed form keeps the rate of the last computed step). ``count = inf`` runs
  until the sum no longer changes in its dtype, at most ``MAX_INFINITE_GUESSES`` steps, else NaN
  (e.g. ``optax.sgd`` with momentum 0.999, whose terms fall below float32's rounding later).

  Args:
    inner: the optimiser, e.g. ``optax.adam(1e-3)``; built once (its hyper-parameters may be
      injected: ``optax.inject_hyperparams(optax.adam)(learning_rate=schedule)``; inject into
      ``inner``, not around ``guessing``).
    proxy: ``'zero'`` (momentum-type optimisers coast on their first moment) or
      ``'last_gradient'`` (the last computed gradient stands in; the earlier GeL report).

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose state is a ``GuessState``.

  Raises:
    ValueError: an unknown proxy.
    TypeError: ``inner`` is no optax transformation (e.g. the factory, not built).

  Examples:
    >>> import jax, jax.numpy as jnp, optax
    >>> from fedjax_gel import optim
    >>> tx = optim.guessing(optax.adam(1e-2))
    >>> params = jnp.ones(3)
    >>> state = tx.init(params)
    >>> updates, state = tx.update(2 * params, state, params)
    >>> updates, state = optim.guess(state, optax.apply_updates(params, updates), 5)
  """
  check_proxy(proxy)
  if not (callable(getattr(inner, 'init', None)) and callable(getattr(inner, 'update', None))):
    raise TypeError(f'guessing: inner must be an optax transformation, e.g. optax.adam(1e-3) '
                    f'(built, not the factory), got {getattr(inner, "__name__", inner)!r}')
  inner = optax.with_extra_args_support(inner)
  keep_last = proxy == 'last_gradient'

  def init(params):
    if keep_last:
      proxy_grad = optax.tree_utils.tree_zeros_like(params)
    else:
      proxy_grad = jax.tree.map(lambda p: jnp.zeros([], jnp.float32), params)
    return GuessState(inner.init(params), proxy_grad, inner, proxy)

  def update(grads, state: GuessState, params=None, **extra_args):
    if state.inner is not inner:
      raise ValueError(
          'guessing(...): this state was made by another guessing transformation; build '
          'guessing(inner) once and reuse it (to change hyper-parameters, inject them into '
          'inner: guessing(optax.inject_hyperparams(optax.adam)(learning_rate=...)), not '
          'inject_hyperparams around guessing)')
    updates, inner_state = inner.update(grads, state.inner_state, params, **extra_args)
    proxy_grad = (jax.tree.map(lambda l, g: jnp.asarray(g, l.dtype), state.proxy_grad, grads)
                  if keep_last else state.proxy_grad)
    return updates, GuessState(inner_state, proxy_grad, inner, proxy)

  return optax.GradientTransformationExtraArgs(init, update)


_AFTER_GUESSING = (
    'put that transformation after guessing in an optax.chain, e.g. optax.chain(guessing('
    'optax.sgd(lr, momentum=0.9)), optax.contrib.reduce_on_plateau()), whose scale guess holds')


def _guess_generic(state: GuessState, params, count):
  """``count`` updates of ``state.inner`` with the proxy gradient, summed (see ``guessing``)."""
  proxy = (state.proxy_grad if state.proxy == 'last_gradient' else
           jax.tree.map(lambda z, p: jnp.zeros_like(p), state.proxy_grad, params))
  total, inner_state = replay(state.inner.update, state.inner_state, params, proxy, count,
                              "guessing(inner)'s inner optimiser", f'; {_AFTER_GUESSING}')
  return total, dataclasses.replace(state, inner_state=inner_state)


def is_guess_state(x) -> bool:
  """Whether ``x`` is the state of a GeL transformation (``gel_sgdm`` or ``guessing``)."""
  return isinstance(x, (GeLSGDMState, GuessState))


def has_guess_state(opt_state) -> bool:
  """Whether an optimiser state holds a GeL state anywhere (``guess`` can take guessed steps).

  Args:
    opt_state: any optax state.

  Returns:
    True where a ``gel_sgdm`` or ``guessing`` state is inside it, at any depth.
  """
  return any(map(is_guess_state, jax.tree.leaves(opt_state, is_leaf=is_guess_state)))


_KINDS = {
    GeLSGDMState: guess_wrappers.GeLKind(
        guess=_guess_sgdm, mirror=lambda s: s.velocity, scalar_leaves=lambda s: False,
        last_gradient=lambda s: s.last_grad is not None, stored_gradient=lambda s: s.last_grad),
    GuessState: guess_wrappers.GeLKind(
        guess=_guess_generic, mirror=lambda s: s.proxy_grad,
        scalar_leaves=lambda s: s.proxy == 'zero', last_gradient=lambda s: s.proxy != 'zero',
        stored_gradient=lambda s: s.proxy_grad if s.proxy != 'zero' else None),
}


def _check_count(count) -> None:
  if not isinstance(count, jax.core.Tracer):
    c = np.asarray(count)
    if c.ndim or c.dtype.kind not in 'iuf' or not c >= 0 or np.isfinite(c) and c != np.floor(c):
      raise ValueError(f'guess: count must be one whole number of steps >= 0 or inf, got '
                       f'{count!r}')


def _reason(refusal: Exception) -> str:
  return str(refusal).removeprefix('guess: ')


def _check_optimizer(optimizer, opt_state, params) -> None:
  """Raises unless ``optimizer.init(params)`` has ``opt_state``'s tree structure and shapes."""
  if not (callable(getattr(optimizer, 'init', None)) and
          callable(getattr(optimizer, 'update', None))):
    what = getattr(optimizer, '__name__', optimizer)
    raise TypeError('guess: optimizer= must be the optax transformation whose state opt_state '
                    f'is (built, not the factory), got {what!r}')
  try:
    made = jax.eval_shape(optimizer.init, params)
  except Exception as err:   # pylint: disable=broad-except
    first = str(err).splitlines()[0] if str(err) else ''
    raise GuessRefusedError(
        'guess: optimizer= is not the optimiser whose state opt_state is: its init(params) '
        f'fails ({type(err).__name__}: {first})') from err
  want, got = jax.tree.structure(made), jax.tree.structure(opt_state)
  if want != got or [jnp.shape(x) for x in jax.tree.leaves(made)] != [
      jnp.shape(x) for x in jax.tree.leaves(opt_state)]:
    how = 'structure' if want != got else 'array shapes'
    raise GuessRefusedError(
        f'guess: optimizer= is not the optimiser whose state opt_state is: its init(params) has '
        f'another state {how}; pass the very transformation that made opt_state (the same '
        'object: guessing(...) states hold it) and the params it steps')


def _replayable(opt_state, params, refusal: GuessRefusedError) -> bool:
  """Whether ``guess(..., optimizer=tx)`` would replay what ``refusal`` refused (statically: not
  an optimiser needing a loss value, nor a last gradient the optimiser was not given)."""
  if not getattr(refusal, 'replayable', True) or guess_wrappers.holds_plateau(opt_state):
    return False
  try:
    guess_wrappers.replay_gradient(opt_state, params, _KINDS)
  except GuessRefusedError:
    return False
  return True


def guess(opt_state, params, count, *, optimizer=None):
  """Takes ``count`` guessed steps with every GeL state inside ``opt_state``.

  Args:
    opt_state: the state of any optimiser holding a ``gel_sgdm`` or ``guessing`` state, at any
      depth of the wrappers ``guess_wrappers`` follows (``chain``, ``named_chain``, ``masked``,
      ``partition``, ``inject_hyperparams``, ``apply_if_finite``; ``reduce_on_plateau`` after it).
    params: the current params (the guesses start from them; ``optax.LookaheadParams`` for
      ``lookahead``).
    count: the number of guessed steps, a scalar (possibly traced; ``inf`` allowed). A concrete
      one must be a whole number >= 0 or ``inf`` (``gel_sgdm``'s closed form would take a
      fraction, ``guessing``'s steps would drop it).
    optimizer: the ``optax.GradientTransformation`` whose state ``opt_state`` is (optional).
      Where the state alone does not say what a wrapper does to a guessed update (``optax.scale``
      or a stateless ``masked`` member after the GeL one, ``MultiSteps``, ``lookahead``,
      ``schedule_free``, ``conditionally_transform``, ...), ``guess`` then replays the optimiser
      itself: ``count`` calls ``optimizer.update(proxy, state, params)``, the params advanced by
      each update as a step would, and the updates summed: exactly what the optimiser would
      apply for the guessed steps. The proxy is zero, but on the parameters of a last-gradient
      GeL transformation the gradient it stored; that is the optimiser's input only where the
      input reaches it unchanged (the chain's first member, inside ``masked``, ``partition``,
      ``inject_hyperparams``, ``lookahead``, ``schedule_free``, ``mechanize``): else refused. An
      infinite count runs as ``guessing``'s does (``replay``). The closed forms and the wrappers'
      states are used first; the replay only where they would refuse.

  Returns:
    ``(updates, opt_state)``: the summed updates the optimiser would apply for the guessed steps,
    like ``params`` (zero where no GeL state acts, e.g. other ``partition`` groups; a replay
    gives every parameter what the optimiser applies when handed the proxy), and the state after
    them; apply them with ``optax.apply_updates``.

  Raises:
    NoGuessStateError: ``opt_state`` holds no GeL state.
    GuessRefusedError: a wrapper whose state does not say what it applies for a guessed step
      (one line naming it and what to use instead, ending "or pass optimizer= to guess ..."
      where that replays it; see ``guess_wrappers``); with ``optimizer``: what a replay cannot
      give either (an update needing a loss value; the last-gradient proxy where the GeL
      transformation was not handed the optimiser's own input), or an ``optimizer`` whose
      ``init(params)`` is not shaped like ``opt_state``.
    TypeError: an ``optimizer`` that is not an optax transformation.
    ValueError: a concrete ``count`` that is not one whole number >= 0 or ``inf``.

  Examples:
    >>> import jax.numpy as jnp, optax
    >>> from fedjax_gel import optim
    >>> tx = optax.chain(optim.gel_sgdm(0.1, momentum=0.5), optax.scale(2.))
    >>> params = jnp.zeros(2)
    >>> state = tx.init(params)
    >>> updates, state = tx.update(jnp.ones(2), state, params)    # v = -0.1
    >>> updates, _ = optim.guess(state, params, jnp.inf, optimizer=tx)
    >>> updates                                  # 2 alpha / (1 - alpha) v, the scale replayed
    Array([-0.2, -0.2], dtype=float32)
  """
  if params is None:
    raise ValueError('guess: pass the current params (the guessed steps start from them)')
  _check_count(count)
  if not has_guess_state(opt_state):
    kinds = sorted({type(x).__name__ for x in jax.tree.leaves(
        opt_state, is_leaf=lambda x: isinstance(x, tuple) and hasattr(x, '_fields'))})
    raise NoGuessStateError(
        'guess: the optimiser state holds no GeL state (gel_sgdm or guessing); found '
        f'{", ".join(kinds) or "nothing"}. Build the client optimiser with '
        'fedjax_gel.optim.gel_sgdm(...) or fedjax_gel.optim.guessing(optax_optimizer)')
  if optimizer is not None:
    _check_optimizer(optimizer, opt_state, params)
  try:
    return guess_wrappers.follow(opt_state, params, count, _KINDS)
  except GuessRefusedError as refusal:
    if optimizer is None:
      if _replayable(opt_state, params, refusal):
        raise GuessRefusedError(f'{refusal}; or pass optimizer= to guess (the optimiser whose '
                                'state this is), which replays it with the proxy') from refusal
      raise
    if not getattr(refusal, 'replayable', True):
      raise   # the optimiser's update needs what the refused part of it needs
    try:
      proxy = guess_wrappers.replay_gradient(opt_state, params, _KINDS)
      return replay(optax.with_extra_args_support(optimizer).update, opt_state, params, proxy,
                    count, 'the optimiser (optimizer=)')
    except GuessRefusedError as failed:
      if _reason(failed) == _reason(refusal):
        raise refusal from failed
      raise GuessRefusedError(f'{refusal}; and optimizer= cannot replay it: '
                              f'{_reason(failed)}') from failed


def check_guessable(opt_state, params, *, optimizer=None) -> None:
  """Raises what ``guess(opt_state, params, count, optimizer=optimizer)`` would, computing nothing.

  It traces ``guess`` for shapes only, e.g. at a run's start (``algorithms.local_sgd``'s
  ``server_init``).

  Args:
    opt_state: the optimiser state, as for ``guess``.
    params: the params, as for ``guess``.
    optimizer: as for ``guess``.

  Raises:
    NoGuessStateError: ``opt_state`` holds no GeL state.
    GuessRefusedError: ``guess`` cannot take the guesses.
  """
  jax.eval_shape(lambda s, p: guess(s, p, jnp.float32(0.), optimizer=optimizer), opt_state,
                 params)


def momentum_coefficients(tau: int, tau_prime, alpha: float) -> jax.Array:
  """The coefficients of a client's accumulated update under momentum and zero-proxy guesses.

  Lemma 1 (Boukhari et al. 2023, GeL, eq. 6): the accumulated update is ``-lr sum_k a_k g_k``
  with ``a_k = (1 - alpha^(tau' + tau - k)) / (1 - alpha)``, ``k < tau``. With ``alpha = 0``
  (plain SGD) every coefficient is 1.

  Args:
    tau: the gradient steps, a static whole number >= 0 (it sizes the result).
    tau_prime: ``tau'``, the guessed steps after them (may be traced, or ``inf``).
    alpha: the momentum, in ``[0, 1)``.

  Returns:
    ``[tau]`` float32 ``a_k``.

  Raises:
    ValueError: ``tau`` not a whole number >= 0, or a concrete ``alpha`` outside its range.

  Examples:
    >>> from fedjax_gel import optim
    >>> optim.momentum_coefficients(3, 0, 0.5)
    Array([1.75, 1.5 , 1.  ], dtype=float32)
  """
  check_hyperparameter('momentum_coefficients alpha', alpha, lambda a: 0 <= a < 1, 'in [0, 1)')
  try:   # a static count (it sizes the result), e.g. a Python or NumPy integer
    steps = None if isinstance(tau, bool) else operator.index(tau)
  except TypeError:
    steps = None
  if steps is None or steps < 0:
    raise ValueError(f'momentum_coefficients: tau must be a whole number >= 0, got {tau!r}')
  tau = steps
  k = jnp.arange(tau, dtype=jnp.float32)
  if isinstance(alpha, (int, float)) and alpha == 0:   # a traced alpha takes the formula
    return jnp.ones_like(k)
  return (1. - jnp.power(alpha, jnp.asarray(tau_prime, jnp.float32) + tau - k)) / (1. - alpha)


def momentum_coefficients_l1(tau, tau_prime, alpha: float) -> jax.Array:
  """The sum of Lemma 1's coefficients, FedNova's ``||a_i||_1`` (Boukhari et al. 2023, GeL).

  ``||a||_1 = [tau - alpha^(tau'+1) (1 - alpha^tau) / (1 - alpha)] / (1 - alpha)``; ``tau' =
  inf`` gives ``tau / (1 - alpha)``, ``alpha = 0`` gives ``tau``.

  Args:
    tau: the gradient steps, >= 0; may be a traced array (one per client).
    tau_prime: ``tau'``, the guessed steps after them; may be a traced array, or ``inf``.
    alpha: the momentum, in ``[0, 1)``; may be traced.

  Returns:
    float32 ``||a||_1``, shaped like ``tau``.

  Raises:
    ValueError: a concrete ``alpha`` or ``tau`` outside its range.

  Examples:
    >>> from fedjax_gel import optim
    >>> optim.momentum_coefficients_l1(3, 0, 0.5)
    Array(4.25, dtype=float32)
  """
  check_hyperparameter('momentum_coefficients_l1 alpha', alpha, lambda a: 0 <= a < 1,
                       'in [0, 1)')
  check_hyperparameter('momentum_coefficients_l1 tau', tau, lambda t: t >= 0, '>= 0')
  tau = jnp.asarray(tau, jnp.float32)
  if isinstance(alpha, (int, float)) and alpha == 0:   # a traced alpha takes the formula
    return tau
  tail = jnp.power(alpha, jnp.asarray(tau_prime, jnp.float32) + 1.) * (1. - jnp.power(alpha, tau))
  return (tau - tail / (1. - alpha)) / (1. - alpha)
