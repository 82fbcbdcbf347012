"""Checks of the counts users hand the library's constructors (``CohortSpec``, ``build_round``,
the per-client stores, ``get_model``): a ValueError of one line naming the constructor and the
argument, instead of a count truncated (``int(2.5)``) or an error deep inside JAX."""
from __future__ import annotations

import operator
from typing import Sequence

import numpy as np

INT32_MAX = 2**31 - 1
"""The largest int32: rounds, steps, cohorts, batches and examples are int32 on the device."""


def is_whole(value) -> bool:
  """Whether ``value`` is one whole number: an int, a NumPy or JAX integer scalar, or an
  integral float (of any kind); not a bool, a string or an array of several values."""
  if (isinstance(value, (bool, np.bool_, str, bytes)) or np.ndim(value) != 0 or
      getattr(value, 'dtype', None) == np.bool_):
    return False
  try:
    operator.index(value)   # int, NumPy and JAX integers
    return True
  except TypeError:
    pass
  try:
    return float(value).is_integer()
  except (TypeError, ValueError):
    return False


def is_listed(value) -> bool:
  """Whether ``value`` is a list, a tuple or an array (not a string, which is a sequence too)."""
  return isinstance(value, (Sequence, np.ndarray)) and not isinstance(value, (str, bytes))


def whole_at_least(where: str, name: str, value, low: int) -> int:
  """``value`` as an int when it is a whole number of at least ``low``, else a ValueError
  naming ``where`` and ``name``."""
  if not is_whole(value) or not int(value) >= low:
    need = {0: 'a non-negative integer', 1: 'a positive integer'}.get(low, f'an integer >= {low}')
    raise ValueError(f'{where}: {name} must be {need}, got {value!r}')
  return int(value)


def positive_int(where: str, name: str, value) -> int:
  """``whole_at_least(where, name, value, 1)``."""
  return whole_at_least(where, name, value, 1)
