"""Federated datasets: LEAF JSON files and LEAF's Synthetic generator.

``leaf_synthetic`` and its functions are imported on first use, so that
``python -m fedjax_gel.data.leaf_synthetic`` runs the module only once.
"""
from __future__ import annotations

import importlib

from fedjax_gel.data import leaf
from fedjax_gel.data.leaf import DEFAULT_SPLIT_SEED
from fedjax_gel.data.leaf import DataError
from fedjax_gel.data.leaf import num_train_samples
from fedjax_gel.data.leaf import read_leaf_json
from fedjax_gel.data.leaf import split_by_sample
from fedjax_gel.data.leaf import to_federated
from fedjax_gel.data.leaf import write_leaf_json

load_leaf = leaf.load

_LAZY = {
    'leaf_synthetic': None,
    'generate_leaf_synthetic': 'generate',
    'load_leaf_synthetic': 'load',
}

__all__ = [
    'DEFAULT_SPLIT_SEED',
    'DataError',
    'generate_leaf_synthetic',
    'leaf',
    'leaf_synthetic',
    'load_leaf',
    'load_leaf_synthetic',
    'num_train_samples',
    'read_leaf_json',
    'split_by_sample',
    'to_federated',
    'write_leaf_json',
]


def __getattr__(name: str):
  if name not in _LAZY:
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
  module = importlib.import_module('fedjax_gel.data.leaf_synthetic')
  return module if _LAZY[name] is None else getattr(module, _LAZY[name])


def __dir__():
  return sorted(set(globals()) | set(__all__))
