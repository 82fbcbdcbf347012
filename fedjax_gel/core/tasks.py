"""Tasks: what a model's outputs are scored by, its training loss and its evaluation metrics.

Each term is a per-example function ``(outputs, y) -> (sum [B], weight [B])``: the loss or metric
summed over what the example holds and how many of those there are (1 for a classification or
regression example, its non-padding tokens for a sequence). A batch's value is
``sum_b sum_b / sum_b weight_b`` over the examples its mask keeps, so an evaluation over a whole
pool weights every token (or example) equally whatever the batches.

A task names one of its metrics as its *main* one, with its direction (``Task.metric``, a
``Metric``): what an experiment tracks, reports the best value of, and counts the rounds to a
target of (``--target``).

Built-ins:

* ``CLASSIFICATION``: softmax cross-entropy of logits ``[B, K]`` against labels ``[B]``;
  ``accuracy`` (main, higher is better).
* ``REGRESSION``: squared error of outputs ``[B, D]`` (or ``[B]``) against targets of the same
  shape, averaged over ``D``; ``mse`` (the loss itself; main, lower is better).
* ``NEXT_TOKEN``: per-token cross-entropy of logits ``[B, L, V]`` against token ids ``[B, L]``,
  tokens equal to ``PAD`` (0) left out of both; ``accuracy`` per token (main).
"""
from __future__ import annotations

from typing import Callable, Iterable, NamedTuple

import jax
import jax.numpy as jnp
import optax

PAD = 0   # the padding token id of NEXT_TOKEN


class Metric(NamedTuple):
  """The metric an experiment tracks, by name, and its direction. Records carry
  ``test_<name>`` and ``best_test_<name>``, summaries ``final_<name>``, ``best_<name>`` and
  ``target_<name>``."""
  name: str = 'accuracy'
  higher_is_better: bool = True

  @classmethod
  def of(cls, summary: dict) -> 'Metric':
    """The metric of a run's ``summary.json`` (accuracy for one written before there was a
    choice)."""
    return cls(**summary.get('metric', {}))

  def key(self, value: float) -> float:
    """A sort key: larger is better."""
    return value if self.higher_is_better else -value

  def best(self, values: Iterable[float]):
    """The best of ``values`` (the first of equals; None for none)."""
    return max(values, key=self.key, default=None)

  def better(self, a: float, b: float) -> bool:
    """Whether ``a`` is strictly better than ``b``."""
    return self.key(a) > self.key(b)

  def reaches(self, value: float, target: float) -> bool:
    return value >= target if self.higher_is_better else value <= target

  @property
  def label(self) -> str:
    """How reports name it: ``test accuracy``, ``test mse``."""
    return f'test {self.name}'

  @property
  def unit(self) -> str:
    """`` (%)`` for accuracy (``short`` prints it in percent), else ``''``."""
    return ' (%)' if self.name == 'accuracy' else ''

  def short(self, value: float) -> str:
    """A value for a table or heat-map cell: accuracy in percent to 0.1, else 3 significant
    digits."""
    return f'{100 * value:.1f}' if self.name == 'accuracy' else f'{value:.3g}'

  def format(self, value) -> str:
    """A value as reports print it: accuracies as percentages (``85%``, ``81.5%``), others
    with 4 significant digits; ``-`` for None."""
    if value is None:
      return '-'
    if self.name == 'accuracy':
      return f'{100 * value:.4g}%'
    return f'{value:.4g}'


class Task(NamedTuple):
  """A model's loss and metrics: what its outputs are scored by (see the module docstring).

  Each term is a per-example function ``(outputs, y) -> (sum [B], weight [B])``.

  Attributes:
    name: the task's name.
    loss: the training loss's term.
    metrics: ``{name: term}``, the evaluation's metrics.
    main: the metric experiments track (report the best value of, count the rounds to
      ``--target`` of).
    higher_is_better: ``main``'s direction.

  Examples:
    >>> import jax.numpy as jnp
    >>> from fedjax_gel import models
    >>> total, weight = models.CLASSIFICATION.loss(jnp.zeros((2, 5)), jnp.array([0, 3]))
    >>> total.shape, weight.tolist()
    ((2,), [1.0, 1.0])
  """
  name: str
  loss: Callable[[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]
  metrics: dict
  main: str = 'accuracy'
  higher_is_better: bool = True

  @property
  def metric(self) -> Metric:
    return Metric(self.main, self.higher_is_better)


def _ones(x):
  return jnp.ones(x.shape[:1], jnp.float32)


def check_labels(task: str, logits, y):
  """A ValueError of one line unless the integer labels ``y`` have the logits' shape less
  their last axis (``[B]`` for ``[B, K]``, ``[B, L]`` for ``[B, L, V]``): labels of shape
  ``[B, 1]``, for instance, would otherwise fail deep inside the loss."""
  if y.shape != logits.shape[:-1] or not jnp.issubdtype(y.dtype, jnp.integer):
    raise ValueError(f'{task} task: labels must be integers of shape {logits.shape[:-1]} for '
                     f'outputs of shape {logits.shape}, got {y.dtype} {y.shape}'
                     + (' (flatten them: y.reshape(-1))' if y.shape[-1:] == (1,) else ''))


def _ce(logits, y):
  check_labels('classification', logits, y)
  return optax.softmax_cross_entropy_with_integer_labels(logits, y), _ones(y)


def _correct(logits, y):
  check_labels('classification', logits, y)
  return (jnp.argmax(logits, -1) == y).astype(jnp.float32), _ones(y)


def _squared_error(out, y):
  """Per example, the mean over its values; ``out`` and ``y`` hold as many values per example
  (``[B, 1]`` against ``[B]`` is fine; broadcasting them would square every pair)."""
  if out.shape[:1] != y.shape[:1] or out.size != y.size:
    raise ValueError(f'regression task: targets must hold one value per output, got outputs '
                     f'{out.shape} and targets {y.shape}')
  err = jnp.square(out.astype(jnp.float32).reshape(out.shape[0], -1) -
                   y.astype(jnp.float32).reshape(out.shape[0], -1))
  return jnp.mean(err, axis=1), _ones(out)


def _token_ce(logits, y):
  check_labels('next_token', logits, y)
  keep = (y != PAD).astype(jnp.float32)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, y)
  return jnp.sum(keep * ce, axis=1), jnp.sum(keep, axis=1)


def _token_correct(logits, y):
  check_labels('next_token', logits, y)
  keep = y != PAD
  return (jnp.sum(keep & (jnp.argmax(logits, -1) == y), axis=1).astype(jnp.float32),
          jnp.sum(keep, axis=1).astype(jnp.float32))


CLASSIFICATION = Task('classification', _ce, {'accuracy': _correct})
"""Softmax cross-entropy of logits ``[B, K]`` against labels ``[B]``; ``accuracy`` (main)."""
REGRESSION = Task('regression', _squared_error, {'mse': _squared_error}, 'mse', False)
"""Squared error of outputs ``[B, D]`` (or ``[B]``) against targets of the same shape.

Averaged over ``D``; ``mse``, the loss itself, is the main metric (lower is better).
"""
NEXT_TOKEN = Task('next_token', _token_ce, {'accuracy': _token_correct})
"""Per-token cross-entropy of logits ``[B, L, V]`` against token ids ``[B, L]``.

Tokens equal to ``PAD`` (0) are left out of both; ``accuracy`` per token is the main metric.
"""


def batch_mean(term, outputs, batch: dict) -> jax.Array:
  """``sum / weight`` of ``term`` over the batch's examples (those ``batch['mask']`` keeps)."""
  total, weight = term(outputs, batch['y'])
  if 'mask' in batch:
    keep = batch['mask'].astype(jnp.float32)
    total, weight = keep * total, keep * weight
  return jnp.sum(total) / jnp.maximum(jnp.sum(weight), 1.)
