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

__all__ = ['ALGORITHMS', 'BUILTIN', 'get', 'hparam_fields', 'markdown_table', 'names',
           'paired_with', 'register', 'specs', 'unregister', 'variant_flags']

BUILTIN = (FEDAVG, FEDAVGCM, GEL, FEDAVG_GEL, FEDPROX, FEDPROX_GEL, FEDNOVA, FEDNOVA_GEL, FEDADAM,
           FEDYOGI, FEDADAGRAD, FEDYOGI_GEL, FEDGBO, MFL, MIMELITE, MIMEXLITE, FEDMAX, FEDEXP,
           SCAFFOLD, FEDDYN, ADABEST, FEDVARP, CLUSTER_FEDVARP, DP_FEDAVG)
"""The built-in algorithms' specs, registered when the module is imported (in this order)."""

ALGORITHMS: Registry[AlgorithmSpec] = Registry('algorithm')
"""Every registered ``AlgorithmSpec`` by name (the functions below read and change it)."""


def register(spec: AlgorithmSpec) -> AlgorithmSpec:
  """Registers an algorithm: ``--algorithm=<name>``, its hyper-parameters' flags, the tables.

  Call it before building configurations or flags. A hyper-parameter named as a flag of the
  experiment's sections is refused when a config of the algorithm is made
  (``experiment.config.make``).

  Args:
    spec: the algorithm's ``AlgorithmSpec``.

  Returns:
    ``spec`` itself, so that ``register`` can wrap an assignment.

  Raises:
    ValueError: its name is not an identifier (it is a value of ``--algorithm``, whose commas
      separate names, and a run's folder name) or is taken by another spec; ``build`` is not
      callable; ``hparams`` is no frozen dataclass of ``hparam`` fields (a plain field's value
      never reached the runs); ``variants`` names none of its hyper-parameters; or one of its
      hyper-parameters shares a name with another algorithm's but not its type, default or
      help (a name is one flag).

  Examples:
    >>> import optax
    >>> from fedjax_gel import algorithms, experiment
    >>> from fedjax_gel.algorithms import registry
    >>> from fedjax_gel.spec import AlgorithmSpec
    >>> spec = registry.register(AlgorithmSpec(
    ...     'sgd_server_half', lambda hp, s: algorithms.fedavg(
    ...         s.loss, optax.sgd(s.client_lr), optax.sgd(0.5)), paper='none'))
    >>> config = experiment.make(algorithm='sgd_server_half', num_rounds=10)
    >>> registry.unregister('sgd_server_half')
  """
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
  """Removes a registered algorithm (tests that register a toy algorithm clean up with it).

  Args:
    name: the algorithm's name.
  """
  ALGORITHMS.unregister(name)


def get(name: str) -> AlgorithmSpec:
  """Looks up a registered algorithm's spec.

  Args:
    name: the algorithm's name (an ``--algorithm`` value).

  Returns:
    Its ``AlgorithmSpec``.

  Raises:
    KeyError: an unknown name.
  """
  return ALGORITHMS.get(name)


def names() -> tuple[str, ...]:
  """The registered algorithms' names, in the order they were registered."""
  return ALGORITHMS.names()


def specs() -> tuple[AlgorithmSpec, ...]:
  """The registered algorithms' specs, in the order they were registered."""
  return ALGORITHMS.specs()


def hparam_fields() -> dict[str, dataclasses.Field]:
  """Every registered hyper-parameter by flag name (the first spec's field of each name)."""
  return ALGORITHMS.hparam_fields()


def variant_flags() -> tuple[str, ...]:
  """The hyper-parameters some algorithm takes several values of (``AlgorithmSpec.variants``).

  They are comma-separated lists on the command line.
  """
  return tuple(dict.fromkeys(v for s in specs() for v in s.variants))


def paired_with(name: str) -> str:
  """The algorithm whose runs ``name``'s are compared with (``AlgorithmSpec.paired_with``).

  Args:
    name: the algorithm's name.

  Returns:
    The other algorithm's name; ``''`` for none or an algorithm this process does not know.
  """
  return get(name).paired_with if name in ALGORITHMS else ''


def markdown_table() -> str:
  """The user guide's table of algorithms (docs/user-guide.md), in Markdown.

  One row per algorithm: name, clients, server, hyper-parameters (with defaults), paper.
  """
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
