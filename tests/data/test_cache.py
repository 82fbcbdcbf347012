"""The disk cache of generated datasets: what it reads back is what was built, to the bit."""
import numpy as np
import pytest

from fedjax_gel.core import federated_data
from fedjax_gel.data import cache, leaf, leaf_synthetic


def tiny_split(seed=0):
  rng = np.random.default_rng(seed)
  clients = [{'x': rng.random((n, 3), np.float32), 'y': rng.integers(0, 2, n).astype(np.int32)}
             for n in (2, 5, 1)]
  pool = federated_data.from_client_arrays(clients, ['a', 'b', 'c'])
  return federated_data.FederatedSplit(pool, pool._replace(counts=np.asarray(pool.counts) // 2))


def assert_same(a, b):
  for part in ('train', 'test'):
    x, y = getattr(a, part), getattr(b, part)
    assert x.client_names == y.client_names
    for k in x.examples:
      np.testing.assert_array_equal(x.examples[k], y.examples[k])
      assert np.asarray(x.examples[k]).dtype == np.asarray(y.examples[k]).dtype
    np.testing.assert_array_equal(x.offsets, y.offsets)
    np.testing.assert_array_equal(x.counts, y.counts)


def test_built_once_then_read_back_exactly(tmp_path):
  built = []

  def build():
    built.append(1)
    return tiny_split()

  first = cache.cached_split('tiny', {'s': 1}, (cache,), build, str(tmp_path))
  second = cache.cached_split('tiny', {'s': 1}, (cache,), build, str(tmp_path))
  assert len(built) == 1 and len(list(tmp_path.iterdir())) == 1
  assert_same(first, tiny_split())
  assert_same(second, tiny_split())
  cache.cached_split('tiny', {'s': 2}, (cache,), build, str(tmp_path))   # other settings
  assert len(built) == 2 and len(list(tmp_path.iterdir())) == 2


def flip_middle_bytes(data: bytes) -> bytes:
  """64 bytes of the middle flipped (one byte may fall in a header's padding)."""
  mid = len(data) // 2
  return data[:mid] + bytes(b ^ 0xFF for b in data[mid:mid + 64]) + data[mid + 64:]


@pytest.mark.parametrize('damage', [
    lambda data: b'not an npz',
    lambda data: b'',                        # EOFError
    lambda data: data[:len(data) // 2],      # BadZipFile: no central directory
    flip_middle_bytes,                       # BadZipFile: bad CRC-32 of a member
], ids=['not_npz', 'empty', 'cut', 'flipped'])
def test_a_damaged_file_is_built_again_and_replaced_and_off_builds_always(tmp_path, damage):
  """Empty, cut and flipped files raised past the cache (zipfile.BadZipFile, EOFError), so every
  later run with the same settings failed until the file was deleted by hand."""
  built = []

  def build():
    built.append(1)
    return tiny_split()

  cache.cached_split('tiny', {}, (cache,), build, str(tmp_path))
  (path,) = tmp_path.iterdir()
  path.write_bytes(damage(path.read_bytes()))
  assert_same(cache.cached_split('tiny', {}, (cache,), build, str(tmp_path)), tiny_split())
  assert_same(cache.cached_split('tiny', {}, (cache,), build, str(tmp_path)), tiny_split())
  assert len(built) == 2   # rebuilt once, then read from the rewritten file
  cache.cached_split('tiny', {}, (cache,), build, '')
  assert len(built) == 3


def test_the_source_code_is_part_of_the_key():
  assert (cache.file_name('x', {}, (cache,)) != cache.file_name('x', {}, (cache, leaf)))


@pytest.mark.slow
def test_leaf_synthetic_through_the_cache_is_leaf_synthetic(tmp_path):
  settings = {'train_fraction': 0.9, 'split_seed': 931231}
  make = lambda: leaf_synthetic.load(**settings)
  cache.cached_split('leaf_synthetic', settings, (leaf_synthetic, leaf), make, str(tmp_path))
  assert_same(cache.cached_split('leaf_synthetic', settings, (leaf_synthetic, leaf),
                                 lambda: None, str(tmp_path)), make())
