"""An optimiser's hyper-parameters as its constructor receives them: a number, a schedule
(``optax.Schedule``: a function of the step count) or a traced value (``inject_hyperparams``
inside ``jit``). ``check_hyperparameter`` refuses a known bad one in one line at construction,
instead of a NaN many steps later; ``value_at`` is its value at a step count.
"""
from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
import numpy as np


def concrete_values(value) -> np.ndarray | None:
  """``value``'s numbers as a NumPy array when they are known (a Python number, a NumPy array
  or scalar, a concrete JAX array); None for traced values (e.g. under ``inject_hyperparams``
  inside ``jit``), schedules and anything else."""
  concrete = isinstance(value, (numbers.Number, np.ndarray, np.generic)) or (
      isinstance(value, jax.Array) and not isinstance(value, jax.core.Tracer))
  return np.asarray(value) if concrete else None


def concrete_scalar(value) -> float | None:
  """``value`` as a float when it is one known number (``concrete_values`` of one element, a
  shape ``()`` or ``(1,)`` array included); None otherwise."""
  known = concrete_values(value)
  return float(known.reshape(())) if known is not None and known.size == 1 else None


def check_hyperparameter(name: str, value, ok, need: str) -> None:
  """Raises ``ValueError`` when a known ``value`` (``concrete_values``) fails ``ok``,
  ``TypeError`` when it is neither one number (a scalar, or an array of one element), a
  schedule (callable) nor a traced value (e.g. a string, a list, ``None``, a bool, an array of
  several numbers: it would have been applied element by element to the parameters it
  broadcasts against)."""
  if callable(value) or isinstance(value, jax.core.Tracer):
    return
  known = concrete_values(value)
  if known is None or not (jnp.issubdtype(known.dtype, jnp.floating) or
                           jnp.issubdtype(known.dtype, jnp.integer)):
    raise TypeError(f'{name} must be a number, got {value!r}')
  if known.size != 1:
    raise TypeError(f'{name} must be one number, got an array of shape {known.shape}')
  if not all(ok(float(x)) for x in known.reshape(-1)):
    raise ValueError(f'{name} must be {need}, got {value}')


def value_at(value, count):
  """The hyper-parameter ``value`` at the step ``count``: a schedule's ``value(count)``, else
  ``value`` itself."""
  return value(count) if callable(value) else value
