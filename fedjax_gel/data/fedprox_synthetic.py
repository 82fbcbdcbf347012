"""FedProx's Synthetic(alpha, beta) federated classification data.

Li et al. 2020, "Federated Optimization in Heterogeneous Networks" (FedProx), Section 5.1, as
their ``data/synthetic_*/generate_synthetic.py`` (alias ``generate_niid.py``) and
``data/synthetic_iid/generate_iid.py`` draw it: 30 users, 60 features, 10 classes, and per user k

* ``n_k = int(lognormal(4, 2)) + 50`` samples;
* ``u_k ~ N(0, alpha)``, ``W_k ~ N(u_k, 1)`` ``[60, 10]``, ``b_k ~ N(u_k, 1)`` ``[10]``;
* ``B_k ~ N(0, beta)``, ``v_k ~ N(B_k, 1)`` ``[60]``, ``x ~ N(v_k, Sigma)`` with
  ``Sigma = diag(j ** -1.2)``, ``j = 1..60``;
* ``y = argmax(softmax(x W_k + b_k))``.

``alpha`` and ``beta`` are standard deviations (the scripts' ``np.random.normal(0, alpha)``; the
paper writes ``N(0, alpha)``). Larger ``beta`` spreads the users' feature distributions (and so
their label mixes). ``alpha`` is meant to spread the users' models, but ``u_k`` adds the same
``u_k * (sum(x) + 1)`` to every class's logit, so it never changes a label: for a given seed,
Synthetic(alpha, beta) equals Synthetic(0, beta) sample for sample (barring ``exp`` overflow,
``|z| > 709``), i.e. only ``beta`` shapes the data. The IID variant (the paper's Synthetic-IID) shares one ``W, b ~ N(0, 1)``
and one feature mean ``v = 0`` across users; ``alpha`` and ``beta`` are unused there.

Draws come from a local ``np.random.RandomState(seed)`` in the scripts' order (which call the
global stream unseeded): counts, then ``u``, ``B``, every ``v_k``, then per user ``W_k, b_k, x``
(IID: counts, ``W, b``, then per user ``x``). The scripts' per-row, unstabilised softmax is
computed for all rows at once, and the covariance's square root once for all users; labels
match theirs up to floating-point ties.
"""
from __future__ import annotations

import numpy as np

from fedjax_gel.core.federated_data import FederatedSplit
from fedjax_gel.data.leaf import to_federated
from fedjax_gel.data.leaf_preprocess import DEFAULT_SPLIT_SEED, split_by_sample

__all__ = ['DEFAULT_SEED', 'NUM_CLASSES', 'NUM_DIM', 'NUM_USERS', 'covariance_diagonal',
           'generate', 'load', 'sample_counts', 'to_leaf', 'user_names']

DEFAULT_SEED = 0
NUM_USERS, NUM_DIM, NUM_CLASSES = 30, 60, 10


def covariance_diagonal(num_dim: int = NUM_DIM) -> np.ndarray:
  """``Sigma_jj = j ** -1.2`` for ``j = 1..num_dim``."""
  return np.power(np.arange(1, num_dim + 1, dtype=np.float64), -1.2)


def sample_counts(rs: np.random.RandomState, num_users: int) -> np.ndarray:
  """``int(lognormal(4, 2)) + 50`` per user (the scripts' ``samples_per_user``)."""
  return rs.lognormal(4, 2, num_users).astype(int) + 50


def _normal_factor(cov: np.ndarray) -> np.ndarray:
  """The SVD square root ``RandomState.multivariate_normal`` computes, taken once for all users."""
  _, s, v = np.linalg.svd(cov)
  return np.sqrt(s)[:, None] * v


def _features(rs: np.random.RandomState, mean: np.ndarray, factor: np.ndarray,
              n: int) -> np.ndarray:
  """``rs.multivariate_normal(mean, cov, n)`` bit for bit, given ``cov``'s ``_normal_factor``."""
  x = np.dot(rs.standard_normal((n, mean.shape[0])), factor)
  x += mean
  return x


def _labels(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
  """``argmax(exp(z) / sum(exp(z)))`` per row with ``z = x W + b``, unstabilised as the scripts.

  An overflowing row (``z > 709``) gives NaN where ``exp`` is infinite, and ``argmax`` picks the
  first NaN, as the scripts' per-row loop does.
  """
  z = x @ w + b
  with np.errstate(over='ignore', invalid='ignore'):
    e = np.exp(z)
    return np.argmax(e / np.sum(e, axis=1, keepdims=True), axis=1)


def _client(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> dict:
  return {'x': x.astype(np.float32), 'y': _labels(x, w, b).astype(np.int32)}


def _check(num_users: int, alpha: float, beta: float) -> None:
  if int(num_users) != num_users or num_users < 1:
    raise ValueError(f'num_users must be a positive integer, got {num_users}')
  for name, v in (('alpha', alpha), ('beta', beta)):
    if not np.isfinite(v) or v < 0:
      raise ValueError(f'{name} must be a finite standard deviation >= 0, got {v}')


def generate(
    alpha: float,
    beta: float,
    iid: bool = False,
    num_users: int = NUM_USERS,
    seed: int = DEFAULT_SEED,
) -> list[dict]:
  """Draws Synthetic(alpha, beta) (or Synthetic-IID with ``iid=True``).

  Returns one dict per user, ``{'x': float32 [n_k, 60], 'y': int32 [n_k]}`` with labels in
  ``0..9``. Deterministic in ``seed``; leaves numpy's global random state alone.
  """
  _check(num_users, alpha, beta)
  rs = np.random.RandomState(seed)
  counts = sample_counts(rs, num_users)
  factor = _normal_factor(np.diag(covariance_diagonal()))
  if iid:
    w = rs.normal(0, 1, (NUM_DIM, NUM_CLASSES))
    b = rs.normal(0, 1, NUM_CLASSES)
    mean = np.zeros(NUM_DIM)
    return [_client(_features(rs, mean, factor, n), w, b) for n in counts]
  mean_w = rs.normal(0, alpha, num_users)  # u_k, also the mean of b_k
  big_b = rs.normal(0, beta, num_users)
  means = [rs.normal(big_b[k], 1, NUM_DIM) for k in range(num_users)]  # v_k
  clients = []
  for k, n in enumerate(counts):
    w = rs.normal(mean_w[k], 1, (NUM_DIM, NUM_CLASSES))
    b = rs.normal(mean_w[k], 1, NUM_CLASSES)
    clients.append(_client(_features(rs, means[k], factor, n), w, b))
  return clients


def user_names(num_users: int) -> list[str]:
  """The scripts' user names ``f_00000, f_00001, ...``."""
  return [f'f_{k:05d}' for k in range(num_users)]


def to_leaf(clients: list[dict]) -> dict:
  """Per-user dicts as a LEAF dict (users ``f_00000, ...``), e.g. for
  ``leaf_files.write_leaf_json``."""
  users = user_names(len(clients))
  return {'users': users, 'num_samples': [len(c['y']) for c in clients],
          'user_data': dict(zip(users, clients))}


def load(
    alpha: float,
    beta: float,
    iid: bool = False,
    train_fraction: float = 0.9,
    seed: int = DEFAULT_SEED,
    split_seed: int = DEFAULT_SPLIT_SEED,
    num_users: int = NUM_USERS,
) -> FederatedSplit:
  """Generates the data and splits every user with LEAF's by-sample rule.

  As ``leaf_synthetic.load``: ``leaf_preprocess.split_by_sample(train_fraction, split_seed)``. The
  FedProx scripts shuffle with Python's unseeded ``random`` and keep the first ``int(0.9 n)``: the
  same train sizes (``n >= 50`` here), other samples. Examples are ``{'x': float32 [P, 60], 'y':
  int32 [P]}``; clients are named ``f_00000, ...``.
  """
  data = to_leaf(generate(alpha, beta, iid, num_users, seed))
  return to_federated(*split_by_sample(data, train_fraction, split_seed))
