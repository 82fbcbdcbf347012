"""The README's Python example runs as written and trains the model."""
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np

README = pathlib.Path(__file__).resolve().parents[1] / 'README.md'


def python_blocks():
  return re.findall(r'```python\n(.*?)```', README.read_text(), re.S)


def run_block(code):
  scope = {}
  exec(compile(code, 'README.md', 'exec'), scope)   # pylint: disable=exec-used
  return scope


def test_readme_engine_example_trains():
  scope = run_block(python_blocks()[0])
  assert scope['metrics'].grad_computations > 0
  assert 0 < float(scope['metrics'].train_loss) < 1.0   # from ln(5) = 1.61 at the start


def test_readme_budgeted_learner_fits_better_with_guesses_than_without():
  code = python_blocks()[1]
  assert 'guesses = 2' in code
  scope = run_block(code)
  without = run_block(code.replace('guesses = 2', 'guesses = 0'))
  loss = scope['loss']
  start = float(loss(without['model'].init(jax.random.key(1), without['x'])))
  assert float(loss(scope['params'])) < 0.8 * float(loss(without['params'])) < 0.8 * start


def test_readme_fedopt_example_moves_the_server_model_to_the_target():
  scope = run_block(python_blocks()[2])
  start = float(jnp.linalg.norm(scope['target']))
  assert float(jnp.linalg.norm(scope['x'] - scope['target'])) < 0.5 * start


def test_readme_fedgbo_example_reaches_the_mean_client_model_and_tracks_statistics():
  scope = run_block(python_blocks()[3])
  np.testing.assert_allclose(scope['x']['w'], 1. - scope['delta']['w'], rtol=1e-6)
  # Both clients move from 1 towards their targets (mean [0, 1, 2]); m is no longer zero.
  assert float(scope['x']['w'][0]) < 1. < float(scope['x']['w'][2])
  assert float(jnp.abs(scope['server_state'].stats.m['w']).min()) > 0


def test_readme_quick_start_names_the_shipped_files():
  text = README.read_text()
  assert ("pip install -e '.[plot]' && python launch/run.py "
          '--flagfile=launch/configs/quickstart.flags') in text
  assert "pip install -e '.[test]' && pytest" in text
  assert (README.parent / 'launch/configs/quickstart.flags').exists()


def test_readme_stateful_example_keeps_a_row_per_client():
  """The SCAFFOLD block continues the engine example's session (its data, model and keys)."""
  scope = run_block(python_blocks()[0].replace('range(100)', 'range(1)'))
  exec(compile(python_blocks()[4], 'README.md', 'exec'), scope)   # pylint: disable=exec-used
  rows = scope['state'].clients['Dense_0']['kernel']
  touched = int((abs(rows).sum(axis=(1, 2)) > 0).sum())
  assert 0 < touched <= 60   # the clients of three rounds of 20 wrote their c_i
  assert int(scope['metrics'].num_clients) == 20


def test_readme_experiment_example_runs_two_seeds_as_one_program():
  (code,) = [b for b in python_blocks() if 'experiment.run(config, workdir' in b]
  scope = run_block(code)
  summaries, best = scope['summaries'], scope['best'].best
  assert [s['seed'] for s in summaries] == [0, 1]
  assert all(s['runs_in_program'] == 2 and s['status'] == 'finished' for s in summaries)
  assert best == {('gel', s['seed']): s['best_accuracy'] for s in summaries}


def test_readme_registry_example_runs_the_registered_algorithm():
  from fedjax_gel.algorithms import registry   # pylint: disable=g-import-not-at-top
  (code,) = [b for b in python_blocks() if 'registry.register(' in b]
  try:
    scope = run_block(code)
  finally:
    registry.unregister('damped_fedavg')
  (summary,) = scope['summaries']
  assert summary['algorithm'] == 'damped_fedavg' and summary['status'] == 'finished'
  assert scope['config'].algorithm.hparams.damping == 0.8


def test_readme_dataset_and_model_tables_are_the_registries():
  from fedjax_gel.data import registry as data_registry   # pylint: disable=g-import-not-at-top
  from fedjax_gel.models import registry as model_registry   # pylint: disable=g-import-not-at-top
  text = README.read_text()
  assert data_registry.markdown_table() in text
  assert model_registry.markdown_table() in text


def test_readme_own_dataset_and_model_example_registers_them_by_spec():
  """The block registers a dataset with a setting of its own and a model by spec, and trains
  them (two rounds here: test_own_model_and_data trains it as written)."""
  from fedjax_gel import models   # pylint: disable=g-import-not-at-top
  from fedjax_gel.data import registry as data_registry   # pylint: disable=g-import-not-at-top
  (code,) = [b for b in python_blocks() if 'register_dataset(' in b]
  try:
    scope = run_block(code.replace('num_rounds=30', 'num_rounds=2').replace(
        'eval_every=10', 'eval_every=2'))
    assert data_registry.get('blobs').hparams is scope['BlobsHparams']
    assert '| `blobs` |' in data_registry.markdown_table()
  finally:
    models.unregister_model('two_layer')
    data_registry.unregister('blobs')
  (summary,) = scope['summaries']
  assert summary['status'] == 'finished' and summary['rounds'] == 2
  assert scope['config'].data.hparams.blob_spread == 1.0
  assert scope['config'].flags()['blob_clients'] == 30
