"""Batched small products as fused multiply-adds: equal to ``lax.dot_general`` and to the
unrewritten function, and applied only where they should be."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax

from fedjax_gel import algorithms, models
from fedjax_gel.core.backend import Backend, small_dots
from fedjax_gel.core.round import build_round

from helpers import TAU_MAX, cohort, init_params

# (lhs shape, rhs shape, dimension numbers): batch dims leading or not, several contracting or
# free dims, both strategies and both orientations of 'rows'.
CASES = [
    ((7, 5, 4), (7, 4, 3), (((2,), (1,)), ((0,), (0,)))),          # [b, m, k] x [b, k, n]
    ((7, 5, 60), (7, 60, 5), (((2,), (1,)), ((0,), (0,)))),        # K = 60: rows
    ((7, 60, 3), (7, 60, 9), (((1,), (1,)), ((0,), (0,)))),        # K = 60, N > M: rows over m
    ((7, 60, 9), (7, 60, 3), (((1,), (1,)), ((0,), (0,)))),        # rows over n
    ((5, 7, 4), (4, 3, 7), (((2,), (0,)), ((1,), (2,)))),          # batch dims not leading
    ((2, 3, 4, 5, 6), (2, 3, 5, 6, 2), (((3, 4), (2, 3)), ((0, 1), (0, 1)))),   # 2 batch, 2 k
    ((7, 2, 3, 4), (7, 4, 5), (((3,), (1,)), ((0,), (0,)))),       # two free lhs dims
]


@pytest.mark.parametrize('lhs_shape,rhs_shape,dims', CASES)
@pytest.mark.slow
def test_fused_dot_equals_dot_general(lhs_shape, rhs_shape, dims):
  lhs = jax.random.normal(jax.random.key(0), lhs_shape)
  rhs = jax.random.normal(jax.random.key(1), rhs_shape)
  how = small_dots.strategy(lhs_shape, rhs_shape, dims)
  assert how in ('outer', 'rows')
  expect = lax.dot_general(lhs, rhs, dims, precision=lax.Precision.HIGHEST)
  got = small_dots.fused_dot(lhs, rhs, dims, how=how)
  assert got.shape == expect.shape
  np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-5)


def test_fused_dot_keeps_the_preferred_element_type():
  lhs = jax.random.normal(jax.random.key(0), (3, 2, 4)).astype(jnp.bfloat16)
  rhs = jax.random.normal(jax.random.key(1), (3, 4, 2)).astype(jnp.bfloat16)
  dims = (((2,), (1,)), ((0,), (0,)))
  got = small_dots.fused_dot(lhs, rhs, dims, preferred_element_type=jnp.float32)
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(
      got, lax.dot_general(lhs, rhs, dims, preferred_element_type=jnp.float32), rtol=1e-6)


def test_strategy_by_hand():
  batched = (((2,), (1,)), ((0,), (0,)))
  assert small_dots.strategy((200, 5, 60), (200, 5, 5), (((1,), (1,)), ((0,), (0,)))) == 'outer'
  assert small_dots.strategy((200, 5, 60), (200, 60, 5), batched) == 'rows'
  assert small_dots.strategy((5, 60), (60, 5), (((1,), (0,)), ((), ()))) is None   # unbatched
  assert small_dots.strategy((8, 20, 784), (8, 784, 200), batched) is None     # large: library
  assert small_dots.strategy((8, 20, 200), (8, 200, 20), batched) is None      # 20 x 200 rows


def mlp_loss(params, batch):
  @jax.jit   # a nested jit: its dots are rewritten too
  def hidden(w, x):
    return jax.nn.relu(x @ w)   # relu is a custom_jvp, bound unchanged
  logits = hidden(params['w1'], batch['x']) @ params['w2']
  return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, batch['y']))


def all_eqns(jaxpr):
  """The equations of ``jaxpr`` and of every jaxpr nested in them."""
  eqns, todo = [], [jaxpr]
  while todo:
    jaxpr = todo.pop()
    eqns.extend(jaxpr.eqns)
    for e in jaxpr.eqns:
      todo.extend(jax.extend.core.jaxprs_in_params(e.params))
  return eqns


def batched_dots(fn, *args):
  return [e for e in all_eqns(jax.make_jaxpr(fn)(*args).jaxpr)
          if e.primitive is lax.dot_general_p and e.params['dimension_numbers'][1][0]]


def test_vmapped_gradient_equals_the_library_and_has_no_batched_dots_left():
  clients = 6
  params = {'w1': jax.random.normal(jax.random.key(0), (clients, 12, 7)),
            'w2': jax.random.normal(jax.random.key(1), (clients, 7, 3))}
  batch = {'x': jax.random.normal(jax.random.key(2), (clients, 5, 12)),
           'y': jax.random.randint(jax.random.key(3), (clients, 5), 0, 3)}
  step = jax.vmap(jax.value_and_grad(mlp_loss))
  fused = small_dots.fuse_small_dots(step)
  assert len(batched_dots(step, params, batch)) == 5   # forward 2, backward 3
  assert not batched_dots(fused, params, batch)
  (l1, g1), (l2, g2) = jax.jit(step)(params, batch), jax.jit(fused)(params, batch)
  np.testing.assert_allclose(l2, l1, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), g2, g1)


def small_reductions(fn, *args):
  return [e for e in all_eqns(jax.make_jaxpr(fn)(*args).jaxpr) if small_dots.small_reduction(e)]


def test_vmapped_gradient_has_no_small_reductions_left():
  """The softmax's maximum and sum over 3 classes, the mean over 5 examples and the bias-like
  sums become unrolled elementwise ops; the sum over 12 x 5 inputs is left to XLA."""
  clients = 6
  params = {'w1': jax.random.normal(jax.random.key(0), (clients, 12, 7)),
            'w2': jax.random.normal(jax.random.key(1), (clients, 7, 3))}
  batch = {'x': jax.random.normal(jax.random.key(2), (clients, 5, 12)),
           'y': jax.random.randint(jax.random.key(3), (clients, 5), 0, 3)}
  step = jax.vmap(jax.value_and_grad(lambda p, b: mlp_loss(p, b) + jnp.sum(b['x'] ** 2)))
  fused = small_dots.fuse_small_dots(step)
  assert small_reductions(step, params, batch) and not small_reductions(fused, params, batch)
  assert any(e.primitive is lax.reduce_sum_p for e in all_eqns(
      jax.make_jaxpr(fused)(params, batch).jaxpr))   # the 60-term sum stays
  (l1, g1), (l2, g2) = jax.jit(step)(params, batch), jax.jit(fused)(params, batch)
  np.testing.assert_allclose(l2, l1, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5), g2, g1)


@pytest.mark.parametrize('axes', [(1,), (2,), (0, 2), (1, 2)])
@pytest.mark.slow
def test_unrolled_reduction_combines_in_index_order(axes):
  """Sums one element after another in row-major order of the reduced axes (checked to the
  bit against a float32 running sum), maxima equal to ``jnp.max``."""
  x = np.asarray(jax.random.normal(jax.random.key(4), (2, 3, 4)) * 1e3, np.float32)
  got = np.asarray(small_dots.unrolled_reduction(jnp.asarray(x), axes, jnp.add))
  moved = np.moveaxis(x, axes, range(3 - len(axes), 3))
  moved = moved.reshape(moved.shape[:3 - len(axes)] + (-1,))
  want = moved[..., 0].copy()
  for i in range(1, moved.shape[-1]):
    want = (want + moved[..., i]).astype(np.float32)
  np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(
      np.asarray(small_dots.unrolled_reduction(jnp.asarray(x), axes, jnp.maximum)),
      np.max(x, axis=axes))


def test_dots_inside_control_flow_are_left_alone():
  def f(w, xs):
    return jax.lax.scan(lambda h, x: (jnp.tanh(x @ w + h), None), jnp.zeros(w.shape[1]), xs)[0]
  step = jax.vmap(f)
  w, xs = jnp.ones((4, 3, 3)), jnp.ones((4, 6, 3))
  fused = small_dots.fuse_small_dots(step)
  assert len(batched_dots(fused, w, xs)) == len(batched_dots(step, w, xs)) == 1
  np.testing.assert_allclose(fused(w, xs), step(w, xs), rtol=1e-6)


@pytest.mark.slow
def test_round_with_fused_dots_equals_the_library_round(data, model):
  loss = models.cross_entropy_loss(model)
  alg = algorithms.fedavgcm(loss, 0.1, 0.9)
  params = init_params(model)
  c = cohort([1, 4, 9, 4], [3, TAU_MAX, 1, 2])
  out = {}
  for fuse in (False, True):
    rf = build_round(alg, chunk_size=2, backend=Backend(fuse_small_dots=fuse))
    out[fuse] = rf(alg.server_init(params), c, data, jax.random.key(0), jnp.int32(3))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               out[True], out[False])


def transposed_dots(fn, *args) -> int:
  """How many ``transpose`` equations read a ``dot_general``'s output directly."""
  eqns = all_eqns(jax.make_jaxpr(fn)(*args).jaxpr)
  dot_outs = {v for e in eqns if e.primitive is lax.dot_general_p for v in e.outvars}
  return sum(e.primitive is lax.transpose_p and e.invars[0] in dot_outs for e in eqns)


def test_weight_gradient_transpose_becomes_a_swapped_product():
  """A dense layer too large to fuse: autodiff writes its weight gradient as a product and a
  transpose; the rewrite computes the product with its operands swapped instead."""
  clients = 3
  w = jax.random.normal(jax.random.key(0), (clients, 256, 128))
  x = jax.random.normal(jax.random.key(1), (clients, 4, 256))
  grad = jax.vmap(jax.grad(lambda w, x: jnp.sum(jnp.tanh(x @ w))))
  fused = small_dots.fuse_small_dots(grad)
  assert transposed_dots(grad, w, x) >= 1
  assert transposed_dots(fused, w, x) == 0
  np.testing.assert_allclose(jax.jit(fused)(w, x), jax.jit(grad)(w, x), rtol=1e-5, atol=1e-5)


def test_swapped_dot_only_for_a_swap_of_the_free_dimensions():
  lhs, rhs = jnp.ones((2, 5, 3)), jnp.arange(24.).reshape((2, 3, 4))
  params = {'dimension_numbers': (((2,), (1,)), ((0,), (0,))), 'precision': None,
            'preferred_element_type': None}
  out = small_dots.swapped_dot((lhs, rhs), params, (0, 2, 1))
  np.testing.assert_allclose(out, jnp.swapaxes(jnp.einsum('bmk,bkn->bmn', lhs, rhs), 1, 2))
  assert small_dots.swapped_dot((lhs, rhs), params, (1, 0, 2)) is None
  assert small_dots.swapped_dot((lhs, rhs), params, (0, 1, 2)) is None
