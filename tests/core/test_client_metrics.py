"""Per-client evaluation: each client's correct predictions and examples over the test pool,
and their spread, against hand counts; arguments evaluation would misread are refused."""
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_gel import models
from fedjax_gel.core import evaluation
from fedjax_gel.core import federated_data as fd


def test_client_sum_and_spread_by_hand():
  # the "model" predicts class 1 when x > 0: client 0 gets 2/3 right, client 1 none of 2,
  # client 2 has no examples, client 3 all 4
  clients = [
      {'x': np.array([[1.], [-1.], [2.]], np.float32), 'y': np.array([1, 1, 1], np.int32)},
      {'x': np.array([[3.], [4.]], np.float32), 'y': np.array([0, 0], np.int32)},
      {'x': np.zeros((0, 1), np.float32), 'y': np.zeros((0,), np.int32)},
      {'x': np.array([[-1.], [-2.], [5.], [6.]], np.float32), 'y': np.array([0, 0, 1, 1],
                                                                            np.int32)},
  ]
  pool = evaluation.make_eval_pool(fd.from_client_arrays(clients), batch_size=4)
  apply = lambda params, x: jnp.concatenate([-x, x], axis=1)   # logits of classes 0 and 1
  out = evaluation.build_evaluate(apply)(None, pool)
  np.testing.assert_array_equal(out['client_sum'], [2, 0, 0, 4])
  np.testing.assert_array_equal(out['client_weight'], [3, 2, 0, 4])
  np.testing.assert_allclose(float(out['accuracy']), 6 / 9, rtol=1e-6)
  spread = evaluation.client_spread(out['client_sum'], out['client_weight'])
  acc = np.array([2 / 3, 0., 1.])   # the client without examples left out
  assert spread == {'mean': float(acc.mean()), 'p10': float(np.percentile(acc, 10)),
                    'p90': float(np.percentile(acc, 90)), 'std': float(acc.std())}
  assert abs(spread['p10'] - 2 / 15) < 1e-12   # 10th percentile of {0, 2/3, 1}, by hand


def test_rows_no_client_owns_are_left_out_and_out_of_order_clients_refused():
  """A pool with padding rows (as a split pool has) failed with a reshape error; one whose
  clients' rows were not in client order was accepted and its per-client metrics went to the
  wrong clients."""
  x = np.array([[1.], [1.], [9.], [-1.], [-1.], [9.]], np.float32)
  y = np.array([1, 1, 0, 0, 0, 0], np.int32)   # rows 2 and 5 are no client's
  apply = lambda params, x: jnp.concatenate([-x, x], axis=1)   # predicts 1 when x > 0
  padded = fd.FederatedData({'x': x, 'y': y}, np.array([0, 3], np.int32),
                            np.array([2, 2], np.int32))
  out = evaluation.build_evaluate(apply)(None, evaluation.make_eval_pool(padded, batch_size=3))
  np.testing.assert_array_equal(out['client_sum'], [2, 2])
  np.testing.assert_array_equal(out['client_weight'], [2, 2])
  assert float(out['accuracy']) == 1. and int(out['count']) == 4
  swapped = fd.FederatedData({'x': x, 'y': y}, np.array([3, 0], np.int32),
                             np.array([2, 2], np.int32))
  with pytest.raises(ValueError, match=r"make_eval_pool: client 1's rows start at 0, before "
                     r"client 0's end at 5: clients' rows must follow one another in client"):
    evaluation.make_eval_pool(swapped)
  with pytest.raises(ValueError, match=r"client 1's rows start at 1, before client 0's end"):
    fd.to_device(fd.FederatedData({'x': x, 'y': y}, np.array([0, 1], np.int32),
                                  np.array([2, 2], np.int32)))   # overlapping rows


def test_a_sampled_pool_has_no_client_metrics():
  data = fd.from_client_arrays([{'x': np.ones((5, 1), np.float32),
                                 'y': np.ones((5,), np.int32)}] * 3)
  pool = evaluation.make_eval_pool(data, max_examples=4)
  out = evaluation.build_evaluate(lambda p, x: jnp.concatenate([-x, x], 1))(None, pool)
  assert 'client_sum' not in out and pool.clients is None


@pytest.mark.parametrize('call,error,words', [
    (lambda pool: evaluation.make_eval_pool(None), TypeError,
     'make_eval_pool: a pool must be a FederatedData, got NoneType'),
    (lambda pool: evaluation.make_eval_pool(pool, batch_size=0), ValueError,
     'make_eval_pool: batch_size must be a positive integer, got 0'),   # was taken as 1
    (lambda pool: evaluation.make_eval_pool(pool, max_examples=2, seed=-1), ValueError,
     'make_eval_pool: seed must be a non-negative integer, got -1'),
    (lambda pool: evaluation.make_eval_pool(pool, max_examples=-2), ValueError,
     'max_examples must be a non-negative integer'),
    (lambda pool: evaluation.build_evaluate(lambda p, x: x, 'regression'), TypeError,
     "build_evaluate: task must be a models.Task .e.g. models.REGRESSION., got 'regression'"),
    # a Model itself (whose apply is the function) failed only at the first call
    (lambda pool: evaluation.build_evaluate(models.get_model('logistic', (1,), 2)), TypeError,
     'build_evaluate: apply_fn must be a function .params, x. -> outputs, e.g. model.apply, got '
     'Model'),
], ids=['no_pool', 'batch_zero', 'negative_seed', 'negative_sample', 'task_by_name', 'model'])
def test_evaluation_refuses_arguments_it_would_misread(call, error, words):
  pool = fd.from_client_arrays([{'x': np.zeros((3, 1), np.float32), 'y': np.zeros(3, np.int32)}])
  with pytest.raises(error, match=words):
    call(pool)
