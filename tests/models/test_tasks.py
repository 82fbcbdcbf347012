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
from fedjax_gel.experiment import cli, factories
from fedjax_gel.experiment.config import ConfigError, make
from fedjax_gel.models import tasks


def test_regression_by_hand():
  out = jnp.array([[1., 2.], [3., 5.]])
  y = jnp.array([[1., 1.], [3., 3.]])
  # per example: mean over the 2 outputs of the squared error: 0.5 and 2
  assert float(tasks.batch_mean(tasks.REGRESSION.loss, out, {'y': y})) == 1.25
  assert float(tasks.batch_mean(tasks.REGRESSION.loss, out,
                                {'y': y, 'mask': jnp.array([True, False])})) == 0.5


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


def test_classification_task_loss_is_cross_entropy_to_the_bit(model, data):
  params = model.init(jax.random.key(0))
  batch = {k: v[:7] for k, v in data.examples.items()}
  assert models.task_loss(model)(params, batch) == models.cross_entropy_loss(model)(params, batch)
  generic = tasks.batch_mean(tasks.CLASSIFICATION.loss, model.apply(params, batch['x']), batch)
  np.testing.assert_allclose(generic, models.cross_entropy_loss(model)(params, batch), rtol=1e-6)


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
  assert 'client_correct' not in out   # no accuracy, no per-client accuracy


def test_the_experiment_refuses_a_task_without_accuracy():
  build = lambda shape, classes: models.from_linen('reg', Linear(), shape, jnp.float32, classes,
                                                   task=models.REGRESSION)
  models.register_model('regression_probe', build)
  try:
    with pytest.raises(ConfigError, match=r'--model=regression_probe: its task \(regression\) '
                                          'has no accuracy'):
      factories.prepare(make(model='regression_probe'))
  finally:
    models.MODELS.pop('regression_probe')


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
    models.MODELS.pop('bigram_probe')
    models.TOKEN_MODELS = tuple(m for m in models.TOKEN_MODELS if m != 'bigram_probe')
    data_registry.LOADERS.pop('token_probe')
  records = [json.loads(line) for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  # per-token accuracy over the 6 real tokens of each sequence: from chance (1/6) to learnt
  assert records[0]['test_accuracy'] < 0.5 and records[-1]['test_accuracy'] > 0.95
  assert records[-1]['client_accuracy_p10'] > 0.9
