"""Local work in epochs, proportional to data and from a per-client list, against a per-client
reference loop written with plain Python loops over each epoch's minibatches."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_gel import algorithms, models
from fedjax_gel.core import keys, sampling
from fedjax_gel.core.round import build_round
from fedjax_gel.core.sampling import CohortSpec, sample_cohort
from fedjax_gel.core.shuffle import cycled_permutation

from helpers import assert_trees_close, grad_of, init_params

LR = 0.3


def epoch_spec(cohort_size, epochs, batch, counts, draw='uniform'):
  return CohortSpec(cohort_size, epochs, batch, replace=True, budget_unit='epochs',
                    budget_draw=draw, max_examples=int(np.max(counts)))


def epoch_orders(spec, client_id, slot, n, seed=0, round_idx=2):
  """Each epoch's shuffle of one client, as the round documents it: the client's shuffle key
  (``keys.client_key``, then the first half of its split) folded with the epoch."""
  ck = keys.client_key(keys.round_key(keys.root_key(seed), round_idx, keys.CLIENT),
                       client_id, slot)
  shuffle_key = jax.random.split(ck)[0]
  length = spec.steps_per_epoch * spec.batch_size
  return [np.asarray(cycled_permutation(jax.random.fold_in(shuffle_key, e), n, length))[:n]
          for e in range(spec.budget_range[1])]


def reference_fedavg(data, loss, params, cohort, spec):
  """Every client: ``E_i`` epochs, each its shuffle cut into minibatches of ``B`` with a short
  last one (sliced, no mask); the server: the weighted mean of the clients' models."""
  ids, budgets = np.asarray(cohort.client_ids), np.asarray(cohort.budgets)
  weights = np.asarray(cohort.weights)
  models_, steps, seen = [], 0, 0
  for slot, (cid, tau) in enumerate(zip(ids, budgets)):
    n, off = int(data.counts[cid]), int(data.offsets[cid])
    per_epoch = max(-(-n // spec.batch_size), 1)   # the client without data: 0 steps
    assert tau % per_epoch == 0, (tau, per_epoch)
    y = params
    for order in epoch_orders(spec, int(cid), slot, n)[:tau // per_epoch]:
      for start in range(0, n, spec.batch_size):
        rows = off + order[start:start + spec.batch_size]
        batch = {k: v[rows] for k, v in data.examples.items()}
        y = jax.tree.map(lambda p, g: p - LR * g, y, grad_of(loss)(y, batch))
        steps += 1
        seen += len(rows)
    models_.append(y)
  mean = jax.tree.map(lambda *v: sum(w * x for w, x in zip(weights, v)) / weights.sum(),
                      *models_)
  return mean, steps, seen


def test_epoch_budgets_are_epochs_times_minibatches_per_epoch(data):
  counts = np.asarray(data.counts)
  spec = epoch_spec(40, (1, 3), 4, counts)
  c = sample_cohort(keys.root_key(0), 5, data.counts, spec)
  n = counts[np.asarray(c.client_ids)]
  per_epoch = -(-n // 4)
  budgets = np.asarray(c.budgets)
  epochs = np.where(per_epoch > 0, budgets // np.maximum(per_epoch, 1), 0)
  np.testing.assert_array_equal(budgets, epochs * per_epoch)
  assert set(epochs[n > 0]) <= {1, 2, 3} and len(set(epochs[n > 0])) > 1
  assert spec.max_budget == 3 * -(-int(counts.max()) // 4)   # 3 epochs of the largest client
  # weights: every client saw all its examples (samples_seen = min(tau B, n) = n)
  np.testing.assert_array_equal(np.asarray(c.weights), n)


def test_proportional_and_per_client_draws(data):
  counts = np.asarray(data.counts)
  spec = CohortSpec(30, (2, 10), 3, replace=True, budget_draw='proportional',
                    max_examples=int(counts.max()))
  c = sample_cohort(keys.root_key(1), 0, data.counts, spec)
  n = counts[np.asarray(c.client_ids)]
  np.testing.assert_array_equal(np.asarray(c.budgets),
                                np.clip(np.round(10 * n / counts.max()), 2, 10))
  fixed = np.arange(len(counts)) % 4 + 1
  spec = CohortSpec(30, (1, 4), 3, replace=True, budget_draw='per_client')
  c = sample_cohort(keys.root_key(1), 0, data.counts, spec, client_budgets=fixed)
  np.testing.assert_array_equal(np.asarray(c.budgets), fixed[np.asarray(c.client_ids)])
  with pytest.raises(ValueError, match='client_budgets'):
    sample_cohort(keys.root_key(1), 0, data.counts, spec)
  with pytest.raises(ValueError, match='max_examples'):
    CohortSpec(3, (1, 2), 3, budget_unit='epochs')
  # below the largest client: its epochs were silently cut to a part of an epoch
  short = CohortSpec(3, (1, 2), 3, budget_unit='epochs', max_examples=2)
  with pytest.raises(ValueError, match=r'CohortSpec.max_examples=2 is below the largest '
                     r'client\'s 30 examples'):
    sample_cohort(keys.root_key(1), 0, counts, short)
  on_device = jnp.asarray(counts)   # the engine example passes train.counts: it was not checked
  for _ in range(2):   # read once per array, then remembered
    with pytest.raises(ValueError, match=r'is below the largest client\'s 30 examples'):
      sample_cohort(keys.root_key(1), 0, on_device, short)
  assert sampling.largest_count(on_device) == 30
  seen = []
  jax.jit(lambda c: seen.append(sampling.largest_count(c)) or c)(on_device)
  assert seen == [None]   # traced: not read


@pytest.mark.parametrize('batch,epochs,chunk', [(4, (1, 3), 3), (5, (2, 2), 8)])
@pytest.mark.slow
def test_epochs_round_equals_per_client_reference_loop(data, model, batch, epochs, chunk):
  """Short last minibatches (n_i not a multiple of B), a new shuffle every epoch, clients of
  different epochs and sizes in one chunk, one without data; FedAvg with server SGD(1)."""
  loss = models.cross_entropy_loss(model)
  alg = algorithms.fedavg(loss, optax.sgd(LR))
  params = init_params(model)
  spec = epoch_spec(8, epochs, batch, data.counts)
  cohort = sample_cohort(keys.root_key(0), 2, data.counts, spec)
  cohort = cohort.__class__(cohort.client_ids.at[0].set(12), cohort.budgets.at[0].set(0),
                            cohort.weights.at[0].set(0.), spec)   # client 12 has no data
  rf = build_round(alg, chunk_size=chunk)
  state, m = rf(alg.server_init(params), cohort, data, keys.root_key(0), jnp.int32(2))
  expect, steps, seen = reference_fedavg(data, loss, params, cohort, spec)
  assert_trees_close(state.params, expect, 1e-5)
  assert int(m.grad_computations) == steps and int(m.examples) == seen


def test_steps_unit_is_unchanged_by_the_new_fields(data, model):
  """The default spec's round is the one of the explicit ``budget_unit='steps'``."""
  alg = algorithms.fedavgcm(models.cross_entropy_loss(model), 0.1, 0.9)
  params = init_params(model)
  outs = []
  for spec in (CohortSpec(6, (2, 5), 3),
               CohortSpec(6, (2, 5), 3, budget_unit='steps', budget_draw='uniform')):
    c = sample_cohort(keys.root_key(0), 1, data.counts, spec)
    rf = build_round(alg, chunk_size=3)
    outs.append(rf(alg.server_init(params), c, data, keys.root_key(0), jnp.int32(1))[0].params)
  jax.tree.map(np.testing.assert_array_equal, *outs)
