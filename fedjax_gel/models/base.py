"""A model as pure functions: ``init(key) -> params``, ``apply(params, x) -> logits``."""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_gel.models.tasks import CLASSIFICATION, Task, batch_mean

Params = Any


class Model(NamedTuple):
  """A classifier given as pure functions over a params pytree.

  Attributes:
    name: registry name.
    init: ``key -> params``.
    apply: ``(params, x) -> logits`` for a batch ``x`` of shape ``[B, *input_shape]``.
    num_classes: output classes.
    features: ``(params, x) -> [B, F]`` penultimate activations (FedMAX), or None.
    task: what its outputs are scored by (``models.tasks``: the loss and the evaluation
      metrics); classification by default.
  """
  name: str
  init: Callable[[jax.Array], Params]
  apply: Callable[[Params, jax.Array], jax.Array]
  num_classes: int
  features: Callable[[Params, jax.Array], jax.Array] | None = None
  task: Task = CLASSIFICATION


def from_linen(name: str, module, input_shape, input_dtype, num_classes: int,
               task: Task = CLASSIFICATION) -> Model:
  """Wraps a Flax linen module whose ``__call__(x)`` maps ``[B, *input_shape]`` to its outputs
  (logits for classification; ``task`` says how they are scored).

  A module with a ``features(x)`` method exposes its penultimate activations.
  """
  dummy = np.zeros((1, *input_shape), input_dtype)   # host array: nothing to compile
  features = None
  if hasattr(module, 'features'):
    features = lambda params, x: module.apply({'params': params}, x, method='features')
  return Model(name, lambda key: module.init(key, dummy)['params'],
               lambda params, x: module.apply({'params': params}, x), num_classes, features,
               task)


def from_nnx(name: str, make_module: Callable, num_classes: int) -> Model:
  """Wraps a Flax ``nnx`` module: ``make_module(rngs) -> module`` mapping ``[B, ...]`` to logits.

  The module is split once into a graph definition and its state; params are the state as a
  plain dict of arrays, which is all the engine vmaps over clients (``nnx.merge`` rebuilds the
  module inside ``apply``, at trace time only).
  """
  from flax import nnx  # pylint: disable=g-import-not-at-top

  abstract = nnx.eval_shape(lambda: make_module(nnx.Rngs(0)))
  graphdef = nnx.split(abstract)[0]

  def init(key):
    return nnx.to_pure_dict(nnx.state(make_module(nnx.Rngs(key))))

  def apply(params, x):
    state = nnx.split(abstract)[1]
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(graphdef, state)(x)

  return Model(name, init, apply, num_classes)


def masked_mean(values: jax.Array, batch: dict) -> jax.Array:
  """Mean over the batch, or over the rows ``batch['mask']`` marks when it has one."""
  if 'mask' not in batch:
    return values.mean()
  mask = batch['mask'].astype(values.dtype)
  return jnp.sum(mask * values) / jnp.maximum(jnp.sum(mask), 1.)


def task_loss(model: Model) -> Callable[[Params, dict], jax.Array]:
  """``loss(params, batch)``: the model's task loss over the batch (``tasks.batch_mean``);
  for classification ``cross_entropy_loss``."""
  return _mean_loss(model, model.task)


def cross_entropy_loss(model: Model) -> Callable[[Params, dict], jax.Array]:
  """``loss(params, batch)``: mean softmax cross-entropy of ``batch['x']`` against ``batch['y']``
  (over the rows ``batch['mask']`` marks, if present)."""
  return _mean_loss(model, CLASSIFICATION)


def _mean_loss(model: Model, task: Task) -> Callable[[Params, dict], jax.Array]:
  return lambda params, batch: batch_mean(task.loss, model.apply(params, batch['x']), batch)


def per_example_loss(model: Model) -> Callable[[Params, dict], jax.Array]:
  """``(params, examples) -> [P]`` the task loss of every example (client selection by loss):
  its ``sum / weight`` (``models.tasks``); for classification the cross-entropy, to the bit."""
  def loss(params, examples):
    total, weight = model.task.loss(model.apply(params, examples['x']), examples['y'])
    return total / jnp.maximum(weight, 1e-30)
  return loss


def max_entropy_loss(model: Model, beta: float) -> Callable[[Params, dict], jax.Array]:
  """FedMAX (Chen et al. 2020): the task loss (cross-entropy for classification) +
  ``beta * KL(U || softmax(a))`` over the penultimate activations ``a`` (``model.features``),
  pushing them towards maximum entropy.

  ``KL(U || p) = -log F - (1/F) sum_f log p_f`` for ``F`` activations.
  """
  if model.features is None:
    raise ValueError(f'model {model.name!r} exposes no penultimate activations for FedMAX')
  ce = task_loss(model)

  def loss(params, batch):
    logp = jax.nn.log_softmax(model.features(params, batch['x']), axis=-1)
    kl = -jnp.log(logp.shape[-1]) - jnp.mean(logp, axis=-1)
    return ce(params, batch) + beta * masked_mean(kl, batch)
  return loss


def num_params(params: Params) -> int:
  return sum(int(x.size) for x in jax.tree_util.tree_leaves(params))
