"""Global biased optimisers (FedGBO): client optimisers whose statistics are frozen in a round.

Mills, Hu, Min, "Accelerating Federated Learning with a Global Biased Optimiser", IEEE
Transactions on Computers (seed 004 of the papers, Algorithm 1, Table 2). The server keeps global
statistics ``S`` (pytrees like params): ``m`` for SGDm, ``v`` for RMSProp, both for Adam, with
``m_0 = 0`` and ``v_0 = 1``. Each round:

* **update** (clients, ``S`` downloaded and never changed during local training), per step with
  minibatch gradient ``g``::

    SGDm:     y <- y - lr (beta m + (1 - beta) g)
    RMSProp:  y <- y - lr g / (sqrt(v) + eps)
    Adam:     y <- y - lr (beta1 m + (1 - beta1) g) / (sqrt(v) + eps)

* **inverse** (server, old ``S``): the average client gradient from the model change, with ``x``
  the round's global model, ``x_bar`` the average client model and ``K`` the number of local
  steps::

    SGDm:     g = [(x - x_bar) / (lr K) - beta m] / (1 - beta)
    RMSProp:  g = (x - x_bar) (sqrt(v) + eps) / (lr K)
    Adam:     g = [(x - x_bar) (sqrt(v) + eps) / (lr K) - beta1 m] / (1 - beta1)

* **track** (server): ``m <- beta1 m + (1 - beta1) g`` and ``v <- beta2 v + (1 - beta2) g^2``
  (SGDm tracks ``m`` with its ``beta``, RMSProp ``v`` with its ``beta``); then ``x <- x_bar``.

With ``S`` frozen the client step is affine in ``g``, so the inverse is exact: if client ``i``
(weight ``p_i``, ``sum_i p_i = 1``) takes ``K_i`` steps with gradients ``g_ik`` and
``x_bar = sum_i p_i y_i``, then ``inverse(x, x_bar, S, sum_i p_i K_i)`` is
``sum_i p_i sum_k g_ik / sum_i p_i K_i``, the step-weighted mean gradient (equal ``K_i = K``:
the plain mean over clients and steps).

Defaults follow the hyper-parameters of the paper's experiments (its code's settings table):
``eps = 1e-3`` everywhere (the paper notes RMSProp and Adam need a large adaptivity parameter to be
stable), ``beta = 0.9`` for SGDm and RMSProp (the most frequent tuned value), ``beta1 = 0.9`` and
``beta2 = 0.99`` for Adam (``beta2`` was fixed at 0.99 in all runs). As in the paper there is no
bias correction. Adam with ``beta1 = 0`` is RMSProp; SGDm is Adam with ``v = 1``, ``eps = 0``.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

KINDS = ('sgdm', 'rmsprop', 'adam')


class GBOStats(NamedTuple):
  """FedGBO's global statistics, pytrees like params: ``m`` (``None`` for RMSProp) and ``v``
  (``None`` for SGDm). ``None`` is an empty pytree, so the stats ``jit``/``vmap`` as they are."""
  m: Any
  v: Any


class GlobalBiasedOptimizer(NamedTuple):
  """A FedGBO optimiser: hyper-parameters and the pure functions of one round.

  Attributes:
    kind: ``'sgdm'``, ``'rmsprop'`` or ``'adam'``.
    learning_rate: the client learning rate ``lr`` (the inverse step divides by it).
    beta1: the decay of ``m`` (SGDm's ``beta``, Adam's ``beta1``; ``None`` for RMSProp).
    beta2: the decay of ``v`` (RMSProp's ``beta``, Adam's ``beta2``; ``None`` for SGDm).
    eps: added to ``sqrt(v)`` (``None`` for SGDm).
    init_stats: ``params -> GBOStats``: ``m = 0``, ``v = 1``.
    client_optimizer: ``stats -> optax.GradientTransformation``: ``init(params)`` returns
      ``stats``; ``update(grads, state, params=None)`` returns the update step above with the
      statistics in ``state`` and the same ``state``.
    inverse: ``(x, x_bar, stats, num_steps) -> g``; ``num_steps`` a positive scalar, possibly a
      traced float (e.g. the weighted mean number of local steps).
    track: ``(stats, g) -> stats``.
    server_update: ``(x, x_bar, stats, num_steps) -> stats``: ``track(stats, inverse(...))``.
    tracking_optimizer: ``stats -> optax.GradientTransformation``: the same optimiser with its
      statistics updated every step (MFL's clients start it from the downloaded statistics).
  """
  kind: str
  learning_rate: float
  beta1: float | None
  beta2: float | None
  eps: float | None
  init_stats: Callable
  client_optimizer: Callable
  inverse: Callable
  track: Callable
  server_update: Callable
  tracking_optimizer: Callable


def _check_decay(name: str, value: float, upper_open: bool) -> None:
  ok = 0 <= value < 1 if upper_open else 0 <= value <= 1
  if not ok:
    raise ValueError(f'{name} must be in [0, {"1)" if upper_open else "1]"}, got {value}')


def _make(kind: str, learning_rate: float, beta1: float | None, beta2: float | None,
          eps: float | None) -> GlobalBiasedOptimizer:
  """Shared body: ``beta1 is None`` means no ``m``, ``beta2 is None`` no ``v`` (and no ``eps``)."""
  if isinstance(learning_rate, (int, float)) and not learning_rate > 0:
    raise ValueError(f'{kind} needs a positive learning rate, got {learning_rate}')
  if beta1 is not None:
    _check_decay('beta' if kind == 'sgdm' else 'beta1', beta1, upper_open=True)
  if beta2 is not None:
    _check_decay('beta' if kind == 'rmsprop' else 'beta2', beta2, upper_open=False)
    if not eps >= 0:
      raise ValueError(f'{kind} needs eps >= 0, got {eps}')
  lr = learning_rate
  has_m, has_v = beta1 is not None, beta2 is not None
  tree_map = jax.tree_util.tree_map

  def init_stats(params):
    m = tree_map(jnp.zeros_like, params) if has_m else None
    v = tree_map(jnp.ones_like, params) if has_v else None
    return GBOStats(m, v)

  def _map(fn, *trees, stats):
    """``fn(*leaves, m, v)`` over ``trees`` and the statistics; a missing statistic is ``None``."""
    if has_m and has_v:
      return tree_map(fn, *trees, stats.m, stats.v)
    if has_m:
      return tree_map(lambda *a: fn(*a, None), *trees, stats.m)
    return tree_map(lambda *a: fn(*a[:-1], None, a[-1]), *trees, stats.v)

  def _direction(g, m, v):
    d = g if m is None else beta1 * m + (1 - beta1) * g
    return d if v is None else d / (jnp.sqrt(v) + eps)

  def update(grads, state, params=None):
    del params
    updates = _map(lambda g, m, v: (-lr * _direction(g, m, v)).astype(g.dtype), grads,
                   stats=state)
    return updates, state

  def client_optimizer(stats):
    return optax.GradientTransformation(lambda params: stats, update)

  def inverse(x, x_bar, stats, num_steps):
    lr_k = lr * jnp.asarray(num_steps, jnp.float32)

    def leaf(x, x_bar, m, v):
      d = (x - x_bar) / lr_k
      if v is not None:
        d = d * (jnp.sqrt(v) + eps)
      if m is not None:
        d = (d - beta1 * m) / (1 - beta1)
      return d.astype(x.dtype)

    return _map(leaf, x, x_bar, stats=stats)

  def track(stats, g):
    m = v = None
    if has_m:
      m = tree_map(lambda m, g: (beta1 * m + (1 - beta1) * g).astype(m.dtype), stats.m, g)
    if has_v:
      v = tree_map(lambda v, g: (beta2 * v + (1 - beta2) * g * g).astype(v.dtype), stats.v, g)
    return GBOStats(m, v)

  def server_update(x, x_bar, stats, num_steps):
    return track(stats, inverse(x, x_bar, stats, num_steps))

  def tracking_update(grads, state, params=None):
    """The ordinary optimiser: statistics tracked every step, the step taken with the new ones
    (``beta m + (1 - beta) g`` is the new ``m``)."""
    del params
    new = track(state, grads)
    v_new = new.v if has_v else None
    updates = _map(lambda g, m, v: (-lr * _direction(g, m, v)).astype(g.dtype), grads,
                   stats=GBOStats(state.m, v_new))
    return updates, new

  def tracking_optimizer(stats):
    return optax.GradientTransformation(lambda params: stats, tracking_update)

  return GlobalBiasedOptimizer(kind, learning_rate, beta1, beta2, eps, init_stats,
                               client_optimizer, inverse, track, server_update,
                               tracking_optimizer)


def gbo_sgdm(learning_rate: float, beta: float = 0.9) -> GlobalBiasedOptimizer:
  """FedGBO with SGDm: ``y <- y - lr (beta m + (1 - beta) g)``; tracks ``m``; ``beta`` in [0, 1)."""
  return _make('sgdm', learning_rate, beta, None, None)


def gbo_rmsprop(learning_rate: float, beta: float = 0.9, eps: float = 1e-3
                ) -> GlobalBiasedOptimizer:
  """FedGBO with RMSProp: ``y <- y - lr g / (sqrt(v) + eps)``; tracks ``v`` with ``beta``."""
  return _make('rmsprop', learning_rate, None, beta, eps)


def gbo_adam(learning_rate: float, beta1: float = 0.9, beta2: float = 0.99, eps: float = 1e-3
             ) -> GlobalBiasedOptimizer:
  """FedGBO with Adam: ``y <- y - lr (beta1 m + (1 - beta1) g) / (sqrt(v) + eps)``; no bias
  correction; tracks ``m`` with ``beta1`` and ``v`` with ``beta2``."""
  return _make('adam', learning_rate, beta1, beta2, eps)


_FACTORIES = {'sgdm': gbo_sgdm, 'rmsprop': gbo_rmsprop, 'adam': gbo_adam}


def gbo(kind: str, learning_rate: float, **hparams) -> GlobalBiasedOptimizer:
  """FedGBO optimiser by name: ``gbo('adam', 1e-3, beta1=0.9)``.

  ``hparams`` are the keywords of ``gbo_sgdm`` (``beta``), ``gbo_rmsprop`` (``beta``, ``eps``) or
  ``gbo_adam`` (``beta1``, ``beta2``, ``eps``); others raise ``ValueError``.
  """
  if kind not in _FACTORIES:
    raise ValueError(f'unknown FedGBO optimiser {kind!r}; known: {", ".join(KINDS)}')
  allowed = {'sgdm': ('beta',), 'rmsprop': ('beta', 'eps'), 'adam': ('beta1', 'beta2', 'eps')}
  unknown = sorted(set(hparams) - set(allowed[kind]))
  if unknown:
    raise ValueError(f'FedGBO {kind} takes {", ".join(allowed[kind])}; got {", ".join(unknown)}')
  return _FACTORIES[kind](learning_rate, **hparams)
