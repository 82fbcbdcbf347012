"""Global biased optimisers (FedGBO): client optimisers whose statistics are frozen in a round.

Mills, Hu, Min 2022, "Accelerating Federated Learning with a Global Biased Optimiser" (FedGBO;
Algorithm 1, Table 2). The server keeps global statistics ``S`` (``GBOStats``, pytrees like
params): ``m`` for SGDm, ``v`` for RMSProp, both for Adam, with ``m_0 = 0`` and ``v_0 = 1``. Each
piece of a round is an optax transformation:

* ``gbo_client`` (clients; ``S`` passed as the extra argument ``stats`` and never changed), per
  step with minibatch gradient ``g``::

    SGDm:     y <- y - lr (b1 m + (1 - b1) g)
    RMSProp:  y <- y - lr g / (sqrt(v) + eps)
    Adam:     y <- y - lr (b1 m + (1 - b1) g) / (sqrt(v) + eps)

* ``gbo_inverse`` (server, old ``S``): the average client gradient from the mean model change
  ``Delta = x - x_bar`` and the number of local steps ``K`` (extra arguments ``stats``,
  ``num_steps``)::

    SGDm:     g = [Delta / (lr K) - b1 m] / (1 - b1)
    RMSProp:  g = Delta (sqrt(v) + eps) / (lr K)
    Adam:     g = [Delta (sqrt(v) + eps) / (lr K) - b1 m] / (1 - b1)

* ``gbo_track`` (server; its state is ``S``): ``m <- b1 m + (1 - b1) g``, ``v <- b2 v +
  (1 - b2) g^2``; the updates pass through unchanged.
* ``gbo_server``: both on ``Delta`` (its state is ``S``), with updates ``-Delta``, so that
  ``x <- x_bar``; a round with ``K = 0`` leaves ``S`` as it is.
* ``gbo_adaptive``: the ordinary optimiser (its state is ``S``, tracked every step), which MFL's
  clients start from the downloaded ``S``.

With ``S`` frozen the client step is affine in ``g``, so the inverse is exact: if client ``i``
(weight ``p_i``) takes ``K_i`` steps with gradients ``g_ik`` and ``x_bar = sum_i p_i y_i``, the
inverse with ``K = sum_i p_i K_i`` gives ``sum_i p_i sum_k g_ik / K``, the step-weighted mean
gradient.

Hyper-parameters are named as in optax: ``b1`` (the paper's ``beta`` for SGDm, ``beta1`` for
Adam), ``b2`` (Adam's ``beta2``), ``decay`` (RMSProp's ``beta``), ``eps`` (the paper's ``epsilon``).
Defaults follow the paper's experiments: ``eps = 1e-3`` (RMSProp and Adam need a large adaptivity
parameter to be stable), ``b1 = decay = 0.9``, ``b2 = 0.99``. As in the paper there is no bias
correction. Learning rates may be optax schedules, evaluated at the transformation's own step
count (client steps; server rounds for the inverse, which is exact only for a learning rate the
clients held constant in the round).
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_gel.optim.hyperparams import check_hyperparameter, value_at

KINDS = ('sgdm', 'rmsprop', 'adam')
"""The FedGBO optimisers by name (``gbo``'s ``kind``)."""


class GBOStats(NamedTuple):
  """FedGBO's global statistics ``S``, pytrees like params (``m_0 = 0``, ``v_0 = 1``).

  Attributes:
    m: the momentum (SGDm, Adam); ``None`` for RMSProp.
    v: the second moment (RMSProp, Adam); ``None`` for SGDm.
  """
  m: Any
  v: Any


class GBOCountState(NamedTuple):
  """The state of ``gbo_client`` and ``gbo_inverse``.

  Attributes:
    count: the step count a learning-rate schedule is evaluated at.
  """
  count: jax.Array


class GBOServerState(NamedTuple):
  """The state of ``gbo_server``.

  Attributes:
    count: the round count (a learning-rate schedule's step).
    stats: the global statistics ``S``.
  """
  count: jax.Array
  stats: GBOStats


class GBOAdaptiveState(NamedTuple):
  """The state of ``gbo_adaptive``.

  Attributes:
    count: the step count (a learning-rate schedule's step).
    stats: the statistics it tracks every step.
  """
  count: jax.Array
  stats: GBOStats


def _check(learning_rate, b1, b2, eps, b2_name='b2'):
  check_hyperparameter('learning_rate', learning_rate, lambda x: 0 < x < math.inf,
                       'positive and finite')
  if b1 is not None:
    check_hyperparameter('b1', b1, lambda b: 0 <= b < 1, 'in [0, 1)')
  if b2 is not None:
    check_hyperparameter(b2_name, b2, lambda b: 0 <= b <= 1, 'in [0, 1]')
    check_hyperparameter('eps', eps, lambda e: 0 <= e < math.inf, '>= 0 and finite')


def init_stats(params, b1, b2) -> GBOStats:
  """``m = 0`` where ``b1`` is given, ``v = 1`` where ``b2`` is."""
  return GBOStats(None if b1 is None else optax.tree_utils.tree_zeros_like(params),
                  None if b2 is None else optax.tree_utils.tree_ones_like(params))


def _zip(fn, *trees, stats: GBOStats):
  """``fn(*leaves, m, v)`` leaf by leaf (leaves as arrays); a missing statistic is ``None``,
  and a ``None`` leaf of the trees (no parameter there, as optax allows) stays ``None``."""
  none = jax.tree.map(lambda _: None, trees[0])
  m = none if stats.m is None else stats.m
  v = none if stats.v is None else stats.v
  return jax.tree.map(
      lambda x, *rest: None if x is None else fn(jnp.asarray(x), *rest),
      *trees, m, v, is_leaf=lambda x: x is None)


def _direction(b1, eps, g, m, v):
  d = g if m is None else b1 * m + (1 - b1) * g
  return d if v is None else d / (jnp.sqrt(v) + eps)


def _check_stats(name: str, stats, b1, b2):
  """``stats`` are of this optimiser's kind: ``m`` where ``b1`` is set, ``v`` where ``b2`` is
  (an Adam client given SGDm's statistics took SGDm steps without a word)."""
  if not isinstance(stats, GBOStats):
    raise ValueError(f'{name}: stats must be GBOStats(m, v), got {type(stats).__name__}')
  if (stats.m is None) != (b1 is None) or (stats.v is None) != (b2 is None):
    need = ' and '.join(n for n, b in (('m', b1), ('v', b2)) if b is not None)
    have = ' and '.join(n for n, x in (('m', stats.m), ('v', stats.v)) if x is not None)
    raise ValueError(f'{name}: statistics of another FedGBO optimiser: this one needs {need}, '
                     f'got {have or "neither"}')


def gbo_client(learning_rate: optax.ScalarOrSchedule, b1: float | None = 0.9,
               b2: float | None = None, eps: float = 1e-3
               ) -> optax.GradientTransformationExtraArgs:
  """FedGBO's client step, with the global statistics frozen (Mills et al. 2022, FedGBO).

  Per step with minibatch gradient ``g``: SGDm ``y <- y - lr (b1 m + (1 - b1) g)``, RMSProp
  ``y <- y - lr g / (sqrt(v) + eps)``, Adam ``y <- y - lr (b1 m + (1 - b1) g) / (sqrt(v) +
  eps)``; ``S = (m, v)`` is passed to every ``update`` and never changed.

  Args:
    learning_rate: ``lr``, positive and finite, or an optax schedule evaluated at the client steps.
    b1: the momentum ``m``'s decay in ``[0, 1)``; None: no ``m``.
    b2: the second moment ``v``'s decay in ``[0, 1]``; None: no ``v``. ``b1`` set and ``b2 =
      None``: SGDm; ``b1 = None`` and ``b2`` set: RMSProp; both: Adam.
    eps: the adaptivity ``eps`` >= 0, read with ``v``.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` (state ``GBOCountState``) whose update is
    ``update(grads, state, params, stats=S)``.

  Raises:
    ValueError: a concrete hyper-parameter outside its range; from ``update``, no ``stats`` or
      statistics of another kind.
  """
  _check(learning_rate, b1, b2, eps)

  def init(params):
    del params
    return GBOCountState(jnp.zeros([], jnp.int32))

  def update(grads, state, params=None, *, stats: GBOStats | None = None, **extra_args):
    del params, extra_args
    if stats is None:
      raise ValueError('gbo_client: update needs the frozen global statistics: '
                       'update(grads, state, params, stats=GBOStats(m, v))')
    _check_stats('gbo_client', stats, b1, b2)
    lr = value_at(learning_rate, state.count)
    updates = _zip(lambda g, m, v: (-lr * _direction(b1, eps, g, m, v)).astype(g.dtype), grads,
                   stats=stats)
    return updates, GBOCountState(optax.safe_increment(state.count))

  return optax.GradientTransformationExtraArgs(init, update)


def inverse_step(delta, stats: GBOStats, lr, num_steps, b1, eps):
  """FedGBO's inverse step: the mean client gradient from the mean model change ``delta``."""
  lr_k = lr * jnp.asarray(num_steps, jnp.float32)

  def leaf(d, m, v):
    g = d / lr_k
    if v is not None:
      g = g * (jnp.sqrt(v) + eps)
    if m is not None:
      g = (g - b1 * m) / (1 - b1)
    return g.astype(d.dtype)

  return _zip(leaf, delta, stats=stats)


def track(stats: GBOStats, grads, b1, b2) -> GBOStats:
  """``m <- b1 m + (1 - b1) g``, ``v <- b2 v + (1 - b2) g^2`` (dtypes kept)."""
  m = None if stats.m is None else jax.tree.map(
      lambda m, g: (b1 * m + (1 - b1) * g).astype(m.dtype), stats.m, grads)
  v = None if stats.v is None else jax.tree.map(
      lambda v, g: (b2 * v + (1 - b2) * g * g).astype(v.dtype), stats.v, grads)
  return GBOStats(m, v)


def gbo_inverse(learning_rate: optax.ScalarOrSchedule, b1: float | None = 0.9,
                b2: float | None = None, eps: float = 1e-3
                ) -> optax.GradientTransformationExtraArgs:
  """FedGBO's inverse step: the mean client gradient from the mean model change (Mills et al. 2022).

  From ``Delta = x - x_bar`` and ``K`` local steps, with the old statistics: SGDm ``g =
  [Delta / (lr K) - b1 m] / (1 - b1)``, RMSProp ``g = Delta (sqrt(v) + eps) / (lr K)``, Adam
  ``g = [Delta (sqrt(v) + eps) / (lr K) - b1 m] / (1 - b1)``. With ``S`` frozen the client
  step is affine in ``g``, so the inverse is exact (for a learning rate the clients held
  constant in the round).

  Args:
    learning_rate: ``lr``, positive and finite, or an optax schedule evaluated at its rounds.
    b1: the momentum ``m``'s decay in ``[0, 1)``; None: no ``m``.
    b2: the second moment ``v``'s decay in ``[0, 1]``; None: no ``v``. ``b1`` set and ``b2 =
      None``: SGDm; ``b1 = None`` and ``b2`` set: RMSProp; both: Adam.
    eps: the adaptivity ``eps`` >= 0, read with ``v``.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` (state ``GBOCountState``) whose update is
    ``update(delta, state, params, stats=S, num_steps=K)``, ``K > 0`` (a traced float is fine,
    e.g. the weighted mean number of local steps).

  Raises:
    ValueError: a concrete hyper-parameter outside its range; from ``update``, no ``stats`` or
      ``num_steps``, statistics of another kind, or a known ``K <= 0``.
  """
  _check(learning_rate, b1, b2, eps)

  def init(params):
    del params
    return GBOCountState(jnp.zeros([], jnp.int32))

  def update(delta, state, params=None, *, stats: GBOStats | None = None, num_steps=None,
             **extra_args):
    del params, extra_args
    if stats is None or num_steps is None:
      raise ValueError('gbo_inverse: update needs stats=GBOStats(m, v) and num_steps=K')
    _check_stats('gbo_inverse', stats, b1, b2)
    check_hyperparameter('gbo_inverse num_steps', num_steps, lambda k: k > 0, '> 0 (K, the '
                         'mean number of local steps)')
    g = inverse_step(delta, stats, value_at(learning_rate, state.count), num_steps, b1, eps)
    return g, GBOCountState(optax.safe_increment(state.count))

  return optax.GradientTransformationExtraArgs(init, update)


def gbo_track(b1: float | None = 0.9, b2: float | None = None
              ) -> optax.GradientTransformationExtraArgs:
  """Tracks the global statistics with the updates, which pass through unchanged.

  ``m <- b1 m + (1 - b1) g``, ``v <- b2 v + (1 - b2) g^2``; its state is the ``GBOStats``.

  Args:
    b1: the momentum ``m``'s decay in ``[0, 1)``; None: no ``m``.
    b2: the second moment ``v``'s decay in ``[0, 1]``; None: no ``v``.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose state is the ``GBOStats``.

  Raises:
    ValueError: a concrete hyper-parameter outside its range.
  """
  _check(1., b1, b2, 0.)

  def init(params):
    return init_stats(params, b1, b2)

  def update(grads, state, params=None, **extra_args):
    del params, extra_args
    return grads, track(state, grads, b1, b2)

  return optax.GradientTransformationExtraArgs(init, update)


def gbo_server(learning_rate: optax.ScalarOrSchedule, b1: float | None = 0.9,
               b2: float | None = None, eps: float = 1e-3
               ) -> optax.GradientTransformationExtraArgs:
  """FedGBO's server step on the mean model change ``Delta = x - x_bar`` (Mills et al. 2022).

  The inverse step (``gbo_inverse``, with the old statistics) then tracking (``gbo_track``) on
  its gradient; the updates are ``-Delta``, so that ``x <- x_bar``. ``K <= 0`` (no client took
  a step) leaves the statistics unchanged.

  Args:
    learning_rate: ``lr``, positive and finite, or an optax schedule evaluated at its rounds.
    b1: the momentum ``m``'s decay in ``[0, 1)``; None: no ``m``.
    b2: the second moment ``v``'s decay in ``[0, 1]``; None: no ``v``. ``b1`` set and ``b2 =
      None``: SGDm; ``b1 = None`` and ``b2`` set: RMSProp; both: Adam.
    eps: the adaptivity ``eps`` >= 0, read with ``v``.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` (state ``GBOServerState``) whose update is
    ``update(delta, state, params, num_steps=K)``.

  Raises:
    ValueError: a concrete hyper-parameter outside its range; from ``update``, no ``num_steps``.
  """
  _check(learning_rate, b1, b2, eps)

  def init(params):
    return GBOServerState(jnp.zeros([], jnp.int32), init_stats(params, b1, b2))

  def update(delta, state, params=None, *, num_steps=None, **extra_args):
    del params, extra_args
    if num_steps is None:
      raise ValueError('gbo_server: update needs num_steps=K (the mean number of local steps)')
    k = jnp.asarray(num_steps, jnp.float32)
    g = inverse_step(delta, state.stats, value_at(learning_rate, state.count),
                     jnp.maximum(k, 1e-30), b1, eps)
    new = track(state.stats, g, b1, b2)
    stats = jax.tree.map(lambda n, o: jnp.where(k > 0, n, o), new, state.stats)
    return (jax.tree.map(jnp.negative, delta),
            GBOServerState(optax.safe_increment(state.count), stats))

  return optax.GradientTransformationExtraArgs(init, update)


def gbo_adaptive(learning_rate: optax.ScalarOrSchedule, b1: float | None = 0.9,
                 b2: float | None = None, eps: float = 1e-3
                 ) -> optax.GradientTransformationExtraArgs:
  """The ordinary optimiser in FedGBO's form, its statistics tracked every step (MFL's clients).

  The step is taken with the new statistics (``b1 m + (1 - b1) g`` is the new ``m``); ``m_0 =
  0``, ``v_0 = 1``. MFL's clients start it from the downloaded statistics.

  Args:
    learning_rate: ``lr``, positive and finite, or an optax schedule evaluated at its steps.
    b1: the momentum ``m``'s decay in ``[0, 1)``; None: no ``m``.
    b2: the second moment ``v``'s decay in ``[0, 1]``; None: no ``v``. ``b1`` set and ``b2 =
      None``: SGDm; ``b1 = None`` and ``b2`` set: RMSProp; both: Adam.
    eps: the adaptivity ``eps`` >= 0, read with ``v``.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose state is a ``GBOAdaptiveState``.

  Raises:
    ValueError: a concrete hyper-parameter outside its range.
  """
  _check(learning_rate, b1, b2, eps)

  def init(params):
    return GBOAdaptiveState(jnp.zeros([], jnp.int32), init_stats(params, b1, b2))

  def update(grads, state, params=None, **extra_args):
    del params, extra_args
    new = track(state.stats, grads, b1, b2)
    lr = value_at(learning_rate, state.count)
    updates = _zip(lambda g, m, v: (-lr * _direction(b1, eps, g, m, v)).astype(g.dtype), grads,
                   stats=GBOStats(state.stats.m, new.v))
    return updates, GBOAdaptiveState(optax.safe_increment(state.count), new)

  return optax.GradientTransformationExtraArgs(init, update)


class GlobalBiasedOptimizer(NamedTuple):
  """One FedGBO optimiser's transformations, with the same hyper-parameters.

  Attributes:
    kind: ``'sgdm'``, ``'rmsprop'`` or ``'adam'``.
    client: ``gbo_client`` (frozen statistics, extra argument ``stats``).
    inverse: ``gbo_inverse`` (``Delta -> g``).
    track: ``gbo_track`` (state: the statistics).
    server: ``gbo_server`` (inverse and tracking; updates ``-Delta``).
    adaptive: ``gbo_adaptive`` (statistics tracked every step; MFL's clients).
    learning_rate: the learning rate they share. A schedule is evaluated by each at its own
      step count (the clients' steps, the server's rounds), so ``algorithms.fedgbo``, whose
      inverse step needs the rate the clients stepped with, refuses one.
  """
  kind: str
  client: optax.GradientTransformationExtraArgs
  inverse: optax.GradientTransformationExtraArgs
  track: optax.GradientTransformationExtraArgs
  server: optax.GradientTransformationExtraArgs
  adaptive: optax.GradientTransformationExtraArgs
  learning_rate: optax.ScalarOrSchedule = None


def _bundle(kind, learning_rate, b1, b2, eps) -> GlobalBiasedOptimizer:
  return GlobalBiasedOptimizer(kind, gbo_client(learning_rate, b1, b2, eps),
                               gbo_inverse(learning_rate, b1, b2, eps), gbo_track(b1, b2),
                               gbo_server(learning_rate, b1, b2, eps),
                               gbo_adaptive(learning_rate, b1, b2, eps), learning_rate)


def _given(kind: str, **hparams):
  """A kind's own hyper-parameters are numbers: ``None`` (the lower-level transformations'
  "not tracked") would silently make it another kind (Adam without ``b2`` runs SGDm)."""
  for name, value in hparams.items():
    if value is None:
      raise TypeError(f'gbo_{kind}: {name} must be a number, got None')


def gbo_sgdm(learning_rate: optax.ScalarOrSchedule, b1: float = 0.9) -> GlobalBiasedOptimizer:
  """FedGBO's optimisers with SGDm (Mills et al. 2022, FedGBO).

  Clients step ``y <- y - lr (b1 m + (1 - b1) g)`` with ``m`` frozen; the server tracks ``m``.

  Args:
    learning_rate: ``lr``, positive and finite, or an optax schedule.
    b1: the paper's ``beta``, in ``[0, 1)``.

  Returns:
    The ``GlobalBiasedOptimizer`` (``kind='sgdm'``).

  Raises:
    ValueError: a concrete hyper-parameter outside its range.
    TypeError: a hyper-parameter that is no number (``None`` included).
  """
  _given('sgdm', b1=b1)
  return _bundle('sgdm', learning_rate, b1, None, 0.)


def gbo_rmsprop(learning_rate: optax.ScalarOrSchedule, decay: float = 0.9, eps: float = 1e-3
                ) -> GlobalBiasedOptimizer:
  """FedGBO's optimisers with RMSProp (Mills et al. 2022, FedGBO).

  Clients step ``y <- y - lr g / (sqrt(v) + eps)`` with ``v`` frozen; the server tracks ``v <-
  decay v + (1 - decay) g^2``.

  Args:
    learning_rate: ``lr``, positive and finite, or an optax schedule.
    decay: the paper's ``beta``, in ``[0, 1]``.
    eps: the paper's ``epsilon``, >= 0 (``1e-3``: RMSProp needs a large adaptivity parameter to
      be stable).

  Returns:
    The ``GlobalBiasedOptimizer`` (``kind='rmsprop'``).

  Raises:
    ValueError: a concrete hyper-parameter outside its range.
    TypeError: a hyper-parameter that is no number (``None`` included).
  """
  _given('rmsprop', decay=decay, eps=eps)
  _check(learning_rate, None, decay, eps, b2_name='decay')
  return _bundle('rmsprop', learning_rate, None, decay, eps)


def gbo_adam(learning_rate: optax.ScalarOrSchedule, b1: float = 0.9, b2: float = 0.99,
             eps: float = 1e-3) -> GlobalBiasedOptimizer:
  """FedGBO's optimisers with Adam (Mills et al. 2022, FedGBO).

  Clients step ``y <- y - lr (b1 m + (1 - b1) g) / (sqrt(v) + eps)`` with ``m`` and ``v``
  frozen, no bias correction; the server tracks ``m`` with ``b1`` and ``v`` with ``b2``.

  Args:
    learning_rate: ``lr``, positive and finite, or an optax schedule.
    b1: the paper's ``beta1``, in ``[0, 1)``.
    b2: the paper's ``beta2``, in ``[0, 1]``.
    eps: the paper's ``epsilon``, >= 0 (``1e-3``: Adam needs a large adaptivity parameter to be
      stable).

  Returns:
    The ``GlobalBiasedOptimizer`` (``kind='adam'``).

  Raises:
    ValueError: a concrete hyper-parameter outside its range.
    TypeError: a hyper-parameter that is no number (``None`` included).

  Examples:
    >>> import jax, jax.numpy as jnp, optax
    >>> from fedjax_gel import optim
    >>> gbo = optim.gbo_adam(learning_rate=0.1, b1=0.9, b2=0.99, eps=1e-3)
    >>> x = {'w': jnp.ones(3)}
    >>> server_state = gbo.server.init(x)
    >>> y, client_state = x, gbo.client.init(x)          # a client, statistics frozen
    >>> g = jax.grad(lambda p: 0.5 * jnp.sum(p['w'] ** 2))(y)
    >>> updates, client_state = gbo.client.update(g, client_state, y, stats=server_state.stats)
    >>> y = optax.apply_updates(y, updates)
    >>> delta = jax.tree.map(jnp.subtract, x, y)
    >>> updates, server_state = gbo.server.update(delta, server_state, x, num_steps=1)
    >>> x = optax.apply_updates(x, updates)              # the client's model, statistics tracked
  """
  _given('adam', b1=b1, b2=b2, eps=eps)
  return _bundle('adam', learning_rate, b1, b2, eps)


_FACTORIES = {'sgdm': (gbo_sgdm, ('b1',)), 'rmsprop': (gbo_rmsprop, ('decay', 'eps')),
              'adam': (gbo_adam, ('b1', 'b2', 'eps'))}


def gbo(kind: str, learning_rate: optax.ScalarOrSchedule, **hparams) -> GlobalBiasedOptimizer:
  """Builds a FedGBO optimiser by name.

  Args:
    kind: one of ``GBO_KINDS``: ``'sgdm'``, ``'rmsprop'``, ``'adam'``.
    learning_rate: ``lr``, positive and finite, or an optax schedule.
    **hparams: those of ``gbo_sgdm`` (``b1``), ``gbo_rmsprop`` (``decay``, ``eps``) or
      ``gbo_adam`` (``b1``, ``b2``, ``eps``).

  Returns:
    The ``GlobalBiasedOptimizer``.

  Raises:
    ValueError: an unknown kind, or a hyper-parameter the kind does not take.

  Examples:
    >>> from fedjax_gel import optim
    >>> optim.gbo('adam', 1e-3, b1=0.9).kind
    'adam'
  """
  if kind not in _FACTORIES:
    raise ValueError(f'unknown FedGBO optimiser {kind!r}; known: {", ".join(KINDS)}')
  factory, allowed = _FACTORIES[kind]
  unknown = sorted(set(hparams) - set(allowed))
  if unknown:
    raise ValueError(f'FedGBO {kind} takes {", ".join(allowed)}; got {", ".join(unknown)}')
  return factory(learning_rate, **hparams)
