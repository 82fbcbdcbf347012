"""The model zoo: LEAF/GeL/FedGBO CNNs and LEAF's stacked LSTMs.

Parameter counts against hand formulas (shapes only, via ``jax.eval_shape``), output shapes,
one engine round per model on small inputs, and the LSTMs' reading of the last position.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_gel import algorithms, models
from fedjax_gel.core import federated_data as fd
from fedjax_gel.core import keys
from fedjax_gel.core.round import build_round
from fedjax_gel.core.sampling import Cohort, CohortSpec
from fedjax_gel.models.cnn import (CelebACNN, TwoConvCNN, as_nhwc, celeba_cnn, cifar_cnn,
                                   femnist_cnn, gel_femnist_cnn)
from fedjax_gel.models.rnn import StackedLSTM, sent140_lstm, shakespeare_lstm


def conv(k, cin, cout):
  return k * k * cin * cout + cout


def dense(fan_in, fan_out):
  return fan_in * fan_out + fan_out


def lstm(fan_in, h):
  """flax ``OptimizedLSTMCell``: 4 gates, input kernel, recurrent kernel, one bias."""
  return 4 * (fan_in * h + h * h + h)


def shapes_only(model):
  return jax.eval_shape(model.init, jax.random.key(0))


def random_params(model, seed=0):
  """Normal(0, 0.1) numpy leaves shaped as ``model.init``'s: a cheap stand-in for ``init``
  (the LSTMs' orthogonal initialisers run LAPACK QRs that take seconds on a busy CPU)."""
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map(lambda s: (0.1 * rng.normal(size=s.shape)).astype(s.dtype),
                                shapes_only(model))


COUNTS = [
    # LEAF FEMNIST: 'SAME' convs, 28 -> 14 -> 7.
    ('femnist', femnist_cnn, (28, 28, 1), 62,
     conv(5, 1, 32) + conv(5, 32, 64) + dense(7 * 7 * 64, 2048) + dense(2048, 62)),
    # GeL FEMNIST: 'VALID' convs, 28 -> 24 -> 12 -> 8 -> 4.
    ('gel_femnist', gel_femnist_cnn, (28, 28, 1), 62,
     conv(5, 1, 32) + conv(5, 32, 64) + dense(4 * 4 * 64, 512) + dense(512, 62)),
    # FedGBO CIFAR100: 'VALID' 3x3 convs, 32 -> 30 -> 15 -> 13 -> 6.
    ('cifar', cifar_cnn, (32, 32, 3), 100,
     conv(3, 3, 32) + conv(3, 32, 64) + dense(6 * 6 * 64, 512) + dense(512, 100)),
    # FedGBO FEMNIST: the same network, 28 -> 26 -> 13 -> 11 -> 5.
    ('cifar_on_femnist', cifar_cnn, (28, 28, 1), 62,
     conv(3, 1, 32) + conv(3, 32, 64) + dense(5 * 5 * 64, 512) + dense(512, 62)),
    # LEAF CelebA: 'SAME' convs and pools, 84 -> 42 -> 21 -> 11 -> 6.
    ('celeba', celeba_cnn, (84, 84, 3), 2,
     conv(3, 3, 32) + 3 * conv(3, 32, 32) + dense(6 * 6 * 32, 2)),
    ('shakespeare', shakespeare_lstm, (80,), 80,
     80 * 8 + lstm(8, 256) + lstm(256, 256) + dense(256, 80)),
    ('sent140', sent140_lstm, (25,), 2,
     10_000 * 100 + lstm(100, 100) + lstm(100, 100) + dense(100, 128) + dense(128, 2)),
]


@pytest.mark.parametrize('builder,input_shape,num_classes,expect',
                         [c[1:] for c in COUNTS], ids=[c[0] for c in COUNTS])
@pytest.mark.slow
def test_parameter_counts_match_the_documented_layers(builder, input_shape, num_classes, expect):
  assert models.num_params(shapes_only(builder(input_shape, num_classes))) == expect


def test_counts_match_the_gel_paper():
  """GeL (seed 000) Table 1: 6.1e5 parameters for FEMNIST, 8.2e5 for Shakespeare."""
  femnist = models.num_params(shapes_only(gel_femnist_cnn((28, 28, 1), 62)))
  shakespeare = models.num_params(shapes_only(shakespeare_lstm((80,), 80)))
  assert femnist == 608_702 and abs(femnist / 6.1e5 - 1) < 0.01
  assert shakespeare == 817_872 and abs(shakespeare / 8.2e5 - 1) < 0.01


@pytest.mark.slow
def test_vocab_size_sets_the_embedding():
  assert shapes_only(shakespeare_lstm((80,), 80))['embed']['embedding'].shape == (80, 8)
  assert shapes_only(shakespeare_lstm((80,), 80, 90))['embed']['embedding'].shape == (90, 8)
  assert shapes_only(sent140_lstm((25,), 2))['embed']['embedding'].shape == (10_000, 100)
  assert shapes_only(sent140_lstm((25,), 2, vocab_size=500))['embed']['embedding'].shape == (
      500, 100)


SHAPES = [
    (femnist_cnn, (28, 28, 1), 62, jnp.float32, 2048),
    (femnist_cnn, (28, 28), 62, jnp.float32, 2048),
    (femnist_cnn, (784,), 62, jnp.float32, 2048),
    (gel_femnist_cnn, (28, 28, 1), 62, jnp.float32, 512),
    (cifar_cnn, (32, 32, 3), 100, jnp.float32, 512),
    (celeba_cnn, (84, 84, 3), 2, jnp.float32, 6 * 6 * 32),
    (shakespeare_lstm, (80,), 80, jnp.int32, 256),
    (sent140_lstm, (25,), 2, jnp.int32, 128),
]


@pytest.mark.parametrize('builder,input_shape,num_classes,dtype,num_features', SHAPES)
@pytest.mark.slow
def test_output_and_feature_shapes(builder, input_shape, num_classes, dtype, num_features):
  m = builder(input_shape, num_classes)
  x = jax.ShapeDtypeStruct((5, *input_shape), dtype)
  params = shapes_only(m)
  assert jax.eval_shape(m.apply, params, x).shape == (5, num_classes)
  assert jax.eval_shape(m.features, params, x).shape == (5, num_features)


def test_image_layouts():
  """``[B, H, W, 1]``, ``[B, H, W]`` and LEAF's flattened ``[B, H*W]`` are the same images."""
  x = np.arange(2 * 28 * 28 * 3, dtype=np.float32).reshape(2, 28, 28, 3)
  assert as_nhwc(x) is x
  np.testing.assert_array_equal(as_nhwc(x[..., 0]), x[..., :1])
  np.testing.assert_array_equal(as_nhwc(x[..., 0].reshape(2, 784)), x[..., :1])
  with pytest.raises(ValueError, match='side'):
    as_nhwc(np.zeros((2, 783), np.float32))


def test_init_draws_the_shapes_it_declares():
  m = celeba_cnn((16, 16, 3), 2)
  params = jax.jit(m.init)(jax.random.key(0))
  assert jax.tree_util.tree_map(jnp.shape, params) == jax.tree_util.tree_map(
      lambda s: s.shape, shapes_only(m))
  assert set(params) == {'convs_0', 'convs_1', 'convs_2', 'convs_3', 'out'}


@pytest.mark.parametrize('module,x', [
    (TwoConvCNN(62), jnp.zeros((1, 28, 28, 1))),
    (CelebACNN(2), jnp.zeros((1, 84, 84, 3))),
    (StackedLSTM(2, 100, dense=128), jnp.zeros((1, 25), jnp.int32)),
], ids=['two_conv', 'celeba', 'lstm'])
def test_modules_keep_no_state_beyond_params(module, x):
  """No BatchNorm statistics or other mutable collections: only ``'params'`` to vmap."""
  assert set(jax.eval_shape(module.init, jax.random.key(0), x)) == {'params'}


# Small inputs of the right kind (vocab: token ids in [0, vocab), None: float images); the
# 28x28 FEMNIST CNNs at their real size.
ENGINE = [
    ('femnist', femnist_cnn, (28, 28, 1), 62, None),
    ('gel_femnist', gel_femnist_cnn, (28, 28), 62, None),
    ('cifar', cifar_cnn, (16, 16, 3), 10, None),
    ('celeba', celeba_cnn, (32, 32, 3), 2, None),
    ('shakespeare', shakespeare_lstm, (6,), 80, 80),
    ('sent140', functools.partial(sent140_lstm, vocab_size=50), (6,), 2, 50),
]


@pytest.mark.parametrize('builder,input_shape,num_classes,vocab',
                         [e[1:] for e in ENGINE], ids=[e[0] for e in ENGINE])
@pytest.mark.slow
def test_one_fedavg_round_in_the_engine(builder, input_shape, num_classes, vocab):
  """3 clients, vmapped in chunks of 2 under ``jax.grad``: the model moves and stays finite."""
  m = builder(input_shape, num_classes)
  rng = np.random.default_rng(0)
  clients = []
  for n in (3, 4, 2):
    if vocab:
      x = rng.integers(0, vocab, size=(n, *input_shape)).astype(np.int32)
    else:
      x = rng.uniform(size=(n, *input_shape)).astype(np.float32)
    clients.append({'x': x, 'y': rng.integers(0, num_classes, size=n).astype(np.int32)})
  data = fd.to_device(fd.from_client_arrays(clients))
  params = random_params(m)
  alg = algorithms.fedavg(models.cross_entropy_loss(m), optax.sgd(0.1))
  rf = build_round(alg, chunk_size=2)
  c = Cohort(jnp.array([0, 1, 2]), jnp.array([2, 1, 2]), jnp.ones(3), CohortSpec(3, (1, 2), 2))
  state, _ = rf(alg.server_init(params), c, data, keys.root_key(0), jnp.int32(0))
  new, old = jax.tree_util.tree_leaves(state.params), jax.tree_util.tree_leaves(params)
  assert all(np.all(np.isfinite(a)) for a in new)
  assert any(not np.allclose(a, b) for a, b in zip(new, old))


LSTMS = [
    ('shakespeare', shakespeare_lstm, 80, 80),
    ('sent140', functools.partial(sent140_lstm, vocab_size=30), 2, 30),
]


@pytest.mark.parametrize('builder,num_classes,vocab', [s[1:] for s in LSTMS],
                         ids=[s[0] for s in LSTMS])
@pytest.mark.slow
def test_lstm_reads_the_whole_sequence_row_by_row(builder, num_classes, vocab):
  m = builder((5,), num_classes)
  params = random_params(m)
  apply = jax.jit(m.apply)    # one compilation: every batch below is [3, 5]
  x = jax.random.randint(jax.random.key(1), (3, 5), 1, vocab)
  logits = np.asarray(apply(params, x))
  first = np.asarray(apply(params, x.at[0, 0].set(0)))
  assert np.abs(first[0] - logits[0]).max() > 1e-6        # the first token counts ...
  np.testing.assert_array_equal(first[1:], logits[1:])     # ... for its own row only
  np.testing.assert_allclose(apply(params, x[::-1]), logits[::-1], rtol=1e-5, atol=1e-6)


def test_sent140_lstm_is_an_lstm_read_at_the_last_position():
  """A numpy LSTM (flax ``OptimizedLSTMCell`` gates) from the same params, by hand."""
  m = sent140_lstm((4,), 2, vocab_size=30)
  p = jax.tree_util.tree_map(np.asarray, random_params(m))
  x = np.array([[3, 7, 0, 0], [29, 1, 2, 5]], np.int32)
  sigmoid = lambda z: 1 / (1 + np.exp(-z))

  def gate(cell, g, inp, h):
    return inp @ cell['i' + g]['kernel'] + h @ cell['h' + g]['kernel'] + cell['h' + g]['bias']

  seq = p['embed']['embedding'][x]                        # [B, L, 100]
  for layer in ('lstms_0', 'lstms_1'):
    cell = p[layer]['cell']
    h = c = np.zeros((2, 100), np.float32)
    outs = []
    for t in range(x.shape[1]):
      i, f = sigmoid(gate(cell, 'i', seq[:, t], h)), sigmoid(gate(cell, 'f', seq[:, t], h))
      g, o = np.tanh(gate(cell, 'g', seq[:, t], h)), sigmoid(gate(cell, 'o', seq[:, t], h))
      c = f * c + i * g
      h = o * np.tanh(c)
      outs.append(h)
    seq = np.stack(outs, 1)
  fc = seq[:, -1] @ p['fc']['kernel'] + p['fc']['bias']
  want = fc @ p['out']['kernel'] + p['out']['bias']
  logits, features = jax.jit(lambda p, x: (m.apply(p, x), m.features(p, x)))(p, x)
  np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(features, fc, rtol=1e-4, atol=1e-5)
