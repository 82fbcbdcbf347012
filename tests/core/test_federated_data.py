"""``federated_data``: a pool is checked before it reaches the device (``check_pool``); its
digest is the same for the same data, and another for any change to an example, a client's
range, a dtype or a feature's name."""
import numpy as np
import pytest

from fedjax_gel.core import federated_data as fd


def pools(seed=0):
  rng = np.random.default_rng(seed)
  clients = [{'x': rng.normal(size=(n, 3)).astype(np.float32),
              'y': rng.integers(0, 3, n).astype(np.int32)} for n in (4, 0, 6)]
  return fd.from_client_arrays(clients), fd.from_client_arrays(clients[:1])


def test_digest_is_of_the_values_and_their_layout():
  train, test = pools()
  digest = fd.digest(train, test)
  assert len(digest) == 64 and digest == fd.digest(*pools())                 # same data
  assert fd.digest(train._replace(client_names=('a', 'b', 'c')), test) == digest
  assert fd.digest(*pools(seed=1)) != digest                                 # other values
  assert fd.digest(test, train) != digest                                    # swapped pools
  x = train.examples['x'].copy()
  x[5, 1] = np.nextafter(x[5, 1], np.float32(np.inf))                        # one ulp
  changed = {
      'value': train._replace(examples={**train.examples, 'x': x}),
      'range': train._replace(offsets=np.asarray([0, 4, 3], np.int32),
                              counts=np.asarray([3, 1, 6], np.int32)),
      'dtype': train._replace(examples={**train.examples,
                                        'y': train.examples['y'].astype(np.int64)}),
      'name': train._replace(examples={'x': train.examples['x'], 'z': train.examples['y']}),
      'shape': train._replace(examples={**train.examples,
                                        'x': train.examples['x'].reshape(10, 3, 1)}),
  }
  digests = {k: fd.digest(p, test) for k, p in changed.items()}
  assert digest not in digests.values() and len(set(digests.values())) == len(changed), digests


def good_pool():
  return fd.FederatedData({'x': np.zeros((5, 2), np.float32), 'y': np.zeros(5, np.int32)},
                          np.asarray([0, 3], np.int32), np.asarray([3, 2], np.int32))


def test_a_well_formed_pool_passes_and_moves_to_the_device():
  pool = good_pool()
  assert fd.check_pool(pool) is pool
  on_device = fd.to_device(pool)
  np.testing.assert_array_equal(on_device.counts, [3, 2])
  assert fd.to_device(on_device).num_examples == 5                  # a pool already moved
  empty = pool._replace(examples={'x': np.zeros((0, 2)), 'y': np.zeros(0, np.int32)},
                        offsets=np.zeros(2, np.int32), counts=np.zeros(2, np.int32))
  assert fd.check_pool(empty) is empty                              # clients without examples
  import ml_dtypes  # pylint: disable=g-import-not-at-top
  narrow = pool._replace(examples={'x': np.zeros((5, 2), ml_dtypes.bfloat16),
                                   'm': np.ones(5, bool), 'y': np.zeros(5, np.uint8)},
                         client_names=np.asarray(['a', 'b']))
  assert fd.to_device(narrow).examples['x'].dtype == ml_dtypes.bfloat16


@pytest.mark.parametrize('change,words', [
    (dict(counts=np.asarray([3, 3], np.int32)), "client 1 owns rows 3..5, outside the pool's 5"),
    (dict(offsets=np.asarray([-1, 3], np.int32)), 'client 0 owns rows -1..1'),
    (dict(counts=np.asarray([3, -1], np.int32)), 'client 1 owns rows 3..1'),
    (dict(counts=np.asarray([3., 2.])), 'offsets and counts must be integer arrays'),
    (dict(counts=np.asarray([3], np.int32)), r'one entry per client, at least one'),
    (dict(offsets=np.zeros(0, np.int32), counts=np.zeros(0, np.int32)), 'at least one'),
    (dict(examples={}), 'at least one feature'),
    (dict(examples={'x': np.zeros((5, 2)), 'y': np.zeros(4, np.int32)}),
     'one row per example, got rows x 5, y 4'),
    (dict(examples={'x': np.asarray([object()] * 5), 'y': np.zeros(5, np.int32)}),
     "feature 'x' must be an array of numbers or booleans with a leading axis"),
    (dict(examples={'x': np.asarray(['a'] * 5), 'y': np.zeros(5, np.int32)}), 'got <U1'),
    (dict(examples={'x': np.float32(1.), 'y': np.zeros(5, np.int32)}), 'shape ()'),
    (dict(client_names=('a', 'b', 'c')), '3 client names for 2 clients'),
], ids=['rows_past_the_pool', 'negative_offset', 'negative_count', 'float_counts',
        'lengths_differ', 'no_clients', 'no_features', 'feature_rows_differ', 'objects',
        'strings', 'scalar_feature', 'names'])
def test_a_malformed_pool_is_one_line_before_it_reaches_the_device(change, words):
  """A pool built by hand (or by a registered loader) whose ranges run past its rows would have
  the round read the wrong examples (its gathers clamp); the rest would fail inside JAX."""
  bad = good_pool()._replace(**change)
  with pytest.raises(ValueError, match='^to_device: ') as e:
    fd.to_device(bad)
  assert words in str(e.value) and '\n' not in str(e.value)
  with pytest.raises(TypeError, match='must be a FederatedData, got dict'):
    fd.check_pool({'x': np.zeros(3)})


def test_host_pools_may_hold_text_until_a_task_turns_it_into_numbers():
  text = fd.from_client_arrays([{'x': np.asarray(['ab', 'cd']), 'y': np.asarray(['b', 'c'])}])
  assert text.examples['x'].dtype.kind == 'U'
  with pytest.raises(ValueError, match=r'numbers or booleans or strings .*\(got object'):
    fd.from_client_arrays([{'x': np.asarray([object(), object()]), 'y': np.zeros(2)}])
  with pytest.raises(ValueError, match="to_device: feature 'x'"):
    fd.to_device(text)


@pytest.mark.parametrize('clients, words', [
    ([np.zeros((3, 3))], "client 0 must be a dict of feature arrays, got ndarray"),
    ([{'x': np.float32(1.), 'y': np.zeros(1)}], "client 0's 'x' has shape ()"),
    ([{'x': np.zeros((2, 3)), 'y': np.zeros(2)}, {'x': np.zeros((2, 4)), 'y': np.zeros(2)}],
     "client 1's 'x' has shape (2, 4), client 0's (2, 3)"),
    ([{'x': np.zeros((2, 3)), 'y': np.zeros(3)}], "client 0 has 2 rows of 'x' but 3 of 'y'"),
    ([{'x': np.zeros((2, 3))}, {'z': np.zeros((2, 3))}], "client 1 has ['z'], client 0 ['x']"),
    ([{'x': np.zeros((2, 3))}, {'x': np.array([[0., np.nan, 0.]] * 2)}],
     "client 1's 'x' holds values that are not finite"),
])
def test_client_arrays_that_make_no_pool_name_the_client(clients, words):
  """numpy's own messages ('truth value of an array is ambiguous', a concatenate's shapes) did
  not say which client, and NaN features trained a non-finite model without a word."""
  with pytest.raises(ValueError) as e:
    fd.from_client_arrays(clients)
  assert str(e.value).startswith('from_client_arrays: ') and words in str(e.value)
