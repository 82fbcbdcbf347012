"""LEAF's "Synthetic" federated classification data, reproduced sample for sample.

Follows LEAF's ``data/synthetic/main.py`` and ``data_generator.py`` (one cluster,
``PROB_CLUSTERS = [1.0]``), drawing from local ``np.random.RandomState`` streams in the same order
as LEAF draws from the global one:

1. ``RandomState(seed)``: per-user sample counts ``min(int(lognormal(3, 2)) + 5, 1000)``.
2. A fresh ``RandomState(seed)`` (LEAF re-seeds in the dataset constructor): the class mixing
   tensor ``Q [d + 1, C, 1]``, the cluster mean, then per user a cluster draw, a feature mean
   ``N(B, 1)`` with ``B ~ N(0, 1)``, features ``x ~ N(mean, diag((i + 1) ** -1.2))``, the user's
   model ``w = Q @ N(cluster_mean, 0.1)``, and labels ``argmax(softmax([1, x] @ w + N(0, 0.1)))``.

Labels use a row-wise softmax as current LEAF does. An earlier LEAF revision computed
``exp(z) / sum(exp(z))`` with Python's ``sum``, which normalises over the *samples* (columns)
before the per-row argmax; ``legacy_column_softmax=True`` reproduces that variant.

With the defaults (1000 users, 5 classes, 60 dims, seed 931231) there are 107,553 samples; LEAF's
by-sample split at 0.9 leaves 96,374 for training, a median of 22.5 per client.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

import numpy as np

from fedjax_gel.core.federated_data import FederatedSplit
from fedjax_gel.data.leaf import to_federated
from fedjax_gel.data.leaf_files import write_leaf_json
from fedjax_gel.data.leaf_preprocess import DEFAULT_SPLIT_SEED, split_by_sample

__all__ = ['DEFAULT_SEED', 'generate', 'load', 'main', 'sample_counts', 'write_leaf_json']

DEFAULT_SEED = 931231
MIN_SAMPLES, MAX_SAMPLES = 5, 1000
PROB_CLUSTERS = (1.0,)


def sample_counts(num_users: int, seed: int = DEFAULT_SEED) -> list[int]:
  """Per-user sample counts, as LEAF's ``get_num_samples``."""
  rs = np.random.RandomState(seed)
  n = rs.lognormal(3, 2, num_users).astype(int)
  return [int(min(s + MIN_SAMPLES, MAX_SAMPLES)) for s in n]


def _row_softmax(z: np.ndarray) -> np.ndarray:
  e = np.exp(z - np.max(z, axis=1, keepdims=True))
  return e / np.sum(e, axis=1, keepdims=True)


def _column_softmax(z: np.ndarray) -> np.ndarray:
  with np.errstate(over='ignore', invalid='ignore'):
    e = np.exp(z)
    return e / sum(e)  # Python's sum: adds the rows, i.e. normalises over samples.


def _normal_factor(cov: np.ndarray) -> np.ndarray:
  """``cov``'s SVD square root exactly as ``RandomState.multivariate_normal`` computes it."""
  _, s, v = np.linalg.svd(cov)
  return np.sqrt(s)[:, None] * v


def _multivariate_normal(rs: np.random.RandomState, mean: np.ndarray, factor: np.ndarray,
                         n: int) -> np.ndarray:
  """``rs.multivariate_normal(mean, cov, n)`` with ``cov`` factorised once, bit for bit.

  ``RandomState`` is numpy's frozen legacy stream: it draws ``standard_normal((n, d))`` and maps
  it through the covariance's SVD factor. Reusing the factor avoids one SVD per user.
  """
  x = np.dot(rs.standard_normal((n, mean.shape[0])), factor)
  x += mean
  return x


def _user(rs: np.random.RandomState, q: np.ndarray, factor: np.ndarray, means: list,
          n: int, legacy_column_softmax: bool) -> dict:
  """Draws one user's samples in LEAF's order (``get_task``)."""
  k = len(PROB_CLUSTERS)
  cluster = rs.choice(range(k), size=None, replace=True, p=list(PROB_CLUSTERS))
  mean = means[cluster]
  num_dim = factor.shape[0]
  b = rs.normal(loc=0.0, scale=1.0, size=None)
  loc = rs.normal(loc=b, scale=1.0, size=num_dim)
  samples = np.ones((n, num_dim + 1))
  samples[:, 1:] = _multivariate_normal(rs, loc, factor, n)
  model_info = rs.normal(loc=mean, scale=0.1, size=mean.shape)
  w = np.matmul(q, model_info)
  logits = np.matmul(samples, w) + rs.normal(loc=0.0, scale=0.1, size=(n, q.shape[1]))
  prob = _column_softmax(logits) if legacy_column_softmax else _row_softmax(logits)
  return {'x': samples[:, 1:], 'y': np.argmax(prob, axis=1)}


def _check_sizes(**sizes: int) -> None:
  for name, v in sizes.items():
    if int(v) != v or v < 1:
      raise ValueError(f'{name} must be a positive integer, got {v}')


def generate(
    num_users: int = 1000,
    num_classes: int = 5,
    num_dim: int = 60,
    seed: int = DEFAULT_SEED,
    legacy_column_softmax: bool = False,
) -> dict:
  """Generates LEAF Synthetic data as a LEAF dict with numpy user data.

  Returns ``{'users': ['0', '1', ...], 'num_samples': [...], 'user_data': {user: {'x': float64
  [n, num_dim], 'y': int [n]}}}``, equal to the output of LEAF's generator for the same arguments.
  ``legacy_column_softmax`` selects the earlier LEAF labelling (see the module docstring).
  """
  _check_sizes(num_users=num_users, num_classes=num_classes, num_dim=num_dim)
  counts = sample_counts(num_users, seed)
  rs = np.random.RandomState(seed)
  k = len(PROB_CLUSTERS)
  q = rs.normal(loc=0.0, scale=1.0, size=(num_dim + 1, num_classes, k))
  sigma = np.diag([(i + 1) ** -1.2 for i in range(num_dim)])
  means = []
  for _ in range(k):
    loc = rs.normal(loc=0, scale=1.0, size=None)
    means.append(rs.normal(loc=loc, scale=1.0, size=k))
  users = [str(i) for i in range(num_users)]
  factor = _normal_factor(sigma)
  user_data = {u: _user(rs, q, factor, means, n, legacy_column_softmax)
               for u, n in zip(users, counts)}
  return {'users': users, 'num_samples': counts, 'user_data': user_data}


def load(
    train_fraction: float = 0.9,
    split_seed: int = DEFAULT_SPLIT_SEED,
    **generate_kwargs,
) -> FederatedSplit:
  """Generates the data in memory and splits it with LEAF's by-sample rule.

  Examples are ``{'x': float32 [P, num_dim], 'y': int32 [P]}``. ``generate_kwargs`` go to
  ``generate``; see ``leaf_preprocess.split_by_sample`` for the split.
  """
  data = generate(**generate_kwargs)
  return to_federated(*split_by_sample(data, train_fraction, split_seed))


class _Parser(argparse.ArgumentParser):

  def error(self, message: str):
    sys.stderr.write(f'{self.prog}: error: {message}\n')
    sys.exit(2)


def _positive_int(s: str) -> int:
  try:
    v = int(s)
  except ValueError:
    raise argparse.ArgumentTypeError(f'{s!r} is not an integer') from None
  if v < 1:
    raise argparse.ArgumentTypeError(f'{s} is not a positive integer')
  return v


def _seed(s: str) -> int:
  try:
    v = int(s)
  except ValueError:
    raise argparse.ArgumentTypeError(f'{s!r} is not an integer') from None
  if not 0 <= v < 2**32:
    raise argparse.ArgumentTypeError(f'{s} is not in [0, 2**32) (numpy seeds are 32-bit)')
  return v


def main(argv: Sequence[str] | None = None) -> int:
  """Command line: writes ``OUT/all_data/data.json`` as LEAF's generator does."""
  p = _Parser(prog='python -m fedjax_gel.data.leaf_synthetic',
              description="Generate LEAF's Synthetic dataset in LEAF JSON format.")
  p.add_argument('--out', required=True, help='output directory; writes OUT/all_data/data.json')
  p.add_argument('--num_users', type=_positive_int, default=1000)
  p.add_argument('--num_classes', type=_positive_int, default=5)
  p.add_argument('--num_dim', type=_positive_int, default=60)
  p.add_argument('--seed', type=_seed, default=DEFAULT_SEED)
  p.add_argument('--legacy_column_softmax', action='store_true',
                 help="label with the earlier LEAF revision's column-normalised softmax")
  args = p.parse_args(argv)
  data = generate(args.num_users, args.num_classes, args.num_dim, args.seed,
                  args.legacy_column_softmax)
  path = os.path.join(args.out, 'all_data', 'data.json')
  try:
    write_leaf_json(data, path)
  except OSError as e:
    p.error(f'--out={args.out}: cannot write {path}: {e.strerror}')
  print(f'wrote {path}: {len(data["users"])} users, {sum(data["num_samples"])} samples')
  return 0


if __name__ == '__main__':
  sys.exit(main())
