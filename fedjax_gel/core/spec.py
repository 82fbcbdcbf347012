"""Algorithms declared by spec: a name, a hyper-parameter record, a builder and properties.

An ``AlgorithmSpec`` is what an experiment needs to know about an algorithm before it builds
one: its hyper-parameters (a frozen dataclass whose fields carry their default, help text and
check, ``hparam``), how to build the ``FederatedAlgorithm`` from them and from the experiment's
``Setting`` (model, loss, client learning rate, server optimiser, population), and properties
the experiment plans with (per-client state, a pre-pass over the clients' data such as Mime's,
guessed steps, a fixed server optimiser). ``fedjax_gel.algorithms.registry`` collects the specs; the command line's flags,
their validation and the README's algorithm table are generated from it.

The same ``hparam`` fields describe the experiment's own configuration sections
(``fedjax_gel.experiment.config``), so that every value is checked in one way.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from fedjax_gel.core.algorithm import FederatedAlgorithm

Check = Callable[[str, Any], Optional[str]]   # (flag, value) -> the problem, or None


def hparam(default, help_text: str, check: Check | None = None, *, flag: str | None = None,
           static: bool = False):
  """A field of a hyper-parameter record: its default, its flag's help, an optional ``check``
  (``at_least``, ``positive``, ``int_range``, ``within``, ``one_of``, ...), the flag's name when
  it is not the field's, and for a float whether the builder needs it as a Python number
  (``static``: runs that differ in it cannot share one program; the others may be traced
  values)."""
  return dataclasses.field(default=default, metadata={'help': help_text, 'check': check,
                                                      'flag': flag, 'static': static})


def flag_name(field: dataclasses.Field) -> str:
  return field.metadata.get('flag') or field.name


def problems(record, checks: bool = True) -> list[str]:
  """Every problem of ``record``'s fields (one line each, naming the flag): a value not of its
  field's type, a float that is not finite, or (``checks``) a value its field's check refuses
  (``checks=False``: a record read back, whose names of registered datasets or models this
  process may not know)."""
  found = (field_problem(f, getattr(record, f.name), checks)
           for f in dataclasses.fields(record) if 'help' in f.metadata)
  return [p for p in found if p]


def field_problem(field: dataclasses.Field, value, checks: bool = True) -> str | None:
  """The problem of ``value`` for the hyper-parameter ``field`` (see ``problems``), or None."""
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
# What a field's declared type accepts (``make`` turns NumPy scalars into Python ones first).
TYPES = {'int': _INT, 'float': lambda v: _INT(v) or isinstance(v, float),
         'bool': lambda v: isinstance(v, bool), 'str': lambda v: isinstance(v, str),
         'Optional[str]': lambda v: v is None or isinstance(v, str),
         'tuple': lambda v: isinstance(v, tuple)}


# The largest int32: rounds, steps, cohorts, batches and examples are int32 on the device.
INT32_MAX = 2**31 - 1
# The largest float32: hyper-parameters are float32 on the device.
FLOAT32_MAX = 3.4028234663852886e38


def _number(x) -> str:
  return str(x) if isinstance(x, int) else f'{x:g}'


def int_range(low: int, high: int = INT32_MAX, note: str = '') -> Check:
  """An integer ``low <= value <= high`` (default ``high``: ``INT32_MAX``, for a value that
  becomes an int32 on the device); ``note`` is added to the message."""
  return lambda name, v: (None if low <= v <= high else
                          f'--{name} must be an integer in [{low}, {high}]{note} (got {v})')


def at_least(low, note: str = '') -> Check:
  """``value >= low``; ``note`` is added to the message (e.g. ``', 0 meaning automatic'``)."""
  return lambda name, v: None if v >= low else f'--{name} must be >= {low}{note} (got {v})'


def positive(name, value) -> str | None:
  """``value > 0`` (a float setting; a whole number given for it too: ``int_range(1)`` is the
  rule of integer settings)."""
  return None if value > 0 else f'--{name} must be positive (got {value})'


def within(low, high, *, open_low: bool = False, open_high: bool = False) -> Check:
  """``low <(=) value <(=) high``."""
  text = f'{"(" if open_low else "["}{_number(low)}, {_number(high)}{")" if open_high else "]"}'

  def check(name, v):
    ok = (v > low if open_low else v >= low) and (v < high if open_high else v <= high)
    return None if ok else f'--{name} must lie in {text} (got {v})'
  return check


def one_of(*known) -> Check:
  return lambda name, v: (None if v in known else
                          f'--{name}: unknown value {v!r}; known: {", ".join(known)}')


@dataclasses.dataclass(frozen=True)
class NoHparams:
  """The hyper-parameters of an algorithm that has none beyond the client learning rate."""


class Setting(NamedTuple):
  """What a builder gets from the experiment besides the algorithm's own hyper-parameters.

  ``client_lr``, ``client_momentum`` and the server optimiser's learning rate may be traced
  values when several runs train as one program (``core.runs``)."""
  model: Any                      # fedjax_gel.models.Model
  loss: Callable                  # loss(params, batch): the model's task loss (models.task_loss)
  client_lr: Any
  client_momentum: Any
  server: Any                     # optax.GradientTransformation applied to Delta
  counts: np.ndarray              # the training clients' example counts (the population)
  uniform_weights: bool = False   # clients weighted equally (not by their data)


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
  """One registered algorithm.

  Attributes:
    name: the ``--algorithm`` value.
    build: ``(hparams, Setting) -> FederatedAlgorithm``.
    hparams: the frozen dataclass of its hyper-parameters (fields made with ``hparam``; a
      field's name is its flag's, shared by every algorithm that reads it).
    client: what its clients do, in words (tables).
    server: what its server does, in words (tables).
    paper: the paper (authors, year, title) and where in it.
    momentum: its clients read ``Setting.client_momentum``.
    stateful: it keeps a row per client (``FederatedAlgorithm.store_row``).
    pre_pass: ``FederatedAlgorithm.pre_pass``.
    guesses: it takes guessed steps (``FederatedAlgorithm.client_guesses``).
    server_optimizer: the server optimiser it fixes (FedOpt), else None: the experiment's.
    own_server: its server step is its own (FedDyn, AdaBest, FedExP, the FedGBO family): it
      applies no server optimiser, so ``Setting.server`` and the ``--server_*`` flags are not
      read (the experiment layer refuses them unless another algorithm of the command reads
      them).
    base: with ``server_optimizer``, the algorithm it is with that server optimiser; the
      experiment layer refuses ``base`` with ``server_optimizer`` in its favour (one name per
      run: ``fedyogi``, not ``fedavg`` with ``--server_optimizer=fedyogi``).
    check: ``(hparams, model name) -> problem or None`` for checks across fields.
    run_name: ``hparams -> name`` of its runs, when it differs from ``name``.
  """
  name: str
  build: Callable[[Any, Setting], FederatedAlgorithm]
  hparams: type = NoHparams
  client: str = 'SGD'
  server: str = '`--server_optimizer` on `Delta`'
  paper: str = ''
  momentum: bool = False
  stateful: bool = False
  pre_pass: str = 'none'
  guesses: bool = False
  server_optimizer: str | None = None
  own_server: bool = False
  base: str = ''
  check: Callable[[Any, str], Optional[str]] | None = None
  run_name: Callable[[Any], str] | None = None

  def problems(self, hparams, model: str) -> list[str]:
    """What is wrong with ``hparams`` for this algorithm (with ``model``), one line each."""
    found = problems(hparams)
    if not found and self.check is not None:
      found += [p for p in [self.check(hparams, model)] if p]
    return found

  def name_of_run(self, hparams) -> str:
    return self.name if self.run_name is None else self.run_name(hparams)
