"""A model as pure functions: ``init(key) -> params``, ``apply(params, x) -> outputs``
(``adapters``: from your Flax module; ``losses``: its losses).

A model that draws random numbers in training (dropout) or keeps mutable collections (BatchNorm's
``batch_stats``) says so (``Model.rngs``, ``Model.collections``) and has a training apply;
``core.model_state.with_model_state`` gives its clients keys and carries its state.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax

from fedjax_gel.core.tasks import CLASSIFICATION, Task

Params = Any


class Model(NamedTuple):
  """A model given as pure functions over a params pytree.

  Attributes:
    name: registry name.
    init: ``key -> params`` (``Variables`` for a model with ``collections``).
    apply: ``(params, x) -> outputs`` for a batch ``x`` of shape ``[B, *input_shape]``, in
      evaluation mode (Flax's ``train=False``: no dropout, running statistics); for a model with
      ``collections`` ``params`` is its ``Variables``.
    num_classes: output classes.
    features: ``(params, x) -> [B, F]`` penultimate activations (FedMAX), or None.
    task: what its outputs are scored by (``models.tasks``: the loss and the evaluation
      metrics); classification by default.
    train_apply: ``(params, state, x, rng) -> (outputs, new_state)`` in training mode
      (``train=True``), drawing its streams from ``rng`` (None for a model without streams) and
      updating its ``state`` (``{}`` for a model without collections); None: ``apply`` trains.
    rngs: the rng streams ``train_apply`` draws (e.g. ``('dropout',)``).
    collections: the mutable collections of ``Variables.state`` (e.g. ``('batch_stats',)``).
  """
  name: str
  init: Callable[[jax.Array], Params]
  apply: Callable[[Params, jax.Array], jax.Array]
  num_classes: int
  features: Callable[[Params, jax.Array], jax.Array] | None = None
  task: Task = CLASSIFICATION
  train_apply: Callable | None = None
  rngs: tuple = ()
  collections: tuple = ()


def num_params(params: Params) -> int:
  """Counts the parameters of a pytree.

  Args:
    params: the params pytree.

  Returns:
    The number of scalars over all leaves.
  """
  return sum(int(x.size) for x in jax.tree_util.tree_leaves(params))
