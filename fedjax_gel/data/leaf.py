"""LEAF JSON files: reading, writing, LEAF's train/test split, and conversion to pools.

A LEAF file is ``{'users': [...], 'num_samples': [...], 'user_data': {user: {'x': [...],
'y': [...]}}}``, optionally with ``'hierarchies'``. Here user data is held as numpy arrays:
numeric features as float64 ``[n, ...]``, string features (Shakespeare) as unicode ``[n]``,
labels as int64 (integer-valued floats such as FedProx's ``4.0`` included) or unicode ``[n]``.

Split seed: LEAF's ``utils/split_data.py`` defaults to a time-based seed (``int(time.time())``),
so its splits are not reproducible unless a seed is given; this module defaults to
``DEFAULT_SPLIT_SEED`` instead.
"""
from __future__ import annotations

import json
import numbers
import os
import random
import sys
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

import numpy as np

from fedjax_gel.core.federated_data import FederatedData, FederatedSplit, from_client_arrays

DEFAULT_SPLIT_SEED = 931231

PathLike = str | os.PathLike
_SEQUENCES = (list, tuple, np.ndarray)


class DataError(ValueError):
  """A LEAF file or dict that cannot be used; the message names the source and the problem, on
  one line (line breaks, e.g. from a file name or a library's message, become spaces)."""

  def __init__(self, message: str):
    super().__init__(' '.join(str(message).splitlines()))


INT32_MAX = 2**31 - 1


# --------------------------------------------------------------------------- validation


def _user_arrays(x: Any, y: Any, source: str, user: str) -> tuple[np.ndarray, np.ndarray]:
  """Checks one user's samples and returns them as (features, labels) numpy arrays."""
  where = f'{source}: user {user!r}'
  if not isinstance(x, _SEQUENCES) or not isinstance(y, _SEQUENCES):
    raise DataError(f"{where} needs lists for 'x' and 'y', got {type(x).__name__} and "
                    f'{type(y).__name__}')
  if len(x) != len(y):
    raise DataError(f'{where} has {len(x)} samples in x but {len(y)} in y')
  return _features(x, where), _labels(y, where)


def _features(x: Any, where: str) -> np.ndarray:
  """Features as an array; refuses ragged rows (rows of different lengths), non-numbers, values
  that are not finite or too large for a float, and empty rows (``[[], []]``)."""
  if isinstance(x, np.ndarray) and x.dtype.kind in 'fiuU':
    return _nonempty_rows(x.astype(np.float64) if x.dtype.kind in 'iu' else x, where)
  x = list(x)
  if x and all(isinstance(v, str) for v in x):
    return np.array(x, dtype=str)
  if x and all(isinstance(v, (list, tuple)) and v and all(isinstance(t, str) for t in v)
               for v in x):   # Sent140: [id, date, query, user, text] per sample
    if len({len(v) for v in x}) != 1:
      raise DataError(f'{where} has string features of different lengths in x')
    return np.array(x, dtype=str)
  try:
    arr = np.asarray(x, dtype=np.float64)
  except OverflowError:
    raise DataError(f'{where} has a feature value too large for a float in x') from None
  except (ValueError, TypeError):
    raise DataError(f'{where} has ragged or non-numeric features in x') from None
  if not np.isfinite(arr).all():
    raise DataError(f'{where} has null, NaN or infinite feature values in x')
  return _nonempty_rows(arr, where)


def _nonempty_rows(x: np.ndarray, where: str) -> np.ndarray:
  """``x`` itself; refuses samples whose features hold no value (rows of length 0)."""
  if len(x) and x.ndim > 1 and x.size == 0:
    raise DataError(f'{where} has empty feature rows in x (shape {x.shape[1:]} per sample)')
  return x


def _labels(y: Any, where: str) -> np.ndarray:
  """Labels as int64 or strings; refuses other values (``true`` and ``null`` included),
  non-integers (``1.5``) and class labels outside ``0 .. 2**31 - 1`` (negative, or too large
  for int32: ``2**32 + 1``, ``1e20``)."""
  if isinstance(y, np.ndarray) and y.dtype.kind in 'iuU':
    return _class_labels(y.astype(np.int64), y, where) if y.dtype.kind in 'iu' else y
  y = list(y)
  if y and all(isinstance(v, str) for v in y):
    return np.array(y, dtype=str)
  if not all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in y):
    raise DataError(f'{where} has labels that are neither numbers nor strings')
  try:
    arr = np.asarray(y, dtype=np.float64)
  except OverflowError:
    raise DataError(f'{where} has a label too large for a class label (0 to {INT32_MAX})'
                    ) from None
  except (ValueError, TypeError):
    raise DataError(f'{where} has labels that are neither numbers nor strings') from None
  if arr.ndim != 1:
    raise DataError(f'{where} has labels of shape {arr.shape}, expected one label per sample')
  bad = ~np.isfinite(arr) | (arr != np.round(arr))
  if bad.any():
    j = int(np.argmax(bad))
    raise DataError(f'{where} has a non-integer label {float(arr[j])!r} (sample {j})')
  return _class_labels(arr, y, where).astype(np.int64)


def _class_labels(arr: np.ndarray, y: Any, where: str) -> np.ndarray:
  """``arr`` itself; refuses labels outside ``0 .. INT32_MAX`` (``y``: the labels as given)."""
  bad = (arr < 0) | (arr > INT32_MAX)
  if bad.any():
    j = int(np.argmax(bad))
    raise DataError(f'{where} has label {y[j]!r} (sample {j}); class labels must be integers '
                    f'from 0 to {INT32_MAX}')
  return arr


def _check_feature_shapes(data: Mapping[str, Any], sources: Mapping[str, str],
                          ref: tuple | None = None) -> tuple | None:
  """Refuses users (with samples) whose feature shape or kind differs from the first user's, or
  from ``ref`` when given (another part's, e.g. the train files' for the test files). Returns
  the reference, ``(source, user, (shape, strings))``; None without samples."""
  for u in data['users']:
    x = data['user_data'][u]['x']
    if len(x) == 0:
      continue
    sig, where = (x.shape[1:], x.dtype.kind == 'U'), sources.get(u, 'data')
    if ref is None:
      ref = (where, u, sig)
    elif sig != ref[2]:
      other = f'user {ref[1]!r}' + (f' of {ref[0]}' if ref[0] != where else '')
      raise DataError(
          f'{where}: user {u!r} has features of shape {x.shape[1:]} '
          f'({"strings" if sig[1] else "numbers"}) but {other} has {ref[2][0]} '
          f'({"strings" if ref[2][1] else "numbers"})')
  return ref


def _check_file(raw: Any, path: str) -> dict:
  """Validates one parsed LEAF file and returns it with numpy user data. Refuses a top level
  that is not an object, ``users`` not a list of strings, ``user_data`` not an object,
  ``num_samples`` not non-negative integers (one per user, each the user's count),
  ``hierarchies`` not a list or shorter than ``users`` (LEAF's split output keeps the entries of
  the users it dropped, so a longer one is kept), and bad user data (``_user_arrays``)."""
  if not isinstance(raw, dict):
    raise DataError(f'{path}: expected a JSON object, got {type(raw).__name__}')
  for key in ('users', 'user_data'):
    if key not in raw:
      raise DataError(f"{path}: missing key {key!r}")
  users, user_data = raw['users'], raw['user_data']
  if not isinstance(users, list):
    raise DataError(f"{path}: 'users' must be a list, got {type(users).__name__}")
  if not isinstance(user_data, dict):
    raise DataError(f"{path}: 'user_data' must be an object, got {type(user_data).__name__}")
  if not all(isinstance(u, str) for u in users):
    raise DataError(f"{path}: 'users' must be a list of user names (strings)")
  num_samples = raw.get('num_samples')
  if num_samples is not None and not (isinstance(num_samples, list) and all(
      isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in num_samples)):
    raise DataError(f"{path}: 'num_samples' must be a list of integers, none negative")
  if num_samples is not None and len(num_samples) != len(users):
    raise DataError(f"{path}: 'num_samples' has {len(num_samples)} entries for {len(users)} users")
  out = {}
  for i, u in enumerate(users):
    d = user_data.get(u)
    if not isinstance(d, dict) or 'x' not in d or 'y' not in d:
      raise DataError(f"{path}: user {u!r} has no 'x'/'y' entry in 'user_data'")
    x, y = _user_arrays(d['x'], d['y'], path, u)
    if num_samples is not None and num_samples[i] != len(y):
      raise DataError(
          f"{path}: 'num_samples' says {num_samples[i]} for user {u!r} but it has {len(y)}")
    out[u] = {'x': x, 'y': y}
  counts = [len(out[u]['y']) for u in users]
  result = {'users': list(users), 'num_samples': counts, 'user_data': out}
  if 'hierarchies' in raw:
    hierarchies = raw['hierarchies']
    if not isinstance(hierarchies, list):
      raise DataError(f"{path}: 'hierarchies' must be a list, got {type(hierarchies).__name__}")
    if len(hierarchies) < len(users):
      raise DataError(f"{path}: 'hierarchies' has {len(hierarchies)} entries for "
                      f'{len(users)} users')
    result['hierarchies'] = list(hierarchies)
  return result


# --------------------------------------------------------------------------- reading / writing


def _json_files(paths: PathLike | Iterable[PathLike]) -> list[str]:
  """Expands ``paths`` (files and/or directories of ``*.json``) to files sorted by name."""
  if isinstance(paths, (str, os.PathLike)):
    paths = [paths]
  files = []
  for p in map(os.fspath, paths):
    if os.path.isdir(p):
      try:
        found = [os.path.join(p, f) for f in os.listdir(p) if f.endswith('.json')]
      except OSError as e:
        raise DataError(f'{p}: cannot list the directory ({e.strerror or e})') from None
      if not found:
        raise DataError(f'{p}: directory holds no .json files')
      files.extend(found)
    else:
      files.append(p)
  if not files:
    raise DataError('no LEAF files given')
  return sorted(files, key=lambda f: (os.path.basename(f), f))


def _read_one(path: str) -> dict:
  """One LEAF file, checked (``_check_file``). Refuses a missing or unreadable file, invalid
  JSON, JSON nested too deeply for Python's parser, and numbers it cannot convert."""
  try:
    with open(path, encoding='utf-8') as f:
      raw = json.load(f)
  except FileNotFoundError:
    raise DataError(f'{path}: no such file') from None
  except json.JSONDecodeError as e:
    raise DataError(
        f'{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})') from None
  except RecursionError:
    raise DataError(f'{path}: JSON nested too deeply to read (over about '
                    f'{sys.getrecursionlimit()} levels)') from None
  except (OSError, UnicodeDecodeError) as e:
    raise DataError(f'{path}: cannot be read ({e})') from None
  except ValueError as e:   # e.g. an integer of more digits than Python converts
    raise DataError(f'{path}: not valid JSON ({str(e).split(";")[0]})') from None
  return _check_file(raw, path)


def read_leaf_json(paths: PathLike | Iterable[PathLike], sampling=None) -> dict:
  """Reads and merges LEAF JSON files (or directories of them) into one LEAF dict.

  Files are taken in order of their names and users in file order. ``'hierarchies'`` is kept
  when every file has it (concatenated as found: LEAF's own split output keeps the entries of
  dropped users, so a file's may be longer than its ``'users'``, not shorter). ``sampling``:
  LEAF's sampling and user filter (``Sampling``), applied to each file as LEAF's
  ``preprocess.sh`` does, before the merge. Raises ``DataError`` naming the file on any problem.
  """
  return _read_merged(paths, sampling)[0]


def _read_merged(paths: PathLike | Iterable[PathLike], sampling=None, ref: tuple | None = None
                 ) -> tuple[dict, tuple | None]:
  """``read_leaf_json``, and the reference of its feature shape (``_check_feature_shapes``:
  ``ref``, when given, is the shape every user must have)."""
  merged = {'users': [], 'num_samples': [], 'user_data': {}}
  hierarchies, sources = [], {}
  files = _json_files(paths)
  parts = [_read_one(path) for path in files]
  if sampling is not None and sampling.active:
    parts = preprocess(parts, sampling)
  for path, part in zip(files, parts):
    for u in part['users']:
      if u in sources:
        raise DataError(f'{path}: user {u!r} already appears in {sources[u]}')
      sources[u] = path
    merged['users'] += part['users']
    merged['num_samples'] += part['num_samples']
    merged['user_data'].update(part['user_data'])
    hierarchies = None if hierarchies is None or 'hierarchies' not in part else (
        hierarchies + part['hierarchies'])
  if hierarchies is not None:
    merged['hierarchies'] = hierarchies
  return merged, _check_feature_shapes(merged, sources, ref)


def _jsonable(v: Any) -> Any:
  return v.tolist() if isinstance(v, np.ndarray) else v


def write_leaf_json(data: Mapping[str, Any], path: PathLike) -> None:
  """Writes a LEAF dict to ``path`` in LEAF's own format (plain lists, ``json.dump``)."""
  out = {'users': [str(u) for u in data['users']]}
  if 'hierarchies' in data:
    out['hierarchies'] = _jsonable(data['hierarchies'])
  out['num_samples'] = [int(n) for n in data['num_samples']]
  out['user_data'] = {
      u: {'x': _jsonable(data['user_data'][u]['x']), 'y': _jsonable(data['user_data'][u]['y'])}
      for u in out['users']}
  parent = os.path.dirname(os.fspath(path))
  if parent:
    os.makedirs(parent, exist_ok=True)
  with open(path, 'w', encoding='utf-8') as f:
    json.dump(out, f)


# --------------------------------------------------------------------------- sampling


SAMPLINGS = ('none', 'niid', 'iid')


class Sampling(NamedTuple):
  """LEAF's ``preprocess.sh`` steps before its split, on raw ``all_data`` files: ``-s niid|iid
  --sf fraction [--iu users]`` (``utils/sample.py``), then ``-k min_samples``
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
  """LEAF's train size for a user with ``n >= 2`` samples (test always keeps at least one)."""
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


# --------------------------------------------------------------------------- pools


def _client(d: Mapping[str, Any], source: str, user: str) -> dict:
  x, y = _user_arrays(d['x'], d['y'], source, user)
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
  """Turns LEAF train/test dicts into a ``FederatedSplit``: over the users present in both
  (``same_users``, a by-sample split), or over each dict's own users (a by-user split, whose
  test clients are held-out users).

  Users keep the dicts' order. Examples are ``{'x', 'y'}``: numeric features as float32,
  string features as unicode arrays (left for a task to encode); labels as int32 (integer-valued
  floats accepted) or unicode arrays for string labels.
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


def load(
    path: PathLike,
    train_fraction: float = 0.9,
    seed: int = DEFAULT_SPLIT_SEED,
    split: str = 'sample',
    gap: int = 0,
    sampling: Sampling = Sampling(),
) -> FederatedSplit:
  """Loads LEAF data as a ``FederatedSplit``.

  ``path`` is either one LEAF JSON file (or a directory of them, such as LEAF's ``all_data/``:
  FEMNIST's many files are merged), split by LEAF's rules: ``split='sample'`` (each user's
  samples at random, ``split_by_sample``), ``'position'`` (each user's first samples for
  training, then ``gap`` skipped: Shakespeare) or ``'user'`` (held-out users,
  ``split_by_user``); or a directory with ``train/`` and ``test/`` sub-directories of LEAF JSON
  files (LEAF's split output), joined by user name (their features must have one shape), and
  the split arguments are unused.
  ``sampling``: LEAF's sampling and user filter of raw files before the split (``Sampling``;
  not for ``train/`` and ``test/``, which LEAF wrote after them).
  """
  if split not in SPLITS:
    raise ValueError(f'split must be one of {SPLITS}, got {split!r}')
  path = os.fspath(path)
  if not os.path.exists(path):
    raise DataError(f'{path}: no such file or directory')
  train_dir, test_dir = os.path.join(path, 'train'), os.path.join(path, 'test')
  if os.path.isdir(train_dir) and os.path.isdir(test_dir):
    if sampling.active:
      raise DataError(f'{path}: holds train/ and test/, which LEAF samples and filters before it '
                      'splits; point at its raw all_data/ to sample here')
    train, ref = _read_merged(train_dir)
    test, _ = _read_merged(test_dir, ref=ref)
    if not set(train['users']) & set(test['users']):
      raise DataError(f'{train_dir} and {test_dir}: no user in common')
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
    raise DataError(f'{path}: no user has both train and test samples after the {rule}')
  return to_federated(train, test)
