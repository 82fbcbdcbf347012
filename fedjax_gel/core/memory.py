"""Memory estimates made before compiling: one client's working set in a round.

A chunk of ``k`` clients takes about ``k x client_bytes(...)`` of device memory: the clients are
vmapped, so every per-client buffer is ``k`` times as large. One client holds

* its data order for the round (``shuffle.order_bytes(tau_max * B)``);
* the peak of the intermediates of one local step, ``value_and_grad(loss)`` on one minibatch
  (``peak_bytes``: a linear scan of the step's jaxpr in program order, each value live from its
  definition to its last use; this counts activations, which the model's size does not tell);
* ``MODEL_COPIES`` model-sized buffers (its params, the optimiser state and the update) and two
  minibatches.

Checked against XLA's own figures (``compiled.memory_analysis()``, the growth of the round's
temporary memory per client added to a chunk; ``tests/core/test_memory.py``): on CPU the estimate
lies between 1.0x and 2.5x of XLA's for the logistic and MLP models (GeL's FEMNIST CNN: 1.15x) and short and long
data orders. It is meant as an upper bound that is not wasteful, to pick a chunk that fits.
"""
from __future__ import annotations

import math

import jax
from jax.extend import core as jcore

from fedjax_gel.core.shuffle import order_bytes

MODEL_COPIES = 3


def _nbytes(v) -> int:
  aval = v.aval
  return math.prod(aval.shape) * aval.dtype.itemsize if hasattr(aval, 'shape') else 0


def _sub_jaxprs(eqn):
  for p in eqn.params.values():
    for sub in p if isinstance(p, (tuple, list)) else (p,):
      if isinstance(sub, jcore.ClosedJaxpr):
        yield sub.jaxpr
      elif isinstance(sub, jcore.Jaxpr):
        yield sub


def peak_bytes(jaxpr) -> int:
  """Peak bytes of the intermediates of ``jaxpr`` live at once (its inputs not counted).

  Each equation's outputs are live until their last use; an equation with inner programs
  (``pjit``, ``custom_vjp``, ``scan`` bodies) adds their own peak while it runs.
  """
  last = {}
  for i, eqn in enumerate(jaxpr.eqns):
    for v in eqn.invars:
      if isinstance(v, jcore.Var):
        last[v] = i
  for v in jaxpr.outvars:
    if isinstance(v, jcore.Var):
      last[v] = len(jaxpr.eqns)
  inputs = set(jaxpr.invars) | set(jaxpr.constvars)
  live = peak = 0
  for i, eqn in enumerate(jaxpr.eqns):
    inner = max((peak_bytes(s) for s in _sub_jaxprs(eqn)), default=0)
    peak = max(peak, live + inner + sum(_nbytes(v) for v in eqn.outvars))
    live += sum(_nbytes(v) for v in eqn.outvars if last.get(v, -1) > i)
    dead = {v for v in eqn.invars
            if isinstance(v, jcore.Var) and last.get(v) == i and v not in inputs}
    live -= sum(_nbytes(v) for v in dead)
  return peak


def step_bytes(loss_fn, params, example_spec: dict, batch_size: int) -> int:
  """Peak intermediate bytes of ``value_and_grad(loss_fn)`` on one minibatch (traced, not run).
  ``example_spec``: one example's ``ShapeDtypeStruct`` per feature."""
  batch = {k: jax.ShapeDtypeStruct((batch_size,) + tuple(s.shape), s.dtype)
           for k, s in example_spec.items()}
  params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
  return peak_bytes(jax.make_jaxpr(jax.value_and_grad(loss_fn))(params, batch).jaxpr)


def client_bytes(loss_fn, params, example_spec: dict, batch_size: int, max_budget: int) -> int:
  """Estimated device bytes one client of a chunk takes during a round (see the module doc)."""
  model = sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(params))
  example = sum(math.prod(s.shape) * s.dtype.itemsize for s in example_spec.values())
  return (order_bytes(max_budget * batch_size) + step_bytes(loss_fn, params, example_spec,
                                                            batch_size)
          + MODEL_COPIES * model + 2 * batch_size * example)
