"""LEAF's tasks as model inputs: FEMNIST images, Shakespeare characters, Sent140 words, CelebA
images. Each ``load_*`` reads LEAF JSON (``leaf.load``: files merged, LEAF's split rules) and
returns a ``FederatedSplit`` whose ``x`` a model can take.

* **FEMNIST** (Caldas et al. 2018): 784 floats per sample -> ``[28, 28, 1]`` float32; 62 classes.
* **Shakespeare**: an 80-character string -> 80 int32 character ids, the label the id of the next
  character. ``vocabulary='leaf'``: LEAF's 80 characters (``models/utils/language_utils.py``);
  ``'tff'``: TensorFlow Federated's 86. A character outside the vocabulary gets the id
  ``len(vocabulary)`` (one out-of-vocabulary id), so there are ``len(vocabulary) + 1`` classes.
  LEAF's split: each user's first 80% of samples train, then 79 skipped (``gap``), then test.
* **Sent140**: ``x = [id, date, query, user, text]``; the text is split as LEAF does
  (``re.findall(r"[\\w']+|[.,!?;]", text)``). The vocabulary is the ``vocab_size`` most frequent
  words of the *training* tweets (ties by first appearance). ``features='bow'``: word counts
  ``[vocab_size]`` float32 (the linear model); ``'tokens'``: the first ``seq_len`` word ids,
  ``1..vocab_size``, out-of-vocabulary ``vocab_size + 1``, padded with 0 (the LSTM). Labels
  ``0/1`` ints or Sentiment140's ``"0"/"4"`` (and ``0/4``) strings -> 0/1.
* **CelebA**: ``x`` names an image file in ``image_dir`` (LEAF's ``data/raw/img_align_celeba``;
  a name resolving outside it is refused, unread); images are resized to ``84 x 84`` RGB (LEAF's
  size) and scaled to ``[0, 1]``; labels 0/1.
"""
from __future__ import annotations

import collections
import os
import re
import warnings

import numpy as np

from fedjax_gel.core import memory, paths
from fedjax_gel.core.federated_data import FederatedData, FederatedSplit
from fedjax_gel.data.errors import DataError
from fedjax_gel.data.leaf import load
from fedjax_gel.data.leaf_files import PathLike
from fedjax_gel.data.leaf_preprocess import DEFAULT_SPLIT_SEED, Sampling

LEAF_CHARS = ('\n !"&\'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}')
TFF_CHARS = ('dhlptx@DHLPTX $(,048cgkoswCGKOSW[_#\'/37;?bfjnrvzBFJNRVZ"&*.26:\naeimquyAEIMQUY]!%)'
             '-159\r')
VOCABULARIES = {'leaf': LEAF_CHARS, 'tff': TFF_CHARS}
SHAKESPEARE_GAP = 79                 # sequence length 80 minus 1
# The classes of the tasks whose labels are fixed (the model has this many outputs, whatever
# labels a sample of the data holds; a label beyond them is refused).
CLASSES = {'femnist': 62, 'sent140': 2, 'celeba': 2}
CELEBA_SIZE = 84
_WORDS = re.compile(r"[\w']+|[.,!?;]")


def _map(data: FederatedData, **examples) -> FederatedData:
  return data._replace(examples=dict(data.examples, **examples))


def _map_split(split: FederatedSplit, fn) -> FederatedSplit:
  return FederatedSplit(*(_map(d, **fn(d.examples)) for d in split))


def char_ids(strings: np.ndarray, vocabulary: str) -> np.ndarray:
  """``[n]`` equal-length strings -> ``[n, L]`` int32 ids; unknown characters ->
  ``len(vocabulary)``."""
  table = np.full(0x110000, len(vocabulary), np.int32)
  table[[ord(ch) for ch in vocabulary]] = np.arange(len(vocabulary), dtype=np.int32)
  strings = np.asarray(strings)
  if strings.dtype.kind != 'U':
    raise DataError(f'expected character strings, got {strings.dtype}')
  codes = strings.reshape(-1, 1).view(np.uint32)   # one code point per column, 0 past the end
  return table[codes].reshape(len(strings), -1) if len(strings) else np.zeros((0, 0), np.int32)


def load_shakespeare(path: PathLike, vocabulary: str = 'leaf', train_fraction: float = 0.8,
                     seed: int = DEFAULT_SPLIT_SEED, split: str = 'position',
                     gap: int = SHAKESPEARE_GAP, sampling: Sampling = Sampling()
                     ) -> FederatedSplit:
  """LEAF Shakespeare as character ids (see the module docstring); ``gap`` samples are skipped
  between each user's train and test parts of a ``'position'`` split."""
  if vocabulary not in VOCABULARIES:
    raise ValueError(f'vocabulary must be one of {sorted(VOCABULARIES)}, got {vocabulary!r}')
  chars = VOCABULARIES[vocabulary]
  data = load(path, train_fraction, seed, split, gap, sampling)
  for pool in data:
    if pool.examples['x'].dtype.kind != 'U' or pool.examples['y'].dtype.kind != 'U':
      raise DataError(f'{path}: Shakespeare samples must be strings (x) and characters (y)')
  # one length over train and test: each pool's array is as wide as its longest string, so a
  # longer test sequence would be read as another input, and a short one padded silently
  lengths = np.concatenate([np.char.str_len(pool.examples['x']) for pool in data])
  if len(lengths) and (lengths.min() != lengths.max() or lengths.min() < 1):
    raise DataError(f'{path}: Shakespeare samples have {lengths.min()} to {lengths.max()} '
                    'characters; expected one length of at least 1, in train and test alike')
  labels = np.concatenate([np.char.str_len(pool.examples['y']) for pool in data])
  if len(labels) and (labels.min() != 1 or labels.max() != 1):
    raise DataError(f'{path}: Shakespeare labels must be single characters (got labels of '
                    f'{labels.min()} to {labels.max()} characters)')

  def encode(ex):
    return {'x': char_ids(ex['x'], chars), 'y': char_ids(ex['y'], chars)[:, 0]}
  return _map_split(data, encode)


def words(text: str) -> list[str]:
  """LEAF's Sent140 tokenisation (``models/utils/language_utils.py: split_line``)."""
  return _WORDS.findall(text)


def word_vocabulary(texts, size: int) -> dict[str, int]:
  """The ``size`` most frequent words (ties by first appearance) -> ids ``1..size``."""
  counts = collections.Counter()
  for t in texts:
    counts.update(words(t))
  ranked = sorted(counts, key=lambda w: -counts[w])   # stable: ties keep first appearance
  return {w: i + 1 for i, w in enumerate(ranked[:size])}


def sentiment_labels(y: np.ndarray, source) -> np.ndarray:
  """0/1 ints, or Sentiment140's 0/4 (ints or strings) -> 0/1."""
  y = np.asarray(y)
  if y.dtype.kind == 'U':
    if not set(np.unique(y)) <= {'0', '1', '4'}:
      raise DataError(f'{source}: Sent140 labels must be 0/1 or "0"/"4" (got {sorted(set(y))[:5]})')
    y = y.astype(np.int64)
  found = set(np.unique(y).tolist())
  if not found <= {0, 1, 4}:
    raise DataError(f'{source}: Sent140 labels must be 0/1 or 0/4 (got {np.unique(y)[:5]})')
  if {1, 4} <= found:   # two conventions in one file: which is positive is a guess
    raise DataError(f'{source}: Sent140 labels mix 1 and 4 (0/1 and 0/4 are two conventions; '
                    'use one)')
  return (y > 0).astype(np.int32)


def zeros(path, rows: int, cols: int, dtype, flag: str, what: str) -> np.ndarray:
  """``np.zeros((rows, cols), dtype)``: ``rows`` tweets of ``cols`` (``flag``) ``what``; a
  DataError naming ``flag`` where that would not fit in this machine's memory."""
  need = rows * cols * np.dtype(dtype).itemsize
  have = memory.host_bytes()
  if need > have:
    raise DataError(f'{path}: {rows:,} tweets of {flag}={cols:,} {what} take '
                    f'{need / 2**30:,.1f} GiB, more than this machine\'s {have / 2**30:,.1f} GiB '
                    f'of memory; lower {flag}')
  return np.zeros((rows, cols), dtype)


def load_sent140(path: PathLike, features: str = 'bow', vocab_size: int = 10_000,
                 seq_len: int = 25, train_fraction: float = 0.9,
                 seed: int = DEFAULT_SPLIT_SEED, split: str = 'sample',
                 sampling: Sampling = Sampling()) -> FederatedSplit:
  """LEAF Sent140 as bag-of-words counts or word ids (see the module docstring)."""
  if features not in ('bow', 'tokens'):
    raise ValueError(f"features must be 'bow' or 'tokens', got {features!r}")
  data = load(path, train_fraction, seed, split, sampling=sampling)

  def text(ex):
    x = ex['x']
    if x.dtype.kind != 'U':
      raise DataError(f'{path}: Sent140 samples must be [id, date, query, user, text] strings')
    return x[:, -1] if x.ndim == 2 else x

  vocab = word_vocabulary(text(data.train.examples), vocab_size)

  def encode(ex):
    ids = [[vocab.get(w, vocab_size + 1) for w in words(t)] for t in text(ex)]
    if features == 'bow':
      x = zeros(path, len(ids), vocab_size, np.float32, 'vocab_size', 'word counts')
      for row, seq in zip(x, ids):
        for j in seq:
          if j <= vocab_size:
            row[j - 1] += 1
    else:
      x = zeros(path, len(ids), seq_len, np.int32, 'seq_len', 'word ids')
      for row, seq in zip(x, ids):
        row[:min(len(seq), seq_len)] = seq[:seq_len]
    return {'x': x, 'y': sentiment_labels(ex['y'], path)}
  return _map_split(data, encode)


def load_femnist(path: PathLike, train_fraction: float = 0.9, seed: int = DEFAULT_SPLIT_SEED,
                 split: str = 'sample', sampling: Sampling = Sampling()) -> FederatedSplit:
  """LEAF FEMNIST (one file or LEAF's directory of files, merged) as ``[28, 28, 1]`` images."""
  data = load(path, train_fraction, seed, split, sampling=sampling)

  def reshape(ex):
    x = ex['x']
    if x.dtype.kind == 'U' or x.shape[1:] != (784,):
      raise DataError(f'{path}: FEMNIST samples must be 784 numbers (got shape {x.shape[1:]})')
    return {'x': x.reshape(-1, 28, 28, 1).astype(np.float32)}
  return _map_split(data, reshape)


def image_path(image_dir: str, name: str) -> tuple[str, str]:
  """The file ``name`` in ``image_dir``: its path there and its real path (links resolved, the
  one to open). Refuses a name that is not inside ``image_dir`` once links are resolved
  (``../x``, an absolute path, a link out of it, the directory itself) and a name with a NUL
  character."""
  name = str(name)   # not numpy's str_, whose repr names its type
  where = f'--image_dir={image_dir}: image name {name!r}'
  if '\0' in name:
    raise DataError(f'{where} holds a NUL character')
  path = os.path.join(image_dir, name)
  root, real = os.path.realpath(image_dir), os.path.realpath(path)
  if real == root:
    raise DataError(f'{where} names the directory itself, not an image in it')
  if os.path.commonpath([root, real]) != root:
    raise DataError(f'{where} resolves outside that directory; refused')
  return path, real


def read_image(image_dir: str, name: str, size: int = CELEBA_SIZE) -> np.ndarray:
  """One RGB image, resized to ``size x size``, float32 in ``[0, 1]``. Refuses a name outside
  ``image_dir`` (``image_path``, before reading anything), a missing file, one over Pillow's
  decompression-bomb limit (``Image.MAX_IMAGE_PIXELS``; its warning between once and twice the
  limit included) and any file Pillow cannot decode."""
  try:
    from PIL import Image  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise DataError('CelebA images need Pillow: pip install pillow') from None
  path, real = image_path(image_dir, name)
  problem = paths.not_regular(real)   # a named pipe would be waited on, /dev/zero read forever
  if problem or not os.path.exists(real):
    raise DataError(f'{path}: {problem or "image not found (CelebA images go in --image_dir)"}')
  try:
    with warnings.catch_warnings():
      warnings.simplefilter('error', Image.DecompressionBombWarning)
      with paths.open_regular(real) as f, Image.open(f) as img:
        img = img.convert('RGB').resize((size, size))
        return np.asarray(img, np.float32) / 255.
  except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
    raise DataError(f'{path}: image too large to decode safely ({e})') from None
  except Exception as e:  # pylint: disable=broad-except  # Pillow's decoders raise many kinds
    raise DataError(f'{path}: cannot be read as an image ({type(e).__name__}: {e})') from None


def load_celeba(path: PathLike, image_dir: str, train_fraction: float = 0.9,
                seed: int = DEFAULT_SPLIT_SEED, split: str = 'sample',
                size: int = CELEBA_SIZE, sampling: Sampling = Sampling()) -> FederatedSplit:
  """LEAF CelebA: image names in the JSON, pixels from ``image_dir`` (see the module docstring)."""
  if not image_dir or not os.path.isdir(image_dir):
    raise DataError(f'--image_dir={image_dir}: no such directory (CelebA needs the images, '
                    "LEAF's data/raw/img_align_celeba)")
  data = load(path, train_fraction, seed, split, sampling=sampling)

  def images(ex):
    if ex['x'].dtype.kind != 'U' or ex['x'].ndim != 1:
      raise DataError(f'{path}: CelebA samples must be image file names')
    x = np.stack([read_image(image_dir, n, size) for n in ex['x']]) if len(ex['x']) else (
        np.zeros((0, size, size, 3), np.float32))
    return {'x': x}
  return _map_split(data, images)
