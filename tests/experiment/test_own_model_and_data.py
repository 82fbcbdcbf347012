"""A model and a dataset defined outside the package: the docs' example registers them, trains
them through ``experiment.run`` and the command line by name; bad registrations and bad loaders
are one-line errors."""
from __future__ import annotations

import contextlib
import io
import json

import jax.numpy as jnp
import pytest

import doc_pages
from fedjax_gel import models
from fedjax_gel.core import federated_data
from fedjax_gel.data import registry as data_registry
from fedjax_gel.experiment import cli
from fedjax_gel.experiment.config import ConfigError, make
from fedjax_gel.experiment.validation import validate
from fedjax_gel.experiment import factories


@pytest.fixture(scope='module')
def docs_example():
  """docs/extending.md's example that registers ``two_layer`` and ``blobs`` (``doc_pages``),
  run as written; both names removed from the registries afterwards."""
  assert 'register_dataset' in doc_pages.example('own_model_and_dataset')
  scope = {}
  try:
    doc_pages.run('own_model_and_dataset', scope=scope)
    yield scope
  finally:
    models.unregister_model('two_layer')
    data_registry.unregister('blobs')


def test_docs_example_trains_the_registered_model_on_the_registered_data(docs_example):
  summary = docs_example['summaries'][0]
  assert summary['status'] == 'finished'
  assert summary['final_accuracy'] > 0.75   # a plane through the origin: learnable


@pytest.mark.slow
def test_the_command_line_takes_both_names(docs_example, tmp_path):
  err = io.StringIO()
  with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
    status = cli.main(['run.py', '--dataset=blobs', '--model=two_layer', '--num_rounds=4',
                       '--eval_every=2', '--clients_per_round=5', f'--workdir={tmp_path}',
                       '--tensorboard=false', '--algorithm=fedavg', '--blob_spread=0.5',
                       '--blob_clients=12'])
  assert status == 0, err.getvalue()
  config = json.loads((tmp_path / 'config.json').read_text())
  assert (config['data']['dataset'], config['model']['name']) == ('blobs', 'two_layer')
  assert len((tmp_path / 'metrics.jsonl').read_text().splitlines()) == 3
  # the dataset's own flags (its spec's hparams), given to its loader and recorded
  assert config['data']['hparams'] == {'blob_clients': 12, 'blob_spread': 0.5}


def test_the_command_line_checks_the_dataset_s_own_flag_and_refuses_it_elsewhere(
    docs_example, tmp_path):
  """``--blob_spread`` is a flag because ``blobs``' spec has it (the run above reads it): its
  check applies, and with another dataset it is one line naming it."""
  def main(*args):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
      status = cli.main(['run.py', '--model=two_layer', f'--workdir={tmp_path}', *args])
    return status, err.getvalue()

  status, err = main('--dataset=leaf_synthetic', '--blob_spread=0.5')
  assert status == 2 and err.count('\n') == 1
  assert '--blob_spread=0.5: --dataset=leaf_synthetic does not read it' in err
  status, err = main('--dataset=blobs', '--blob_spread=-1')
  assert status == 2 and '--blob_spread must be >= 0' in err
  assert not list(tmp_path.iterdir())


def test_unknown_names_list_the_registered_ones(docs_example):
  with pytest.raises(ConfigError, match='blobs'):
    validate(make(dataset='nowhere'))
  with pytest.raises(ConfigError, match='two_layer'):
    validate(make(model='nothing'))


@pytest.mark.parametrize('register,args,words', [
    (models.register_model, ('logistic', lambda s, c: None), 'registered already'),
    (models.register_model, ('not a name', lambda s, c: None), 'identifier'),
    (models.register_model, ('fine', 3), 'callable'),
    (data_registry.register_dataset, ('femnist', lambda d: None), 'registered already'),
    (data_registry.register_dataset, ('fine', None), 'callable'),
])
def test_bad_registrations(register, args, words):
  with pytest.raises(ValueError, match=words):
    register(*args)


def pool(dim, n=4, clients=3):
  import numpy as np  # pylint: disable=g-import-not-at-top
  return federated_data.from_client_arrays(
      [{'x': np.zeros((n, dim), np.float32), 'y': np.zeros((n,), np.int32)}] * clients)


@pytest.mark.parametrize('returned,words', [
    (lambda: (pool(3), pool(3)), 'not a FederatedSplit'),
    (lambda: federated_data.FederatedSplit(pool(3), None), "test pool must be a FederatedData"),
    (lambda: federated_data.FederatedSplit(pool(3), pool(4)), 'different names or shapes'),
    (lambda: federated_data.FederatedSplit(pool(3)._replace(counts=pool(3).counts + 1), pool(3)),
     "the loader's train pool: client 2 owns rows 8..12, outside the pool's 12 rows"),
    (lambda: federated_data.FederatedSplit(
        pool(3), pool(3)._replace(examples={'x': pool(3).examples['x'].astype(object),
                                            'y': pool(3).examples['y']})),
     "the loader's test pool: feature 'x' must be an array of numbers"),
])
def test_bad_loaders_are_one_line_errors(returned, words):
  data_registry.register_dataset('broken', lambda d: returned())
  try:
    with pytest.raises(ConfigError, match='--dataset=broken: ') as e:
      factories.load_split(make(dataset='broken'))
    assert words in str(e.value) and '\n' not in str(e.value)
  finally:
    data_registry.unregister('broken')


def nan_pool():
  split = pool(3)
  x = split.examples['x'].copy()
  x[4, 1] = float('nan')
  return split._replace(examples={**split.examples, 'x': x})


def failing_loader():
  raise RuntimeError('the bucket is gone\nsecond line')


@pytest.mark.parametrize('loader,words', [
    (lambda d: failing_loader(), r"its loader failed at .*test_own_model_and_data.py:\d+: "
     'RuntimeError: the bucket is gone$'),
    (lambda d: federated_data.FederatedSplit(pool(3), nan_pool()),
     "the loader's test pool holds a feature 'x' that is not finite"),
], ids=['loader_raises', 'nan_feature'])
def test_a_loader_that_fails_or_gives_bad_values_is_one_line(loader, words):
  """A loader's own exception is one line saying where it was raised; NaN features, which the
  LEAF loaders refuse, are refused here too (the runs trained to NaN before)."""
  from fedjax_gel.data.errors import DataError  # pylint: disable=g-import-not-at-top
  data_registry.register_dataset('failing', loader)
  try:
    with pytest.raises(DataError, match=f'^--dataset=failing: {words}'):
      factories.load_split(make(dataset='failing'))
  finally:
    data_registry.unregister('failing')


@pytest.mark.parametrize('build,words', [
    (lambda shape, classes: None, r"failed at .*: TypeError: get_model: 'probe' was built as a "
     'NoneType, not a fedjax_gel Model'),
    (lambda shape, classes: 1 / 0, 'failed at .*: ZeroDivisionError: division by zero'),
    (lambda shape, classes: models.from_linen('probe', models.LogisticRegression(classes), shape,
                                              jnp.float32, classes, task=models.REGRESSION),
     'is a regression model; blobs holds integer labels, not float targets'),
], ids=['not_a_model', 'build_raises', 'regression_on_labels'])
def test_a_registered_model_that_cannot_serve_the_data_is_one_line(docs_example, build, words):
  models.register_model('probe', build)
  try:
    c = make(dataset='blobs', model='probe')
    with pytest.raises(ConfigError, match=f'^--model=probe.*{words}'):
      factories.make_model(c, factories.load_split(c))
  finally:
    models.unregister_model('probe')


def test_a_loader_may_hold_out_other_clients_for_testing():
  """As ``--leaf_split=user`` does: the test pool's clients are not the training ones."""
  data_registry.register_dataset(
      'held_out', lambda d: federated_data.FederatedSplit(pool(3), pool(3, clients=2)))
  try:
    split = factories.load_split(make(dataset='held_out'))
    assert (split.train.num_clients, split.test.num_clients) == (3, 2)
  finally:
    data_registry.unregister('held_out')


def test_integer_pixels_for_a_model_of_numbers_say_to_cast_them():
  """uint8 images were refused as "token ids; use one of shakespeare_lstm, ...": the fix is a
  cast, which the line now says."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  images = federated_data.from_client_arrays(
      [{'x': np.zeros((4, 3), np.uint8), 'y': np.zeros((4,), np.int32)}] * 3)
  with pytest.raises(ConfigError, match=r"holds integer features \(uint8: token ids\); use one "
                     r"of .*_lstm \(images of integer pixels: give the loader's x as float32, "
                     r'e.g. x / 255\)'):
    factories.make_model(make(model='logistic'), federated_data.FederatedSplit(images, images))


def test_column_labels_for_a_classifier_say_to_flatten_them():
  """A loader's labels of shape ``[n, 1]`` failed inside the loss with a traceback."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  column = federated_data.from_client_arrays(
      [{'x': np.zeros((4, 3), np.float32), 'y': np.arange(4, dtype=np.int32)[:, None] % 2}] * 3)
  with pytest.raises(ConfigError, match=r'^--model=logistic is a classifier, which takes one '
                     r'integer label per example; leaf_synthetic holds labels of shape \(1,\) '
                     r'per example \(flatten them: y.reshape\(-1\)\)$'):
    factories.make_model(make(model='logistic'), federated_data.FederatedSplit(column, column))
