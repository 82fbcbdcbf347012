"""FedGBO's global biased optimisers: frozen client statistics, exact inverse step, tracking."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.flatten_util import ravel_pytree

from fedjax_gel.optim.gbo import (KINDS, GBOStats, GlobalBiasedOptimizer, gbo, gbo_adam,
                                  gbo_rmsprop, gbo_sgdm)

LR, K, NUM_CLIENTS = 0.05, 5, 4
KIND_HPARAMS = {'sgdm': {'beta': 0.8}, 'rmsprop': {'beta': 0.9, 'eps': 1e-3},
                'adam': {'beta1': 0.7, 'beta2': 0.95, 'eps': 1e-3}}


def _tree(w, b):
  return {'w': jnp.asarray(w, jnp.float32), 'b': jnp.asarray(b, jnp.float32)}


X0 = _tree([[0.3, -1.2, 0.8], [1.5, 0.1, -0.4]], [0.2, -0.7, 1.1])
DIM = 9
# Two "gradients" that make the statistics non-trivial (m != 0, v != 1) before a round.
H1 = _tree([[0.5, -2.0, 0.3], [0.0, 1.5, -0.1]], [-0.3, 0.05, 3.0])
H2 = _tree([[-0.5, 0.1, 1.0], [2.0, -0.2, 0.4]], [0.3, -4.0, 0.01])


def _quadratics(num_clients=NUM_CLIENTS, seed=0):
  """Per-client ``f_i(y) = 0.5 ||A_i y - b_i||^2`` on the flattened params."""
  rng = np.random.default_rng(seed)
  a = (rng.normal(size=(num_clients, DIM, DIM)) / np.sqrt(DIM)).astype(np.float32)
  b = rng.normal(size=(num_clients, DIM)).astype(np.float32)
  return jnp.asarray(a), jnp.asarray(b)


def _loss(params, a, b):
  flat, _ = ravel_pytree(params)
  r = a @ flat - b
  return 0.5 * jnp.dot(r, r)


def _warm_stats(opt: GlobalBiasedOptimizer) -> GBOStats:
  return opt.track(opt.track(opt.init_stats(X0), H1), H2)


def _train(opt, stats, a, b, steps):
  """One client's local training from X0 with full-batch gradients; returns (y, grads, state)."""
  tx = opt.client_optimizer(stats)
  y, state, grads = X0, tx.init(X0), []
  for _ in range(steps):
    g = jax.grad(_loss)(y, a, b)
    grads.append(g)
    updates, state = tx.update(g, state, y)
    y = optax.apply_updates(y, updates)
  return y, grads, state


def _mean(trees, weights=None):
  weights = np.full(len(trees), 1. / len(trees)) if weights is None else weights
  return jax.tree.map(lambda *xs: sum(w * np.asarray(x, np.float64) for w, x in zip(weights, xs)),
                      *trees)


def _assert_close(got, want, rtol=1e-5, atol=1e-5):
  for k in want:
    np.testing.assert_allclose(np.asarray(got[k], np.float64), np.asarray(want[k], np.float64),
                               rtol=rtol, atol=atol)


@pytest.mark.parametrize('kind', KINDS)
def test_inverse_recovers_mean_client_gradient(kind):
  """With frozen statistics one client step is ``y <- y - lr (c1 m + c2 g) / d`` with ``c1, c2,
  d`` the same on every client and step, i.e. affine in ``g``. Summed over ``K`` steps and
  averaged over clients, ``x - x_bar = lr K (c1 m + c2 g_mean) / d`` with ``g_mean`` the mean of
  all computed gradients, and the inverse step solves this for ``g_mean`` exactly, however far the
  iterates moved (nothing is linearised in the loss)."""
  opt = gbo(kind, LR, **KIND_HPARAMS[kind])
  stats = _warm_stats(opt)
  a, b = _quadratics()
  ys, grads = [], []
  for i in range(NUM_CLIENTS):
    y, g, _ = _train(opt, stats, a[i], b[i], K)
    ys.append(y)
    grads.extend(g)
  x_bar = jax.tree.map(lambda *ys: jnp.mean(jnp.stack(ys), 0), *ys)
  g_mean = _mean(grads)
  _assert_close(opt.inverse(X0, x_bar, stats, K), g_mean)
  # The clients' gradients differ (so the check is not about one repeated gradient), and the
  # statistics matter: inverting with fresh statistics gives something else.
  assert not np.allclose(grads[0]['w'], grads[-1]['w'], atol=1e-2)
  wrong = opt.inverse(X0, x_bar, opt.init_stats(X0), K)
  assert not np.allclose(np.asarray(wrong['w']), g_mean['w'], atol=1e-3)


@pytest.mark.parametrize('kind', KINDS)
def test_inverse_with_unequal_steps_and_weights_under_jit(kind):
  """Clients with ``K_i`` steps and weights ``p_i``: ``inverse(x, sum_i p_i y_i, S, sum_i p_i
  K_i)`` is the step-weighted mean ``sum_i p_i sum_k g_ik / sum_i p_i K_i``; ``K`` traced."""
  opt = gbo(kind, LR, **KIND_HPARAMS[kind])
  stats = _warm_stats(opt)
  a, b = _quadratics()
  steps = [1, 3, 6, 4]
  p = np.array([0.1, 0.4, 0.2, 0.3])
  ys, sums = [], []
  for i in range(NUM_CLIENTS):
    y, g, _ = _train(opt, stats, a[i], b[i], steps[i])
    ys.append(y)
    sums.append(_mean(g, np.ones(len(g))))
  x_bar = _mean(ys, p)
  mean_steps = float(np.dot(p, steps))
  want = jax.tree.map(lambda s: s / mean_steps, _mean(sums, p))
  x_bar32 = jax.tree.map(lambda t: jnp.asarray(t, jnp.float32), x_bar)
  got = jax.jit(opt.inverse)(X0, x_bar32, stats, jnp.float32(mean_steps))
  _assert_close(got, want)
  assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(got))


@pytest.mark.parametrize('kind', KINDS)
def test_statistics_frozen_during_local_training(kind):
  """The client state after ``K`` steps (eager and in a jitted scan) is the downloaded stats."""
  opt = gbo(kind, LR, **KIND_HPARAMS[kind])
  stats = _warm_stats(opt)
  a, b = _quadratics()
  _, _, state = _train(opt, stats, a[0], b[0], K)
  tx = opt.client_optimizer(stats)
  assert tx.init(X0) is stats and state is stats

  @jax.jit
  def local(stats, a, b):
    tx = opt.client_optimizer(stats)

    def step(carry, _):
      y, state = carry
      updates, state = tx.update(jax.grad(_loss)(y, a, b), state, y)
      return (optax.apply_updates(y, updates), state), None

    (y, state), _ = jax.lax.scan(step, (X0, tx.init(X0)), None, length=K)
    return y, state

  y, state = local(stats, a[0], b[0])
  assert isinstance(state, GBOStats)
  assert jax.tree.structure(state) == jax.tree.structure(stats)
  for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(stats)):
    assert got.dtype == want.dtype and np.array_equal(np.asarray(got), np.asarray(want))
  assert not np.allclose(y['w'], X0['w'])  # the model did move


def test_vmap_over_clients_matches_loop():
  """Local training vmapped over clients (stats broadcast) equals client-by-client training."""
  opt = gbo_adam(LR, beta1=0.7, beta2=0.95)
  stats = _warm_stats(opt)
  a, b = _quadratics()

  def local(a, b):
    tx = opt.client_optimizer(stats)

    def step(_, carry):
      y, state = carry
      updates, state = tx.update(jax.grad(_loss)(y, a, b), state, y)
      return optax.apply_updates(y, updates), state

    return jax.lax.fori_loop(0, K, step, (X0, tx.init(X0)))[0]

  ys = jax.jit(jax.vmap(local))(a, b)
  for i in range(NUM_CLIENTS):
    y, _, _ = _train(opt, stats, a[i], b[i], K)
    _assert_close(jax.tree.map(lambda t: t[i], ys), y, rtol=1e-6, atol=1e-6)


def test_sgdm_without_momentum_is_sgd():
  """``beta = 0``: client steps are ``optax.sgd(lr)`` steps whatever ``m`` holds, and the server
  step sets ``m`` to the recovered mean gradient ``(x - x_bar) / (lr K)``."""
  opt = gbo_sgdm(LR, beta=0.)
  stats = GBOStats(_tree(np.full((2, 3), 5.), np.full(3, -3.)), None)
  a, b = _quadratics()
  sgd = optax.sgd(LR)
  y_gbo, y_sgd = X0, X0
  tx = opt.client_optimizer(stats)
  gbo_state, sgd_state = tx.init(X0), sgd.init(X0)
  for _ in range(K):
    u_gbo, gbo_state = tx.update(jax.grad(_loss)(y_gbo, a[0], b[0]), gbo_state, y_gbo)
    u_sgd, sgd_state = sgd.update(jax.grad(_loss)(y_sgd, a[0], b[0]), sgd_state, y_sgd)
    _assert_close(u_gbo, u_sgd, rtol=1e-6, atol=1e-7)
    y_gbo, y_sgd = optax.apply_updates(y_gbo, u_gbo), optax.apply_updates(y_sgd, u_sgd)
  _assert_close(y_gbo, y_sgd, rtol=1e-6, atol=1e-7)
  y, grads, _ = _train(opt, stats, a[0], b[0], K)
  new = opt.server_update(X0, y, stats, K)
  assert new.v is None
  _assert_close(new.m, _mean(grads))
  _assert_close(new.m, jax.tree.map(lambda x, y: (x - y) / (LR * K), X0, y), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('kind', KINDS)
def test_client_inverse_and_tracking_match_numpy(kind):
  """Update, inverse and tracking of each kind against float64 numpy written from the formulas."""
  hp = KIND_HPARAMS[kind]
  opt = gbo(kind, LR, **hp)
  rng = np.random.default_rng(1)
  m = {k: rng.normal(size=x.shape) for k, x in X0.items()}
  v = {k: rng.uniform(0.01, 2., size=x.shape) for k, x in X0.items()}
  g = {k: rng.normal(size=x.shape) for k, x in X0.items()}
  x_bar = {k: np.asarray(x) - 0.01 * rng.normal(size=x.shape) for k, x in X0.items()}
  f32 = lambda t: {k: jnp.asarray(x, jnp.float32) for k, x in t.items()}
  stats = GBOStats(f32(m) if kind != 'rmsprop' else None, f32(v) if kind != 'sgdm' else None)
  upd, _ = opt.client_optimizer(stats).update(f32(g), stats)
  inv = opt.inverse(X0, f32(x_bar), stats, 3.5)
  new = opt.track(stats, f32(g))
  for k in X0:
    d = np.asarray(X0[k], np.float64) - x_bar[k]
    if kind == 'sgdm':
      beta = hp['beta']
      want_upd = -LR * (beta * m[k] + (1 - beta) * g[k])
      want_inv = (d / (LR * 3.5) - beta * m[k]) / (1 - beta)
      want_m, want_v = beta * m[k] + (1 - beta) * g[k], None
    elif kind == 'rmsprop':
      beta, eps = hp['beta'], hp['eps']
      want_upd = -LR * g[k] / (np.sqrt(v[k]) + eps)
      want_inv = d * (np.sqrt(v[k]) + eps) / (LR * 3.5)
      want_m, want_v = None, beta * v[k] + (1 - beta) * g[k] ** 2
    else:
      b1, b2, eps = hp['beta1'], hp['beta2'], hp['eps']
      want_upd = -LR * (b1 * m[k] + (1 - b1) * g[k]) / (np.sqrt(v[k]) + eps)
      want_inv = (d * (np.sqrt(v[k]) + eps) / (LR * 3.5) - b1 * m[k]) / (1 - b1)
      want_m, want_v = b1 * m[k] + (1 - b1) * g[k], b2 * v[k] + (1 - b2) * g[k] ** 2
    np.testing.assert_allclose(upd[k], want_upd, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(inv[k], want_inv, rtol=1e-4, atol=1e-4)
    if want_m is None:
      assert new.m is None
    else:
      np.testing.assert_allclose(new.m[k], want_m, rtol=1e-5, atol=1e-7)
    if want_v is None:
      assert new.v is None
    else:
      np.testing.assert_allclose(new.v[k], want_v, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize('kind', KINDS)
def test_initial_statistics(kind):
  """``m`` starts at 0, ``v`` at 1, shaped and typed like params; absent statistics are None."""
  stats = gbo(kind, LR).init_stats(X0)
  assert isinstance(stats, GBOStats)
  for name, fill, present in (('m', 0., kind != 'rmsprop'), ('v', 1., kind != 'sgdm')):
    tree = getattr(stats, name)
    if not present:
      assert tree is None
      continue
    for k, x in X0.items():
      assert tree[k].shape == x.shape and tree[k].dtype == jnp.float32
      assert np.all(np.asarray(tree[k]) == fill)


def test_adam_without_momentum_is_rmsprop():
  """Adam with ``beta1 = 0`` steps, inverts and tracks ``v`` as RMSProp (paper, §5)."""
  adam, rms = gbo_adam(LR, beta1=0., beta2=0.9), gbo_rmsprop(LR, beta=0.9)
  s_adam = _warm_stats(adam)
  s_rms = GBOStats(None, s_adam.v)
  _assert_close(adam.client_optimizer(s_adam).update(H1, s_adam)[0],
                rms.client_optimizer(s_rms).update(H1, s_rms)[0], rtol=1e-6, atol=1e-7)
  x_bar = jax.tree.map(lambda x, h: x - 0.01 * h, X0, H2)
  _assert_close(adam.inverse(X0, x_bar, s_adam, 3), rms.inverse(X0, x_bar, s_rms, 3),
                rtol=1e-6, atol=1e-6)
  _assert_close(adam.track(s_adam, H1).v, rms.track(s_rms, H1).v, rtol=1e-6, atol=1e-7)


def test_defaults_and_bad_arguments():
  """Documented defaults; unknown kinds, foreign hyper-parameters and bad values are refused."""
  assert (gbo('sgdm', 0.1).beta1, gbo('sgdm', 0.1).beta2) == (0.9, None)
  assert (gbo('rmsprop', 0.1).beta2, gbo('rmsprop', 0.1).eps) == (0.9, 1e-3)
  adam = gbo('adam', 0.1)
  assert (adam.kind, adam.beta1, adam.beta2, adam.eps) == ('adam', 0.9, 0.99, 1e-3)
  assert gbo('rmsprop', 0.1, beta=0.5).beta2 == 0.5
  with pytest.raises(ValueError, match='unknown FedGBO'):
    gbo('yogi', 0.1)
  with pytest.raises(ValueError, match='beta1'):
    gbo('sgdm', 0.1, beta1=0.9)
  with pytest.raises(ValueError, match='eps'):
    gbo('sgdm', 0.1, eps=1e-3)
  with pytest.raises(ValueError):
    gbo_sgdm(0.1, beta=1.)
  with pytest.raises(ValueError):
    gbo_adam(0.1, beta1=-0.1)
  with pytest.raises(ValueError):
    gbo_rmsprop(0.1, eps=-1.)
  with pytest.raises(ValueError):
    gbo_rmsprop(0.)
