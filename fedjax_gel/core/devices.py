"""Devices: the ``'clients'`` mesh, and XLA's CPU backend set up for many small clients.

``configure_cpu`` sets two of XLA's CPU options before JAX starts (``launch/run.py`` and the
benchmarks call it; they only concern the CPU backend, GPU and TPU devices are used as they are):

* **Cores as devices.** XLA's CPU backend runs a vmapped step of many small per-client models on
  about one core (the step is a chain of small kernels, each too small to split across
  threads). Presented as several CPU devices (``--xla_force_host_platform_device_count``), the
  engine splits each chunk over them with ``shard_map`` and every core works: on a 2-core
  machine a 10,000-client LEAF Synthetic round runs 1.29x faster on 2 devices than on 1
  (``benchmarks/device_scaling.py``; 200-client rounds are slower split, 400-client ones
  faster). ``auto_num_devices`` counts that threshold as work, so a few clients of a large
  model (an LSTM, a CNN) run one per core.
* **Small loops as one kernel.** XLA's CPU runtime launches every kernel of a program
  separately, about a microsecond each, so a small round's local steps (some twenty kernels a
  step of a few microseconds of work) cost their launches. XLA compiles a ``while`` loop as one
  kernel when nothing in it calls a library (no matrix product, convolution, scatter or custom
  call) and its cost analysis counts fewer accessed bytes than a threshold
  (``xla_cpu_small_while_loop_byte_threshold``, 1 KiB by default). The local-step loop of a
  small model whose products ``core.small_dots`` fuses is such a loop, but its count includes
  the whole data pool it gathers from (23 MB for LEAF Synthetic), so ``SMALL_LOOP_BYTES``
  raises the threshold to 1 GiB. In practice only programs compiled for compile time
  (``QUICK_COMPILE``, the experiment layer's choice for small rounds) qualify: XLA's fusion
  emitters hand the loops' reductions to a library. A 20-client LEAF Synthetic round runs
  1.22x faster, to the bit the same (``benchmarks/RESULTS.md``). All of this is jaxlib < 0.11:
  0.11 has the fusion emitters only, and the loop stays a loop of kernels there.
"""
from __future__ import annotations

import os

import jaxlib
import numpy as np

CLIENT_AXIS = 'clients'
CPU_DEVICES_FLAG = '--xla_force_host_platform_device_count'
# Below this many clients per device a round is too small to gain from splitting it.
MIN_CLIENTS_PER_DEVICE = 200   # 2 CPU devices: slower at 200 clients, faster at 400
# On CPU, the same threshold as work: a local step's forward multiply-adds per device (clients x
# B x parameters) of MIN_CLIENTS_PER_DEVICE LEAF Synthetic clients (B = 5, 305 parameters).
# Clients of a larger model reach it with fewer clients per device.
MIN_STEP_WORK_PER_DEVICE = MIN_CLIENTS_PER_DEVICE * 5 * 305
# XLA options of a program compiled for compile time: XLA's CPU backend compiles with its
# legacy loop emitters instead of its fusion emitters, 20-40% faster (a small round: 1.3 s ->
# 1.0 s); the program then runs as fast for a 20-client logistic round, 9-16% slower for 200
# to 2,000 clients and 1.4x slower for GeL's FEMNIST CNN (benchmarks/RESULTS.md, start-up).
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
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  if xla_bridge.backends_are_initialized():
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
  return dict(QUICK_COMPILE) if quick and QUICK_COMPILE and _backend() == 'cpu' else None


def auto_num_devices(cohort_size: int, available: int, client_step_work: int = 0) -> int:
  """All devices when each gets enough of a round's work, else one.

  On CPU, with ``client_step_work`` (one client's local step: ``B`` x the model's parameters,
  its forward multiply-adds for a dense model), enough is at least one client and
  ``MIN_STEP_WORK_PER_DEVICE`` of a step's work per device. A client of a large model is then a
  unit of work of its own: the Shakespeare LSTM's 20-client round runs 1.3x faster with one
  client at a time on each core than with each client's small products split over the cores'
  threads, GeL's FEMNIST CNN about as fast or faster (``benchmarks/RESULTS.md``), while LEAF
  Synthetic keeps its measured 200 clients per device. Otherwise (accelerators, or no work
  given) at least ``MIN_CLIENTS_PER_DEVICE`` clients per device.
  """
  if client_step_work and _backend() == 'cpu':
    enough = (cohort_size >= available and
              cohort_size * client_step_work >= MIN_STEP_WORK_PER_DEVICE * available)
  else:
    enough = cohort_size >= MIN_CLIENTS_PER_DEVICE * available
  return available if enough else 1


def _backend() -> str:
  import jax  # pylint: disable=g-import-not-at-top
  return jax.default_backend()


def client_mesh(num_devices: int = 0):
  """A 1-D ``jax.sharding.Mesh`` named ``'clients'`` over the first ``num_devices`` devices.

  ``0`` takes all devices. Returns None for a single device (the engine then needs no sharding).
  """
  import jax  # pylint: disable=g-import-not-at-top
  devices = jax.devices()
  if num_devices < 0:   # devices[:-1] would have been one device fewer than all
    raise ValueError(f'client_mesh: num_devices must be >= 0 (0: all), got {num_devices}')
  num_devices = num_devices or len(devices)
  if num_devices > len(devices):
    raise ValueError(f'{num_devices} devices asked for, {len(devices)} present')
  if num_devices == 1:
    return None
  return jax.sharding.Mesh(np.array(devices[:num_devices]), (CLIENT_AXIS,))


def replicate(tree, mesh):
  """``tree`` placed whole on every device of ``mesh`` (``None``: unchanged).

  The server state is read on every device; placed once, it is not copied to each device again
  every round. (The training pool is split by client instead: ``federated_data.to_device(data,
  mesh)``; the evaluation reads one device's copy: ``local_copy``.)
  """
  if mesh is None:
    return tree
  import jax  # pylint: disable=g-import-not-at-top
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  if sharding.is_fully_addressable:
    return jax.device_put(tree, sharding)

  def one(a):   # a mesh over several processes: each places its own devices' copies
    if isinstance(a, jax.Array) and a.sharding.is_equivalent_to(sharding, a.ndim):
      return a
    if isinstance(a, jax.Array) and jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
      return jax.random.wrap_key_data(one(jax.random.key_data(a)), impl=jax.random.key_impl(a))
    host = to_host(a)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])
  return jax.tree.map(one, tree)


def local_copy(tree, device):
  """``tree`` on ``device``, one of this process' devices: an array replicated over several
  devices (the server state on a mesh) is taken as its copy there, another placed there.

  A program on one device that reads the server state (the evaluation) then runs once; given
  the replicated state it runs on every device of the mesh, which on CPU are the same cores.
  """
  import jax  # pylint: disable=g-import-not-at-top

  def one(a):
    if isinstance(a, jax.Array) and a.sharding.is_fully_replicated:
      for shard in a.addressable_shards:
        if shard.device == device:
          return shard.data
    return jax.device_put(a, device)
  return jax.tree.map(one, tree)


def split_rows(tree, mesh):
  """``tree``'s leaves (host arrays) split by their first axis into one block per device of the
  mesh's ``'clients'`` axis; each process places only its own devices' blocks."""
  import jax  # pylint: disable=g-import-not-at-top
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(CLIENT_AXIS))

  def one(a):
    host = np.asarray(a)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])
  return jax.tree.map(one, tree)


def to_host(tree):
  """``jax.device_get`` for arrays that may span several processes' devices: a replicated
  array is read from this process' first copy."""
  import jax  # pylint: disable=g-import-not-at-top

  def one(a):
    if isinstance(a, jax.Array) and not a.is_fully_addressable:
      return np.asarray(a.addressable_data(0))
    return jax.device_get(a)
  return jax.tree.map(one, tree)
