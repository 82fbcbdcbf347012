"""The vmapped round agrees with the debug backend (``core.debug_round``: clients one by one in a
Python loop, eagerly), up to float summation order: the server state and every metric, for
algorithms that take guessed steps, keep per-client rows, make a pre-pass over all of a client's
examples or its first minibatch, on cohorts with unequal budgets, a client drawn twice, a client
without data, equal budgets (nothing masked: padding and data-less clients step too) with the
fused small products, no client with data at all, and budgets in epochs."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_gel import algorithms, models, optim
from fedjax_gel.core import keys
from fedjax_gel.core.backend import Backend
from fedjax_gel.core.round import build_round
from fedjax_gel.core.sampling import Cohort, CohortSpec

from helpers import EMPTY_CLIENT, TAU_MAX, cohort, init_params

LR = 0.1


def make(name, loss, num_clients):
  return {
      'fedavgcm': lambda: algorithms.fedavgcm(loss, LR, 0.9),
      'gel': lambda: algorithms.gel(loss, LR, 0.9),
      'scaffold': lambda: algorithms.scaffold(loss, LR, num_clients),
      'mimelite': lambda: algorithms.mime(loss, optim.gbo_sgdm(LR, b1=0.9)),
      'mimexlite': lambda: algorithms.mime(loss, optim.gbo_sgdm(LR, b1=0.9), full_batch=False),
  }[name]()


def close(a, b):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=2e-5, atol=2e-6), a, b)


def agree(alg, data, c, params, chunk_size=2, fused=False):
  """Runs the vmapped round (chunks of ``chunk_size``; ``fused`` small products) and the debug
  round; checks that they agree and returns the debug round's metrics."""
  state = alg.server_init(params)
  args = (c, data, keys.root_key(3), jnp.int32(2))
  vmapped, vm = build_round(alg, chunk_size=chunk_size, backend=Backend(fuse_small_dots=fused),
                            client_distance=True)(state, *args)
  debug, dm = build_round(alg, chunk_size=chunk_size, backend=Backend(debug=True))(state, *args)
  close(vmapped, debug)
  for field in ('train_loss', 'grad_computations', 'examples', 'uploaded_bytes',
                'downloaded_bytes', 'client_distance', 'num_clients', 'finite', 'diagnostics'):
    close(getattr(vm, field), getattr(dm, field))
  return dm


@pytest.mark.parametrize('name', ['fedavgcm', 'gel', 'scaffold', 'mimelite', 'mimexlite'])
@pytest.mark.slow
def test_the_vmapped_round_agrees_with_the_debug_round(data, model, name):
  loss = models.cross_entropy_loss(model)
  alg = make(name, loss, data.num_clients)
  # unequal budgets over two chunks and a padding slot, client 4 twice, one client without data
  c = cohort([4, 9, EMPTY_CLIENT, 1, 4], [2, TAU_MAX, 3, 1, 3], [1., 2., 1., 1., 0.5])
  metrics = agree(alg, data, c, init_params(model))
  assert int(metrics.num_clients) == 4 and int(metrics.computed_steps) == 2 + TAU_MAX + 1 + 3
  assert float(metrics.client_distance) > 0


@pytest.mark.slow
def test_budgets_in_epochs_agree_with_the_debug_round(data, model):
  """Epochs: a new shuffle per epoch and each epoch's short last minibatch masked."""
  alg = algorithms.fedavgcm(models.cross_entropy_loss(model), LR, 0.9)
  spec = CohortSpec(3, (1, 2), 4, budget_unit='epochs',
                    max_examples=int(np.max(np.asarray(data.counts))))
  c = Cohort(jnp.asarray([5, 2, 7], jnp.int32), jnp.asarray([2, 1, 2], jnp.int32),
             jnp.ones((3,), jnp.float32), spec)
  agree(alg, data, c, init_params(model), chunk_size=3)


@pytest.mark.slow
def test_equal_budgets_with_fused_products_agree_with_the_debug_round(data, model):
  alg = make('gel', models.cross_entropy_loss(model), data.num_clients)
  c = cohort([4, 9, EMPTY_CLIENT, 1, 4], [3] * 5, max_budget=3)
  c = Cohort(c.client_ids, c.budgets, c.weights, CohortSpec(5, (3, 3), c.spec.batch_size))
  assert c.spec.equal_budgets
  agree(alg, data, c, init_params(model), fused=True)


@pytest.mark.parametrize('name', ['scaffold', 'mimelite'])
@pytest.mark.slow
def test_a_cohort_without_data_leaves_the_model_in_both(data, model, name):
  alg = make(name, models.cross_entropy_loss(model), data.num_clients)
  metrics = agree(alg, data, cohort([EMPTY_CLIENT] * 3, [2, 3, 1]), init_params(model))
  assert int(metrics.num_clients) == 0 and np.isnan(metrics.train_loss)
