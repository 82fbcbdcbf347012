"""Tasks (``models.tasks``): losses and metrics against hand-computed values, a regression model
trained by the engine against a plain SGD loop, the experiment's refusal of a task without
accuracy, and a next-token model trained from the command line."""
import contextlib
import io
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_gel import algorithms, models
from fedjax_gel.core import evaluation
from fedjax_gel.core import federated_data as fd
from fedjax_gel.core import keys
from fedjax_gel.core.round import build_round
from fedjax_gel.core.sampling import Cohort, CohortSpec
from fedjax_gel.core.shuffle import cycled_permutation
from fedjax_gel.data import registry as data_registry
from fedjax_gel.experiment import cli
from fedjax_gel.models import tasks


def test_regression_by_hand():
  out = jnp.array([[1., 2.], [3., 5.]])
  y = jnp.array([[1., 1.], [3., 3.]])
  # per example: mean over the 2 outputs of the squared error: 0.5 and 2
  assert float(tasks.batch_mean(tasks.REGRESSION.loss, out, {'y': y})) == 1.25
  assert float(tasks.batch_mean(tasks.REGRESSION.loss, out,
                                {'y': y, 'mask': jnp.array([True, False])})) == 0.5


@pytest.mark.slow
def test_next_token_masks_padding_by_hand():
  # 2 sequences of 3 tokens over a vocabulary of 3; token 0 is padding
  logits = jnp.log(jnp.array([
      [[.1, .7, .2], [.1, .2, .7], [.8, .1, .1]],
      [[.2, .3, .5], [.6, .3, .1], [.3, .3, .4]]]))
  y = jnp.array([[1, 1, 0], [2, 0, 0]])   # three real tokens: right, wrong, right
  assert float(tasks.batch_mean(tasks.NEXT_TOKEN.metrics['accuracy'], logits, {'y': y})) == (
      pytest.approx(2 / 3))
  expect = -(np.log(.7) + np.log(.2) + np.log(.5)) / 3   # the mean over real tokens
  np.testing.assert_allclose(tasks.batch_mean(tasks.NEXT_TOKEN.loss, logits, {'y': y}), expect,
                             rtol=1e-6)


@pytest.mark.slow
def test_classification_task_loss_is_the_cross_entropy_by_hand(model, data):
  params = model.init(jax.random.key(0))
  batch = {k: v[:7] for k, v in data.examples.items()}
  logits = np.asarray(model.apply(params, batch['x']), np.float64)
  shifted = logits - logits.max(1, keepdims=True)
  ce = np.log(np.exp(shifted).sum(1)) - shifted[np.arange(7), batch['y']]   # -log softmax_y
  mask = np.array([1, 0, 1, 1, 0, 1, 1], np.float32)
  for loss in (models.cross_entropy_loss(model), models.task_loss(model)):
    np.testing.assert_allclose(loss(params, batch), ce.mean(), rtol=1e-5)
    np.testing.assert_allclose(loss(params, {**batch, 'mask': mask}), ce[mask > 0].mean(),
                               rtol=1e-5)


class Linear(nn.Module):
  @nn.compact
  def __call__(self, x):
    return nn.Dense(2)(x)


def regression_pool():
  rng = np.random.default_rng(0)
  w = rng.normal(size=(3, 2))
  clients = []
  for n in (6, 9, 4):
    x = rng.normal(size=(n, 3)).astype(np.float32)
    clients.append({'x': x, 'y': (x @ w).astype(np.float32)})
  return fd.from_client_arrays(clients)


@pytest.mark.slow
def test_a_regression_model_in_the_engine_equals_a_plain_sgd_loop():
  host = regression_pool()
  data = fd.to_device(host)
  model = models.from_linen('linear', Linear(), (3,), jnp.float32, 0, task=models.REGRESSION)
  loss = models.task_loss(model)
  params = model.init(jax.random.key(1))
  alg = algorithms.fedavg(loss, optax.sgd(0.1))
  tau, batch, cid = 4, 2, 1
  cohort = Cohort(jnp.array([cid], jnp.int32), jnp.array([tau], jnp.int32),
                  jnp.ones((1,), jnp.float32), CohortSpec(1, (1, tau), batch))
  state, _ = build_round(alg, chunk_size=1)(alg.server_init(params), cohort, data,
                                            keys.root_key(0), jnp.int32(0))
  ck = keys.client_key(keys.round_key(keys.root_key(0), 0, keys.CLIENT), cid, 0)
  order = np.asarray(cycled_permutation(jax.random.split(ck)[0], 9, tau * batch))
  y = params
  for k in range(tau):   # the engine's documented order, by hand
    rows = int(host.offsets[cid]) + order[k * batch:(k + 1) * batch]
    b = {name: np.asarray(v)[rows] for name, v in host.examples.items()}
    y = jax.tree.map(lambda p, g: p - 0.1 * g, y, jax.grad(loss)(y, b))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               state.params, y)
  out = evaluation.build_evaluate(model.apply, model.task)(y, evaluation.make_eval_pool(host))
  pred = model.apply(y, np.asarray(host.examples['x']))
  mse = np.mean(np.mean((np.asarray(pred) - np.asarray(host.examples['y'])) ** 2, axis=1))
  np.testing.assert_allclose(out['mse'], mse, rtol=1e-5)
  np.testing.assert_allclose(out['loss'], mse, rtol=1e-5)
  # Per client: the sum of its examples' squared errors and their count (the main metric's).
  errors = np.mean((np.asarray(pred) - np.asarray(host.examples['y'])) ** 2, axis=1)
  np.testing.assert_array_equal(out['client_weight'], host.counts)
  for c, (start, n) in enumerate(zip(host.offsets, host.counts)):
    np.testing.assert_allclose(out['client_sum'][c], errors[start:start + n].sum(), rtol=1e-5)


def regression_split(data):
  """24 clients of ``y = x W`` (3 features, 2 targets) with their own input scale."""
  rng = np.random.default_rng(data.split_seed)
  w = rng.normal(size=(3, 2))
  clients = []
  for i in range(24):
    x = (rng.normal(size=(15, 3)) * (0.5 + i / 24)).astype(np.float32)
    clients.append({'x': x, 'y': (x @ w).astype(np.float32)})
  part = lambda s: fd.from_client_arrays([{k: v[s] for k, v in c.items()} for c in clients])
  return fd.FederatedSplit(part(slice(0, 12)), part(slice(12, None)))


@pytest.mark.slow
def test_a_regression_model_runs_from_the_command_line(tmp_path):
  """Records, summaries, grids and reports follow the task's main metric (mse, lower is
  better): best is the minimum, the target is reached at or below it."""
  build = lambda shape, outputs: models.from_linen('reg', Linear(), shape, jnp.float32, outputs,
                                                   task=models.REGRESSION)
  models.register_model('regression_probe', build)
  data_registry.register_dataset('regression_probe', regression_split)
  common = ['run.py', '--dataset=regression_probe', '--model=regression_probe',
            '--algorithm=fedavg', '--client_lr=0.05', '--num_rounds=20', '--eval_every=2',
            '--clients_per_round=4', '--batch_size=5', '--budget_range=2,3', '--target=0.05',
            '--tensorboard=false']
  try:
    with contextlib.redirect_stderr(io.StringIO()) as err, contextlib.redirect_stdout(
        io.StringIO()) as out:
      status = cli.main(common + [f'--workdir={tmp_path / "run"}'])
      assert status == 0, err.getvalue()
      grid_args = common + ['--client_lr_grid=0.01,0.05', '--server_lr_grid=0.5,1',
                            f'--workdir={tmp_path / "grid"}']
      status = cli.main(grid_args)
      assert status == 0, err.getvalue()
      grid_json = (tmp_path / 'grid' / 'grid.json').read_text()
      (tmp_path / 'grid' / 'grid.json').write_text(grid_json.replace('"diverged": false',
                                                                     '"diverged": true'))
      err.seek(0)
      err.truncate()
      assert cli.main(grid_args) == 2   # a finished grid whose results changed: one line
      assert 'grid.json changed since the run finished' in err.getvalue()
      (tmp_path / 'grid' / 'grid.json').write_text(grid_json)
      err.seek(0)
      err.truncate()   # a target no mean squared error reaches: one line, nothing written
      assert cli.main(common + ['--target=-1', f'--workdir={tmp_path / "never"}']) == 2
      assert err.getvalue().startswith('error: --target must be >= 0 (got -1): '
                                       '--model=regression_probe is scored by its mean squared')
      assert not (tmp_path / 'never').exists()
  finally:
    models.unregister_model('regression_probe')
    data_registry.unregister('regression_probe')
  records = [json.loads(line)
             for line in (tmp_path / 'run' / 'metrics.jsonl').read_text().splitlines()]
  mse = [r['test_mse'] for r in records]
  assert mse[-1] < 0.5 * mse[0]
  assert [r['best_test_mse'] for r in records] == list(np.minimum.accumulate(mse))
  assert all(r['client_mse_p10'] <= r['client_mse_mean'] <= r['client_mse_p90']
             for r in records)
  summary = json.loads((tmp_path / 'run' / 'summary.json').read_text())
  assert summary['metric'] == {'name': 'mse', 'higher_is_better': False}
  assert (summary['final_mse'], summary['best_mse'], summary['target_mse']) == (
      mse[-1], min(mse), 0.05)
  assert summary['rounds_to_target'] == next((r['round'] for r in records
                                              if r['test_mse'] <= 0.05), None)
  assert 'final test mse' in out.getvalue() and 'test accuracy' not in out.getvalue()
  assert 'mean best mse' in (tmp_path / 'run' / 'report.md').read_text()
  # The grid: its summary has a run's schema, of the cell with the lowest best mse.
  grid = json.loads((tmp_path / 'grid' / 'grid.json').read_text())
  grid_summary = json.loads((tmp_path / 'grid' / 'summary.json').read_text())
  assert set(grid_summary) == set(summary)
  assert summary['grid'] is None and grid_summary['grid']['cells'] == 4
  best = min(grid['cells'], key=lambda c: c['best_mse'])
  assert (grid_summary['client_lr'], grid_summary['server_lr'], grid_summary['best_mse']) == (
      best['client_lr'], best['server_lr'], best['best_mse'])


class Bigram(nn.Module):
  """Next-token logits from the current token alone: ``[B, L] -> [B, L, V]``."""
  vocab: int

  @nn.compact
  def __call__(self, tokens):
    return nn.Embed(self.vocab, self.vocab)(tokens)


def token_split(data):
  """12 clients of sequences in which token t (1..5) is always followed by t % 5 + 1; the
  sequences end in padding (0), which the next-token task leaves out."""
  rng = np.random.default_rng(data.split_seed)
  clients = []
  for _ in range(12):
    start = rng.integers(1, 6, size=(20, 1))
    seq = (start + np.arange(9)[None, :] - 1) % 5 + 1
    seq[:, 7:] = 0
    clients.append({'x': seq[:, :8].astype(np.int32), 'y': seq[:, 1:].astype(np.int32)})
  part = lambda s: fd.from_client_arrays([{k: v[s] for k, v in c.items()} for c in clients])
  return fd.FederatedSplit(part(slice(0, 16)), part(slice(16, None)))


@pytest.mark.slow
def test_a_next_token_model_runs_from_the_command_line(tmp_path):
  build = lambda shape, classes, vocab_size: models.from_linen(
      'bigram', Bigram(vocab_size), shape, jnp.int32, classes, task=models.NEXT_TOKEN)
  models.register_model('bigram_probe', build, tokens=True)
  data_registry.register_dataset('token_probe', token_split)
  try:
    with contextlib.redirect_stderr(io.StringIO()) as err, contextlib.redirect_stdout(
        io.StringIO()):
      status = cli.main(['run.py', '--dataset=token_probe', '--model=bigram_probe',
                         '--algorithm=fedavg', '--client_lr=1.0', '--num_rounds=30',
                         '--eval_every=10', '--clients_per_round=4', '--batch_size=5',
                         '--budget_range=2,4', '--tensorboard=false', f'--workdir={tmp_path}'])
    assert status == 0, err.getvalue()
  finally:
    models.unregister_model('bigram_probe')
    data_registry.unregister('token_probe')
  records = [json.loads(line) for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  # per-token accuracy over the 6 real tokens of each sequence: from chance (1/6) to learnt
  assert records[0]['test_accuracy'] < 0.5 and records[-1]['test_accuracy'] > 0.95
  assert records[-1]['client_accuracy_p10'] > 0.9


@pytest.mark.parametrize('task, outputs, y, message', [
    (tasks.CLASSIFICATION, (4, 3), jnp.zeros((4, 1), jnp.int32),
     r'classification task: labels must be integers of shape \(4,\) for outputs of shape '
     r'\(4, 3\), got int32 \(4, 1\) \(flatten them: y.reshape\(-1\)\)'),
    (tasks.CLASSIFICATION, (4, 3), jnp.zeros((4,), jnp.float32),
     r'labels must be integers of shape \(4,\) .* got float32 \(4,\)$'),
    (tasks.NEXT_TOKEN, (2, 5, 7), jnp.zeros((2, 4), jnp.int32),
     r'next_token task: labels must be integers of shape \(2, 5\)'),
    (tasks.REGRESSION, (4, 2), jnp.zeros((4,)),
     r'regression task: targets must hold one value per output, got outputs \(4, 2\) and '
     r'targets \(4,\)'),
])
def test_labels_of_the_wrong_shape_or_kind_are_named_in_one_line(task, outputs, y, message):
  for term in (task.loss, *task.metrics.values()):
    with pytest.raises(ValueError, match=message):
      term(jnp.zeros(outputs), y)


def test_cross_entropy_loss_names_column_labels(model, data):
  params = model.init(jax.random.key(0))
  batch = {'x': data.examples['x'][:4], 'y': data.examples['y'][:4, None]}
  with pytest.raises(ValueError, match=r'flatten them'):
    jax.jit(models.cross_entropy_loss(model))(params, batch)


def test_regression_targets_of_shape_b_score_outputs_of_shape_b_1():
  """``[B, 1]`` outputs against ``[B]`` targets: per example error, not every pair's."""
  out = jnp.array([[1.], [3.]])
  y = jnp.array([2., 3.])
  assert float(tasks.batch_mean(tasks.REGRESSION.loss, out, {'y': y})) == 0.5
