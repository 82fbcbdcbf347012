"""FedAdagrad / FedYogi / FedAdam against plain-numpy hand computations of Reddi et al. 2021."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_gel.optim.fedopt import FedOptState, fedadagrad, fedadam, fedyogi

B1, B2, TAU, LR = 0.9, 0.99, 1e-3, 0.1


def _tree(a, b):
  return {'w': jnp.asarray(a, jnp.float32), 'b': jnp.asarray(b, jnp.float32)}


PARAMS = _tree([[1.0, -2.0], [0.5, 3.0]], [0.25, -1.0, 2.0])
# Step-1 and step-2 "gradients" (Delta = x - y); mixes tiny and large entries.
G1 = _tree([[0.5, -2.0], [0.0, 1.5]], [-0.3, 0.05, 3.0])
G2 = _tree([[-0.5, 0.1], [2.0, -0.2]], [0.3, -4.0, 0.01])


def _np(tree):
  return {k: np.asarray(v, np.float64) for k, v in tree.items()}


def _hand(method, grads, v0, lr=LR, b1=B1, b2=B2, tau=TAU):
  """Independent numpy reference: list of (updates, m, v) after each step, per leaf."""
  out = []
  m = {k: np.zeros_like(g) for k, g in grads[0].items()}
  v = {k: np.full_like(g, v0) for k, g in grads[0].items()}
  for g in grads:
    upd, m_new, v_new = {}, {}, {}
    for k in g:
      gk = g[k]
      m_new[k] = b1 * m[k] + (1 - b1) * gk
      if method == 'adagrad':
        v_new[k] = v[k] + gk ** 2
      elif method == 'yogi':
        v_new[k] = v[k] - (1 - b2) * gk ** 2 * np.sign(v[k] - gk ** 2)
      else:
        v_new[k] = b2 * v[k] + (1 - b2) * gk ** 2
      upd[k] = -lr * m_new[k] / (np.sqrt(v_new[k]) + tau)
    m, v = m_new, v_new
    out.append((upd, m, v))
  return out


def _run(tx, grads, params=PARAMS):
  state = tx.init(params)
  out = []
  for g in grads:
    upd, state = tx.update(g, state, params)
    out.append((upd, state))
  return out


def _assert_tree_close(got, want, rtol=1e-5, atol=1e-7):
  assert set(got) == set(want)
  for k in want:
    np.testing.assert_allclose(np.asarray(got[k], np.float64), want[k], rtol=rtol, atol=atol)


@pytest.mark.parametrize('name,make', [
    ('adagrad', lambda: fedadagrad(LR, b1=B1, eps=TAU)),
    ('yogi', lambda: fedyogi(LR, b1=B1, b2=B2, eps=TAU)),
    ('adam', lambda: fedadam(LR, b1=B1, b2=B2, eps=TAU)),
])
def test_one_and_two_steps_match_hand_computation(name, make):
  """Default v_0 = tau^2; updates, m and v after steps 1 and 2 equal the numpy reference."""
  got = _run(make(), [G1, G2])
  want = _hand(name, [_np(G1), _np(G2)], v0=TAU ** 2)
  for (upd, state), (w_upd, w_m, w_v) in zip(got, want):
    assert isinstance(state, FedOptState)
    _assert_tree_close(upd, w_upd)
    _assert_tree_close(state.m, w_m)
    _assert_tree_close(state.v, w_v, rtol=1e-5, atol=1e-12)
    for leaf in jax.tree.leaves(upd):
      assert leaf.dtype == jnp.float32
  assert int(got[-1][1].count) == 2


def test_initial_state():
  state = fedyogi(LR).init(PARAMS)
  for k in PARAMS:
    np.testing.assert_array_equal(state.m[k], np.zeros(PARAMS[k].shape, np.float32))
    np.testing.assert_allclose(state.v[k], np.full(PARAMS[k].shape, TAU ** 2), rtol=1e-6)
    assert state.m[k].dtype == state.v[k].dtype == jnp.float32
  state = fedadam(LR, initial_accumulator=0.25).init(PARAMS)
  np.testing.assert_array_equal(state.v['w'], np.full((2, 2), 0.25, np.float32))


def test_yogi_sign_branch_both_ways():
  """v_0 = 1: entries with g^2 < v shrink v, entries with g^2 > v grow it, at both steps."""
  v0 = 1.0
  g1 = _tree([[0.5, -2.0], [0.1, 1.5]], [-0.3, 0.2, 3.0])
  g2 = _tree([[-0.5, 0.1], [2.0, -0.2]], [0.3, -4.0, 0.01])
  grads = [_np(g1), _np(g2)]
  want = _hand('yogi', grads, v0=v0)
  # The data really exercises both branches at both steps.
  v_prev = {k: np.full_like(g, v0) for k, g in grads[0].items()}
  for g, (_, _, v) in zip(grads, want):
    signs = np.concatenate([np.sign(v_prev[k] - g[k] ** 2).ravel() for k in g])
    assert (signs > 0).any() and (signs < 0).any()
    v_prev = v
  got = _run(fedyogi(LR, initial_accumulator=v0), [g1, g2])
  for (upd, state), (w_upd, w_m, w_v) in zip(got, want):
    _assert_tree_close(upd, w_upd)
    _assert_tree_close(state.m, w_m)
    _assert_tree_close(state.v, w_v)
  # Yogi's v differs from Adam's on the shrinking entries.
  adam_v = _hand('adam', grads, v0=v0)[0][2]
  assert not np.allclose(want[0][2]['w'], adam_v['w'])
  # ...and the default-v_0 run also hits both branches (tiny and large g vs tau^2).
  g = _np(_tree([[5e-4, -2.0], [1e-4, 1.5]], [0.0, 0.2, 3.0]))
  signs = np.concatenate([np.sign(TAU ** 2 - g[k] ** 2).ravel() for k in g])
  assert (signs > 0).any() and (signs < 0).any()
  (upd, state), = _run(fedyogi(LR), [_tree(g['w'], g['b'])])
  (w_upd, _, w_v), = _hand('yogi', [g], v0=TAU ** 2)
  _assert_tree_close(upd, w_upd)
  _assert_tree_close(state.v, w_v, atol=1e-13)


def test_server_step_moves_toward_client():
  """x <- x + updates with Delta = x - y moves x toward y by lr (1-b1)|g| / (sqrt(v_1) + tau)."""
  x = _tree([[1.0, -2.0], [0.5, 3.0]], [0.25, -1.0, 2.0])
  y = _tree([[0.0, 1.0], [0.4, 3.5]], [-0.75, -1.2, 5.0])
  delta = jax.tree.map(lambda a, b: a - b, x, y)
  tx = fedadam(LR)
  upd, _ = tx.update(delta, tx.init(x), x)
  x_new = optax.apply_updates(x, upd)
  for k in x:
    step = np.asarray(x_new[k], np.float64) - np.asarray(x[k], np.float64)
    toward = np.asarray(y[k], np.float64) - np.asarray(x[k], np.float64)
    assert np.all(np.sign(step) == np.sign(toward))
    g = np.asarray(delta[k], np.float64)
    v1 = B2 * TAU ** 2 + (1 - B2) * g ** 2
    np.testing.assert_allclose(np.abs(step), LR * (1 - B1) * np.abs(g) / (np.sqrt(v1) + TAU),
                               rtol=1e-4)


def test_fedadam_differs_from_optax_adam():
  """optax.adam bias-corrects (m / (1 - b1^t), v / (1 - b2^t)) and starts from v_0 = 0, so its
  first step is lr g / (|g| + eps) whatever b1, b2 are. FedAdam's is
  lr (1 - b1) g / (sqrt(b2 tau^2 + (1 - b2) g^2) + tau): close to lr sign(g) only when |g| >> tau
  (at the defaults (1 - b1) / sqrt(1 - b2) = 1), noticeably smaller for moderate g (0.05 here)."""
  ours, _ = fedadam(LR, b1=B1, b2=B2, eps=TAU).update(G1, fedadam(LR).init(PARAMS))
  ref = optax.adam(LR, b1=B1, b2=B2, eps=TAU)
  theirs, _ = ref.update(G1, ref.init(PARAMS))
  g = _np(G1)
  for k in g:
    np.testing.assert_allclose(theirs[k], -LR * g[k] / (np.abs(g[k]) + TAU), rtol=1e-5, atol=1e-7)
  diff = max(float(np.max(np.abs(np.asarray(ours[k]) - np.asarray(theirs[k])))) for k in g)
  assert diff > 1e-3
  # g = 0.05 (b[1]): ~0.082 lr versus ~0.098 lr.
  assert abs(float(ours['b'][1])) < 0.9 * abs(float(theirs['b'][1]))


def test_learning_rate_schedule():
  """A schedule is evaluated at the number of updates applied so far: lr(0), then lr(1)."""
  sched = lambda count: 0.1 * (count + 1.0)
  got = _run(fedadam(sched), [G1, G2])
  grads = [_np(G1), _np(G2)]
  unit = _hand('adam', grads, v0=TAU ** 2, lr=1.0)
  for step, ((upd, _), (w_upd, _, _)) in enumerate(zip(got, unit)):
    _assert_tree_close(upd, {k: 0.1 * (step + 1) * w for k, w in w_upd.items()})


@pytest.mark.parametrize('make', [fedadagrad, fedyogi, fedadam])
def test_jit_and_vmap(make):
  """vmap over 3 independent problems (under jit) equals three separate eager runs."""
  tx = make(LR)
  rng = np.random.default_rng(0)
  params = _tree(rng.normal(size=(3, 2, 2)), rng.normal(size=(3, 3)))
  grads = [_tree(rng.normal(size=(3, 2, 2)), rng.normal(size=(3, 3))) for _ in range(2)]

  @jax.jit
  @jax.vmap
  def two_steps(p, g1, g2):
    s = tx.init(p)
    u1, s = tx.update(g1, s, p)
    p = optax.apply_updates(p, u1)
    u2, s = tx.update(g2, s, p)
    return optax.apply_updates(p, u2), s

  batched_p, batched_s = two_steps(params, *grads)
  for i in range(3):
    take = lambda t: jax.tree.map(lambda a: a[i], t)
    p = take(params)
    s = tx.init(p)
    for g in grads:
      u, s = tx.update(take(g), s, p)
      p = optax.apply_updates(p, u)
    for k in p:
      np.testing.assert_allclose(batched_p[k][i], p[k], rtol=1e-6, atol=1e-7)
      np.testing.assert_allclose(batched_s.v[k][i], s.v[k], rtol=1e-6, atol=1e-12)
      assert batched_p[k].dtype == jnp.float32


@pytest.mark.parametrize('make,words', [
    (lambda: fedadam(-LR), 'learning_rate must be finite and >= 0, got -0.1'),
    (lambda: fedadam(float('inf')), 'learning_rate must be finite and >= 0, got inf'),
    (lambda: fedyogi(LR, b1=1.), r'b1 must be in \[0, 1\), got 1.0'),
    (lambda: fedadam(LR, b2=1.5), r'b2 must be in \[0, 1\], got 1.5'),
    (lambda: fedyogi(LR, b2=-0.1), r'b2 must be in \[0, 1\]'),
    (lambda: fedadagrad(LR, eps=0.), "eps must be positive and finite .Reddi et al.'s tau., got 0.0"),
    (lambda: fedadagrad(LR, initial_accumulator=-1.), 'initial_accumulator must be >= 0'),
    (lambda: fedadam(jnp.float32(-1.)), 'learning_rate must be finite and >= 0, got -1.0'),
    (lambda: fedadam(LR, b1=np.float32(2.)), r'b1 must be in \[0, 1\)'),
], ids=['lr_negative', 'lr_inf', 'b1_one', 'b2_above_one', 'b2_negative', 'tau_zero',
        'negative_accumulator', 'jax_scalar', 'numpy_scalar'])
def test_hyperparameters_outside_their_range_are_refused(make, words):
  """``tau = 0`` divides ``0 / 0`` where a leaf's ``g`` and ``v_0`` are zero; the others leave
  Reddi et al.'s algorithm (a momentum of 1 never forgets, a negative rate ascends)."""
  with pytest.raises(ValueError, match=words):
    make()


def test_schedules_and_traced_hyperparameters_are_left_to_the_caller():
  fedadam(optax.constant_schedule(LR))
  # a warm-up from 0, injected: evaluated to a JAX scalar of 0 at the first step, eagerly
  warm = optax.inject_hyperparams(fedadam)(learning_rate=optax.linear_schedule(0., LR, 10))
  warm.update(G1, warm.init(PARAMS))
  jax.jit(lambda lr: fedadam(lr).update(G1, fedadam(LR).init(PARAMS))[0])(jnp.float32(LR))
