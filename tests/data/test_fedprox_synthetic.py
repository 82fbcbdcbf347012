"""Tests for FedProx's Synthetic(alpha, beta) generator."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest

from fedjax_gel.core.federated_data import FederatedSplit, client_examples
from fedjax_gel.data import fedprox_synthetic as fs
from fedjax_gel.data import leaf_files, leaf_preprocess

SUBSET = (pathlib.Path(__file__).resolve().parents[2].parent / 'shared' / 'data' / 'leaf' /
          'fedprox_synthetic_1_1_subset.json')


def script_reference(alpha, beta, iid, seed, num_users=30):
  """FedProx's generate_synthetic.py / generate_iid.py loops on the seeded global stream."""

  def softmax(x):
    ex = np.exp(x)
    return ex / np.sum(np.exp(x))

  saved = np.random.get_state()
  try:
    np.random.seed(seed)
    dimension, num_class = 60, 10
    samples_per_user = np.random.lognormal(4, 2, (num_users)).astype(int) + 50
    diagonal = np.zeros(dimension)
    for j in range(dimension):
      diagonal[j] = np.power((j + 1), -1.2)
    cov_x = np.diag(diagonal)
    mean_x = np.zeros((num_users, dimension))
    if iid:
      w_global = np.random.normal(0, 1, (dimension, num_class))
      b_global = np.random.normal(0, 1, num_class)
    else:
      mean_w = np.random.normal(0, alpha, num_users)
      mean_b = mean_w
      big_b = np.random.normal(0, beta, num_users)
      for i in range(num_users):
        mean_x[i] = np.random.normal(big_b[i], 1, dimension)
    out = []
    for i in range(num_users):
      if iid:
        w, b = w_global, b_global
      else:
        w = np.random.normal(mean_w[i], 1, (dimension, num_class))
        b = np.random.normal(mean_b[i], 1, num_class)
      xx = np.random.multivariate_normal(mean_x[i], cov_x, samples_per_user[i])
      yy = np.zeros(samples_per_user[i])
      for j in range(samples_per_user[i]):
        yy[j] = np.argmax(softmax(np.dot(xx[j], w) + b))
      out.append((xx, yy))
    return out
  finally:
    np.random.set_state(saved)


def label_tv(clients):
  """Mean total-variation distance between each user's label distribution and the pooled one."""
  per_user = np.array([np.bincount(c['y'], minlength=10) / len(c['y']) for c in clients])
  pooled = np.bincount(np.concatenate([c['y'] for c in clients]), minlength=10)
  return 0.5 * np.abs(per_user - pooled / pooled.sum()).sum(1).mean()


def within_user_variance(xs):
  """Per-dimension variance of the features around each user's own mean (pooled over users)."""
  xs = [x for x in xs if len(x) > 1]
  centred = np.concatenate([x - x.mean(0) for x in xs])
  return (centred**2).sum(0) / sum(len(x) - 1 for x in xs), centred


@pytest.fixture(scope='module')
def synthetic_1_1():
  return fs.generate(1, 1, seed=0)


def test_shapes_dtypes_and_classes(synthetic_1_1):
  assert len(synthetic_1_1) == 30
  for c in synthetic_1_1:
    n = len(c['y'])
    assert n >= 50
    assert c['x'].shape == (n, 60) and c['x'].dtype == np.float32
    assert c['y'].shape == (n,) and c['y'].dtype == np.int32
  y = np.concatenate([c['y'] for c in synthetic_1_1])
  assert y.min() >= 0 and y.max() <= 9
  assert len(np.unique(y)) == 10


@pytest.mark.parametrize('alpha,beta,iid,num_users',
                         [(1, 1, False, 30), (0.5, 0.5, False, 8), (0, 0, True, 8)])
@pytest.mark.slow
def test_matches_fedprox_script(alpha, beta, iid, num_users):
  got = fs.generate(alpha, beta, iid=iid, num_users=num_users, seed=3)
  want = script_reference(alpha, beta, iid, seed=3, num_users=num_users)
  assert [len(c['y']) for c in got] == [len(y) for _, y in want]
  for c, (x, y) in zip(got, want):
    np.testing.assert_allclose(c['x'], x, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(c['y'], y)


def test_deterministic_by_seed_and_leaves_global_state_alone():
  np.random.seed(5)
  before = np.random.get_state()[1].copy()
  a, b, c = fs.generate(1, 1, seed=7), fs.generate(1, 1, seed=7), fs.generate(1, 1, seed=9)
  np.testing.assert_array_equal(np.random.get_state()[1], before)
  for u, v in zip(a, b):
    np.testing.assert_array_equal(u['x'], v['x'])
    np.testing.assert_array_equal(u['y'], v['y'])
  assert [len(u['y']) for u in a] != [len(u['y']) for u in c]


def test_num_users():
  assert len(fs.generate(0, 0, num_users=7, seed=1)) == 7
  with pytest.raises(ValueError, match='num_users'):
    fs.generate(0, 0, num_users=0)
  with pytest.raises(ValueError, match='beta'):
    fs.generate(0, -1)


def test_heterogeneity_grows_with_beta():
  for seed in range(4):
    homo, hetero = fs.generate(0, 0, seed=seed), fs.generate(1, 1, seed=seed)
    # A user's mean feature is B_k + N(0, 1/60): spread sqrt(beta^2 + 1/60).
    assert np.std([c['x'].mean() for c in homo]) < 0.3
    assert np.std([c['x'].mean() for c in hetero]) > 0.6
    assert label_tv(hetero) > label_tv(homo)


def test_alpha_shifts_all_logits_equally():
  """``u_k`` adds ``u_k * (sum(x) + 1)`` to every class's logit, so labels do not depend on it."""
  a, b = fs.generate(0, 1, seed=2), fs.generate(2, 1, seed=2)
  for u, v in zip(a, b):
    np.testing.assert_array_equal(u['x'], v['x'])
    np.testing.assert_array_equal(u['y'], v['y'])


def test_iid_users_share_one_label_distribution():
  clients = fs.generate(0, 0, iid=True, seed=1)
  assert label_tv(clients) < 0.2
  assert label_tv(fs.generate(0, 0, seed=1)) > 0.6
  big = [c for c in clients if len(c['y']) >= 300]
  pooled = np.bincount(np.concatenate([c['y'] for c in clients]), minlength=10) / sum(
      len(c['y']) for c in clients)
  assert big
  for c in big:
    assert 0.5 * np.abs(np.bincount(c['y'], minlength=10) / len(c['y']) - pooled).sum() < 0.15
  # One shared feature distribution, v = 0.
  assert np.abs(np.concatenate([c['x'] for c in clients]).mean(0)).max() < 0.1


def test_covariance_is_diagonal_j_pow_minus_1_2(synthetic_1_1):
  var, centred = within_user_variance([c['x'].astype(np.float64) for c in synthetic_1_1])
  target = fs.covariance_diagonal()
  np.testing.assert_allclose(target, np.arange(1, 61.)**-1.2)
  assert np.abs(var / target - 1).max() < 0.1  # 22,349 samples: relative sd ~0.01 per entry
  corr = np.corrcoef(centred, rowvar=False)
  assert np.abs(corr - np.eye(60)).max() < 0.05


def test_load_gives_federated_split():
  split = fs.load(1, 1, seed=0)
  clients = fs.generate(1, 1, seed=0)
  assert isinstance(split, FederatedSplit)
  assert split.train.client_names == tuple(f'f_{k:05d}' for k in range(30))
  assert split.test.client_names == split.train.client_names
  counts = np.array([len(c['y']) for c in clients])
  expected_train = np.array([leaf_preprocess.num_train_samples(n, 0.9) for n in counts])
  np.testing.assert_array_equal(split.train.counts, expected_train)
  np.testing.assert_array_equal(split.test.counts, counts - expected_train)
  assert split.train.examples['x'].dtype == np.float32
  assert split.train.examples['y'].dtype == np.int32
  # Each user's train and test rows together are exactly its generated rows.
  for k in (0, 17, 29):
    tr, te = client_examples(split.train, k), client_examples(split.test, k)
    got = np.concatenate([tr['x'], te['x']])
    order = np.lexsort(got.T[::-1])
    want = clients[k]['x'][np.lexsort(clients[k]['x'].T[::-1])]
    np.testing.assert_array_equal(got[order], want)
  other = fs.load(1, 1, seed=0, split_seed=1)
  assert not np.array_equal(other.train.examples['x'], split.train.examples['x'])


def test_to_leaf_round_trip(tmp_path):
  clients = fs.generate(0.5, 0.5, num_users=4, seed=1)
  path = tmp_path / 'data.json'
  leaf_files.write_leaf_json(fs.to_leaf(clients), path)
  back = leaf_files.read_leaf_json(path)
  assert back['users'] == ['f_00000', 'f_00001', 'f_00002', 'f_00003']
  for u, c in zip(back['users'], clients):
    np.testing.assert_allclose(back['user_data'][u]['x'], c['x'])
    np.testing.assert_array_equal(back['user_data'][u]['y'], c['y'])


@pytest.mark.skipif(not SUBSET.is_file(),
                    reason=f'shipped FedProx file not found at {SUBSET} (../shared/data/leaf)')
def test_shipped_fedprox_1_1_subset_is_consistent():
  data = leaf_files.read_leaf_json(SUBSET)
  assert data['users'] == fs.user_names(30)
  xs = [data['user_data'][u]['x'] for u in data['users']]
  ys = [data['user_data'][u]['y'] for u in data['users']]
  assert all(x.ndim == 2 and x.shape[1] == 60 for x in xs)
  y = np.concatenate(ys)
  assert y.dtype.kind == 'i' and y.min() >= 0 and y.max() <= 9  # labels stored as 4.0, ...
  # Within a user, x ~ N(v_k, diag(j^-1.2)): about 1,050 degrees of freedom, sd ~0.045.
  var, centred = within_user_variance(xs)
  assert np.abs(var / fs.covariance_diagonal() - 1).max() < 0.2
  assert abs(np.mean(var / fs.covariance_diagonal()) - 1) < 0.05
  assert np.abs(np.corrcoef(centred, rowvar=False) - np.eye(60)).max() < 0.2
  # beta = 1: users' mean features spread by ~1 (0.13 at beta = 0), and labels are skewed.
  assert np.std([x.mean() for x in xs]) > 0.5
  assert label_tv([{'y': v} for v in ys]) > 0.5
