"""LEAF's sampling (``preprocess.sh -s niid|iid --sf F [--iu U]``) and user filter (``-k K``)
against references written out on plain lists from LEAF's rules (``utils/sample.py``,
``utils/remove_users.py``), run on LEAF JSON files the tests make."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from fedjax_gel.data import errors, leaf, leaf_files, leaf_preprocess


def file_data(first: int, sizes, hierarchies=False):
  """Users 'u<first>', ... of the given sizes; sample j of user u has x = [u, j], y = 100 u + j."""
  users = [f'u{first + i}' for i in range(len(sizes))]
  data = {'users': users, 'num_samples': list(sizes), 'user_data': {
      u: {'x': [[float(first + i), float(j)] for j in range(n)],
          'y': [100 * (first + i) + j for j in range(n)]}
      for i, (u, n) in enumerate(zip(users, sizes))}}
  if hierarchies:
    data['hierarchies'] = [f'writer-{u}' for u in users]
  return data


FILES = [file_data(0, [7, 0, 12, 3, 25, 9, 1], hierarchies=True),
         file_data(10, [40, 2, 2, 15, 8])]


def reference_niid(data, fraction, rng):
  """Whole users, shuffled (with their hierarchies), until int(fraction * total) samples; the
  user that would pass it keeps a shuffle of its first samples up to that count."""
  goal = int(fraction * sum(data['num_samples']))
  users = list(data['users'])
  if 'hierarchies' in data:
    pairs = list(zip(users, data['hierarchies']))
    rng.shuffle(pairs)
    users = [p[0] for p in pairs]
    hiers = [p[1] for p in pairs]
  else:
    rng.shuffle(users)
  got, kept, counts, ys = 0, [], [], {}
  i = 0
  while got < goal:
    u = users[i]
    y = list(data['user_data'][u]['y'])
    n = len(y)
    if got + n > goal:
      n = goal - got
      y = [y[j] for j in rng.sample(list(range(n)), n)]
    kept.append(u)
    counts.append(n)
    ys[u] = y
    got += n
    i += 1
  out = {'users': kept, 'num_samples': counts, 'y': ys}
  if 'hierarchies' in data:
    out['hierarchies'] = hiers[:len(kept)]
  return out


def reference_iid(data, fraction, users_fraction, rng, first):
  """int(fraction * total) samples of all users pooled, without replacement, dealt in draw
  order to round(users_fraction * U) (at least 1) users: the smaller groups first."""
  pooled = [y for u in data['users'] for y in data['user_data'][u]['y']]
  total = len(pooled)
  drawn = rng.sample(list(range(total)), int(fraction * total))
  groups = int(round(users_fraction * len(data['users']))) or 1
  size = len(drawn) // groups
  bigger = len(drawn) - groups * size
  chunks, start = [], 0
  for g in range(groups):
    take = size + (1 if g >= groups - bigger else 0)
    chunks.append(drawn[start:start + take])
    start += take
  names = [str(first + g) for g in range(groups)]
  return {'users': names, 'num_samples': [len(c) for c in chunks],
          'y': {n: [pooled[j] for j in c] for n, c in zip(names, chunks)}}


def reference_filter(part, k):
  keep = [i for i, n in enumerate(part['num_samples']) if n > k]
  out = {'users': [part['users'][i] for i in keep],
         'num_samples': [part['num_samples'][i] for i in keep],
         'y': {part['users'][i]: part['y'][part['users'][i]] for i in keep}}
  if 'hierarchies' in part:
    out['hierarchies'] = [part['hierarchies'][i] for i in keep]
  return out


def as_lists(parts):
  return [{'users': p['users'], 'num_samples': p['num_samples'],
           'y': {u: [int(v) for v in p['user_data'][u]['y']] for u in p['users']},
           **({'hierarchies': p['hierarchies']} if 'hierarchies' in p else {})} for p in parts]


def written(tmp_path):
  """FILES as LEAF JSON files (names in order) read back as the module reads them."""
  for i, data in enumerate(FILES):
    (tmp_path / f'all_data_{i}.json').write_text(json.dumps(data))
  return [leaf_files.read_leaf_json(tmp_path / f'all_data_{i}.json') for i in range(len(FILES))]


@pytest.mark.parametrize('fraction,k', [(0.05, -1), (0.3, 0), (0.5, 2), (0.99, 5), (1.0, 0)])
@pytest.mark.parametrize('seed', [0, 7])
def test_niid_and_filter_match_leaf_rules(tmp_path, fraction, k, seed):
  parts = written(tmp_path)
  sampling = leaf_preprocess.Sampling('niid', fraction, min_samples=k, seed=seed)
  got = as_lists(leaf_preprocess.preprocess(parts, sampling))
  rng, want = random.Random(seed), []
  for data in FILES:
    part = reference_niid(data, fraction, rng)
    want.append(reference_filter(part, k) if k >= 0 else part)
  assert got == want
  for data, part in zip(FILES, got):   # LEAF's count, whatever the users' sizes
    if k < 0:
      assert sum(part['num_samples']) == int(fraction * sum(data['num_samples']))


@pytest.mark.parametrize('fraction,users', [(0.5, 0.3), (0.2, 0.01), (1.0, 1.0)])
def test_iid_matches_leaf_rules(tmp_path, fraction, users):
  parts = written(tmp_path)
  sampling = leaf_preprocess.Sampling('iid', fraction, users, seed=3)
  got = as_lists(leaf_preprocess.preprocess(parts, sampling))
  rng, want, first = random.Random(3), [], 0
  for data in FILES:
    want.append(reference_iid(data, fraction, users, rng, first))
    first += len(want[-1]['users'])
  assert got == want
  x = leaf_preprocess.preprocess(parts, sampling)[0]['user_data']
  for u, d in x.items():   # features travel with their labels: y = 100 x[0] + x[1]
    np.testing.assert_array_equal(100 * np.asarray(d['x'])[:, 0] + np.asarray(d['x'])[:, 1],
                                  d['y'])


def test_load_samples_each_raw_file_then_splits(tmp_path):
  """load() on LEAF's raw all_data: sampled per file, filtered, merged, split by sample; the
  same seed gives the same subsets, another seed others."""
  written(tmp_path)
  sampling = leaf_preprocess.Sampling('niid', 0.5, min_samples=2, seed=11)
  split = leaf.load(tmp_path, sampling=sampling)
  kept = [u for p in leaf_preprocess.preprocess(written(tmp_path), sampling) for u in p['users']]
  assert list(split.train.client_names) == kept
  again = leaf.load(tmp_path, sampling=sampling)
  np.testing.assert_array_equal(split.train.examples['y'], again.train.examples['y'])
  other = leaf.load(tmp_path, sampling=sampling._replace(seed=12))
  assert (list(other.train.client_names) != kept or
          not np.array_equal(other.train.examples['y'], split.train.examples['y']))


def test_sampling_split_directories_or_everything_is_refused(tmp_path):
  for side in ('train', 'test'):
    (tmp_path / side).mkdir()
    (tmp_path / side / 'a.json').write_text(json.dumps(FILES[0]))
  with pytest.raises(errors.DataError, match='raw all_data'):
    leaf.load(tmp_path, sampling=leaf_preprocess.Sampling(min_samples=0))
  raw = tmp_path / 'raw'
  raw.mkdir()
  (raw / 'a.json').write_text(json.dumps(FILES[0]))
  with pytest.raises(errors.DataError, match='no user left'):
    leaf.load(raw, sampling=leaf_preprocess.Sampling(min_samples=1000))
