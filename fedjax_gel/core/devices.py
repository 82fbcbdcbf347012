"""Devices: the ``'clients'`` mesh over which a round's clients are split, and the placement
of pools and states on it.

**Cores as devices.** XLA's CPU backend runs a vmapped step of many small per-client models on
about one core (the step is a chain of small kernels, each too small to split across threads).
Presented as several CPU devices (``core.backend.xla.configure_cpu``), the engine splits each
chunk over them with ``shard_map`` and every core works: on a 2-core machine a 10,000-client
LEAF Synthetic round runs 1.29x faster on 2 devices than on 1 (``benchmarks/device_scaling.py``;
200-client rounds are slower split, 400-client ones faster). ``auto_num_devices`` counts that
threshold as work, so a few clients of a large model (an LSTM, a CNN) run one per core.
"""
from __future__ import annotations

import numpy as np

CLIENT_AXIS = 'clients'
# Below this many clients per device a round is too small to gain from splitting it.
MIN_CLIENTS_PER_DEVICE = 200   # 2 CPU devices: slower at 200 clients, faster at 400
# On CPU, the same threshold as work: a local step's forward multiply-adds per device (clients x
# B x parameters) of MIN_CLIENTS_PER_DEVICE LEAF Synthetic clients (B = 5, 305 parameters).
# Clients of a larger model reach it with fewer clients per device.
MIN_STEP_WORK_PER_DEVICE = MIN_CLIENTS_PER_DEVICE * 5 * 305


def auto_num_devices(cohort_size: int, available: int, client_step_work: int = 0) -> int:
  """All devices when each gets enough of a round's work, else one.

  On CPU, with ``client_step_work`` (one client's local step: ``B`` x the model's parameters,
  its forward multiply-adds for a dense model), enough is at least one client and
  ``MIN_STEP_WORK_PER_DEVICE`` of a step's work per device. A client of a large model is then a
  unit of work of its own: the Shakespeare LSTM's 20-client round runs 1.3x faster with one
  client at a time on each core than with each client's small products split over the cores'
  threads, GeL's FEMNIST CNN about as fast or faster (``docs/speed.md``), while LEAF
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
