"""MNIST, EMNIST (by_class), CIFAR-10 and CIFAR-100 from TFDS data sources, split into clients.

Examples are read through ``tfds.data_source`` (random access to ArrayRecord files, decoded with
numpy/PIL; no TensorFlow graph), then dealt to clients with ``partition``: ``dirichlet`` (Hsu et
al. 2019) for every dataset, or ``pachinko`` (Reddi et al. 2021) for CIFAR-100 with its coarse
labels. Examples are ``{'x': float32 [P, H, W, C] in [0, 1], 'y': int32 [P]}``.

Train and test: the official train split is partitioned into the clients' train pools, and the
official test split into the *same* clients' test pools with the same per-client label
proportions (so each client is tested on its own label mix, and the test pools together hold
the whole official test set). The train pools equal ``partition.dirichlet(train_labels,
num_clients, alpha, seed)`` (``partition.pachinko`` likewise).

Nothing is downloaded: the data must have been prepared in ArrayRecord format beforehand
(``prepare_command`` gives the line; preparing needs TensorFlow, reading does not). EMNIST images
are returned as TFDS stores them (transposed relative to MNIST, as in the NIST source).
"""
from __future__ import annotations

import os
from typing import Any, NamedTuple, Sequence

import numpy as np

from fedjax_gel.core.federated_data import FederatedData, FederatedSplit
from fedjax_gel.data import partition as partition_lib
from fedjax_gel.data.errors import DataError

__all__ = ['DATASETS', 'data_source', 'load', 'load_cifar10', 'load_cifar100', 'load_emnist',
           'load_mnist', 'prepare_command', 'read_source', 'read_split']


class Spec(NamedTuple):
  """A supported dataset: its TFDS name, label count, image shape and superclass field."""
  tfds_name: str
  num_classes: int
  shape: tuple
  coarse_key: str | None = None


DATASETS = {
    'mnist': Spec('mnist', 10, (28, 28, 1)),
    'emnist': Spec('emnist/byclass', 62, (28, 28, 1)),
    'cifar10': Spec('cifar10', 10, (32, 32, 3)),
    'cifar100': Spec('cifar100', 100, (32, 32, 3), 'coarse_label'),
}
PARTITIONS = ('dirichlet', 'pachinko')


def _tfds():
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ImportError('TFDS datasets need tensorflow_datasets and array_record: '
                      'pip install tensorflow-datasets array-record pillow') from None
  return tfds


def _spec(name: str) -> Spec:
  if name not in DATASETS:
    raise DataError(f'unknown dataset {name!r}; choose one of {", ".join(DATASETS)}')
  return DATASETS[name]


def _data_dir_root(data_dir: str | os.PathLike | None) -> str:
  if data_dir is not None:
    return os.fspath(data_dir)
  return os.fspath(_tfds().core.constants.DATA_DIR)


def prepare_command(tfds_name: str, data_dir: str | os.PathLike | None = None) -> str:
  """The shell line that downloads and prepares ``tfds_name`` as ArrayRecord in ``data_dir``."""
  return (f'python -c "import tensorflow_datasets as tfds; tfds.builder({tfds_name!r}, '
          f"data_dir={_data_dir_root(data_dir)!r}, file_format='array_record')"
          '.download_and_prepare()"')


def data_source(tfds_name: str, split: str, data_dir: str | os.PathLike | None = None) -> Any:
  """``tfds.data_source(tfds_name, split, data_dir)`` without downloading.

  Raises ``DataError`` (one line, with the command to run) when the dataset is not prepared in
  ``data_dir`` (default: ``$TFDS_DATA_DIR`` or ``~/tensorflow_datasets``), or was prepared in a
  format without random access (TFRecord, ``tfds.load``'s default).
  """
  tfds = _tfds()
  try:
    return tfds.data_source(tfds_name, split=split, data_dir=data_dir, download=False)
  except (KeyError, NotImplementedError, ValueError, AssertionError, FileNotFoundError):
    builder = tfds.builder(tfds_name, data_dir=data_dir)  # the format prepared, if any
    root = _data_dir_root(data_dir)
    if not builder.is_prepared():
      raise DataError(f'{tfds_name} is not prepared in data_dir={root} (this loader never '
                      f'downloads); prepare it once (needs tensorflow) with: '
                      f'{prepare_command(tfds_name, data_dir)}') from None
    fmt = builder.info.file_format
    if fmt not in tfds.core.FileFormat.with_random_access():
      raise DataError(f'{tfds_name} in data_dir={root} was prepared as '
                      f'{getattr(fmt, "value", fmt)}, which has no random access; prepare it '
                      f'as array_record in another data_dir with: '
                      f'{prepare_command(tfds_name, "OTHER_DIR")}') from None
    raise


def _read_batch(source: Any, keys: list[int]) -> Sequence[Any]:
  get_many = getattr(source, '__getitems__', None)
  if get_many is not None:
    try:
      return get_many(keys)
    except TypeError:  # tfds.testing.mock_data (4.9) binds __getitems__ without its self
      pass
  return [source[k] for k in keys]


def read_source(source: Any, fields: Sequence[str],
                batch_size: int = 1024) -> dict[str, np.ndarray]:
  """Every example of a random-access ``source`` (``len`` and ``[i]``; ``__getitems__`` is used
  for batched reads where present), as one stacked numpy array per field."""
  n = len(source)
  parts = {f: [] for f in fields}
  for start in range(0, n, batch_size):
    batch = _read_batch(source, list(range(start, min(n, start + batch_size))))
    for f in fields:
      parts[f].append(np.stack([np.asarray(ex[f]) for ex in batch]))
  return {f: np.concatenate(v) if v else np.zeros((0,)) for f, v in parts.items()}


def _read(name: str, split: str, data_dir) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
  """``(uint8 images [n, H, W, C], int32 labels [n], int32 superclasses [n] or None)``."""
  spec = _spec(name)
  fields = ['image', 'label'] + ([spec.coarse_key] if spec.coarse_key else [])
  where = f'{name} ({spec.tfds_name}, split {split!r}, data_dir={_data_dir_root(data_dir)})'
  try:
    ex = read_source(data_source(spec.tfds_name, split, data_dir), fields)
  except (DataError, MemoryError, OSError):   # OSError: one line naming its file, from the CLI
    raise
  except Exception as e:  # pylint: disable=broad-except  # damaged: protobuf's, ArrayRecord's, ...
    message = str(e).strip().splitlines()
    raise DataError(f'{where} cannot be read ({message[0] if message else type(e).__name__}); '
                    f'a preparation that was stopped or a damaged file leaves this: remove '
                    f'{os.path.join(_data_dir_root(data_dir), spec.tfds_name)} and prepare it '
                    f'again with: {prepare_command(spec.tfds_name, data_dir)}') from None
  images, labels = ex['image'], ex['label']
  if not len(labels):
    raise DataError(f'{where} holds no examples')
  if images.shape[1:] != spec.shape or images.dtype != np.uint8:
    raise DataError(f'{where} has images {images.dtype} {images.shape[1:]}, expected uint8 '
                    f'{spec.shape}')
  if labels.min() < 0 or labels.max() >= spec.num_classes:
    raise DataError(f'{where} has labels outside 0..{spec.num_classes - 1}')
  coarse = ex[spec.coarse_key].astype(np.int32) if spec.coarse_key else None
  return images, labels.astype(np.int32), coarse


def _to_float(images: np.ndarray) -> np.ndarray:
  return images.astype(np.float32) / np.float32(255)


def read_split(name: str, split: str = 'train',
               data_dir: str | os.PathLike | None = None) -> dict[str, np.ndarray]:
  """One whole split, unpartitioned: ``{'x': float32 [n, H, W, C] in [0, 1], 'y': int32 [n]}``
  (CIFAR-100 adds ``'coarse_y'``, its 20 superclasses)."""
  images, labels, coarse = _read(name, split, data_dir)
  out = {'x': _to_float(images), 'y': labels}
  if coarse is not None:
    out['coarse_y'] = coarse
  return out


def _pool(images: np.ndarray, labels: np.ndarray, parts: list[np.ndarray]) -> FederatedData:
  order = np.concatenate(parts)
  counts = np.array([len(p) for p in parts], np.int32)
  offsets = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32)
  names = tuple(str(i) for i in range(len(parts)))
  return FederatedData({'x': _to_float(images[order]), 'y': labels[order]}, offsets, counts,
                       names)


def load(
    name: str,
    num_clients: int = 100,
    alpha: float = 0.5,
    partition: str = 'dirichlet',
    beta: float = 10.0,
    seed: int = 0,
    data_dir: str | os.PathLike | None = None,
) -> FederatedSplit:
  """Loads ``name`` (``mnist``, ``emnist``, ``cifar10``, ``cifar100``) as ``num_clients`` clients.

  ``partition='dirichlet'``: label proportions ``Dir(alpha * p)``, ``p`` the train split's label
  distribution. ``partition='pachinko'`` (CIFAR-100 only): superclass proportions ``Dir(alpha)``,
  fine proportions within a superclass ``Dir(beta)``. Client sizes are equal (up to one) in
  each split; ``num_clients`` may not exceed the test split's size.
  """
  spec = _spec(name)
  if partition not in PARTITIONS:
    raise DataError(f'unknown partition {partition!r}; choose one of {", ".join(PARTITIONS)}')
  if partition == 'pachinko' and spec.coarse_key is None:
    raise DataError(f'partition=pachinko needs superclasses, which {name} does not have '
                    '(only cifar100)')
  train_x, train_y, train_c = _read(name, 'train', data_dir)
  test_x, test_y, test_c = _read(name, 'test', data_dir)
  num_clients = int(num_clients)
  if not 1 <= num_clients <= min(len(train_y), len(test_y)):
    raise DataError(f'{name}: num_clients must be in 1..{min(len(train_y), len(test_y))} '
                    f'(each client needs a train and a test example), got {num_clients}')
  s_prop, s_train, s_test = partition_lib.child_seeds(seed, 3)
  try:
    if partition == 'dirichlet':
      q = partition_lib.dirichlet_proportions(
          partition_lib.label_prior(train_y, spec.num_classes), num_clients, alpha, s_prop)
      train = partition_lib.allocate(train_y, q, s_train)
      test = partition_lib.allocate(test_y, q, s_test)
    else:
      parent = partition_lib.superclass_of(np.concatenate([train_y, test_y]),
                                           np.concatenate([train_c, test_c]))
      coarse, fine = partition_lib.pachinko_proportions(parent, num_clients, alpha, beta, s_prop)
      train = partition_lib.allocate_pachinko(train_y, train_c, coarse, fine, s_train)
      test = partition_lib.allocate_pachinko(test_y, test_c, coarse, fine, s_test)
  except ValueError as e:
    raise DataError(f'{name}: {e}') from None
  return FederatedSplit(_pool(train_x, train_y, train), _pool(test_x, test_y, test))


def load_mnist(num_clients: int = 100, alpha: float = 0.5, seed: int = 0,
               data_dir: str | os.PathLike | None = None) -> FederatedSplit:
  """MNIST (60,000 train / 10,000 test, 28x28x1, 10 classes), Dirichlet partition."""
  return load('mnist', num_clients, alpha, seed=seed, data_dir=data_dir)


def load_emnist(num_clients: int = 100, alpha: float = 0.5, seed: int = 0,
                data_dir: str | os.PathLike | None = None) -> FederatedSplit:
  """EMNIST by_class (697,932 / 116,323, 28x28x1, 62 classes), Dirichlet partition."""
  return load('emnist', num_clients, alpha, seed=seed, data_dir=data_dir)


def load_cifar10(num_clients: int = 100, alpha: float = 0.5, seed: int = 0,
                 data_dir: str | os.PathLike | None = None) -> FederatedSplit:
  """CIFAR-10 (50,000 / 10,000, 32x32x3, 10 classes), Dirichlet partition (Hsu et al.)."""
  return load('cifar10', num_clients, alpha, seed=seed, data_dir=data_dir)


def load_cifar100(num_clients: int = 500, alpha: float = 0.1, partition: str = 'pachinko',
                  beta: float = 10.0, seed: int = 0,
                  data_dir: str | os.PathLike | None = None) -> FederatedSplit:
  """CIFAR-100 (50,000 / 10,000, 32x32x3, 100 classes in 20 superclasses).

  Defaults are TFF's federated CIFAR-100 (Reddi et al.): Pachinko, 500 clients x 100 train
  examples, alpha 0.1, beta 10. TFF's test split has 100 separate clients; here the 500 clients
  get 20 test examples each, drawn with their own proportions.
  """
  return load('cifar100', num_clients, alpha, partition, beta, seed, data_dir)
