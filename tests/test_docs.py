"""The documentation, README.md and docs/: its Python examples run as written and compute what
the text says, its ``launch/run.py`` commands name only the launcher's flags, its links lead to
files that exist, and the site builds with ``mkdocs build --strict``.

The examples are found by name (``<!-- example: NAME -->`` before the block; ``doc_pages``).
"""
import importlib
import importlib.util
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl import flags

import doc_pages
import test_docstrings
from fedjax_gel.experiment import cli, parsing

REPO = doc_pages.REPO
run = doc_pages.run
example = doc_pages.example


@pytest.mark.slow
def test_engine_example_trains():
  scope = run('engine')
  assert scope['metrics'].grad_computations > 0
  assert 0 < float(scope['metrics'].train_loss) < 1.0   # from ln(5) = 1.61 at the start


@pytest.mark.slow
def test_budgeted_learner_fits_better_with_guesses_than_without():
  code = example('budgeted_learner')
  assert 'guesses = 2' in code
  scope = run('budgeted_learner')
  without = run('budgeted_learner', code.replace('guesses = 2', 'guesses = 0'))
  loss = scope['loss']
  start = float(loss(without['model'].init(jax.random.key(1), without['x'])))
  assert float(loss(scope['params'])) < 0.8 * float(loss(without['params'])) < 0.8 * start


def test_fedopt_example_moves_the_server_model_to_the_target():
  scope = run('fedopt_server')
  start = float(jnp.linalg.norm(scope['target']))
  assert float(jnp.linalg.norm(scope['x'] - scope['target'])) < 0.5 * start


def test_fedgbo_example_reaches_the_mean_client_model_and_tracks_statistics():
  scope = run('fedgbo_client_and_server')
  np.testing.assert_allclose(scope['x']['w'], 1. - scope['delta']['w'], rtol=1e-6)
  # Both clients move from 1 towards their targets (mean [0, 1, 2]); m is no longer zero.
  assert float(scope['x']['w'][0]) < 1. < float(scope['x']['w'][2])
  assert float(jnp.abs(scope['server_state'].stats.m['w']).min()) > 0


@pytest.mark.slow
def test_stateful_example_keeps_a_row_per_client():
  """The SCAFFOLD block continues the engine example's session (its data, model and keys)."""
  scope = run('engine', example('engine').replace('range(100)', 'range(1)'))
  run('scaffold', scope=scope)
  rows = scope['state'].clients['Dense_0']['kernel']
  touched = int((abs(rows).sum(axis=(1, 2)) > 0).sum())
  assert 0 < touched <= 60   # the clients of three rounds of 20 wrote their c_i
  assert int(scope['metrics'].num_clients) == 20


@pytest.mark.slow
def test_mesh_example_builds_a_round_that_trains_on_the_placed_pool():
  """The mesh block continues the engine example; its round runs on the pool and state it
  placed (one device here: no mesh, the same code path as the engine example's)."""
  scope = run('engine', example('engine').replace('range(100)', 'range(1)'))
  run('mesh', scope=scope)
  fg, root, spec, train = scope['fg'], scope['root'], scope['spec'], scope['train']
  state, metrics = scope['round_fn'](scope['state'], fg.sample_cohort(root, 0, train.counts, spec),
                                     train, root, jnp.int32(0))
  assert int(metrics.num_clients) == 20 and np.isfinite(float(metrics.train_loss))
  assert jax.tree.structure(state) == jax.tree.structure(scope['state'])


@pytest.mark.slow
def test_experiment_example_runs_two_seeds_as_one_program():
  scope = run('experiment_callback')
  summaries, best = scope['summaries'], scope['best'].best
  assert [s['seed'] for s in summaries] == [0, 1]
  assert all(s['runs_in_program'] == 2 and s['status'] == 'finished' for s in summaries)
  assert best == {('gel', s['seed']): s['best_accuracy'] for s in summaries}


def test_registry_example_runs_the_registered_algorithm():
  from fedjax_gel.algorithms import registry   # pylint: disable=g-import-not-at-top
  try:
    scope = run('register_algorithm')
  finally:
    registry.unregister('damped_fedavg')
  (summary,) = scope['summaries']
  assert summary['algorithm'] == 'damped_fedavg' and summary['status'] == 'finished'
  assert scope['config'].algorithm.hparams.damping == 0.8


@pytest.mark.slow
def test_own_dataset_and_model_example_registers_them_by_spec():
  """The block registers a dataset with a setting of its own and a model by spec, and trains
  them (two rounds here: test_own_model_and_data trains it as written)."""
  from fedjax_gel import models   # pylint: disable=g-import-not-at-top
  from fedjax_gel.data import registry as data_registry   # pylint: disable=g-import-not-at-top
  code = example('own_model_and_dataset')
  try:
    scope = run('own_model_and_dataset', code.replace('num_rounds=30', 'num_rounds=2').replace(
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


# The examples a test of their own runs and checks (the batch-norm one in
# tests/experiment/test_model_options.py); every other Python block runs in
# test_every_other_python_block_runs.
CHECKED = ('engine', 'budgeted_learner', 'fedopt_server', 'fedgbo_client_and_server', 'scaffold',
           'mesh', 'experiment_callback', 'register_algorithm', 'own_model_and_dataset',
           'batch_norm_and_dropout')
OTHERS = [b for b in doc_pages.blocks('python') if b.name not in CHECKED]


def test_the_checked_examples_are_on_the_pages_and_their_copies_agree():
  found = doc_pages.examples()
  assert set(CHECKED) <= set(found), set(CHECKED) - set(found)
  for block in doc_pages.blocks('python'):
    if block.name is not None:
      assert block.code == found[block.name].code, (
          f'{block.where}: the example {block.name!r} differs from its copy at '
          f'{found[block.name].where}')
      assert block.after is None or block.after in found, block.where


def test_every_other_python_block_runs():
  """Each in a fresh session (after the example it continues); a traceback names its page and
  line. (Every block is a checked example today: this runs the ones added without a test.)"""
  for block in OTHERS:
    scope = {}
    if block.after is not None:
      run(block.after, scope=scope)
    exec(compile(block.code, block.where, 'exec'), scope)   # pylint: disable=exec-used


def test_quick_start_names_the_shipped_files():
  text = (REPO / 'README.md').read_text()
  assert ("pip install -e '.[plot]' && python launch/run.py "
          '--flagfile=launch/configs/quickstart.flags') in text
  assert "pip install -e '.[test]' && pytest" in text
  assert (REPO / 'launch/configs/quickstart.flags').exists()


COMMANDS = doc_pages.launcher_commands()


def test_the_pages_show_launcher_commands():
  pages = {where.split(':')[0] for where, _ in COMMANDS}
  assert {'README.md', 'docs/running.md', 'docs/operations.md', 'docs/results.md'} <= pages


@pytest.mark.parametrize('where, args', COMMANDS, ids=[w for w, _ in COMMANDS])
def test_every_launcher_command_names_only_the_launchers_flags(where, args, monkeypatch):
  """Parsed as ``launch/run.py`` parses them (absl, with the flags of the config's sections and
  the registered specs), from the repository root: an unknown flag, a value of the wrong type
  or a flag file that is not there is an error."""
  monkeypatch.chdir(REPO)
  values = flags.FlagValues()
  cli.define_flags(values)
  assert parsing.parse(['run.py', *args], values) == ['run.py'], where


@pytest.mark.parametrize('page', doc_pages.pages())
def test_links_lead_to_files_that_exist(page):
  """mkdocs checks the site's links (test_the_site_builds_strictly); README.md is not a page of
  the site, so its links to the docs and the repository's files are checked here, as are the
  docs' (in case a link leaves the site)."""
  missing = [t for t in doc_pages.relative_links(page) if not doc_pages.link_exists(page, t)]
  assert not missing, f'{page} links to missing files: {missing}'


def test_the_dataset_and_model_tables_are_the_registries():
  from fedjax_gel.data import registry as data_registry   # pylint: disable=g-import-not-at-top
  from fedjax_gel.models import registry as model_registry   # pylint: disable=g-import-not-at-top
  text = (REPO / 'docs' / 'user-guide.md').read_text()
  assert data_registry.markdown_table() in text
  assert model_registry.markdown_table() in text


@pytest.mark.skipif(importlib.util.find_spec('mkdocs') is None
                    or importlib.util.find_spec('mkdocstrings_handlers') is None,
                    reason="mkdocs and mkdocstrings are not installed (pip install -e '.[docs]')")
@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path):
  """Every page, link and anchor resolves and every API page renders from the docstrings
  (mkdocs.yml's validation: a warning fails a strict build)."""
  site = tmp_path / 'site'
  proc = subprocess.run([sys.executable, '-m', 'mkdocs', 'build', '--strict', '--quiet',
                         '--site-dir', str(site)], cwd=REPO, capture_output=True, text=True,
                        check=False, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert (site / 'index.html').exists() and (site / 'api' / 'optim' / 'index.html').exists()
  assert 'fedjax_gel.optim.gel_sgdm' in (site / 'api' / 'optim' / 'index.html').read_text()
  # Every public name has its entry on its package's page (the top-level package's names on
  # the pages of the packages that define them): a builder named as its module is reached
  # through that module (``fedjax_gel.algorithms.fedavg.fedavg``), as griffe sees the module.
  missing = []
  for module in test_docstrings.MODULES[1:]:
    page = (site / 'api' / module.split('.')[1] / 'index.html').read_text()
    anchors = set(re.findall(r'id="([^"]+)"', page))
    missing += [f'{module}.{n}' for n in importlib.import_module(module).__all__
                if not {f'{module}.{n}', f'{module}.{n}.{n}'} & anchors]
  assert not missing, f'the API reference does not show {missing}'
