"""Models: the registry, the logistic model's closed form, and the nnx adapter in the engine."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from fedjax_gel import algorithms, models
from fedjax_gel.core import federated_data as fd
from fedjax_gel.core import keys
from fedjax_gel.core.round import build_round
from fedjax_gel.core.sampling import Cohort, CohortSpec


def test_logistic_is_xw_plus_b_with_305_parameters():
  m = models.get_model('logistic', (60,), 5)
  params = m.init(jax.random.key(0))
  assert models.num_params(params) == 305
  x = jax.random.normal(jax.random.key(1), (7, 60))
  w, b = params['Dense_0']['kernel'], params['Dense_0']['bias']
  np.testing.assert_allclose(m.apply(params, x), x @ w + b, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_cross_entropy_by_hand():
  m = models.get_model('logistic', (2,), 3)
  params = {'Dense_0': {'kernel': jnp.array([[1., 0., -1.], [0., 2., 0.]]),
                        'bias': jnp.zeros(3)}}
  batch = {'x': jnp.array([[1., 1.], [0., 0.]]), 'y': jnp.array([1, 0])}
  logits = np.array([[1., 2., -1.], [0., 0., 0.]])
  expect = np.mean([np.log(np.exp(r).sum()) - r[y] for r, y in zip(logits, [1, 0])])
  np.testing.assert_allclose(models.cross_entropy_loss(m)(params, batch), expect, rtol=1e-6)


def test_unknown_model_names_the_known_ones():
  with pytest.raises(ValueError, match="unknown model 'cnn'; known: celeba_cnn, cifar_cnn, "
                     'femnist_cnn, gel_femnist_cnn, logistic, mlp, sent140_lstm, '
                     'shakespeare_lstm'):
    models.get_model('cnn', (3,), 2)


@pytest.mark.slow
def test_nnx_module_runs_in_the_engine_like_its_linen_twin():
  """An nnx Linear and the linen logistic model, given equal params, train to equal models."""
  nnx_model = models.from_nnx('nnx_linear', lambda rngs: nnx.Linear(4, 3, rngs=rngs), 3)
  linen_model = models.get_model('logistic', (4,), 3)
  p_nnx = nnx_model.init(jax.random.key(0))
  assert set(p_nnx) == {'kernel', 'bias'}
  p_linen = {'Dense_0': dict(p_nnx)}
  rng = np.random.default_rng(0)
  clients = [{'x': rng.normal(size=(n, 4)).astype(np.float32),
              'y': rng.integers(0, 3, size=n).astype(np.int32)} for n in (6, 9, 4)]
  data = fd.to_device(fd.from_client_arrays(clients))
  c = Cohort(jnp.array([0, 1, 2]), jnp.array([3, 2, 4]), jnp.ones(3), CohortSpec(3, (1, 4), 2))
  out = []
  for m, p in ((nnx_model, p_nnx), (linen_model, p_linen)):
    alg = algorithms.fedavgcm(models.cross_entropy_loss(m), 0.1, 0.9, optax.sgd(1.0))
    rf = build_round(alg, chunk_size=2)
    state, _ = rf(alg.server_init(p), c, data, keys.root_key(0), jnp.int32(0))
    out.append(state.params)
  np.testing.assert_allclose(out[0]['kernel'], out[1]['Dense_0']['kernel'], rtol=1e-6)
  np.testing.assert_allclose(out[0]['bias'], out[1]['Dense_0']['bias'], rtol=1e-6)
  assert not np.allclose(out[0]['kernel'], p_nnx['kernel'])


@pytest.mark.parametrize('shape,classes,words', [
    ((60,), 0, 'num_classes must be a positive integer, got 0'),
    ((60,), 2.5, 'num_classes must be a positive integer, got 2.5'),
    ((0,), 5, r'input_shape must be a tuple of positive integers, got \(0,\)'),
    (60, 5, 'input_shape must be a tuple of positive integers, got 60'),
])
def test_get_model_refuses_shapes_and_class_counts_that_are_not_positive(shape, classes, words):
  with pytest.raises(ValueError, match=f'get_model: {words}'):
    models.get_model('logistic', shape, classes)
