"""Models with dropout and BatchNorm in the clients' local steps (``core.model_state``): each
server policy against a hand-written per-client loop of Flax's own ``apply``, the step keys
against their documented derivation, linen and nnx, chunks and a mesh, and the one-line
refusals."""
from __future__ import annotations

import textwrap

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import helpers
from fedjax_gel import algorithms, models
from fedjax_gel.core import federated_data as fd
from fedjax_gel.core import keys, model_state, sampling
from fedjax_gel.core.round import build_round

N, FEATURES, CLASSES, LR = 6, 4, 3, 0.2


class BatchNormNet(nn.Module):
  """Dense, BatchNorm (running statistics in ``batch_stats``), ReLU, dropout, dense."""
  rate: float = 0.

  @nn.compact
  def __call__(self, x, train: bool = False):
    x = nn.BatchNorm(use_running_average=not train, momentum=0.5)(nn.Dense(5)(x))
    x = nn.Dropout(self.rate, deterministic=not train)(nn.relu(x))
    return nn.Dense(CLASSES)(x)


class DropoutNet(nn.Module):
  rate: float = 0.5

  @nn.compact
  def __call__(self, x, train: bool = False):
    return nn.Dense(CLASSES)(nn.Dropout(self.rate, deterministic=not train)(
        nn.relu(nn.Dense(8)(x))))


@pytest.fixture(scope='module')
def pool():
  """5 clients of N examples each (equal weights; a minibatch of N is all of a client's rows)."""
  rng = np.random.default_rng(0)
  clients = [{'x': (rng.normal(size=(N, FEATURES)) + i).astype(np.float32),
              'y': rng.integers(0, CLASSES, N).astype(np.int32)} for i in range(5)]
  return clients, fd.to_device(fd.from_client_arrays(clients))


SPEC = sampling.CohortSpec(3, (1, 3), N)


def engine_rounds(alg, model, data, rounds=3, chunk_size=2, seed=0):
  root = keys.root_key(seed)
  state = alg.server_init(model.init(keys.init_key(root)))
  run = build_round(alg, chunk_size=chunk_size)
  for r in range(rounds):
    state, metrics = run(state, sampling.sample_cohort(root, r, data.counts, SPEC), data, root, r)
  return state, metrics


def hand_rounds(module, clients, data, policy, rounds=3, seed=0):
  """FedAvg (client SGD, server x <- mean of the clients' models) with BatchNorm's statistics
  treated by ``policy``, client by client with Flax's ``apply``: each step is a full pass over
  the client's N rows (a minibatch of N in any order has the same statistics and gradient)."""
  root = keys.root_key(seed)
  variables = module.init(keys.init_key(root), jnp.zeros((1, FEATURES)))
  params, initial = variables['params'], variables['batch_stats']
  stats, own = initial, {}

  def loss(p, s, x, y):
    out, new = module.apply({'params': p, 'batch_stats': s}, x, train=True,
                            mutable=['batch_stats'])
    return optax.softmax_cross_entropy_with_integer_labels(out, y).mean(), new['batch_stats']

  step = jax.jit(jax.grad(loss, has_aux=True))
  for r in range(rounds):
    cohort = sampling.sample_cohort(root, r, data.counts, SPEC)
    finals, final_stats = [], []
    for i, tau in zip(np.asarray(cohort.client_ids), np.asarray(cohort.budgets)):
      p = params
      s = own.get(int(i), initial) if policy == 'local' else stats
      for _ in range(int(tau)):
        g, s = step(p, s, clients[i]['x'], clients[i]['y'])
        p = jax.tree.map(lambda a, b: a - LR * b, p, g)
      finals.append(p)
      final_stats.append(s)
      own[int(i)] = s
    mean = lambda trees: jax.tree.map(lambda *a: sum(a) / len(a), *trees)
    params = mean(finals)
    if policy == 'average':
      stats = mean(final_stats)
  if policy == 'local':
    stats = jax.tree.map(lambda *a: sum(a) / len(a), *own.values())
  elif policy == 'frozen':
    stats = initial
  return params, stats


@pytest.mark.parametrize('policy', model_state.POLICIES)
@pytest.mark.slow
def test_each_policy_matches_a_per_client_loop(pool, policy):
  clients, data = pool
  module = BatchNormNet()
  model = models.from_linen('bn', module, (FEATURES,), jnp.float32, CLASSES)
  assert (model.rngs, model.collections) == ((), ('batch_stats',))   # dropout of rate 0
  alg = model_state.with_model_state(
      algorithms.fedavg(models.task_loss(model), optax.sgd(LR)), model, policy, num_clients=5)
  state, metrics = engine_rounds(alg, model, data)
  assert bool(metrics.finite)
  got = alg.server_params(state)
  params, stats = hand_rounds(module, clients, data, policy)
  helpers.assert_trees_close(got.params, params, 2e-5)
  helpers.assert_trees_close(got.state['batch_stats'], stats, 2e-5)
  if policy != 'frozen':   # the statistics moved from their initial values
    assert np.abs(np.asarray(stats['BatchNorm_0']['mean'])).max() > 0.1


@pytest.mark.slow
def test_dropout_changes_training_and_evaluation_is_deterministic(pool):
  _, data = pool
  trained = {}
  for rate in (0.0, 0.5):
    model = models.from_linen(f'drop{rate}', DropoutNet(rate), (FEATURES,), jnp.float32, CLASSES)
    alg = model_state.with_model_state(
        algorithms.fedavg(models.task_loss(model), optax.sgd(LR)), model)
    trained[rate] = (model, alg.server_params(engine_rounds(alg, model, data)[0]))
  # rate 0 draws nothing: no streams, the algorithm unwrapped; rate 0.5 draws 'dropout'
  assert trained[0.0][0].rngs == () and trained[0.5][0].rngs == ('dropout',)
  diff = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), trained[0.0][1], trained[0.5][1])
  assert max(jax.tree.leaves(diff)) > 1e-3
  model, params = trained[0.5]
  x = data.examples['x'][:8]
  np.testing.assert_array_equal(model.apply(params, x), model.apply(params, x))
  # evaluation is the module with train=False: no dropout, so no key needed
  np.testing.assert_array_equal(model.apply(params, x), DropoutNet(0.5).apply(
      {'params': params}, x, train=False))


def key_probe():
  """A linear model that writes a uniform draw of its step's key into its state."""
  def init(key):
    return models.Variables({'w': jax.random.normal(key, (FEATURES, CLASSES))},
                            {'probe': jnp.zeros(())})

  def train_apply(params, state, x, rng):
    return x @ params['w'], {'probe': jax.random.uniform(rng)}

  return models.Model('probe', init, lambda v, x: x @ v.params['w'], CLASSES,
                      train_apply=train_apply, rngs=('noise',), collections=('probe',))


@pytest.mark.slow
def test_step_keys_follow_seed_round_client_and_step(pool):
  """A client's last step gets the key fold_in(fold_in(k, MODEL_KEY), tau_i - 1), ``k`` its
  algorithm key (the second half of its client key's split, ``core.keys``)."""
  _, data = pool
  model = key_probe()
  alg = model_state.with_model_state(
      algorithms.fedavg(models.task_loss(model), optax.sgd(LR)), model, 'local', num_clients=5)
  state, _ = engine_rounds(alg, model, data, rounds=1)
  rows = state.clients.local
  root = keys.root_key(0)
  cohort = sampling.sample_cohort(root, 0, data.counts, SPEC)
  expect = {}
  for slot, (i, tau) in enumerate(zip(np.asarray(cohort.client_ids),
                                      np.asarray(cohort.budgets))):
    ck = keys.client_key(keys.round_key(root, 0, keys.CLIENT), int(i), slot)
    k = jax.random.fold_in(jax.random.split(ck)[1], model_state.MODEL_KEY)
    expect[int(i)] = float(jax.random.uniform(
        jax.random.fold_in(k, int(tau) - 1)))
  got = np.asarray(rows.state['probe'])
  for i in range(5):
    assert got[i] == pytest.approx(expect.get(i, 0.), abs=1e-7), i
  assert len(set(expect.values())) == len(expect)   # clients draw differently


class NnxNet(nnx.Module):

  def __init__(self, rngs, rate=0.5):
    self.dense = nnx.Linear(FEATURES, 5, rngs=rngs)
    self.norm = nnx.BatchNorm(5, momentum=0.5, rngs=rngs)
    self.drop = nnx.Dropout(rate, rngs=rngs)
    self.out = nnx.Linear(5, CLASSES, rngs=rngs)

  def __call__(self, x):
    return self.out(self.drop(nnx.relu(self.norm(self.dense(x)))))


@pytest.mark.slow
def test_nnx_dropout_and_batch_norm_train_under_each_policy(pool):
  _, data = pool
  finals = {}
  for rate, policy in ((0.5, 'average'), (0.5, 'local'), (0.0, 'average')):
    model = models.from_nnx('nnx', lambda rngs, rate=rate: NnxNet(rngs, rate), CLASSES)
    assert model.collections == ('state',)
    alg = model_state.with_model_state(
        algorithms.fedavg(models.task_loss(model), optax.sgd(LR)), model, policy, num_clients=5)
    state, metrics = engine_rounds(alg, model, data)
    assert bool(metrics.finite)
    finals[rate, policy] = variables = alg.server_params(state)
    mean = variables.state['state']['norm']['mean']
    assert float(jnp.abs(mean).max()) > 0.1   # the statistics moved
    x = data.examples['x'][:8]
    np.testing.assert_array_equal(model.apply(variables, x), model.apply(variables, x))
  diff = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), finals[0.5, 'average'].params,
                      finals[0.0, 'average'].params)
  assert max(jax.tree.leaves(diff)) > 1e-3


@pytest.mark.slow
def test_models_without_streams_or_state_keep_their_algorithm():
  """The published models (no dropout, no BatchNorm) are trained by the same program."""
  for name, shape, vocab in (('logistic', (6,), None), ('gel_femnist_cnn', (784,), None),
                             ('shakespeare_lstm', (8,), 10)):
    model = models.get_model(name, shape, 10, vocab_size=vocab)
    assert (model.rngs, model.collections) == ((), ())
    alg = algorithms.fedavg(models.task_loss(model), optax.sgd(0.1))
    assert model_state.with_model_state(alg, model) is alg
  model = models.get_model('shakespeare_lstm', (8,), 10, vocab_size=10, dropout=0.3)
  assert model.rngs == ('dropout',)
  model = models.get_model('celeba_cnn', (16, 16, 3), 2, batch_norm=True)
  assert model.collections == ('batch_stats',)
  with pytest.raises(models.OptionError, match='--dropout: model .logistic. has no such option'):
    models.get_model('logistic', (6,), 3, dropout=0.5)


def test_bad_models_and_policies_are_one_line():
  class AlwaysDrops(nn.Module):   # no train flag: it would drop at evaluation too
    @nn.compact
    def __call__(self, x):
      return nn.Dense(CLASSES)(nn.Dropout(0.5, deterministic=False)(x))

  with pytest.raises(ValueError, match=r"rng stream 'dropout' in evaluation \(its __call__ "
                     'takes no train argument'):
    models.from_linen('drops', AlwaysDrops(), (FEATURES,), jnp.float32, CLASSES)
  model = models.from_linen('bn', BatchNormNet(), (FEATURES,), jnp.float32, CLASSES)
  alg = algorithms.fedavg(models.task_loss(model), optax.sgd(LR))
  with pytest.raises(ValueError, match="'batch_stats'.*--model_state=average"):
    model_state.with_model_state(alg, model)
  with pytest.raises(ValueError, match='per client'):
    model_state.with_model_state(alg, model, 'local')
  batch = {'x': jnp.zeros((2, FEATURES)), 'y': jnp.zeros((2,), jnp.int32)}
  with pytest.raises(ValueError, match="mutable collection 'batch_stats'.*with_model_state"):
    models.task_loss(model)(model.init(jax.random.key(0)).params, batch)


def test_an_algorithm_taking_its_own_gradients_is_refused(pool):
  _, data = pool
  model = models.from_linen('bn', BatchNormNet(), (FEATURES,), jnp.float32, CLASSES)
  loss = models.task_loss(model)
  base = algorithms.fedavg(loss, optax.sgd(LR))

  def own_step(state, batch, x):
    value, grads = jax.value_and_grad(loss)(state.params, batch)
    return state._replace(params=jax.tree.map(lambda p, g: p - g, state.params, grads)), value

  alg = model_state.with_model_state(base._replace(client_step=own_step), model, 'average')
  with pytest.raises(TypeError, match='model_state.value_and_grad'):
    engine_rounds(alg, model, data, rounds=1)


MESH = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np, optax, flax.linen as nn
    from fedjax_gel import algorithms, models
    from fedjax_gel.core import federated_data as fd, keys, model_state, sampling, store
    from fedjax_gel.core.devices import client_mesh
    from fedjax_gel.core.round import build_round

    class Net(nn.Module):
      @nn.compact
      def __call__(self, x, train=False):
        x = nn.BatchNorm(use_running_average=not train, momentum=0.5)(nn.Dense(5)(x))
        return nn.Dense(3)(nn.Dropout(0.3, deterministic=not train)(nn.relu(x)))

    rng = np.random.default_rng(1)
    clients = [{'x': rng.normal(size=(int(n), 4)).astype(np.float32),
                'y': rng.integers(0, 3, int(n)).astype(np.int32)} for n in rng.integers(3, 12, 9)]
    host = fd.from_client_arrays(clients)
    model = models.from_linen('net', Net(), (4,), jnp.float32, 3)
    loss = models.task_loss(model)
    root = keys.root_key(0)
    spec = sampling.CohortSpec(6, (1, 4), 3)
    for policy, base in (('local', algorithms.scaffold(loss, 0.1, 9)),):
      alg = model_state.with_model_state(base, model, policy, num_clients=9)
      out = []
      for devices, chunk in ((1, 6), (2, 2)):
        mesh = client_mesh(devices) if devices > 1 else None
        data = fd.to_device(host, mesh)
        state = store.place_state(alg.server_init(model.init(keys.init_key(root))), alg, mesh)
        run = build_round(alg, chunk_size=chunk, mesh=mesh)
        for r in range(3):
          state, _ = run(state, sampling.sample_cohort(root, r, data.counts, spec), data, root, r)
        out.append(jax.device_get(alg.server_params(state)))
      jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6), *out)
    print('MESH OK')
''')


@pytest.mark.slow
def test_a_mesh_and_chunks_give_the_single_device_round():
  """BatchNorm and dropout, the local statistics' store beside SCAFFOLD's, split by client over
  2 devices (the average policy adds only means of uploads, the engine's own path)."""
  helpers.run_on_cpu_devices(MESH, 'MESH OK', 2)


def test_the_planner_counts_the_local_rows():
  from fedjax_gel.experiment import planning  # pylint: disable=g-import-not-at-top
  model = models.from_linen('bn', BatchNormNet(), (FEATURES,), jnp.float32, CLASSES)
  params = model.init(jax.random.key(0))
  base = algorithms.fedavg(models.task_loss(model), optax.sgd(LR))
  local = model_state.with_model_state(base, model, 'local', num_clients=1000)
  row = 2 * 5 * 4 + 4   # BatchNorm's mean and variance of 5 float32 features, and the flag
  assert planning.store_bytes(local, params) == 1000 * row
  assert planning.store_bytes(model_state.with_model_state(base, model, 'average'), params) == 0


@pytest.mark.slow
def test_modules_forwarding_kwargs_or_sowing_are_not_state(pool):
  """A ``**kwargs`` module is called without ``train``; a collection ``sow`` grows is dropped,
  not carried (its structure changes every step)."""
  _, data = pool

  class Forwards(nn.Module):
    @nn.compact
    def __call__(self, x, **kw):
      return nn.Dense(CLASSES)(x, **kw)

  class Sows(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = False):
      h = nn.Dense(8)(x)
      self.sow('activations', 'h', h)
      return nn.Dense(CLASSES)(h)

  for module in (Forwards(), Sows()):
    model = models.from_linen('m', module, (FEATURES,), jnp.float32, CLASSES)
    assert (model.rngs, model.collections) == ((), ())
    alg = model_state.with_model_state(
        algorithms.fedavg(models.task_loss(model), optax.sgd(LR)), model)
    assert bool(engine_rounds(alg, model, data, rounds=1)[1].finite)


@pytest.mark.slow
def test_mime_takes_its_anchor_gradient_in_training_mode(pool):
  """Mimelite's full-batch pre-pass on a BatchNorm and dropout model: trains, under local
  statistics (whose broadcast state is the initial one: in evaluation mode it would normalise
  nothing)."""
  from fedjax_gel import optim  # pylint: disable=g-import-not-at-top
  _, data = pool
  model = models.from_linen('bn', BatchNormNet(0.3), (FEATURES,), jnp.float32, CLASSES)
  alg = model_state.with_model_state(
      algorithms.mime(models.task_loss(model), optim.gbo_sgdm(LR, 0.9)), model, 'local',
      num_clients=5)
  state, metrics = engine_rounds(alg, model, data, rounds=2)
  assert bool(metrics.finite) and float(metrics.grad_computations) > 0


def test_epoch_budgets_are_refused_for_batch_statistics(pool):
  _, data = pool
  model = models.from_linen('bn', BatchNormNet(), (FEATURES,), jnp.float32, CLASSES)
  alg = model_state.with_model_state(
      algorithms.fedavg(models.task_loss(model), optax.sgd(LR)), model, 'average')
  root = keys.root_key(0)
  spec = sampling.CohortSpec(3, (1, 1), 4, budget_unit='epochs', max_examples=N)
  with pytest.raises(ValueError, match="padding rows of an epoch's short last minibatch"):
    build_round(alg, chunk_size=2)(alg.server_init(model.init(root)),
                                   sampling.sample_cohort(root, 0, data.counts, spec), data, root,
                                   0)
