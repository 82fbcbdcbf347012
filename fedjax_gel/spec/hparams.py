"""Hyper-parameter records: frozen dataclasses of ``hparam`` fields, and the fields' checks.

Each field carries its default, its flag's help text and a check (``hparam``). Every record the
experiment reads from flags is made of such fields: the experiment's own configuration sections
(``fedjax_gel.experiment.config``), and the hyper-parameters of each algorithm, dataset and model
spec (``fedjax_gel.spec``). A field is one flag of ``launch/run.py``, shared by the records that
hold a field of its name; its check and its type are applied in one way wherever it is given.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional

import numpy as np

from fedjax_gel.core.checks import INT32_MAX

Check = Callable[[str, Any], Optional[str]]
"""A field's check: ``(flag, value) -> the problem`` (one line naming ``--flag``), or None."""


def hparam(default, help_text: str, check: Check | None = None, *, flag: str | None = None,
           static: bool = False):
  """Declares a field of a hyper-parameter record: one flag of ``launch/run.py``.

  Args:
    default: the field's default value.
    help_text: the flag's help.
    check: the value's check (``at_least``, ``positive``, ``int_range``, ``within``,
      ``one_of``, ...); None: its type only.
    flag: the flag's name when it is not the field's.
    static: for a float, the builder needs it as a Python number: runs that differ in it
      cannot share one program (the others may be traced values).

  Returns:
    A ``dataclasses.field`` carrying them in its metadata.

  Examples:
    >>> import dataclasses
    >>> from fedjax_gel import spec
    >>> @dataclasses.dataclass(frozen=True)
    ... class DampedHparams:
    ...   damping: float = spec.hparam(0.5, 'The server moves by this fraction of Delta.',
    ...                                spec.within(0, 1))
    >>> spec.problems(DampedHparams(damping=2.))
    ['--damping must lie in [0, 1] (got 2.0)']
  """
  return dataclasses.field(default=default, metadata={'help': help_text, 'check': check,
                                                      'flag': flag, 'static': static})


def flag_name(field: dataclasses.Field) -> str:
  """The flag's name of a hyper-parameter field: ``hparam``'s ``flag``, else the field's name.

  Args:
    field: a field made with ``hparam``.

  Returns:
    The name, without ``--``.
  """
  return field.metadata.get('flag') or field.name


def problems(record, checks: bool = True) -> list[str]:
  """Lists every problem of a hyper-parameter record's fields, one line each naming the flag.

  A value not of its field's type, a float that is not finite or beyond float32's range, or
  (``checks``) a value its field's check refuses.

  Args:
    record: an instance of a record of ``hparam`` fields.
    checks: apply the fields' own checks; False: types only (a record read back, whose names
      of registered datasets or models this process may not know).

  Returns:
    The problems (empty: none).
  """
  found = (field_problem(f, getattr(record, f.name), checks)
           for f in dataclasses.fields(record) if 'help' in f.metadata)
  return [p for p in found if p]


def field_problem(field: dataclasses.Field, value, checks: bool = True) -> str | None:
  """The problem of one value for a hyper-parameter field (see ``problems``), or None.

  Args:
    field: a field made with ``hparam``.
    value: the value.
    checks: apply the field's own check.

  Returns:
    One line naming the flag, or None.
  """
  name = flag_name(field)
  expected = field.type if isinstance(field.type, str) else field.type.__name__
  if not TYPES.get(expected, lambda v: True)(value):
    return f'--{name}: {value!r} is not of type {expected}'
  if isinstance(value, float) and not math.isfinite(value):
    return f'--{name} must be a finite number (got {value})'
  if isinstance(value, float) and abs(value) > FLOAT32_MAX:
    return (f'--{name} must lie within float32\'s range, +-3.4e38 (got {value:g}): the device '
            'computes in float32, where it would be infinite')
  if isinstance(value, float) and 0 < abs(value) < np.finfo(np.float32).tiny:
    return (f'--{name} is 0 in float32, which the device computes in (got {value:g}): below '
            "float32's smallest normal number, about 1.2e-38, XLA flushes it to 0")
  if checks and field.metadata.get('check') is not None:
    try:
      return field.metadata['check'](name, value)
    except (TypeError, ValueError):   # e.g. a string where a number belongs (from Python)
      return f'--{name}: {value!r} is not of type {field.type}'
  return None


_INT = lambda v: isinstance(v, int) and not isinstance(v, bool)
TYPES = {'int': _INT, 'float': lambda v: _INT(v) or isinstance(v, float),
         'bool': lambda v: isinstance(v, bool), 'str': lambda v: isinstance(v, str),
         'Optional[str]': lambda v: v is None or isinstance(v, str),
         'tuple': lambda v: isinstance(v, tuple)}
"""What a field's declared type accepts, by the type's name (``value -> bool``).

``experiment.make`` turns NumPy scalars into Python ones first; an ``int`` is a ``float``'s
value too, a bool no number.
"""


FLOAT32_MAX = 3.4028234663852886e38
"""The largest float32: hyper-parameters are float32 on the device."""


def _number(x) -> str:
  return str(x) if isinstance(x, int) else f'{x:g}'


def int_range(low: int, high: int = INT32_MAX, note: str = '') -> Check:
  """A check: an integer ``low <= value <= high``.

  Args:
    low: the smallest value.
    high: the largest (default ``INT32_MAX``, for a value that becomes an int32 on the device).
    note: added to the message.

  Returns:
    The ``Check``.
  """
  return lambda name, v: (None if low <= v <= high else
                          f'--{name} must be an integer in [{low}, {high}]{note} (got {v})')


def at_least(low, note: str = '') -> Check:
  """A check: ``value >= low``.

  Args:
    low: the smallest value.
    note: added to the message (e.g. ``', 0 meaning automatic'``).

  Returns:
    The ``Check``.
  """
  return lambda name, v: None if v >= low else f'--{name} must be >= {low}{note} (got {v})'


def positive(name, value) -> str | None:
  """A check: ``value > 0``, for a float setting (a whole number given for it too).

  ``int_range(1)`` is the rule of integer settings.

  Args:
    name: the flag's name.
    value: the value.

  Returns:
    The problem, or None.
  """
  return None if value > 0 else f'--{name} must be positive (got {value})'


def within(low, high, *, open_low: bool = False, open_high: bool = False) -> Check:
  """A check: ``low <(=) value <(=) high``.

  Args:
    low: the lower bound.
    high: the upper bound.
    open_low: exclude ``low``.
    open_high: exclude ``high``.

  Returns:
    The ``Check``.
  """
  text = f'{"(" if open_low else "["}{_number(low)}, {_number(high)}{")" if open_high else "]"}'

  def check(name, v):
    ok = (v > low if open_low else v >= low) and (v < high if open_high else v <= high)
    return None if ok else f'--{name} must lie in {text} (got {v})'
  return check


def one_of(*known) -> Check:
  """A check: a value among ``known``.

  Args:
    *known: the values allowed.

  Returns:
    The ``Check``.
  """
  return lambda name, v: (None if v in known else
                          f'--{name}: unknown value {v!r}; known: {", ".join(known)}')


@dataclasses.dataclass(frozen=True)
class NoHparams:
  """The hyper-parameters of a spec that has none of its own."""


def check_record_class(where: str, record: type):
  """Checks that a class is a record of hyper-parameters, as the registries require.

  A frozen dataclass (the class) whose every field is made with ``hparam`` (a plain field's
  value never reached the runs: they were built from its default).

  Args:
    where: the start of the error's message.
    record: the class.

  Raises:
    ValueError: not a frozen dataclass, or a plain field.
  """
  if not (isinstance(record, type) and dataclasses.is_dataclass(record)):
    raise ValueError(f'{where}: hparams must be a frozen dataclass (the class itself), got '
                     f'{record!r}')
  if not record.__dataclass_params__.frozen:
    raise ValueError(f'{where}: hparams {record.__name__} must be frozen '
                     '(@dataclasses.dataclass(frozen=True))')
  for field in dataclasses.fields(record):
    if 'help' not in field.metadata:
      raise ValueError(f'{where}: hyper-parameter {field.name!r} of {record.__name__} is a '
                       'plain field; make it with fedjax_gel.spec.hparam(default, help, check)')
