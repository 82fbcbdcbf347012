"""Federated data as a flat, device-resident example pool.

A federated dataset is one pytree of arrays whose leading axis runs over *all* examples of *all*
clients, plus ``offsets[N]`` and ``counts[N]``: client ``i`` owns pool rows
``offsets[i] : offsets[i] + counts[i]``. There is no per-client padding, so a population whose
clients range from 5 to 50,000 examples costs exactly its number of examples.
"""
from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

Examples = Mapping[str, Any]  # e.g. {'x': [P, ...] features, 'y': [P] int labels}


class FederatedData(NamedTuple):
  """A flat example pool with per-client ranges.

  Attributes:
    examples: dict of arrays, each with leading axis ``P`` (total examples).
    offsets: ``[N]`` int32, first pool row of each client.
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
  """Builds a pool from one dict of equally keyed numpy arrays per client (host side)."""
  if not clients:
    raise ValueError('a federated dataset needs at least one client')
  keys = sorted(clients[0])
  counts = np.array([len(c[keys[0]]) for c in clients], dtype=np.int32)
  for c, n in zip(clients, counts):
    if sorted(c) != keys or any(len(c[k]) != n for k in keys):
      raise ValueError('every client needs the same fields, each with one row per example')
  offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32)
  examples = {k: np.concatenate([np.asarray(c[k]) for c in clients]) for k in keys}
  names = tuple(client_names) if client_names is not None else tuple(str(i) for i in range(len(clients)))
  return FederatedData(examples, offsets, counts, names)


def client_examples(data: FederatedData, i: int) -> dict:
  """The examples of client ``i`` as numpy arrays (host side; for tests and tools)."""
  lo, n = int(data.offsets[i]), int(data.counts[i])
  return {k: np.asarray(v)[lo:lo + n] for k, v in data.examples.items()}


def to_device(data: FederatedData) -> FederatedData:
  """Moves the pool and the index arrays onto the default device.

  The client names stay behind (strings are host metadata and cannot enter a jitted function).
  """
  import jax  # pylint: disable=g-import-not-at-top
  # device_put, not jnp.asarray: a transfer, with no program to compile per array
  return FederatedData(
      {k: jax.device_put(np.asarray(v)) for k, v in data.examples.items()},
      jax.device_put(np.asarray(data.offsets, np.int32)),
      jax.device_put(np.asarray(data.counts, np.int32)))


class FederatedSplit(NamedTuple):
  """Train and test pools over the same clients (same order)."""
  train: FederatedData
  test: FederatedData
