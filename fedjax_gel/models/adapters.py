"""Your own Flax module as a ``Model``: ``from_linen`` (a ``flax.linen`` module) and ``from_nnx``
(a ``flax.nnx`` one). The rng streams a module draws in training (dropout) are found by tracing
it, and its mutable collections (BatchNorm's ``batch_stats``) kept as the model's state.
"""
from __future__ import annotations

import inspect
import re
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_gel.core.model_state import Variables
from fedjax_gel.core.tasks import CLASSIFICATION, Task
from fedjax_gel.models.base import Model


# Collections a linen module may write that are not model state: ``sow``'s intermediates and
# ``perturb``'s perturbations are made mutable in training (so that they work) and dropped, as is
# any collection a training step changes the structure of (``sow`` into a name of its own).
NOT_STATE = ('params', 'intermediates', 'perturbations')
MAX_STREAMS = 16   # rng streams a module may ask for before ``from_linen`` gives up


def stream_keys(rng, streams) -> dict:
  """``{stream: fold_in(rng, position)}``: one key per rng stream of the step."""
  return {s: jax.random.fold_in(rng, i) for i, s in enumerate(streams)}


def takes_train(module) -> bool:
  """Whether a linen module's ``__call__`` takes ``train`` (Flax's convention for dropout and
  BatchNorm: ``nn.Dropout(rate, deterministic=not train)``,
  ``nn.BatchNorm(use_running_average=not train)``)."""
  try:
    params = inspect.signature(module.__call__).parameters
  except (TypeError, ValueError):
    return False
  return 'train' in params   # by name: ``**kwargs`` may be forwarded to layers that refuse it


def missing_stream(error) -> str | None:
  """The rng stream a ``flax.errors.InvalidRngError`` asks for (``... needs PRNG for "s"``)."""
  found = re.search(r'PRNG for "([^"]+)"', str(error))
  return found.group(1) if found else None


def discover_streams(name: str, run: Callable, where: str, *args) -> tuple[tuple, Any]:
  """The rng streams ``run(rngs, *args)`` asks for, found by tracing it (``jax.eval_shape``;
  ``args`` may be shape structs) with the streams asked so far until it asks for none; and the
  shapes of what it returned then."""
  from flax import errors  # pylint: disable=g-import-not-at-top
  streams = []
  for _ in range(MAX_STREAMS):
    try:
      out = jax.eval_shape(lambda *a: run(stream_keys(jax.random.key(0), streams), *a), *args)
      return tuple(streams), out
    except errors.InvalidRngError as e:
      stream = missing_stream(e)
      if stream is None or stream in streams:
        raise ValueError(f'model {name!r}: {where} asks for an rng stream it is not given: '
                         f'{str(e).split(" (https")[0]}') from None
      streams.append(stream)
  raise ValueError(f'model {name!r}: {where} asks for more than {MAX_STREAMS} rng streams')


def from_linen(name: str, module, input_shape, input_dtype, num_classes: int,
               task: Task = CLASSIFICATION) -> Model:
  """Wraps a Flax linen module as a ``Model``.

  The module's ``__call__(x)`` maps ``[B, *input_shape]`` to its outputs (logits for classification;
  ``task`` says how they are scored). A module whose ``__call__`` takes ``train`` is called with
  ``train=True`` in the clients' local steps and ``train=False`` in evaluation; one that does not is
  called without it. The rng streams it draws in training (``self.make_rng``, ``nn.Dropout``) are
  found by tracing it once, and each step gets a key per stream (``core.model_state``). Collections
  its ``init`` returns besides ``'params'`` (e.g. BatchNorm's ``'batch_stats'``) are its mutable
  state (``Variables``), written in training; ``sow``'s ``'intermediates'`` are dropped. A module
  that asks for an rng stream in evaluation (dropout without ``deterministic=not train``) is
  refused. A module with a ``features(x)`` method exposes its penultimate activations.

  Args:
    name: the model's name.
    module: the linen module.
    input_shape: one example's shape.
    input_dtype: the inputs' dtype (e.g. ``jnp.float32``, ``jnp.int32`` for tokens).
    num_classes: output classes.
    task: what its outputs are scored by (``models.tasks``).

  Returns:
    The ``Model``.

  Raises:
    ValueError: a module that asks for an rng stream in evaluation (naming the stream), or for
      more than ``MAX_STREAMS`` streams.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> import flax.linen as nn
    >>> from fedjax_gel import models
    >>> model = models.from_linen('two_layer', nn.Sequential([nn.Dense(32), nn.relu,
    ...                                                       nn.Dense(3)]), (4,), jnp.float32, 3)
    >>> model.apply(model.init(jax.random.key(0)), jnp.ones((2, 4))).shape
    (2, 3)
  """
  dummy = np.zeros((1, *input_shape), input_dtype)   # host array: nothing to compile
  train_kw = (lambda train: {'train': train}) if takes_train(module) else (lambda train: {})

  def init_with(key, streams):
    if not streams:   # a plain key: the params of a module without streams, as ever
      return module.init(key, dummy, **train_kw(False))
    return module.init({'params': key, **stream_keys(jax.random.fold_in(key, 1), streams)},
                       dummy, **train_kw(False))

  # Traced once each (a model's build is part of a run's start-up): init, then a training step.
  init_streams, shapes = discover_streams(
      name, lambda rngs: init_with(jax.random.key(0), rngs), 'its init')
  collections = tuple(c for c in shapes if c not in NOT_STATE)
  written = [*NOT_STATE[1:], *collections]   # mutable in training

  def variables(params):
    if collections:
      return {'params': params.params, **params.state}
    return {'params': params}

  def apply(params, x):
    return module.apply(variables(params), x, **train_kw(False))

  def run_train(params, state, x, rngs, keep=None):
    vs = {'params': params, **(state or {})}
    out, new = module.apply(vs, x, rngs=rngs, mutable=written, **train_kw(True))
    return out, {c: new[c] for c in (collections if keep is None else keep)}

  def init(key):
    vs = init_with(key, init_streams)
    if collections:
      return Variables(vs['params'], {c: vs[c] for c in collections})
    return vs['params']

  abstract_state = {c: shapes[c] for c in collections}
  streams, (_, stepped) = discover_streams(
      name, lambda rngs, p, st: run_train(p, st, dummy, rngs, keep=written[2:]),
      'its training', shapes['params'], abstract_state)
  same = lambda c: (jax.tree.structure(stepped[c]) == jax.tree.structure(abstract_state[c]) and
                    jax.tree.leaves(stepped[c]) == jax.tree.leaves(abstract_state[c]))
  collections = tuple(c for c in collections if same(c))   # a growing one is sown, not state
  if streams:   # one that draws in training may draw in evaluation too: refused
    evaluation = Variables(shapes['params'], {c: shapes[c] for c in collections})
    drawn, _ = discover_streams(
        name, lambda rngs, vs: module.apply(variables(vs if collections else vs.params), dummy,
                                            rngs=rngs, **train_kw(False)),
        'its evaluation', evaluation)
    if drawn:
      raise ValueError(
          f'model {name!r} draws the rng stream {drawn[0]!r} in evaluation ('
          + ('train=False' if train_kw(False) else 'its __call__ takes no train argument')
          + '), where nothing is drawn: give its __call__ a train argument and its dropout '
          'deterministic=not train')

  train_apply = None
  if train_kw(True) or streams or collections:
    def train_apply(params, state, x, rng):
      return run_train(params, state, x, stream_keys(rng, streams) if streams else {})

  features = None
  if hasattr(module, 'features'):
    features = lambda params, x: module.apply(variables(params), x, method='features')
  return Model(name, init, apply, num_classes, features, task, train_apply, streams,
               collections)


def from_nnx(name: str, make_module: Callable, num_classes: int,
             task: Task = CLASSIFICATION) -> Model:
  """Wraps a Flax ``nnx`` module as a ``Model``.

  The module is split once into a graph definition and its state: params are its
  ``nnx.Param`` variables as a plain dict of arrays, which is all the engine vmaps over clients
  (``nnx.merge`` rebuilds the module inside ``apply``, at trace time only). Its other variables
  (``nnx.BatchStat``, ...) but rng state are its mutable state (``Variables``). The clients'
  local steps run it after ``module.train()`` with every rng stream it holds (``nnx.Dropout``'s)
  reseeded from the step's key; evaluation after ``module.eval()``.

  Args:
    name: the model's name.
    make_module: ``rngs -> module``, building the module (mapping ``[B, ...]`` to outputs)
      from an ``nnx.Rngs``.
    num_classes: output classes.
    task: what its outputs are scored by (``models.tasks``).

  Returns:
    The ``Model``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from flax import nnx
    >>> from fedjax_gel import models
    >>> model = models.from_nnx('linear', lambda rngs: nnx.Linear(4, 3, rngs=rngs), 3)
    >>> model.apply(model.init(jax.random.key(0)), jnp.ones((2, 4))).shape
    (2, 3)
  """
  from flax import nnx  # pylint: disable=g-import-not-at-top

  abstract = nnx.eval_shape(lambda: make_module(nnx.Rngs(0)))
  graphdef = nnx.split(abstract)[0]
  state_filter = nnx.All(nnx.Not(nnx.Param), nnx.Not(nnx.RngState))
  streams = tuple(sorted({node.tag for _, node in nnx.iter_graph(abstract)
                          if isinstance(node, nnx.RngStream)}))
  abstract_state = nnx.to_pure_dict(nnx.state(abstract, state_filter))
  collections = ('state',) if jax.tree.leaves(abstract_state) else ()

  def init(key):
    module = make_module(nnx.Rngs(key))
    params = nnx.to_pure_dict(nnx.state(module, nnx.Param))
    if collections:
      return Variables(params, {'state': nnx.to_pure_dict(nnx.state(module, state_filter))})
    return params

  def build(params, state):
    """The module with ``params`` and ``state``; its rng streams hold placeholder keys."""
    parts = nnx.split(abstract, nnx.Param, state_filter, ...)[1:]
    nnx.replace_by_pure_dict(parts[0], params)
    if collections:
      nnx.replace_by_pure_dict(parts[1], state['state'])
    rng_state = jax.tree.map(
        lambda a: (jax.random.key(0) if jnp.issubdtype(a.dtype, jax.dtypes.prng_key) else
                   jnp.zeros(a.shape, a.dtype)), parts[2])
    return nnx.merge(graphdef, parts[0], parts[1], rng_state)

  def apply(params, x):
    params, state = (params.params, params.state) if collections else (params, None)
    module = build(params, state)
    module.eval()
    return module(x)

  def train_apply(params, state, x, rng):
    module = build(params, state)
    module.train()
    if streams:
      nnx.reseed(module, **stream_keys(rng, streams))
    out = module(x)
    if not collections:
      return out, {}
    nnx.pop(module, nnx.Intermediate)
    return out, {'state': nnx.to_pure_dict(nnx.state(module, state_filter))}

  return Model(name, init, apply, num_classes, task=task,
               train_apply=train_apply if streams or collections else None, rngs=streams,
               collections=collections)
