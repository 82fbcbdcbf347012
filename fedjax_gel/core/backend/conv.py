"""The convolution as patches times the kernel: fast when vmapped over clients.

Vmapping a client's training step over a cohort turns every convolution into a batched one
with a different kernel per client. XLA's CPU backend runs that, and the transposed
convolutions of its gradient, more than an order of magnitude slower than the same arithmetic
as matrix products (GeL's FEMNIST CNN: ``benchmarks/vs_torch_loop.py`` with and without
``--xla_layers``, the measurements in ``docs/speed.md``).
``patches_conv`` computes the same convolution as the window's shifted strided slices stacked
into patches ``[N, *out_spatial, window * C_in]`` and one ``dot_general`` with the kernel
reshaped to ``[window * C_in, C_out]``. Its gradient is slices, pads and products too, and
under ``vmap`` the product becomes one batched matrix product per layer, which the CPU library
runs at full speed. The patches cost ``window`` times the input's memory.

``conv_general_dilated`` is the drop-in for ``flax.linen.Conv(conv_general_dilated=...)`` the
models of ``fedjax_gel.models.cnn`` use: patches on CPU and GPU, XLA's own convolution on TPU
(not measured there). On a GPU the vmapped convolution fares no better: on an H100, XLA runs it
as cuDNN convolutions of one client each, per step (thousands of launches of the top kernel a
round), and a 1,000-client GeL FEMNIST CNN round is slower with it than with patches
(``benchmarks/profile_round.py --workload cnn --clients 1000`` with and without
``--xla_layers``, ``docs/speed.md``). Both compute the same convolution up to float
summation order.
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
  """``lax.conv_general_dilated`` computed as patches times the reshaped kernel.

  ``out[n, p, o] = sum_{k, c} x[n, p * s + k * d, c] w[k, c, o]`` over window offsets ``k``,
  after padding and input dilation: the window's shifted strided slices stacked into patches
  ``[N, *out_spatial, window * C_in]`` and one ``dot_general`` with the kernel reshaped to
  ``[window * C_in, C_out]`` (see the module docstring for why). Grouped convolutions
  (``feature_group_count`` or ``batch_group_count`` above 1) and empty outputs are left to
  ``lax.conv_general_dilated``.

  Args:
    lhs: the input, laid out as ``dimension_numbers`` say.
    rhs: the kernel, laid out as ``dimension_numbers`` say.
    window_strides: the strides ``s``, one per spatial dimension.
    padding: ``'SAME'``, ``'VALID'`` or a ``(low, high)`` pair per spatial dimension.
    lhs_dilation: the input's dilation (None: 1 in every dimension).
    rhs_dilation: the kernel's dilation ``d`` (None: 1 in every dimension).
    dimension_numbers: as ``lax.conv_general_dilated``'s (None: ``NCHW``, ``OIHW``).
    feature_group_count: above 1, a grouped convolution, left to XLA.
    batch_group_count: above 1, a grouped convolution, left to XLA.
    precision: the product's precision, as ``lax.dot_general``'s.
    preferred_element_type: the product's accumulation type, as ``lax.dot_general``'s.

  Returns:
    The convolution's output, as ``lax.conv_general_dilated`` returns it (the same values up
    to float summation order).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from fedjax_gel import models
    >>> x, w = jnp.ones((2, 28, 28, 1)), jnp.ones((5, 5, 1, 32))
    >>> y = models.patches_conv(x, w, (1, 1), 'SAME', dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
    >>> y.shape
    (2, 28, 28, 32)
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
  """``patches_conv``, or ``lax.conv_general_dilated`` on TPU (same arguments); pass it as
  ``flax.linen.Conv(conv_general_dilated=...)``."""
  conv = lax.conv_general_dilated if jax.default_backend() == 'tpu' else patches_conv
  return conv(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers,
              feature_group_count, batch_group_count, precision, preferred_element_type)
