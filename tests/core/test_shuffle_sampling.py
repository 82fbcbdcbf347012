"""Data order and samplers: uniformity, cycling, pairing by (seed, round)."""
import collections
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_gel.core import keys
from fedjax_gel.core.sampling import (Cohort, CohortSpec, aggregation_weights, check_cohort,
                                      sample_budgets, sample_clients, sample_cohort)
from fedjax_gel.core.shuffle import cycled_permutation, fisher_yates_draws, partial_fisher_yates

perms = jax.jit(jax.vmap(cycled_permutation, in_axes=(0, 0, None)), static_argnums=2)


def chi2_uniform(counter, categories, draws):
  expected = draws / len(categories)
  return sum((counter.get(c, 0) - expected) ** 2 / expected for c in categories)


def sequential_fisher_yates(draws, length):
  """The textbook algorithm, one swap after another, on a sparse array (the oracle)."""
  a = {}
  for t, j in enumerate(draws.tolist()):
    a[t], a[j] = a.get(j, j), a.get(t, t)
  return [a.get(t, t) for t in range(length)]


# The packed int32 sort key (bound 10**6 with these lengths) and the pair sort (no bound).
SWAPS = [lambda d: partial_fisher_yates(d, 10**6), partial_fisher_yates]


@pytest.mark.parametrize('swaps', SWAPS)
@pytest.mark.parametrize('length', [1, 2, 7, 40, 150])
@pytest.mark.slow
def test_vectorised_swaps_equal_textbook_fisher_yates(swaps, length):
  fn = jax.jit(jax.vmap(swaps))
  for n in [1, 2, 3, 5, 9, 40, 41, 149, 1000, 10**6]:
    keys_ = jax.random.split(jax.random.key(n), 4)
    draws = np.asarray(jax.vmap(fisher_yates_draws, in_axes=(0, None, None))(keys_, n, length))
    for row, out in zip(draws, np.asarray(fn(draws))):
      assert out.tolist() == sequential_fisher_yates(row, length), (n, row)


@pytest.mark.parametrize('swaps', SWAPS)
@pytest.mark.slow
def test_swaps_resolve_chains_by_hand(swaps):
  # L = 4, n = 6: swaps (0,2) (1,2) (2,5) (3,3): 012345 -> 210345 -> 201345 -> 205341 -> 2053..
  np.testing.assert_array_equal(swaps(jnp.array([2, 2, 5, 3], jnp.int32)), [2, 0, 5, 3])
  # L = 3, n = 9, every draw beyond the buffer, the last two equal: 0<->7, 1<->8, 2<->8.
  np.testing.assert_array_equal(swaps(jnp.array([7, 8, 8], jnp.int32)), [7, 8, 1])


@pytest.mark.parametrize('swaps', SWAPS)
@pytest.mark.parametrize('length', [2, 3, 4, 5, 9, 16, 17, 33, 65, 129])
@pytest.mark.slow
def test_swaps_resolve_the_longest_chains(swaps, length):
  """Step ``t`` swaps ``t`` and ``t + 1``: the value at the last position passes through
  every earlier one, a chain of ``L - 1`` links, the most the pointer jumping must follow
  (``2^k >= L - 1`` jumps exactly at ``L = 2^k + 1``)."""
  draws = np.minimum(np.arange(length) + 1, length - 1).astype(np.int32)
  assert swaps(jnp.asarray(draws)).tolist() == sequential_fisher_yates(draws, length)


@pytest.mark.slow
def test_same_key_same_order_other_key_other_order():
  ks = jax.random.split(jax.random.key(7), 3)
  n = jnp.array([500, 500, 500])
  a, b = np.asarray(perms(ks, n, 64)), np.asarray(perms(ks, n, 64))
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a[0], a[1])
  # the packed and the pair sort give the same order for the same key
  np.testing.assert_array_equal(
      cycled_permutation(ks[0], 500, 64, bound=500), cycled_permutation(ks[0], 500, 64))


@pytest.mark.slow
def test_long_orders_of_small_clients_do_not_overflow_the_packed_key():
  """Steps past ``n`` draw ``j_t = t``, so ``L^2`` bounds the key too: with ``L = 50,000``
  (``L^2 > 2^31``) and ``n = 10`` the pairs are sorted unpacked, and the order still cycles
  through a permutation of the 10 examples."""
  out = np.asarray(cycled_permutation(jax.random.key(3), 10, 50_000, bound=10))
  assert sorted(out[:10].tolist()) == list(range(10))
  np.testing.assert_array_equal(out, np.tile(out[:10], 5_000))


@pytest.mark.slow
def test_order_memory_is_linear_in_length():
  """O(C L) device memory: four times the length, at most about four times XLA's temporary
  buffers (an L x L intermediate would make it sixteen)."""
  def temp(length):
    fn = jax.jit(jax.vmap(lambda k, n: cycled_permutation(k, n, length, bound=10**4)))
    ks, n = jax.random.split(jax.random.key(0), 256), jnp.full((256,), 10**4)
    return fn.lower(ks, n).compile().memory_analysis().temp_size_in_bytes
  small, large = temp(128), temp(512)
  assert large <= 5 * small, (small, large)
  assert large <= 256 * 512 * 64   # and within order_bytes' 56 bytes per position, rounded up


def test_full_permutation_is_uniform():
  draws = 24_000
  out = np.asarray(perms(jax.random.split(jax.random.key(0), draws), jnp.full(draws, 4), 4))
  cats = list(itertools.permutations(range(4)))
  stat = chi2_uniform(collections.Counter(map(tuple, out)), cats, draws)
  assert stat < 49.7   # chi2(23) 99.9% quantile


def test_partial_permutation_is_uniform_over_ordered_draws():
  """Length 2 of n = 7 exercises the sparse map (swaps beyond the buffer)."""
  draws = 21_000
  out = np.asarray(perms(jax.random.split(jax.random.key(1), draws), jnp.full(draws, 7), 2))
  assert all(a != b for a, b in out)
  cats = list(itertools.permutations(range(7), 2))
  stat = chi2_uniform(collections.Counter(map(tuple, out)), cats, draws)
  assert stat < 73.4   # chi2(41) 99.9% quantile


@pytest.mark.parametrize('n,length', [(1, 5), (3, 10), (7, 7), (50, 12), (1000, 40)])
@pytest.mark.slow
def test_cycles_through_a_permutation(n, length):
  out = np.asarray(cycled_permutation(jax.random.key(n), n, length))
  head = out[:min(n, length)]
  assert len(set(head.tolist())) == len(head) and head.min() >= 0 and head.max() < n
  np.testing.assert_array_equal(out, head[np.arange(length) % n] if n < length else head)


def test_cohort_depends_on_seed_and_round_only():
  counts = jnp.arange(5, 105, dtype=jnp.int32)
  spec = CohortSpec(30, (4, 13), 5, replace=False)
  a = sample_cohort(keys.root_key(3), 7, counts, spec)
  b = sample_cohort(keys.root_key(3), 7, counts, spec)
  c = sample_cohort(keys.root_key(3), 8, counts, spec)
  d = sample_cohort(keys.root_key(4), 7, counts, spec)
  np.testing.assert_array_equal(a.client_ids, b.client_ids)
  np.testing.assert_array_equal(a.budgets, b.budgets)
  assert not np.array_equal(a.client_ids, c.client_ids)
  assert not np.array_equal(a.client_ids, d.client_ids)
  assert len(set(np.asarray(a.client_ids).tolist())) == 30   # without replacement
  assert np.all((np.asarray(a.budgets) >= 4) & (np.asarray(a.budgets) <= 13))


def test_budgets_cover_the_whole_range():
  counts = jnp.full((50,), 10, jnp.int32)
  c = sample_cohort(keys.root_key(0), 0, counts, CohortSpec(2000, (4, 13), 5, replace=True))
  assert set(np.asarray(c.budgets).tolist()) == set(range(4, 14))
  assert set(np.asarray(c.client_ids).tolist()) == set(range(50))   # with replacement


def test_aggregation_weights_by_hand():
  budgets, n = jnp.array([4, 13, 2]), jnp.array([100, 30, 7])
  np.testing.assert_array_equal(aggregation_weights('samples_seen', budgets, n, 5), [20, 30, 7])
  np.testing.assert_array_equal(aggregation_weights('num_examples', budgets, n, 5), [100, 30, 7])
  np.testing.assert_array_equal(aggregation_weights('uniform', budgets, n, 5), [1, 1, 1])
  with pytest.raises(ValueError, match='unknown aggregation'):
    aggregation_weights('bogus', budgets, n, 5)


def test_cohort_larger_than_population_without_replacement():
  with pytest.raises(ValueError, match='exceeds the population'):
    sample_cohort(keys.root_key(0), 0, jnp.ones((5,), jnp.int32),
                  CohortSpec(6, (1, 2), 1, replace=False))


@pytest.mark.parametrize('replace', [True, False])
def test_cyclic_participation_never_leaves_the_current_group(replace):
  counts = jnp.full((103,), 10, jnp.int32)   # groups of 26, 26, 26 and 25 clients
  seen = {g: set() for g in range(4)}
  spec = CohortSpec(20, (1, 3), 5, replace=replace, selection='cyclic', groups=4)
  for r in range(12):
    c = sample_cohort(keys.root_key(5), r, counts, spec)
    ids = np.asarray(c.client_ids)
    assert np.all(ids % 4 == r % 4) and ids.max() < 103
    if not replace:
      assert len(set(ids.tolist())) == 20
    seen[r % 4].update(ids.tolist())
  assert all(len(v) > 20 for v in seen.values())   # several rounds spread over each group


def test_cyclic_group_too_small_without_replacement():
  with pytest.raises(ValueError, match='smallest cyclic group'):
    sample_cohort(keys.root_key(0), 0, jnp.ones((10,), jnp.int32),
                  CohortSpec(4, (1, 2), 1, replace=False, selection='cyclic', groups=3))


@pytest.mark.parametrize('kwargs,match', [
    (dict(budget_range=(5, 3)), '1 <= a <= b'),
    (dict(budget_range=(0, 3)), '1 <= a <= b'),
    (dict(batch_size=0), 'batch_size'),
    (dict(weighting='bogus'), 'unknown weighting'),
    # beyond int32 a round failed deep in JAX, or its runtime crashed (a cohort of 2**40)
    (dict(batch_size=2**40), r'4 x 3 x 1099511627776 = \d+ examples exceeds the int32 limit'),
    (dict(budget_range=(2**33, 2**33 + 1)), 'exceeds the int32 limit'),
    (dict(cohort_size=2**40, replace=True), 'exceeds the int32 limit'),
])
def test_cohort_spec_rejects_bad_fields(kwargs, match):
  fields = dict(cohort_size=4, budget_range=(1, 3), batch_size=2) | kwargs
  with pytest.raises(ValueError, match=match):
    CohortSpec(**fields)


@pytest.mark.parametrize('budgets,budget_range,match', [
    ([1, 2, 2], (2, 2), 'other than 2'),   # an equal-budgets spec would run them all 2 steps
    ([0, 2, 2], (2, 2), r'give a spec with a < b, e.g. \(1, 2\)'),
    ([1, 4, 2], (1, 3), r'in \[0, 3\]'),      # more than b: the round would cut it to b
    ([1, -1, 2], (1, 3), r'in \[0, 3\]'),
])
def test_a_hand_made_cohort_with_budgets_its_spec_would_not_run_is_refused(budgets,
                                                                          budget_range, match):
  make = lambda b: check_cohort(Cohort(np.arange(3, dtype=np.int32), np.asarray(b, np.int32),
                                       np.ones(3, np.float32), CohortSpec(3, budget_range, 2)), 3)
  with pytest.raises(ValueError, match=match):
    make(budgets)
  make([budget_range[1]] * 3)   # budgets it runs as given
  make(np.clip(budgets, 0, budget_range[1]) if budget_range[0] < budget_range[1] else [2] * 3)


def test_sample_cohort_with_a_spec_draws_the_documented_streams():
  """Clients from the round's COHORT key, budgets from its BUDGET key (the streams the keyword
  form drew from), the same for two calls, in range, with ``samples_seen`` weights."""
  counts = jnp.arange(3, 43, dtype=jnp.int32)
  root, r = keys.root_key(6), 2
  spec = CohortSpec(25, (2, 9), 4, replace=True, weighting='samples_seen')
  a, b = (sample_cohort(root, r, counts, spec) for _ in range(2))
  assert a.spec == spec
  np.testing.assert_array_equal(a.client_ids, b.client_ids)
  np.testing.assert_array_equal(a.budgets, b.budgets)
  np.testing.assert_array_equal(
      a.client_ids, sample_clients(keys.round_key(root, r, keys.COHORT), 40, 25, True))
  np.testing.assert_array_equal(
      a.budgets, sample_budgets(keys.round_key(root, r, keys.BUDGET), 25, 2, 9))
  ids, budgets = np.asarray(a.client_ids), np.asarray(a.budgets)
  assert ids.min() >= 0 and ids.max() < 40 and budgets.min() >= 2 and budgets.max() <= 9
  np.testing.assert_array_equal(a.weights, np.minimum(4 * budgets, np.asarray(counts)[ids]))


SPEC3 = CohortSpec(3, (1, 4), 2, replace=True)


@pytest.mark.parametrize('ids,budgets,weights,error,match', [
    (np.asarray([0, 1, 5]), None, None, ValueError, r'client_ids must lie in \[0, 5\) for a '
     r'population of 5 clients \(got 0 to 5\)'),
    (np.asarray([-1, 1, 2]), None, None, ValueError, r'client_ids must lie in \[0, 5\)'),
    (None, None, np.asarray([1., -1., 1.]), ValueError, 'weights must be finite and non-negative'),
    (None, None, np.asarray([1., np.nan, 1.]), ValueError, 'weights must be finite'),
    (jnp.asarray([0, 1, 2, 3]), None, None, ValueError, r'one length \(got shapes client_ids '
     r'\(4,\), budgets \(3,\), weights \(3,\)\)'),
    (None, jnp.asarray([[1, 2, 3]]), None, ValueError, 'of one axis and one length'),
    (None, jnp.asarray([1., 2., 3.]), None, TypeError, 'budgets must hold integers, got float32'),
    (jnp.asarray([0., 1., 2.]), None, None, TypeError, 'client_ids must hold integers'),
    (None, None, jnp.asarray([1, 1, 1]), TypeError, 'weights must hold floats, got int32'),
    ([0, 1, 2], None, None, TypeError, 'client_ids must be an array .NumPy or JAX., got list'),
], ids=['id_past_the_population', 'negative_id', 'negative_weight', 'nan_weight',
        'lengths_differ', 'two_axes', 'float_budgets', 'float_ids', 'int_weights', 'list'])
def test_a_hand_made_cohort_of_the_wrong_kind_is_refused(ids, budgets, weights, error, match):
  """The arrays' kinds and shapes, whatever holds them, and on the host their values: the round
  would otherwise take another client's rows (ids clamped) or invent a client (shapes)."""
  fine = (np.arange(3, dtype=np.int32), np.asarray([1, 2, 4], np.int32),
          np.ones(3, np.float32))
  cohort = Cohort(*(fine[i] if x is None else x for i, x in enumerate((ids, budgets, weights))),
                  SPEC3)
  with pytest.raises(error, match=match):
    check_cohort(cohort, 5)
  check_cohort(Cohort(*fine, SPEC3), 5)
  check_cohort(Cohort(*map(jnp.asarray, fine), SPEC3), 5)
  check_cohort(Cohort(np.asarray([4, 4, 0], np.int32), fine[1],
                      np.asarray([0., 2., 1.], jnp.bfloat16), SPEC3), 5)


def test_sample_cohort_refuses_ids_and_budgets_that_do_not_fit():
  """Host ids outside the population and per-client budgets outside the range or of another
  length (the sampler would clamp the ids and clip the budgets)."""
  counts = jnp.full(5, 10, jnp.int32)
  spec = CohortSpec(3, (2, 4), 2, budget_draw='per_client')
  root = keys.root_key(0)
  with pytest.raises(ValueError, match=r'client_ids must lie in \[0, 5\) .* \(got 0 to 7\)'):
    sample_cohort(root, 0, counts, spec, client_ids=np.asarray([0, 1, 7]),
                  client_budgets=np.full(5, 3))
  with pytest.raises(ValueError, match=r'client_budgets must lie within budget_range \(2, 4\)'):
    sample_cohort(root, 0, counts, spec, client_budgets=np.asarray([3, 3, 100, 3, 3]))
  with pytest.raises(ValueError, match=r'one budget per client, \[5\] \(got shape \(1,\)\)'):
    sample_cohort(root, 0, counts, spec, client_budgets=jnp.asarray([3]))
  with pytest.raises(ValueError, match=r"client_ids must hold the cohort's 3 clients, "
                     r'\[cohort_size\] \(got shape \(2,\)\)'):   # a malformed Cohort before
    sample_cohort(root, 0, counts, spec, client_ids=jnp.asarray([0, 1]),
                  client_budgets=np.full(5, 3))
  c = sample_cohort(root, 0, counts, spec, client_budgets=np.asarray([2, 3, 4, 2, 3]))
  np.testing.assert_array_equal(c.budgets, np.asarray([2, 3, 4, 2, 3])[np.asarray(c.client_ids)])


@pytest.mark.parametrize('kwargs,match', [
    (dict(budget_range=(2.7, 4.2)), r"budget_range must be \(a, b\) of integers, got \(2\.7, 4\.2\)"),
    (dict(budget_range=(1, '4')), 'budget_range must be'),
    (dict(budget_range=(1, 2, 3)), 'budget_range must be'),
    (dict(cohort_size=2.5), 'cohort_size must be a positive integer, got 2.5'),
    (dict(batch_size='3'), "batch_size must be a positive integer, got '3'"),
    (dict(batch_size=True), 'batch_size must be a positive integer, got True'),
])
def test_a_spec_of_counts_that_are_not_whole_numbers_is_refused(kwargs, match):
  """CohortSpec truncated them (budgets (2.7, 4.2) ran as (2, 4)) or failed deep in JAX."""
  with pytest.raises(ValueError, match=match):
    CohortSpec(**{**dict(cohort_size=3, budget_range=(1, 4), batch_size=2), **kwargs})
  spec = CohortSpec(np.int64(3), (2., jnp.int32(4)), 2.)   # whole numbers of other types
  assert (spec.cohort_size, spec.budget_range, spec.batch_size) == (3, (2, 4), 2)
  assert all(type(v) is int for v in (spec.cohort_size, spec.batch_size, *spec.budget_range))


@pytest.mark.parametrize('counts,error,words', [
    (np.asarray([3, -1, 5]), ValueError, r'counts must be >= 0 \(got -1\)'),
    (np.asarray([3., 1.]), ValueError, r'integers of one axis \(got float64 \(2,\)\)'),
    (np.zeros((2, 2), np.int32), ValueError, r'integers of one axis \(got int32 \(2, 2\)\)'),
    (np.zeros(0, np.int32), ValueError, 'integers of one axis'),
    (None, ValueError, r'integers of one axis \(got NoneType \(\)\)'),
], ids=['negative', 'floats', 'two_axes', 'no_clients', 'none'])
def test_sample_cohort_refuses_counts_that_are_not_a_population(counts, error, words):
  spec = CohortSpec(4, (1, 3), 2, replace=True)
  with pytest.raises(error, match=f'^sample_cohort: .*{words}'):
    sample_cohort(keys.root_key(0), 0, counts, spec)
  as_list = sample_cohort(keys.root_key(0), 0, [3, 4, 5], spec)   # a list is taken as an array
  np.testing.assert_array_equal(
      as_list.client_ids, sample_cohort(keys.root_key(0), 0, np.asarray([3, 4, 5]), spec).client_ids)


def test_cohort_spec_replace_must_be_a_bool():
  """``replace='no'`` was taken as true (a non-empty string)."""
  with pytest.raises(ValueError, match="replace must be True or False, got 'no'"):
    CohortSpec(4, (1, 3), 2, replace='no')
  assert CohortSpec(4, (1, 3), 2, replace=np.bool_(False)).replace is False


@pytest.mark.parametrize('seed', [2**32, 2**40, -1, 1.5, 'a', True])
def test_root_key_refuses_seeds_that_would_collide(seed):
  """``root_key(2**32)`` was ``root_key(0)``'s key, and -1 was taken: two seeds, one run."""
  with pytest.raises(ValueError, match=r'root_key: seed must be an integer in \[0, 4294967295\]'):
    keys.root_key(seed)
  assert not np.array_equal(jax.random.key_data(keys.root_key(2**32 - 1)),
                            jax.random.key_data(keys.root_key(0)))
