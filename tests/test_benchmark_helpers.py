"""The benchmarks' FLOP counter against closed forms (its figures go into RESULTS.md)."""
import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), 'benchmarks'))

import common  # pylint: disable=g-import-not-at-top,wrong-import-position


def test_product_flops_counts_products_scans_and_convolutions():
  a, w = jnp.ones((10, 256)), jnp.ones((256, 1024))
  assert common.product_flops(jnp.dot, a, w) == 2 * 10 * 256 * 1024

  def recurrence(h, w):   # 80 steps of [10, 256] x [256, 256], plus elementwise work
    return jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), h, None, length=80)[0]
  h, w2 = jnp.ones((10, 256)), jnp.ones((256, 256))
  assert common.product_flops(recurrence, h, w2) == 80 * 2 * 10 * 256 * 256
  # Reverse mode: each step's product, its input gradient and its kernel gradient.
  grad = jax.grad(lambda w: jnp.sum(recurrence(h, w)))
  assert common.product_flops(grad, w2) == 3 * 80 * 2 * 10 * 256 * 256

  x, k = jnp.ones((4, 12, 12, 3)), jnp.ones((5, 5, 3, 8))   # NHWC, HWIO, VALID: 8 x 8 out
  conv = lambda x, k: jax.lax.conv_general_dilated(x, k, (1, 1), 'VALID',
                                                   dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
  assert common.product_flops(conv, x, k) == 2 * (4 * 8 * 8 * 8) * (5 * 5 * 3)
