"""Federated datasets: LEAF JSON files (``leaf``), LEAF's Synthetic generator
(``leaf_synthetic``, imported by name: ``from fedjax_gel.data import leaf_synthetic``) and the
registry of your own (``register_dataset``).

The package imports only ``leaf`` so that ``python -m fedjax_gel.data.leaf_synthetic`` runs its
module once.
"""
from fedjax_gel.data import leaf, registry
from fedjax_gel.data.leaf import (DEFAULT_SPLIT_SEED, DataError, Sampling, num_train_samples,
                                  read_leaf_json, split_by_sample, to_federated, write_leaf_json)
from fedjax_gel.data.registry import register_dataset

load_leaf = leaf.load

__all__ = ['DEFAULT_SPLIT_SEED', 'DataError', 'Sampling', 'leaf', 'load_leaf', 'num_train_samples',
           'read_leaf_json', 'register_dataset', 'registry', 'split_by_sample', 'to_federated',
           'write_leaf_json']
