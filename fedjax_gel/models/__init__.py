"""Flax models and a registry of them by spec (``registry``; ``register_model`` adds your own).

A ``Model`` is pure functions (``init``, ``apply``) with the ``Task`` that scores its outputs;
``get_model`` builds a registered one by name, ``from_linen`` and ``from_nnx`` wrap your own
Flax module, and ``task_loss`` (``cross_entropy_loss`` for classifiers) gives the algorithms
their ``loss_fn``.
"""
from __future__ import annotations

import functools

from fedjax_gel.core.checks import is_whole, positive_int
from fedjax_gel.core import tasks
from fedjax_gel.core.model_state import Variables
from fedjax_gel.models.adapters import from_linen, from_nnx
from fedjax_gel.models.base import Model, num_params
from fedjax_gel.models.losses import (cross_entropy_loss, masked_mean, max_entropy_loss,
                                      per_example_loss, task_loss)
from fedjax_gel.core.tasks import CLASSIFICATION, NEXT_TOKEN, REGRESSION, Task
from fedjax_gel.models.cnn import (CelebACNN, TwoConvCNN, celeba_cnn, cifar_cnn, femnist_cnn,
                                   gel_femnist_cnn)
from fedjax_gel.models.layers import max_pool_2x2, patches_conv
from fedjax_gel.models.logistic import MLP, LogisticRegression, logistic, mlp
from fedjax_gel.models import registry
from fedjax_gel.models.registry import register_model, unregister_model
from fedjax_gel.models.rnn import StackedLSTM, sent140_lstm, shakespeare_lstm
from fedjax_gel.spec.model import ModelSpec

MODELS = registry.Builders()
"""``{name: build}`` of the registered models, read-only (``register_model`` adds one)."""
BUILTIN_MODELS = tuple(s.name for s in registry.BUILTIN)
"""The built-in models' names (all scored by accuracy)."""


@functools.lru_cache(maxsize=64)
def _built_in(name: str, input_shape: tuple, num_classes: int, options: tuple) -> Model:
  """A built-in model, built once per shape, classes and options: building traces it
  (``from_linen``), and a ``Model`` is immutable pure functions, safe to share (a built-in
  name is never registered again: ``register_model``)."""
  return registry.get(name).build(input_shape, num_classes, **dict(options))


class OptionError(ValueError):
  """Raised by ``get_model`` for an option the model does not take (a ``ValueError``)."""


def get_model(name: str, input_shape, num_classes: int, vocab_size: int | None = None,
              **options) -> Model:
  """Builds the registered model ``name`` for inputs ``[*input_shape]`` and ``num_classes``.

  A built-in model is built once per shape, classes and options, and shared.

  Args:
    name: the model's name (``BUILTIN_MODELS``, or one ``register_model`` added).
    input_shape: one example's shape, a tuple of positive integers.
    num_classes: output classes, a positive integer.
    vocab_size: token models: token ids lie below it.
    **options: the model's own keyword arguments (``dropout=``, ``batch_norm=``, ...).

  Returns:
    The ``Model``.

  Raises:
    ValueError: an unknown name, or a shape or ``num_classes`` that is not positive.
    OptionError: an option set (not 0 or False) for a model whose builder does not take it, so
      that ``--dropout=0.5`` is never silently ignored.
    TypeError: a registered builder that returns something other than a ``Model``.

  Examples:
    >>> import jax
    >>> import fedjax_gel as fg
    >>> model = fg.get_model('mlp', (60,), 5, dropout=0.5)
    >>> model.rngs
    ('dropout',)
  """
  if name not in registry.names():
    raise ValueError(f'unknown model {name!r}; known: {", ".join(sorted(registry.names()))}')
  spec = registry.get(name)
  num_classes = positive_int('get_model', 'num_classes', num_classes)
  if not (isinstance(input_shape, (tuple, list)) and
          all(is_whole(v) and int(v) >= 1 for v in input_shape)):
    raise ValueError(f'get_model: input_shape must be a tuple of positive integers, got '
                     f'{input_shape!r}')
  input_shape = tuple(int(v) for v in input_shape)
  own, forwards = spec.takes()   # ``forwards``: the builder takes ``**options``
  given = {k: v for k, v in options.items() if v}
  for option in given:
    if option not in own and not forwards:
      raise OptionError(f'--{option}: model {name!r} has no such option (its own: '
                       f'{", ".join(own) or "none"})')
  if spec.tokens:
    given['vocab_size'] = vocab_size
  if name in BUILTIN_MODELS:
    model = _built_in(name, input_shape, num_classes, tuple(sorted(given.items())))
  else:
    model = spec.build(input_shape, num_classes, **given)
  if not isinstance(model, Model):
    raise TypeError(f'get_model: {name!r} was built as a {type(model).__name__}, not a '
                    'fedjax_gel Model (models.from_linen or from_nnx wraps a Flax module)')
  return model


__all__ = [
    'BUILTIN_MODELS', 'CLASSIFICATION', 'CelebACNN', 'LogisticRegression', 'MLP', 'MODELS',
    'Model', 'ModelSpec', 'NEXT_TOKEN', 'OptionError', 'REGRESSION', 'StackedLSTM', 'Task',
    'TwoConvCNN', 'Variables', 'celeba_cnn', 'cifar_cnn', 'cross_entropy_loss', 'femnist_cnn',
    'from_linen', 'from_nnx', 'gel_femnist_cnn', 'get_model', 'logistic', 'masked_mean',
    'max_entropy_loss', 'max_pool_2x2', 'mlp', 'num_params', 'patches_conv', 'per_example_loss',
    'register_model', 'registry', 'sent140_lstm', 'shakespeare_lstm', 'task_loss', 'tasks',
    'unregister_model',
]
