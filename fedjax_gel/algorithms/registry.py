"""The registry of algorithms: every ``AlgorithmSpec`` the experiment layer can run by name.

Adding an algorithm is one module that defines its builder and its ``AlgorithmSpec`` (see
``fedjax_gel.core.spec``), plus one entry in ``BUILTIN`` below; code outside the package calls
``register(spec)`` before it builds a configuration. The command line's ``--algorithm`` values,
its hyper-parameter flags (one per field name, shared by the algorithms that read it), their
checks and the README's algorithm table all come from here.
"""
from __future__ import annotations

import dataclasses

from fedjax_gel.algorithms.drift import ADABEST, FEDDYN, SCAFFOLD
from fedjax_gel.algorithms.fedavg import FEDADAGRAD, FEDADAM, FEDAVG, FEDAVGCM, FEDYOGI
from fedjax_gel.algorithms.fedexp import FEDEXP
from fedjax_gel.algorithms.fedmax import FEDMAX
from fedjax_gel.algorithms.fednova import FEDNOVA, FEDNOVA_GEL
from fedjax_gel.algorithms.fedprox import FEDPROX, FEDPROX_GEL
from fedjax_gel.algorithms.fedvarp import CLUSTER_FEDVARP, FEDVARP
from fedjax_gel.algorithms.gbo import FEDGBO, MFL, MIMELITE, MIMEXLITE
from fedjax_gel.algorithms.gel import FEDAVG_GEL, FEDYOGI_GEL, GEL
from fedjax_gel.core.spec import AlgorithmSpec, flag_name

BUILTIN = (FEDAVG, FEDAVGCM, GEL, FEDAVG_GEL, FEDPROX, FEDPROX_GEL, FEDNOVA, FEDNOVA_GEL, FEDADAM,
           FEDYOGI, FEDADAGRAD, FEDYOGI_GEL, FEDGBO, MFL, MIMELITE, MIMEXLITE, FEDMAX, FEDEXP,
           SCAFFOLD, FEDDYN, ADABEST, FEDVARP, CLUSTER_FEDVARP)

_SPECS: dict[str, AlgorithmSpec] = {}


def register(spec: AlgorithmSpec) -> AlgorithmSpec:
  """Adds ``spec`` (returned, so that it can decorate an assignment).

  Raises ``ValueError`` when its name is not an identifier (it is a value of ``--algorithm``,
  whose commas separate names, and a run's folder name), when it is taken by another spec, or
  when one of its
  hyper-parameters shares a name with another algorithm's but not its type, default or help
  (a name is one flag). A hyper-parameter named as a flag of the experiment's sections is
  refused when a config of the algorithm is made (``experiment.config.make``)."""
  if not isinstance(spec.name, str) or not spec.name.isidentifier():
    raise ValueError(f'register: an algorithm\'s name must be an identifier (a value of '
                     f'--algorithm and a folder name), got {spec.name!r}')
  if _SPECS.get(spec.name, spec) is not spec:
    raise ValueError(f'an algorithm named {spec.name!r} is registered already (a notebook cell '
                     f'run again: registry.unregister({spec.name!r}) first)')
  check_spec(spec)
  known = hparam_fields()
  for field in dataclasses.fields(spec.hparams):
    other = known.get(flag_name(field))
    if other is not None and (other.type, other.default, other.metadata['help']) != (
        field.type, field.default, field.metadata['help']):
      raise ValueError(f'{spec.name}: hyper-parameter {field.name!r} differs from the one of '
                       'the same name another algorithm registered')
  _SPECS[spec.name] = spec
  return spec


def check_spec(spec: AlgorithmSpec):
  """The parts of ``spec`` that ``register`` can check before a run uses them: ``build``
  callable, ``hparams`` a frozen dataclass (the class) whose every field is made with
  ``core.spec.hparam`` (a plain field's value never reached the runs: they were built from its
  default); else a ValueError naming the algorithm."""
  where = f'register({spec.name!r})'
  if not callable(spec.build):
    raise ValueError(f'{where}: build must be a function (hparams, Setting) -> '
                     f'FederatedAlgorithm, got {spec.build!r}')
  h = spec.hparams
  if not (isinstance(h, type) and dataclasses.is_dataclass(h)):
    raise ValueError(f'{where}: hparams must be a frozen dataclass (the class itself), got {h!r}')
  if not h.__dataclass_params__.frozen:
    raise ValueError(f'{where}: hparams {h.__name__} must be frozen '
                     '(@dataclasses.dataclass(frozen=True))')
  for field in dataclasses.fields(h):
    if 'help' not in field.metadata:
      raise ValueError(f'{where}: hyper-parameter {field.name!r} of {h.__name__} is a plain '
                       'field; make it with core.spec.hparam(default, help, check)')


def unregister(name: str):
  """Removes a spec (tests that register a toy algorithm clean up with it)."""
  _SPECS.pop(name, None)


def get(name: str) -> AlgorithmSpec:
  """The spec of ``name``; ``KeyError`` for an unknown one."""
  return _SPECS[name]


def names() -> tuple[str, ...]:
  return tuple(_SPECS)


def specs() -> tuple[AlgorithmSpec, ...]:
  return tuple(_SPECS.values())


def hparam_fields() -> dict[str, dataclasses.Field]:
  """Every registered hyper-parameter by flag name (the first spec's field of each name)."""
  fields = {}
  for spec in _SPECS.values():
    for field in dataclasses.fields(spec.hparams):
      fields.setdefault(flag_name(field), field)
  return fields


def markdown_table() -> str:
  """The README's table of algorithms: name, clients, server, hyper-parameters, paper."""
  rows = ['| `--algorithm` | clients | server | hyper-parameters (default) | paper |',
          '|---|---|---|---|---|']
  for spec in _SPECS.values():
    hparams = ', '.join(f'`--{flag_name(f)}` ({f.default})'
                        for f in dataclasses.fields(spec.hparams))
    rows.append(f'| `{spec.name}` | {spec.client} | {spec.server} | {hparams or "-"} | '
                f'{spec.paper} |')
  return '\n'.join(rows)


for _spec in BUILTIN:
  register(_spec)
