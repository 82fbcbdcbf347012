"""The registry of datasets: every ``DatasetSpec`` the experiment layer loads by name.

By name: ``--dataset=name``, ``experiment.make(dataset=name)``. Adding a built-in dataset is one
module holding its spec (``fedjax_gel/data/specs/``) and one entry in ``BUILTIN`` below. From your
own code, ``register_dataset(DatasetSpec(...))`` before building configs or flags gives a dataset
its ``--dataset`` value, a flag per field of its ``hparams`` and every output of a built-in one;
``register_dataset(name, load)`` registers a loader ``load(data_config) -> FederatedSplit`` of no
settings of its own, which reads the experiment's ``DataConfig`` (``data_path``, ``data_dir``,
``train_fraction``, ``split_seed``). The experiment checks what a registered loader returns
(``DatasetSpec.checked``), builds the model from its shapes, and plans, trains and reports as for
any dataset.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from fedjax_gel.data.specs.leaf import CELEBA, FEMNIST, LEAF, SENT140, SHAKESPEARE
from fedjax_gel.data.specs.synthetic import FEDPROX_SYNTHETIC, LEAF_SYNTHETIC
from fedjax_gel.data.specs.tfds import CIFAR10, CIFAR100, EMNIST, MNIST
from fedjax_gel.spec import DatasetSpec, Registry, flag_name
from fedjax_gel.spec.dataset import COMMON

BUILTIN = (LEAF_SYNTHETIC, FEDPROX_SYNTHETIC, LEAF, FEMNIST, SHAKESPEARE, SENT140, CELEBA, MNIST,
           EMNIST, CIFAR10, CIFAR100)

DATASETS: Registry[DatasetSpec] = Registry('dataset')


def _check(spec: DatasetSpec):
  where = f'register_dataset({spec.name!r})'
  if not callable(spec.load):
    raise ValueError(f'{where}: load must be callable, got {type(spec.load).__name__}')
  for kind in ('needs', 'reads'):
    unknown = [f for f in getattr(spec, kind) if f not in COMMON]
    if unknown:
      raise ValueError(f'{where}: {kind} names {unknown[0]!r}; the settings every dataset may '
                       f'read are {", ".join(COMMON)} (its own: hparams)')


def register_dataset(spec: DatasetSpec | str, load: Callable | None = None) -> DatasetSpec:
  """Registers a dataset: ``--dataset=<name>``, a flag per field of its ``hparams``, the tables.

  Call it before building configs or flags. The experiment checks what a registered loader
  returns (``DatasetSpec.checked``), builds the model from its shapes, and plans, trains and
  reports as for any dataset.

  Args:
    spec: the dataset's ``DatasetSpec``; or its name, with ``load``.
    load: with a name, a loader ``load(data_config) -> FederatedSplit`` of no settings of its
      own, which reads ``data_path``, ``data_dir`` and ``train_fraction`` of the experiment's
      ``DataConfig``.

  Returns:
    The registered ``DatasetSpec``.

  Raises:
    ValueError: a name taken (by a built-in or a registered dataset), a loader that is not
      callable, ``needs`` or ``reads`` naming no common setting, or a setting of another
      dataset of the same name but another type, default or help.

  Examples:
    >>> import numpy as np
    >>> import fedjax_gel as fg
    >>> from fedjax_gel import experiment
    >>> from fedjax_gel.data import registry
    >>> def blobs(data_config):
    ...   rng = np.random.default_rng(data_config.split_seed)
    ...   clients = [{'x': rng.normal(size=(50, 5)).astype(np.float32),
    ...               'y': rng.integers(0, 2, 50).astype(np.int32)} for _ in range(30)]
    ...   part = lambda s: fg.from_client_arrays([{k: v[s] for k, v in c.items()}
    ...                                           for c in clients])
    ...   return fg.core.FederatedSplit(part(slice(0, 40)), part(slice(40, None)))
    >>> spec = fg.register_dataset('blobs', blobs)
    >>> config = experiment.make(dataset='blobs', model='mlp', num_rounds=10)
    >>> registry.unregister('blobs')
  """
  if not isinstance(spec, DatasetSpec):
    if not callable(load):
      raise ValueError(f'register_dataset: load must be callable, got {type(load).__name__}')
    legacy = load
    spec = DatasetSpec(spec, lambda d, hparams: legacy(d),
                       reads=('data_path', 'data_dir', 'train_fraction'))
  return DATASETS.register(spec, _check)


def unregister(name: str):
  """Removes a dataset (tests that register a toy one clean up with it)."""
  DATASETS.unregister(name)


def get(name: str) -> DatasetSpec:
  """The spec of ``name``; ``KeyError`` for an unknown one."""
  return DATASETS.get(name)


def names() -> tuple[str, ...]:
  """Every dataset name: the built-in ones, then the registered ones."""
  return DATASETS.names()


def specs() -> tuple[DatasetSpec, ...]:
  return DATASETS.specs()


def hparam_fields() -> dict[str, dataclasses.Field]:
  """Every dataset's setting by flag name (the first spec's field of each name)."""
  return DATASETS.hparam_fields()


def readers(flag: str) -> tuple[str, ...]:
  """The datasets that read ``flag``: a setting of their own, or a common one they read."""
  if flag in COMMON:
    return tuple(s.name for s in specs() if flag in s.read())
  return DATASETS.readers(flag)


def not_read(flag: str, dataset: str) -> str:
  """Why ``--dataset``'s runs do not read ``flag``, for messages: ``only read with LEAF
  datasets`` where exactly the datasets of one family read it, else ``--dataset=X does not read
  it``."""
  who = readers(flag)
  families = {get(name).family for name in who}
  if len(families) == 1 and '' not in families:
    (family,) = families
    if set(who) == {s.name for s in specs() if s.family == family}:
      return f'only read with {family} datasets (got --dataset={dataset})'
  return f'--dataset={dataset} does not read it'


def markdown_table() -> str:
  """The user guide's table of datasets (docs/user-guide.md): name, data, features, settings
  (default)."""
  rows = ['| `--dataset` | data | `x` | reads | settings (default) |', '|---|---|---|---|---|']
  for spec in specs():
    own = ', '.join(f'`--{flag_name(f)}` ({f.default})' for f in dataclasses.fields(spec.hparams))
    reads = ', '.join([f'`--{f}` (required)' for f in spec.needs] +
                      [f'`--{f}`' for f in spec.reads if f not in spec.needs])
    rows.append(f'| `{spec.name}` | {spec.data} | {spec.x} | {reads or "-"} | {own or "-"} |')
  return '\n'.join(rows)


DATASETS.add_builtin(BUILTIN)
