"""LEAF JSON files: reading (every file checked, one ``DataError`` line naming the file and
the problem), merging and writing.

A LEAF file is ``{'users': [...], 'num_samples': [...], 'user_data': {user: {'x': [...],
'y': [...]}}}``, optionally with ``'hierarchies'``. Here user data is held as numpy arrays:
numeric features as float64 ``[n, ...]``, string features (Shakespeare) as unicode ``[n]``,
labels as int64 (integer-valued floats such as FedProx's ``4.0`` included) or unicode ``[n]``.
"""
from __future__ import annotations

import json
import numbers
import os
import sys
from typing import Any, Iterable, Mapping

import numpy as np

from fedjax_gel.core.paths import not_regular, open_regular
from fedjax_gel.core.checks import INT32_MAX
from fedjax_gel.data.errors import DataError
from fedjax_gel.data.leaf_preprocess import preprocess

PathLike = str | os.PathLike
_SEQUENCES = (list, tuple, np.ndarray)


# --------------------------------------------------------------------------- validation


def user_arrays(x: Any, y: Any, source: str, user: str) -> tuple[np.ndarray, np.ndarray]:
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
  if isinstance(x, np.ndarray) and x.dtype.kind == 'U':
    return _nonempty_rows(x, where)
  if isinstance(x, np.ndarray) and x.dtype.kind in 'fiu':
    return _in_float32(x.astype(np.float64) if x.dtype.kind in 'iu' else x, where)
  x = list(x)
  if x and all(isinstance(v, str) for v in x):
    return np.array(x, dtype=str)
  if x and all(isinstance(v, (list, tuple)) and v and all(isinstance(t, str) for t in v)
               for v in x):   # Sent140: [id, date, query, user, text] per sample
    if len({len(v) for v in x}) != 1:
      raise DataError(f'{where} has string features of different lengths in x')
    return np.array(x, dtype=str)
  if _has_bool(x):   # NumPy would read true as 1.0 beside numbers
    raise DataError(f'{where} has true/false among the features in x; features must be numbers')
  try:
    arr = np.asarray(x)   # not dtype=float64 at once: that would read "0.5" as 0.5
    if arr.dtype.kind == 'O':   # ragged rows, or integers beyond int64
      arr = np.asarray(x, dtype=np.float64)
  except OverflowError:
    raise DataError(f'{where} has a feature value too large for a float in x') from None
  except (ValueError, TypeError):
    raise DataError(f'{where} has ragged or non-numeric features in x') from None
  if arr.dtype.kind not in 'fiu':   # strings among the numbers, or only booleans
    raise DataError(f'{where} has ragged or non-numeric features in x (got {arr.dtype} values)')
  return _in_float32(arr.astype(np.float64), where)


def _has_bool(values) -> bool:
  """Whether a truth value (JSON's true or false, a NumPy bool or an array of them) is among
  ``values`` (nested lists, tuples, arrays), by the types of each sequence (a few percent of
  parsing the JSON)."""
  if isinstance(values, np.ndarray):
    return values.dtype.kind == 'b' or (values.dtype.kind == 'O' and _has_bool(list(values)))
  types = set(map(type, values))
  if types & {bool, np.bool_}:
    return True
  nested = (list, tuple, np.ndarray)
  return bool(types & set(nested)) and any(_has_bool(v) for v in values if isinstance(v, nested))


def _in_float32(arr: np.ndarray, where: str) -> np.ndarray:
  """``arr`` itself; refuses values that are not finite, or beyond float32's range (the
  device's features: they would turn infinite there)."""
  if not np.isfinite(arr).all():
    raise DataError(f'{where} has null, NaN or infinite feature values in x')
  if arr.size and np.abs(arr).max() > np.finfo(np.float32).max:
    raise DataError(f'{where} has a feature value beyond float32\'s range (about 3.4e38) in x: '
                    f'{np.abs(arr).max():.3g}')
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
  odd = [j for j, v in enumerate(y) if not isinstance(v, numbers.Real) or isinstance(v, bool)]
  if odd:
    kinds = 'numbers and strings mixed' if any(isinstance(v, str) for v in y) else (
        'labels that are neither numbers nor strings')
    raise DataError(f'{where} has {kinds}: label {repr(y[odd[0]])[:40]} (sample {odd[0]})')
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
  if len(set(users)) != len(users):
    twice = next(u for i, u in enumerate(users) if u in users[:i])
    raise DataError(f"{path}: user {twice!r} is listed twice in 'users'")
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
    x, y = user_arrays(d['x'], d['y'], path, u)
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


class _RepeatedKey(ValueError):
  """A JSON object names one key twice (Python's parser would keep the last silently)."""


def _object(pairs: list) -> dict:
  """``json``'s ``object_pairs_hook``: the object as a dict, refusing a repeated key."""
  out = dict(pairs)
  if len(out) != len(pairs):
    seen = set()
    raise _RepeatedKey(next(k for k, _ in pairs if k in seen or seen.add(k)))
  return out


def _read_one(path: str) -> dict:
  """One LEAF file, checked (``_check_file``). Refuses a missing or unreadable file, invalid
  JSON, a key repeated in one object, JSON nested too deeply for Python's parser, and numbers it
  cannot convert."""
  problem = not_regular(path)   # a named pipe would be waited on, /dev/zero read forever
  if problem:
    raise DataError(f'{path}: {problem}')
  try:
    with open_regular(path, 'r', encoding='utf-8') as f:
      raw = json.load(f, object_pairs_hook=_object)
  except FileNotFoundError:
    reason = 'a symbolic link to nothing' if os.path.islink(path) else 'no such file'
    raise DataError(f'{path}: {reason}') from None
  except json.JSONDecodeError as e:
    raise DataError(
        f'{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})') from None
  except RecursionError:
    raise DataError(f'{path}: JSON nested too deeply to read (over about '
                    f'{sys.getrecursionlimit()} levels)') from None
  except (OSError, UnicodeDecodeError) as e:
    raise DataError(f'{path}: cannot be read ({e})') from None
  except _RepeatedKey as e:
    raise DataError(f'{path}: the key {e.args[0]!r} appears twice in one JSON object (a user '
                    'named twice in user_data would lose one of its copies)') from None
  except ValueError as e:   # e.g. an integer of more digits than Python converts
    raise DataError(f'{path}: not valid JSON ({str(e).split(";")[0]})') from None
  return _check_file(raw, path)


def read_leaf_json(paths: PathLike | Iterable[PathLike], sampling=None) -> dict:
  """Reads and merges LEAF JSON files (or directories of them) into one LEAF dict.

  Files are taken in order of their names and users in file order. ``'hierarchies'`` is kept
  when every file has it (concatenated as found: LEAF's own split output keeps the entries of
  dropped users, so a file's may be longer than its ``'users'``, not shorter). ``sampling``:
  LEAF's sampling and user filter (``Sampling``), applied to each file as LEAF's
  ``preprocess.sh`` does, before the merge.

  Args:
    paths: a LEAF JSON file or a directory of them, or several.
    sampling: LEAF's sampling and user filter (``Sampling``); None: neither.

  Returns:
    The merged LEAF dict (``users``, ``num_samples``, ``user_data``, maybe ``hierarchies``).

  Raises:
    DataError: any problem, naming the file (unreadable, not LEAF's format, a user twice,
      features of different shapes).
  """
  return read_merged(paths, sampling)[0]


def read_merged(paths: PathLike | Iterable[PathLike], sampling=None, ref: tuple | None = None
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
  """Writes a LEAF dict to a file in LEAF's own format (plain lists, ``json.dump``).

  Args:
    data: the LEAF dict (``users``, ``num_samples``, ``user_data``; ``hierarchies`` kept).
    path: the file; its folder is made if missing.
  """
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
