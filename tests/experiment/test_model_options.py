"""Models with dropout and BatchNorm from the command line: ``--dropout``, ``--model_state``,
a registered model taking them, a resumed run equal to the uninterrupted one (the checkpoint
carries the statistics), and one-line refusals."""
from __future__ import annotations

import json

import flax.linen as nn
import jax.numpy as jnp
import pytest

import doc_pages
import helpers
from fedjax_gel import models


class NormedMLP(nn.Module):
  num_classes: int
  dropout: float = 0.

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.BatchNorm(use_running_average=not train)(nn.Dense(16)(x))
    x = nn.Dropout(self.dropout, deterministic=not train)(nn.relu(x))
    return nn.Dense(self.num_classes)(x)


def normed_mlp(input_shape, num_classes, **options):   # takes --dropout through **options
  return models.from_linen('normed_mlp', NormedMLP(num_classes, **options), input_shape,
                           jnp.float32, num_classes)


@pytest.fixture(scope='module', autouse=True)
def registered():
  models.register_model('normed_mlp', normed_mlp)
  yield
  models.unregister_model('normed_mlp')


def command(data, workdir, *extra):
  return ['--dataset=leaf', f'--data_path={data}', '--num_rounds=6', '--eval_every=2',
          '--checkpoint_every=2', '--clients_per_round=3', '--budget_range=1,3',
          '--batch_size=4', '--noplots', '--tensorboard=false', '--algorithm=fedavg',
          f'--workdir={workdir}', *extra]


def records(workdir):
  lines = (workdir / 'metrics.jsonl').read_text().splitlines()
  return [{k: v for k, v in json.loads(line).items() if k != 'elapsed_s'} for line in lines]


@pytest.mark.parametrize('policy', ['average', 'local'])
@pytest.mark.slow
def test_a_batch_norm_model_with_dropout_resumes_to_the_uninterrupted_run(tiny_leaf_file,
                                                                           tmp_path, policy):
  flags = ('--model=normed_mlp', '--dropout=0.5', f'--model_state={policy}')
  whole = helpers.cli_run(*command(tiny_leaf_file, tmp_path / 'whole', *flags))
  assert whole.returncode == 0, whole.stderr
  short = helpers.cli_run(*command(tiny_leaf_file, tmp_path / 'short', *flags,
                                   '--num_rounds=2'))
  assert short.returncode == 0, short.stderr
  extended = helpers.cli_run(*command(tiny_leaf_file, tmp_path / 'short', *flags))
  assert extended.returncode == 0, extended.stderr
  assert records(tmp_path / 'short') == records(tmp_path / 'whole')
  assert ((tmp_path / 'short' / 'model.msgpack').read_bytes() ==
          (tmp_path / 'whole' / 'model.msgpack').read_bytes())
  config = json.loads((tmp_path / 'whole' / 'config.json').read_text())
  assert config['model'] == {'name': 'normed_mlp', 'dropout': 0.5, 'batch_norm': False,
                             'model_state': policy}


@pytest.mark.slow
def test_dropout_changes_the_run(tiny_leaf_file, tmp_path):
  runs = {}
  for rate in ('0', '0.5'):
    proc = helpers.cli_run(*command(tiny_leaf_file, tmp_path / rate, '--model=mlp',
                                    f'--dropout={rate}', '--client_lr=0.5'))
    assert proc.returncode == 0, proc.stderr
    runs[rate] = records(tmp_path / rate)
  assert runs['0'][0]['test_loss'] == runs['0.5'][0]['test_loss']   # the same initial model
  assert runs['0'][-1]['train_loss'] != runs['0.5'][-1]['train_loss']


@pytest.mark.parametrize('flags, names', [
    (('--model=normed_mlp',), ("'batch_stats'", '--model_state=average', 'local')),
    (('--model=logistic', '--dropout=0.5'), ('--dropout', 'logistic')),
    (('--model=mlp', '--model_state=average'), ('--model_state=average', 'no mutable')),
    (('--model=mlp', '--batch_norm'), ('--batch_norm', 'mlp')),
    (('--model=mlp', '--dropout=1'), ('--dropout',)),
    (('--model=normed_mlp', '--model_state=average', '--budget_unit=epochs'),
     ("'batch_stats'", '--budget_unit=epochs')),
    (('--model=normed_mlp', '--model_state=local', '--algorithm=cluster_fedvarp',
      '--fedvarp_clusters=2'), ('--model_state=local', 'cluster')),
])
def test_bad_model_flags_are_one_line(tiny_leaf_file, tmp_path, flags, names):
  proc = helpers.cli_run(*command(tiny_leaf_file, tmp_path, *flags))
  helpers.assert_one_line_error(proc, *names)
  assert not (tmp_path / 'metrics.jsonl').exists()


@pytest.mark.slow
def test_the_docs_example_trains_a_batch_norm_model_with_dropout():
  """docs/extending.md's example (``doc_pages``), in 4 rounds."""
  block = doc_pages.example('batch_norm_and_dropout')
  assert "register_model('normed_net'" in block
  try:
    scope = doc_pages.run('batch_norm_and_dropout', block.replace(
        'num_rounds=20', 'num_rounds=4').replace('eval_every=10', 'eval_every=2'))
  finally:
    models.unregister_model('normed_net')
  summary = scope['summaries'][0]
  assert summary['status'] == 'finished' and summary['rounds'] == 4
