"""Poisson client sampling: the slots against the binomial tail, the cohort sizes' distribution
and each client's rate against Binomial(N, q), and absent slots that take no part: a round of a
Poisson cohort equals the round of its present clients alone (the vmapped round, the debug
round, equal budgets, and a per-client store whose absent rows stay as they were)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from fedjax_gel import algorithms, models
from fedjax_gel.core import keys, sampling
from fedjax_gel.core.backend import Backend
from fedjax_gel.core.round import build_round
from fedjax_gel.core.sampling import Cohort, CohortSpec

from helpers import assert_trees_close, init_params


@pytest.mark.parametrize('n, q', [(13, 0.5), (1000, 0.02), (3400, 0.3), (50, 1.0)])
def test_the_slots_hold_every_cohort_but_a_tail_below_one_in_a_trillion(n, q):
  k = sampling.poisson_slots(n, q)
  assert stats.binom.sf(k, n, q) <= sampling.POISSON_TAIL
  assert k == n or stats.binom.sf(k - 1, n, q) > sampling.POISSON_TAIL   # the smallest such


def test_cohort_sizes_are_binomial_and_every_client_is_drawn_at_rate_q():
  n, q, rounds = 40, 0.2, 4000
  slots = sampling.poisson_slots(n, q)
  root = keys.root_key(5)
  draw = jax.jit(jax.vmap(lambda r: sampling.sample_clients_poisson(
      keys.round_key(root, r, keys.COHORT), n, slots, q)))
  ids, present = map(np.asarray, draw(jnp.arange(rounds)))
  sizes = present.sum(1)
  # chi-square of the sizes against Binomial(40, 0.2), tails pooled to expected counts >= 5
  edges = [0, 4, 5, 6, 7, 8, 9, 10, 11, 12, 41]
  observed = np.histogram(sizes, edges)[0]
  expected = rounds * np.diff(stats.binom.cdf(np.array(edges) - 1, n, q))
  assert stats.chisquare(observed, expected).pvalue > 1e-3
  # each client's share of the rounds; the slots are distinct clients, the drawn ones first
  drawn = np.zeros((rounds, n), bool)
  rows = np.repeat(np.arange(rounds)[:, None], slots, 1)
  drawn[rows[present], ids[present]] = True
  rate = drawn.mean(0)
  assert np.all(np.abs(rate - q) < 5 * np.sqrt(q * (1 - q) / rounds))
  assert all(len(set(r)) == slots for r in ids)
  assert np.all(np.diff(present.astype(int), axis=1) <= 0)
  # sample_cohort draws from the same stream, and leaves absent slots without budget or weight
  spec = CohortSpec(slots, (1, 4), 3, selection='poisson', rate=q)
  c = sampling.sample_cohort(root, 7, np.full(n, 5, np.int32), spec)
  np.testing.assert_array_equal(c.client_ids, ids[7])
  np.testing.assert_array_equal(c.present, present[7])
  assert not np.any(np.asarray(c.budgets)[~present[7]]) and not np.any(
      np.asarray(c.weights)[~present[7]])


def present_only(c: Cohort) -> Cohort:
  """The cohort of ``c``'s present slots (the first ones), drawn as a fixed-size cohort."""
  m = int(np.sum(c.present))
  spec = CohortSpec(m, c.spec.budget_range, c.spec.batch_size)
  return Cohort(c.client_ids[:m], c.budgets[:m], c.weights[:m], spec, c.population)


@pytest.mark.parametrize('name, budget_range', [('fedavgcm', (1, 6)), ('gel', (1, 6)),
                                                ('fedavgcm', (3, 3)), ('scaffold', (1, 6))])
@pytest.mark.slow
def test_absent_slots_take_no_part(data, model, name, budget_range):
  loss = models.cross_entropy_loss(model)
  alg = {'fedavgcm': lambda: algorithms.fedavgcm(loss, 0.1, 0.9),
         'gel': lambda: algorithms.gel(loss, 0.1, 0.9),
         'scaffold': lambda: algorithms.scaffold(loss, 0.1, data.num_clients)}[name]()
  n = data.num_clients
  spec = CohortSpec(sampling.poisson_slots(n, 0.3), budget_range, 3, selection='poisson',
                    rate=0.3)
  root = keys.root_key(1)
  c = next(c for r in range(50) for c in [sampling.sample_cohort(root, r, data.counts, spec)]
           if 1 < int(np.sum(c.present)) < spec.cohort_size - 1)
  state = alg.server_init(init_params(model))
  args = (data, root, jnp.int32(4))
  poisson, pm = build_round(alg, chunk_size=2)(state, c, *args)
  fixed, fm = build_round(alg, chunk_size=3)(state, present_only(c), *args)
  debug, dm = build_round(alg, chunk_size=2, backend=Backend(debug=True))(state, c, *args)
  assert_trees_close(poisson, fixed, 2e-6)
  assert_trees_close(poisson, debug, 2e-6)
  for field in ('train_loss', 'grad_computations', 'num_clients', 'uploaded_bytes'):
    np.testing.assert_allclose(getattr(pm, field), getattr(fm, field), rtol=2e-6)
    np.testing.assert_allclose(getattr(pm, field), getattr(dm, field), rtol=2e-6)
  assert int(pm.num_clients) == int(np.sum(np.asarray(data.counts)[
      np.asarray(c.client_ids)[np.asarray(c.present)]] > 0))
  if name == 'scaffold':   # the absent slots' rows were not written
    absent = np.setdiff1d(np.asarray(c.client_ids)[~np.asarray(c.present)],
                          np.asarray(c.client_ids)[np.asarray(c.present)])
    before, after = (jax.tree.leaves(s.clients)[0] for s in (state, poisson))
    np.testing.assert_array_equal(np.asarray(after)[absent], np.asarray(before)[absent])


def test_a_hand_made_present_mask_must_fit_the_cohort():
  spec = CohortSpec(3, (1, 2), 2)
  c = Cohort(np.array([0, 1, 2], np.int32), np.array([2, 0, 2], np.int32),
             np.ones(3, np.float32), spec, present=np.array([1, 0, 1]))
  with pytest.raises(ValueError, match='present must be a bool array'):
    sampling.check_cohort(c, 5)
  # an absent slot's budget is not read: 0 passes where the spec runs every client 2 steps
  equal = CohortSpec(3, (2, 2), 2)
  sampling.check_cohort(Cohort(c.client_ids, c.budgets, c.weights, equal,
                               present=np.array([True, False, True])), 5)
  with pytest.raises(ValueError, match='budgets other than 2'):
    sampling.check_cohort(Cohort(c.client_ids, c.budgets, c.weights, equal), 5)
