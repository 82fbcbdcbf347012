"""Checks of the counts users hand the library's constructors (``CohortSpec``, ``build_round``,
the per-client stores, ``get_model``): a ValueError of one line naming the constructor and the
argument, instead of a count truncated (``int(2.5)``) or an error deep inside JAX."""
from __future__ import annotations

import numpy as np


def is_whole(value) -> bool:
  """Whether ``value`` is a whole number: an int, a NumPy or JAX integer, or an integral float;
  not a bool or a string."""
  if isinstance(value, (bool, np.bool_, str)):
    return False
  if hasattr(value, '__index__'):   # int, NumPy and JAX integers
    return True
  return isinstance(value, (float, np.floating)) and float(value).is_integer()


def positive_int(where: str, name: str, value) -> int:
  """``value`` as an int when it is a whole number of at least 1, else a ValueError naming
  ``where`` and ``name``."""
  if not is_whole(value) or not int(value) >= 1:
    raise ValueError(f'{where}: {name} must be a positive integer, got {value!r}')
  return int(value)
