"""Convolution and pooling layers that run fast when vmapped over clients on CPU.


Vmapping a client's training step over a cohort turns every convolution into a batched one
with a different kernel per client. XLA's CPU backend runs that, and the transposed
convolutions of its gradient, more than an order of magnitude slower than the same arithmetic
as matrix products (GeL's FEMNIST CNN: ``benchmarks/vs_torch_loop.py`` with and without
``--xla_layers``, figures in ``benchmarks/RESULTS.md``).
``patches_conv`` computes the same convolution as the window's shifted strided slices stacked
into patches ``[N, *out_spatial, window * C_in]`` and one ``dot_general`` with the kernel
reshaped to ``[window * C_in, C_out]``. Its gradient is slices, pads and products too, and
under ``vmap`` the product becomes one batched matrix product per layer, which the CPU library
runs at full speed. The patches cost ``window`` times the input's memory.

``conv_general_dilated`` is the drop-in for ``flax.linen.Conv(conv_general_dilated=...)`` the
models of ``fedjax_gel.models.cnn`` use: patches on the CPU backend, XLA's own convolution on
GPU and TPU (whose convolution kernels batch well). Both compute the same convolution up to
float summation order.

``max_pool_2x2`` is ``nn.max_pool(x, (2, 2), strides=(2, 2))`` as the maximum of four strided
views, with a gradient of selects (``jax.custom_vjp``): XLA's CPU ``reduce_window`` and the
``select_and_scatter`` of its gradient were the slowest kernels of the CNN round after the
convolutions. (Neither a ``max`` over a reshape nor a tree of ``jnp.maximum`` is better: their
automatic gradients count the ties with a reduction or scatter through interior pads.)

Use both in your own Flax CNN to get the same speed.
"""
from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def patches_conv(lhs, rhs, window_strides, padding, lhs_dilation=None, rhs_dilation=None,
                 dimension_numbers=None, feature_group_count=1, batch_group_count=1,
                 precision=None, preferred_element_type=None):
  """``lax.conv_general_dilated`` (same arguments) as patches times the reshaped kernel.

  ``out[n, p, o] = sum_{k, c} x[n, p * s + k * d, c] w[k, c, o]`` over window offsets ``k``,
  after padding and input dilation. Grouped convolutions (``feature_group_count`` or
  ``batch_group_count`` above 1) and empty outputs are left to ``lax.conv_general_dilated``.
  """
  args = (window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers,
          feature_group_count, batch_group_count, precision, preferred_element_type)
  if feature_group_count != 1 or batch_group_count != 1:
    return lax.conv_general_dilated(lhs, rhs, *args)
  nsp = lhs.ndim - 2
  dn = lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
  x = jnp.transpose(lhs, (dn.lhs_spec[0], *dn.lhs_spec[2:], dn.lhs_spec[1]))   # [N, *S, C]
  w = jnp.transpose(rhs, (*dn.rhs_spec[2:], dn.rhs_spec[1], dn.rhs_spec[0]))   # [*K, C, O]
  window = w.shape[:nsp]
  strides = tuple(window_strides)
  lhs_d = tuple(lhs_dilation or (1,) * nsp)
  rhs_d = tuple(rhs_dilation or (1,) * nsp)
  if isinstance(padding, str):
    dilated_in = [(n - 1) * d + 1 for n, d in zip(x.shape[1:-1], lhs_d)]
    dilated_window = [(k - 1) * d + 1 for k, d in zip(window, rhs_d)]
    padding = lax.padtype_to_pads(dilated_in, dilated_window, strides, padding)
  x = lax.pad(x, jnp.zeros((), x.dtype),
              [(0, 0, 0), *((lo, hi, d - 1) for (lo, hi), d in zip(padding, lhs_d)), (0, 0, 0)])
  out = [(n - (k - 1) * d - 1) // s + 1
         for n, k, d, s in zip(x.shape[1:-1], window, rhs_d, strides)]
  if min(out, default=1) <= 0:
    return lax.conv_general_dilated(lhs, rhs, *args)
  cols = []
  for offset in itertools.product(*map(range, window)):
    start = (0, *(o * d for o, d in zip(offset, rhs_d)), 0)
    limit = (x.shape[0], *(b + (n - 1) * s + 1 for b, n, s in zip(start[1:-1], out, strides)),
             x.shape[-1])
    cols.append(lax.slice(x, start, limit, (1, *strides, 1)))
  patches = jnp.stack(cols, axis=-2).reshape((x.shape[0], *out, -1))   # [N, *out, K * C]
  y = lax.dot_general(patches, w.reshape((-1, w.shape[-1])), (((nsp + 1,), (0,)), ((), ())),
                      precision=precision, preferred_element_type=preferred_element_type)
  order = (dn.out_spec[0], *dn.out_spec[2:], dn.out_spec[1])   # y's axes in the output's terms
  return jnp.transpose(y, tuple(np.argsort(order)))


def conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation=None,
                         rhs_dilation=None, dimension_numbers=None, feature_group_count=1,
                         batch_group_count=1, precision=None, preferred_element_type=None):
  """``patches_conv`` on the CPU backend, ``lax.conv_general_dilated`` elsewhere (same
  arguments); pass it as ``flax.linen.Conv(conv_general_dilated=...)``."""
  conv = patches_conv if jax.default_backend() == 'cpu' else lax.conv_general_dilated
  return conv(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers,
              feature_group_count, batch_group_count, precision, preferred_element_type)


def _corners(x):
  """The four ``[N, H/2, W/2, C]`` views of the 2x2 blocks of an even ``[N, H, W, C]``, in
  window order (0,0), (0,1), (1,0), (1,1)."""
  n, h, w, c = x.shape
  b = x.reshape((n, h // 2, 2, w // 2, 2, c))
  return b[:, :, 0, :, 0], b[:, :, 0, :, 1], b[:, :, 1, :, 0], b[:, :, 1, :, 1]


@jax.custom_vjp
def _pool_even(x):
  a, b, c, d = _corners(x)
  return jnp.maximum(jnp.maximum(a, b), jnp.maximum(c, d))


def _pool_even_fwd(x):
  return _pool_even(x), x


def _pool_even_bwd(x, g):
  """The gradient goes to the first maximum of each block in window order, as
  ``select_and_scatter`` gives it in ``nn.max_pool``; one broadcast select writes it."""
  a, b, c, d = _corners(x)
  y = jnp.maximum(jnp.maximum(a, b), jnp.maximum(c, d))
  first = jnp.where(a == y, 0, jnp.where(b == y, 1, jnp.where(c == y, 2, 3)))   # [N, H/2, W/2, C]
  n, h2, w2, ch = y.shape
  position = jnp.arange(4).reshape((1, 1, 2, 1, 2, 1))
  dx = jnp.where(position == first[:, :, None, :, None], g[:, :, None, :, None],
                 jnp.zeros((), g.dtype))
  return (dx.reshape((n, 2 * h2, 2 * w2, ch)),)


_pool_even.defvjp(_pool_even_fwd, _pool_even_bwd)


def max_pool_2x2(x, padding: str = 'VALID'):
  """``nn.max_pool(x, (2, 2), strides=(2, 2), padding=padding)`` on ``[N, H, W, C]``: the same
  values and the same gradient (to the first maximum of each block), as elementwise maxima of
  the blocks' four strided views and, for the gradient, selects.

  ``'SAME'`` pads an odd side with ``-inf``, ``'VALID'`` drops its last row or column.
  """
  _, h, w, _ = x.shape
  if padding == 'SAME':
    x = jnp.pad(x, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)), constant_values=-jnp.inf)
  elif padding == 'VALID':
    x = x[:, :h - h % 2, :w - w % 2]
  else:
    raise ValueError(f"max_pool_2x2: padding must be 'SAME' or 'VALID', got {padding!r}")
  return _pool_even(x)
