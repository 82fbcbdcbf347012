"""LEAF data as a ``FederatedSplit``: LEAF's JSON files read, sampled, split and pooled.

``load`` reads LEAF JSON files (``leaf_files``), applies LEAF's sampling and split
(``leaf_preprocess``) and builds the train and test pools (``to_federated``).
"""
from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np

from fedjax_gel.core.federated_data import FederatedData, FederatedSplit, from_client_arrays
from fedjax_gel.data.errors import DataError
from fedjax_gel.data.leaf_files import PathLike, read_leaf_json, read_merged, user_arrays
from fedjax_gel.data.leaf_preprocess import (DEFAULT_SPLIT_SEED, Sampling, split_by_sample,
                                             split_by_user)


def _client(d: Mapping[str, Any], source: str, user: str) -> dict:
  x, y = user_arrays(d['x'], d['y'], source, user)
  x = x if x.dtype.kind == 'U' else x.astype(np.float32)
  y = y if y.dtype.kind == 'U' else y.astype(np.int32)
  return {'x': x, 'y': y}


def _pool(clients: list[dict], names: list[str], source: str) -> FederatedData:
  """Builds a pool, giving empty clients the common feature shape."""
  ref = next((c['x'] for c in clients if len(c['x'])), None)
  if ref is not None:
    for c in clients:
      if not len(c['x']):
        c['x'] = np.zeros((0,) + ref.shape[1:], ref.dtype)
  for c, u in zip(clients, names):
    if ref is not None and len(c['x']) and (c['x'].shape[1:] != ref.shape[1:] or
                                            (c['x'].dtype.kind == 'U') != (ref.dtype.kind == 'U')):
      raise DataError(f'{source}: user {u!r} has features of shape {c["x"].shape[1:]}, '
                      f'others {ref.shape[1:]}')
  return from_client_arrays(clients, names)


def to_federated(train: Mapping[str, Any], test: Mapping[str, Any],
                 same_users: bool = True) -> FederatedSplit:
  """Turns LEAF train and test dicts into a ``FederatedSplit``.

  Users keep the dicts' order. Examples are ``{'x', 'y'}``: numeric features as float32,
  string features as unicode arrays (left for a task to encode); labels as int32 (integer-valued
  floats accepted) or unicode arrays for string labels.

  Args:
    train: the training LEAF dict.
    test: the test LEAF dict.
    same_users: the pools hold the users present in both (a by-sample split); False: each
      dict's own users (a by-user split, whose test clients are held-out users).

  Returns:
    The ``FederatedSplit`` on the host.

  Raises:
    DataError: no user in common (or none on a side), or users' features of different shapes.
  """
  if same_users:
    in_test = set(test['users'])
    train_users = test_users = [u for u in train['users'] if u in in_test]
    if not train_users:
      raise DataError('train and test data have no user in common')
  else:
    train_users, test_users = list(train['users']), list(test['users'])
    if not train_users or not test_users:
      raise DataError('a by-user split needs users on both sides')
  tr = [_client(train['user_data'][u], 'train data', u) for u in train_users]
  te = [_client(test['user_data'][u], 'test data', u) for u in test_users]
  return FederatedSplit(_pool(tr, train_users, 'train data'), _pool(te, test_users, 'test data'))


SPLITS = ('sample', 'position', 'user')


def check_same_users(train_users, test_users, train_dir: str, test_dir: str):
  """LEAF's split output holds every user on both sides (its by-sample split keeps a user with
  train and test samples and drops the others), so a user on one side only means a shard
  missing or from another split: a DataError naming one, rather than the user left out."""
  in_train, in_test = set(train_users), set(test_users)
  if not in_train & in_test:
    raise DataError(f'{train_dir} and {test_dir}: no user in common')
  only = [(u, train_dir) for u in train_users if u not in in_test] + [
      (u, test_dir) for u in test_users if u not in in_train]
  if only:
    user, folder = only[0]
    raise DataError(f'{train_dir} and {test_dir}: {len(only)} of {len(in_train | in_test)} users '
                    f'are on one side only (e.g. {str(user)[:80]!r}, in {folder} only); LEAF\'s '
                    'split writes every user to both, so a file is missing or from another split')


def holds_split(path: PathLike) -> bool:
  """Whether ``path`` is a folder of LEAF's split output (``train/`` and ``test/``), which
  ``load`` reads as it is, without a split of its own."""
  return all(os.path.isdir(os.path.join(path, side)) for side in ('train', 'test'))


def load(
    path: PathLike,
    train_fraction: float = 0.9,
    seed: int = DEFAULT_SPLIT_SEED,
    split: str = 'sample',
    gap: int = 0,
    sampling: Sampling = Sampling(),
) -> FederatedSplit:
  """Loads LEAF data as a ``FederatedSplit`` (``data.load_leaf``).

  Args:
    path: either one LEAF JSON file (or a directory of them, such as LEAF's ``all_data/``:
      FEMNIST's many files are merged), split by LEAF's rules; or a directory with ``train/``
      and ``test/`` sub-directories of LEAF JSON files (LEAF's split output), joined by user
      name (their features must have one shape; every user on both sides,
      ``check_same_users``), and the split arguments are unused.
    train_fraction: the share of each user's samples (``'user'``: of the users) to train on.
    seed: the split's seed.
    split: ``'sample'`` (each user's samples at random, ``split_by_sample``), ``'position'``
      (each user's first samples for training, then ``gap`` skipped: Shakespeare) or
      ``'user'`` (held-out users, ``split_by_user``).
    gap: with ``'position'``, the samples skipped between a user's train and test parts.
    sampling: LEAF's sampling and user filter of raw files before the split (``Sampling``; not
      for ``train/`` and ``test/``, which LEAF wrote after them).

  Returns:
    The ``FederatedSplit`` on the host (``to_device`` moves a pool for the round).

  Raises:
    ValueError: an unknown split.
    DataError: a missing path, a file that cannot be used (naming it), sampling asked of
      ``train/`` and ``test/``, or no user left after the sampling or the split.

  Examples:
    >>> import numpy as np
    >>> from fedjax_gel import data
    >>> users = {f'u{i}': {'x': np.ones((10, 3)), 'y': np.arange(10) % 2} for i in range(4)}
    >>> data.write_leaf_json({'users': list(users), 'num_samples': [10] * 4,
    ...                       'user_data': users}, 'all_data/all_data.json')
    >>> split = data.load_leaf('all_data', train_fraction=0.8)
    >>> split.train.counts, split.test.counts
    (array([8, 8, 8, 8], dtype=int32), array([2, 2, 2, 2], dtype=int32))
  """
  if split not in SPLITS:
    raise ValueError(f'split must be one of {SPLITS}, got {split!r}')
  path = os.fspath(path)
  if not os.path.exists(path):
    raise DataError(f'{path}: no such file or directory')
  if holds_split(path):
    train_dir, test_dir = os.path.join(path, 'train'), os.path.join(path, 'test')
    if sampling.active:
      raise DataError(f'{path}: holds train/ and test/, which LEAF samples and filters before it '
                      'splits; point at its raw all_data/ to sample here')
    train, ref = read_merged(train_dir)
    test, _ = read_merged(test_dir, ref=ref)
    check_same_users(train['users'], test['users'], train_dir, test_dir)
    return to_federated(train, test)
  data = read_leaf_json(path, sampling)
  if not data['users']:
    raise DataError(f"{path}: no user left after LEAF's sampling and user filter"
                    if sampling.active else f'{path}: holds no user')
  if split == 'user':
    return to_federated(*split_by_user(data, train_fraction, seed), same_users=False)
  train, test = split_by_sample(data, train_fraction, seed, split == 'position', gap)
  if not train['users']:
    rule = f'position split (gap {gap})' if split == 'position' else 'split'
    hint = (f'; it drops {gap} samples (--split_gap) between each user\'s train and test '
            'parts, which left none to test on: try --split_gap=0' if split == 'position' and gap
            else '')
    raise DataError(f'{path}: no user has both train and test samples after the {rule}{hint}')
  return to_federated(train, test)
