"""LEAF's stacked-LSTM classifiers of token sequences (Shakespeare, Sent140).

Both read int32 token ids ``[B, L]`` and classify from the top LSTM's output at the LAST
position (LEAF: one label per sequence). The LSTMs start from a zero carry and hold no state
beyond ``'params'``, so ``apply`` is pure and vmaps over clients. Token ids must lie in
``[0, vocab_size)``. ``dropout`` (off by default, as in LEAF's models; ``--dropout``) drops
each LSTM's outputs in training: between the layers and before the classifier.
"""
from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp

from fedjax_gel.models import layers
from fedjax_gel.models.base import Model, from_linen
from fedjax_gel.spec.model import ModelSpec

GATES = ('i', 'f', 'g', 'o')


def lstm_kernels(cell) -> tuple:
  """``(wi, wh, b)`` of ``layers.lstm`` from an ``OptimizedLSTMCell``'s parameters ``cell``
  (input kernels ``ii, if, ig, io``; recurrent kernels and biases ``hi, hf, hg, ho``)."""
  return (jnp.concatenate([cell['i' + g]['kernel'] for g in GATES], axis=1),
          jnp.concatenate([cell['h' + g]['kernel'] for g in GATES], axis=1),
          jnp.concatenate([cell['h' + g]['bias'] for g in GATES]))


class StackedLSTM(nn.Module):
  """Embedding ``vocab_size x embed_dim``, ``layers`` LSTMs of ``hidden`` units (flax
  ``OptimizedLSTMCell``: input kernels without bias, recurrent kernels with one bias), the top
  output at the last position, an optional linear dense ``dense`` (no activation, as LEAF's
  Sent140 ``fc1``; 0: none), then dense ``num_classes``. ``features``: the classifier's input.

  The parameters are Flax's ``nn.RNN(nn.OptimizedLSTMCell)``'s, initialised by it; with
  ``fused`` (the default) ``apply`` runs them through ``layers.lstm``, the same function with a
  faster gradient (``fused=False``: Flax's cell, which the tests compare it with).
  """
  num_classes: int
  vocab_size: int
  embed_dim: int = 8
  hidden: int = 256
  layers: int = 2
  dense: int = 0
  fused: bool = True
  dropout: float = 0.

  def setup(self):
    self.embed = nn.Embed(self.vocab_size, self.embed_dim)
    self.lstms = [nn.RNN(nn.OptimizedLSTMCell(self.hidden)) for _ in range(self.layers)]
    if self.dense:
      self.fc = nn.Dense(self.dense)
    self.out = nn.Dense(self.num_classes)
    if self.dropout:
      self.drop = nn.Dropout(self.dropout)

  def features(self, tokens, train: bool = False):
    h = self.embed(tokens)
    for i, lstm in enumerate(self.lstms):
      if self.fused and not self.is_initializing():
        h = layers.lstm(h, *lstm_kernels(lstm.variables['params']['cell']))
      else:
        h = lstm(h)
      if self.dropout and i < len(self.lstms) - 1:
        h = self.drop(h, deterministic=not train)
    h = h[:, -1]   # the top layer's outputs are read at the last position only
    if self.dropout:
      h = self.drop(h, deterministic=not train)
    return self.fc(h) if self.dense else h

  def __call__(self, tokens, train: bool = False):
    return self.out(self.features(tokens, train))


def shakespeare_lstm(input_shape, num_classes: int, vocab_size: int | None = None,
                     fused: bool = True, dropout: float = 0.) -> Model:
  """LEAF's Shakespeare next-character model (Caldas et al. 2018; also GeL's, Boukhari et al. 2023):
  embedding 8, two stacked LSTMs of 256 units, dense ``num_classes`` on the last position.

  ``input_shape = (L,)`` (80 in LEAF); ``vocab_size`` defaults to ``num_classes`` (the same
  characters in and out). With LEAF's 80 characters: 817,872 parameters, GeL's 8.2e5.
  ``fused``: ``StackedLSTM.fused``.
  """
  vocab = num_classes if vocab_size is None else vocab_size
  module = StackedLSTM(num_classes, vocab, embed_dim=8, hidden=256, fused=fused, dropout=dropout)
  return from_linen('shakespeare_lstm', module, tuple(input_shape), jnp.int32, num_classes)


def sent140_lstm(input_shape, num_classes: int, vocab_size: int | None = None,
                 dropout: float = 0.) -> Model:
  """LEAF's Sent140 stacked LSTM (Caldas et al. 2018, ``models/sent140/stacked_lstm.py``):
  learned embedding 100, two LSTMs of 100 units, linear dense 128, dense ``num_classes``, read
  at the last of ``input_shape = (L,)`` positions (25 in LEAF, padding included).

  As in LEAF's current code, the embedding is learned with the LSTM width (100); its earlier
  version used frozen 300-d GloVe vectors. ``vocab_size`` counts every id, padding and unknown
  included (LEAF: its word list plus one); default 10,000. 2 classes, vocab 10,000: 1,173,986
  parameters (1,000,000 in the embedding).
  """
  vocab = 10_000 if vocab_size is None else vocab_size
  module = StackedLSTM(num_classes, vocab, embed_dim=100, hidden=100, dense=128, dropout=dropout)
  return from_linen('sent140_lstm', module, tuple(input_shape), jnp.int32, num_classes)


SHAKESPEARE_LSTM = ModelSpec(
    'shakespeare_lstm', shakespeare_lstm, tokens=True, options=('dropout',),
    parameters='817,872 (80 characters)',
    architecture='embedding 8, two LSTM layers of 256, dense from the last position')
SENT140_LSTM = ModelSpec(
    'sent140_lstm', sent140_lstm, tokens=True, options=('dropout',),
    parameters='1,173,986 (10,000 words)',
    architecture="embedding 100, two LSTM layers of 100, dense 128, dense 2 (LEAF's, with a "
    'learned embedding instead of GloVe)')
