"""Batched small matrix products as fused multiply-adds, small reductions unrolled (an XLA CPU
speed-up).

Vmapping a client's step over many clients turns every matrix product of the model into a
*batched* ``dot_general`` with one tiny product per client (logistic regression at ``B = 5``:
a ``[5, 60] x [60, 5]`` forward and a ``[60, 5] x [5, 5]`` weight gradient per client). XLA's
CPU backend runs such a dot as one library call per batch element, so its cost grows with the
number of clients, a call's overhead each, whatever the size of the products
(``benchmarks/profile_round.py``: at 200 clients the batched products took about half of the
round).
The same product written as a sum of broadcast multiplications is one fused, vectorised loop.

``fuse_small_dots(fn)`` traces ``fn`` and evaluates its jaxpr with every batched ``dot_general``
that is small (at most ``max_terms`` multiply-adds per batch element) rewritten, with
``a = [batch, M, K]`` and ``b = [batch, K, N]`` the operands:

* ``'outer'``, a short contraction (``K <= max_contraction``, the weight gradient over a
  minibatch): ``out = sum_k a[:, :, k, None] * b[:, None, k, :]``, the ``k`` sum unrolled;
* ``'rows'``, few rows on one side (``min(M, N) <= 8`` and ``min(M, N) K <= 512``, the forward
  product of a small minibatch): each row ``sum_k a[:, m, k, None] * b[:, k, :]``, unrolled;

which XLA fuses into one loop over the output. Sums and maxima over at most ``MAX_REDUCED``
elements (a softmax over 5 classes, a mean over a minibatch of 5) become the same kind of
unrolled elementwise ops, in the order of XLA's own reduction loop (``unrolled_reduction``).
XLA's default CPU pipeline hands every reduction to its YNN library, a call that costs far more
than its few additions, three per local step of a logistic regression: a 200-client round ran
faster without them (``docs/speed.md``); a round compiled for compile
time (``core.backend.xla.QUICK_COMPILE``, jaxlib < 0.11), whose reductions are XLA's own loops,
computes the same bits either way.

A library product followed by a transpose that swaps its two sides' free dimensions (how
reverse-mode autodiff writes a weight gradient) is computed as the product with its operands
swapped (``swapped_dot``). Everything else is bound unchanged; nested ``jit`` calls are
inlined so that their products are seen too. The result equals the library product up to float
summation order. Large products, unbatched ones and those inside control flow (``scan``,
``while``, ``cond``) are left to the library, which is faster there. GPUs and TPUs run batched
products well: ``build_round`` applies this on CPU only.
"""
from __future__ import annotations

import math

import jax
import jax.extend as jex
import jax.numpy as jnp
from jax import lax

MAX_CONTRACTION = 32   # "outer": unroll contractions of at most this many terms
MAX_ROW_TERMS = 512    # "rows": or unroll rows x contraction up to this many terms
MAX_ROWS = 8           # over at most this many rows (of the side with fewer rows)
MAX_TERMS = 1 << 16    # and at most this many multiply-adds per batch element
MAX_REDUCED = 8        # sums and maxima over at most this many elements: unrolled
REDUCTIONS = {lax.reduce_sum_p: lax.add, lax.reduce_max_p: lax.max}


def _sizes(lhs_shape, rhs_shape, dimension_numbers):
  """``(lhs free dims, rhs free dims, M, N, K)`` of a ``dot_general``."""
  (lc, rc), (lb, rb) = dimension_numbers
  lf = [d for d in range(len(lhs_shape)) if d not in lc and d not in lb]
  rf = [d for d in range(len(rhs_shape)) if d not in rc and d not in rb]
  return (lf, rf, math.prod(lhs_shape[d] for d in lf), math.prod(rhs_shape[d] for d in rf),
          math.prod(lhs_shape[d] for d in lc))


def strategy(lhs_shape, rhs_shape, dimension_numbers, max_contraction=MAX_CONTRACTION,
             max_terms=MAX_TERMS) -> str | None:
  """How to fuse a ``dot_general``: ``'outer'`` (a short contraction: ``sum_k`` of outer
  products), ``'rows'`` (few rows on one side: each row ``sum_k`` of scaled rows of the other
  side), or None (unbatched, or large enough for the library)."""
  if not dimension_numbers[1][0]:
    return None
  _, _, m, n, k = _sizes(lhs_shape, rhs_shape, dimension_numbers)
  if k == 0 or m * n * k > max_terms:
    return None
  if k <= max_contraction:
    return 'outer'
  if min(m, n) <= MAX_ROWS and min(m, n) * k <= MAX_ROW_TERMS:
    return 'rows'
  return None


def fused_dot(lhs, rhs, dimension_numbers, preferred_element_type=None, how='outer'):
  """``lax.dot_general`` as an unrolled sum of broadcast products (same result layout).

  With ``a = [batch, M, K]`` and ``b = [batch, K, N]`` (the operands transposed and reshaped),
  ``'outer'`` is ``sum_k a[:, :, k, None] * b[:, None, k, :]`` and ``'rows'`` stacks
  ``sum_k a[:, m, k, None] * b[:, k, :]`` over ``m`` (or the same over ``n`` when ``N < M``).
  Written with ``lax``'s primitives (slices, broadcasts, multiplies, adds) rather than
  ``jax.numpy``'s indexing and operators, which trace each term through nested functions: the
  same arithmetic in the same order, traced and lowered in less time.
  """
  (lc, rc), (lb, rb) = dimension_numbers
  lf, rf, m, n, k = _sizes(lhs.shape, rhs.shape, dimension_numbers)
  dtype = preferred_element_type or jnp.result_type(lhs, rhs)
  batch = [lhs.shape[d] for d in lb]
  a = jnp.transpose(lhs, (*lb, *lf, *lc)).reshape(*batch, m, k).astype(dtype)
  b = jnp.transpose(rhs, (*rb, *rc, *rf)).reshape(*batch, k, n).astype(dtype)
  nb = len(batch)

  def at(x, row, col, shape):   # x[..., row, col] (an index or all), broadcast to ``shape``
    for axis, i in ((nb, row), (nb + 1, col)):
      if i is not None:
        x = lax.slice_in_dim(x, i, i + 1, axis=axis)
    return lax.broadcast_in_dim(x, shape, tuple(range(nb + 2)))

  if how == 'outer':
    shape = (*batch, m, n)
    out = sum_of(lax.mul(at(a, None, i, shape), at(b, i, None, shape)) for i in range(k))
  elif m <= n:
    shape = (*batch, 1, n)
    out = lax.concatenate([sum_of(lax.mul(at(a, r, i, shape), at(b, i, None, shape))
                                  for i in range(k)) for r in range(m)], nb)
  else:
    shape = (*batch, m, 1)
    out = lax.concatenate([sum_of(lax.mul(at(a, None, i, shape), at(b, i, c, shape))
                                  for i in range(k)) for c in range(n)], nb + 1)
  return out.reshape(*batch, *(lhs.shape[d] for d in lf), *(rhs.shape[d] for d in rf))


def small_reduction(eqn) -> bool:
  """Whether ``eqn`` sums or maximises over at most ``MAX_REDUCED`` elements."""
  if eqn.primitive not in REDUCTIONS:
    return False
  shape = eqn.invars[0].aval.shape
  return 0 < math.prod(shape[a] for a in eqn.params['axes']) <= MAX_REDUCED


def unrolled_reduction(x, axes, combine):
  """``x`` reduced over ``axes`` by ``combine`` one element after another in index order, the
  order of XLA's own reduction loop: ``((x_0 + x_1) + x_2) + ...``."""
  moved = jnp.moveaxis(x, axes, tuple(range(x.ndim - len(axes), x.ndim)))
  flat = moved.reshape(moved.shape[:x.ndim - len(axes)] + (-1,))
  out = lax.index_in_dim(flat, 0, axis=-1, keepdims=False)
  for i in range(1, flat.shape[-1]):
    out = combine(out, lax.index_in_dim(flat, i, axis=-1, keepdims=False))
  return out


def sum_of(terms):
  """A pairwise (tree) sum: shorter dependency chains, less rounding error than a running sum."""
  terms = list(terms)
  while len(terms) > 1:
    terms = [lax.add(terms[i], terms[i + 1]) if i + 1 < len(terms) else terms[i]
             for i in range(0, len(terms), 2)]
  return terms[0]


def swapped_dot(operands, params, permutation):
  """``transpose(dot_general(lhs, rhs), permutation)`` as ``dot_general(rhs, lhs)`` when the
  permutation only swaps the free dimensions of the two sides (else None).

  Reverse-mode autodiff writes a weight gradient this way; XLA's CPU backend then runs the
  product and a strided transpose (a cost every step for a large dense layer), where the
  swapped product writes the gradient in place.
  """
  lhs, rhs = operands
  (lc, rc), (lb, rb) = params['dimension_numbers']
  lf, rf, _, _, _ = _sizes(lhs.shape, rhs.shape, params['dimension_numbers'])
  nb, nl = len(lb), len(lf)
  if tuple(permutation) != (*range(nb), *range(nb + nl, nb + nl + len(rf)), *range(nb, nb + nl)):
    return None
  precision = params.get('precision')
  if isinstance(precision, tuple):
    precision = precision[::-1]
  return lax.dot_general(rhs, lhs, ((rc, lc), (rb, lb)), precision=precision,
                         preferred_element_type=params.get('preferred_element_type'))


def _eval(jaxpr, consts, args, limits):
  """``jax.core.eval_jaxpr`` with small batched products fused and nested ``jit``s inlined."""
  env = {}

  def read(v):
    return v.val if isinstance(v, jex.core.Literal) else env[v]

  for v, x in zip(jaxpr.constvars, consts):
    env[v] = x
  for v, x in zip(jaxpr.invars, args):
    env[v] = x
  dots = {}   # output var -> (operands, params) of the library products
  for eqn in jaxpr.eqns:
    invals = [read(v) for v in eqn.invars]
    p = eqn.params
    how = None
    if eqn.primitive is lax.dot_general_p:
      how = strategy(eqn.invars[0].aval.shape, eqn.invars[1].aval.shape,
                     p['dimension_numbers'], *limits)
      if how is None:
        dots[eqn.outvars[0]] = (invals, p)
    swapped = None
    if eqn.primitive is lax.transpose_p and eqn.invars[0] in dots:
      swapped = swapped_dot(*dots[eqn.invars[0]], p['permutation'])
    if swapped is not None:
      outs = [swapped]
    elif how is not None:
      outs = [fused_dot(*invals, p['dimension_numbers'], p.get('preferred_element_type'), how)]
    elif small_reduction(eqn):
      outs = [unrolled_reduction(invals[0], tuple(p['axes']), REDUCTIONS[eqn.primitive])]
    elif eqn.primitive.name in ('jit', 'pjit'):
      inner = p['jaxpr']
      outs = _eval(inner.jaxpr, inner.consts, invals, limits)
    else:
      with eqn.ctx.manager:
        outs = eqn.primitive.bind(*invals, **eqn.primitive.get_bind_params(p))
      if not eqn.primitive.multiple_results:
        outs = [outs]
    for v, x in zip(eqn.outvars, outs):
      if not isinstance(v, jex.core.DropVar):
        env[v] = x
  return [read(v) for v in jaxpr.outvars]


def fuse_small_dots(fn, max_contraction: int = MAX_CONTRACTION, max_terms: int = MAX_TERMS):
  """Wraps ``fn`` so that its batched small products run as fused multiply-adds.

  ``fn`` is traced anew at each call (inside ``jit``, once per compilation) and its jaxpr
  evaluated with every small batched ``dot_general`` rewritten (``'outer'`` or ``'rows'``, see
  the module docstring), small sums and maxima unrolled and nested ``jit`` calls inlined; the
  result equals ``fn``'s up to float summation order. A speed-up on CPU only: ``build_round``
  applies it there when its ``Backend`` asks (``Backend.fuse_small_dots``).

  Args:
    fn: the function to wrap (a vmapped local step), of positional array arguments.
    max_contraction: the longest contraction ``K`` fused as ``'outer'``.
    max_terms: the most multiply-adds per batch element a fused product may take.

  Returns:
    ``wrapped(*args)``, computing what ``fn(*args)`` does.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from fedjax_gel import core
    >>> step = jax.vmap(lambda w, x: jnp.tanh(x @ w))   # one tiny product per client
    >>> w, x = jnp.ones((200, 60, 5)), jnp.ones((200, 5, 60))
    >>> out = jax.jit(core.fuse_small_dots(step))(w, x)
  """
  def wrapped(*args):
    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
    outs = _eval(closed.jaxpr, closed.consts, jax.tree_util.tree_leaves(args),
                 (max_contraction, max_terms))
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(out_shape), outs)
  return wrapped
