"""Tasks: what a model's outputs are scored by, its training loss and its evaluation metrics.

Each term is a per-example function ``(outputs, y) -> (sum [B], weight [B])``: the loss or metric
summed over what the example holds and how many of those there are (1 for a classification or
regression example, its non-padding tokens for a sequence). A batch's value is
``sum_b sum_b / sum_b weight_b`` over the examples its mask keeps, so an evaluation over a whole
pool weights every token (or example) equally whatever the batches.

Built-ins:

* ``CLASSIFICATION``: softmax cross-entropy of logits ``[B, K]`` against labels ``[B]``;
  ``accuracy``.
* ``REGRESSION``: squared error of outputs ``[B, D]`` (or ``[B]``) against targets of the same
  shape, averaged over ``D``; ``mse`` (the loss itself).
* ``NEXT_TOKEN``: per-token cross-entropy of logits ``[B, L, V]`` against token ids ``[B, L]``,
  tokens equal to ``PAD`` (0) left out of both; ``accuracy`` per token.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

PAD = 0   # the padding token id of NEXT_TOKEN


class Task(NamedTuple):
  """A model's loss and metrics (see the module doc); ``metrics`` maps names to terms."""
  name: str
  loss: Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]
  metrics: dict


def _ones(x):
  return jnp.ones(x.shape[:1], jnp.float32)


def _ce(logits, y):
  return optax.softmax_cross_entropy_with_integer_labels(logits, y), _ones(y)


def _correct(logits, y):
  return (jnp.argmax(logits, -1) == y).astype(jnp.float32), _ones(y)


def _squared_error(out, y):
  err = jnp.square(out.astype(jnp.float32) - y.astype(jnp.float32)).reshape(out.shape[0], -1)
  return jnp.mean(err, axis=1), _ones(out)


def _token_ce(logits, y):
  keep = (y != PAD).astype(jnp.float32)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, y)
  return jnp.sum(keep * ce, axis=1), jnp.sum(keep, axis=1)


def _token_correct(logits, y):
  keep = y != PAD
  return (jnp.sum(keep & (jnp.argmax(logits, -1) == y), axis=1).astype(jnp.float32),
          jnp.sum(keep, axis=1).astype(jnp.float32))


CLASSIFICATION = Task('classification', _ce, {'accuracy': _correct})
REGRESSION = Task('regression', _squared_error, {'mse': _squared_error})
NEXT_TOKEN = Task('next_token', _token_ce, {'accuracy': _token_correct})


def batch_mean(term, outputs, batch: dict) -> jax.Array:
  """``sum / weight`` of ``term`` over the batch's examples (those ``batch['mask']`` keeps)."""
  total, weight = term(outputs, batch['y'])
  if 'mask' in batch:
    keep = batch['mask'].astype(jnp.float32)
    total, weight = keep * total, keep * weight
  return jnp.sum(total) / jnp.maximum(jnp.sum(weight), 1.)
