"""``federated_data.digest``: the same data give the same digest; any change to an example, a
client's range, a dtype or a feature's name gives another."""
import numpy as np

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
