"""Checkpoints of a run, to resume it after a crash with nothing lost.

A checkpoint holds the server state (model, server optimiser state and the per-client store),
the round it was taken after, and the run's bookkeeping at that round (``meta``: the length of
``metrics.jsonl``, the cumulative totals, the configuration). Nothing else is needed: every
random draw of round ``r`` comes from ``(seed, r)`` (``core.keys``), so a resumed run repeats
exactly the rounds an uninterrupted one would have run.

Format: flax's msgpack serialisation of ``{'version', 'round', 'state', 'meta'}`` (no pickle),
written to a temporary file, flushed to disk and renamed over ``checkpoint-<round>.msgpack``, so
a checkpoint is whole or absent. The last ``KEEP`` checkpoints are kept.
"""
from __future__ import annotations

import glob
import os
import re

import jax
from flax import serialization

from fedjax_gel.core import devices
from fedjax_gel.experiment import cluster
from fedjax_gel.experiment.config import ConfigError

VERSION = 1
KEEP = 2
_NAME = re.compile(r'checkpoint-(\d+)\.msgpack$')


class CheckpointError(ConfigError):
  """A checkpoint that cannot be read; the message is one line naming the file."""


def path(workdir: str, round_idx: int) -> str:
  return os.path.join(workdir, f'checkpoint-{round_idx}.msgpack')


def rounds(workdir: str) -> list[int]:
  """The rounds of the checkpoints in ``workdir``, ascending."""
  found = (_NAME.search(p) for p in glob.glob(os.path.join(workdir, 'checkpoint-*.msgpack')))
  return sorted(int(m.group(1)) for m in found if m)


def write_atomic(file: str, data: bytes):
  """Writes ``file`` whole or not at all: a temporary file, flushed to disk, renamed over it.
  Only the writing process writes (``cluster.writes``)."""
  if not cluster.writes():
    return
  tmp = file + '.tmp'
  with open(tmp, 'wb') as f:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, file)


def save(workdir: str, round_idx: int, state, meta: dict):
  """Writes the checkpoint of ``round_idx`` and drops all but the last ``KEEP`` (the writing
  process; the others keep nothing)."""
  if not cluster.writes():
    return
  data = serialization.msgpack_serialize({
      'version': VERSION, 'round': round_idx, 'meta': meta,
      'state': serialization.to_state_dict(devices.to_host(state))})
  write_atomic(path(workdir, round_idx), data)
  for old in rounds(workdir)[:-KEEP]:
    os.remove(path(workdir, old))


def _read(file: str) -> dict:
  with open(file, 'rb') as f:
    data = serialization.msgpack_restore(f.read())
  if not isinstance(data, dict) or data.get('version') != VERSION:
    raise ValueError(f'not a version-{VERSION} checkpoint')
  for k in ('round', 'meta', 'state'):
    if k not in data:
      raise ValueError(f'no {k!r}')
  return data


def _error(file: str, e: Exception, what: str = 'unreadable checkpoint') -> CheckpointError:
  reason = str(e).splitlines()[0] if str(e) else type(e).__name__
  return CheckpointError(f'{file}: {what} ({reason}); remove it or pass --overwrite')


def load(workdir: str, round_idx: int, target):
  """``(state, meta)`` of the checkpoint of ``round_idx``; ``target`` gives the state's structure
  (a freshly initialised state, or its shapes). A damaged file, or one holding a state of other
  shapes (another model or algorithm), is a CheckpointError."""
  file = path(workdir, round_idx)
  try:
    data = _read(file)
  except Exception as e:  # pylint: disable=broad-except  # any damage reads as one line
    raise _error(file, e) from None
  try:
    state = serialization.from_state_dict(target, data['state'])
    for a, b in zip(jax.tree.leaves(target), jax.tree.leaves(state)):
      if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f'an array of shape {b.shape} {b.dtype} where the run has {a.shape} '
                         f'{a.dtype}')
  except Exception as e:  # pylint: disable=broad-except
    raise _error(file, e, "holds another configuration's state") from None
  return state, data['meta']


def restore(workdir: str, round_idx: int, target):
  """``load``, and ``metrics.jsonl`` cut back to its length at the checkpoint (the lines of
  later rounds are written again as the run resumes)."""
  state, meta = load(workdir, round_idx, target)
  if cluster.writes():
    with open(os.path.join(workdir, 'metrics.jsonl'), 'rb+') as f:
      f.truncate(meta['metrics_bytes'])
  return state, meta


def check(workdir: str, target, meta_keys: tuple):
  """Reads every checkpoint in ``workdir`` before a run resumes from them: each must fit
  ``target`` (see ``load``), hold ``meta_keys``, and fit the ``metrics.jsonl`` there."""
  metrics = os.path.join(workdir, 'metrics.jsonl')
  for r in rounds(workdir):
    _, meta = load(workdir, r, target)
    missing = [k for k in ('metrics_bytes',) + tuple(meta_keys) if k not in meta]
    if missing:
      raise _error(path(workdir, r), ValueError(f'no {missing[0]!r} in its meta'))
    size = os.path.getsize(metrics) if os.path.isfile(metrics) else -1
    if size < meta['metrics_bytes']:
      raise CheckpointError(
          f'{path(workdir, r)}: {metrics} is {"missing" if size < 0 else "shorter"} than at '
          'the checkpoint; remove the checkpoint or pass --overwrite')
