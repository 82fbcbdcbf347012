"""FedOpt server optimisers: FedAdagrad, FedYogi, FedAdam (Reddi et al. 2021, Algorithm 2).

Reddi, Charles, Zaheer, Garrett, Rush, Konecny, Kumar, McMahan, "Adaptive Federated
Optimization", ICLR 2021. The server receives ``g = Delta = sum_i p_i (x - y_i)``, i.e. minus
Reddi's ``Delta_t``, and applies these transformations to it as if it were a gradient. Per
leaf, elementwise, with ``m_0 = 0`` and ``v_0 = initial_accumulator`` (default ``tau**2``, the
equality case of Algorithm 2's requirement ``v_{-1} >= tau^2``)::

  m_t = beta1 m_{t-1} + (1 - beta1) g
  v_t = v_{t-1} + g^2                                       (FedAdagrad)
  v_t = v_{t-1} - (1 - beta2) g^2 sign(v_{t-1} - g^2)       (FedYogi)
  v_t = beta2 v_{t-1} + (1 - beta2) g^2                     (FedAdam)
  updates = -lr m_t / (sqrt(v_t) + tau)

so ``x_{t+1} = x_t + lr m_t^Reddi / (sqrt(v_t) + tau)``. There is no bias correction; ``tau`` is
Reddi's degree of adaptivity. The arguments are named as in optax: ``b1`` and ``b2`` are Reddi's
``beta_1`` and ``beta_2``, ``eps`` is his ``tau``. Concrete values outside ``lr >= 0``,
``b1`` in ``[0, 1)``, ``b2`` in ``[0, 1]``, ``eps > 0`` and ``initial_accumulator >= 0`` are a
ValueError. ``learning_rate`` may be a float or an optax
schedule, evaluated at the number of updates applied so far (0 on the first call).

How these differ from the optax optimisers of the same name (optax 0.2.8):

* ``optax.adam(lr, b1, b2, eps)``: ``v_0 = 0`` and bias-corrected moments
  ``m_t / (1 - b1^t)``, ``v_t / (1 - b2^t)``; ``eps`` (default 1e-8) is outside the sqrt, plus
  ``eps_root`` (default 0) inside. With ``eps = tau`` the first step is therefore about
  ``lr sign(g)``, while ``fedadam``'s is ``lr (1 - beta1) g / (sqrt(v_1) + tau)``.
* ``optax.yogi(lr, b1=0.9, b2=0.999, eps=1e-3)``: both ``m`` and ``v`` start at
  ``initial_accumulator_value = 1e-6`` (a ``scale_by_yogi`` argument, not exposed by ``yogi``),
  both are bias-corrected, and ``eps`` is outside the sqrt. Its ``v`` recursion is the one above.
* ``optax.adagrad(lr, initial_accumulator_value=0.1, eps=1e-7)``: no momentum (it scales ``g``
  itself), ``v_0 = 0.1``, and ``eps`` is inside the sqrt: ``g / sqrt(v_t + eps)``.
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_gel.optim.hyperparams import check_hyperparameter, value_at


class FedOptState(NamedTuple):
  """The state of ``fedadagrad``, ``fedyogi`` and ``fedadam``.

  Attributes:
    m: the first moment, a pytree like params.
    v: the second moment, a pytree like params.
    count: the number of updates applied (a learning-rate schedule's step).
  """
  m: Any
  v: Any
  count: jax.Array


def _fedopt(learning_rate: optax.ScalarOrSchedule, b1: float, eps: float,
            initial_accumulator: float | None,
            second_moment: Callable[[jax.Array, jax.Array], jax.Array]
            ) -> optax.GradientTransformationExtraArgs:
  """Shared body: ``second_moment(v_{t-1}, g) -> v_t`` selects the method."""
  check_hyperparameter('learning_rate', learning_rate, lambda x: 0 <= x < math.inf,
                       'finite and >= 0')
  check_hyperparameter('b1', b1, lambda b: 0 <= b < 1, 'in [0, 1)')
  check_hyperparameter('eps', eps, lambda e: 0 < e < math.inf,
                       "positive and finite (Reddi et al.'s tau)")
  if initial_accumulator is not None:
    check_hyperparameter('initial_accumulator', initial_accumulator, lambda v: 0 <= v < math.inf,
                         '>= 0 and finite')
  v0 = eps ** 2 if initial_accumulator is None else initial_accumulator

  def init_fn(params):
    return FedOptState(jax.tree.map(jnp.zeros_like, params),
                       jax.tree.map(lambda p: jnp.full_like(p, v0), params),
                       jnp.zeros([], jnp.int32))

  def update_fn(updates, state: FedOptState, params=None, **extra_args):
    del params, extra_args
    lr = value_at(learning_rate, state.count)
    m = jax.tree.map(lambda m, g: (b1 * m + (1 - b1) * g).astype(m.dtype), state.m, updates)
    v = jax.tree.map(lambda v, g: second_moment(v, g).astype(v.dtype), state.v, updates)
    out = jax.tree.map(lambda m, v: (-lr * m / (jnp.sqrt(v) + eps)).astype(m.dtype), m, v)
    return out, FedOptState(m, v, optax.safe_increment(state.count))

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def fedadagrad(learning_rate: optax.ScalarOrSchedule, b1: float = 0.9, eps: float = 1e-3,
               initial_accumulator: float | None = None) -> optax.GradientTransformationExtraArgs:
  """FedAdagrad, a FedOpt server optimiser (Reddi et al. 2021, Adaptive Federated Optimization).

  ``m_t = b1 m_{t-1} + (1 - b1) g``, ``v_t = v_{t-1} + g^2``, ``updates = -lr m_t /
  (sqrt(v_t) + eps)`` (no bias correction; see the module docstring for how it differs from
  ``optax.adagrad``).

  Args:
    learning_rate: ``lr`` >= 0, a float or an optax schedule evaluated at the number of updates
      applied so far (0 on the first call).
    b1: Reddi's ``beta_1``, the momentum of ``m``, in ``[0, 1)``.
    eps: Reddi's ``tau``, the degree of adaptivity (outside the sqrt), positive and finite.
    initial_accumulator: ``v_0``, >= 0 and finite; None: ``eps**2`` (the equality case of
      Algorithm 2's ``v_{-1} >= tau^2``).

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose state is a ``FedOptState``; its
    ``update`` takes the mean client update ``Delta`` as the gradient.

  Raises:
    ValueError: a concrete hyper-parameter outside its range.
    TypeError: a hyper-parameter that is no number.
  """
  return _fedopt(learning_rate, b1, eps, initial_accumulator, lambda v, g: v + g * g)


def fedyogi(learning_rate: optax.ScalarOrSchedule, b1: float = 0.9, b2: float = 0.99,
            eps: float = 1e-3, initial_accumulator: float | None = None
            ) -> optax.GradientTransformationExtraArgs:
  """FedYogi, a FedOpt server optimiser (Reddi et al. 2021, Adaptive Federated Optimization).

  ``m_t = b1 m_{t-1} + (1 - b1) g``, ``v_t = v_{t-1} - (1 - b2) g^2 sign(v_{t-1} - g^2)``,
  ``updates = -lr m_t / (sqrt(v_t) + eps)`` (no bias correction; see the module docstring for
  how it differs from ``optax.yogi``).

  Args:
    learning_rate: ``lr`` >= 0, a float or an optax schedule evaluated at the number of updates
      applied so far (0 on the first call).
    b1: Reddi's ``beta_1``, the momentum of ``m``, in ``[0, 1)``.
    b2: Reddi's ``beta_2``, in ``[0, 1]``.
    eps: Reddi's ``tau``, the degree of adaptivity (outside the sqrt), positive and finite.
    initial_accumulator: ``v_0``, >= 0 and finite; None: ``eps**2`` (the equality case of
      Algorithm 2's ``v_{-1} >= tau^2``).

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose state is a ``FedOptState``; its
    ``update`` takes the mean client update ``Delta`` as the gradient.

  Raises:
    ValueError: a concrete hyper-parameter outside its range.
    TypeError: a hyper-parameter that is no number.

  Examples:
    >>> import jax.numpy as jnp, optax
    >>> from fedjax_gel import optim
    >>> server = optim.fedyogi(learning_rate=0.1, b1=0.9, b2=0.99, eps=1e-3)
    >>> x, target = jnp.zeros(3), jnp.array([1., 2., 3.])
    >>> state = server.init(x)
    >>> updates, state = server.update(x - target, state, x)   # Delta = x - mean client model
    >>> x = optax.apply_updates(x, updates)
  """
  check_hyperparameter('b2', b2, lambda b: 0 <= b <= 1, 'in [0, 1]')

  def second_moment(v, g):
    g2 = g * g
    return v - (1 - b2) * g2 * jnp.sign(v - g2)
  return _fedopt(learning_rate, b1, eps, initial_accumulator, second_moment)


def fedadam(learning_rate: optax.ScalarOrSchedule, b1: float = 0.9, b2: float = 0.99,
            eps: float = 1e-3, initial_accumulator: float | None = None
            ) -> optax.GradientTransformationExtraArgs:
  """FedAdam, a FedOpt server optimiser (Reddi et al. 2021, Adaptive Federated Optimization).

  ``m_t = b1 m_{t-1} + (1 - b1) g``, ``v_t = b2 v_{t-1} + (1 - b2) g^2``, ``updates = -lr m_t /
  (sqrt(v_t) + eps)`` (no bias correction; see the module docstring for how it differs from
  ``optax.adam``).

  Args:
    learning_rate: ``lr`` >= 0, a float or an optax schedule evaluated at the number of updates
      applied so far (0 on the first call).
    b1: Reddi's ``beta_1``, the momentum of ``m``, in ``[0, 1)``.
    b2: Reddi's ``beta_2``, in ``[0, 1]``.
    eps: Reddi's ``tau``, the degree of adaptivity (outside the sqrt), positive and finite.
    initial_accumulator: ``v_0``, >= 0 and finite; None: ``eps**2`` (the equality case of
      Algorithm 2's ``v_{-1} >= tau^2``).

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose state is a ``FedOptState``; its
    ``update`` takes the mean client update ``Delta`` as the gradient.

  Raises:
    ValueError: a concrete hyper-parameter outside its range.
    TypeError: a hyper-parameter that is no number.

  Examples:
    >>> import optax
    >>> import fedjax_gel as fg
    >>> model = fg.get_model('logistic', (60,), 5)
    >>> alg = fg.fedavg(fg.cross_entropy_loss(model), optax.sgd(0.01),
    ...                 server_optimizer=fg.optim.fedadam(learning_rate=0.01))
  """
  check_hyperparameter('b2', b2, lambda b: 0 <= b <= 1, 'in [0, 1]')
  return _fedopt(learning_rate, b1, eps, initial_accumulator,
                 lambda v, g: b2 * v + (1 - b2) * g * g)
