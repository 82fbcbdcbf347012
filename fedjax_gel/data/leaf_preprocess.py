"""LEAF's preprocessing of raw files, draw for draw: sampling (``Sampling``, LEAF's
``utils/sample.py``), the user filter (``utils/remove_users.py``) and the train/test splits
(``utils/split_data.py``), on LEAF dicts (``leaf_files.read_leaf_json``).

Split seed: LEAF's ``utils/split_data.py`` defaults to a time-based seed (``int(time.time())``),
so its splits are not reproducible unless a seed is given; this module defaults to
``DEFAULT_SPLIT_SEED`` instead.
"""
from __future__ import annotations

import random
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

DEFAULT_SPLIT_SEED = 931231
"""The splits' and the sampling's seed by default (LEAF's own default is time-based)."""


# --------------------------------------------------------------------------- sampling


SAMPLINGS = ('none', 'niid', 'iid')


class Sampling(NamedTuple):
  """LEAF's ``preprocess.sh`` steps before its split, on raw ``all_data`` files.

  ``-s niid|iid --sf fraction [--iu users]`` (``utils/sample.py``), then ``-k min_samples``
  (``utils/remove_users.py``). The defaults do neither.

  Attributes:
    mode: ``'none'``; ``'niid'``: whole users at random until their samples reach ``fraction``
      of the file's (the last user cut to its first samples); ``'iid'``: ``fraction`` of the
      file's samples at random, dealt in order to ``iid_users`` of its user count new users.
    fraction: ``--sf``.
    iid_users: ``--iu``, the iid sample's users as a fraction of the file's users (at least 1).
    min_samples: ``-k``: users with at most this many samples are dropped; -1 keeps all.
    seed: seed of one ``random.Random`` shared by the files in name order (LEAF's
      ``sample.py`` uses Python's unseeded global generator, so no seed reproduces its subsets;
      its rules are followed draw for draw).
  """
  mode: str = 'none'
  fraction: float = 0.1
  iid_users: float = 0.01
  min_samples: int = -1
  seed: int = DEFAULT_SPLIT_SEED

  @property
  def active(self) -> bool:
    return self.mode != 'none' or self.min_samples >= 0


def sample_niid(data: Mapping[str, Any], fraction: float, rng: random.Random) -> dict:
  """LEAF's niid sampling of one file: users (with their hierarchies) shuffled, then taken
  whole until ``int(fraction * total)`` samples; the last one cut to a shuffle of its first
  samples to reach that count exactly."""
  target = int(fraction * sum(len(data['user_data'][u]['y']) for u in data['users']))
  users = list(data['users'])
  hiers = list(data['hierarchies']) if 'hierarchies' in data else None
  if hiers is not None:
    pairs = list(zip(users, hiers))
    rng.shuffle(pairs)
    users, hiers = [u for u, _ in pairs], [h for _, h in pairs]
  else:
    rng.shuffle(users)
  out = {'users': [], 'num_samples': [], 'user_data': {}}
  if hiers is not None:
    out['hierarchies'] = []
  total = 0
  for i, u in enumerate(users):
    if total >= target:
      break
    d = data['user_data'][u]
    n = len(d['y'])
    if total + n > target:
      n = target - total
      idx = rng.sample(range(n), n)
      d = {'x': _take(d['x'], idx), 'y': _take(d['y'], idx)}
    out['users'].append(u)
    out['num_samples'].append(n)
    out['user_data'][u] = d
    total += n
    if hiers is not None:
      out['hierarchies'].append(hiers[i])
  return out


def sample_iid(data: Mapping[str, Any], fraction: float, users_fraction: float,
               rng: random.Random, first_user: int = 0) -> dict:
  """LEAF's iid sampling of one file: ``int(fraction * total)`` of its samples drawn without
  replacement from all users' samples pooled, dealt in draw order to ``round(users_fraction *
  U)`` (at least 1) new users named ``str(first_user + i)``, the first groups one sample
  smaller when they do not divide evenly (LEAF's ``iid_divide``)."""
  xs = [x for u in data['users'] for x in data['user_data'][u]['x']]
  ys = [y for u in data['users'] for y in data['user_data'][u]['y']]
  picked = rng.sample(range(len(ys)), int(fraction * len(ys)))
  groups = max(1, int(round(users_fraction * len(data['users']))))
  small, big = divmod(len(picked), groups)
  sizes = [small] * (groups - big) + [small + 1] * big
  out = {'users': [], 'num_samples': [], 'user_data': {}}
  start = 0
  for g, size in enumerate(sizes):
    idx = picked[start:start + size]
    start += size
    u = str(first_user + g)
    out['users'].append(u)
    out['num_samples'].append(size)
    out['user_data'][u] = {'x': _stack([xs[i] for i in idx], data, 'x'),
                           'y': _stack([ys[i] for i in idx], data, 'y')}
  return out


def _stack(rows: list, data: Mapping[str, Any], key: str) -> np.ndarray:
  """``rows`` of ``data``'s ``key`` arrays as one array (empty: their shape and dtype)."""
  if rows:
    return np.stack(rows)
  ref = next(iter(data['user_data'].values()))[key]
  return np.zeros((0,) + np.shape(ref)[1:], np.asarray(ref).dtype)


def remove_users(data: Mapping[str, Any], min_samples: int) -> dict:
  """LEAF's ``remove_users.py``: keeps the users with more than ``min_samples`` samples (and
  their hierarchies)."""
  keep = [i for i, u in enumerate(data['users'])
          if len(data['user_data'][u]['y']) > min_samples]
  users = [data['users'][i] for i in keep]
  out = {'users': users, 'num_samples': [len(data['user_data'][u]['y']) for u in users],
         'user_data': {u: data['user_data'][u] for u in users}}
  if 'hierarchies' in data and len(data['hierarchies']) == len(data['users']):
    out['hierarchies'] = [data['hierarchies'][i] for i in keep]
  return out


def preprocess(parts: Sequence[Mapping[str, Any]], sampling: Sampling) -> list[dict]:
  """LEAF's sampling and user filter (``sampling``) applied to each file's dict, in order."""
  rng, next_user, out = random.Random(sampling.seed), 0, []
  for part in parts:
    if sampling.mode == 'niid':
      part = sample_niid(part, sampling.fraction, rng)
    elif sampling.mode == 'iid':
      part = sample_iid(part, sampling.fraction, sampling.iid_users, rng, next_user)
      next_user += len(part['users'])
    elif sampling.mode != 'none':
      raise ValueError(f'sampling mode must be one of {SAMPLINGS}, got {sampling.mode!r}')
    if sampling.min_samples >= 0:
      part = remove_users(part, sampling.min_samples)
    out.append(part)
  return out


# --------------------------------------------------------------------------- splitting


def _take(seq: Any, idx: Sequence[int]) -> Any:
  if isinstance(seq, np.ndarray):
    return seq[np.asarray(idx, dtype=np.int64)]
  return [seq[j] for j in idx]


def num_train_samples(n: int, train_fraction: float) -> int:
  """LEAF's train size for a user with ``n >= 2`` samples (test always keeps at least one).

  Args:
    n: the user's samples, at least 2.
    train_fraction: the share of them to train on.

  Returns:
    ``max(1, int(train_fraction * n))``, 1 when ``n == 2``.
  """
  return 1 if n == 2 else max(1, int(train_fraction * n))


def split_by_sample(
    data: Mapping[str, Any],
    train_fraction: float = 0.9,
    seed: int = DEFAULT_SPLIT_SEED,
    by_position: bool = False,
    gap: int = 0,
) -> tuple[dict, dict]:
  """Splits each user's samples into train and test with LEAF's by-sample rule.

  As LEAF's ``utils/split_data.py``: users with fewer than 2 samples are dropped; a user with
  ``n`` samples gets ``max(1, int(train_fraction * n))`` training samples (1 when ``n == 2``),
  chosen by ``rng.sample(range(n), n_train)`` with one ``random.Random(seed)`` shared by all
  users in order; train and test both keep the original sample order.

  ``by_position=True`` takes the first ``n_train`` samples as train and, after skipping
  ``gap`` samples, the rest as test (LEAF's rule for Shakespeare, with ``gap = 79``: sequence
  length 80 minus 1, so no test window overlaps a training one; no randomness). A user whose
  test part is then empty is dropped, as LEAF does.

  Args:
    data: a LEAF dict (``users``, ``num_samples``, ``user_data``; ``hierarchies`` kept).
    train_fraction: the share of each user's samples to train on, in ``(0, 1)``.
    seed: the split's seed.
    by_position: split by position instead of at random.
    gap: with ``by_position``, the samples skipped between train and test.

  Returns:
    ``(train, test)``, LEAF dicts over the users kept.

  Raises:
    ValueError: ``train_fraction`` outside ``(0, 1)``.
  """
  if not 0.0 < train_fraction < 1.0:
    raise ValueError(f'train_fraction must be in (0, 1), got {train_fraction}')
  rng = random.Random(seed)
  train = {'users': [], 'num_samples': [], 'user_data': {}}
  test = {'users': [], 'num_samples': [], 'user_data': {}}
  kept = []
  for i, u in enumerate(data['users']):
    d = data['user_data'][u]
    n = len(d['y'])
    if n < 2:
      continue
    n_train = num_train_samples(n, train_fraction)
    if by_position:
      tr, te = np.arange(n_train), np.arange(n_train + gap, n)
      if not len(te):
        continue
    else:
      is_train = np.zeros(n, dtype=bool)
      is_train[rng.sample(range(n), n_train)] = True
      tr, te = np.flatnonzero(is_train), np.flatnonzero(~is_train)
    kept.append(i)
    for part, idx in ((train, tr), (test, te)):
      part['users'].append(u)
      part['num_samples'].append(len(idx))
      part['user_data'][u] = {'x': _take(d['x'], idx), 'y': _take(d['y'], idx)}
  if 'hierarchies' in data:
    h = list(data['hierarchies'])
    h = [h[i] for i in kept] if len(h) == len(data['users']) else h
    train['hierarchies'], test['hierarchies'] = h, list(h)
  return train, test


def split_by_user(data: Mapping[str, Any], train_fraction: float = 0.9,
                  seed: int = DEFAULT_SPLIT_SEED) -> tuple[dict, dict]:
  """LEAF's by-user split (``utils/split_data.py --by_user``): ``int(train_fraction * U)`` users,
  drawn with ``random.Random(seed).sample``, keep all their samples for training; the other users
  are the test set. Both keep the file's user order."""
  if not 0.0 < train_fraction < 1.0:
    raise ValueError(f'train_fraction must be in (0, 1), got {train_fraction}')
  users = list(data['users'])
  chosen = set(random.Random(seed).sample(range(len(users)), int(train_fraction * len(users))))
  parts = ({'users': [], 'num_samples': [], 'user_data': {}},
           {'users': [], 'num_samples': [], 'user_data': {}})
  for i, u in enumerate(users):
    part = parts[0 if i in chosen else 1]
    part['users'].append(u)
    part['num_samples'].append(len(data['user_data'][u]['y']))
    part['user_data'][u] = data['user_data'][u]
  return parts
