"""Tests for the LEAF Synthetic generator."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from scipy.special import softmax

from fedjax_gel.core.federated_data import FederatedSplit
from fedjax_gel.data import leaf_files, leaf_preprocess
from fedjax_gel.data import leaf_synthetic


def leaf_reference(num_users, num_classes, num_dim, seed, legacy=False, max_users=None):
  """LEAF's generator written out step by step on the global numpy random state."""
  saved = np.random.get_state()
  try:
    np.random.seed(seed)
    counts = np.random.lognormal(3, 2, (num_users)).astype(int)
    counts = [min(s + 5, 1000) for s in counts]

    np.random.seed(seed)  # the dataset constructor seeds again
    prob_clusters = [1.0]
    num_clusters = len(prob_clusters)
    q = np.random.normal(loc=0.0, scale=1.0, size=(num_dim + 1, num_classes, num_clusters))
    sigma = np.zeros((num_dim, num_dim))
    for i in range(num_dim):
      sigma[i, i] = (i + 1)**(-1.2)
    means = []
    for _ in range(num_clusters):
      loc = np.random.normal(loc=0, scale=1., size=None)
      means.append(np.random.normal(loc=loc, scale=1., size=num_clusters))

    tasks = []
    for n in counts[:max_users]:
      cluster_idx = np.random.choice(range(num_clusters), size=None, replace=True, p=prob_clusters)
      mean = means[cluster_idx]
      b = np.random.normal(loc=0.0, scale=1.0, size=None)
      loc = np.random.normal(loc=b, scale=1.0, size=num_dim)
      samples = np.ones((n, num_dim + 1))
      samples[:, 1:] = np.random.multivariate_normal(mean=loc, cov=sigma, size=n)
      model_info = np.random.normal(loc=mean, scale=0.1, size=mean.shape)
      w = np.matmul(q, model_info)
      z = np.matmul(samples, w) + np.random.normal(loc=0., scale=0.1, size=(n, num_classes))
      prob = np.exp(z) / sum(np.exp(z)) if legacy else softmax(z, axis=1)
      tasks.append((samples[:, 1:], np.argmax(prob, axis=1)))
    return counts, tasks
  finally:
    np.random.set_state(saved)


def assert_matches_reference(data, counts, tasks):
  assert data['num_samples'][:len(counts)] == counts[:len(data['num_samples'])]
  for i, (x, y) in enumerate(tasks):
    d = data['user_data'][str(i)]
    assert d['x'].shape == x.shape
    np.testing.assert_allclose(d['x'], x, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(d['y'], y)


def all_labels(data):
  return np.concatenate([data['user_data'][u]['y'] for u in data['users']])


@pytest.fixture(scope='module')
def default_data():
  return leaf_synthetic.generate()


@pytest.fixture(scope='module')
def default_legacy():
  return leaf_synthetic.generate(legacy_column_softmax=True)


def test_default_counts(default_data):
  assert default_data['users'] == [str(i) for i in range(1000)]
  assert len(default_data['num_samples']) == 1000
  assert sum(default_data['num_samples']) == 107_553
  assert min(default_data['num_samples']) >= 5 and max(default_data['num_samples']) <= 1000
  for u, n in zip(default_data['users'], default_data['num_samples']):
    d = default_data['user_data'][u]
    assert d['x'].shape == (n, 60) and d['x'].dtype == np.float64
    assert d['y'].shape == (n,) and d['y'].dtype.kind == 'i'


def test_default_split_counts(default_data):
  train, test = leaf_preprocess.split_by_sample(default_data, 0.9)
  assert sum(train['num_samples']) == 96_374
  assert sum(test['num_samples']) == 107_553 - 96_374
  assert np.median(train['num_samples']) == 22.5


def test_load_gives_federated_split():
  split = leaf_synthetic.load()
  assert isinstance(split, FederatedSplit)
  assert split.train.num_clients == split.test.num_clients == 1000
  assert split.train.num_examples == 96_374
  assert np.median(split.train.counts) == 22.5
  assert split.train.examples['x'].dtype == np.float32
  assert split.train.examples['x'].shape == (96_374, 60)
  assert split.train.examples['y'].dtype == np.int32
  assert split.train.client_names[:3] == ('0', '1', '2')


@pytest.mark.slow
def test_default_matches_leaf_reference_all_users(default_data):
  counts, tasks = leaf_reference(1000, 5, 60, 931231)
  assert default_data['num_samples'] == counts
  assert_matches_reference(default_data, counts, tasks)


@pytest.mark.slow
def test_default_legacy_matches_leaf_reference_all_users(default_legacy):
  counts, tasks = leaf_reference(1000, 5, 60, 931231, legacy=True)
  assert_matches_reference(default_legacy, counts, tasks)


@pytest.mark.parametrize('legacy', [False, True])
def test_small_config_matches_leaf_reference(legacy):
  data = leaf_synthetic.generate(num_users=30, num_classes=3, num_dim=10, seed=5,
                                 legacy_column_softmax=legacy)
  counts, tasks = leaf_reference(30, 3, 10, 5, legacy=legacy)
  assert data['num_samples'] == counts
  assert len(tasks) == 30
  assert_matches_reference(data, counts, tasks)


def test_leaves_global_random_state_alone():
  np.random.seed(123)
  before = np.random.get_state()
  leaf_synthetic.generate(num_users=5, num_dim=4)
  after = np.random.get_state()
  assert before[0] == after[0] and before[2:] == after[2:]
  np.testing.assert_array_equal(before[1], after[1])


def test_deterministic_and_seed_dependent():
  a = leaf_synthetic.generate(num_users=30, num_dim=8, seed=7)
  b = leaf_synthetic.generate(num_users=30, num_dim=8, seed=7)
  c = leaf_synthetic.generate(num_users=30, num_dim=8, seed=8)
  assert a['num_samples'] == b['num_samples']
  for u in a['users']:
    np.testing.assert_array_equal(a['user_data'][u]['x'], b['user_data'][u]['x'])
    np.testing.assert_array_equal(a['user_data'][u]['y'], b['user_data'][u]['y'])
  assert a['num_samples'] != c['num_samples']
  assert not np.allclose(a['user_data']['0']['x'][:5], c['user_data']['0']['x'][:5])


def test_labels_in_range_and_every_class_occurs(default_data, default_legacy):
  for data in (default_data, default_legacy):
    y = all_labels(data)
    assert y.min() >= 0 and y.max() < 5
    assert np.all(np.bincount(y, minlength=5) > 0)


def test_legacy_softmax_changes_labels(default_data, default_legacy):
  y, y_legacy = all_labels(default_data), all_labels(default_legacy)
  assert default_legacy['num_samples'] == default_data['num_samples']
  for u in ('0', '500', '999'):  # features are drawn identically; only labels differ
    np.testing.assert_array_equal(default_data['user_data'][u]['x'],
                                  default_legacy['user_data'][u]['x'])
  assert np.mean(y != y_legacy) > 0.3


def test_rejects_non_positive_sizes():
  with pytest.raises(ValueError, match='num_users'):
    leaf_synthetic.generate(num_users=0)
  with pytest.raises(ValueError, match='num_dim'):
    leaf_synthetic.generate(num_dim=-2)


def test_json_round_trip(tmp_path):
  data = leaf_synthetic.generate(num_users=12, num_classes=3, num_dim=4, seed=3)
  path = tmp_path / 'nested' / 'data.json'
  leaf_synthetic.write_leaf_json(data, path)
  with open(path) as f:
    raw = json.load(f)
  assert list(raw) == ['users', 'num_samples', 'user_data']
  assert isinstance(raw['user_data']['0']['x'], list)
  assert isinstance(raw['user_data']['0']['x'][0][0], float)
  assert isinstance(raw['user_data']['0']['y'][0], int)
  back = leaf_files.read_leaf_json(path)
  assert back['users'] == data['users']
  assert back['num_samples'] == data['num_samples']
  for u in data['users']:
    np.testing.assert_array_equal(back['user_data'][u]['x'], data['user_data'][u]['x'])
    np.testing.assert_array_equal(back['user_data'][u]['y'], data['user_data'][u]['y'])


def test_cli_writes_all_data_json(tmp_path, capsys):
  out = tmp_path / 'synthetic'
  rc = leaf_synthetic.main(['--out', str(out), '--num_users', '7', '--num_classes', '3',
                            '--num_dim', '4', '--seed', '11'])
  assert rc == 0
  path = out / 'all_data' / 'data.json'
  assert path.is_file()
  printed = capsys.readouterr().out.strip().splitlines()
  assert len(printed) == 1 and str(path) in printed[0] and '7 users' in printed[0]
  expected = leaf_synthetic.generate(num_users=7, num_classes=3, num_dim=4, seed=11)
  got = leaf_files.read_leaf_json(path)
  assert got['num_samples'] == expected['num_samples']
  assert f'{sum(expected["num_samples"])} samples' in printed[0]
  np.testing.assert_array_equal(got['user_data']['6']['y'], expected['user_data']['6']['y'])


def test_cli_legacy_flag(tmp_path):
  out = tmp_path / 'legacy'
  leaf_synthetic.main(['--out', str(out), '--num_users', '5', '--num_dim', '4',
                       '--legacy_column_softmax'])
  got = leaf_files.read_leaf_json(os.path.join(out, 'all_data', 'data.json'))
  expected = leaf_synthetic.generate(num_users=5, num_dim=4, legacy_column_softmax=True)
  for u in expected['users']:
    np.testing.assert_array_equal(got['user_data'][u]['y'], expected['user_data'][u]['y'])


@pytest.mark.parametrize('argv', [
    ['--num_users', '0'],
    ['--num_classes', '-3'],
    ['--num_dim', 'abc'],
    ['--seed', '-1'],
    ['--seed', str(2**32)],
    [],  # no --out
])
def test_cli_bad_arguments_exit_2(tmp_path, capsys, argv):
  if argv:
    argv = ['--out', str(tmp_path)] + argv
  with pytest.raises(SystemExit) as e:
    leaf_synthetic.main(argv)
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert len(err.strip().splitlines()) == 1 and 'error' in err
  assert not (tmp_path / 'all_data').exists()


def test_cli_unwritable_out_is_one_line(tmp_path, capsys):
  blocker = tmp_path / 'a_file'
  blocker.write_text('')
  with pytest.raises(SystemExit) as e:
    leaf_synthetic.main(['--out', str(blocker), '--num_users', '2'])
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert len(err.strip().splitlines()) == 1 and str(blocker) in err
