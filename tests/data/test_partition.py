"""Tests for the Dirichlet and Pachinko label partitions."""
from __future__ import annotations

import numpy as np
import pytest

from fedjax_gel.data import partition


def skewed_labels(n=10_000, k=10, seed=0):
  """Labels whose global distribution is far from uniform (p_k proportional to k + 1)."""
  p = np.arange(1, k + 1, dtype=np.float64)
  return np.random.default_rng(seed).choice(k, size=n, p=p / p.sum())


def cifar100_like(per_fine=500):
  """100 fine labels, fine label f in superclass f % 20 (not contiguous, to catch mix-ups)."""
  fine = np.random.default_rng(1).permutation(np.repeat(np.arange(100), per_fine))
  return fine, fine % 20


def assert_partition(parts, n, num_clients):
  assert len(parts) == num_clients
  assert all(p.dtype == np.int64 and len(p) > 0 for p in parts)
  assert all(np.all(np.diff(p) > 0) for p in parts)  # sorted, no repeats
  np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(n))
  sizes = np.array([len(p) for p in parts])
  assert sizes.max() - sizes.min() <= 1


def proportions(labels, parts, k):
  return np.array([np.bincount(labels[p], minlength=k) / len(p) for p in parts])


@pytest.mark.parametrize('alpha', [0.01, 0.5, 100.0])
@pytest.mark.parametrize('n,num_clients', [(10_000, 100), (1003, 10), (7, 7)])
def test_dirichlet_assigns_every_example_once(alpha, n, num_clients):
  labels = skewed_labels(n)
  assert_partition(partition.dirichlet(labels, num_clients, alpha, seed=3), n, num_clients)


def test_dirichlet_large_alpha_approaches_prior():
  labels = skewed_labels()
  prior = partition.label_prior(labels)
  np.testing.assert_allclose(prior, np.bincount(labels) / len(labels))
  parts = partition.dirichlet(labels, 10, 1e5, seed=0)
  q = proportions(labels, parts, 10)
  # 1,000 examples per client: multinomial sd <= 0.016 per label.
  assert np.abs(q - prior).max() < 0.06
  wide = proportions(labels, partition.dirichlet(labels, 10, 1.0, seed=0), 10)
  assert np.abs(wide - prior).max() > 0.2


def test_dirichlet_small_alpha_one_label_dominates():
  labels = skewed_labels()
  parts = partition.dirichlet(labels, 100, 0.01, seed=1)
  top = proportions(labels, parts, 10).max(1)
  assert np.mean(top > 0.8) > 0.7
  spread = proportions(labels, partition.dirichlet(labels, 100, 100.0, seed=1), 10).max(1)
  assert np.mean(spread > 0.8) == 0


def test_dirichlet_proportions_follow_alpha_times_prior():
  prior = np.array([0.5, 0.3, 0.2, 0.0])
  q = partition.dirichlet_proportions(prior, 4000, 2.0, seed=0)
  assert q.shape == (4000, 4)
  np.testing.assert_allclose(q.sum(1), 1.0)
  assert np.all(q[:, 3] == 0)  # no weight on absent labels
  np.testing.assert_allclose(q.mean(0), prior, atol=0.01)
  # Dir(a): Var q_k = p_k (1 - p_k) / (sum a + 1) with sum a = alpha.
  np.testing.assert_allclose(q.var(0)[:3], prior[:3] * (1 - prior[:3]) / 3.0, rtol=0.1)


def test_dirichlet_deterministic_by_seed():
  labels = skewed_labels(2000)
  a, b = partition.dirichlet(labels, 20, 0.3, seed=5), partition.dirichlet(labels, 20, 0.3, seed=5)
  c = partition.dirichlet(labels, 20, 0.3, seed=6)
  assert all(np.array_equal(x, y) for x, y in zip(a, b))
  assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_dirichlet_equals_proportions_then_allocate():
  labels = skewed_labels(3000)
  s_prop, s_alloc = np.random.SeedSequence(9).spawn(2)
  q = partition.dirichlet_proportions(partition.label_prior(labels), 30, 0.5, s_prop)
  want = partition.allocate(labels, q, s_alloc)
  got = partition.dirichlet(labels, 30, 0.5, seed=9)
  assert all(np.array_equal(x, y) for x, y in zip(got, want))


def test_allocate_runs_labels_out_and_renormalises():
  labels = np.array([0] * 5 + [1] * 95)
  q = np.array([[1.0, 0.0], [1.0, 0.0]])  # both want label 0, which has only 5 examples
  parts = partition.allocate(labels, q, seed=0)
  assert_partition(parts, 100, 2)
  assert np.bincount(labels[parts[0]], minlength=2).tolist() == [5, 45]
  parts = partition.allocate(labels, q, seed=0, sizes=[10, 90])
  assert [len(p) for p in parts] == [10, 90]


@pytest.mark.parametrize('args,match', [
    ((np.array([0, 1]), 3, 1.0), 'cannot fill'),
    ((np.array([0, 1]), 0, 1.0), 'num_clients'),
    ((np.array([0, 1]), 1, 0.0), 'alpha'),
    ((np.array([0.5, 1]), 1, 1.0), 'integer'),
    ((np.array([-1, 1]), 1, 1.0), '>= 0'),
])
def test_dirichlet_rejects_bad_arguments(args, match):
  with pytest.raises(ValueError, match=match):
    partition.dirichlet(*args)


def test_pachinko_tff_cifar100_shape():
  fine, coarse = cifar100_like()
  parts = partition.pachinko(fine, coarse, 500, seed=0)
  assert_partition(parts, 50_000, 500)
  assert {len(p) for p in parts} == {100}


def test_pachinko_coarse_and_fine_are_consistent():
  fine, coarse = cifar100_like(per_fine=100)
  parts = partition.pachinko(fine, coarse, 100, alpha=0.1, beta=10.0, seed=2)
  assert_partition(parts, 10_000, 100)
  parent = partition.superclass_of(fine, coarse)
  np.testing.assert_array_equal(parent, np.arange(100) % 20)
  for p in parts:
    np.testing.assert_array_equal(parent[fine[p]], coarse[p])
    np.testing.assert_array_equal(np.bincount(coarse[p], minlength=20),
                                  np.bincount(fine[p] % 20, minlength=20))
  # alpha = 0.1 over 20 superclasses: a client's examples sit in few superclasses.
  coarse_top = proportions(coarse, parts, 20).max(1)
  assert np.median(coarse_top) > 0.5
  # beta = 10 within a superclass: its 5 fine labels are used nearly evenly by early clients.
  first = parts[0]
  s = np.bincount(coarse[first]).argmax()
  in_s = np.bincount(fine[first][coarse[first] == s], minlength=100)[np.arange(s, 100, 20)]
  assert (in_s > 0).sum() >= 4


def test_pachinko_small_beta_concentrates_fine_labels():
  fine, coarse = cifar100_like(per_fine=100)
  spread = partition.pachinko(fine, coarse, 100, alpha=0.1, beta=10.0, seed=4)
  peaked = partition.pachinko(fine, coarse, 100, alpha=0.1, beta=0.01, seed=4)

  def fine_purity(parts):  # share of a client's top superclass taken by its top fine label
    out = []
    for p in parts[:50]:
      s = np.bincount(coarse[p]).argmax()
      f = fine[p][coarse[p] == s]
      out.append(np.bincount(f).max() / len(f))
    return np.mean(out)

  assert fine_purity(peaked) > 0.9 > 0.5 > fine_purity(spread)


def test_pachinko_deterministic_by_seed():
  fine, coarse = cifar100_like(per_fine=20)
  a = partition.pachinko(fine, coarse, 20, seed=1)
  b = partition.pachinko(fine, coarse, 20, seed=1)
  c = partition.pachinko(fine, coarse, 20, seed=2)
  assert all(np.array_equal(x, y) for x, y in zip(a, b))
  assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_pachinko_proportions_shapes():
  parent = np.arange(100) % 20
  coarse, fine = partition.pachinko_proportions(parent, 7, 0.1, 10.0, seed=0)
  assert coarse.shape == (7, 20) and fine.shape == (7, 100)
  np.testing.assert_allclose(coarse.sum(1), 1.0)
  for s in range(20):
    np.testing.assert_allclose(fine[:, parent == s].sum(1), 1.0)


def test_pachinko_rejects_inconsistent_superclasses():
  fine = np.array([0, 1, 0, 2])
  with pytest.raises(ValueError, match='fine label 0 appears under superclasses 0 and 1'):
    partition.pachinko(fine, np.array([0, 0, 1, 1]), 2)
  with pytest.raises(ValueError, match='shape'):
    partition.pachinko(fine, np.array([0, 0, 0]), 2)
  with pytest.raises(ValueError, match='beta'):
    partition.pachinko(fine, np.array([0, 0, 0, 1]), 2, beta=-1.0)


def test_child_seeds_match_spawn_and_do_not_advance():
  ss = np.random.SeedSequence(3)
  a = partition.child_seeds(ss, 2)
  b = partition.child_seeds(ss, 2)
  want = np.random.SeedSequence(3).spawn(2)
  for x, y, z in zip(a, b, want):
    assert x.generate_state(4).tolist() == y.generate_state(4).tolist()
    assert x.generate_state(4).tolist() == z.generate_state(4).tolist()
  labels = skewed_labels(500)
  p1 = partition.dirichlet(labels, 5, 0.5, seed=ss)
  p2 = partition.dirichlet(labels, 5, 0.5, seed=ss)
  p3 = partition.dirichlet(labels, 5, 0.5, seed=3)
  assert all(np.array_equal(x, y) and np.array_equal(x, z) for x, y, z in zip(p1, p2, p3))
