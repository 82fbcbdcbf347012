"""Bad data given to launch/run.py: hostile LEAF JSON, ill-shaped features, labels that are not
class labels, train/test files that disagree, CelebA image names outside --image_dir and images
Pillow refuses. Each is one line on stderr naming the file and the problem, exit status 2, no
traceback, and nothing written in the work directory."""
from __future__ import annotations

import contextlib
import io
import json
import os
import pathlib

import jax
import numpy as np
import pytest

from fedjax_gel.data import leaf, leaf_files, leaf_tasks
from fedjax_gel.data.errors import DataError
from fedjax_gel.experiment import cli

Image = pytest.importorskip('PIL.Image')
REPO = pathlib.Path(__file__).resolve().parents[2]


def valid() -> dict:
  """Two users of four samples, two features, labels 0/1."""
  return {'users': ['a', 'b'], 'num_samples': [4, 4],
          'user_data': {u: {'x': [[float(i), 1.] for i in range(4)], 'y': [0, 1, 0, 1]}
                        for u in 'ab'}}


def changed(**fields):
  """``valid()`` with top-level fields replaced."""
  return lambda d: dict(d, **fields)


def user(u='a', **fields):
  """``valid()`` with user ``u``'s entries replaced."""
  def change(d):
    d['user_data'][u].update(fields)
    return d
  return change


def label(text):
  """``valid()`` as JSON text with user a's second label written as ``text``."""
  return lambda d: json.dumps(d).replace('"y": [0, 1, 0, 1]', f'"y": [0, {text}, 0, 1]', 1)


DEEP = '[' * 100_000 + ']' * 100_000

LEAF_CASES = {   # name: (valid() -> bad content, dict or JSON text; words of the error)
    'deep': (lambda d: json.dumps(d).replace('"x": ', f'"x": {DEEP}, "z": ', 1),
             ['nested too deeply']),
    'top_level_list': (lambda d: [d], ['expected a JSON object, got list']),
    'users_string': (changed(users='ab'), ["'users' must be a list, got str"]),
    'users_not_names': (changed(users=['a', 2]), ["'users' must be a list of user names"]),
    'num_samples_negative': (changed(num_samples=[-4, 4]), ["'num_samples'", 'none negative']),
    'num_samples_short': (changed(num_samples=[4]), ["'num_samples' has 1 entries for 2 users"]),
    'num_samples_floats': (changed(num_samples=[4., 4.]), ["'num_samples' must be a list"]),
    'user_data_list': (changed(user_data=[]), ["'user_data' must be an object, got list"]),
    'hierarchies_string': (changed(hierarchies='ab'), ["'hierarchies' must be a list, got str"]),
    'hierarchies_short': (changed(hierarchies=['h']), ["'hierarchies' has 1 entries for 2"]),
    'x_not_list': (user(x={'0': 1}), ["user 'a' needs lists for 'x' and 'y', got dict"]),
    'y_not_list': (user(y=3), ["user 'a' needs lists for 'x' and 'y'", 'and int']),
    'xy_lengths': (user(y=[0, 1]), ["user 'a' has 4 samples in x but 2 in y"]),
    'empty_rows': (lambda d: user('a', x=[[]] * 4)(user('b', x=[[]] * 4)(d)),
                   ["user 'a' has empty feature rows"]),
    'ragged_rows': (user(x=[[0., 1.], [1.], [2., 1.], [3., 1.]]), ["user 'a' has ragged"]),
    'rows_differ_by_user': (user('b', x=[[0., 1., 2.]] * 4),
                            ["user 'b' has features of shape (3,)", "user 'a' has (2,)"]),
    'huge_feature': (user(x=[[10**400, 1.]] * 4), ['too large for a float']),
    # a number written as a string was read as the number; booleans as 0/1
    'feature_string': (user(x=[[0., '0.5']] * 4), ["user 'a' has ragged or non-numeric"]),
    'feature_booleans': (user(x=[[True, False]] * 4), ['true/false among the features']),
    'feature_boolean_among_numbers': (user(x=[[0.5, True]] + [[0.5, 1.]] * 3),
                                      ["user 'a' has true/false among the features"]),
    'feature_boolean_nested': (user(x=[[[0.5], [False]]] * 4), ['true/false among the features']),
    'feature_over_float32': (user(x=[[1e300, 1.]] * 4), ["user 'a'", "beyond float32's range"]),
    'huge_digits': (label('1' * 5000), ['not valid JSON', 'digits']),
    'label_over_int32': (label(2**32 + 1), ['label 4294967297', 'from 0 to 2147483647']),
    'label_over_int64': (label(2**63), ['label 9223372036854775808', 'class labels']),
    'label_1e20': (label('1e20'), ['label 1e+20', 'class labels']),
    'label_huge_int': (label(10**400), ['label too large']),
    'label_fraction': (label(1.5), ['non-integer label 1.5']),
    'label_negative': (label(-1), ['label -1', 'class labels']),
    'label_true': (label('true'), ['neither numbers nor strings']),
    'label_word_among_numbers': (label('"cat"'), ['numbers and strings mixed', "'cat'"]),
    'user_twice': (changed(users=['a', 'a']), ["user 'a' is listed twice in 'users'"]),
}


def cli_run(*args) -> tuple[int, str, str]:
  """``launch/run.py args`` in this process: its exit status, stdout + stderr, and stderr."""
  out, err = io.StringIO(), io.StringIO()
  with contextlib.chdir(REPO), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = cli.main(['run.py', *args])
  return code, out.getvalue() + err.getvalue(), err.getvalue()


def assert_refused(proc, workdir, *words):
  """Status 2, no traceback, one line ``error: ...`` on stderr holding ``words``, and no work
  directory (or an empty one)."""
  code, output, err = proc
  assert code == 2, output
  assert 'Traceback' not in output
  assert len(err.splitlines()) == 1 and err.startswith('error: '), err
  for word in words:
    assert word in err, err
  assert not workdir.exists() or not os.listdir(workdir), os.listdir(workdir)


def run(tmp_path, data_path, *flags):
  workdir = tmp_path / 'w'
  proc = cli_run('--dataset=leaf', f'--data_path={data_path}', '--model=logistic',
                 '--num_rounds=1', f'--workdir={workdir}', *flags)
  return proc, workdir


@pytest.mark.parametrize('x', [
    [(0.5, True)] * 2, [[0.5, np.True_]] * 2, [np.array([.5, 1.]), np.array([True, False])],
    np.array([[True, False]] * 2)], ids=['tuple', 'numpy_bool', 'bool_row', 'bool_array'])
def test_truth_values_among_in_memory_features_are_refused(x):
  """Data handed over in memory (``leaf.to_federated``'s dicts): tuples, NumPy truth values and
  arrays of them too, not only JSON's true/false."""
  with pytest.raises(DataError, match="user 'a' has true/false among the features"):
    leaf_files.user_arrays(x, [0, 1], 'mem', 'a')
  leaf_files.user_arrays([(0.5, 1.)] * 2, [0, 1], 'mem', 'a')   # numbers pass


def test_valid_data_loads(tmp_path):
  """The cases' starting point is good data: only their change is refused."""
  path = tmp_path / 'good.json'
  path.write_text(json.dumps(valid()))
  split = leaf.load(path)
  assert split.train.num_clients == 2 and split.train.examples['x'].shape[1:] == (2,)


@pytest.mark.parametrize('name', LEAF_CASES)
def test_bad_leaf_file_is_one_line(tmp_path, name):
  make, words = LEAF_CASES[name]
  content = make(valid())
  path = tmp_path / f'{name}.json'
  path.write_text(content if isinstance(content, str) else json.dumps(content))
  proc, workdir = run(tmp_path, path)
  assert_refused(proc, workdir, f'{path}:', *words)


@pytest.mark.parametrize('labels, words', [
    # max label + 1 classes overflowed int32: a traceback from the memory planner
    ('[0, 2147483647, 0, 1]', ['needs labels 0, 1, ... up to 2147483646', 'label 2147483647']),
    # a one-class classifier: accuracy 1 and "rounds to target: 0" without a word
    ('[0, 0, 0, 0]', ['holds only label 0, one class']),
    # one stray label built a model of 1,000,001 outputs (minutes a round)
    ('[0, 1000000, 0, 1]', ['holds 3 distinct labels up to 1000000', 'number the labels 0..2']),
])
def test_labels_that_make_no_classifier_are_one_line(tmp_path, labels, words):
  data = valid()
  text = json.dumps(data).replace('"y": [0, 1, 0, 1]', f'"y": {labels}',
                                  2 if labels == '[0, 0, 0, 0]' else 1)
  path = tmp_path / 'labels.json'
  path.write_text(text)
  proc, workdir = run(tmp_path, path, '--clients_per_round=2')
  assert_refused(proc, workdir, '--model=logistic', *words)


def test_train_and_test_features_must_match(tmp_path):
  for part, width in (('train', 2), ('test', 3)):
    (tmp_path / 'leaf' / part).mkdir(parents=True)
    data = valid()
    for u in data['users']:
      data['user_data'][u]['x'] = [[1.] * width] * 4
    (tmp_path / 'leaf' / part / f'{part}_0.json').write_text(json.dumps(data))
  proc, workdir = run(tmp_path, tmp_path / 'leaf')
  assert_refused(proc, workdir, str(tmp_path / 'leaf' / 'test' / 'test_0.json'),
                 str(tmp_path / 'leaf' / 'train' / 'train_0.json'), 'shape (3,)', '(2,)')


# --------------------------------------------------------------------------- Shakespeare


def shakespeare(lengths, labels=None) -> dict:
  """One speaker of 10 samples of the given lengths (split 8 train / 2 test by position, no
  gap), labels one character each unless given."""
  x = ['a' * n for n in lengths]
  return {'users': ['s'], 'num_samples': [len(x)],
          'user_data': {'s': {'x': x, 'y': labels or ['b'] * len(x)}}}


SHAKESPEARE_CASES = {   # name: (the file's content; words of the error)
    # only the test part longer: its array was wider, each test row one character more
    'test_longer': (shakespeare([4] * 8 + [5] * 2), ['4 to 5 characters', 'train and test']),
    'empty_samples': (shakespeare([0] * 10), ['0 to 0 characters', 'at least 1']),
    'empty_label': (shakespeare([4] * 10, ['b'] * 9 + ['']),   # was the out-of-vocabulary class
                    ['labels must be single characters', '0 to 1 characters']),
}


@pytest.mark.parametrize('name', SHAKESPEARE_CASES)
def test_bad_shakespeare_file_is_one_line(tmp_path, name):
  content, words = SHAKESPEARE_CASES[name]
  path = tmp_path / f'{name}.json'
  path.write_text(json.dumps(content))
  workdir = tmp_path / 'w'
  proc = cli_run('--dataset=shakespeare', f'--data_path={path}', '--model=shakespeare_lstm',
                 '--split_gap=0', '--train_fraction=0.8', '--clients_per_round=1',
                 '--num_rounds=1', f'--workdir={workdir}')
  assert_refused(proc, workdir, f'{path}:', *words)


# --------------------------------------------------------------------------- fixed classes


def femnist(labels) -> dict:
  """Two writers of four blank images, with these labels (each writer's four)."""
  return {'users': ['w1', 'w2'], 'num_samples': [4, 4],
          'user_data': {u: {'x': [[0.] * 784] * 4, 'y': labels[4 * i:4 * i + 4]}
                        for i, u in enumerate(['w1', 'w2'])}}


def test_femnist_has_its_62_classes_whatever_its_sample_holds(tmp_path):
  """The model was sized by the largest label in the data: a sample without the last classes
  got fewer outputs, and a label of 70 grew the model to 71 outputs."""
  from fedjax_gel.experiment import config as config_lib, factories  # pylint: disable=g-import-not-at-top
  path = tmp_path / 'femnist.json'
  path.write_text(json.dumps(femnist([0, 1, 2, 3] * 2)))
  c = config_lib.make(dataset='femnist', data_path=str(path), model='logistic',
                      train_fraction=0.5)
  split = factories.load_split(c)
  params = factories.make_model(c, split).init(jax.random.key(0))
  assert params['Dense_0']['bias'].shape == (62,)
  path.write_text(json.dumps(femnist([0, 1, 70, 3] * 2)))
  workdir = tmp_path / 'w'
  proc = cli_run('--dataset=femnist', f'--data_path={path}', '--model=logistic',
                 '--train_fraction=0.5', '--clients_per_round=2', '--num_rounds=1',
                 f'--workdir={workdir}')
  assert_refused(proc, workdir, '--dataset=femnist has 62 classes, 0..61', 'holds label 70')


# --------------------------------------------------------------------------- CelebA


def celeba(tmp_path, last: str):
  """CelebA in ``tmp_path``: ``img/`` of four small images, and ``celeba.json`` whose fourth
  image name is ``last``; a readable ``outside/secret.png`` beside ``img/``."""
  images, outside = tmp_path / 'img', tmp_path / 'outside'
  images.mkdir()
  outside.mkdir()
  for i in range(4):
    Image.new('RGB', (20, 30), (60 * i, 0, 0)).save(images / f'{i}.png')
  Image.new('RGB', (20, 30)).save(outside / 'secret.png')
  names = ['0.png', '1.png', '2.png', last]
  path = tmp_path / 'celeba.json'
  path.write_text(json.dumps({'users': ['c1', 'c2'], 'num_samples': [2, 2], 'user_data': {
      'c1': {'x': names[:2], 'y': [0, 1]}, 'c2': {'x': names[2:], 'y': [1, 0]}}}))
  return path, images


def symlink_out(images):
  os.symlink(images.parent / 'outside' / 'secret.png', images / 'link.png')
  return 'link.png'


def corrupt(images):
  (images / 'bad.png').write_bytes(b'\x89PNG\r\n\x1a\n not an image')
  return 'bad.png'


def truncated(images):
  data = (images / '0.png').read_bytes()
  (images / 'cut.png').write_bytes(data[:len(data) // 2])
  return 'cut.png'


def big(images):
  Image.new('RGB', (40, 40)).save(images / 'big.png')   # 1600 pixels, the others 600
  return 'big.png'


CELEBA_CASES = {   # name: (img dir -> the fourth image name; Pillow's pixel limit; words)
    'parent': (lambda images: '../outside/secret.png', None, ['resolves outside']),
    'absolute': (lambda images: str(images.parent / 'outside' / 'secret.png'), None,
                 ['resolves outside']),
    'symlink': (symlink_out, None, ["'link.png' resolves outside"]),
    'directory': (lambda images: '.', None, ['names the directory itself']),
    'missing': (lambda images: 'nope.png', None, ['nope.png: image not found']),
    'corrupt': (corrupt, None, ['bad.png: cannot be read as an image']),
    'truncated': (truncated, None, ['cut.png: cannot be read as an image']),
    'bomb': (big, 700, ['big.png: image too large', 'decompression bomb']),   # over 2x
    'bomb_warning': (big, 1000, ['big.png: image too large', 'decompression bomb']),   # 1x-2x
}


@pytest.mark.parametrize('name', CELEBA_CASES)
def test_bad_celeba_image_is_one_line(tmp_path, monkeypatch, name):
  pick, limit, words = CELEBA_CASES[name]
  path, images = celeba(tmp_path, 'x')
  path.write_text(path.read_text().replace('"x"]', json.dumps(pick(images)) + ']'))
  if limit:
    monkeypatch.setattr(Image, 'MAX_IMAGE_PIXELS', limit)
  opened, open_image = [], Image.open
  monkeypatch.setattr(Image, 'open', lambda f, *a, **k: opened.append(str(f)) or open_image(
      f, *a, **k))
  workdir = tmp_path / 'w'
  proc = cli_run('--dataset=celeba', f'--data_path={path}', f'--image_dir={images}',
                 '--num_rounds=1', f'--workdir={workdir}')
  assert_refused(proc, workdir, *words)
  assert not any('secret' in f for f in opened), opened   # refused before it is read


def test_valid_celeba_loads(tmp_path):
  path, images = celeba(tmp_path, '3.png')
  split = leaf_tasks.load_celeba(path, str(images), train_fraction=0.5)
  assert split.train.examples['x'].shape == (2, 84, 84, 3)
