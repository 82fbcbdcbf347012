"""A registry of specs by name: the algorithms', the datasets' and the models' each one.

A spec is a frozen dataclass with a ``name`` and, for algorithms and datasets, an ``hparams``
record (``fedjax_gel.spec.hparams``) whose fields are flags shared by name: two specs may hold
a field of one name only when it is the same flag (type, default and help).
"""
from __future__ import annotations

import dataclasses
from typing import Generic, TypeVar

from fedjax_gel.spec.hparams import check_record_class, flag_name

S = TypeVar('S')


class Registry(Generic[S]):
  """The specs of one kind by name, in the order they were registered.

  Args:
    kind: ``'algorithm'``, ``'dataset'`` or ``'model'``, the flag their names are values of.
  """

  def __init__(self, kind: str):
    self.kind = kind
    self._specs: dict[str, S] = {}
    self.builtin: tuple[str, ...] = ()

  def register(self, spec: S, check=None) -> S:
    """Adds a spec.

    Args:
      spec: the spec.
      check: ``spec -> None``, raising for the kind's own rules, before it is added.

    Returns:
      ``spec`` itself, so that ``register`` can wrap an assignment.

    Raises:
      ValueError: its name is not an identifier (it is a flag's value, which commas separate,
        and a folder's name); another spec holds it; its ``hparams`` is no frozen dataclass of
        ``hparam`` fields; or one of those shares a flag's name with another spec's field but
        not its type, default or help (a name is one flag).
    """
    name, kind = spec.name, self.kind
    if not isinstance(name, str) or not name.isidentifier():
      article = 'an' if kind[0] in 'aeiou' else 'a'
      raise ValueError(f'register: {article} {kind}\'s name must be an identifier (a value of '
                       f'--{kind} and a folder name), got {name!r}')
    if self._specs.get(name, spec) is not spec:
      raise ValueError(f'a {kind} named {name!r} is registered already (a notebook cell run '
                       f'again: unregister({name!r}) first)')
    record = getattr(spec, 'hparams', None)
    if record is not None:
      check_record_class(f'register({name!r})', record)
      known = self.hparam_fields()
      for field in dataclasses.fields(record):
        other = known.get(flag_name(field))
        if other is not None and (other.type, other.default, other.metadata['help']) != (
            field.type, field.default, field.metadata['help']):
          raise ValueError(f'{name}: hyper-parameter {field.name!r} differs from the one of '
                           f'the same name another {kind} registered')
    if check is not None:
      check(spec)
    self._specs[name] = spec
    return spec

  def unregister(self, name: str):
    """Removes a spec (tests that register a toy one clean up with it)."""
    self._specs.pop(name, None)

  def get(self, name: str) -> S:
    """The spec of ``name``; ``KeyError`` for an unknown one."""
    return self._specs[name]

  def __contains__(self, name) -> bool:
    return name in self._specs

  def names(self) -> tuple[str, ...]:
    return tuple(self._specs)

  def specs(self) -> tuple[S, ...]:
    return tuple(self._specs.values())

  def hparam_fields(self) -> dict[str, dataclasses.Field]:
    """Every registered hyper-parameter by flag name (the first spec's field of each name)."""
    fields = {}
    for spec in self._specs.values():
      for field in _fields(spec):
        fields.setdefault(flag_name(field), field)
    return fields

  def readers(self, flag: str) -> tuple[str, ...]:
    """The specs whose hyper-parameters hold ``flag``."""
    return tuple(s.name for s in self._specs.values()
                 if flag in {flag_name(f) for f in _fields(s)})

  def add_builtin(self, specs):
    """Registers the built-in ``specs`` (``builtin``: their names)."""
    for spec in specs:
      self.register(spec)
    self.builtin += tuple(s.name for s in specs)


def _fields(spec) -> tuple[dataclasses.Field, ...]:
  record = getattr(spec, 'hparams', None)
  return dataclasses.fields(record) if record is not None else ()
