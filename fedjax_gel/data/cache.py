"""A disk cache of generated datasets (LEAF Synthetic, FedProx Synthetic).

Generating LEAF Synthetic as LEAF's generator does (Python's ``random``, one user at a time) and
splitting it takes about half a second, every run. ``cached_split`` keeps the split pools in one
``.npz`` file per setting and reads it back in a few milliseconds. The file's name is a hash of
the settings *and of the source code of the modules that generate and split the data*, so a
change to a generator can never serve stale data. Files are written whole or not at all; one
that cannot be read is generated and written again.

The cache lives in ``$FEDJAX_GEL_DATA_CACHE`` if set (empty: off), else
``$XDG_CACHE_HOME/fedjax_gel/data`` (``~/.cache/fedjax_gel/data``); delete it to clear it.
"""
from __future__ import annotations

import hashlib
import json
import os
import zipfile
from typing import Callable, Sequence

import numpy as np

from fedjax_gel.core import paths
from fedjax_gel.core.federated_data import FederatedData, FederatedSplit

ENV = 'FEDJAX_GEL_DATA_CACHE'


def default_dir() -> str:
  return paths.user_cache_dir(ENV, 'data')


def file_name(name: str, settings: dict, sources: Sequence) -> str:
  """``<name>-<hash of settings and of the modules' source files>.npz``."""
  digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
  for module in sources:
    with open(module.__file__, 'rb') as f:
      digest.update(f.read())
  return f'{name}-{digest.hexdigest()[:20]}.npz'


def _arrays(split: FederatedSplit) -> dict:
  out = {}
  for part in ('train', 'test'):
    data = getattr(split, part)
    out.update({f'{part}/x/{k}': np.asarray(v) for k, v in data.examples.items()})
    out[f'{part}/offsets'] = np.asarray(data.offsets)
    out[f'{part}/counts'] = np.asarray(data.counts)
    out[f'{part}/names'] = np.asarray(data.client_names, dtype=str)
  return out


def _split(arrays) -> FederatedSplit:
  parts = {}
  for part in ('train', 'test'):
    examples = {k.split('/', 2)[2]: arrays[k] for k in arrays.files
                if k.startswith(f'{part}/x/')}
    parts[part] = FederatedData(examples, arrays[f'{part}/offsets'], arrays[f'{part}/counts'],
                                tuple(str(n) for n in arrays[f'{part}/names']))
  return FederatedSplit(**parts)


def cached_split(name: str, settings: dict, sources: Sequence,
                 build: Callable[[], FederatedSplit], folder: str | None = None
                 ) -> FederatedSplit:
  """``build()``'s split, from the cache when it holds this ``name``, ``settings`` and source
  code; otherwise built and stored. ``folder`` (default ``default_dir()``): ``''`` is off."""
  folder = default_dir() if folder is None else folder
  if not folder:
    return build()
  path = os.path.join(folder, file_name(name, settings, sources))
  try:   # absent, damaged (empty, cut, a bad checksum), of another layout or not a regular
    # file (a named pipe, never waited on: replaced below): built
    with paths.open_regular(path) as f, np.load(f) as arrays:
      return _split(arrays)
  except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
    pass
  split = build()
  try:
    os.makedirs(folder, exist_ok=True)
    tmp = f'{path}.{os.getpid()}.tmp'
    with open(tmp, 'wb') as f:
      np.savez(f, **_arrays(split))
    os.replace(tmp, path)
  except OSError:   # a cache that cannot be written only costs the next run the time
    pass
  return split
