"""Flax models and a registry by name."""
from __future__ import annotations

from fedjax_gel.models.base import (Model, cross_entropy_loss, from_linen, from_nnx, masked_mean,
                                    max_entropy_loss, num_params, per_example_cross_entropy)
from fedjax_gel.models.logistic import MLP, LogisticRegression, logistic, mlp

MODELS = {'logistic': logistic, 'mlp': mlp}


def get_model(name: str, input_shape, num_classes: int) -> Model:
  """Builds the registered model ``name`` for inputs ``[*input_shape]`` and ``num_classes``."""
  if name not in MODELS:
    raise ValueError(f'unknown model {name!r}; known: {", ".join(sorted(MODELS))}')
  return MODELS[name](input_shape, num_classes)


__all__ = ['MLP', 'MODELS', 'LogisticRegression', 'Model', 'masked_mean', 'max_entropy_loss', 'mlp', 'per_example_cross_entropy', 'cross_entropy_loss', 'from_linen', 'from_nnx',
           'get_model', 'logistic', 'num_params']
