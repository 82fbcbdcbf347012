"""Federated datasets: LEAF's data and generator, and the registry of datasets by spec.

LEAF data (``leaf``: the loader; ``leaf_files``: reading and writing LEAF
JSON; ``leaf_preprocess``: LEAF's sampling and splits), LEAF's Synthetic generator
(``leaf_synthetic``, imported by name: ``from fedjax_gel.data import leaf_synthetic``) and the
registry of datasets by spec (``registry``: the built-in ones' specs in ``specs/``, your own
added by ``register_dataset``).

The package imports ``leaf`` and the specs, whose loaders import the rest when called, so that
``python -m fedjax_gel.data.leaf_synthetic`` runs its module once.
"""
from fedjax_gel.data import leaf, registry
from fedjax_gel.data.errors import DataError
from fedjax_gel.data.leaf import to_federated
from fedjax_gel.data.leaf_files import read_leaf_json, write_leaf_json
from fedjax_gel.data.leaf_preprocess import (DEFAULT_SPLIT_SEED, Sampling, num_train_samples,
                                             split_by_sample)
from fedjax_gel.data.registry import register_dataset

load_leaf = leaf.load
"""``leaf.load``: LEAF data as a ``FederatedSplit``."""

__all__ = ['DEFAULT_SPLIT_SEED', 'DataError', 'Sampling', 'leaf', 'load_leaf', 'num_train_samples',
           'read_leaf_json', 'register_dataset', 'registry', 'split_by_sample', 'to_federated',
           'write_leaf_json']
