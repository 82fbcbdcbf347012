"""Power-of-d client selection against hand computations."""
import collections

import jax.numpy as jnp
import jax
import numpy as np
import pytest

from fedjax_gel import models
from fedjax_gel.core import keys
from fedjax_gel.core.selection import candidates, power_of_d

from helpers import init_params


@pytest.fixture(scope='module')
def example_loss(model):
  return models.per_example_loss(model)


def candidate_ids(seed, r, counts, d):
  return np.asarray(candidates(keys.round_key(keys.root_key(seed), r, keys.COHORT), counts, d))


def test_d_equal_to_c_takes_every_candidate(data, model, example_loss):
  params = init_params(model)
  for r in range(5):
    ids = power_of_d(keys.root_key(2), r, params, data, per_example_loss=example_loss, d=4,
                     cohort_size=4)
    np.testing.assert_array_equal(ids, candidate_ids(2, r, data.counts, 4))


@pytest.mark.slow
def test_candidates_are_drawn_in_proportion_to_data_size():
  counts = jnp.array([1, 2, 7], jnp.int32)
  draws = 3000
  seen = collections.Counter(int(candidate_ids(0, r, counts, 1)[0]) for r in range(draws))
  expected = np.array([0.1, 0.2, 0.7]) * draws
  stat = sum((seen[i] - e) ** 2 / e for i, e in enumerate(expected))
  assert stat < 13.8   # chi2(2) 99.9% quantile


@pytest.mark.slow
def test_more_candidates_than_clients_picks_the_highest_losses(data, model, example_loss):
  """The C of d candidates with the largest mean loss over all their examples, by hand."""
  params = init_params(model, seed=3)
  loss = jax.jit(models.cross_entropy_loss(model))   # jitted: compiled once per client size
  select = jax.jit(power_of_d, static_argnames=('per_example_loss', 'd', 'cohort_size'))
  for r in range(3):
    cand = candidate_ids(1, r, data.counts, 8)
    by_hand = []
    for cid in cand:
      lo, n = int(data.offsets[cid]), int(data.counts[cid])
      by_hand.append(float(loss(params, {k: v[lo:lo + n] for k, v in data.examples.items()})))
    expect = cand[np.argsort(-np.array(by_hand), kind='stable')[:3]]
    ids = select(keys.root_key(1), r, params, data, per_example_loss=example_loss, d=8,
                 cohort_size=3)
    np.testing.assert_array_equal(np.sort(ids), np.sort(expect))


def test_minibatch_variant_picks_distinct_candidates(data, model, example_loss):
  params = init_params(model)
  ids = np.asarray(power_of_d(keys.root_key(4), 0, params, data,
                              per_example_loss=example_loss, d=9, cohort_size=5,
                              mode='minibatch', batch_size=3))
  assert len(set(ids.tolist())) == 5
  assert set(ids.tolist()) <= set(candidate_ids(4, 0, data.counts, 9).tolist())


def test_d_below_c_is_refused(data, model, example_loss):
  with pytest.raises(ValueError, match='power-of-d needs'):
    power_of_d(keys.root_key(0), 0, init_params(model), data, per_example_loss=example_loss,
               d=2, cohort_size=3)


@pytest.mark.parametrize('mode', ['full', 'minibatch'])
@pytest.mark.slow
def test_a_candidate_without_data_is_chosen_only_when_too_few_have_data(data, model,
                                                                        example_loss, mode):
  """d = the population draws the empty client 12 too; its minibatch read another client's rows
  and was chosen over clients with data. Now it is last: out of C = 12, in with C = 13."""
  params = init_params(model)
  for r in range(4):
    ids = power_of_d(keys.root_key(r), r, params, data, per_example_loss=example_loss, d=13,
                     cohort_size=12, mode=mode, batch_size=3)
    assert sorted(np.asarray(ids).tolist()) == list(range(12))
  ids = power_of_d(keys.root_key(0), 0, params, data, per_example_loss=example_loss, d=13,
                   cohort_size=13, mode=mode, batch_size=3)
  assert sorted(np.asarray(ids).tolist()) == list(range(13))
