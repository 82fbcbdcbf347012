"""XLA's options: the CPU backend set up for many small clients, and programs compiled for
compile time.

``configure_cpu`` sets two of XLA's CPU options before JAX starts (``launch/run.py`` and the
benchmarks call it; they only concern the CPU backend, GPU and TPU devices are used as they are):

* **Cores as devices** (``--xla_force_host_platform_device_count``): every core a device of the
  ``'clients'`` mesh (``core.devices``).
* **Small loops as one kernel.** XLA's CPU runtime launches every kernel of a program
  separately, about a microsecond each, so a small round's local steps (some twenty kernels a
  step of a few microseconds of work) cost their launches. XLA compiles a ``while`` loop as one
  kernel when nothing in it calls a library (no matrix product, convolution, scatter or custom
  call) and its cost analysis counts fewer accessed bytes than a threshold
  (``xla_cpu_small_while_loop_byte_threshold``, 1 KiB by default). The local-step loop of a
  small model whose products ``small_dots`` fuses is such a loop, but its count includes
  the whole data pool it gathers from (23 MB for LEAF Synthetic), so ``SMALL_LOOP_BYTES``
  raises the threshold to 1 GiB. In practice only programs compiled for compile time
  (``QUICK_COMPILE``, the experiment layer's choice for small rounds) qualify: XLA's fusion
  emitters hand the loops' reductions to a library. A 20-client LEAF Synthetic round runs
  1.22x faster, to the bit the same (``docs/speed.md``). All of this is jaxlib < 0.11:
  0.11 has the fusion emitters only, and the loop stays a loop of kernels there.

``compiler_options`` are ``jax.jit``'s options of a program (``Backend.compiler_options``).
"""
from __future__ import annotations

import os

import jaxlib

from fedjax_gel.core.backend import jax_private

CPU_DEVICES_FLAG = '--xla_force_host_platform_device_count'
# XLA options of a program compiled for compile time: XLA's CPU backend compiles with its
# legacy loop emitters instead of its fusion emitters, 20-40% faster; the program then runs as fast for a 20-client logistic round, 9-16% slower for 200
# to 2,000 clients and 1.4x slower for GeL's FEMNIST CNN (docs/speed.md, start-up).
# jaxlib 0.11 removed the legacy emitters and the option (an unknown option is an error there):
# with it, programs are compiled with XLA's defaults (``QUICK_COMPILE`` is empty). The option is
# passed on CPU only (``compiler_options``).
LEGACY_EMITTERS = tuple(int(v) for v in jaxlib.__version__.split('.')[:2]) < (0, 11)
QUICK_COMPILE = {'xla_cpu_use_fusion_emitters': False} if LEGACY_EMITTERS else {}


# XLA's bytes threshold of a while loop it compiles as one kernel (see above).
SMALL_LOOP_BYTES = 1 << 30
BACKEND_OPTIONS_FLAG = '--xla_backend_extra_options'
SMALL_LOOP_FLAG = (f'{BACKEND_OPTIONS_FLAG}=xla_cpu_small_while_loop_byte_threshold='
                   f'{SMALL_LOOP_BYTES}')


def configure_cpu(count: int | None = None) -> bool:
  """Presents ``count`` (default: every core) CPU devices to JAX and lets XLA compile small
  loops up to ``SMALL_LOOP_BYTES`` as one kernel (both through ``XLA_FLAGS``).

  Must run before JAX initialises its backends (its first computation or ``jax.devices()``).
  Returns False, changing nothing, when that has happened; an option ``XLA_FLAGS`` already
  sets (the device count, or any ``--xla_backend_extra_options``) is left as it is.
  """
  if jax_private.backends_initialized():
    return False
  flags = os.environ.get('XLA_FLAGS', '')
  if CPU_DEVICES_FLAG not in flags:
    flags += f' {CPU_DEVICES_FLAG}={count or os.cpu_count() or 1}'
  if BACKEND_OPTIONS_FLAG not in flags:
    flags += f' {SMALL_LOOP_FLAG}'
  os.environ['XLA_FLAGS'] = flags.strip()
  return True


def compiler_options(quick: bool) -> dict | None:
  """``jax.jit``'s ``compiler_options`` of a program compiled for compile time (``quick``:
  ``QUICK_COMPILE``, XLA CPU options: on CPU only) or for run time (None: XLA's defaults)."""
  import jax  # pylint: disable=g-import-not-at-top
  return dict(QUICK_COMPILE) if quick and QUICK_COMPILE and jax.default_backend() == 'cpu' else None


