"""Federated data as a flat, device-resident example pool.

A federated dataset is one pytree of arrays whose leading axis runs over *all* examples of *all*
clients, plus ``offsets[N]`` and ``counts[N]``: client ``i`` owns pool rows
``offsets[i] : offsets[i] + counts[i]``, in client order. There is no per-client padding, so a
population whose clients range from 5 to 50,000 examples costs exactly its number of examples.
On a mesh of devices the pool is split by client (``to_device(data, mesh)``): each device holds
the examples of the clients it owns, its block padded to the largest device's count; or, where
it fits, whole on every device (``replicate=True``), so that any device can train any client.
"""
from __future__ import annotations

import hashlib
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

Examples = Mapping[str, Any]  # e.g. {'x': [P, ...] features, 'y': [P] int labels}


class FederatedData(NamedTuple):
  """A flat example pool with per-client ranges.

  Client ``i`` owns pool rows ``offsets[i] : offsets[i] + counts[i]``, in client order, with no
  per-client padding (see the module docstring).

  Attributes:
    examples: dict of arrays, each with leading axis ``P`` (total examples).
    offsets: ``[N]`` int32, first pool row of each client (non-decreasing in the client id).
    counts: ``[N]`` int32, number of examples of each client.
    client_names: the clients' names (host-side metadata, never traced).
  """
  examples: Examples
  offsets: Any
  counts: Any
  client_names: tuple = ()

  @property
  def num_clients(self) -> int:
    return int(np.shape(self.counts)[0])

  @property
  def num_examples(self) -> int:
    return int(np.shape(next(iter(self.examples.values())))[0])


def from_client_arrays(
    clients: Sequence[Examples], client_names: Sequence[str] | None = None
) -> FederatedData:
  """Builds a pool from one dict of equally keyed numpy arrays per client (host side).

  Args:
    clients: one dict of feature arrays per client (e.g. ``{'x': [n_i, ...], 'y': [n_i]}``):
      every client the same features, each with one row per example, rows of one shape across
      clients, float features finite.
    client_names: the clients' names (default ``'0'``, ``'1'``, ...).

  Returns:
    The ``FederatedData`` on the host (``to_device`` moves it for the round).

  Raises:
    ValueError: no clients, or a client or feature that breaks the rules above (the message
      names them).

  Examples:
    >>> import numpy as np
    >>> import fedjax_gel as fg
    >>> rng = np.random.default_rng(0)
    >>> clients = [{'x': rng.normal(size=(n, 60)).astype(np.float32),
    ...             'y': rng.integers(0, 5, n)} for n in (12, 30, 7)]
    >>> pool = fg.from_client_arrays(clients)
    >>> pool.counts, pool.offsets
    (array([12, 30,  7], dtype=int32), array([ 0, 12, 42], dtype=int32))
  """
  where = 'from_client_arrays'
  if not clients:
    raise ValueError('a federated dataset needs at least one client')
  for i, c in enumerate(clients):
    if not isinstance(c, Mapping) or not c:
      raise ValueError(f'{where}: client {i} must be a dict of feature arrays, got '
                       f'{type(c).__name__}')
  keys = sorted(clients[0])
  arrays = [{k: np.asarray(v) for k, v in c.items()} for c in clients]
  for i, c in enumerate(arrays):
    if sorted(c) != keys:
      raise ValueError(f'{where}: every client needs the same features; client {i} has '
                       f'{sorted(c)}, client 0 {keys}')
    for k, a in c.items():
      first = arrays[0][k]
      if a.ndim == 0 or first.ndim == 0 or a.shape[1:] != first.shape[1:]:
        raise ValueError(f'{where}: client {i}\'s {k!r} has shape {a.shape}, client 0\'s '
                         f'{first.shape}: each feature needs one row per example, rows of one '
                         'shape')
      if len(a) != len(c[keys[0]]):
        raise ValueError(f'{where}: client {i} has {len(c[keys[0]])} rows of {keys[0]!r} but '
                         f'{len(a)} of {k!r}; every feature needs one row per example')
      if a.dtype.kind in 'fc' and not np.isfinite(a).all():
        raise ValueError(f'{where}: client {i}\'s {k!r} holds values that are not finite (NaN '
                         'or infinite)')
  counts = np.array([len(c[keys[0]]) for c in arrays], dtype=np.int32)
  offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32)
  examples = {k: np.concatenate([c[k] for c in arrays]) for k in keys}
  names = tuple(client_names) if client_names is not None else tuple(str(i) for i in range(len(clients)))
  return check_pool(FederatedData(examples, offsets, counts, names), 'from_client_arrays',
                    text=True)


# text features ('U', 'S') only in host pools that a dataset's task turns into numbers (LEAF's
# raw text); otherwise numbers of any width (bfloat16 included) or booleans
TEXT_KINDS = 'US'


def check_pool(data: FederatedData, where: str = 'FederatedData',
               text: bool = False) -> FederatedData:
  """``data`` itself if it is a well-formed pool, else a ValueError (TypeError for a value that
  is not a ``FederatedData``) in one line starting with ``where``: at least one feature, each
  an array of numbers or booleans (or strings: ``text``) with one row per example (the same
  leading length ``P``); ``offsets`` and ``counts`` integer arrays of one axis and one entry per
  client (at least one), counts and offsets non-negative, every client's rows within the pool
  (``offsets + counts <= P``) and after the previous client's (``offsets[i] + counts[i] <=
  offsets[i + 1]``); client names none or one per client. Reads shapes and dtypes of
  the features, and the values of ``offsets`` and ``counts`` only."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  if not isinstance(data, FederatedData):
    raise TypeError(f'{where}: a pool must be a FederatedData, got {type(data).__name__}')
  if not isinstance(data.examples, Mapping) or not data.examples:
    raise ValueError(f'{where}: examples must be a dict of at least one feature array')
  rows = {}
  for name, v in data.examples.items():
    dtype = np.dtype(v.dtype if hasattr(v, 'dtype') else np.asarray(v).dtype)
    numeric = jnp.issubdtype(dtype, jnp.number) or dtype == np.bool_
    if not np.shape(v) or not (numeric or text and dtype.kind in TEXT_KINDS):
      raise ValueError(f'{where}: feature {name!r} must be an array of numbers or booleans'
                       f'{" or strings" if text else ""} with a leading axis of examples (got '
                       f'{dtype}, shape {np.shape(v)})')
    rows[name] = np.shape(v)[0]
  if len(set(rows.values())) > 1:
    raise ValueError(f'{where}: every feature needs one row per example, got rows '
                     f'{", ".join(f"{k} {n}" for k, n in rows.items())}')
  pool_rows = next(iter(rows.values()))
  offsets, counts = np.asarray(data.offsets), np.asarray(data.counts)
  if (offsets.ndim != 1 or offsets.shape != counts.shape or not len(counts) or not all(
      np.issubdtype(a.dtype, np.integer) for a in (offsets, counts))):
    raise ValueError(f'{where}: offsets and counts must be integer arrays of one entry per '
                     f'client, at least one (got {offsets.dtype} {offsets.shape} and '
                     f'{counts.dtype} {counts.shape})')
  ends = offsets.astype(np.int64) + counts
  if counts.min() < 0 or offsets.min() < 0 or ends.max() > pool_rows:
    bad = int(np.argmax((counts < 0) | (offsets < 0) | (ends > pool_rows)))
    raise ValueError(f'{where}: client {bad} owns rows {offsets[bad]}..{ends[bad] - 1}, outside '
                     f'the pool\'s {pool_rows} rows (counts and offsets must be >= 0, '
                     'offsets + counts <= rows)')
  overlap = np.flatnonzero(ends[:-1] > offsets[1:])
  if len(overlap):   # power-of-d's full losses and the evaluation read rows in client order
    i = int(overlap[0])
    raise ValueError(f'{where}: client {i + 1}\'s rows start at {offsets[i + 1]}, before client '
                     f'{i}\'s end at {ends[i]}: clients\' rows must follow one another in client '
                     'order (offsets non-decreasing, not overlapping)')
  if len(data.client_names) and len(data.client_names) != len(counts):
    raise ValueError(f'{where}: {len(data.client_names)} client names for {len(counts)} clients')
  return data


def client_examples(data: FederatedData, i: int) -> dict:
  """The examples of one client as numpy arrays (host side; for tests and tools).

  Args:
    data: the pool.
    i: the client's id.

  Returns:
    ``{feature: [counts[i], ...]}``, the client's rows of each feature.
  """
  lo, n = int(data.offsets[i]), int(data.counts[i])
  return {k: np.asarray(v)[lo:lo + n] for k, v in data.examples.items()}


def gather_rows(examples: Examples, idx) -> dict:
  """``examples[idx]`` leaf by leaf (pool rows ``idx``, any shape), inside a jitted function.
  The callers' rows are in range by construction, so the gather clamps (``mode='clip'``)
  rather than filling out-of-range rows: XLA's CPU gather then does no per-element bounds
  select (5-10% of a small cohort's round)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  return jax.tree_util.tree_map(lambda a: jnp.take(a, idx, axis=0, mode='clip'), examples)


def to_device(data: FederatedData, mesh=None, replicate: bool = False) -> FederatedData:
  """Moves the pool and its index arrays onto the default device, or onto a mesh.

  The client names stay behind (strings are host metadata and cannot enter a jitted function).
  Done once, not every round.

  Args:
    data: the host pool (e.g. ``from_client_arrays``'s, or a ``split.train``).
    mesh: a device mesh with an axis named ``'clients'``: the pool split by client
      (``owner_layout``), each device holding only the examples of the clients it owns; None:
      the default device.
    replicate: with ``mesh``, the whole pool on every device instead (the round then deals the
      cohort to the devices by budget, ``core.round.deal``; a copy of the pool per device).

  Returns:
    The ``FederatedData`` on the device(s), without client names.

  Raises:
    ValueError: a malformed pool (``check_pool``).

  Examples:
    >>> from fedjax_gel.data import leaf_synthetic
    >>> import fedjax_gel as fg
    >>> train = fg.to_device(leaf_synthetic.load().train)
  """
  import jax  # pylint: disable=g-import-not-at-top
  from fedjax_gel.core import devices  # pylint: disable=g-import-not-at-top
  check_pool(data, 'to_device')
  if mesh is not None and replicate:
    return FederatedData(*devices.replicate(
        (dict(data.examples), np.asarray(data.offsets, np.int32),
         np.asarray(data.counts, np.int32)), mesh))
  if mesh is not None:
    data = owner_layout(data, mesh.shape[devices.CLIENT_AXIS])
    return FederatedData(devices.split_rows(data.examples, mesh),
                         *devices.replicate((data.offsets, data.counts), mesh))
  # device_put, not jnp.asarray: a transfer, with no program to compile per array
  return FederatedData(
      {k: jax.device_put(np.asarray(v)) for k, v in data.examples.items()},
      jax.device_put(np.asarray(data.offsets, np.int32)),
      jax.device_put(np.asarray(data.counts, np.int32)))


def clients_per_owner(num_clients: int, num_devices: int) -> int:
  """``S = ceil(N / D)``: device ``d`` owns clients ``d S .. (d + 1) S - 1`` (the last ones may
  own fewer, or none), and the rows of a per-client store split the same way."""
  return -(-num_clients // num_devices)


def owner_blocks(counts, num_devices: int) -> tuple[list, int]:
  """``(clients of each device, rows L of each device's block)``: ``L`` is the largest number
  of examples a device owns (at least 1)."""
  counts = np.asarray(counts)
  owned = clients_per_owner(len(counts), num_devices)
  blocks = [np.arange(d * owned, min((d + 1) * owned, len(counts))) for d in range(num_devices)]
  return blocks, max(1, max(int(counts[b].sum()) for b in blocks))


def owner_layout(data: FederatedData, num_devices: int) -> FederatedData:
  """The pool re-laid out in ``num_devices`` equal blocks of ``L`` rows (host side): block ``d``
  holds the examples of the clients device ``d`` owns (``clients_per_owner``), in client order,
  then zero rows up to ``L``, the largest block's count. ``offsets`` point into the blocks, so
  client ``i`` still owns rows ``offsets[i] : offsets[i] + counts[i]``, and they rise with
  ``i``. One device: the pool itself (its clients in order, unpadded)."""
  counts = np.asarray(data.counts, np.int32)
  offsets = np.asarray(data.offsets, np.int64)
  blocks, length = owner_blocks(counts, num_devices)
  rows, new_offsets = [], np.zeros(len(counts), np.int32)
  for d, block in enumerate(blocks):
    starts = np.concatenate([[0], np.cumsum(counts[block])[:-1]]).astype(np.int64)
    new_offsets[block] = d * length + starts
    idx = np.concatenate([np.arange(offsets[i], offsets[i] + counts[i]) for i in block] +
                         [np.zeros(0, np.int64)])
    rows.append(np.concatenate([idx, np.full(length - len(idx), -1)]))
  rows = np.concatenate(rows)
  examples = {}
  for k, v in data.examples.items():
    v = np.asarray(v)
    out = v[np.maximum(rows, 0)] if len(v) else np.zeros((len(rows),) + v.shape[1:], v.dtype)
    out[rows < 0] = 0
    examples[k] = out
  return FederatedData(examples, new_offsets, counts, data.client_names)


class FederatedSplit(NamedTuple):
  """Train and test pools over the same clients (same order).

  Attributes:
    train: the clients' training examples.
    test: the same clients' test examples.
  """
  train: FederatedData
  test: FederatedData


def digest(*pools: FederatedData) -> str:
  """SHA-256 of ``pools``: each one's features (names, dtypes, shapes, values), offsets and
  counts, not its clients' names. The same data give the same digest on any machine and from
  any source; a run's ``config.json`` records it (``data_sha256``)."""
  h = hashlib.sha256()
  for pool in pools:
    arrays = [*sorted(pool.examples.items()), ('offsets', pool.offsets), ('counts', pool.counts)]
    for name, a in arrays:
      a = np.ascontiguousarray(np.asarray(a))
      h.update(f'{name} {a.dtype.str} {a.shape};'.encode())
      h.update(a.reshape(-1).view(np.uint8))
  return h.hexdigest()
