"""Datasets registered from your own code, usable by name as the built-in ones
(``--dataset=name``, ``experiment.make(dataset=name)``).

A loader is ``load(data_config) -> FederatedSplit``: it reads ``data_config`` (the experiment's
``DataConfig``: ``data_path``, ``train_fraction``, ``split_seed`` and the rest) and returns the
train and test pools on the host (``federated_data.from_client_arrays`` builds one from a list of
per-client ``{'x': ..., 'y': ...}`` arrays; ``data.split_by_sample`` splits each client's
examples). The experiment checks what it returns, builds the model from its shapes, and plans,
trains and reports as for any dataset.
"""
from __future__ import annotations

from typing import Callable

# The datasets the experiment layer loads itself (``experiment.factories.load_split``).
BUILTIN = ('leaf_synthetic', 'fedprox_synthetic', 'leaf', 'femnist', 'shakespeare', 'sent140',
           'celeba', 'mnist', 'emnist', 'cifar10', 'cifar100')
LOADERS: dict[str, Callable] = {}


def register_dataset(name: str, load: Callable) -> None:
  """Makes ``load`` the dataset ``name``; call it before building configs or flags. A name
  taken (by a built-in or a registered dataset) is a ValueError."""
  if not isinstance(name, str) or not name.isidentifier():
    raise ValueError(f'register_dataset: the name must be an identifier, got {name!r}')
  if name in LOADERS or name in BUILTIN:
    raise ValueError(f'register_dataset: a dataset {name!r} exists already')
  if not callable(load):
    raise ValueError(f'register_dataset: load must be callable, got {type(load).__name__}')
  LOADERS[name] = load


def names() -> tuple[str, ...]:
  """Every dataset name: the built-in ones, then the registered ones."""
  return BUILTIN + tuple(LOADERS)
