"""FedGBO's global biased optimisers: frozen client statistics, exact inverse step, tracking."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.flatten_util import ravel_pytree

from fedjax_gel.optim.gbo import (KINDS, GBOCountState, GBOServerState, GBOStats,
                                  GlobalBiasedOptimizer, gbo, gbo_adam, gbo_rmsprop, gbo_sgdm,
                                  init_stats, inverse_step, track)

LR, K, NUM_CLIENTS = 0.05, 5, 4
KIND_HPARAMS = {'sgdm': {'b1': 0.8}, 'rmsprop': {'decay': 0.9, 'eps': 1e-3},
                'adam': {'b1': 0.7, 'b2': 0.95, 'eps': 1e-3}}


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
  stats = opt.track.init(X0)
  for h in (H1, H2):
    stats = opt.track.update(h, stats)[1]
  return stats


def _step(opt, g, y, stats):
  """One client step's updates with the frozen statistics ``stats``."""
  return opt.client.update(g, opt.client.init(y), y, stats=stats)[0]


def _inverse(opt, x, x_bar, stats, num_steps):
  """The mean client gradient from ``x - x_bar`` (``opt.inverse``)."""
  delta = optax.tree_utils.tree_sub(x, x_bar)
  return opt.inverse.update(delta, opt.inverse.init(x), x, stats=stats, num_steps=num_steps)[0]


def _train(opt, stats, a, b, steps):
  """One client's local training from X0 with full-batch gradients; returns (y, grads, state)."""
  tx = opt.client
  y, state, grads = X0, tx.init(X0), []
  for _ in range(steps):
    g = jax.grad(_loss)(y, a, b)
    grads.append(g)
    updates, state = tx.update(g, state, y, stats=stats)
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
  _assert_close(_inverse(opt, X0, x_bar, stats, K), g_mean)
  # The clients' gradients differ (so the check is not about one repeated gradient), and the
  # statistics matter: inverting with fresh statistics gives something else.
  assert not np.allclose(grads[0]['w'], grads[-1]['w'], atol=1e-2)
  wrong = _inverse(opt, X0, x_bar, opt.track.init(X0), K)
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
  got = jax.jit(functools.partial(_inverse, opt))(X0, x_bar32, stats, jnp.float32(mean_steps))
  _assert_close(got, want)
  assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(got))


@pytest.mark.parametrize('kind', KINDS)
def test_statistics_frozen_during_local_training(kind):
  """The statistics are an argument of every client step, never client state: after ``K``
  steps (eager and in a jitted scan) the state is the step count alone; the same gradient twice
  gives the same step (while the ordinary optimiser, tracking its statistics, moves on)."""
  opt = gbo(kind, LR, **KIND_HPARAMS[kind])
  stats = _warm_stats(opt)
  a, b = _quadratics()
  y_eager, _, state = _train(opt, stats, a[0], b[0], K)
  assert isinstance(state, GBOCountState) and int(state.count) == K

  @jax.jit
  def local(stats, a, b):
    def step(carry, _):
      y, state = carry
      updates, state = opt.client.update(jax.grad(_loss)(y, a, b), state, y, stats=stats)
      return (optax.apply_updates(y, updates), state), None

    (y, state), _ = jax.lax.scan(step, (X0, opt.client.init(X0)), None, length=K)
    return y, state

  y, state = local(stats, a[0], b[0])
  assert isinstance(state, GBOCountState) and int(state.count) == K
  _assert_close(y, y_eager, rtol=1e-6, atol=1e-6)
  assert not np.allclose(y['w'], X0['w'])  # the model did move
  state = opt.client.init(X0)
  first, state = opt.client.update(H1, state, X0, stats=stats)
  _assert_close(opt.client.update(H1, state, X0, stats=stats)[0], first, rtol=0, atol=0)
  moving = opt.adaptive.init(X0)._replace(stats=stats)
  first, moving = opt.adaptive.update(H1, moving, X0)
  assert not np.allclose(opt.adaptive.update(H1, moving, X0)[0]['w'], first['w'])


def test_vmap_over_clients_matches_loop():
  """Local training vmapped over clients (stats broadcast) equals client-by-client training."""
  opt = gbo_adam(LR, b1=0.7, b2=0.95)
  stats = _warm_stats(opt)
  a, b = _quadratics()

  def local(a, b):
    def step(_, carry):
      y, state = carry
      updates, state = opt.client.update(jax.grad(_loss)(y, a, b), state, y, stats=stats)
      return optax.apply_updates(y, updates), state

    return jax.lax.fori_loop(0, K, step, (X0, opt.client.init(X0)))[0]

  ys = jax.jit(jax.vmap(local))(a, b)
  for i in range(NUM_CLIENTS):
    y, _, _ = _train(opt, stats, a[i], b[i], K)
    _assert_close(jax.tree.map(lambda t: t[i], ys), y, rtol=1e-6, atol=1e-6)


def test_sgdm_without_momentum_is_sgd():
  """``b1 = 0``: client steps are ``optax.sgd(lr)`` steps whatever ``m`` holds, and the server
  step sets ``m`` to the recovered mean gradient ``(x - x_bar) / (lr K)`` and ``x`` to ``x_bar``."""
  opt = gbo_sgdm(LR, b1=0.)
  stats = GBOStats(_tree(np.full((2, 3), 5.), np.full(3, -3.)), None)
  a, b = _quadratics()
  sgd = optax.sgd(LR)
  y_gbo, y_sgd = X0, X0
  tx = opt.client
  gbo_state, sgd_state = tx.init(X0), sgd.init(X0)
  for _ in range(K):
    u_gbo, gbo_state = tx.update(jax.grad(_loss)(y_gbo, a[0], b[0]), gbo_state, y_gbo,
                                 stats=stats)
    u_sgd, sgd_state = sgd.update(jax.grad(_loss)(y_sgd, a[0], b[0]), sgd_state, y_sgd)
    _assert_close(u_gbo, u_sgd, rtol=1e-6, atol=1e-7)
    y_gbo, y_sgd = optax.apply_updates(y_gbo, u_gbo), optax.apply_updates(y_sgd, u_sgd)
  _assert_close(y_gbo, y_sgd, rtol=1e-6, atol=1e-7)
  y, grads, _ = _train(opt, stats, a[0], b[0], K)
  delta = optax.tree_utils.tree_sub(X0, y)
  updates, server_state = opt.server.update(delta, GBOServerState(jnp.int32(0), stats), X0,
                                            num_steps=K)
  _assert_close(optax.apply_updates(X0, updates), y, rtol=1e-6, atol=1e-6)   # x <- x_bar
  assert int(server_state.count) == 1
  new = server_state.stats
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
  upd = _step(opt, f32(g), X0, stats)
  inv = _inverse(opt, X0, f32(x_bar), stats, 3.5)
  new = opt.track.update(f32(g), stats)[1]
  # The module-level functions are the same computations.
  b1, b2, eps = hp.get('b1'), hp.get('b2', hp.get('decay')), hp.get('eps', 0.)
  delta = optax.tree_utils.tree_sub(X0, f32(x_bar))
  _assert_close(inverse_step(delta, stats, LR, 3.5, b1, eps), inv, rtol=0, atol=0)
  for got, want in zip(track(stats, f32(g), b1, b2), new):
    assert (got is None) == (want is None)
    if want is not None:
      _assert_close(got, want, rtol=0, atol=0)
  for k in X0:
    d = np.asarray(X0[k], np.float64) - x_bar[k]
    if kind == 'sgdm':
      beta = hp['b1']
      want_upd = -LR * (beta * m[k] + (1 - beta) * g[k])
      want_inv = (d / (LR * 3.5) - beta * m[k]) / (1 - beta)
      want_m, want_v = beta * m[k] + (1 - beta) * g[k], None
    elif kind == 'rmsprop':
      beta, eps = hp['decay'], hp['eps']
      want_upd = -LR * g[k] / (np.sqrt(v[k]) + eps)
      want_inv = d * (np.sqrt(v[k]) + eps) / (LR * 3.5)
      want_m, want_v = None, beta * v[k] + (1 - beta) * g[k] ** 2
    else:
      b1, b2, eps = hp['b1'], hp['b2'], hp['eps']
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
  """``m`` starts at 0, ``v`` at 1, shaped and typed like params; absent statistics are None;
  the tracking, server and adaptive transformations all start there."""
  opt = gbo(kind, LR)
  stats = opt.track.init(X0)
  assert isinstance(stats, GBOStats)
  for other in (opt.server.init(X0).stats, opt.adaptive.init(X0).stats,
                init_stats(X0, 0.9 if kind != 'rmsprop' else None,
                           0.9 if kind != 'sgdm' else None)):
    assert jax.tree.structure(other) == jax.tree.structure(stats)
    jax.tree.map(np.testing.assert_array_equal, other, stats)
  for name, fill, present in (('m', 0., kind != 'rmsprop'), ('v', 1., kind != 'sgdm')):
    tree = getattr(stats, name)
    if not present:
      assert tree is None
      continue
    for k, x in X0.items():
      assert tree[k].shape == x.shape and tree[k].dtype == jnp.float32
      assert np.all(np.asarray(tree[k]) == fill)


def test_adam_without_momentum_is_rmsprop():
  """Adam with ``b1 = 0`` steps, inverts and tracks ``v`` as RMSProp (paper, §5)."""
  adam, rms = gbo_adam(LR, b1=0., b2=0.9), gbo_rmsprop(LR, decay=0.9)
  s_adam = _warm_stats(adam)
  s_rms = GBOStats(None, s_adam.v)
  _assert_close(_step(adam, H1, X0, s_adam), _step(rms, H1, X0, s_rms), rtol=1e-6, atol=1e-7)
  x_bar = jax.tree.map(lambda x, h: x - 0.01 * h, X0, H2)
  _assert_close(_inverse(adam, X0, x_bar, s_adam, 3), _inverse(rms, X0, x_bar, s_rms, 3),
                rtol=1e-6, atol=1e-6)
  _assert_close(adam.track.update(H1, s_adam)[1].v, rms.track.update(H1, s_rms)[1].v,
                rtol=1e-6, atol=1e-7)


def test_statistics_of_another_kind_are_refused():
  """An Adam client given SGDm's statistics (no v) took SGDm steps without a word."""
  adam, sgdm = gbo_adam(LR), gbo_sgdm(LR)
  sgdm_stats = init_stats(X0, 0.9, None)
  with pytest.raises(ValueError, match='gbo_client: statistics of another FedGBO optimiser: '
                     'this one needs m and v, got m'):
    adam.client.update(H1, adam.client.init(X0), X0, stats=sgdm_stats)
  with pytest.raises(ValueError, match='gbo_inverse: statistics of another'):
    adam.inverse.update(H1, adam.inverse.init(X0), X0, stats=sgdm_stats, num_steps=2.)
  sgdm.client.update(H1, sgdm.client.init(X0), X0, stats=sgdm_stats)   # its own kind


def test_defaults_and_bad_arguments():
  """Documented defaults (each optimiser by name steps, inverts and tracks as the one built with
  the defaults written out); unknown kinds, foreign or old hyper-parameter names and bad values
  are refused."""
  def same(got, want):
    assert got.kind == want.kind
    stats = _warm_stats(want)
    x_bar = jax.tree.map(lambda x, h: x - 0.01 * h, X0, H2)
    _assert_close(_step(got, H1, X0, stats), _step(want, H1, X0, stats), rtol=0, atol=0)
    _assert_close(_inverse(got, X0, x_bar, stats, 3), _inverse(want, X0, x_bar, stats, 3),
                  rtol=0, atol=0)
    jax.tree.map(np.testing.assert_array_equal, got.track.update(H1, stats)[1],
                 want.track.update(H1, stats)[1])

  same(gbo('sgdm', 0.1), gbo_sgdm(0.1, b1=0.9))
  same(gbo('rmsprop', 0.1), gbo_rmsprop(0.1, decay=0.9, eps=1e-3))
  same(gbo('adam', 0.1), gbo_adam(0.1, b1=0.9, b2=0.99, eps=1e-3))
  same(gbo('rmsprop', 0.1, decay=0.5), gbo_rmsprop(0.1, decay=0.5, eps=1e-3))
  with pytest.raises(AssertionError):   # the comparison sees a different hyper-parameter
    same(gbo('sgdm', 0.1), gbo_sgdm(0.1, b1=0.8))
  with pytest.raises(ValueError, match='unknown FedGBO'):
    gbo('yogi', 0.1)
  with pytest.raises(ValueError, match='beta1'):
    gbo('sgdm', 0.1, beta1=0.9)
  with pytest.raises(ValueError, match='beta2'):
    gbo('adam', 0.1, beta2=0.9)
  with pytest.raises(ValueError, match='beta'):
    gbo('rmsprop', 0.1, beta=0.5)
  with pytest.raises(ValueError, match='eps'):
    gbo('sgdm', 0.1, eps=1e-3)
  with pytest.raises(ValueError):
    gbo_sgdm(0.1, b1=1.)
  with pytest.raises(ValueError):
    gbo_adam(0.1, b1=-0.1)
  with pytest.raises(ValueError):
    gbo_rmsprop(0.1, eps=-1.)
  with pytest.raises(ValueError):
    gbo_rmsprop(0.)


def test_none_leaves_pass_through_as_in_optax():
  """A ``None`` leaf (no parameter there) crashed every FedGBO transformation but tracking."""
  with_none = {**X0, 'frozen': None}
  grads = {**H1, 'frozen': None}
  for kind in KINDS:
    opt = gbo(kind, LR, **KIND_HPARAMS[kind])
    stats = _warm_stats(opt)
    stats_of = lambda t, s=stats: GBOStats(*(x if x is None or t is X0 else {**x, 'frozen': None}
                                             for x in s))
    for name, run in (
        ('client', lambda t, g: opt.client.update(g, opt.client.init(t), t, stats=stats_of(t))),
        ('adaptive', lambda t, g: opt.adaptive.update(g, opt.adaptive.init(t), t)),
        ('server', lambda t, g: opt.server.update(g, opt.server.init(t), t, num_steps=2.))):
      got, want = run(with_none, grads)[0], run(X0, H1)[0]
      assert got['frozen'] is None, (kind, name)
      _assert_close({k: got[k] for k in X0}, want, rtol=0, atol=0)


@pytest.mark.parametrize('make, error, words', [
    (lambda: gbo_adam(LR, b2=None), TypeError, 'gbo_adam: b2 must be a number, got None'),
    (lambda: gbo_rmsprop(LR, decay=None), TypeError, 'gbo_rmsprop: decay must be a number'),
    (lambda: gbo_sgdm(LR, b1=None), TypeError, 'gbo_sgdm: b1 must be a number'),
    (lambda: gbo_adam(LR, eps=float('inf')), ValueError, 'eps must be >= 0 and finite'),
    (lambda: gbo_sgdm(LR, b1=np.array([1.])), ValueError, r'b1 must be in \[0, 1\)'),
], ids=['adam_without_b2', 'rmsprop_without_decay', 'sgdm_without_b1', 'eps_inf', 'b1_array'])
def test_a_kind_without_its_hyper_parameters_is_refused(make, error, words):
  """``None`` made Adam run SGDm and RMSProp plain SGD under their own names; an infinite
  ``eps`` never moved; a one-element array of 1 was not checked (an infinite inverse step)."""
  with pytest.raises(error, match=words):
    make()


@pytest.mark.parametrize('num_steps', [0, -2, float('nan'), np.array([0.])])
def test_the_inverse_step_refuses_a_known_step_count_that_is_not_positive(num_steps):
  """``K = 0`` gave inf, ``K = -2`` the opposite sign, NaN NaN; a traced K is the caller's."""
  opt = gbo_sgdm(LR)
  with pytest.raises(ValueError, match=r'gbo_inverse num_steps must be > 0'):
    opt.inverse.update(H1, opt.inverse.init(X0), X0, stats=_warm_stats(opt), num_steps=num_steps)
