"""The registry of algorithms: every ``AlgorithmSpec`` the experiment layer can run by name.

Adding an algorithm is one module that defines its builder and its ``AlgorithmSpec`` (see
``fedjax_gel.spec.algorithm``), plus one entry in ``BUILTIN`` below; code outside the package
calls ``register(spec)`` before it builds a configuration. The command line's ``--algorithm``
values, its hyper-parameter flags (one per field name, shared by the algorithms that read it),
their checks and the user guide's algorithm table all come from here.
"""
from __future__ import annotations

import dataclasses

from fedjax_gel.algorithms.drift import ADABEST, FEDDYN, SCAFFOLD
from fedjax_gel.algorithms.fedavg import (DP_FEDAVG, FEDADAGRAD, FEDADAM, FEDAVG, FEDAVGCM,
                                         FEDYOGI)
from fedjax_gel.algorithms.fedexp import FEDEXP
from fedjax_gel.algorithms.fedmax import FEDMAX
from fedjax_gel.algorithms.fednova import FEDNOVA, FEDNOVA_GEL
from fedjax_gel.algorithms.fedprox import FEDPROX, FEDPROX_GEL
from fedjax_gel.algorithms.fedvarp import CLUSTER_FEDVARP, FEDVARP
from fedjax_gel.algorithms.gbo import FEDGBO, MFL, MIMELITE, MIMEXLITE
from fedjax_gel.algorithms.gel import FEDAVG_GEL, FEDYOGI_GEL, GEL
from fedjax_gel.spec import AlgorithmSpec, Registry, flag_name

BUILTIN = (FEDAVG, FEDAVGCM, GEL, FEDAVG_GEL, FEDPROX, FEDPROX_GEL, FEDNOVA, FEDNOVA_GEL, FEDADAM,
           FEDYOGI, FEDADAGRAD, FEDYOGI_GEL, FEDGBO, MFL, MIMELITE, MIMEXLITE, FEDMAX, FEDEXP,
           SCAFFOLD, FEDDYN, ADABEST, FEDVARP, CLUSTER_FEDVARP, DP_FEDAVG)

ALGORITHMS: Registry[AlgorithmSpec] = Registry('algorithm')


def register(spec: AlgorithmSpec) -> AlgorithmSpec:
  """Adds ``spec`` (returned, so that it can decorate an assignment).

  Raises ``ValueError`` when its name is not an identifier (it is a value of ``--algorithm``,
  whose commas separate names, and a run's folder name), when it is taken by another spec, when
  ``build`` is not callable, when ``hparams`` is no frozen dataclass of ``hparam`` fields (a
  plain field's value never reached the runs), or when one of its hyper-parameters shares a name
  with another algorithm's but not its type, default or help (a name is one flag). A
  hyper-parameter named as a flag of the experiment's sections is refused when a config of the
  algorithm is made (``experiment.config.make``)."""
  return ALGORITHMS.register(spec, _check)


def _check(spec: AlgorithmSpec):
  if not callable(spec.build):
    raise ValueError(f'register({spec.name!r}): build must be a function (hparams, Setting) -> '
                     f'FederatedAlgorithm, got {spec.build!r}')
  unknown = [v for v in spec.variants
             if v not in {flag_name(f) for f in dataclasses.fields(spec.hparams)}]
  if unknown:
    raise ValueError(f'register({spec.name!r}): variants names {unknown[0]!r}, none of its '
                     'hyper-parameters')


def unregister(name: str):
  """Removes a spec (tests that register a toy algorithm clean up with it)."""
  ALGORITHMS.unregister(name)


def get(name: str) -> AlgorithmSpec:
  """The spec of ``name``; ``KeyError`` for an unknown one."""
  return ALGORITHMS.get(name)


def names() -> tuple[str, ...]:
  return ALGORITHMS.names()


def specs() -> tuple[AlgorithmSpec, ...]:
  return ALGORITHMS.specs()


def hparam_fields() -> dict[str, dataclasses.Field]:
  """Every registered hyper-parameter by flag name (the first spec's field of each name)."""
  return ALGORITHMS.hparam_fields()


def variant_flags() -> tuple[str, ...]:
  """The hyper-parameters some algorithm takes several values of (``AlgorithmSpec.variants``):
  comma-separated lists on the command line."""
  return tuple(dict.fromkeys(v for s in specs() for v in s.variants))


def paired_with(name: str) -> str:
  """The algorithm ``name``'s runs are compared with (``AlgorithmSpec.paired_with``); '' for
  none or an algorithm this process does not know."""
  return get(name).paired_with if name in ALGORITHMS else ''


def markdown_table() -> str:
  """The user guide's table of algorithms (docs/user-guide.md): name, clients, server,
  hyper-parameters, paper."""
  rows = ['| `--algorithm` | clients | server | hyper-parameters (default) | paper |',
          '|---|---|---|---|---|']
  for spec in specs():
    hparams = ', '.join(f'`--{flag_name(f)}` ({f.default})'
                        for f in dataclasses.fields(spec.hparams))
    rows.append(f'| `{spec.name}` | {spec.client} | {spec.server} | {hparams or "-"} | '
                f'{spec.paper} |')
  return '\n'.join(rows)


for _spec in BUILTIN:
  register(_spec)
