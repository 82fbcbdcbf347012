"""The backend seam: every rewrite, lowering, XLA option, compile-cache key and private JAX use,
behind one record.

* ``Backend`` (``program``): how the engine's programs are compiled; ``build_round`` and
  ``build_runs`` take it, the experiment layer's planner fills it; ``Backend.jit`` compiles a
  program with it.
* ``small_dots``: the vmapped step's small batched products as fused multiply-adds (CPU).
* ``conv``: convolutions as patches times the kernel (CPU and GPU; the models' layers use it).
* ``threefry``: JAX's Threefry hash lowered unrolled on CPU, inside ``Backend.lowering`` only.
* ``xla``: XLA's CPU flags set at process start (``configure_cpu``) and compiler options.
* ``compilation_cache``: JAX's persistent compilation cache, keyed alike in every process.
* ``jax_private``: the one module that reaches into ``jax._src``.

Nothing here changes the process as a side effect of building a round: XLA's flags are set by
the command that starts the process (``launch/run.py``), the cache by the command that enables
it, and the Threefry lowering lasts as long as a ``Backend`` program's lowering.
"""
from fedjax_gel.core.backend.program import Backend, Program, default_static_steps
from fedjax_gel.core.backend.small_dots import fuse_small_dots

__all__ = ['Backend', 'Program', 'default_static_steps', 'fuse_small_dots']
