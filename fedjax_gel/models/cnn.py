"""Image CNNs of LEAF (FEMNIST, CelebA), GeL (FEMNIST) and FedGBO (CIFAR100).

Off by default, as the papers' configurations have none, each has ``dropout`` (a rate: dropout
on the classifier's input in training, ``--dropout``), and the CelebA CNN LEAF's BatchNorm
(``--batch_norm``, whose running statistics the server treats by ``--model_state``); without
them a model keeps nothing beyond ``'params'`` and is the same function as before they existed.

Inputs are float images ``[B, H, W, C]``; ``[B, H, W]`` is read as one channel and ``[B, H*W]``
as a flattened square one-channel image (LEAF stores FEMNIST as 784 floats per example).
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax.numpy as jnp
from jax import lax

from fedjax_gel.models.adapters import from_linen
from fedjax_gel.models.base import Model
from fedjax_gel.models.layers import conv_general_dilated, dropped, max_pool_2x2
from fedjax_gel.spec.model import ModelSpec


def as_nhwc(x):
  """``x`` as ``[B, H, W, C]``: adds the channel axis to ``[B, H, W]`` and unflattens a square
  one-channel ``[B, H*W]``."""
  if x.ndim == 4:
    return x
  if x.ndim == 3:
    return x[..., None]
  if x.ndim == 2 and math.isqrt(x.shape[1]) ** 2 == x.shape[1]:
    side = math.isqrt(x.shape[1])
    return x.reshape((x.shape[0], side, side, 1))
  raise ValueError(f'expected images [B, H, W, C], [B, H, W] or [B, side*side]; got {x.shape}')


def _xla_pool(x, padding: str = 'VALID'):
  return nn.max_pool(x, (2, 2), strides=(2, 2), padding=padding)


class TwoConvCNN(nn.Module):
  """A CNN of two convolutions, a hidden dense layer and a classifier (linen).

  conv ``k x k`` (``channels[0]``) + ReLU, maxpool 2x2/2, conv ``k x k`` (``channels[1]``) +
  ReLU, maxpool 2x2/2, dense ``hidden`` + ReLU, dense ``num_classes``; the pools are unpadded.
  ``features`` are the ``hidden`` ReLU activations.

  Attributes:
    num_classes: output classes.
    kernel: ``k``, the convolutions' size.
    padding: the convolutions' padding (``'SAME'`` as in TF/LEAF, ``'VALID'`` as PyTorch's
      default).
    hidden: the hidden dense layer's units.
    channels: the two convolutions' output channels.
    xla_layers: run the convolutions and pools as XLA's own ``conv_general_dilated`` and
      ``nn.max_pool`` on every backend (the same function; slower when vmapped on CPU, see
      ``models.layers``), for comparison.
    dropout: the rate of dropout on the classifier's input in training; 0: none.
  """
  num_classes: int
  kernel: int = 5
  padding: str = 'SAME'
  hidden: int = 2048
  channels: tuple = (32, 64)
  xla_layers: bool = False
  dropout: float = 0.

  def setup(self):
    k = (self.kernel, self.kernel)
    conv = lax.conv_general_dilated if self.xla_layers else conv_general_dilated
    self.conv1 = nn.Conv(self.channels[0], k, padding=self.padding, conv_general_dilated=conv)
    self.conv2 = nn.Conv(self.channels[1], k, padding=self.padding, conv_general_dilated=conv)
    self.pool = _xla_pool if self.xla_layers else max_pool_2x2
    self.dense = nn.Dense(self.hidden)
    self.out = nn.Dense(self.num_classes)
    if self.dropout:
      self.drop = nn.Dropout(self.dropout)

  def features(self, x):
    x = self.pool(nn.relu(self.conv1(as_nhwc(x))))
    x = self.pool(nn.relu(self.conv2(x)))
    return nn.relu(self.dense(x.reshape((x.shape[0], -1))))

  def __call__(self, x, train: bool = False):
    return self.out(dropped(self, self.features(x), train))


def femnist_cnn(input_shape, num_classes: int, dropout: float = 0.) -> Model:
  """Builds LEAF's FEMNIST CNN (Caldas et al. 2018, LEAF: A Benchmark for Federated Settings).

  LEAF's ``models/femnist/cnn.py``: conv 5x5 32 'SAME' + ReLU, maxpool, conv 5x5 64 'SAME' +
  ReLU, maxpool, dense 2048 + ReLU, dense ``num_classes``. 28x28x1 inputs and 62 classes:
  6,603,710 parameters.

  Args:
    input_shape: one image's shape: ``(H, W, C)``, ``(H, W)`` or ``(H*W,)`` (a flattened
      square one-channel image).
    num_classes: output classes.
    dropout: the rate of dropout on the classifier's input in training; 0 (default): none.

  Returns:
    The ``Model`` ``'femnist_cnn'``.
  """
  module = TwoConvCNN(num_classes, kernel=5, padding='SAME', hidden=2048, dropout=dropout)
  return from_linen('femnist_cnn', module, tuple(input_shape), jnp.float32, num_classes)


def gel_femnist_cnn(input_shape, num_classes: int, dropout: float = 0.) -> Model:
  """Builds the FEMNIST CNN of GeL (Boukhari et al. 2023, GeL; about 6.1e5 parameters, Table 1).

  The paper says only "CNN, 2 Conv2D layers" (Table 4), "the same models as McMahan et al.
  (2017) and Li et al. (2020b)" and 6.1e5 parameters. McMahan et al.'s CNN (conv 5x5 32,
  maxpool, conv 5x5 64, maxpool, dense 512 + ReLU, softmax) has that count only with unpadded
  ('VALID', PyTorch's default) convolutions: 28 -> 24 -> 12 -> 8 -> 4, so 4*4*64 = 1024
  inputs to the dense layer and 608,702 parameters for 28x28x1 inputs and 62 classes ('SAME'
  convolutions give 1.69e6; LEAF's 2048-wide CNN, ``femnist_cnn``, 6.6e6). This is our choice.

  Args:
    input_shape: one image's shape: ``(H, W, C)``, ``(H, W)`` or ``(H*W,)`` (a flattened
      square one-channel image).
    num_classes: output classes.
    dropout: the rate of dropout on the classifier's input in training; 0 (default): none.

  Returns:
    The ``Model`` ``'gel_femnist_cnn'``.
  """
  module = TwoConvCNN(num_classes, kernel=5, padding='VALID', hidden=512, dropout=dropout)
  return from_linen('gel_femnist_cnn', module, tuple(input_shape), jnp.float32, num_classes)


def cifar_cnn(input_shape, num_classes: int, dropout: float = 0.) -> Model:
  """Builds FedGBO's CIFAR100 CNN (Mills et al. 2022, FedGBO, §5).

  Layer sizes from the authors' code (github.com/JedMills/FedGBO ``models.py``): conv 3x3 32
  'VALID' + ReLU, maxpool, conv 3x3 64 'VALID' + ReLU, maxpool, dense 512 + ReLU, dense
  ``num_classes``.
  32x32x3 inputs (32 -> 30 -> 15 -> 13 -> 6, 2304 dense inputs) and 100 classes: 1,250,852
  parameters. FedGBO's FEMNIST CNN is the same network on 28x28x1 inputs with 62 classes (1600 dense
  inputs, 870,334 parameters): build this on that shape.

  Args:
    input_shape: one image's shape: ``(H, W, C)``, ``(H, W)`` or ``(H*W,)`` (a flattened
      square one-channel image).
    num_classes: output classes.
    dropout: the rate of dropout on the classifier's input in training; 0 (default): none.

  Returns:
    The ``Model`` ``'cifar_cnn'``.
  """
  module = TwoConvCNN(num_classes, kernel=3, padding='VALID', hidden=512, dropout=dropout)
  return from_linen('cifar_cnn', module, tuple(input_shape), jnp.float32, num_classes)


class CelebACNN(nn.Module):
  """LEAF's CelebA CNN as a linen module: convolution blocks, then a classifier.

  ``blocks`` x [conv 3x3 ``channels`` 'SAME', (BatchNorm), maxpool 2x2/2 'SAME', ReLU], dense
  ``num_classes`` on the flattened maps (``features``).

  Attributes:
    num_classes: output classes.
    blocks: the convolution blocks.
    channels: each convolution's output channels.
    dropout: the rate of dropout on the classifier's input in training; 0: none.
    batch_norm: BatchNorm after each convolution (its running statistics in
      ``'batch_stats'``).
  """
  num_classes: int
  blocks: int = 4
  channels: int = 32
  dropout: float = 0.
  batch_norm: bool = False

  def setup(self):
    self.convs = [nn.Conv(self.channels, (3, 3), padding='SAME',
                          conv_general_dilated=conv_general_dilated)
                  for _ in range(self.blocks)]
    if self.batch_norm:
      self.norms = [nn.BatchNorm() for _ in range(self.blocks)]
    self.out = nn.Dense(self.num_classes)
    if self.dropout:
      self.drop = nn.Dropout(self.dropout)

  def features(self, x, train: bool = False):
    x = as_nhwc(x)
    for i, conv in enumerate(self.convs):
      x = conv(x)
      if self.batch_norm:
        x = self.norms[i](x, use_running_average=not train)
      x = nn.relu(max_pool_2x2(x, 'SAME'))
    return x.reshape((x.shape[0], -1))

  def __call__(self, x, train: bool = False):
    return self.out(dropped(self, self.features(x, train), train))


def celeba_cnn(input_shape, num_classes: int, dropout: float = 0.,
               batch_norm: bool = False) -> Model:
  """Builds LEAF's CelebA CNN (Caldas et al. 2018, LEAF: A Benchmark for Federated Settings).

  LEAF's ``models/celeba/cnn.py``: 4 x [conv 3x3 32 'SAME', (BatchNorm), maxpool 2x2/2 'SAME',
  ReLU], dense ``num_classes``. LEAF normalises after every convolution with BatchNorm in training
  mode; ``batch_norm`` (off by default, as this model was published here without it) restores it,
  Flax's ``nn.BatchNorm`` (momentum 0.99, epsilon 1e-5; LEAF's TF layer: 0.99, 1e-3), its statistics
  treated by the run's ``--model_state``. 84x84x3 inputs (84 -> 42 -> 21 -> 11 -> 6, 1152 dense
  inputs) and 2 classes: 30,946 parameters (31,202 with BatchNorm's scales and biases).

  Args:
    input_shape: one image's shape: ``(H, W, C)``, ``(H, W)`` or ``(H*W,)`` (a flattened
      square one-channel image).
    num_classes: output classes.
    dropout: the rate of dropout on the classifier's input in training; 0 (default): none.
    batch_norm: LEAF's BatchNorm after every convolution.

  Returns:
    The ``Model`` ``'celeba_cnn'``.
  """
  return from_linen('celeba_cnn', CelebACNN(num_classes, dropout=dropout, batch_norm=batch_norm),
                    tuple(input_shape), jnp.float32, num_classes)


FEMNIST_CNN = ModelSpec(
    'femnist_cnn', femnist_cnn, options=('dropout',), parameters='6,603,710',
    architecture="LEAF's: conv 5x5 32, pool, conv 5x5 64, pool, dense 2048, dense 62")
GEL_FEMNIST_CNN = ModelSpec(
    'gel_femnist_cnn', gel_femnist_cnn, options=('dropout',), parameters='608,702',
    architecture="McMahan et al.'s with unpadded convolutions and dense 512 (GeL's 6.1e5)")
CELEBA_CNN = ModelSpec(
    'celeba_cnn', celeba_cnn, options=('dropout', 'batch_norm'), parameters='30,946',
    architecture="LEAF's: 4 x (conv 3x3 32, pool, ReLU), dense 2; LEAF's BatchNorm after each "
    'conv with `--batch_norm` (off by default, as published here; its statistics by '
    '`--model_state`)')
CIFAR_CNN = ModelSpec(
    'cifar_cnn', cifar_cnn, options=('dropout',), parameters='1,250,852 (CIFAR-100)',
    architecture="FedGBO's: conv 3x3 32, pool, conv 3x3 64, pool, dense 512, dense")
