"""GeL, FedProx, FedNova and FedOpt in the engine, each against an independent oracle."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_gel import algorithms, optim
from fedjax_gel.algorithms import GuessPolicy
from fedjax_gel.core import federated_data as fd
from fedjax_gel.core import keys
from fedjax_gel.core.round import build_round

from helpers import (EMPTY_CLIENT, TAU_MAX, assert_trees_close, cohort, grad_of, init_params,
                     minibatches, run, with_guesses)

LR, ALPHA = 0.1, 0.9
tree_map = jax.tree_util.tree_map


def sgdm_by_hand(data, loss, x, cid, slot, tau, grad_fn=None):
  """GeL's client momentum loop (eqs. 1-2) on the engine's minibatches: ``(y, v, last grad)``."""
  grad_fn = grad_fn or grad_of(loss)
  y, v, g = x, tree_map(jnp.zeros_like, x), None
  for batch in minibatches(data, cid, slot, tau):
    g = grad_fn(y, batch)
    v = tree_map(lambda v, g: ALPHA * v - LR * g, v, g)
    y = tree_map(jnp.add, y, v)
  return y, v, g


def weighted(trees, weights):
  total = sum(weights)
  return tree_map(lambda *ls: sum(w * l for w, l in zip(weights, ls)) / total, *trees)


@pytest.mark.parametrize('no_guesses', ['zero_counts', 'policy_none'])
@pytest.mark.slow
def test_gel_with_zero_guesses_is_fedavgcm(data, loss, model, no_guesses):
  x = init_params(model)
  c = cohort([1, 5, 9], [2, 6, 4], [1., 2., 3.])
  if no_guesses == 'zero_counts':
    alg = with_guesses(algorithms.gel(loss, LR, ALPHA), [0, 0, 0])
  else:
    alg = algorithms.gel(loss, LR, ALPHA, guess_policy=GuessPolicy('none'))
  gel, _ = run(alg, data, c, x, chunk_size=3)
  cm, _ = run(algorithms.fedavgcm(loss, LR, ALPHA), data, c, x, chunk_size=3)
  assert_trees_close(gel.params, cm.params, tol=1e-7)


@pytest.mark.slow
def test_gel_defaults_differ_from_fedavgcm_by_the_papers_nudge(data, loss, model):
  """GeL from Python without extra arguments guesses tau'_i = b + 5 - tau_i (budgets U{1..b}):
  x'_GeL - x'_CM = sum_i p_i alpha (1 - alpha^tau'_i) / (1 - alpha) v_i, v_i by hand."""
  x = init_params(model)
  ids, taus, w = [1, 5, 9, 3], [2, TAU_MAX, 4, 1], [1., 2., 3., 1.]
  c = cohort(ids, taus, w, max_budget=TAU_MAX)   # spec budget_range (1, TAU_MAX)
  gel, _ = run(algorithms.gel(loss, LR, ALPHA), data, c, x, chunk_size=2)
  cm, _ = run(algorithms.fedavgcm(loss, LR, ALPHA), data, c, x, chunk_size=2)
  nudges = []
  for slot, (cid, tau) in enumerate(zip(ids, taus)):
    _, v, _ = sgdm_by_hand(data, loss, x, cid, slot, tau)
    tp = TAU_MAX + 5 - tau
    nudges.append(tree_map(lambda v: ALPHA * (1 - ALPHA ** tp) / (1 - ALPHA) * v, v))
  diff = tree_map(jnp.subtract, gel.params, cm.params)
  assert max(float(jnp.abs(d).max()) for d in jax.tree_util.tree_leaves(diff)) > 1e-3
  assert_trees_close(diff, weighted(nudges, w), tol=1e-5)


@pytest.mark.slow
def test_gel_clients_take_the_eq5_nudge_each_with_its_own_count(data, loss, model):
  """x' = sum_i p_i [y_i + alpha (1 - alpha^tau'_i) / (1 - alpha) v_i] (seed 000, eq. 5)."""
  x = init_params(model)
  ids, taus, guesses, w = [1, 5, 9], [2, 6, 4], [3., 0., jnp.inf], [1., 2., 3.]
  state, _ = run(with_guesses(algorithms.gel(loss, LR, ALPHA), guesses), data,
                 cohort(ids, taus, w), x, chunk_size=2)
  ys = []
  for slot, (cid, tau, tp) in enumerate(zip(ids, taus, guesses)):
    y, v, _ = sgdm_by_hand(data, loss, x, cid, slot, tau)
    nudge = ALPHA / (1 - ALPHA) if np.isinf(tp) else ALPHA * (1 - ALPHA ** tp) / (1 - ALPHA)
    ys.append(tree_map(lambda y, v: y + nudge * v, y, v))
  assert_trees_close(state.params, weighted(ys, w), tol=1e-5)


def test_fedavg_gel_guesses_with_the_last_gradient(data, loss, model):
  """Plain SGD clients; each guess repeats the last gradient step: y - tau' lr g_last."""
  x = init_params(model)
  ids, taus, guesses = [3, 7], [5, 2], [4., 1.]
  state, _ = run(with_guesses(algorithms.fedavg_gel(loss, LR), guesses), data,
                 cohort(ids, taus), x, chunk_size=2)
  ys = []
  for slot, (cid, tau, tp) in enumerate(zip(ids, taus, guesses)):
    y, g = x, None
    for batch in minibatches(data, cid, slot, tau):
      g = grad_of(loss)(y, batch)
      y = tree_map(lambda p, g: p - LR * g, y, g)
    ys.append(tree_map(lambda p, g: p - tp * LR * g, y, g))
  assert_trees_close(state.params, weighted(ys, [1., 1.]), tol=1e-5)


@pytest.mark.parametrize('guesses', [False, True])
@pytest.mark.slow
def test_fedprox_gradient_is_autodiff_of_the_proximal_objective(data, loss, model, guesses):
  """Client steps on f(y) + mu/2 ||y - x||^2; the guessed nudge ignores the proximal term."""
  mu, x = 0.5, init_params(model)
  ids, taus, tps = [5, 9], [6, 4], [2., 5.]
  alg = (with_guesses(algorithms.fedprox_gel(loss, LR, mu, ALPHA), tps) if guesses
         else algorithms.fedprox(loss, LR, mu, ALPHA))
  state, _ = run(alg, data, cohort(ids, taus), x, chunk_size=2)

  def proximal(y, batch):
    sq = sum(jnp.sum((a - b) ** 2) for a, b in zip(jax.tree_util.tree_leaves(y),
                                                     jax.tree_util.tree_leaves(x)))
    return loss(y, batch) + mu / 2 * sq

  ys = []
  for slot, (cid, tau, tp) in enumerate(zip(ids, taus, tps)):
    y, v, _ = sgdm_by_hand(data, loss, x, cid, slot, tau, jax.grad(proximal))
    nudge = ALPHA * (1 - ALPHA ** tp) / (1 - ALPHA) if guesses else 0.
    ys.append(tree_map(lambda y, v: y + nudge * v, y, v))
  assert_trees_close(state.params, weighted(ys, [1., 1.]), tol=1e-5)


@pytest.mark.parametrize('momentum', [0.0, ALPHA])
@pytest.mark.slow
def test_fednova_with_equal_budgets_is_fedavg(data, loss, model, momentum):
  x = init_params(model)
  c = cohort([1, 5, 9], [4, 4, 4], [1., 2., 3.])
  nova, _ = run(algorithms.fednova(loss, LR, momentum), data, c, x, chunk_size=3)
  avg, _ = run(algorithms.fedavg(loss, optax.sgd(LR, momentum=momentum or None)), data, c, x,
               chunk_size=3)
  assert_trees_close(nova.params, avg.params, tol=1e-5)


@pytest.mark.parametrize('guesses', [False, True])
@pytest.mark.slow
def test_fednova_normalises_by_the_lemma1_coefficients(data, loss, model, guesses):
  """x' = x - tau_eff sum_i p_i Delta_i / ||a_i||_1, ||a_i||_1 summed from eq. 6 by hand."""
  x = init_params(model)
  ids, taus, tps, w = [1, 5, 9], [2, 6, 4], [5., 2., 0.], [1., 2., 3.]
  alg = (with_guesses(algorithms.fednova_gel(loss, LR, ALPHA), tps) if guesses
         else algorithms.fednova(loss, LR, ALPHA))
  state, _ = run(alg, data, cohort(ids, taus, w), x, chunk_size=3)
  p = np.array(w) / sum(w)
  normalized, norms = [], []
  for slot, (cid, tau, tp) in enumerate(zip(ids, taus, tps)):
    tp = tp if guesses else 0.
    y, v, _ = sgdm_by_hand(data, loss, x, cid, slot, tau)
    y = tree_map(lambda y, v: y + ALPHA * (1 - ALPHA ** tp) / (1 - ALPHA) * v, y, v)
    a1 = sum((1 - ALPHA ** (tp + tau - k)) / (1 - ALPHA) for k in range(tau))
    normalized.append(tree_map(lambda x0, y: (x0 - y) / a1, x, y))
    norms.append(a1)
  tau_eff = float(np.dot(p, norms))
  d = weighted(normalized, w)
  assert_trees_close(state.params, tree_map(lambda x0, d: x0 - tau_eff * d, x, d), tol=1e-5)


def second_moment(name, d, b2, tau):
  """v_1 from v_0 = tau^2 (Reddi et al. 2021, Algorithm 2), by hand."""
  v0 = tau ** 2
  if name == 'fedadagrad':
    return v0 + d ** 2
  if name == 'fedyogi':
    return v0 - (1 - b2) * d ** 2 * np.sign(v0 - d ** 2)
  return b2 * v0 + (1 - b2) * d ** 2


@pytest.mark.parametrize('name', ['fedadam', 'fedyogi', 'fedadagrad'])
@pytest.mark.slow
def test_fedopt_round_is_one_hand_computed_server_step(data, loss, model, name):
  """Client SGD; server: m = (1-b1) Delta, v_1 as above, x' = x - lr m / (sqrt(v_1) + tau)."""
  x, lr, b1, b2, tau = init_params(model), 0.3, 0.9, 0.99, 1e-3
  server = {'fedadam': lambda: optim.fedadam(lr, b1, b2, tau),
            'fedyogi': lambda: optim.fedyogi(lr, b1, b2, tau),
            'fedadagrad': lambda: optim.fedadagrad(lr, b1, tau)}[name]()
  alg = algorithms.fedavg(loss, optax.sgd(LR), server, name)
  state, _ = run(alg, data, cohort([2, 6], [3, 5], [1., 3.]), x, chunk_size=2)
  ys = []
  for slot, (cid, t) in enumerate(zip([2, 6], [3, 5])):
    y = x
    for batch in minibatches(data, cid, slot, t):
      y = tree_map(lambda p, g: p - LR * g, y, grad_of(loss)(y, batch))
    ys.append(y)
  delta = tree_map(lambda x0, y: np.asarray(x0 - y, np.float64), x, weighted(ys, [1., 3.]))

  def step(x0, d):
    return x0 - lr * (1 - b1) * d / (np.sqrt(second_moment(name, d, b2, tau)) + tau)

  assert_trees_close(state.params, tree_map(step, x, delta), tol=1e-5)


def test_fedyogi_gel_is_the_eq5_nudge_then_one_yogi_step(data, loss, model):
  x, lr, b1, b2, tau = init_params(model), 0.3, 0.9, 0.99, 1e-3
  ids, taus, tps, w = [2, 6], [3, 5], [4., 1.], [1., 3.]
  alg = algorithms.gel(loss, LR, ALPHA, optim.fedyogi(lr, b1, b2, tau), name='fedyogi_gel')
  state, _ = run(with_guesses(alg, tps), data, cohort(ids, taus, w), x, chunk_size=2)
  ys = []
  for slot, (cid, t, tp) in enumerate(zip(ids, taus, tps)):
    y, v, _ = sgdm_by_hand(data, loss, x, cid, slot, t)
    ys.append(tree_map(lambda y, v: y + ALPHA * (1 - ALPHA ** tp) / (1 - ALPHA) * v, y, v))
  delta = tree_map(lambda x0, y: np.asarray(x0 - y, np.float64), x, weighted(ys, w))

  def step(x0, d):
    return x0 - lr * (1 - b1) * d / (np.sqrt(second_moment('fedyogi', d, b2, tau)) + tau)

  assert_trees_close(state.params, tree_map(step, x, delta), tol=1e-5)


@pytest.mark.slow
def test_fednova_client_without_steps_is_inert(data, loss, model):
  """tau_i = 0 gives ||a_i||_1 = 0: the client must add nothing (and no NaN) to the round."""
  x = init_params(model)
  alg = algorithms.fednova(loss, LR, ALPHA)
  both, _ = run(alg, data, cohort([1, 5], [0, 4], [1., 1.]), x, chunk_size=2)
  assert all(np.isfinite(leaf).all() for leaf in jax.tree_util.tree_leaves(both.params))
  alone, _ = run(alg, data, cohort([1, 5], [0, 4], [0., 1.]), x, chunk_size=2)
  # p = (1/2, 1/2): tau_eff = a_5 / 2 and the mean normalised update d_5 / 2, so the step is a
  # quarter of client 5's own Delta_5 = a_5 d_5 (the step when it is alone).
  assert_trees_close(tree_map(lambda x0, b: x0 - b, x, both.params),
                     tree_map(lambda x0, s: 0.25 * (x0 - s), x, alone.params), tol=1e-5)


def test_guess_proxies_that_would_mislead_are_refused(loss):
  with pytest.raises(ValueError, match='zero-proxy guesses without momentum do nothing'):
    algorithms.fedavg_gel(loss, LR, proxy='zero')
  for zero in (0.0, np.float32(0.), jnp.float32(0.)):   # NumPy and JAX zeros ran as FedAvg
    with pytest.raises(ValueError, match='zero-proxy guesses without momentum do nothing'):
      algorithms.gel(loss, LR, momentum=zero)
  with pytest.raises(ValueError, match='infinitely many guesses need the zero proxy'):
    algorithms.gel(loss, LR, ALPHA, proxy='last_gradient', guess_policy=GuessPolicy('inf'))


@pytest.mark.slow
def test_gel_client_optimiser_and_guess_policy_go_together(data, loss, model):
  """A GeL client optimiser without a guess policy, or a guess policy without one, is refused
  by server_init; a GeL state inside optax.chain is found and guesses like gel's."""
  x = init_params(model)
  for alg in (algorithms.local_sgd(loss, optim.gel_sgdm(LR, ALPHA)),
              algorithms.fedavg(loss, optim.gel_sgdm(LR, ALPHA))):
    with pytest.raises(ValueError, match='no guess policy'):
      alg.server_init(x)
  with pytest.raises(ValueError, match='holds no GeL state'):
    algorithms.local_sgd(loss, optax.sgd(LR), client_guesses=GuessPolicy().counts).server_init(x)
  policy = GuessPolicy('fixed', count=3)
  chained = optax.chain(optax.clip_by_global_norm(10.), optim.gel_sgdm(LR, ALPHA))
  c = cohort([1, 5, 9], [2, 6, 4], [1., 2., 3.])
  got, _ = run(algorithms.local_sgd(loss, chained, client_guesses=policy.counts), data, c, x,
               chunk_size=2)
  want, _ = run(algorithms.gel(loss, LR, ALPHA, guess_policy=policy), data, c, x, chunk_size=2)
  assert_trees_close(got.params, want.params, tol=1e-6)


@pytest.mark.parametrize('policy,expect', [
    (GuessPolicy('none'), [0, 0, 0, 0]),
    (GuessPolicy(), [14, 9, 5, 6]),                     # tau = b + 5 = 18
    (GuessPolicy('remaining', tau=18), [14, 9, 5, 6]),
    (GuessPolicy('remaining', tau=10), [6, 1, 0, 0]),
    (GuessPolicy('cohort_max', k=2), [11, 6, 2, 3]),
    (GuessPolicy('inf'), [np.inf] * 4),
    (GuessPolicy('fixed', count=5), [5, 5, 5, 5]),
    (GuessPolicy('percent', percent=25.), [1, 2, 3, 3]),
])
def test_guess_policies_by_hand(policy, expect):
  np.testing.assert_array_equal(policy.counts(jnp.array([4, 9, 13, 12]), 13), expect)


@pytest.mark.parametrize('policy,error,words', [
    (GuessPolicy('fixed', 5), ValueError, r"GuessPolicy\('fixed'\) does not read tau \(got 5\); "
     r"it reads count, given by name: GuessPolicy\('fixed', count=...\)"),
    (GuessPolicy('cohort_max', 2), ValueError, "does not read tau"),
    (GuessPolicy('inf', count=3), ValueError, 'does not read count .* it reads no field'),
    (GuessPolicy('fixed', count='5'), TypeError, "count must be a whole number, got '5'"),
    (GuessPolicy('percent', percent='25'), TypeError, "percent must be a number, got '25'"),
], ids=['fixed_positional', 'cohort_max_positional', 'inf_count', 'count_str', 'percent_str'])
def test_a_policy_field_its_kind_does_not_read_or_no_number_is_refused(loss, policy, error,
                                                                       words):
  """``GuessPolicy('fixed', 5)`` put 5 in ``tau`` and took no guess: GeL trained as FedAvgCM."""
  with pytest.raises(error, match=words):
    algorithms.gel(loss, LR, ALPHA, guess_policy=policy)


@pytest.mark.slow
def test_cohort_max_reads_the_steps_taken_not_the_budgets_of_clients_without_data(data, loss,
                                                                                   model):
  """An empty client takes no step: its budget (6) must not raise the cohort's maximum, which
  is client 1's own 2, so client 1 guesses 2 + 0 - 2 = 0 steps and the round is FedAvgCM's."""
  x = init_params(model)
  c = cohort([1, EMPTY_CLIENT], [2, 6], [1., 1.])
  gel, _ = run(algorithms.gel(loss, LR, ALPHA, guess_policy=GuessPolicy('cohort_max', k=0)),
               data, c, x, chunk_size=2)
  cm, _ = run(algorithms.fedavgcm(loss, LR, ALPHA), data, c, x, chunk_size=2)
  assert_trees_close(gel.params, cm.params, tol=1e-7)


def test_guess_counts_do_not_recompile(data, loss, model):
  traces = []

  def counting_loss(p, b):
    traces.append(1)
    return loss(p, b)

  alg = algorithms.gel(counting_loss, LR, ALPHA)   # tau'_i = b + 5 - tau_i, per cohort
  rf = build_round(alg, chunk_size=2)
  state = alg.server_init(init_params(model))
  state, _ = rf(state, cohort([1, 2], [3, 4]), data, keys.root_key(0), jnp.int32(0))
  compiled_once = len(traces)
  for budgets in ([1, 6], [5, 2]):
    state, _ = rf(state, cohort([1, 2], budgets), data, keys.root_key(0), jnp.int32(1))
  assert compiled_once > 0 and len(traces) == compiled_once


def test_fedexp_step_is_the_extrapolated_mean_update(model, loss):
  """x' = x - eta_g Delta, eta_g = max(1, sum_i p_i ||Delta_i||^2 / (2 (||Delta||^2 + eps))),
  on two clients whose labels disagree (y = argmax(xW) and argmax(-xW)), so eta_g > 1."""
  rng = np.random.default_rng(1)
  w = rng.normal(size=(4, 3))
  xs = [rng.normal(size=(12, 4)).astype(np.float32) for _ in range(2)]
  ys = [np.argmax(xs[0] @ w, 1), np.argmax(-xs[1] @ w, 1)]
  data = fd.to_device(fd.from_client_arrays(
      [{'x': x, 'y': y.astype(np.int32)} for x, y in zip(xs, ys)]))
  x, eps = init_params(model), 1e-3
  ids, taus, w8 = [0, 1], [6, 6], [1., 1.]
  state, metrics = run(algorithms.fedexp(loss, LR, eps), data, cohort(ids, taus, w8), x,
                       chunk_size=2)
  deltas = []
  for slot, (cid, tau) in enumerate(zip(ids, taus)):
    y = x
    for batch in minibatches(data, cid, slot, tau):
      y = tree_map(lambda p, g: p - LR * g, y, grad_of(loss)(y, batch))
    deltas.append(np.concatenate([np.ravel(a - b) for a, b in zip(
        jax.tree_util.tree_leaves(x), jax.tree_util.tree_leaves(y))]).astype(np.float64))
  mean = (deltas[0] + deltas[1]) / 2
  eta = max(1., (deltas[0] @ deltas[0] + deltas[1] @ deltas[1]) / 2 / (2 * (mean @ mean + eps)))
  assert eta > 1.1   # the clients pull apart: FedExP extrapolates
  flat_x = np.concatenate([np.ravel(a) for a in jax.tree_util.tree_leaves(x)])
  flat_new = np.concatenate([np.ravel(a) for a in jax.tree_util.tree_leaves(state.params)])
  np.testing.assert_allclose(flat_new, flat_x - eta * mean, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(metrics.diagnostics['eta_g'], eta, rtol=1e-4)   # reported as well
  # the model evaluated is the mean of the last two, (x^1 + x^0) / 2; the clients get x^1
  alg = algorithms.fedexp(loss, LR, eps)
  flat = lambda t: np.concatenate([np.ravel(a) for a in jax.tree_util.tree_leaves(t)])
  np.testing.assert_allclose(flat(alg.server_params(state)), (flat_new + flat_x) / 2, rtol=1e-6)
  np.testing.assert_array_equal(flat(alg.broadcast(state)), flat_new)
  np.testing.assert_array_equal(flat(alg.server_params(alg.server_init(x))), flat_x)
  last = algorithms.fedexp(loss, LR, eps, average_last_two=False)
  np.testing.assert_array_equal(flat(last.server_params(state)), flat_new)


def test_fedexp_step_size_is_at_least_one():
  from fedjax_gel.algorithms.fedexp import server_step_size  # pylint: disable=g-import-not-at-top
  d = {'w': jnp.array([3., 4.])}   # ||Delta||^2 = 25
  assert float(server_step_size(0., d, 1e-3)) == 1.
  np.testing.assert_allclose(server_step_size(200., d, 0.), 4.)   # 200 / (2 * 25)


@pytest.mark.parametrize('momentum', [1.0, -0.1, jnp.float32(1.5)])
def test_fedavgcm_refuses_a_momentum_outside_zero_to_one(loss, momentum):
  with pytest.raises(ValueError, match=r'momentum must be in \[0, 1\)'):
    algorithms.fedavgcm(loss, LR, momentum)


@pytest.mark.parametrize('build, error, words', [
    # a string failed deep inside optax, NaN trained a non-finite model, -1 climbed the loss:
    # the command line refused them all, the Python builders did not
    (lambda loss, model: algorithms.fedavgcm(loss, '0.1'), TypeError,
     "fedavgcm: client_lr must be a number, got '0.1'"),
    (lambda loss, model: algorithms.fedavgcm(loss, float('nan')), ValueError,
     'fedavgcm: client_lr must be positive and finite, got nan'),
    (lambda loss, model: algorithms.fedavgcm(loss, -1.), ValueError, 'client_lr must be positive'),
    (lambda loss, model: algorithms.fedprox(loss, LR, mu=-5.), ValueError,
     'fedprox: mu must be >= 0 and finite, got -5.0'),
    (lambda loss, model: algorithms.fedprox_gel(loss, 0.), ValueError,
     'fedprox_gel: client_lr must be positive'),
    (lambda loss, model: algorithms.fednova(loss, LR, momentum=1.), ValueError,
     r'fednova: momentum must be in \[0, 1\)'),
    (lambda loss, model: algorithms.fednova_gel(loss, np.inf), ValueError,
     'fednova_gel: client_lr must be positive'),
    (lambda loss, model: algorithms.fedmax(model, LR, beta=-1.), ValueError,
     'fedmax: beta must be >= 0'),
    (lambda loss, model: algorithms.fedexp(loss, LR, eps=0.), ValueError,
     'fedexp: eps must be positive'),
    (lambda loss, model: algorithms.fedvarp(loss, 'x', [.5, .5]), TypeError,
     'fedvarp: client_lr must be a number'),
    (lambda loss, model: algorithms.scaffold(loss, -0.1, 4), ValueError,
     'scaffold: client_lr must be positive'),
    (lambda loss, model: algorithms.feddyn(loss, LR, -1., 4), ValueError,
     'feddyn: mu must be >= 0'),
    (lambda loss, model: algorithms.adabest(loss, LR, 0.1, 1.5, 4), ValueError,
     r'adabest: beta must be in \[0, 1\], got 1.5'),
])
def test_builders_refuse_a_bad_rate_or_weight_naming_it(loss, model, build, error, words):
  with pytest.raises(error, match=words):
    build(loss, model)


def test_builders_take_schedules_and_traced_rates(loss):
  algorithms.fedavgcm(loss, optax.constant_schedule(LR))
  jax.jit(lambda lr: algorithms.fedprox(loss, lr, mu=0.).name and lr)(jnp.float32(LR))
