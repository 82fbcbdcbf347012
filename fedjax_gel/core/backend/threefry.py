"""Threefry-2x32 on CPU as one fused kernel (``unrolled_on_cpu``).

JAX's default PRNG hashes counters with Threefry-2x32 (Salmon et al. 2011, "Parallel random
numbers: as easy as 1, 2, 3"): 20 rounds of add, rotate and xor on pairs of uint32, with a key
injection after every 4 rounds. On GPU and TPU JAX lowers it unrolled; on CPU it lowers it as a
``while`` loop over the 5 key injections, which keeps compile time down for programs with many
random calls but costs a loop of some 20 tiny kernels (and copies of the carried words) at
every call site at run time. A compiled round has a dozen such sites (the clients' keys, their
data order, the algorithms' draws): at 20 clients and one local step they were 715 of the
round's 773 kernel launches (``benchmarks/profile_round.py``).

Within ``unrolled_on_cpu()`` the primitive is lowered on CPU as the unrolled rounds, which XLA
fuses into one elementwise kernel per call site: the same bits (integer arithmetic; the tests
check it against the paper's known-answer vectors and a NumPy oracle), fewer kernels, and
8-17% less compile time for a round (``benchmarks/paired_checkouts.py``; the loops' control
flow is gone). Round times did not change measurably on CPU. The lowering applies to what is
lowered inside the ``with`` (``Backend.jit``'s programs) and JAX's own rule is back after it,
so the user's programs are lowered as JAX lowers them.
"""
from __future__ import annotations

import contextlib
import threading

import numpy as np
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import stablehlo as hlo
from jax.interpreters import mlir

from fedjax_gel.core.backend import jax_private

ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))   # Threefry-2x32's rotation constants
PARITY = 0x1BD11BDA                               # the key schedule's parity constant


def _lowering(ctx, key1, key2, x1, x2):
  """Threefry-2x32 with 20 rounds, unrolled, as StableHLO: ``(y1, y2)`` for key ``(key1,
  key2)`` and counters ``(x1, x2)`` (uint32, broadcast to the output's shape). Emitted op by op
  rather than traced from a Python function (``mlir.lower_fun``), which took a quarter of a
  round's lowering."""
  aval = ctx.avals_out[0]
  out = ir.RankedTensorType.get(aval.shape, ir.IntegerType.get_unsigned(32))
  rank = len(aval.shape)

  def widen(v, shape):
    dims = ir.DenseI64ArrayAttr.get(list(range(rank - len(shape), rank)))
    return v if tuple(shape) == tuple(aval.shape) else hlo.broadcast_in_dim(out, v, dims)

  def const(c: int):
    return widen(mlir.ir_constant(np.uint32(c)), ())

  def rotate(v, r: int):
    return hlo.or_(hlo.shift_left(v, const(r)), hlo.shift_right_logical(v, const(32 - r)))

  key1, key2, a, b = (widen(v, x.shape) for v, x in zip((key1, key2, x1, x2), ctx.avals_in))
  ks = (key1, key2, hlo.xor(hlo.xor(key1, key2), const(PARITY)))
  a, b = hlo.add(a, ks[0]), hlo.add(b, ks[1])
  for i in range(5):
    for r in ROTATIONS[i % 2]:
      a = hlo.add(a, b)
      b = hlo.xor(rotate(b, r), a)
    a = hlo.add(a, ks[(i + 1) % 3])
    b = hlo.add(hlo.add(b, ks[(i + 2) % 3]), const(i + 1))
  return [a, b]


_lock = threading.Lock()
_holders = 0        # the ``with`` blocks open now, in every thread
_replaced = None    # JAX's rule while they are (a 1-tuple), or None: nothing was swapped


@contextlib.contextmanager
def unrolled_on_cpu():
  """Lowers ``threefry2x32`` unrolled on CPU inside the ``with`` (nestable, and across threads:
  installed by the first block to open, JAX's own rule back when the last one closes).
  Changes nothing where this JAX does not expose the primitive or its lowering rules.

  JAX caches a lowering by function and arguments (``jax.jit`` wrappers of one Python function
  share it), so a function lowered once is not lowered again on the other side of the
  ``with``: the engine's programs are closures of their own, lowered only inside it."""
  global _holders, _replaced
  with _lock:
    if _holders == 0:
      try:
        from jax.extend.random import threefry2x32_p  # pylint: disable=g-import-not-at-top
        _replaced = (threefry2x32_p, jax_private.swap_lowering(
            threefry2x32_p, jax_private.lowering_entry(_lowering), 'cpu'))
      except (ImportError, AttributeError, KeyError):
        _replaced = None
    _holders += 1
  try:
    yield
  finally:
    with _lock:
      _holders -= 1
      if _holders == 0 and _replaced is not None:
        jax_private.swap_lowering(_replaced[0], _replaced[1], 'cpu')
        _replaced = None
