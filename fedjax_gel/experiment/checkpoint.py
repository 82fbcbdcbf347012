"""Checkpoints of a run, to resume it after a crash with nothing lost.

A checkpoint holds the server state (model, server optimiser state and the per-client store),
the round it was taken after, and the run's bookkeeping at that round (``meta``: the length of
``metrics.jsonl``, the cumulative totals, the configuration). Nothing else is needed: every
random draw of round ``r`` comes from ``(seed, r)`` (``core.keys``), so a resumed run repeats
exactly the rounds an uninterrupted one would have run.

Format: a directory ``checkpoint-<round>/`` holding the server state as an orbax-checkpoint
(``state/``; every process writes the shards of its own devices, nothing is gathered onto one
host) and ``meta.msgpack`` (flax msgpack of ``{'payload', 'sha256'}``: the msgpack of
``{'version', 'round', 'meta', 'layout', 'state_sha256'}`` and its SHA-256; no pickle).
``state_sha256`` is the digest of ``state/``'s files (``files.digest``): a checkpoint whose
meta or state changed after it was written (a flipped bit, a file cut or swapped) is refused
with one line, and a run resumes from its last intact checkpoint (``intact_rounds``). Every
process writes into ``checkpoint-<round>.tmp/`` (created afresh, never through a link); once
orbax's save has returned on all of them (it ends with a barrier), process 0 adds the meta,
flushes it to disk and renames the directory, so a checkpoint is whole or absent. What a kill
leaves behind (a ``.tmp`` directory) is never read and goes at the next save. The last ``KEEP``
checkpoints are kept. Version-2 checkpoints (no digests) are still read.

A checkpoint resumes under any number of processes and devices: its arrays are read straight
into the new run's shardings. A per-client store split over ``D`` devices has its rows padded to
a multiple of ``D`` (``core.store.place``); read under another count, its zero padding rows are
dropped or added (``layout`` records the shapes and the device count they were written with).
"""
from __future__ import annotations

import errno
import glob
import hashlib
import os
import re
import shutil

import jax
from absl import logging as absl_logging
from flax import serialization

from fedjax_gel.core import paths
from fedjax_gel.experiment import files
from fedjax_gel.experiment.config import ConfigError
from fedjax_gel.experiment.messages import first_line

VERSION = 3
KEEP = 2
_NAME = re.compile(r'checkpoint-(0|[1-9][0-9]*)$')   # save's names only: not checkpoint-0200


class CheckpointError(ConfigError):
  """A checkpoint that cannot be read; the message is one line naming the file, ``reason``
  what is wrong with it."""

  def __init__(self, message: str, reason: str = ''):
    super().__init__(message)
    self.reason = reason


class DamagedCheckpoint(CheckpointError):
  """A checkpoint whose files are missing, cut, unreadable or do not match their checksums (as
  opposed to an intact one of another configuration)."""


def path(workdir: str, round_idx: int) -> str:
  return os.path.join(workdir, f'checkpoint-{round_idx}')


def rounds(workdir: str) -> list[int]:
  """The rounds of the checkpoints in ``workdir``, ascending."""
  found = (_NAME.search(p) for p in glob.glob(os.path.join(workdir, 'checkpoint-*')))
  return sorted(int(m.group(1)) for m in found if m)


def remove(workdir: str, round_idx: int):
  """Removes the checkpoint of ``round_idx``, whole: renamed out of the way first (a
  ``.tmp`` name, never read), then deleted."""
  gone = path(workdir, round_idx) + '.removed.tmp'
  shutil.rmtree(gone, ignore_errors=True)
  os.replace(path(workdir, round_idx), gone)
  shutil.rmtree(gone)


def remove_after(workdir: str, round_idx: int):
  """Removes the checkpoints of rounds after ``round_idx``."""
  for r in rounds(workdir):
    if r > round_idx:
      remove(workdir, r)


def leftovers(workdir: str) -> list[str]:
  """What a killed save (``checkpoint-<round>.tmp``), a damaged checkpoint set aside
  (``.damaged``) or an earlier version (one ``checkpoint-<round>.msgpack`` file) left in
  ``workdir``."""
  return sorted(glob.glob(os.path.join(workdir, 'checkpoint-*.tmp')) +
                glob.glob(os.path.join(workdir, 'checkpoint-*.damaged')) +
                glob.glob(os.path.join(workdir, 'checkpoint-*.msgpack')))


def _orbax(method: str, directory: str, args_of):
  """``Checkpointer.save`` or ``.restore`` of orbax's synchronous checkpointer on
  ``directory`` with ``args_of(orbax.checkpoint)``; closed after use. Orbax's own log is
  quiet meanwhile: its writer threads log each failure (a disk that fills up during the save)
  with a traceback, pages of them, where the error it raises is told in one line."""
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top  # 0.2 s: when needed
  verbosity = absl_logging.get_verbosity()
  absl_logging.set_verbosity(absl_logging.FATAL)
  checkpointer = None
  try:
    checkpointer = ocp.Checkpointer(ocp.StandardCheckpointHandler())
    if method == 'save':
      return checkpointer.save(directory, args=args_of(ocp), force=True)
    return checkpointer.restore(directory, args=args_of(ocp))
  finally:
    if checkpointer is not None:
      checkpointer.close()
    absl_logging.set_verbosity(verbosity)


def _devices(leaves) -> int:
  """Devices the arrays of ``leaves`` span (1 for shapes without a sharding)."""
  return max([len(a.sharding.device_set) for a in leaves
              if getattr(a, 'sharding', None) is not None] + [1])


def _fresh_dir(directory: str):
  """``directory`` created empty, never through a link (what a kill or a plant left there
  goes first)."""
  if os.path.islink(directory) or os.path.isfile(directory):
    os.remove(directory)
  elif os.path.isdir(directory):
    shutil.rmtree(directory)
  os.mkdir(directory)


def save(workdir: str, round_idx: int, state, meta: dict, runtime):
  """Writes the checkpoint of ``round_idx`` (every process of ``runtime``, the command's
  ``runtime.Runtime``, its own shards; process 0 the meta) and drops all but the last
  ``KEEP``. A checkpoint of that round already there is kept (a round's state is a function
  of the round): as process 0 sees it, so that every process takes the same way (one that saw
  it late entered the save's barrier alone and waited forever)."""
  final = path(workdir, round_idx)
  if runtime.from_writer(os.path.isdir(final) and not os.path.islink(final)):
    return
  tmp = os.path.abspath(final + '.tmp')
  runtime.write(_fresh_dir, tmp)
  runtime.sync(f'checkpoint {round_idx}')
  leaves = jax.tree.leaves(state)
  _save_state(os.path.join(tmp, 'state'), state, leaves)
  if not runtime.writes:
    return
  layout = {'shapes': [list(a.shape) for a in leaves], 'devices': _devices(leaves)}
  payload = serialization.msgpack_serialize(
      {'version': VERSION, 'round': round_idx, 'meta': meta, 'layout': layout,
       'state_sha256': files.digest(os.path.join(tmp, 'state'))})
  files.write_atomic(os.path.join(tmp, 'meta.msgpack'), serialization.msgpack_serialize(
      {'payload': payload, 'sha256': hashlib.sha256(payload).hexdigest()}))
  _fsync_dir(tmp)
  os.replace(tmp, final)
  _fsync_dir(workdir)
  for old in rounds(workdir)[:-KEEP]:
    remove(workdir, old)
  for left in leftovers(workdir):   # a kill's
    if left.endswith('.tmp'):
      shutil.rmtree(left, ignore_errors=True)


# Room a checkpoint's state needs beyond twice its arrays' bytes: orbax's metadata, manifest and
# lock files (about 0.1 MB for a small model).
SAVE_SLACK_BYTES = 1 << 20


def _save_state(directory: str, state, leaves):
  """Orbax's save of ``state`` into ``directory``, on a disk with room for it: a full disk is
  an ``OSError`` (ENOSPC) naming ``directory``, raised before orbax starts where the room is
  short (its writer threads would fail with pages of tracebacks), and when orbax fails so."""
  full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), directory)
  need = 2 * sum(sum(s.data.nbytes for s in a.addressable_shards)
                 if hasattr(a, 'addressable_shards') else getattr(a, 'nbytes', 0) for a in leaves)
  if shutil.disk_usage(os.path.dirname(directory)).free < need + SAVE_SLACK_BYTES:
    raise full
  try:
    _orbax('save', directory, lambda ocp: ocp.args.StandardSave(state))
  except Exception as e:  # pylint: disable=broad-except  # tensorstore's RESOURCE_EXHAUSTED
    if 'No space left on device' in str(e) or "os_error_code='28'" in str(e):
      raise full from None
    raise


def _fsync_dir(directory: str):
  fd = os.open(directory, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def _read(file: str) -> dict:
  with paths.open_regular(file) as f:
    data = serialization.msgpack_restore(f.read())
  if isinstance(data, dict) and 'payload' in data:   # version 3: the meta's own checksum
    payload = data['payload']
    if not isinstance(payload, bytes) or hashlib.sha256(payload).hexdigest() != data.get('sha256'):
      raise ValueError('its meta does not match its checksum: damaged')
    data = serialization.msgpack_restore(payload)
  if not isinstance(data, dict) or data.get('version') not in (2, VERSION):
    raise ValueError(f'not a version-{VERSION} checkpoint')
  for k in ('round', 'meta', 'layout') + (('state_sha256',) if data['version'] == 3 else ()):
    if k not in data:
      raise ValueError(f'no {k!r}')
  return data


_VERIFIED = set()   # (state folder, its recorded digest, files.stamp) this process verified


def _verify(file: str, data: dict):
  """Compares the state's files with the digest the checkpoint was written with (version 3).
  A resumed run reads each checkpoint three times (``check``, ``intact_rounds``, ``load``); the
  state is hashed once, then again only if its files changed (``files.stamp``)."""
  if 'state_sha256' not in data:
    return
  state = os.path.abspath(os.path.join(file, 'state'))
  key = (state, data['state_sha256'], files.stamp(state))
  if key in _VERIFIED:
    return
  if files.digest(state) != data['state_sha256']:
    raise ValueError('its state does not match its checksum: damaged')
  _VERIFIED.add(key)


REMOVE = '; remove it or pass --overwrite'


def _error(file: str, e: Exception, what: str = 'damaged checkpoint',
           kind: type = DamagedCheckpoint) -> CheckpointError:
  return kind(f'{file}: {what} ({first_line(e)}){REMOVE}', first_line(e))


def _fits(layout: dict, target) -> bool:
  """Whether arrays of ``layout['shapes']`` hold ``target``'s: the same shapes, but for rows a
  split store pads (fewer than the devices of either layout)."""
  leaves = jax.tree.leaves(target)
  shapes = layout['shapes']
  if len(shapes) != len(leaves):
    raise ValueError(f'{len(shapes)} arrays where the run has {len(leaves)}')
  pad = max(layout['devices'], _devices(leaves))
  exact = True
  for saved, a in zip(shapes, leaves):
    saved = tuple(saved)
    if saved == a.shape:
      continue
    exact = False
    if len(saved) != len(a.shape) or saved[1:] != a.shape[1:] or abs(saved[0] - a.shape[0]) >= pad:
      raise ValueError(f'an array of shape {saved} where the run has {a.shape}')
  return exact


def _intact(workdir: str, round_idx: int) -> dict:
  """The checkpoint's data, read and checked: its meta and state match their checksums and it
  holds round ``round_idx`` (a copy or a rename, resumed, would skip or repeat rounds)."""
  file = path(workdir, round_idx)
  data = _read(os.path.join(file, 'meta.msgpack'))
  _verify(file, data)
  if data['round'] != round_idx:
    raise ValueError(f'it holds the state of round {data["round"]}')
  return data


def read_meta(workdir: str, round_idx: int, target) -> dict:
  """The checkpoint's meta (the bookkeeping ``save`` was given); a damaged checkpoint, or one
  holding a state of other shapes (another model or algorithm), is a CheckpointError."""
  file = path(workdir, round_idx)
  try:
    data = _intact(workdir, round_idx)
  except Exception as e:  # pylint: disable=broad-except  # any damage reads as one line
    raise _error(file, e) from None
  try:
    _fits(data['layout'], target)
  except Exception as e:  # pylint: disable=broad-except
    raise _error(file, e, "holds another configuration's state", CheckpointError) from None
  return data


def load(workdir: str, round_idx: int, target):
  """``(state, meta)`` of the checkpoint of ``round_idx``, read into ``target``'s shapes and
  shardings (arrays, or ``jax.ShapeDtypeStruct``s with shardings); see ``read_meta``."""
  data = read_meta(workdir, round_idx, target)
  file = path(workdir, round_idx)
  shapes = jax.tree.map(
      lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=getattr(a, 'sharding', None)),
      target)
  strict = _fits(data['layout'], target)
  try:
    state = _orbax('restore', os.path.join(os.path.abspath(file), 'state'),
                   lambda ocp: ocp.args.StandardRestore(shapes, strict=strict))
  except Exception as e:  # pylint: disable=broad-except
    raise _error(file, e) from None
  return state, data['meta']


def cut_metrics(workdir: str, size: int):
  """Cuts ``metrics.jsonl`` back to ``size`` bytes, as it was when the run stood where it
  resumes from (0: its start)."""
  metrics = os.path.join(workdir, 'metrics.jsonl')
  if os.path.exists(metrics):
    files.truncate(metrics, size)


def check(workdir: str, target, meta_keys: tuple) -> list[str]:
  """Reads every checkpoint in ``workdir`` before a run resumes from them: each must be intact,
  fit ``target`` (see ``read_meta``), hold ``meta_keys``, and fit the ``metrics.jsonl`` there.
  Returns a note for each damaged one when an intact one is left (the run resumes from the
  last intact one, ``intact_rounds``); a CheckpointError when none is."""
  metrics = os.path.join(workdir, 'metrics.jsonl')
  for old in glob.glob(os.path.join(workdir, 'checkpoint-*.msgpack')):
    raise CheckpointError(f'{old}: a checkpoint of an earlier fedjax_gel (one file, version 1); '
                          'remove it or pass --overwrite')
  damaged = []
  for r in rounds(workdir):
    try:
      meta = read_meta(workdir, r, target)['meta']
    except DamagedCheckpoint as e:
      damaged.append((r, e))
      continue
    missing = [k for k in ('metrics_bytes',) + tuple(meta_keys) if k not in meta]
    if missing:
      raise _error(path(workdir, r), ValueError(f'no {missing[0]!r} in its meta'),
                   'unreadable checkpoint', CheckpointError)
    size = os.path.getsize(metrics) if os.path.isfile(metrics) else -1
    if size < meta['metrics_bytes']:
      raise CheckpointError(
          f'{path(workdir, r)}: {metrics} is '
          f'{"missing" if size < 0 else "shorter than at the checkpoint"}; remove the '
          'checkpoint or pass --overwrite')
    if meta.get('metrics_sha256') and files.digest(metrics, meta['metrics_bytes']) != meta[
        'metrics_sha256']:   # checkpoints of versions before the checksum have none
      raise CheckpointError(
          f'{path(workdir, r)}: {metrics} changed before the checkpoint\'s round (its first '
          f'{meta["metrics_bytes"]} bytes do not match the checksum the checkpoint holds); '
          'restore it or pass --overwrite')
  if damaged and len(damaged) == len(rounds(workdir)):
    last = damaged[-1][1]
    if len(damaged) == 1:
      raise last
    earlier = ', '.join(os.path.basename(path(workdir, r)) for r, _ in damaged[:-1])
    raise type(last)(f'{str(last).removesuffix(REMOVE)}; every checkpoint is damaged (the '
                     f'earlier {earlier} too): remove them or pass --overwrite')
  return [f'{path(workdir, r)} is damaged ({e.reason}); the run resumes from its last intact '
          'checkpoint and sets this one aside (.damaged)' for r, e in damaged]


def intact_rounds(workdir: str, set_aside: bool = True) -> list[int]:
  """``rounds`` of the intact checkpoints (``_intact``); where ``set_aside`` (the writing
  process), the damaged ones are renamed ``checkpoint-<round>.damaged`` (kept for inspection,
  never read)."""
  good = []
  for r in rounds(workdir):
    file = path(workdir, r)
    try:
      _intact(workdir, r)
      good.append(r)
    except Exception:  # pylint: disable=broad-except
      if set_aside:
        shutil.rmtree(file + '.damaged', ignore_errors=True)
        os.replace(file, file + '.damaged')
  return good
