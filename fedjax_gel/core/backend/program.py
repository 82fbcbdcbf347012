"""``Backend``: how the engine's programs are compiled, the one record ``build_round`` and
``build_runs`` take (the experiment layer's planner fills it).

Every field is a choice of speed on a platform, and none reads how long a run is, so that a run
extended to more rounds is the longer run, bit for bit. Only ``fuse_small_dots`` changes
numbers (the last bits: the products sum in another order), so it is off unless asked for.
"""
from __future__ import annotations

import contextlib
from typing import Any, Mapping, NamedTuple

import jax

from fedjax_gel.core.backend import jax_private, small_dots, threefry


class Backend(NamedTuple):
  """How a round is compiled.

  Attributes:
    fuse_small_dots: the vmapped local step's small batched products as fused multiply-adds
      (``small_dots``): on CPU, rounds of many clients up to 2x faster, other last bits. GPUs
      and TPUs run batched products well: the experiment layer asks for it on CPU only.
    static_steps: loop every chunk's local steps ``b`` times (a trip count fixed at compile
      time, steps beyond a client's ``tau_i`` masked) rather than to the chunk's own largest
      ``tau_i`` (a data-dependent loop that an accelerator may read its predicate of back on the
      host once per step); None: ``default_static_steps``. The same numbers either way.
    compiler_options: XLA options of the programs (``jax.jit``'s; e.g. ``xla.QUICK_COMPILE``);
      None: XLA's defaults. The same numbers (``tests/core/test_compile_options.py``).
    unrolled_threefry: lower the programs' Threefry hashes unrolled on CPU (``threefry``): the
      same bits, fewer kernels, less compile time.
    debug: ``build_round`` returns the debug round instead (``core.debug_round``: the clients
      one by one in a Python loop, eagerly, for ``print`` and breakpoints; one device).
  """
  fuse_small_dots: bool = False
  static_steps: bool | None = None
  compiler_options: Mapping[str, Any] | None = None
  unrolled_threefry: bool = True
  debug: bool = False

  def step(self, fn):
    """The vmapped local step ``fn`` as this backend runs it."""
    return small_dots.fuse_small_dots(fn) if self.fuse_small_dots else fn

  def loops_statically(self, equal_budgets: bool) -> bool:
    return default_static_steps(equal_budgets) if self.static_steps is None else self.static_steps

  @contextlib.contextmanager
  def lowering(self):
    """Where this backend's programs are lowered: the unrolled Threefry inside, JAX's own rules
    after (nothing process-wide outlives it)."""
    with threefry.unrolled_on_cpu() if self.unrolled_threefry else contextlib.nullcontext():
      yield

  def jit(self, fn, **jit_kwargs) -> 'Program':
    """``jax.jit(fn, compiler_options=..., **jit_kwargs)``, lowered within ``lowering``."""
    options = None if self.compiler_options is None else dict(self.compiler_options)
    nested = {k: v for k, v in jit_kwargs.items() if k != 'donate_argnums'}
    return Program(jax.jit(fn, compiler_options=options, **jit_kwargs), jax.jit(fn, **nested),
                   self)


class Program:
  """A jitted function whose calls and ``lower`` run within its backend's ``lowering`` (a call
  that finds its program compiled lowers nothing). Called inside another trace (another
  program, ``jax.eval_shape``) it is a plain nested ``jit``: the outer program's options and
  lowering apply."""

  def __init__(self, jitted, nested, backend: Backend):
    self.jitted, self.nested, self.backend = jitted, nested, backend

  def __call__(self, *args, **kwargs):
    tracing = jax_private.under_trace()
    if tracing is None:   # this JAX cannot tell: traced arguments at least
      tracing = any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((args, kwargs)))
    if tracing:
      return self.nested(*args, **kwargs)
    with self.backend.lowering():
      return self.jitted(*args, **kwargs)

  def lower(self, *args, **kwargs):
    with self.backend.lowering():
      return self.jitted.lower(*args, **kwargs)


def default_static_steps(equal_budgets: bool) -> bool:
  """``Backend.static_steps``' default: a trip count fixed at compile time when every budget is
  equal (no step is wasted) or on an accelerator, where the data-dependent loop may read its
  predicate back on the host once per step (on an H100 a 10,000-client round of
  ``tau_i ~ U{1..50}`` was a fifth slower with it, ``docs/speed.md``); each chunk's own largest
  budget on CPU otherwise."""
  return equal_budgets or jax.default_backend() != 'cpu'
