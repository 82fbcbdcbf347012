"""models.layers: the patch convolution and the reshape max pool against XLA's own ops."""
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from fedjax_gel import models
from fedjax_gel.models import layers

# (lhs shape, rhs shape, strides, padding, lhs dilation, rhs dilation, dimension numbers)
CASES = [
    ((2, 9, 9, 3), (3, 3, 3, 4), (1, 1), 'VALID', None, None, ('NHWC', 'HWIO', 'NHWC')),
    ((2, 9, 9, 3), (3, 3, 3, 4), (2, 2), 'SAME', None, None, ('NHWC', 'HWIO', 'NHWC')),
    ((2, 9, 8, 3), (3, 2, 3, 4), (2, 1), [(1, 2), (0, 1)], (2, 1), (1, 2),
     ('NHWC', 'HWIO', 'NHWC')),
    ((2, 3, 9, 9), (4, 3, 3, 3), (1, 2), 'SAME', None, (2, 2), ('NCHW', 'OIHW', 'NCHW')),
    ((2, 3, 9, 9), (4, 3, 3, 3), (1, 1), [(-1, 2), (1, 0)], None, None,
     ('NCHW', 'OIHW', 'NHWC')),
    ((2, 11, 3), (3, 3, 4), (2,), 'SAME', None, None, ('NWC', 'WIO', 'NWC')),
    ((2, 5, 6, 7, 2), (2, 3, 2, 2, 3), (1, 2, 1), 'VALID', None, None,
     ('NHWDC', 'HWDIO', 'NHWDC')),
]


def _conv(impl, case):
  _, _, strides, padding, lhs_d, rhs_d, dn = case
  return lambda x, w: impl(x, w, strides, padding, lhs_d, rhs_d, dn)


@pytest.mark.parametrize('case', CASES, ids=[str(i) for i in range(len(CASES))])
@jax.default_matmul_precision('float32')   # on a GPU, not TF32: the tolerances are float32's
@pytest.mark.slow
def test_patches_conv_equals_xla_conv_and_its_gradients(case):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal(case[0]), jnp.float32)
  w = jnp.asarray(rng.standard_normal(case[1]), jnp.float32)
  ours, xla = _conv(layers.patches_conv, case), _conv(lax.conv_general_dilated, case)
  np.testing.assert_allclose(ours(x, w), xla(x, w), rtol=1e-5, atol=1e-4)
  grad = lambda f: jax.grad(lambda x, w: jnp.sum(jnp.sin(f(x, w))), (0, 1))(x, w)
  for a, b in zip(grad(ours), grad(xla)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4)


def test_grouped_convolution_is_left_to_xla():
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.standard_normal((2, 6, 6, 4)), jnp.float32)
  w = jnp.asarray(rng.standard_normal((3, 3, 2, 6)), jnp.float32)
  args = ((1, 1), 'SAME', None, None, ('NHWC', 'HWIO', 'NHWC'), 2)
  np.testing.assert_array_equal(layers.patches_conv(x, w, *args),
                                lax.conv_general_dilated(x, w, *args))


@pytest.mark.parametrize('ties', [False, True])
@pytest.mark.parametrize('padding', ['VALID', 'SAME'])
@pytest.mark.slow
def test_max_pool_2x2_equals_flax_max_pool_and_its_gradient(padding, ties):
  """Values and gradients, odd sides included; with ties (integers 0..2) the gradient goes to
  the first maximum of each block, as ``nn.max_pool``'s ``select_and_scatter`` gives it."""
  rng = np.random.default_rng(2)
  x = rng.integers(0, 3, (3, 7, 8, 4)) if ties else rng.standard_normal((3, 7, 8, 4))
  x = jnp.asarray(x, jnp.float32)
  flax_pool = lambda x: nn.max_pool(x, (2, 2), strides=(2, 2), padding=padding)
  np.testing.assert_array_equal(layers.max_pool_2x2(x, padding), flax_pool(x))
  weights = jnp.arange(flax_pool(x).size, dtype=jnp.float32).reshape(flax_pool(x).shape)
  grad = lambda f: jax.grad(lambda x: jnp.sum(weights * f(x)))(x)
  np.testing.assert_array_equal(grad(lambda x: layers.max_pool_2x2(x, padding)),
                                grad(flax_pool))
  with pytest.raises(ValueError, match='padding'):
    layers.max_pool_2x2(x, 'CIRCULAR')


def test_pool_gradient_computes_the_convolutions_input_gradient_once():
  """After a patches convolution, the pool's cotangent (the convolution's input gradient, a sum
  of padded slices) is one kernel's output, not evaluated again in the kernel that writes the
  pool's input gradient for each position of a block (on CPU, where XLA fuses)."""
  rng = np.random.default_rng(4)
  x = jnp.asarray(rng.standard_normal((2, 12, 12, 3)), jnp.float32)
  w1 = jnp.asarray(rng.standard_normal((3, 3, 3, 4)), jnp.float32)
  w2 = jnp.asarray(rng.standard_normal((3, 3, 4, 5)), jnp.float32)
  conv = lambda x, w: layers.patches_conv(x, w, (1, 1), 'VALID', None, None,
                                          ('NHWC', 'HWIO', 'NHWC'))

  def loss(w1, pool):
    return jnp.sum(jnp.sin(conv(pool(jax.nn.relu(conv(x, w1))), w2)))

  ours = jax.jit(jax.grad(loss), static_argnums=1)
  flax_pool = lambda x: nn.max_pool(x, (2, 2), strides=(2, 2))
  np.testing.assert_allclose(ours(w1, layers.max_pool_2x2), ours(w1, flax_pool), rtol=1e-6)
  if jax.default_backend() != 'cpu':
    return
  hlo = ours.lower(w1, layers.max_pool_2x2).compile().as_text()
  kernels = re.findall(r'\n%?[\w.-]+ \([^\n]*\) -> (\S+) \{\n(.*?)\n\}', hlo, re.S)
  padding = [shape for shape, body in kernels if ' pad(' in body]   # the input gradient's sum
  assert padding and set(padding) == {'f32[2,5,5,4]'}, padding   # written once, at pool shape


def _primitives(jaxpr) -> set:
  """The primitive names in ``jaxpr`` and every jaxpr nested in it."""
  names, todo = set(), [jaxpr]
  while todo:
    jaxpr = todo.pop()
    for eqn in jaxpr.eqns:
      names.add(eqn.primitive.name)
      todo.extend(jax.extend.core.jaxprs_in_params(eqn.params))
  return names


@jax.default_matmul_precision('float32')   # on a GPU, not TF32: the tolerances are float32's
@pytest.mark.slow
def test_cnn_fast_layers_equal_xla_layers_and_vmap_without_batched_convolutions():
  """GeL's FEMNIST CNN: the default layers give XLA's outputs and per-client gradients, and
  the vmapped client gradient has no convolution or reduce_window left (on CPU and GPU)."""
  fast = models.TwoConvCNN(62, padding='VALID', hidden=512)
  xla = models.TwoConvCNN(62, padding='VALID', hidden=512, xla_layers=True)
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.random((3, 4, 784)), jnp.float32)       # 3 clients, 4 images each
  y = jnp.asarray(rng.integers(0, 62, (3, 4)))
  params = jax.jit(fast.init)(jax.random.key(0), x[0])   # jitted: one compile, not op by op
  np.testing.assert_allclose(jax.jit(fast.apply)(params, x[0]), jax.jit(xla.apply)(params, x[0]),
                             rtol=1e-5, atol=1e-5)

  def client_grads(module):
    loss = lambda p, xb, yb: jnp.mean(
        -jax.nn.log_softmax(module.apply(p, xb))[jnp.arange(4), yb])
    return jax.vmap(jax.grad(loss), in_axes=(None, 0, 0))

  for a, b in zip(jax.tree.leaves(jax.jit(client_grads(fast))(params, x, y)),
                  jax.tree.leaves(jax.jit(client_grads(xla))(params, x, y))):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
  prims = _primitives(jax.make_jaxpr(client_grads(fast))(params, x, y).jaxpr)
  assert 'conv_general_dilated' not in prims and 'reduce_window_max' not in prims, prims
  xla_prims = _primitives(jax.make_jaxpr(client_grads(xla))(params, x, y).jaxpr)
  assert {'conv_general_dilated', 'reduce_window_max'} <= xla_prims, xla_prims


@pytest.mark.parametrize('backend, conv', [('cpu', False), ('gpu', False), ('tpu', True)])
def test_the_patches_convolution_serves_cpu_and_gpu_xla_serves_tpu(monkeypatch, backend, conv):
  """``conv_general_dilated`` traces to products on CPU and GPU (an H100 ran the vmapped CNN
  round 2.3x faster that way), to XLA's convolution on TPU."""
  monkeypatch.setattr(jax, 'default_backend', lambda: backend)
  x, w = jnp.ones((2, 6, 6, 3)), jnp.ones((3, 3, 3, 4))
  jaxpr = jax.make_jaxpr(lambda x, w: layers.conv_general_dilated(
      x, w, (1, 1), 'VALID', dimension_numbers=('NHWC', 'HWIO', 'NHWC')))(x, w).jaxpr
  assert ('conv_general_dilated' in _primitives(jaxpr)) == conv


def _flax_lstm(hidden, x, cell):
  """Flax's own ``nn.RNN(nn.OptimizedLSTMCell)`` on the cell parameters ``cell``."""
  return nn.RNN(nn.OptimizedLSTMCell(hidden)).apply({'params': {'cell': cell}}, x)


@pytest.mark.slow
def test_lstm_equals_flax_lstm_cell_and_its_gradients(features=3, hidden=5):
  from fedjax_gel.models.rnn import lstm_kernels
  x = jax.random.normal(jax.random.key(0), (2, 7, features))
  cell = nn.RNN(nn.OptimizedLSTMCell(hidden)).init(jax.random.key(1), x)['params']['cell']
  # Random biases and larger kernels, so that no gate sits at a trivial value.
  cell = jax.tree_util.tree_map(
      lambda a: 2 * jax.random.normal(jax.random.key(a.size), a.shape), cell)
  weights = jax.random.normal(jax.random.key(2), (2, 7, hidden))   # every position counts

  def fused(x, cell):
    return jnp.sum(weights * jnp.sin(layers.lstm(x, *lstm_kernels(cell))))

  def reference(x, cell):
    return jnp.sum(weights * jnp.sin(_flax_lstm(hidden, x, cell)))

  np.testing.assert_allclose(layers.lstm(x, *lstm_kernels(cell)), _flax_lstm(hidden, x, cell),
                             rtol=1e-5, atol=1e-6)
  got = jax.jit(jax.grad(fused, argnums=(0, 1)))(x, cell)
  want = jax.grad(reference, argnums=(0, 1))(x, cell)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
                         got, want)
  # Vmapped over clients with a kernel each, as the round runs it; and differentiated twice.
  cells = jax.tree_util.tree_map(lambda a: jnp.stack([a, a[::-1] * 0.5]), cell)
  xs = jnp.stack([x, -x])
  got = jax.vmap(jax.grad(fused, argnums=1))(xs, cells)
  want = jax.vmap(jax.grad(reference, argnums=1))(xs, cells)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
                         got, want)
  second = lambda f: jax.grad(lambda x: jnp.sum(jax.grad(f)(x, cell) ** 2))(x)
  np.testing.assert_allclose(second(fused), second(reference), rtol=1e-3, atol=1e-5)


@pytest.mark.slow
def test_stacked_lstm_fused_and_flax_cells_share_parameters_and_gradients():
  """The model's ``fused`` apply and Flax's cell: the same initial parameters, the same loss
  gradient (Sent140's shape: a dense after the LSTMs)."""
  from fedjax_gel.models.adapters import from_linen
  from fedjax_gel.models.losses import cross_entropy_loss
  from fedjax_gel.models.rnn import StackedLSTM
  fused, flax_cell = (from_linen('lstm', StackedLSTM(3, 12, embed_dim=4, hidden=6, dense=5,
                                                     fused=f), (9,), jnp.int32, 3)
                      for f in (True, False))
  params = fused.init(jax.random.key(0))
  jax.tree_util.tree_map(np.testing.assert_array_equal, params,
                         flax_cell.init(jax.random.key(0)))
  batch = {'x': jax.random.randint(jax.random.key(1), (4, 9), 0, 12),
           'y': jnp.array([0, 1, 2, 1])}
  got = jax.grad(cross_entropy_loss(fused))(params, batch)
  want = jax.grad(cross_entropy_loss(flax_cell))(params, batch)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                         got, want)
