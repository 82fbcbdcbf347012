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
from fedjax_gel.models.adapters import from_linen
from fedjax_gel.models.base import Model
from fedjax_gel.spec.model import ModelSpec

GATES = ('i', 'f', 'g', 'o')


def lstm_kernels(cell) -> tuple:
  """``(wi, wh, b)`` of ``layers.lstm`` from an ``OptimizedLSTMCell``'s parameters ``cell``
  (input kernels ``ii, if, ig, io``; recurrent kernels and biases ``hi, hf, hg, ho``)."""
  return (jnp.concatenate([cell['i' + g]['kernel'] for g in GATES], axis=1),
          jnp.concatenate([cell['h' + g]['kernel'] for g in GATES], axis=1),
          jnp.concatenate([cell['h' + g]['bias'] for g in GATES]))


class StackedLSTM(nn.Module):
  """A stacked-LSTM classifier of token sequences, read at the last position (linen).

  Embedding ``vocab_size x embed_dim``, ``layers`` LSTMs of ``hidden`` units (flax
  ``OptimizedLSTMCell``: input kernels without bias, recurrent kernels with one bias), the top
  output at the last position, an optional linear dense ``dense``, then dense
  ``num_classes``. ``features``: the classifier's input. The parameters are Flax's
  ``nn.RNN(nn.OptimizedLSTMCell)``'s, initialised by it.

  Attributes:
    num_classes: output classes.
    vocab_size: token ids lie in ``[0, vocab_size)``.
    embed_dim: the embedding's width.
    hidden: each LSTM's units.
    layers: the stacked LSTMs.
    dense: a linear dense layer's units before the classifier (no activation, as LEAF's
      Sent140 ``fc1``); 0: none.
    fused: ``apply`` runs the LSTMs through ``layers.lstm``, the same function with a faster
      gradient; False: Flax's cell (which the tests compare it with).
    dropout: the rate of dropout on each LSTM's outputs in training (between the layers and
      before the classifier); 0: none.
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
  """Builds LEAF's Shakespeare next-character model (Caldas et al. 2018; also GeL's).

  LEAF: A Benchmark for Federated Settings; GeL's (Boukhari et al. 2023) too: embedding 8, two
  stacked LSTMs of 256 units, dense ``num_classes`` on the last position. With LEAF's 80
  characters: 817,872 parameters, GeL's 8.2e5.

  Args:
    input_shape: ``(L,)``, the sequence length (80 in LEAF).
    num_classes: output classes (characters).
    vocab_size: the input tokens; None: ``num_classes`` (the same characters in and out).
    fused: ``StackedLSTM.fused``.
    dropout: the rate of dropout on each LSTM's outputs in training; 0 (default): none.

  Returns:
    The ``Model`` ``'shakespeare_lstm'``, on int32 token ids.
  """
  vocab = num_classes if vocab_size is None else vocab_size
  module = StackedLSTM(num_classes, vocab, embed_dim=8, hidden=256, fused=fused, dropout=dropout)
  return from_linen('shakespeare_lstm', module, tuple(input_shape), jnp.int32, num_classes)


def sent140_lstm(input_shape, num_classes: int, vocab_size: int | None = None,
                 dropout: float = 0.) -> Model:
  """Builds LEAF's Sent140 stacked LSTM (Caldas et al. 2018, LEAF).

  LEAF: A Benchmark for Federated Settings, ``models/sent140/stacked_lstm.py``: learned embedding
  100, two LSTMs of 100 units, linear dense 128, dense ``num_classes``, read at the last position.
  As in LEAF's current code, the embedding is learned with the LSTM width (100); its earlier version
  used frozen 300-d GloVe vectors. ``vocab_size`` counts every id, padding and unknown included
  (LEAF: its word list plus one); default 10,000. 2 classes, vocab 10,000: 1,173,986 parameters
  (1,000,000 in the embedding).

  Args:
    input_shape: ``(L,)``, the sequence length (25 in LEAF, padding included).
    num_classes: output classes.
    vocab_size: every token id, padding and unknown included; None: 10,000.
    dropout: the rate of dropout on each LSTM's outputs in training; 0 (default): none.

  Returns:
    The ``Model`` ``'sent140_lstm'``, on int32 token ids.
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
