"""JAX's persistent compilation cache, on by default for ``launch/run.py``.

A run spends most of its start-up compiling (the round, the sampler, the evaluation). JAX can keep
the compiled programs on disk and reuse them in the next process with the same program, flags and
devices: the quickstart then starts in about half the time (``benchmarks/RESULTS.md``). Results
do not change: a cached program is the program XLA would compile.

The cache lives in ``$FEDJAX_GEL_COMPILATION_CACHE`` if set (empty: off), else
``$XDG_CACHE_HOME/fedjax_gel/jax`` (``~/.cache/fedjax_gel/jax``). It only grows; delete the folder
to clear it. An entry that cannot be read (e.g. a process killed while writing it) makes JAX warn
and compile again.

Several processes (``--num_processes``) share the cache: JAX writes it from process 0 only, and
the other processes read what process 0 wrote (``share_between_processes``), so a restarted
run's processes all start from it.
"""
from __future__ import annotations

import functools
import json
import os
import platform

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
  share_between_processes()
  return path


def share_between_processes() -> bool:
  """Keys a CPU program that runs on several processes' devices alike in every process.

  JAX keys a cached program by its devices' topology among other things, and on CPU that
  topology is the calling process's own devices: each process of a multi-process run keys the
  same program differently and, as JAX writes the cache from process 0 only, every other
  process compiled every program again at every start, process 0 waiting for it (the 2-process
  quickstart restarted in 18.3-35.4 s, in 12.0-18.2 s with this: ``benchmarks/RESULTS.md``).
  For such a program this hashes its devices' global ids, processes and kind and the host's
  processor (``host_processor``: XLA compiles for it) instead, the same in every process on the
  same kind of host; other programs keep JAX's key. Patches ``jax._src.cache_key``, JAX's own
  key function (JAX 0.10 to 0.12); returns False, changing nothing, where that JAX has none.
  """
  try:
    from jax._src import cache_key  # pylint: disable=g-import-not-at-top
  except ImportError:
    return False
  original = getattr(cache_key, '_hash_accelerator_config', None)
  if original is None:
    return False
  if getattr(original, 'shared_between_processes', False):
    return True

  def hash_devices(hash_obj, devices):
    flat = list(getattr(devices, 'flat', devices))
    if (flat and all(d.platform == 'cpu' for d in flat) and
        len({d.process_index for d in flat}) > 1):
      described = [(d.id, d.process_index, d.device_kind) for d in flat]
      hash_obj.update(json.dumps([host_processor(), described]).encode())
    else:
      original(hash_obj, devices)

  hash_devices.shared_between_processes = True
  cache_key._hash_accelerator_config = hash_devices  # pylint: disable=protected-access
  return True


@functools.lru_cache(maxsize=None)
def host_processor() -> str:
  """This host's processor: its vendor, model and feature flags where Linux lists them
  (``/proc/cpuinfo``), else the machine and processor names Python knows."""
  try:
    with open('/proc/cpuinfo', encoding='utf-8') as f:
      first = f.read().split('\n\n')[0]
  except OSError:
    first = ''
  fields = [line for line in first.splitlines()
            if line.split(':')[0].strip() in ('vendor_id', 'model name', 'flags')]
  return '\n'.join(fields) or f'{platform.machine()} {platform.processor()}'

