"""Tests for LEAF JSON reading, LEAF's split rule and conversion to pools."""
from __future__ import annotations

import json
import pathlib
import random

import numpy as np
import pytest

from fedjax_gel.core.federated_data import FederatedSplit, client_examples
from fedjax_gel.data import errors, leaf, leaf_files, leaf_preprocess
from fedjax_gel.data import leaf_synthetic

LEAF_DIR = pathlib.Path(__file__).resolve().parents[2].parent / 'shared' / 'data' / 'leaf'
needs_leaf_files = pytest.mark.skipif(
    not LEAF_DIR.is_dir(), reason=f'real LEAF files not found at {LEAF_DIR} (../shared/data/leaf)')


def indexed_data(sizes, hierarchies=False):
  """Users '0', '1', ... whose sample j has x = [j, -j] and y = j."""
  users = [str(i) for i in range(len(sizes))]
  data = {
      'users': users,
      'num_samples': list(sizes),
      'user_data': {u: {'x': [[float(j), float(-j)] for j in range(n)], 'y': list(range(n))}
                    for u, n in zip(users, sizes)},
  }
  if hierarchies:
    data['hierarchies'] = [f'h{u}' for u in users]
  return data


def leaf_split_reference(data, frac, seed):
  """LEAF's utils/split_data.py by-sample loop, written out on lists."""
  rng = random.Random(seed)
  train, test = {}, {}
  for u in data['users']:
    ys = list(data['user_data'][u]['y'])
    n = len(ys)
    if n < 2:
      continue
    n_train = max(1, int(frac * n))
    if n == 2:
      n_train = 1
    indices = [j for j in range(n)]
    train_blist = [False for _ in range(n)]
    for j in rng.sample(indices, n_train):
      train_blist[j] = True
    train[u] = [ys[j] for j in range(n) if train_blist[j]]
    test[u] = [ys[j] for j in range(n) if not train_blist[j]]
  return train, test


def write_json(path, obj):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(obj))
  return path


# --------------------------------------------------------------------------- split rule


@pytest.mark.parametrize('n,expected', [(2, (1, 1)), (3, (2, 1)), (5, (4, 1)), (10, (9, 1)),
                                        (11, (9, 2)), (20, (18, 2))])
def test_train_sizes_hand_computed(n, expected):
  train, test = leaf_preprocess.split_by_sample(indexed_data([n]), 0.9)
  assert (train['num_samples'][0], test['num_samples'][0]) == expected
  n_train = leaf_preprocess.num_train_samples(n, 0.9)
  assert (n_train, n - n_train) == expected


def test_small_users_dropped():
  train, test = leaf_preprocess.split_by_sample(indexed_data([5, 1, 0, 2]), 0.9)
  assert train['users'] == test['users'] == ['0', '3']
  assert set(train['user_data']) == set(test['user_data']) == {'0', '3'}
  assert train['num_samples'] == [4, 1] and test['num_samples'] == [1, 1]


def test_partition_disjoint_and_in_original_order():
  sizes = [2, 3, 7, 10, 31, 100]
  data = indexed_data(sizes)
  train, test = leaf_preprocess.split_by_sample(data, 0.75, seed=4)
  for u, n in zip(data['users'], sizes):
    tr, te = list(train['user_data'][u]['y']), list(test['user_data'][u]['y'])
    assert tr == sorted(tr) and te == sorted(te)
    assert not set(tr) & set(te)
    assert sorted(tr + te) == list(range(n))
    assert [x[0] for x in train['user_data'][u]['x']] == tr  # x travels with y
    assert len(te) >= 1 and len(tr) >= 1


def test_split_matches_leaf_loop_with_one_shared_rng():
  data = indexed_data([5, 1, 2, 40, 13, 7, 2, 100])
  ref_train, ref_test = leaf_split_reference(data, 0.9, seed=17)
  train, test = leaf_preprocess.split_by_sample(data, 0.9, seed=17)
  assert train['users'] == list(ref_train)
  for u in ref_train:
    assert list(train['user_data'][u]['y']) == ref_train[u]
    assert list(test['user_data'][u]['y']) == ref_test[u]


def test_split_matches_leaf_loop_on_synthetic_arrays():
  data = leaf_synthetic.generate(num_users=40, num_dim=5, seed=2)
  ref_train, _ = leaf_split_reference(data, 0.9, seed=99)
  train, test = leaf_preprocess.split_by_sample(data, 0.9, seed=99)
  for u in ref_train:
    np.testing.assert_array_equal(train['user_data'][u]['y'], ref_train[u])
    n_tr = len(train['user_data'][u]['y'])
    assert train['user_data'][u]['x'].shape == (n_tr, 5)


def test_same_seed_same_split_other_seed_differs():
  data = indexed_data([50] * 10)
  a, _ = leaf_preprocess.split_by_sample(data, 0.9, seed=1)
  b, _ = leaf_preprocess.split_by_sample(data, 0.9, seed=1)
  c, _ = leaf_preprocess.split_by_sample(data, 0.9, seed=2)
  ys = lambda d: [list(d['user_data'][u]['y']) for u in d['users']]
  assert ys(a) == ys(b)
  assert ys(a) != ys(c)


def test_default_seed_is_shared_constant():
  data = indexed_data([30, 30])
  a, _ = leaf_preprocess.split_by_sample(data)
  b, _ = leaf_preprocess.split_by_sample(data, 0.9, seed=leaf_preprocess.DEFAULT_SPLIT_SEED)
  assert [list(a['user_data'][u]['y']) for u in a['users']] == [
      list(b['user_data'][u]['y']) for u in b['users']]


def test_split_by_position():
  train, test = leaf_preprocess.split_by_sample(indexed_data([10, 2, 1]), 0.8, seed=3,
                                                by_position=True)
  assert train['users'] == ['0', '1']
  assert list(train['user_data']['0']['y']) == list(range(8))
  assert list(test['user_data']['0']['y']) == [8, 9]
  assert list(train['user_data']['1']['y']) == [0] and list(test['user_data']['1']['y']) == [1]


def test_split_keeps_hierarchies_of_kept_users():
  train, test = leaf_preprocess.split_by_sample(indexed_data([4, 1, 3], hierarchies=True), 0.9)
  assert train['hierarchies'] == test['hierarchies'] == ['h0', 'h2']


def test_split_rejects_bad_fraction():
  with pytest.raises(ValueError, match='train_fraction'):
    leaf_preprocess.split_by_sample(indexed_data([4]), 1.5)


# --------------------------------------------------------------------------- to_federated / load


def test_to_federated_users_in_both_and_dtypes():
  train, test = leaf_preprocess.split_by_sample(indexed_data([6, 4, 9]), 0.5, seed=0)
  del test['user_data']['1']
  test['users'].remove('1')
  split = leaf.to_federated(train, test)
  assert isinstance(split, FederatedSplit)
  assert split.train.client_names == split.test.client_names == ('0', '2')
  assert split.train.examples['x'].dtype == np.float32
  assert split.train.examples['y'].dtype == np.int32
  np.testing.assert_array_equal(split.train.counts, [3, 4])
  np.testing.assert_array_equal(client_examples(split.test, 1)['y'],
                                test['user_data']['2']['y'])


def test_load_single_file_splits(tmp_path):
  data = leaf_synthetic.generate(num_users=15, num_dim=3, seed=4)
  path = tmp_path / 'all_data' / 'data.json'
  leaf_files.write_leaf_json(data, path)
  split = leaf.load(path, 0.9, seed=8)
  expected = leaf.to_federated(*leaf_preprocess.split_by_sample(data, 0.9, seed=8))
  for a, b in ((split.train, expected.train), (split.test, expected.test)):
    np.testing.assert_array_equal(a.counts, b.counts)
    np.testing.assert_array_equal(a.examples['x'], b.examples['x'])
    np.testing.assert_array_equal(a.examples['y'], b.examples['y'])
  split_dir = leaf.load(tmp_path / 'all_data', 0.9, seed=8)  # a directory of JSON files
  np.testing.assert_array_equal(split_dir.train.examples['y'], expected.train.examples['y'])


def test_load_train_test_directories(tmp_path):
  data = leaf_synthetic.generate(num_users=12, num_dim=3, seed=6)
  train, test = leaf_preprocess.split_by_sample(data, 0.8, seed=1)
  users = train['users']
  part = lambda d, us: {'users': us, 'num_samples': [len(d['user_data'][u]['y']) for u in us],
                        'user_data': {u: d['user_data'][u] for u in us}}
  # Train over two files (read in name order); test in one file with the users reversed.
  leaf_files.write_leaf_json(part(train, users[6:]), tmp_path / 'train' / 'b_train.json')
  leaf_files.write_leaf_json(part(train, users[:6]), tmp_path / 'train' / 'a_train.json')
  leaf_files.write_leaf_json(part(test, users[::-1]), tmp_path / 'test' / 'data_test.json')
  split = leaf.load(tmp_path)
  assert split.train.client_names == tuple(users)
  expected = leaf.to_federated(train, test)
  for a, b in ((split.train, expected.train), (split.test, expected.test)):
    np.testing.assert_array_equal(a.counts, b.counts)
    np.testing.assert_array_equal(a.examples['x'], b.examples['x'])
    np.testing.assert_array_equal(a.examples['y'], b.examples['y'])


def test_read_merges_files_and_hierarchies(tmp_path):
  a = indexed_data([3, 2], hierarchies=True)
  b = {'users': ['x'], 'num_samples': [1], 'hierarchies': ['hx'],
       'user_data': {'x': {'x': [[1.0, 2.0]], 'y': [4.0]}}}
  write_json(tmp_path / 'z.json', a)
  write_json(tmp_path / 'b.json', b)
  merged = leaf_files.read_leaf_json([tmp_path / 'z.json', tmp_path / 'b.json'])
  assert merged['users'] == ['x', '0', '1']
  assert merged['num_samples'] == [1, 3, 2]
  assert merged['hierarchies'] == ['hx', 'h0', 'h1']
  assert merged['user_data']['x']['y'].dtype.kind == 'i'


def test_read_rejects_duplicate_users(tmp_path):
  write_json(tmp_path / 'a.json', indexed_data([2]))
  write_json(tmp_path / 'b.json', indexed_data([3]))
  with pytest.raises(errors.DataError, match='b.json'):
    leaf_files.read_leaf_json(tmp_path)


def test_read_ignores_user_data_of_unlisted_users(tmp_path):
  data = indexed_data([3, 4])
  data['user_data']['dropped'] = {'x': [], 'y': []}  # as LEAF's split output leaves them
  write_json(tmp_path / 'd.json', data)
  assert set(leaf_files.read_leaf_json(tmp_path / 'd.json')['user_data']) == {'0', '1'}


def test_string_features_and_labels_kept(tmp_path):
  data = {'users': ['a', 'b'], 'num_samples': [3, 2],
          'user_data': {'a': {'x': ['abc', 'bcd', 'cde'], 'y': ['d', 'e', 'f']},
                        'b': {'x': ['xyz', 'yz '], 'y': [' ', 'q']}}}
  split = leaf.load(write_json(tmp_path / 's.json', data), 0.5, split='position')
  assert split.train.examples['x'].dtype.kind == 'U'
  assert split.train.examples['y'].dtype.kind == 'U'
  assert list(split.train.examples['x']) == ['abc', 'xyz']
  assert list(split.test.examples['y']) == ['e', 'f', 'q']


# --------------------------------------------------------------------------- malformed input


def valid_file():
  return indexed_data([3, 2])


def _missing_key(d):
  del d['user_data']
  return d


def _length_mismatch(d):
  d['user_data']['1']['y'].append(5)
  d['num_samples'][1] = 3
  return d


def _half_label(d):
  d['user_data']['0']['y'][1] = 4.5
  return d


def _num_samples_wrong(d):
  d['num_samples'][0] = 7
  return d


def _ragged(d):
  d['user_data']['0']['x'][2] = [1.0]
  return d


def _bad_label_type(d):
  d['user_data']['1']['y'] = [None, 1]
  return d


def _null_feature(d):
  d['user_data']['0']['x'][0][1] = None
  return d


def _scalar_x(d):
  d['user_data']['1']['x'] = 3.0
  return d


def _missing_user(d):
  del d['user_data']['1']
  return d


@pytest.mark.parametrize('corrupt,phrase', [
    (_missing_key, "missing key 'user_data'"),
    (_length_mismatch, '2 samples in x but 3 in y'),
    (_half_label, 'non-integer label 4.5'),
    (_num_samples_wrong, "'num_samples' says 7"),
    (_ragged, 'ragged'),
    (_bad_label_type, 'neither numbers nor strings'),
    (_null_feature, 'NaN'),
    (_missing_user, "user '1'"),
    (_scalar_x, "needs lists for 'x' and 'y'"),
])
def test_malformed_content_raises_data_error(tmp_path, corrupt, phrase):
  path = write_json(tmp_path / 'bad.json', corrupt(valid_file()))
  with pytest.raises(errors.DataError) as e:
    leaf.load(path)
  msg = str(e.value)
  assert str(path) in msg and phrase in msg, msg
  assert '\n' not in msg


def test_missing_file_and_bad_json(tmp_path):
  missing = tmp_path / 'nope.json'
  with pytest.raises(errors.DataError, match='nope.json'):
    leaf.load(missing)
  with pytest.raises(errors.DataError, match='nope.json: no such file'):
    leaf_files.read_leaf_json(missing)
  bad = tmp_path / 'bad.json'
  bad.write_text('{"users": [')
  with pytest.raises(errors.DataError) as e:
    leaf_files.read_leaf_json(bad)
  assert str(bad) in str(e.value) and 'not valid JSON' in str(e.value)
  listed = tmp_path / 'list.json'
  listed.write_text('[1, 2]')
  with pytest.raises(errors.DataError, match='list.json: expected a JSON object'):
    leaf_files.read_leaf_json(listed)


def test_a_user_named_twice_in_user_data_is_refused_not_merged_into_one(tmp_path):
  twice = tmp_path / 'twice.json'
  twice.write_text('{"users": ["a", "b"], "num_samples": [1, 1], "user_data": '
                   '{"a": {"x": [[1.0]], "y": [0]}, "a": {"x": [[2.0]], "y": [1]}, '
                   '"b": {"x": [[3.0]], "y": [1]}}}')
  with pytest.raises(errors.DataError, match="twice.json: the key 'a' appears twice"):
    leaf_files.read_leaf_json(twice)


def test_data_error_is_value_error():
  assert issubclass(errors.DataError, ValueError)


def test_inconsistent_feature_shapes_across_files(tmp_path):
  write_json(tmp_path / 'a.json', indexed_data([2]))
  write_json(tmp_path / 'b.json', {'users': ['z'], 'num_samples': [2],
                                   'user_data': {'z': {'x': [[1.0], [2.0]], 'y': [0, 1]}}})
  with pytest.raises(errors.DataError, match="b.json: user 'z' has features of shape"):
    leaf_files.read_leaf_json(tmp_path)


# --------------------------------------------------------------------------- real LEAF files


@needs_leaf_files
def test_real_fedprox_synthetic_file():
  path = LEAF_DIR / 'fedprox_synthetic_1_1_subset.json'
  data = leaf_files.read_leaf_json(path)
  assert len(data['users']) == 30
  assert sum(data['num_samples']) == 1084
  y = np.concatenate([data['user_data'][u]['y'] for u in data['users']])
  assert y.dtype.kind == 'i' and 0 <= y.min() and y.max() < 10
  split = leaf.load(path)
  assert split.train.num_clients == 30
  assert split.train.num_examples + split.test.num_examples == 1084
  assert split.train.examples['x'].dtype == np.float32
  assert split.train.examples['x'].shape[1] == 60
  assert split.train.examples['y'].dtype == np.int32
  with open(path) as f:
    raw = json.load(f)
  u = raw['users'][0]
  first = client_examples(split.train, 0)
  raw_y = [int(v) for v in raw['user_data'][u]['y']]
  assert set(first['y'].tolist()) <= set(raw_y)


@needs_leaf_files
def test_real_shakespeare_file():
  path = LEAF_DIR / 'shakespeare_niid_keep100_subset.json'
  data = leaf_files.read_leaf_json(path)
  assert len(data['users']) == 109
  assert sum(data['num_samples']) == 16_507
  u = data['users'][0]
  assert data['user_data'][u]['x'].dtype.kind == 'U'
  assert all(len(s) == 80 for s in data['user_data'][u]['x'])
  assert all(len(s) == 1 for s in data['user_data'][u]['y'])
  split = leaf.load(path, 0.8, split='position')
  kept = [n for n in data['num_samples'] if n >= 2]
  assert split.train.num_clients == len(kept)
  assert split.train.num_examples + split.test.num_examples == sum(kept)
  assert split.train.examples['x'].dtype.kind == 'U'
  name = split.train.client_names[0]
  n_train = int(split.train.counts[0])
  assert n_train == leaf_preprocess.num_train_samples(len(data['user_data'][name]['y']), 0.8)
  np.testing.assert_array_equal(client_examples(split.train, 0)['x'],
                                data['user_data'][name]['x'][:n_train])
  np.testing.assert_array_equal(client_examples(split.test, 0)['y'],
                                data['user_data'][name]['y'][n_train:])


def test_package_exports():
  import fedjax_gel.data as data
  for name in data.__all__:
    assert getattr(data, name) is not None, name
  assert data.load_leaf is leaf.load
  assert leaf_synthetic.DEFAULT_SEED == leaf_preprocess.DEFAULT_SPLIT_SEED == 931231


@pytest.mark.parametrize('missing', ['test', 'train'])
def test_train_test_directories_with_a_user_on_one_side_are_refused(tmp_path, missing):
  """A shard missing from test/ (or train/): its users are on one side only, which LEAF's split
  never writes; one line naming a user and its folder, not the users silently left out."""
  data = leaf_synthetic.generate(num_users=12, num_dim=3, seed=6)
  train, test = leaf_preprocess.split_by_sample(data, 0.8, seed=1)
  users = train['users']
  part = lambda d, us: {'users': us, 'num_samples': [len(d['user_data'][u]['y']) for u in us],
                        'user_data': {u: d['user_data'][u] for u in us}}
  for side, d in (('train', train), ('test', test)):
    leaf_files.write_leaf_json(part(d, users[:8]), tmp_path / side / f'a_{side}.json')
    if side != missing:
      leaf_files.write_leaf_json(part(d, users[8:]), tmp_path / side / f'b_{side}.json')
  with pytest.raises(errors.DataError) as e:
    leaf.load(tmp_path)
  other = 'train' if missing == 'test' else 'test'
  assert str(e.value) == (
      f'{tmp_path / "train"} and {tmp_path / "test"}: 4 of 12 users are on one side only (e.g. '
      f"{users[8]!r}, in {tmp_path / other} only); LEAF's split writes every user to both, so a "
      'file is missing or from another split')


def test_a_position_split_that_leaves_no_test_sample_says_which_flag(tmp_path):
  """Short users under LEAF's Shakespeare gap: the error now names --split_gap."""
  data = {'users': ['a', 'b'], 'num_samples': [10, 10],
          'user_data': {u: {'x': [[float(i)] for i in range(10)], 'y': list(range(10))}
                        for u in 'ab'}}
  path = tmp_path / 'short.json'
  path.write_text(json.dumps(data))
  with pytest.raises(errors.DataError, match=r'after the position split \(gap 79\); it drops 79 '
                     r'samples \(--split_gap\) .* try --split_gap=0'):
    leaf.load(path, split='position', gap=79)
  assert leaf.load(path, split='position', gap=0).train.num_clients == 2
