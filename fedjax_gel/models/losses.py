"""A ``Model``'s losses, for the algorithms' ``loss_fn``: its task's loss (``task_loss``; a
classifier's ``cross_entropy_loss``) over a minibatch, in training mode with the key and state
the engine put in the batch (``training_outputs``), each example's (``per_example_loss``) and
FedMAX's (``max_entropy_loss``).
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from fedjax_gel.core.model_state import BATCH_ENTRY
from fedjax_gel.core.tasks import CLASSIFICATION, Task, batch_mean
from fedjax_gel.models.base import Model, Params


def training_outputs(model: Model, params, batch):
  """The model's outputs on ``batch['x']`` in training mode, and its new state (None when it has
  none to return): with the step's key and state the engine put in the batch (``batch['model']``,
  ``core.model_state``); a model without streams or collections by itself. A model that needs a
  key or state the batch does not carry is a ValueError (one line)."""
  inputs = batch.get(BATCH_ENTRY)
  if inputs is None:
    if model.rngs or model.collections:
      needs = ', '.join([f'the rng stream {s!r}' for s in model.rngs] +
                        [f'the mutable collection {c!r}' for c in model.collections])
      raise ValueError(f'model {model.name!r} trains with {needs}, which this minibatch does '
                       'not carry: wrap the algorithm with fedjax_gel.core.model_state.'
                       'with_model_state(algorithm, model, policy)')
    if model.train_apply is None:
      return model.apply(params, batch['x']), None
    return model.train_apply(params, {}, batch['x'], None)[0], None
  outputs, state = model.train_apply(params, inputs.state or {}, batch['x'], inputs.rng)
  return outputs, (state if model.collections else None)


def masked_mean(values: jax.Array, batch: dict) -> jax.Array:
  """Mean over the batch, or over the rows ``batch['mask']`` marks when it has one.

  Args:
    values: ``[B]`` per-example values.
    batch: the minibatch (its ``'mask'``, if any, ``[B]``).

  Returns:
    The scalar mean.
  """
  if 'mask' not in batch:
    return values.mean()
  mask = batch['mask'].astype(values.dtype)
  return jnp.sum(mask * values) / jnp.maximum(jnp.sum(mask), 1.)


def task_loss(model: Model) -> Callable[[Params, dict], jax.Array]:
  """The model's task loss as ``loss(params, batch)``, for the algorithms' ``loss_fn``.

  The task's ``sum / weight`` over the batch (``tasks.batch_mean``, over the rows
  ``batch['mask']`` marks); for classification ``cross_entropy_loss``. A model with rng
  streams or mutable state trains with what the engine puts in the batch
  (``core.model_state``).

  Args:
    model: the ``Model``.

  Returns:
    ``loss(params, batch) -> scalar`` (with the new state, for a model with state).
  """
  return _mean_loss(model, model.task)


def cross_entropy_loss(model: Model) -> Callable[[Params, dict], jax.Array]:
  """The mean softmax cross-entropy loss of a classifier, ``loss(params, batch)``.

  The cross-entropy of the model's outputs on ``batch['x']`` against the labels ``batch['y']``,
  over the rows ``batch['mask']`` marks, if present.

  Args:
    model: the ``Model`` (trained in training mode: ``train=True``).

  Returns:
    ``loss(params, batch) -> scalar``, for the algorithms' ``loss_fn``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> import fedjax_gel as fg
    >>> model = fg.get_model('logistic', (60,), 5)
    >>> loss = fg.cross_entropy_loss(model)
    >>> batch = {'x': jnp.zeros((4, 60)), 'y': jnp.array([0, 1, 2, 3])}
    >>> round(float(loss(model.init(jax.random.key(0)), batch)), 4)   # ln 5 at zero inputs
    1.6094
  """
  return _mean_loss(model, CLASSIFICATION)


def _mean_loss(model: Model, task: Task) -> Callable[[Params, dict], jax.Array]:
  def loss(params, batch):
    outputs, state = training_outputs(model, params, batch)
    value = batch_mean(task.loss, outputs, batch)
    return value if state is None else (value, state)
  return loss


def per_example_loss(model: Model) -> Callable[[Params, dict], jax.Array]:
  """The task loss of every example, for client selection by loss.

  Args:
    model: the ``Model``.

  Returns:
    ``(params, examples) -> [P]``, each example's ``sum / weight`` (``models.tasks``); for
    classification the cross-entropy, to the bit.
  """
  def loss(params, examples):
    total, weight = model.task.loss(model.apply(params, examples['x']), examples['y'])
    return total / jnp.maximum(weight, 1e-30)
  return loss


def max_entropy_loss(model: Model, beta: float) -> Callable[[Params, dict], jax.Array]:
  """FedMAX's client loss: the task loss plus a maximum-entropy term (Chen et al. 2020, FedMAX).

  The task loss (cross-entropy for classification) ``+ beta * KL(U || softmax(a))`` over the
  penultimate activations ``a`` (``model.features``), pushing them towards maximum entropy;
  ``KL(U || p) = -log F - (1/F) sum_f log p_f`` for ``F`` activations.

  Args:
    model: the ``Model``, with ``features`` and without rng streams or mutable state.
    beta: the entropy term's weight.

  Returns:
    ``loss(params, batch) -> scalar``.

  Raises:
    ValueError: a model without penultimate activations, or with rng streams or mutable state.
  """
  if model.features is None:
    raise ValueError(f'model {model.name!r} exposes no penultimate activations for FedMAX')
  if model.rngs or model.collections:
    raise ValueError(f'model {model.name!r} trains with rng streams or mutable state, which '
                     "FedMAX's activations do not carry; choose a model without (--dropout=0)")
  ce = task_loss(model)

  def loss(params, batch):
    logp = jax.nn.log_softmax(model.features(params, batch['x']), axis=-1)
    kl = -jnp.log(logp.shape[-1]) - jnp.mean(logp, axis=-1)
    return ce(params, batch) + beta * masked_mean(kl, batch)
  return loss
