"""Federated datasets: LEAF JSON files (``leaf``) and LEAF's Synthetic generator
(``leaf_synthetic``, imported by name: ``from fedjax_gel.data import leaf_synthetic``).

The package imports only ``leaf`` so that ``python -m fedjax_gel.data.leaf_synthetic`` runs its
module once.
"""
from fedjax_gel.data import leaf
from fedjax_gel.data.leaf import (DEFAULT_SPLIT_SEED, DataError, Sampling, num_train_samples,
                                  read_leaf_json, split_by_sample, to_federated, write_leaf_json)

load_leaf = leaf.load

__all__ = ['DEFAULT_SPLIT_SEED', 'DataError', 'Sampling', 'leaf', 'load_leaf', 'num_train_samples',
           'read_leaf_json', 'split_by_sample', 'to_federated', 'write_leaf_json']
