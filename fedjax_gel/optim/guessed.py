"""Guessed updates (GeL): gradient-free extra steps for an optax client optimiser.

After exhausting its budget of ``tau_i`` gradient steps, a GeL client takes ``tau'_i`` *guessed*
steps, each an optimiser update with a proxy in place of the gradient it cannot afford
(Dhasade et al., "GeL: guess and learn", AAAI; seed 000 of the papers, §3.1, Algorithm 1):

* proxy *zero* with SGD momentum (``v <- alpha v - lr g; y <- y + v``, eqs. 1-2): each guess is
  ``v <- alpha v; y <- y + v``, so ``tau'`` of them add up to the nudge (eq. 5)

      y <- y + alpha (1 - alpha^tau') / (1 - alpha) * v,

  ``alpha / (1 - alpha) * v`` for ``tau' = inf``. ``gel_sgdm`` computes it in closed form.
* proxy *last gradient* (the earlier GeL report, seed 001, §3): the wrapped optimiser (e.g. Adam)
  is re-applied ``tau'`` times with the last computed gradient. ``guessing`` wraps any optax
  optimiser this way, or with the zero proxy.

Both return a ``GuessingTransformation``: an optax ``GradientTransformation`` (``init``,
``update``) plus ``guess(state, params, count) -> (updates, state)``, usable in any JAX training
loop. ``count`` may differ per call (and per client under ``vmap``) without recompiling.

Lemma 1 (seed 000, eq. 6): with momentum and zero proxy, the accumulated client update is
``-lr * sum_k a_k g_k`` with ``a_k = (1 - alpha^(tau' + tau_i - k)) / (1 - alpha)``;
``momentum_coefficients`` returns ``a`` and ``momentum_coefficients_l1`` its sum (FedNova's
``||a_i||_1``).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

PROXIES = ('zero', 'last_gradient')


class GuessingTransformation(NamedTuple):
  """An optax ``GradientTransformation`` with gradient-free guessed steps.

  Attributes:
    init: ``params -> state``.
    update: ``(grads, state, params) -> (updates, state)``, as in optax.
    guess: ``(state, params, count) -> (updates, state)``: the summed updates of ``count``
      guessed steps (``count`` a scalar, possibly traced; 0 gives zero updates).
  """
  init: Callable
  update: Callable
  guess: Callable


class SGDMState(NamedTuple):
  """GeL's momentum ``v`` (velocity): ``v <- alpha v - lr g``; the update is ``v``."""
  velocity: Any


def gel_sgdm(learning_rate: float, momentum: float = 0.9) -> GuessingTransformation:
  """SGD with momentum and GeL's zero-proxy guesses in closed form (seed 000, eqs. 1, 2, 5).

  ``update``: ``v <- alpha v - lr g``, updates ``= v`` (equal to ``optax.sgd(lr, momentum)`` for a
  constant ``lr``). ``guess(state, params, count)``: updates
  ``alpha (1 - alpha^count) / (1 - alpha) v`` and ``v <- alpha^count v``; ``count`` may be a float,
  ``inf`` included.
  """
  if not 0 <= momentum < 1:
    raise ValueError(f'gel_sgdm needs a momentum in [0, 1), got {momentum}')
  lr, alpha = learning_rate, momentum

  def init(params):
    return SGDMState(jax.tree_util.tree_map(jnp.zeros_like, params))

  def update(grads, state, params=None):
    del params
    v = jax.tree_util.tree_map(lambda v, g: alpha * v - lr * g, state.velocity, grads)
    return v, SGDMState(v)

  def guess(state, params=None, count=0):
    del params
    decay = jnp.power(jnp.asarray(alpha, jnp.float32), jnp.asarray(count, jnp.float32))
    nudge = alpha * (1. - decay) / (1. - alpha)
    updates = jax.tree_util.tree_map(lambda v: (nudge * v).astype(v.dtype), state.velocity)
    return updates, SGDMState(jax.tree_util.tree_map(lambda v: (decay * v).astype(v.dtype),
                                                     state.velocity))

  return GuessingTransformation(init, update, guess)


class GuessState(NamedTuple):
  """The wrapped optimiser's state and the last gradient (``None`` for the zero proxy)."""
  inner: Any
  last_grad: Any


def guessing(inner: optax.GradientTransformation, proxy: str = 'zero') -> GuessingTransformation:
  """Gives any optax optimiser guessed steps: ``inner`` re-applied with a proxy gradient.

  Args:
    inner: the client optimiser, e.g. ``optax.adam(1e-3)`` or ``optax.sgd(lr, momentum=0.9)``.
    proxy: ``'zero'`` (the gradient is taken as 0: momentum-type optimisers coast on their first
      moment) or ``'last_gradient'`` (the last computed gradient stands in; seed 001).

  ``guess(state, params, count)`` runs ``count`` (a finite integer, possibly traced) updates of
  ``inner`` with the proxy, moving a copy of ``params`` along, and returns their sum. A count
  that is not finite gives no guesses (infinitely many need a closed form: ``gel_sgdm``).
  """
  if proxy not in PROXIES:
    raise ValueError(f'unknown guess proxy {proxy!r}; known: {", ".join(PROXIES)}')
  keep_last = proxy == 'last_gradient'

  def init(params):
    last = jax.tree_util.tree_map(jnp.zeros_like, params) if keep_last else None
    return GuessState(inner.init(params), last)

  def update(grads, state, params=None):
    updates, inner_state = inner.update(grads, state.inner, params)
    return updates, GuessState(inner_state, grads if keep_last else None)

  def guess(state, params, count):
    proxy_grad = state.last_grad if keep_last else jax.tree_util.tree_map(jnp.zeros_like, params)

    def step(_, carry):
      total, inner_state, p = carry
      u, inner_state = inner.update(proxy_grad, inner_state, p)
      return optax.tree_utils.tree_add(total, u), inner_state, optax.apply_updates(p, u)

    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    count = jnp.asarray(count, jnp.float32)
    count = jnp.where(jnp.isfinite(count), count, 0.).astype(jnp.int32)
    total, inner_state, _ = jax.lax.fori_loop(0, count, step,
                                              (zeros, state.inner, params))
    return total, GuessState(inner_state, state.last_grad)

  return GuessingTransformation(init, update, guess)


def momentum_coefficients(tau: int, tau_prime, alpha: float) -> jax.Array:
  """Lemma 1 (seed 000, eq. 6): ``a_k = (1 - alpha^(tau' + tau - k)) / (1 - alpha)``, k < tau.

  With ``alpha = 0`` (plain SGD) every coefficient is 1.
  """
  k = jnp.arange(tau, dtype=jnp.float32)
  if alpha == 0:
    return jnp.ones_like(k)
  return (1. - jnp.power(alpha, jnp.asarray(tau_prime, jnp.float32) + tau - k)) / (1. - alpha)


def momentum_coefficients_l1(tau, tau_prime, alpha: float) -> jax.Array:
  # alpha in [0, 1): the sums below are geometric series.
  """``||a||_1 = [tau - alpha^(tau'+1) (1 - alpha^tau) / (1 - alpha)] / (1 - alpha)`` (DESIGN §4).

  ``tau`` and ``tau'`` may be traced arrays (one per client); ``tau' = inf`` gives
  ``tau / (1 - alpha)``; ``alpha = 0`` gives ``tau``.
  """
  tau = jnp.asarray(tau, jnp.float32)
  if alpha == 0:
    return tau
  tail = jnp.power(alpha, jnp.asarray(tau_prime, jnp.float32) + 1.) * (1. - jnp.power(alpha, tau))
  return (tau - tail / (1. - alpha)) / (1. - alpha)
