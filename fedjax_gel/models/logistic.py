"""Multinomial logistic regression (the LEAF Synthetic model: 60 -> 5, 305 parameters)."""
from __future__ import annotations


import flax.linen as nn
import jax.numpy as jnp

from fedjax_gel.models.adapters import from_linen
from fedjax_gel.models.base import Model
from fedjax_gel.models.layers import dropped
from fedjax_gel.spec.model import ModelSpec


class LogisticRegression(nn.Module):
  """Multinomial logistic regression: ``logits = x W + b`` on flattened inputs (linen).

  Flax's default initialisation (LeCun normal ``W``, zero ``b``).

  Attributes:
    num_classes: output classes.
  """
  num_classes: int

  @nn.compact
  def __call__(self, x):
    return nn.Dense(self.num_classes)(self.features(x))

  def features(self, x):
    """Penultimate activations: with no hidden layer, the flattened input itself."""
    return x.reshape((x.shape[0], -1))


def logistic(input_shape, num_classes: int) -> Model:
  """Builds multinomial logistic regression, the LEAF Synthetic model (60 -> 5, 305 parameters).

  Args:
    input_shape: one example's shape (flattened).
    num_classes: output classes.

  Returns:
    The ``Model`` ``'logistic'``; its ``features`` are the flattened inputs (no hidden layer).

  Examples:
    >>> import jax
    >>> from fedjax_gel import models
    >>> models.num_params(models.logistic((60,), 5).init(jax.random.key(0)))
    305
  """
  return from_linen('logistic', LogisticRegression(num_classes), tuple(input_shape), jnp.float32,
                    num_classes)




class MLP(nn.Module):
  """One ReLU hidden layer of ``hidden`` units, then a linear classifier (linen).

  Attributes:
    num_classes: output classes.
    hidden: the hidden layer's units.
    dropout: the rate of dropout on the hidden layer's activations in training; 0: none.
  """
  num_classes: int
  hidden: int = 64
  dropout: float = 0.

  def setup(self):
    self.hidden_layer = nn.Dense(self.hidden)
    self.out = nn.Dense(self.num_classes)
    if self.dropout:
      self.drop = nn.Dropout(self.dropout)

  def features(self, x):
    return nn.relu(self.hidden_layer(x.reshape((x.shape[0], -1))))

  def __call__(self, x, train: bool = False):
    return self.out(dropped(self, self.features(x), train))


def mlp(input_shape, num_classes: int, dropout: float = 0.) -> Model:
  """Builds an ``MLP`` of 64 hidden units (4,229 parameters on LEAF Synthetic).

  Args:
    input_shape: one example's shape (flattened).
    num_classes: output classes.
    dropout: the rate of dropout on its hidden layer's activations in training; 0 (default):
      none.

  Returns:
    The ``Model`` ``'mlp'``; its ``features`` are the hidden activations.
  """
  return from_linen('mlp', MLP(num_classes, dropout=dropout), tuple(input_shape), jnp.float32,
                    num_classes)


LOGISTIC = ModelSpec('logistic', logistic, options=(), architecture='`x W + b`',
                     parameters='305 on LEAF Synthetic')
MLP_SPEC = ModelSpec('mlp', mlp, options=('dropout',), architecture='one ReLU layer of 64',
                     parameters='4,229 on LEAF Synthetic')
