"""LEAF's tasks as model inputs: Shakespeare ids and its 79-sample gap, Sent140 words, FEMNIST
images, CelebA images from a directory, the by-user split; errors are one line."""
from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from fedjax_gel.core.federated_data import client_examples
from fedjax_gel.data import errors, leaf, leaf_files, leaf_preprocess, leaf_tasks

LEAF_DIR = pathlib.Path(__file__).resolve().parents[2].parent / 'shared' / 'data' / 'leaf'
SHAKESPEARE = LEAF_DIR / 'shakespeare_niid_keep100_subset.json'


def write(path, users):
  """LEAF JSON from ``{user: (xs, ys)}``."""
  data = {'users': list(users), 'num_samples': [len(y) for _, y in users.values()],
          'user_data': {u: {'x': x, 'y': y} for u, (x, y) in users.items()}}
  path.write_text(json.dumps(data))
  return path


def test_character_vocabularies():
  assert len(leaf_tasks.LEAF_CHARS) == len(set(leaf_tasks.LEAF_CHARS)) == 80
  assert len(leaf_tasks.TFF_CHARS) == len(set(leaf_tasks.TFF_CHARS)) == 86
  ids = leaf_tasks.char_ids(np.array(['ab\n', 'z~ ']), leaf_tasks.LEAF_CHARS)
  want = [[leaf_tasks.LEAF_CHARS.index(ch) for ch in 'ab\n'],
          [leaf_tasks.LEAF_CHARS.index('z'), 80, leaf_tasks.LEAF_CHARS.index(' ')]]
  np.testing.assert_array_equal(ids, want)   # '~' is outside LEAF's vocabulary: id 80


def text_user(n, seed):
  rng = np.random.default_rng(seed)
  line = ''.join(rng.choice(list('abc de'), size=n + 80))
  return [line[i:i + 80] for i in range(n)], [line[i + 80] for i in range(n)]


def test_shakespeare_position_split_skips_79_samples_and_drops_users_without_test(tmp_path):
  """LEAF: train = first int(0.8 n) samples, test = samples int(0.8 n) + 79 onwards."""
  path = write(tmp_path / 's.json', {'long': text_user(500, 0), 'short': text_user(120, 1)})
  split = leaf_tasks.load_shakespeare(path)
  assert split.train.client_names == ('long',)   # 120 - 96 - 79 < 0: no test part
  xs, ys = text_user(500, 0)
  assert int(split.train.counts[0]) == 400 and int(split.test.counts[0]) == 500 - 479
  test = client_examples(split.test, 0)
  np.testing.assert_array_equal(test['x'][0], leaf_tasks.char_ids(np.array([xs[479]]),
                                                                   leaf_tasks.LEAF_CHARS)[0])
  assert test['y'][0] == leaf_tasks.LEAF_CHARS.index(ys[479])
  no_gap = leaf_tasks.load_shakespeare(path, gap=0)
  assert no_gap.train.client_names == ('long', 'short')
  assert int(no_gap.test.counts[1]) == 120 - 96


def test_shakespeare_rejects_numbers_and_ragged_strings(tmp_path):
  with pytest.raises(errors.DataError, match='must be strings'):
    leaf_tasks.load_shakespeare(write(tmp_path / 'n.json', {'u': ([[1.0]] * 200, [1] * 200)}),
                                gap=0)
  ragged = (['a' * 80] * 100 + ['b' * 79] * 100, ['c'] * 200)
  with pytest.raises(errors.DataError, match='79 to 80 characters') as e:
    leaf_tasks.load_shakespeare(write(tmp_path / 'r.json', {'u': ragged}), gap=0)
  assert '\n' not in str(e.value)


@pytest.mark.skipif(not SHAKESPEARE.is_file(), reason=f'{SHAKESPEARE} not found (../shared/data)')
def test_real_shakespeare_subset_as_ids():
  split = leaf_tasks.load_shakespeare(SHAKESPEARE, gap=0)
  assert split.train.num_clients == split.test.num_clients == 109
  assert split.train.examples['x'].shape[1:] == (80,)
  assert split.train.examples['x'].dtype == np.int32
  for pool in split:   # every character of the subset is in LEAF's vocabulary
    assert pool.examples['x'].max() < 80 and pool.examples['y'].max() < 80
  raw = leaf_files.read_leaf_json(SHAKESPEARE)
  u = split.train.client_names[0]
  first = client_examples(split.train, 0)
  assert ''.join(leaf_tasks.LEAF_CHARS[i] for i in first['x'][0]) == raw['user_data'][u]['x'][0]
  tff = leaf_tasks.load_shakespeare(SHAKESPEARE, vocabulary='tff', gap=0)
  assert ''.join(leaf_tasks.TFF_CHARS[i] for i in tff.train.examples['x'][0]) == (
      raw['user_data'][u]['x'][0])


def tweet(text):
  return ['1', 'Mon Apr 06 22:19:45 PDT 2009', 'NO_QUERY', 'user', text]


def sent140_file(tmp_path, labels):
  a = [tweet('good day good'), tweet('bad, day!'), tweet('good'), tweet('rare words here')]
  b = [tweet('day good'), tweet('bad bad'), tweet('good day'), tweet('unseen')]
  return write(tmp_path / 'sent.json', {'a': (a, labels[:4]), 'b': (b, labels[4:])})


def test_sent140_bag_of_words_and_tokens_from_training_words(tmp_path):
  path = sent140_file(tmp_path, ['0', '4', '4', '0', '4', '0', '0', '4'])
  bow = leaf_tasks.load_sent140(path, 'bow', vocab_size=3, train_fraction=0.5, seed=1)
  train_part = leaf_preprocess.split_by_sample(leaf_files.read_leaf_json(path), 0.5,
                                               1)[0]['user_data']
  train_texts = [x[-1] for u in bow.train.client_names for x in train_part[u]['x']]
  vocab = leaf_tasks.word_vocabulary(train_texts, 3)
  assert sorted(vocab.values()) == [1, 2, 3]
  x, y = bow.train.examples['x'], bow.train.examples['y']
  assert x.shape[1:] == (3,) and set(np.unique(y)) <= {0, 1}
  for row, text in zip(x, train_texts):
    want = np.zeros(3)
    for w in leaf_tasks.words(text):
      if w in vocab:
        want[vocab[w] - 1] += 1
    np.testing.assert_array_equal(row, want)
  tok = leaf_tasks.load_sent140(path, 'tokens', vocab_size=3, seq_len=2, train_fraction=0.5,
                                seed=1)
  for row, text in zip(tok.train.examples['x'], train_texts):
    ids = [vocab.get(w, 4) for w in leaf_tasks.words(text)][:2]
    np.testing.assert_array_equal(row, ids + [0] * (2 - len(ids)))
  assert leaf_tasks.words("bad, day! it's") == ['bad', ',', 'day', '!', "it's"]


def test_sent140_features_that_would_not_fit_in_memory_are_refused_before_allocation(tmp_path):
  path = sent140_file(tmp_path, ['0', '4', '4', '0', '4', '0', '0', '4'])
  with pytest.raises(errors.DataError, match=r'tweets of vocab_size=4,000,000,000,000 word counts '
                     r'take .* GiB, more than this machine.s .* lower vocab_size'):
    leaf_tasks.load_sent140(path, 'bow', vocab_size=4 * 10**12, train_fraction=0.5)
  with pytest.raises(errors.DataError, match=r'seq_len=4,000,000,000,000 word ids'):
    leaf_tasks.load_sent140(path, 'tokens', seq_len=4 * 10**12, train_fraction=0.5)


def test_sent140_labels(tmp_path):
  np.testing.assert_array_equal(leaf_tasks.sentiment_labels(np.array(['0', '4']), 'f'), [0, 1])
  np.testing.assert_array_equal(leaf_tasks.sentiment_labels(np.array([0, 1, 1]), 'f'), [0, 1, 1])
  with pytest.raises(errors.DataError, match='0/1 or'):
    leaf_tasks.sentiment_labels(np.array(['2']), 'f')
  with pytest.raises(errors.DataError, match='mix 1 and 4'):   # both were taken as positive
    leaf_tasks.sentiment_labels(np.array([0, 1, 4]), 'f')
  split = leaf_tasks.load_sent140(sent140_file(tmp_path, [0, 1, 1, 0, 1, 0, 0, 1]),
                                  train_fraction=0.5)
  assert set(np.unique(split.test.examples['y'])) <= {0, 1}


def test_femnist_files_merge_into_images(tmp_path):
  rng = np.random.default_rng(0)
  (tmp_path / 'all').mkdir()
  for k in range(2):
    users = {f'w{k}{j}': (rng.random((4, 784)).round(3).tolist(), [k, j, 61, 0])
             for j in range(2)}
    write(tmp_path / 'all' / f'part{k}.json', users)
  split = leaf_tasks.load_femnist(tmp_path / 'all', train_fraction=0.5)
  assert split.train.num_clients == 4 and split.train.examples['x'].shape[1:] == (28, 28, 1)
  raw = leaf_files.read_leaf_json(tmp_path / 'all')
  flat = np.concatenate([raw['user_data'][u]['x'] for u in raw['users']])
  got = np.concatenate([split.train.examples['x'], split.test.examples['x']]).reshape(-1, 784)
  rows = lambda a: a[np.lexsort(a.T[::-1])]   # the same samples, in any order
  np.testing.assert_allclose(rows(got), rows(flat), rtol=1e-6)
  write(tmp_path / 'bad.json', {'u': ([[0.] * 10] * 3, [1, 2, 3])})
  with pytest.raises(errors.DataError, match='784 numbers'):
    leaf_tasks.load_femnist(tmp_path / 'bad.json')


def test_celeba_reads_images_from_the_image_directory(tmp_path):
  image = pytest.importorskip('PIL.Image')
  images = tmp_path / 'img'
  images.mkdir()
  names = [f'{i:06d}.jpg' for i in range(6)]
  for i, name in enumerate(names):
    image.new('RGB', (178, 218), (40 * i, 255 - 40 * i, 7)).save(images / name)
  path = write(tmp_path / 'celeba.json', {'c1': (names[:3], [0, 1, 1]),
                                          'c2': (names[3:], [1, 0, 0])})
  split = leaf_tasks.load_celeba(path, str(images), train_fraction=0.5)
  x = np.concatenate([split.train.examples['x'], split.test.examples['x']])
  assert x.shape == (6, 84, 84, 3) and x.dtype == np.float32
  assert 0. <= x.min() and x.max() <= 1.
  reds = sorted(np.round(x[:, 40, 40, 0] * 255).astype(int).tolist())
  assert all(abs(r - 40 * i) <= 3 for r, i in zip(reds, range(6)))   # JPEG, resized
  with pytest.raises(errors.DataError, match='--image_dir=.*no such directory') as e:
    leaf_tasks.load_celeba(path, str(tmp_path / 'missing'))
  assert '\n' not in str(e.value)
  (images / names[4]).unlink()
  with pytest.raises(errors.DataError, match='000004.jpg: image not found'):
    leaf_tasks.load_celeba(path, str(images))


def test_split_by_user_holds_out_whole_users(tmp_path):
  users = {f'u{i}': ([[float(i)]] * (i + 1), [0] * (i + 1)) for i in range(10)}
  path = write(tmp_path / 'u.json', users)
  split = leaf.load(path, 0.8, seed=3, split='user')
  assert split.train.num_clients == 8 and split.test.num_clients == 2
  assert not set(split.train.client_names) & set(split.test.client_names)
  assert sorted(split.train.client_names + split.test.client_names) == sorted(users)
  for pool in split:   # a held-out user keeps all of its samples
    for i, name in enumerate(pool.client_names):
      assert int(pool.counts[i]) == int(name[1:]) + 1
