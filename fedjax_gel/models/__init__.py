"""Flax models and a registry by name."""
from __future__ import annotations

from fedjax_gel.models.base import (Model, cross_entropy_loss, from_linen, from_nnx, masked_mean,
                                    max_entropy_loss, num_params, per_example_cross_entropy)
from fedjax_gel.models.cnn import (CelebACNN, TwoConvCNN, celeba_cnn, cifar_cnn, femnist_cnn,
                                   gel_femnist_cnn)
from fedjax_gel.models.layers import max_pool_2x2, patches_conv
from fedjax_gel.models.logistic import MLP, LogisticRegression, logistic, mlp
from fedjax_gel.models.rnn import StackedLSTM, sent140_lstm, shakespeare_lstm

MODELS = {'logistic': logistic, 'mlp': mlp, 'femnist_cnn': femnist_cnn,
          'gel_femnist_cnn': gel_femnist_cnn, 'celeba_cnn': celeba_cnn, 'cifar_cnn': cifar_cnn,
          'shakespeare_lstm': shakespeare_lstm, 'sent140_lstm': sent140_lstm}
# Models of token ids (int inputs), built with the vocabulary size.
TOKEN_MODELS = ('shakespeare_lstm', 'sent140_lstm')


def get_model(name: str, input_shape, num_classes: int, vocab_size: int | None = None) -> Model:
  """Builds the registered model ``name`` for inputs ``[*input_shape]`` and ``num_classes``
  (token models: ids below ``vocab_size``)."""
  if name not in MODELS:
    raise ValueError(f'unknown model {name!r}; known: {", ".join(sorted(MODELS))}')
  if name in TOKEN_MODELS:
    return MODELS[name](input_shape, num_classes, vocab_size=vocab_size)
  return MODELS[name](input_shape, num_classes)


__all__ = ['CelebACNN', 'MLP', 'MODELS', 'LogisticRegression', 'Model', 'StackedLSTM', 'TOKEN_MODELS',
           'TwoConvCNN', 'celeba_cnn', 'cifar_cnn', 'cross_entropy_loss', 'femnist_cnn',
           'from_linen', 'from_nnx', 'gel_femnist_cnn', 'get_model', 'logistic', 'masked_mean',
           'max_entropy_loss', 'max_pool_2x2', 'mlp', 'patches_conv', 'num_params', 'per_example_cross_entropy', 'sent140_lstm',
           'shakespeare_lstm']
