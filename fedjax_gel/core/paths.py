"""Paths as error lines name them, and files opened only when they are regular files.

* ``shown``: a path (or any value a user gave) quoted for a one-line error: as it is, or
  ``repr``-quoted where a line break or another unprintable character would split the line.
* ``not_regular``: what a path is when it is no regular file (a named pipe, a device, a
  socket, a directory), for a check before anything is opened.
* ``open_regular`` / ``regular_fd``: a file opened for reading or writing that is a regular
  file, and an open that never blocks: checked before the open, opened with ``O_NONBLOCK`` (a
  named pipe without a reader or a writer would wait forever) and checked again on what was
  opened (``fstat``: a pipe planted between the check and the open); anything else is a
  ``NotRegularFile`` naming the path.
"""
from __future__ import annotations

import errno
import os
import stat

# What a file that is not a regular file is, by its mode.
KINDS = ((stat.S_ISDIR, 'a directory'), (stat.S_ISFIFO, 'a named pipe'),
         (stat.S_ISCHR, 'a character device'), (stat.S_ISBLK, 'a block device'),
         (stat.S_ISSOCK, 'a socket'))


def shown(path) -> str:
  """``path`` as an error line quotes it: as it is, or ``repr``-quoted (``'a\\nb'``) where it
  holds a character that is not printable (a line break would split the line)."""
  text = os.fsdecode(path) if isinstance(path, (bytes, os.PathLike)) else str(path)
  return text if text.isprintable() else repr(text)


def kind(mode: int) -> str | None:
  """What a file of ``mode`` (``st_mode``) is when it is neither a regular file nor a symbolic
  link (``'a named pipe'``, ...); else None."""
  return next((what for test, what in KINDS if test(mode)), None)


def kind_of(path, follow: bool = True) -> str | None:
  """What ``path`` is (``kind``) where it is a directory, a named pipe, a device or a socket;
  None for a regular file, a missing one (its open says so) or, unless ``follow``, a symbolic
  link."""
  try:
    return kind(os.stat(path, follow_symlinks=follow).st_mode)
  except (OSError, ValueError):   # ValueError: a NUL in the name
    return None


def not_regular(path, follow: bool = True) -> str | None:
  """``'not a regular file (a named pipe)'`` where ``path`` is one (``kind_of``); else None."""
  what = kind_of(path, follow)
  return None if what is None else f'not a regular file ({what})'


class NotRegularFile(OSError):
  """A file to read or write that is not a regular file: ``strerror`` says what it is,
  ``filename`` names it."""

  def __str__(self):
    return self.strerror


def _refused(path, problem: str) -> NotRegularFile:
  return NotRegularFile(errno.EINVAL, problem, os.fsdecode(path))


def regular_fd(path, flags: int = os.O_RDONLY, mode: int = 0o666) -> int:
  """``os.open(path, flags, mode)`` of a regular file (or of a new one, with ``O_CREAT``), in
  blocking mode once opened; never blocks itself (see the module doc). ``O_NOFOLLOW`` keeps
  its meaning: a symbolic link is the open's ``ELOOP``."""
  follow = not flags & os.O_NOFOLLOW
  problem = not_regular(path, follow)
  if problem:
    raise _refused(path, problem)
  try:
    fd = os.open(path, flags | os.O_NONBLOCK, mode)
  except OSError as e:
    if e.errno == errno.ENXIO:   # a named pipe without a reader, or a socket
      raise _refused(path, not_regular(path, follow) or 'not a regular file') from None
    raise
  try:
    what = kind(os.fstat(fd).st_mode)
    if what is not None:
      raise _refused(path, f'not a regular file ({what})')
    os.set_blocking(fd, True)
  except BaseException:
    os.close(fd)
    raise
  return fd


def open_regular(path, mode: str = 'rb', **kwargs):
  """``open(path, mode)`` for reading (``'r'`` or ``'rb'``, with ``open``'s keywords) of a
  regular file only; see ``regular_fd``."""
  fd = regular_fd(path)
  try:
    return os.fdopen(fd, mode, **kwargs)
  except BaseException:
    os.close(fd)
    raise


def user_cache_dir(env: str, name: str) -> str:
  """``$env`` if set (``''``: off), else ``$XDG_CACHE_HOME/fedjax_gel/<name>``
  (``~/.cache/fedjax_gel/<name>``): where fedjax_gel keeps what later processes reuse."""
  if env in os.environ:
    return os.environ[env]
  base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return os.path.join(base, 'fedjax_gel', name)
