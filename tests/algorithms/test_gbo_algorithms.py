"""FedGBO, MFL, Mimelite, MimeXlite and FedMAX in the engine against hand computations."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_gel import algorithms, models, optim
from fedjax_gel.core import keys
from fedjax_gel.core.round import build_round

from helpers import (B, assert_trees_close, cohort, init_params, minibatches, run, small_model,
                     small_pool)

LR = 0.1
tree_map = jax.tree_util.tree_map


@pytest.fixture(scope='module')
def data():
  return small_pool()


@pytest.fixture(scope='module')
def model():
  return small_model()


@pytest.fixture(scope='module')
def loss(model):
  return models.cross_entropy_loss(model)


def sgd_by_hand(data, loss, x, cid, slot, tau, round_idx=3, direction=None):
  y = x
  for batch in minibatches(data, cid, slot, tau, round_idx=round_idx):
    g = jax.grad(loss)(y, batch)
    y = tree_map(lambda p, d: p - LR * d, y, direction(g) if direction else g)
  return y


def test_fedgbo_sgdm_with_beta_zero_is_fedavg(data, loss, model):
  x = init_params(model)
  c = cohort([1, 5, 9], [2, 6, 4], [1., 2., 3.])
  gbo, _ = run(algorithms.fedgbo(loss, optim.gbo_sgdm(LR, beta=0.)), data, c, x, chunk_size=3)
  avg, _ = run(algorithms.fedavg(loss, optax.sgd(LR)), data, c, x, chunk_size=3)
  assert_trees_close(gbo.params, avg.params)


@pytest.mark.parametrize('kind', ['sgdm', 'rmsprop', 'adam'])
def test_fedgbo_round_tracks_the_mean_client_gradient(data, loss, model, kind):
  """Frozen statistics: y_i from by-hand steps; the new statistics track the step-weighted mean
  of the gradients the clients computed, which the inverse step must recover exactly."""
  opt = optim.gbo(kind, LR)
  x = init_params(model)
  ids, taus, w = [1, 5, 9], [2, 6, 4], [1., 2., 3.]
  state, _ = run(algorithms.fedgbo(loss, opt), data, cohort(ids, taus, w), x, chunk_size=2)
  stats = opt.init_stats(x)
  step = opt.client_optimizer(stats)
  ys, grad_sums = [], []
  for slot, (cid, tau) in enumerate(zip(ids, taus)):
    y, gsum = x, tree_map(jnp.zeros_like, x)
    for batch in minibatches(data, cid, slot, tau):
      g = jax.grad(loss)(y, batch)
      gsum = tree_map(jnp.add, gsum, g)
      y = optax.apply_updates(y, step.update(g, stats)[0])
    ys.append(y)
    grad_sums.append(gsum)
  p = np.array(w) / sum(w)
  x_bar = tree_map(lambda *ls: sum(pi * l for pi, l in zip(p, ls)), *ys)
  g_bar = tree_map(lambda *ls: sum(pi * l for pi, l in zip(p, ls)) / float(np.dot(p, taus)),
                   *grad_sums)
  assert_trees_close(state.params, x_bar, tol=1e-5)
  assert_trees_close(state.stats, opt.track(stats, g_bar), tol=1e-4)


def test_mfl_with_one_client_is_centralised_training(data, loss, model):
  """Two rounds of one client (full participation) = one optimiser run over the same batches."""
  opt = optim.gbo_adam(LR)
  alg = algorithms.mfl(loss, opt)
  rf = build_round(alg, batch_size=B, max_budget=6, chunk_size=1)
  x = init_params(model)
  state = alg.server_init(x)
  for r in (3, 4):
    state, _ = rf(state, cohort([5], [4]), data, keys.root_key(0), jnp.int32(r))
  central = opt.tracking_optimizer(opt.init_stats(x))
  y, s = x, central.init(x)
  for r in (3, 4):
    for batch in minibatches(data, 5, 0, 4, round_idx=r):
      u, s = central.update(jax.grad(loss)(y, batch), s, y)
      y = optax.apply_updates(y, u)
  assert_trees_close(state.params, y, tol=1e-5)
  assert_trees_close(state.stats, s, tol=1e-5)


@pytest.mark.parametrize('full_batch', [True, False])
def test_mime_round_by_hand(data, loss, model, full_batch):
  """x' = mean y_i (frozen-statistics steps); S' = track(S, mean gradient at x), where the
  gradient is over all the client's examples (Mimelite) or its first minibatch (MimeXlite)."""
  opt = optim.gbo_sgdm(LR, beta=0.9)
  x = init_params(model)
  ids, taus = [3, 5], [3, 2]
  alg = algorithms.mime(loss, opt, full_batch=full_batch)
  state, metrics = run(alg, data, cohort(ids, taus), x, chunk_size=2)
  stats = opt.init_stats(x)
  step = opt.client_optimizer(stats)
  ys, anchors = [], []
  for slot, (cid, tau) in enumerate(zip(ids, taus)):
    batches = list(minibatches(data, cid, slot, tau))
    if full_batch:
      lo, n = int(data.offsets[cid]), int(data.counts[cid])
      everything = {k: v[lo:lo + n] for k, v in data.examples.items()}
      anchors.append(jax.grad(loss)(x, everything))
    else:
      anchors.append(jax.grad(loss)(x, batches[0]))
    y = x
    for batch in batches:
      y = optax.apply_updates(y, step.update(jax.grad(loss)(y, batch), stats)[0])
    ys.append(y)
  mean = lambda trees: tree_map(lambda a, b: (a + b) / 2, *trees)
  assert_trees_close(state.params, mean(ys), tol=1e-5)
  assert_trees_close(state.stats, opt.track(stats, mean(anchors)), tol=1e-5)
  n_anchor = (-(-int(data.counts[3]) // B) + -(-int(data.counts[5]) // B)) if full_batch else 2
  assert int(metrics.grad_computations) == sum(taus) + n_anchor


def test_fedmax_on_logistic_regression_is_fedavg(data, loss, model):
  x = init_params(model)
  c = cohort([1, 5], [3, 4])
  fm, _ = run(algorithms.fedmax(model, LR, beta=2.0), data, c, x, chunk_size=2)
  avg, _ = run(algorithms.fedavg(loss, optax.sgd(LR)), data, c, x, chunk_size=2)
  assert_trees_close(fm.params, avg.params)


def test_fedmax_loss_by_hand():
  m = models.get_model('mlp', (4,), 3)
  p = m.init(jax.random.key(0))
  batch = {'x': jax.random.normal(jax.random.key(1), (5, 4)), 'y': jnp.array([0, 1, 2, 1, 0])}
  a = np.asarray(m.features(p, batch['x']), np.float64)
  logp = a - np.log(np.exp(a).sum(-1, keepdims=True))
  kl = np.mean(-np.log(a.shape[-1]) - logp.mean(-1))
  expect = float(models.cross_entropy_loss(m)(p, batch)) + 0.7 * kl
  np.testing.assert_allclose(models.max_entropy_loss(m, 0.7)(p, batch), expect, rtol=1e-5)


def test_bytes_and_client_distance_metrics(data, loss, model):
  x = init_params(model)
  model_bytes = sum(l.size * 4 for l in jax.tree_util.tree_leaves(x))   # 15 float32
  c = cohort([1, 5, 9], [2, 6, 4])
  _, avg = run(algorithms.fedavg(loss, optax.sgd(LR)), data, c, x, chunk_size=2)
  assert int(avg.uploaded_bytes) == int(avg.downloaded_bytes) == 3 * model_bytes
  _, mfl = run(algorithms.mfl(loss, optim.gbo_adam(LR)), data, c, x, chunk_size=2)
  assert int(mfl.uploaded_bytes) == int(mfl.downloaded_bytes) == 3 * 3 * model_bytes
  _, gbo = run(algorithms.fedgbo(loss, optim.gbo_sgdm(LR)), data, c, x, chunk_size=2)
  assert int(gbo.uploaded_bytes) == 3 * (model_bytes + 4)   # Delta and the step count
  assert int(gbo.downloaded_bytes) == 3 * 2 * model_bytes
  # Mean pairwise cosine distance of the client models, by hand.
  ys = [sgd_by_hand(data, loss, x, cid, slot, t) for slot, (cid, t) in
        enumerate(zip([1, 5, 9], [2, 6, 4]))]
  flat = [np.concatenate([np.ravel(l) for l in jax.tree_util.tree_leaves(y)]) for y in ys]
  cos = [f @ g / np.linalg.norm(f) / np.linalg.norm(g)
         for i, f in enumerate(flat) for j, g in enumerate(flat) if i < j]
  np.testing.assert_allclose(avg.client_distance, 1 - np.mean(cos), rtol=1e-4, atol=1e-6)
