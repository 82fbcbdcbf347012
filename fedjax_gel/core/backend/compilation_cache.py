"""JAX's persistent compilation cache, on by default for ``launch/run.py``.

A run spends most of its start-up compiling (the round, the sampler, the evaluation). JAX can keep
the compiled programs on disk and reuse them in the next process with the same program, flags and
devices: the quickstart then starts in about half the time (``docs/speed.md``). Results
do not change: a cached program is the program XLA would compile.

The cache lives in ``$FEDJAX_GEL_COMPILATION_CACHE`` if set (empty: off), else
``$XDG_CACHE_HOME/fedjax_gel/jax`` (``~/.cache/fedjax_gel/jax``). It only grows; delete the folder
to clear it. An entry that cannot be read (e.g. a process killed while writing it) makes JAX warn
and compile again.

Several processes (``--num_processes``) share the cache: JAX writes it from process 0 only, and
the other processes read the programs over all processes' devices that process 0 wrote
(``share_between_processes``); each compiles its few programs on its own devices itself. In a
first start every process compiles and process 0 writes while the others may look: one that
reads an entry being written warns and compiles it (JAX writes entries in place).
"""
from __future__ import annotations

import functools
import json
import os

from fedjax_gel.core.backend import jax_private
from fedjax_gel.core.paths import user_cache_dir

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

  JAX keys a cached program by its devices' topology among other things; on CPU that is the
  calling process's own devices, so each process keyed the same program differently and, as
  only process 0 writes the cache, the others compiled every program at every start
  (``docs/speed.md``). For such a program on a host whose processor ``host_processor``
  names, this hashes the devices' global ids, processes and kind and that processor (XLA
  compiles for it) instead: the same in every process on the same kind of host. Every other
  program keeps JAX's key. Patches JAX's key function ``_hash_accelerator_config``
  (``jax_private.cache_key_module``) (JAX 0.10 to 0.12 have it; tested with 0.10.2); returns False,
  changing nothing, where that JAX has none.
  """
  cache_key = jax_private.cache_key_module()
  original = getattr(cache_key, '_hash_accelerator_config', None)
  if original is None:
    return False
  if getattr(original, 'shared_between_processes', False):
    return True

  def hash_devices(hash_obj, devices, *args, **kwargs):
    described = across_processes(devices)
    if described is None:
      return original(hash_obj, devices, *args, **kwargs)
    hash_obj.update(described.encode())
    return None

  hash_devices.shared_between_processes = True
  cache_key._hash_accelerator_config = hash_devices  # pylint: disable=protected-access
  return True


def across_processes(devices) -> str | None:
  """What keys a program on ``devices`` (an array of them) in every process alike: JSON of
  the host's processor and each device's id, process and kind; None (JAX's key) unless they
  are CPU devices of several processes on a host whose processor is known."""
  try:
    flat = list(getattr(devices, 'flat', devices))
    if (not flat or any(d.platform != 'cpu' for d in flat) or
        len({d.process_index for d in flat}) < 2 or not host_processor()):
      return None
    return json.dumps([host_processor(), [(d.id, d.process_index, d.device_kind)
                                          for d in flat]])
  except (AttributeError, TypeError):   # not devices as this JAX has them: JAX's key
    return None


# /proc/cpuinfo's fields that name a processor and its features: x86's, then Arm's.
PROCESSOR_FIELDS = ('vendor_id', 'cpu family', 'model', 'model name', 'stepping', 'flags',
                    'CPU implementer', 'CPU architecture', 'CPU variant', 'CPU part',
                    'CPU revision', 'Features')


@functools.lru_cache(maxsize=None)
def host_processor() -> str:
  """This host's processor as Linux lists it (``/proc/cpuinfo``'s first processor: vendor,
  model and feature flags on x86, implementer, part and features on Arm); '' where it does not
  (no such file, or none of those fields)."""
  try:
    with open('/proc/cpuinfo', encoding='utf-8') as f:
      first = f.read().split('\n\n')[0]
  except OSError:
    return ''
  return '\n'.join(line for line in first.splitlines()
                   if line.split(':')[0].strip() in PROCESSOR_FIELDS)
