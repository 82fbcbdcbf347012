"""JAX's persistent compilation cache, on by default for ``launch/run.py``.

A run spends most of its start-up compiling (the round, the sampler, the evaluation). JAX can keep
the compiled programs on disk and reuse them in the next process with the same program, flags and
devices: the quickstart then starts in about half the time (``benchmarks/RESULTS.md``). Results
do not change: a cached program is the program XLA would compile.

The cache lives in ``$FEDJAX_GEL_COMPILATION_CACHE`` if set (empty: off), else
``$XDG_CACHE_HOME/fedjax_gel/jax`` (``~/.cache/fedjax_gel/jax``). It only grows; delete the folder
to clear it. An entry that cannot be read (e.g. a process killed while writing it) makes JAX warn
and compile again.
"""
from __future__ import annotations

import os

from fedjax_gel.data.cache import user_cache_dir

ENV = 'FEDJAX_GEL_COMPILATION_CACHE'


def default_dir() -> str:
  """``$FEDJAX_GEL_COMPILATION_CACHE`` if set (``''``: off), else the user's cache folder."""
  return user_cache_dir(ENV, 'jax')


def enable(path: str | None) -> str | None:
  """Turns the cache on in ``path`` (created if needed); ``''`` or ``None`` leaves it off.

  Returns the absolute folder, or None. Raises ``OSError`` when the folder cannot be created or
  written. Every program is cached, however short its compilation (JAX's default skips those
  under a second, which are most of a small run's).
  """
  if not path:
    return None
  import jax  # pylint: disable=g-import-not-at-top
  path = os.path.abspath(os.path.expanduser(path))
  os.makedirs(path, exist_ok=True)
  if not os.path.isdir(path) or not os.access(path, os.W_OK | os.X_OK):
    raise OSError(f'{path} is not a writable folder')
  jax.config.update('jax_compilation_cache_dir', path)
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  return path
