"""Tests for the TFDS data-source loaders; nothing is downloaded.

``tfds.testing.mock_data`` runs with ``MockPolicy.USE_CODE``: the installed tfds ships no
metadata files (``AUTO`` falls back to ``USE_CODE`` anyway, and ``USE_FILES`` fails), and its
data-source mock draws random examples from the builders' feature specs. Every split then holds
the same ``num_examples`` examples.
"""
from __future__ import annotations

import io
import json

import numpy as np
import pytest

from fedjax_gel.core.federated_data import FederatedSplit, client_examples
from fedjax_gel.data import partition, tfds_data  # imports tensorflow_datasets only when used
from fedjax_gel.data.errors import DataError

tfds = pytest.importorskip('tensorflow_datasets')

N = 120


def mock(num_examples=N, **kwargs):
  return tfds.testing.mock_data(num_examples=num_examples, policy=tfds.testing.MockPolicy.USE_CODE,
                                **kwargs)


def cifar100_source(self, split, decoders=None, deserialize_method=None, **kwargs):
  """A list data source whose fine label f always sits in superclass f // 5."""
  del self, decoders, deserialize_method, kwargs
  rng = np.random.default_rng(0 if split == 'train' else 1)
  n = 400 if split == 'train' else 100
  fine = rng.permutation(np.arange(n) % 100)
  return [{'image': rng.integers(0, 256, (32, 32, 3), dtype=np.uint8), 'label': np.int64(f),
           'coarse_label': np.int64(f // 5), 'id': f'train_{i}'} for i, f in enumerate(fine)]


@pytest.mark.parametrize('name', ['mnist', 'emnist', 'cifar10', 'cifar100'])
def test_load_dirichlet_shapes_and_ranges(name, tmp_path):
  spec = tfds_data.DATASETS[name]
  with mock():
    split = tfds_data.load(name, num_clients=10, alpha=0.5, seed=0, data_dir=tmp_path)
  assert isinstance(split, FederatedSplit)
  for pool in (split.train, split.test):
    assert pool.num_clients == 10 and pool.num_examples == N
    assert list(pool.counts) == [12] * 10
    np.testing.assert_array_equal(pool.offsets, np.arange(0, N, 12))
    x, y = pool.examples['x'], pool.examples['y']
    assert sorted(pool.examples) == ['x', 'y']
    assert x.shape == (N,) + spec.shape and x.dtype == np.float32
    assert 0.0 <= x.min() and x.max() <= 1.0 and x.max() > 0.5
    assert y.shape == (N,) and y.dtype == np.int32
    assert 0 <= y.min() and y.max() < spec.num_classes
  assert split.train.client_names == split.test.client_names == tuple(map(str, range(10)))


def test_emnist_has_62_classes(tmp_path):
  with mock(num_examples=600):
    y = tfds_data.read_split('emnist', 'train', tmp_path)['y']
  assert y.max() >= 50 and y.max() < 62  # the mock draws labels below num_classes = 62


def test_train_pool_is_the_dirichlet_partition(tmp_path):
  with mock():
    whole = tfds_data.read_split('mnist', 'train', tmp_path)
    split = tfds_data.load_mnist(num_clients=8, alpha=0.3, seed=4, data_dir=tmp_path)
  assert whole['x'].shape == (N, 28, 28, 1) and whole['x'].dtype == np.float32
  parts = partition.dirichlet(whole['y'], 8, 0.3, seed=4)
  for i, p in enumerate(parts):
    got = client_examples(split.train, i)
    np.testing.assert_array_equal(got['x'], whole['x'][p])
    np.testing.assert_array_equal(got['y'], whole['y'][p])
  # Each pool holds every example of its split exactly once.
  rows = split.test.examples['x'].reshape(N, -1)
  assert len(np.unique(rows, axis=0)) == len(np.unique(whole['x'].reshape(N, -1), axis=0))


def test_images_are_scaled_bytes(tmp_path):
  with mock(num_examples=5):
    source = tfds_data.data_source('cifar10', 'train', tmp_path)
    raw = np.stack([source[i]['image'] for i in range(5)])
    x = tfds_data.read_split('cifar10', 'test', tmp_path)['x']
  np.testing.assert_allclose(x, raw.astype(np.float32) / 255, rtol=0, atol=0)


def test_deterministic_by_seed(tmp_path):
  with mock():
    a = tfds_data.load('cifar10', 6, 0.2, seed=1, data_dir=tmp_path)
    b = tfds_data.load('cifar10', 6, 0.2, seed=1, data_dir=tmp_path)
    c = tfds_data.load('cifar10', 6, 0.2, seed=2, data_dir=tmp_path)
  np.testing.assert_array_equal(a.train.examples['y'], b.train.examples['y'])
  np.testing.assert_array_equal(a.test.examples['x'], b.test.examples['x'])
  assert not np.array_equal(a.train.examples['y'], c.train.examples['y'])


def test_cifar100_pachinko_uses_superclasses(tmp_path):
  with mock(as_data_source_fn=cifar100_source):
    split = tfds_data.load_cifar100(num_clients=4, alpha=0.1, beta=10.0, seed=0,
                                    data_dir=tmp_path)
    whole = tfds_data.read_split('cifar100', 'train', tmp_path)
  np.testing.assert_array_equal(whole['coarse_y'], whole['y'] // 5)
  assert list(split.train.counts) == [100] * 4 and list(split.test.counts) == [25] * 4
  fine, coarse = whole['y'], whole['coarse_y']
  parts = partition.pachinko(fine, coarse, 4, alpha=0.1, beta=10.0, seed=0)
  for i, p in enumerate(parts):
    np.testing.assert_array_equal(client_examples(split.train, i)['y'], fine[p])
  # alpha = 0.1 over 20 superclasses: the first client (not yet limited by what others left)
  # uses few of them.
  assert (np.bincount(coarse[parts[0]], minlength=20) > 0).sum() <= 10


def test_pachinko_needs_consistent_superclasses(tmp_path):
  with mock(), pytest.raises(DataError, match='cifar100: fine label .* appears under'):
    tfds_data.load('cifar100', 4, partition='pachinko', data_dir=tmp_path)  # random mock labels


def test_bad_arguments(tmp_path):
  with pytest.raises(DataError, match='unknown dataset'):
    tfds_data.load('imagenet')
  with pytest.raises(DataError, match='only cifar100'):
    tfds_data.load('mnist', partition='pachinko')
  with pytest.raises(DataError, match='unknown partition'):
    tfds_data.load('mnist', partition='iid')
  with mock(num_examples=5), pytest.raises(DataError, match='num_clients must be in 1..5'):
    tfds_data.load('mnist', num_clients=6, data_dir=tmp_path)


@pytest.mark.parametrize('name,tfds_name', [('mnist', 'mnist'), ('emnist', 'emnist/byclass'),
                                            ('cifar100', 'cifar100')])
def test_not_prepared_is_one_line_with_the_command(name, tfds_name, tmp_path):
  with pytest.raises(DataError) as e:
    tfds_data.load(name, data_dir=tmp_path)
  msg = str(e.value)
  assert '\n' not in msg
  assert f'{tfds_name} is not prepared in data_dir={tmp_path}' in msg
  assert (f"tfds.builder('{tfds_name}', data_dir='{tmp_path}', file_format='array_record')"
          '.download_and_prepare()') in msg
  assert list(tmp_path.iterdir()) == []  # nothing downloaded or written


def test_a_damaged_preparation_is_one_line_with_the_command(tmp_path):
  """A damaged folder (here a ``dataset_info.json`` cut short) raised protobuf's ParseError
  with a traceback."""
  info = tmp_path / 'mnist' / '3.0.1' / 'dataset_info.json'
  info.parent.mkdir(parents=True)
  info.write_text('{bad')
  with pytest.raises(DataError) as e:
    tfds_data.load('mnist', data_dir=tmp_path)
  msg = str(e.value)
  assert '\n' not in msg and msg.startswith(f"mnist (mnist, split 'train', data_dir={tmp_path}) "
                                            'cannot be read (')
  assert f'remove {tmp_path / "mnist"} and prepare it again with: ' in msg


def png(image):
  from PIL import Image  # pylint: disable=g-import-not-at-top
  buffer = io.BytesIO()
  Image.fromarray(image[..., 0]).save(buffer, format='png')
  return buffer.getvalue()


class FedjaxGelFakeDigits(tfds.core.GeneratorBasedBuilder):
  """A tiny image dataset prepared for real (ArrayRecord) without TensorFlow: the examples are
  given as PNG bytes, which TFDS stores as they are (encoding arrays would need TensorFlow)."""
  VERSION = tfds.core.Version('1.0.0')

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
        'image': tfds.features.Image(shape=(4, 4, 1)),
        'label': tfds.features.ClassLabel(num_classes=3)}))

  def _split_generators(self, dl_manager):
    del dl_manager
    return {'train': self._generate_examples(23)}

  def _generate_examples(self, n):
    for i in range(n):
      yield i, {'image': png(np.full((4, 4, 1), i, np.uint8)), 'label': i % 3}


@pytest.fixture(scope='module')
def prepared_dir(tmp_path_factory):
  root = tmp_path_factory.mktemp('tfds')
  FedjaxGelFakeDigits(data_dir=str(root), file_format='array_record').download_and_prepare()
  return root


def test_read_source_reads_and_decodes_array_records_in_batches(prepared_dir):
  source = tfds_data.data_source('fedjax_gel_fake_digits', 'train', prepared_dir)
  ex = tfds_data.read_source(source, ['image', 'label'], batch_size=7)
  order = np.argsort(ex['image'][:, 0, 0, 0])  # TFDS shuffles the records on preparation
  np.testing.assert_array_equal(ex['image'][order, 0, 0, 0], np.arange(23))
  np.testing.assert_array_equal(ex['label'][order], np.arange(23) % 3)
  assert ex['image'].shape == (23, 4, 4, 1) and ex['image'].dtype == np.uint8


def test_prepared_as_tfrecord_is_one_line(prepared_dir, tmp_path):
  import shutil  # pylint: disable=g-import-not-at-top
  root = tmp_path / 'tfrecord'
  shutil.copytree(prepared_dir, root)
  info = root / 'fedjax_gel_fake_digits' / '1.0.0' / 'dataset_info.json'
  meta = json.loads(info.read_text())
  meta['fileFormat'] = 'tfrecord'
  info.write_text(json.dumps(meta))
  with pytest.raises(DataError) as e:
    tfds_data.data_source('fedjax_gel_fake_digits', 'train', root)
  msg = str(e.value)
  assert '\n' not in msg and 'prepared as tfrecord' in msg and "file_format='array_record'" in msg
