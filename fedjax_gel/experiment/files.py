"""Files in a work directory: written whole, never through a symbolic link, by one process.

* ``write_atomic``: a file whole or not at all: a temporary file created exclusively next to it
  (``O_EXCL``: a name planted there is never opened), flushed to disk, renamed over the file (a
  rename replaces a link itself, never what it points to).
* ``open_append`` / ``open_new``: a file to append to or to start empty, opened with
  ``O_NOFOLLOW``: a link planted at its name is an error (``ELOOP``), not a write elsewhere;
  and only a regular file, without blocking (``core.paths.regular_fd``): a named pipe planted
  there is an error, not a wait for a reader. Every file read back is opened so too
  (``core.paths.open_regular``).
* ``check_outputs``: refuses a work directory in which an output's name (or ``plots/``,
  ``tensorboard/``, a checkpoint or a file in one) is a symbolic link, a special file (a named
  pipe, a device, a socket) or of the wrong kind (a file where a folder goes, or the reverse),
  before anything is written; ``check_writable`` one where a run to train could not write.
* ``lock``: one writer per work directory: an advisory ``flock`` of the directory, held until
  the run ends or the process exits (whatever the way: the kernel releases it, so a killed run
  leaves no stale lock); ``WORKDIR/.lock`` names the holder for the processes it refuses while
  the run lasts.
* ``digest``: the SHA-256 of a file or of a folder's files (checkpoints and finished outputs
  carry theirs, verified when they are read back); ``stamp``: what any write to a folder's
  files changes (their names, sizes, inodes and change times), so that a digest verified once
  need not be computed again while the stamp holds.
* ``write_json`` / ``read_json`` / ``json_line``: JSON files and ``metrics.jsonl`` lines (NaN and
  infinities written as null, ``finite``), read back only from regular files.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import math
import os
import re
import resource
import socket
import stat
import sys
import tempfile
import time

from fedjax_gel.core import paths
from fedjax_gel.experiment.config import ConfigError

LOCK = '.lock'
# What a work directory holds that fedjax_gel writes (beside checkpoint-<round>/ folders).
OUTPUTS = ('config.json', 'metrics.jsonl', 'metrics.csv', 'summary.json', 'grid.json',
           'model.msgpack', 'report.md', 'runs.json', 'plots', 'tensorboard', LOCK)
FOLDERS = ('plots', 'tensorboard')   # the folders among them
_held: dict[str, int] = {}   # work directory -> the descriptor holding its lock
_UMASK = os.umask(0o022)
os.umask(_UMASK)


@contextlib.contextmanager
def naming(path: str):
  """An ``OSError`` raised inside that names no file (a write's, a flush's or a close's: a
  full disk) is raised again naming ``path``, so that its one line says which file."""
  try:
    yield
  except OSError as e:
    if e.filename is None and e.errno is not None:
      raise OSError(e.errno, e.strerror, path) from e
    raise


def write_atomic(path: str, data: bytes):
  """Writes ``path`` whole or not at all (see the module doc)."""
  directory = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(prefix=f'.{os.path.basename(path)}.', suffix='.tmp', dir=directory)
  try:
    os.fchmod(fd, 0o666 & ~_UMASK)   # as open() would create it (mkstemp: owner only)
    with naming(path), os.fdopen(fd, 'wb') as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.lexists(tmp):
      os.remove(tmp)
    raise


# write_atomic's temporaries: '.NAME.' + tempfile's 8 random characters + '.tmp'.
_TEMPORARY = re.compile(r'\.(.+)\.[a-z0-9_]{8}\.tmp')


def target_of(path: str) -> str:
  """The file that ``path`` is written for when it is ``write_atomic``'s temporary
  (``DIR/.NAME.XXXXXXXX.tmp`` -> ``DIR/NAME``), else ``path`` itself."""
  folder, name = os.path.split(path)
  match = _TEMPORARY.fullmatch(name)
  return os.path.join(folder, match.group(1)) if match else path


def remove_temporaries(folder: str):
  """Removes the temporary files of ``write_atomic`` that a kill left in ``folder``."""
  for name in os.listdir(folder) if os.path.isdir(folder) else ():
    path = os.path.join(folder, name)
    if _TEMPORARY.fullmatch(name) and os.path.isfile(path) and not os.path.islink(path):
      os.remove(path)


@contextlib.contextmanager
def _open(path: str, flags: int, mode: str, **kwargs):
  fd = paths.regular_fd(path, flags | os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
  with naming(path), os.fdopen(fd, mode, **kwargs) as f:
    yield f


def open_append(path: str, mode: str = 'a', **kwargs):
  """``with open(path, 'a')`` that refuses to follow a link at ``path`` (``OSError`` ELOOP)
  and names ``path`` in its write errors (``naming``)."""
  return _open(path, os.O_APPEND, mode, **kwargs)


def open_new(path: str, mode: str = 'w', **kwargs):
  """``with open(path, 'w')`` (emptied), as ``open_append``."""
  return _open(path, os.O_TRUNC, mode, **kwargs)


def truncate(path: str, size: int):
  """Cuts ``path`` back to ``size`` bytes, not through a link, a regular file only."""
  fd = paths.regular_fd(path, os.O_WRONLY | os.O_NOFOLLOW)
  try:
    os.ftruncate(fd, size)
  finally:
    os.close(fd)


# What a work directory's entry must be, by its name (``check_outputs``).
A_FILE, A_FOLDER, A_CHECKPOINT = 'a file', 'a folder', "a checkpoint's folder"


def entry_problem(path: str, want: str | None = None) -> str | None:
  """What is wrong with ``path`` in a work directory where fedjax_gel writes ``want``
  (``A_FILE``, ``A_FOLDER``, ``A_CHECKPOINT``; None: either): a symbolic link, a special file
  (a named pipe, a device, a socket: opened, it would wait forever or never end) or the other
  kind; None when it is absent or as it should be."""
  try:
    mode = os.lstat(path).st_mode
  except OSError:
    return None
  if stat.S_ISLNK(mode):
    return 'is a symbolic link'
  folder = stat.S_ISDIR(mode)
  if not folder and not stat.S_ISREG(mode):
    return f'is {paths.not_regular(path, follow=False)}'
  if want == A_FILE and folder:
    return f'is a folder where {want} goes'
  if want in (A_FOLDER, A_CHECKPOINT) and not folder:
    return f'is a file where {want} goes'
  return None


def check_outputs(workdir: str, top: str | None = None):
  """A ConfigError naming the first output of ``workdir`` (its names in ``OUTPUTS``, the files
  in ``plots/`` and ``tensorboard/``, checkpoints and their files) that is a symbolic link (in
  a checkpoint: allowed), a special file or a file where a folder goes or the reverse
  (``entry_problem``); or the first folder between ``top`` (the command's ``--workdir``, which
  may itself be a link) and ``workdir`` that is a link: fedjax_gel writes only regular files
  and folders there; a checkpoint is a folder. Checked before anything is written, so that a
  run that would fail (or wait forever) half-way through its first write is refused whole (see
  also ``check_writable``)."""
  def refuse(path, what='is a symbolic link'):
    raise ConfigError(f'{paths.shown(path)} {what}; fedjax_gel writes only regular files and '
                      'folders in its work directory: remove it')

  if top is not None:
    below = os.path.relpath(workdir, top)
    folder = top
    for part in ([] if below == '.' else below.split(os.sep)):
      folder = os.path.join(folder, part)
      if os.path.islink(folder):
        refuse(folder)
  if not os.path.isdir(workdir):
    return
  names = {n: A_FOLDER if n in FOLDERS else A_FILE for n in OUTPUTS}
  for n in os.listdir(workdir):   # checkpoint-<round>.msgpack: a version 1's file
    if n.startswith('checkpoint-'):
      names[n] = None if n.endswith('.msgpack') else A_CHECKPOINT
  for sub in FOLDERS:
    folder = os.path.join(workdir, sub)
    if os.path.isdir(folder) and not os.path.islink(folder):
      names.update((os.path.join(sub, n), None) for n in os.listdir(folder))
  for name, want in names.items():
    path = os.path.join(workdir, name)
    problem = entry_problem(path, want)
    if problem:
      refuse(path, problem)
    if want == A_CHECKPOINT and os.path.isdir(path):
      for root, _, found in os.walk(path):
        for n in found:
          problem = entry_problem(os.path.join(root, n))
          if problem and problem != 'is a symbolic link':
            refuse(os.path.join(root, n), problem)


def check_writable(workdir: str):
  """A ConfigError when the process could not write a run into ``workdir``: files cannot be
  made in it, or its ``metrics.jsonl`` cannot be appended to (for the runs it will train or
  resume; a finished run's folder may be read-only)."""
  def why(path):
    read_only = os.statvfs(path).f_flag & os.ST_RDONLY
    return 'it is on a read-only file system' if read_only else 'permission denied'
  if os.path.isdir(workdir) and not os.access(workdir, os.W_OK | os.X_OK):
    raise ConfigError(f'{workdir}: files cannot be made in it ({why(workdir)})')
  metrics = os.path.join(workdir, 'metrics.jsonl')
  if os.path.isfile(metrics) and not os.access(metrics, os.W_OK):
    raise ConfigError(f'{metrics} cannot be written ({why(metrics)})')


def lock(workdir: str):
  """Takes ``workdir``'s lock (an ``flock`` of the directory itself: taking it writes nothing)
  for the rest of the process, or until ``unlock``; again: nothing. A ConfigError naming the
  process that holds it (``WORKDIR/.lock``, written by ``name_holder``)."""
  key = os.path.realpath(workdir)
  if key in _held:
    return
  try:
    fd = _open_folder(workdir)
  except OSError as e:
    if e.errno == errno.EMFILE:   # one open file per locked run folder
      soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
      raise ConfigError(f'--workdir={workdir}: this command holds {len(_held):,} run folders '
                        f'locked and may open no more files (ulimit -n: {soft:,}); raise the '
                        'limit, or give fewer --seeds, grid values or algorithms at once') from None
    raise ConfigError(f'--workdir={workdir}: cannot open it ({e.strerror})') from None
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    os.close(fd)
    h = holder(workdir) or holder_above(workdir)
    who = (f'process {h["pid"]} on {h["host"]} (since {h["since"]}: {h["command"]})' if h else
           'another process')
    raise ConfigError(f'--workdir={workdir} is in use by {who}; wait for it to finish or stop '
                      'it, or choose another --workdir') from None
  except OSError as e:   # a file system without flock (some network ones): say so, not "in use"
    os.close(fd)
    raise ConfigError(f'--workdir={workdir}: cannot be locked on this file system '
                      f'({e.strerror}); choose a work directory on a local disk') from None
  _held[key] = fd


def _open_folder(workdir: str) -> int:
  """A file descriptor of the folder ``workdir``; where the process' soft limit of open files
  is reached, raises it to the hard limit first (a command of many runs locks each run's
  folder, an open file each)."""
  try:
    return os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)
  except OSError as e:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if e.errno != errno.EMFILE or (hard != resource.RLIM_INFINITY and soft >= hard):
      raise
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)


def name_holder(workdir: str):
  """Writes who holds ``workdir``'s lock into ``WORKDIR/.lock`` (for the processes it
  refuses); a dead holder's name there means nothing: its lock went with it."""
  holder = {'pid': os.getpid(), 'host': socket.gethostname(),
            'since': time.strftime('%Y-%m-%d %H:%M:%S'), 'command': ' '.join(sys.argv)[:500]}
  write_atomic(os.path.join(workdir, LOCK), json.dumps(holder).encode())


def holder(workdir: str) -> dict | None:
  """Who holds ``workdir``'s lock as ``WORKDIR/.lock`` names it (``name_holder``'s pid, host,
  since, command); None without a readable one."""
  try:
    with paths.open_regular(os.path.join(workdir, LOCK), 'r') as f:
      h = json.load(f)
  except (OSError, ValueError, RecursionError):
    return None
  fields = ('pid', 'host', 'since', 'command')
  return h if isinstance(h, dict) and all(k in h for k in fields) else None


def holder_above(folder: str) -> dict | None:
  """The holder a folder above ``folder`` names: a run's folder is locked by the command that
  named itself in its top work directory only (one ``.lock`` a command)."""
  folder = os.path.abspath(folder)
  while os.path.dirname(folder) != folder:
    folder = os.path.dirname(folder)
    h = holder(folder)
    if h is not None:
      return h
  return None


def unlock(workdir: str):
  """Releases ``workdir``'s lock and removes ``.lock`` (a process exiting releases the lock
  too; a killed one leaves ``.lock`` behind, which names a dead holder and is replaced)."""
  fd = _held.pop(os.path.realpath(workdir), None)
  if fd is not None:
    try:   # a folder turned read-only: the error under way (a failed write) is the one to tell
      os.remove(os.path.join(workdir, LOCK))
    except OSError:   # the lock goes with the descriptor; a stale .lock is replaced
      pass
    os.close(fd)


def digest(path: str, size: int | None = None) -> str:
  """SHA-256 (hex) of a file (of its first ``size`` bytes, if given), or of a folder's files:
  their paths relative to it, sizes and bytes, in sorted order."""
  h = hashlib.sha256()
  if os.path.isdir(path):
    files = sorted(os.path.relpath(os.path.join(root, n), path)
                   for root, _, names in os.walk(path) for n in names)
    for rel in files:
      h.update(f'{rel}\0{os.path.getsize(os.path.join(path, rel))}\0'.encode())
      _update(h, os.path.join(path, rel))
  else:
    _update(h, path, size)
  return h.hexdigest()


def stamp(path: str) -> tuple:
  """A folder's files as ``(relative path, size, inode, change time in ns)``, sorted: a write,
  a rename, a removal or a new file changes it; the change time (``st_ctime_ns``) cannot be set
  back by a program (``os.utime`` sets the modification time and moves the change time on)."""
  out = []
  for root, _, names in os.walk(path):
    for n in names:
      st = os.stat(os.path.join(root, n), follow_symlinks=False)
      out.append((os.path.relpath(os.path.join(root, n), path), st.st_size, st.st_ino,
                  st.st_ctime_ns))
  return tuple(sorted(out))


def _update(h, file: str, size: int | None = None):
  left = -1 if size is None else size
  with paths.open_regular(file) as f:
    while left:
      block = f.read(1 << 20 if left < 0 else min(left, 1 << 20))
      if not block:
        break
      h.update(block)
      left -= len(block) if left > 0 else 0


def finite(obj):
  """Replaces NaN and infinities (a diverged run) by None, so the JSON stays valid."""
  if isinstance(obj, float) and not math.isfinite(obj):
    return None
  if isinstance(obj, dict):
    return {k: finite(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [finite(v) for v in obj]
  return obj


def write_text(path: str, text: str):
  """Writes ``path`` whole or not at all (``write_atomic``)."""
  write_atomic(path, text.encode())


def write_json(path: str, obj):
  write_text(path, json.dumps(finite(obj), indent=2, allow_nan=False) + '\n')


def read_json(path: str) -> dict:
  with paths.open_regular(path, 'r') as f:
    return json.load(f)


def read_json_as(path: str, kind: type, problem: str):
  """``path``'s JSON when it reads as a ``kind`` (``object``: any JSON); else a ConfigError:
  ``path`` and ``problem``."""
  try:
    value = read_json(path)
  except (OSError, ValueError, RecursionError):
    raise ConfigError(f'{path} {problem}') from None
  if not isinstance(value, kind):
    raise ConfigError(f'{path} {problem}')
  return value


def json_line(record: dict) -> str:
  """One ``metrics.jsonl`` line (NaN and infinities written as null)."""
  return json.dumps(finite(record), allow_nan=False) + '\n'
