"""The one module that reaches into JAX's private modules (``jax._src``), each use a function.

JAX exports no public handle for these; each is guarded by ``tests/core/test_jax_private.py``
against the JAX versions ``setup.cfg`` supports (from 0.10; tested with 0.10.2), and each
degrades to "not available" (``None`` or ``False``) rather than failing where a JAX lacks it.

* ``backends_initialized``: whether JAX has started its backends (XLA's flags are read then).
* ``under_trace``: whether a transformation is tracing (a ``Backend`` program called inside
  another program is a plain nested ``jit``).
* ``distributed_client`` / ``preemption_sync_manager``: JAX's own client of the coordination
  service of several processes and its preemption manager (as ``jax.experimental.
  multihost_utils`` and orbax reach them).
* ``cache_key_module``: the module whose ``_hash_accelerator_config`` keys a program's devices
  in the persistent compilation cache (``compilation_cache.share_between_processes``).
* ``swap_lowering``: sets a primitive's lowering rule on one platform and returns the rule it
  replaced, so that a lowering can be scoped to the programs that ask for it
  (``threefry.unrolled_on_cpu``); ``jax.interpreters.mlir.register_lowering`` alone cannot undo
  itself.
"""
from __future__ import annotations

from typing import Any


_MISSING = (ImportError, AttributeError)   # what a JAX without a hook raises


def backends_initialized() -> bool:
  """Whether JAX has started its backends (False where this JAX cannot tell)."""
  try:
    from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
    return xla_bridge.backends_are_initialized()
  except _MISSING:
    return False


def under_trace() -> bool | None:
  """Whether a JAX transformation (``jit``, ``eval_shape``, ``vmap``, ...) is tracing now;
  None where this JAX cannot tell."""
  try:
    from jax._src import core  # pylint: disable=g-import-not-at-top
    return not core.trace_state_clean()
  except _MISSING:
    return None


def distributed_client() -> Any:
  """JAX's coordination-service client (``None`` in a process that did not join several, or
  where this JAX keeps it elsewhere)."""
  try:
    from jax._src import distributed  # pylint: disable=g-import-not-at-top
    return distributed.global_state.client
  except _MISSING:
    return None


def preemption_sync_manager() -> Any:
  try:
    from jax._src import distributed  # pylint: disable=g-import-not-at-top
    return distributed.global_state.preemption_sync_manager
  except _MISSING:
    return None


def cache_key_module() -> Any:
  """``jax._src.cache_key``, or None where this JAX has no such module."""
  try:
    from jax._src import cache_key  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  return cache_key


def swap_lowering(primitive, entry, platform: str):
  """Makes ``entry`` (a rule from ``lowering_entry``, or what an earlier swap returned; None:
  no platform rule, JAX's generic one applies) ``primitive``'s lowering on ``platform``;
  returns the entry it replaced (None where there was none). Raises ``ImportError`` or
  ``AttributeError`` where this JAX keeps its lowering rules elsewhere (nothing swapped)."""
  from jax._src.interpreters import mlir  # pylint: disable=g-import-not-at-top
  rules = mlir._platform_specific_lowerings[platform]  # pylint: disable=protected-access
  old = rules.get(primitive)
  if entry is None:
    rules.pop(primitive, None)
  else:
    rules[primitive] = entry
  return old


def lowering_entry(rule, inline: bool = True) -> Any:
  """``rule`` as the lowering tables hold it (what ``mlir.register_lowering`` stores)."""
  from jax._src.interpreters import mlir  # pylint: disable=g-import-not-at-top
  return mlir.LoweringRuleEntry(rule, inline)
