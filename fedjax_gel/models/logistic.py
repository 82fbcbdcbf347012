"""Multinomial logistic regression (the LEAF Synthetic model: 60 -> 5, 305 parameters)."""
from __future__ import annotations


import flax.linen as nn
import jax.numpy as jnp

from fedjax_gel.models.base import Model, from_linen


class LogisticRegression(nn.Module):
  """``logits = x W + b`` on flattened inputs; Flax default init (LeCun normal W, zero b)."""
  num_classes: int

  @nn.compact
  def __call__(self, x):
    return nn.Dense(self.num_classes)(x.reshape((x.shape[0], -1)))


def logistic(input_shape, num_classes: int) -> Model:
  return from_linen('logistic', LogisticRegression(num_classes), tuple(input_shape), jnp.float32,
                    num_classes)


