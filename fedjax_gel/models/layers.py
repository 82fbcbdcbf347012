"""Convolution, pooling and LSTM layers that run fast when vmapped over clients.

``patches_conv`` and ``conv_general_dilated`` (the drop-in for ``flax.linen.Conv(
conv_general_dilated=...)``: patches on CPU and GPU, XLA's own convolution on TPU) are the
convolution as patches times the kernel, a backend choice that lives in
``fedjax_gel.core.backend.conv`` (why, and the measurements, there); they are this module's too,
for your own Flax CNN.

``max_pool_2x2`` is ``nn.max_pool(x, (2, 2), strides=(2, 2))`` as the maximum of four strided
views, with a gradient of selects (``jax.custom_vjp``): XLA's CPU ``reduce_window`` and the
``select_and_scatter`` of its gradient were the slowest kernels of the CNN round after the
convolutions. (Neither a ``max`` over a reshape nor a tree of ``jnp.maximum`` is better: their
automatic gradients count the ties with a reduction or scatter through interior pads.) The
gradient's cotangent is computed once, not once per position of its block (``_computed_once``).

Use both in your own Flax CNN to get the same speed.

``lstm`` runs an LSTM over a sequence with the four gates' kernels as one matrix each (what
Flax's ``nn.RNN(nn.OptimizedLSTMCell)`` computes, from the same parameters), with its own
gradient (``jax.custom_vjp``): the backward recurrence only carries ``(dh, dc)`` through the
recurrent kernel and writes every position's gate cotangent; the kernels' gradients and the
input's are then one matrix product each over all positions. Differentiating Flax's cell
instead adds every gate's kernel gradient into its accumulator at every position, about 40% of
a Shakespeare round (``docs/speed.md``). Forward-mode differentiation (``jax.jvp``)
of a ``custom_vjp`` is not defined; use Flax's cell for it.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from fedjax_gel.core.backend.conv import (  # pylint: disable=unused-import
    conv_general_dilated, patches_conv)


def _corners(x):
  """The four ``[N, H/2, W/2, C]`` views of the 2x2 blocks of an even ``[N, H, W, C]``, in
  window order (0,0), (0,1), (1,0), (1,1)."""
  n, h, w, c = x.shape
  b = x.reshape((n, h // 2, 2, w // 2, 2, c))
  return b[:, :, 0, :, 0], b[:, :, 0, :, 1], b[:, :, 1, :, 0], b[:, :, 1, :, 1]


def _computed_once(g, like):
  """``g`` unchanged, divided by a 1 that XLA cannot fold away (``like == like or like !=
  like`` holds for every float, NaN included; ``g / 1`` is ``g`` for every float).

  The pool's gradient reads each element of its cotangent ``g`` four times, once per position
  of its block. XLA's CPU fusion puts a cheap producer into such a consumer and evaluates it
  once per read: after a patches convolution that producer is the convolution's input
  gradient, a sum of 25 padded slices (5 x 5 window), evaluated for every position of the
  block (GeL's FEMNIST CNN: 14-15% of its round's kernel time). It does not do that with an
  expensive producer such as a division, so ``g`` is computed once and stored, and the pool's
  gradient reads it: the same values, a faster step (``docs/speed.md``).
  """
  return g / ((like == like) | (like != like)).astype(g.dtype)


@jax.custom_vjp
def _pool_even(x):
  a, b, c, d = _corners(x)
  return jnp.maximum(jnp.maximum(a, b), jnp.maximum(c, d))


def _pool_even_fwd(x):
  return _pool_even(x), x


def _pool_even_bwd(x, g):
  """The gradient goes to the first maximum of each block in window order, as
  ``select_and_scatter`` gives it in ``nn.max_pool``; one broadcast select writes it from
  the cotangent, computed once (``_computed_once``)."""
  a, b, c, d = _corners(x)
  y = jnp.maximum(jnp.maximum(a, b), jnp.maximum(c, d))
  first = jnp.where(a == y, 0, jnp.where(b == y, 1, jnp.where(c == y, 2, 3)))   # [N, H/2, W/2, C]
  g = _computed_once(g, a)
  n, h2, w2, ch = y.shape
  position = jnp.arange(4).reshape((1, 1, 2, 1, 2, 1))
  dx = jnp.where(position == first[:, :, None, :, None], g[:, :, None, :, None],
                 jnp.zeros((), g.dtype))
  return (dx.reshape((n, 2 * h2, 2 * w2, ch)),)


_pool_even.defvjp(_pool_even_fwd, _pool_even_bwd)


def max_pool_2x2(x, padding: str = 'VALID'):
  """A 2x2 max pool of stride 2, fast when vmapped: ``nn.max_pool(x, (2, 2), strides=(2, 2))``.

  The same values and the same gradient (to the first maximum of each block), as elementwise
  maxima of the blocks' four strided views and, for the gradient, selects.

  Args:
    x: ``[N, H, W, C]``.
    padding: ``'SAME'`` pads an odd side with ``-inf``, ``'VALID'`` drops its last row or
      column.

  Returns:
    ``[N, ceil(H / 2), ceil(W / 2), C]`` (``'SAME'``) or ``[N, H // 2, W // 2, C]``.

  Raises:
    ValueError: another padding.

  Examples:
    >>> import jax.numpy as jnp
    >>> from fedjax_gel import models
    >>> models.max_pool_2x2(jnp.arange(16.).reshape(1, 4, 4, 1))[0, :, :, 0]
    Array([[ 5.,  7.],
           [13., 15.]], dtype=float32)
  """
  _, h, w, _ = x.shape
  if padding == 'SAME':
    x = jnp.pad(x, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)), constant_values=-jnp.inf)
  elif padding == 'VALID':
    x = x[:, :h - h % 2, :w - w % 2]
  else:
    raise ValueError(f"max_pool_2x2: padding must be 'SAME' or 'VALID', got {padding!r}")
  return _pool_even(x)


def lstm(x, wi, wh, b):
  """An LSTM over ``x [B, L, I]`` from a zero carry: its outputs ``h [B, L, H]``.

  ``wi [I, 4H]``, ``wh [H, 4H]`` and ``b [4H]`` hold the gates ``i, f, g, o`` side by side:
  ``z_t = x_t wi + h_{t-1} wh + b``; ``i, f, o = sigmoid(z^i, z^f, z^o)``, ``g = tanh(z^g)``;
  ``c_t = f c_{t-1} + i g``; ``h_t = o tanh(c_t)`` (Flax's ``OptimizedLSTMCell`` with its
  kernels concatenated; ``models.rnn.lstm_kernels`` builds them from its parameters).
  """
  return jnp.swapaxes(_recurrence(jnp.swapaxes(x, 0, 1), wi, wh, b), 0, 1)


def _gates(z):
  """``(i, f, g, o)`` activations of the pre-activations ``z [..., 4H]``, side by side."""
  i, f, g, o = jnp.split(z, 4, axis=-1)
  return jnp.concatenate([jax.nn.sigmoid(i), jax.nn.sigmoid(f), jnp.tanh(g), jax.nn.sigmoid(o)],
                         axis=-1)


def _scan(x, wi, wh, b, outputs):
  """Runs the LSTM over time-major ``x [L, B, I]``; ``outputs(c, h, act, tanh_c)`` says what
  every position writes."""
  zero = jnp.zeros((x.shape[1], wh.shape[0]), x.dtype)

  def step(carry, x_t):
    c, h = carry
    act = _gates(x_t @ wi + h @ wh + b)
    i, f, g, o = jnp.split(act, 4, axis=-1)
    c = f * c + i * g
    tanh_c = jnp.tanh(c)
    h = o * tanh_c
    return (c, h), outputs(c, h, act, tanh_c)

  return lax.scan(step, (zero, zero), x)[1]


@jax.custom_vjp
def _recurrence(x, wi, wh, b):
  """``h [L, B, H]`` of time-major ``x [L, B, I]``."""
  return _scan(x, wi, wh, b, lambda c, h, act, tanh_c: h)


def _recurrence_fwd(x, wi, wh, b):
  """``h`` and what the gradient reads: every position's ``h``, ``c``, gate activations and
  ``tanh(c)``."""
  cs, hs, acts, tanh_cs = _scan(x, wi, wh, b, lambda *outs: outs)
  return hs, (x, wi, wh, hs, cs, acts, tanh_cs)


def _recurrence_bwd(residuals, dhs):
  """The backward recurrence carries ``(dh, dc)`` and writes every position's ``dz_t``; the
  kernels' gradients ``d wi = sum_t x_t^T dz_t``, ``d wh = sum_t h_{t-1}^T dz_t`` and the
  input's ``dx_t = dz_t wi^T`` are then one product each over all positions."""
  x, wi, wh, hs, cs, acts, tanh_cs = residuals
  zero = jnp.zeros_like(hs[0])
  c_prev = jnp.concatenate([zero[None], cs[:-1]])
  h_prev = jnp.concatenate([zero[None], hs[:-1]])
  wh_t = wh.T

  def step(carry, inputs):
    dh, dc = carry
    dh_t, act, tanh_c, c_before = inputs
    i, f, g, o = jnp.split(act, 4, axis=-1)
    dh = dh + dh_t
    dc = dc + dh * o * (1 - tanh_c * tanh_c)
    dz = jnp.concatenate([dc * g * i * (1 - i), dc * c_before * f * (1 - f),
                          dc * i * (1 - g * g), dh * tanh_c * o * (1 - o)], axis=-1)
    return (dz @ wh_t, dc * f), dz

  _, dz = lax.scan(step, (zero, zero), (dhs, acts, tanh_cs, c_prev), reverse=True)
  return (dz @ wi.T, jnp.einsum('lbi,lbg->ig', x, dz), jnp.einsum('lbh,lbg->hg', h_prev, dz),
          dz.sum((0, 1)))


_recurrence.defvjp(_recurrence_fwd, _recurrence_bwd)


def dropped(module, x, train: bool):
  """``module.drop`` (an ``nn.Dropout``) on ``x`` in training, where ``module`` has a dropout
  rate (its ``dropout`` field); ``x`` itself otherwise."""
  return module.drop(x, deterministic=not train) if module.dropout else x
