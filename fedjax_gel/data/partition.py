"""Label-skewed partitions of a centralised dataset into clients.

* ``dirichlet``: Hsu et al. 2019, "Measuring the Effects of Non-Identical Data Distribution for
  Federated Visual Classification", Section 3: client ``c`` draws label proportions
  ``q_c ~ Dir(alpha * p)``, ``p`` the prior over labels. Here ``p`` is the dataset's own label
  distribution (label counts / N), so ``E[q_c] = p`` and, as ``alpha -> inf``, every client
  matches the whole dataset, while ``alpha -> 0`` gives one label per client.
* ``pachinko``: Reddi et al. 2021, "Adaptive Federated Optimization", Appendix C (CIFAR-100):
  client ``c`` draws coarse proportions ``Dir(alpha)`` over the superclasses and, per
  superclass, fine proportions ``Dir(beta)`` over its labels (symmetric Dirichlets, as the paper;
  TFF's CIFAR-100 uses alpha = 0.1, beta = 10, 500 clients x 100 training examples).

Both follow the papers' sampling: clients are filled one after the other, each example of client
``c`` drawn from ``q_c`` *without replacement* from what earlier clients left; a label that runs
out is dropped and the proportions renormalised over the labels still available (Pachinko: a fine
label's share goes to its siblings, a superclass's to the other superclasses). Client ``c``'s
counts are drawn in batches (``multinomial``, then the excess over a label's stock redrawn),
which has the same distribution as drawing the examples one at a time with renormalisation.
If a client's proportions put no mass on any label still available (all of its labels ran out,
or a Dirichlet draw underflowed to 0), its remaining examples are drawn uniformly over them.

Client sizes are equal (``N // C``, the first ``N % C`` clients one more), as in both papers, so
every example is assigned exactly once and no client is empty whenever ``N >= C`` (checked).
The last clients take what the others left, so their label mixes follow the leftovers more
than their own ``q_c``.

Every function returns one sorted ``int64`` index array per client. ``seed`` accepts an int or a
``np.random.SeedSequence``; ``dirichlet`` and ``pachinko`` draw the proportions from the first
and the allocation from the second of ``SeedSequence(seed).spawn(2)``, so a loader can reuse the
proportions for a second split (``allocate``, ``allocate_pachinko``).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ['allocate', 'allocate_pachinko', 'child_seeds', 'client_sizes', 'dirichlet',
           'dirichlet_proportions', 'label_prior', 'pachinko', 'pachinko_proportions',
           'superclass_of']

Seed = int | np.random.SeedSequence


def child_seeds(seed: Seed, n: int) -> list[np.random.SeedSequence]:
  """``SeedSequence(seed).spawn(n)``, without advancing a given ``SeedSequence``'s spawn count."""
  ss = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
  return [np.random.SeedSequence(ss.entropy, spawn_key=ss.spawn_key + (i,),
                                 pool_size=ss.pool_size) for i in range(n)]


def _labels(labels: np.ndarray, name: str = 'labels') -> np.ndarray:
  labels = np.asarray(labels)
  if labels.ndim != 1 or (labels.size and labels.dtype.kind not in 'iu'):
    raise ValueError(f'{name} must be a 1-D integer array, got {labels.dtype} {labels.shape}')
  if labels.size and labels.min() < 0:
    raise ValueError(f'{name} must be >= 0, got {labels.min()}')
  return labels.astype(np.int64)


def client_sizes(num_examples: int, num_clients: int) -> np.ndarray:
  """Equal sizes summing to ``num_examples``; the first ``num_examples % num_clients`` get one
  more. Raises ``ValueError`` unless ``1 <= num_clients <= num_examples`` (no empty client)."""
  if int(num_clients) != num_clients or num_clients < 1:
    raise ValueError(f'num_clients must be a positive integer, got {num_clients}')
  if num_examples < num_clients:
    raise ValueError(f'{num_examples} examples cannot fill {num_clients} clients '
                     '(every client needs at least one)')
  q, r = divmod(int(num_examples), int(num_clients))
  return np.array([q + 1] * r + [q] * (num_clients - r), dtype=np.int64)


def label_prior(labels: np.ndarray, num_classes: int | None = None) -> np.ndarray:
  """The labels' empirical distribution ``[K]`` (``K = num_classes`` or ``max + 1``)."""
  labels = _labels(labels)
  k = int(labels.max()) + 1 if num_classes is None else num_classes
  counts = np.bincount(labels, minlength=k).astype(np.float64)
  if len(counts) > k:
    raise ValueError(f'labels reach {len(counts) - 1} but num_classes is {k}')
  return counts / counts.sum()


def _check_concentration(name: str, v: float) -> None:
  if not np.isfinite(v) or v <= 0:
    raise ValueError(f'{name} must be a positive, finite Dirichlet concentration, got {v}')


def _dirichlet_rows(rng: np.random.Generator, conc: np.ndarray, n: int) -> np.ndarray:
  """``n`` draws of ``Dir(conc)`` where ``conc > 0``; zero concentration gives zero weight."""
  out = np.zeros((n, len(conc)))
  live = conc > 0
  if live.sum() == 1:
    out[:, live] = 1.0
  elif live.any():
    out[:, live] = rng.dirichlet(conc[live], n)
  return out


def dirichlet_proportions(prior: np.ndarray, num_clients: int, alpha: float,
                          seed: Seed = 0) -> np.ndarray:
  """``[C, K]`` rows ``q_c ~ Dir(alpha * prior)`` (labels with zero prior get zero weight)."""
  _check_concentration('alpha', alpha)
  prior = np.asarray(prior, np.float64)
  if prior.ndim != 1 or (prior < 0).any() or not prior.sum() > 0:
    raise ValueError('prior must be a 1-D array of non-negative weights with a positive sum')
  rng = np.random.default_rng(seed)
  return _dirichlet_rows(rng, alpha * prior / prior.sum(), int(num_clients))


def _draw(rng: np.random.Generator, p: np.ndarray, stock: np.ndarray, n: int) -> np.ndarray:
  """Counts of ``n`` draws from ``p`` without replacement from ``stock``, renormalising ``p``
  over the labels left. Needs ``n <= stock.sum()``."""
  counts = np.zeros_like(stock)
  while n > 0:
    left = stock - counts
    w = np.where(left > 0, p, 0.0)
    if not w.sum() > 0:
      w = (left > 0).astype(np.float64)
    got = np.minimum(rng.multinomial(n, w / w.sum()), left)
    counts += got
    n -= int(got.sum())
  return counts


def _assign(labels: np.ndarray, counts: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
  """Turns per-client label counts ``[C, K]`` into index arrays, each label's examples dealt
  out in a random order."""
  owner = np.empty(len(labels), np.int64)
  order = rng.permutation(len(labels))
  by_label = order[np.argsort(labels[order], kind='stable')]
  starts = np.concatenate([[0], np.cumsum(np.bincount(labels, minlength=counts.shape[1]))])
  for k in range(counts.shape[1]):
    owner[by_label[starts[k]:starts[k + 1]]] = np.repeat(np.arange(len(counts)), counts[:, k])
  members = np.argsort(owner, kind='stable')
  return np.split(members, np.cumsum(counts.sum(1))[:-1])


def allocate(labels: np.ndarray, proportions: np.ndarray, seed: Seed = 0,
             sizes: Sequence[int] | None = None) -> list[np.ndarray]:
  """Deals ``labels``' indices to clients with label proportions ``proportions[c]`` (``[C, K]``).

  Client sizes default to ``client_sizes(N, C)``; see the module docstring for the sampling.
  """
  labels = _labels(labels)
  proportions = np.asarray(proportions, np.float64)
  num_clients, k = proportions.shape
  if labels.size and labels.max() >= k:
    raise ValueError(f'labels reach {labels.max()} but proportions cover {k} labels')
  sizes = client_sizes(len(labels), num_clients) if sizes is None else np.asarray(sizes, np.int64)
  if len(sizes) != num_clients or sizes.sum() != len(labels) or (sizes < 0).any():
    raise ValueError(f'sizes must be {num_clients} non-negative counts summing to {len(labels)}')
  rng = np.random.default_rng(seed)
  stock = np.bincount(labels, minlength=k)
  counts = np.zeros((num_clients, k), np.int64)
  for c in range(num_clients):
    counts[c] = _draw(rng, proportions[c], stock, int(sizes[c]))
    stock -= counts[c]
  return _assign(labels, counts, rng)


def dirichlet(labels: np.ndarray, num_clients: int, alpha: float,
              seed: Seed = 0) -> list[np.ndarray]:
  """Hsu et al.'s partition: ``q_c ~ Dir(alpha * p)`` with ``p = label_prior(labels)``.

  Returns ``num_clients`` sorted index arrays of equal size (up to one), together a permutation
  of ``range(len(labels))``.
  """
  labels = _labels(labels)
  client_sizes(len(labels), num_clients)
  s_prop, s_alloc = child_seeds(seed, 2)
  q = dirichlet_proportions(label_prior(labels), num_clients, alpha, s_prop)
  return allocate(labels, q, s_alloc)


def superclass_of(fine_labels: np.ndarray, coarse_labels: np.ndarray) -> np.ndarray:
  """``[K]`` superclass of each fine label (``-1`` where absent); ``ValueError`` if a fine
  label appears under two superclasses."""
  fine, coarse = _labels(fine_labels, 'fine_labels'), _labels(coarse_labels, 'coarse_labels')
  if fine.shape != coarse.shape:
    raise ValueError(f'fine_labels {fine.shape} and coarse_labels {coarse.shape} differ in shape')
  parent = np.full(int(fine.max()) + 1 if fine.size else 0, -1, np.int64)
  present, first = np.unique(fine, return_index=True)
  parent[present] = coarse[first]
  bad = parent[fine] != coarse
  if bad.any():
    j = int(np.argmax(bad))
    raise ValueError(f'fine label {fine[j]} appears under superclasses {parent[fine[j]]} and '
                     f'{coarse[j]}')
  return parent


def pachinko_proportions(parent: np.ndarray, num_clients: int, alpha: float, beta: float,
                         seed: Seed = 0) -> tuple[np.ndarray, np.ndarray]:
  """``(coarse [C, S], fine [C, K])``: ``coarse[c] ~ Dir(alpha 1_S)`` and, per superclass ``s``,
  ``fine[c, parent == s] ~ Dir(beta 1)`` (so each superclass's fine row sums to 1)."""
  _check_concentration('alpha', alpha)
  _check_concentration('beta', beta)
  rng = np.random.default_rng(seed)
  num_coarse = int(parent.max()) + 1
  coarse = rng.dirichlet(np.full(num_coarse, float(alpha)), int(num_clients))
  fine = np.zeros((int(num_clients), len(parent)))
  for s in range(num_coarse):
    members = parent == s
    fine[:, members] = _dirichlet_rows(rng, np.full(members.sum(), float(beta)), num_clients)
  return coarse, fine


def allocate_pachinko(fine_labels: np.ndarray, coarse_labels: np.ndarray, coarse: np.ndarray,
                      fine: np.ndarray, seed: Seed = 0,
                      sizes: Sequence[int] | None = None) -> list[np.ndarray]:
  """Deals indices to clients by Pachinko allocation with the given proportions.

  Per client: superclass counts from ``coarse[c]`` over the superclasses with examples left,
  then, per superclass, fine counts from ``fine[c]`` over its fine labels left.
  """
  parent = superclass_of(fine_labels, coarse_labels)
  labels = _labels(fine_labels, 'fine_labels')
  num_clients = len(coarse)
  sizes = client_sizes(len(labels), num_clients) if sizes is None else np.asarray(sizes, np.int64)
  if len(sizes) != num_clients or sizes.sum() != len(labels) or (sizes < 0).any():
    raise ValueError(f'sizes must be {num_clients} non-negative counts summing to {len(labels)}')
  k, num_coarse = fine.shape[1], coarse.shape[1]
  if len(parent) > k or parent.max() >= num_coarse:
    raise ValueError('proportions do not cover every fine label and superclass')
  parent = np.concatenate([parent, np.full(k - len(parent), -1)])
  groups = [np.flatnonzero(parent == s) for s in range(num_coarse)]
  rng = np.random.default_rng(seed)
  stock = np.bincount(labels, minlength=k)
  counts = np.zeros((num_clients, k), np.int64)
  for c in range(num_clients):
    coarse_stock = np.array([stock[g].sum() for g in groups])
    per_coarse = _draw(rng, coarse[c], coarse_stock, int(sizes[c]))
    for s in np.flatnonzero(per_coarse):
      g = groups[s]
      counts[c, g] = _draw(rng, fine[c, g], stock[g], int(per_coarse[s]))
    stock -= counts[c]
  return _assign(labels, counts, rng)


def pachinko(fine_labels: np.ndarray, coarse_labels: np.ndarray, num_clients: int,
             alpha: float = 0.1, beta: float = 10.0, seed: Seed = 0) -> list[np.ndarray]:
  """Reddi et al.'s Pachinko allocation (defaults: TFF's CIFAR-100, alpha 0.1, beta 10).

  ``coarse_labels[i]`` must be the superclass of ``fine_labels[i]`` (one per fine label).
  Returns ``num_clients`` sorted index arrays of equal size (up to one), together a permutation
  of ``range(len(fine_labels))``.
  """
  parent = superclass_of(fine_labels, coarse_labels)
  client_sizes(len(fine_labels), num_clients)
  s_prop, s_alloc = child_seeds(seed, 2)
  coarse, fine = pachinko_proportions(parent, num_clients, alpha, beta, s_prop)
  return allocate_pachinko(fine_labels, coarse_labels, coarse, fine, s_alloc)
