"""Guessed updates against the GeL paper's identities and plain optax loops."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_gel.optim.guessed import (gel_sgdm, guess, guessing, momentum_coefficients,
                                      momentum_coefficients_l1)

LR, ALPHA = 0.05, 0.9


def tree(seed, scale=1.0):
  k1, k2 = jax.random.split(jax.random.key(seed))
  return {'w': scale * jax.random.normal(k1, (3, 2)), 'b': scale * jax.random.normal(k2, (2,))}


def close(a, b, tol=1e-6):
  jax.tree_util.tree_map(lambda u, v: np.testing.assert_allclose(u, v, rtol=tol, atol=tol), a, b)


def run_steps(opt, params, grads):
  state = opt.init(params)
  for g in grads:
    u, state = opt.update(g, state, params)
    params = optax.apply_updates(params, u)
  return params, state


def test_gel_sgdm_steps_equal_optax_sgd_momentum():
  grads = [tree(s) for s in range(6)]
  ours, _ = run_steps(gel_sgdm(LR, ALPHA), tree(99), grads)
  ref, _ = run_steps(optax.sgd(LR, momentum=ALPHA), tree(99), grads)
  close(ours, ref)


@pytest.mark.parametrize('tau,tau_prime', [(1, 0), (4, 3), (7, 12), (5, 0)])
def test_lemma1_accumulated_update_is_the_coefficient_weighted_gradient_sum(tau, tau_prime):
  """x^(tau + tau') - x^(0) = -lr sum_k a_k g_k with recorded gradients (seed 000, eq. 6)."""
  opt = gel_sgdm(LR, ALPHA)
  x0 = tree(7)
  grads = [tree(100 + k) for k in range(tau)]
  y, state = run_steps(opt, x0, grads)
  u, _ = guess(state, y, tau_prime)
  y = optax.apply_updates(y, u)
  a = [(1 - ALPHA ** (tau_prime + tau - k)) / (1 - ALPHA) for k in range(tau)]   # eq. 6
  np.testing.assert_allclose(momentum_coefficients(tau, tau_prime, ALPHA), a, rtol=1e-6)
  expect = jax.tree_util.tree_map(
      lambda x, *gs: x - LR * sum(ak * g for ak, g in zip(a, gs)), x0, *grads)
  close(y, expect)


def test_zero_guesses_change_nothing():
  opt = gel_sgdm(LR, ALPHA)
  y, state = run_steps(opt, tree(1), [tree(2), tree(3)])
  u, new_state = guess(state, y, 0)
  close(u, jax.tree_util.tree_map(jnp.zeros_like, y), tol=0)
  close(new_state.velocity, state.velocity, tol=0)


def test_infinite_guesses_are_the_alpha_over_one_minus_alpha_nudge():
  opt = gel_sgdm(LR, ALPHA)
  y, state = run_steps(opt, tree(1), [tree(2), tree(3), tree(4)])
  u, new_state = guess(state, y, jnp.inf)
  close(u, jax.tree_util.tree_map(lambda v: ALPHA / (1 - ALPHA) * v, state.velocity))
  close(new_state.velocity, jax.tree_util.tree_map(jnp.zeros_like, state.velocity), tol=0)


@pytest.mark.parametrize('proxy', ['zero', 'last_gradient'])
@pytest.mark.parametrize('count', [0, 1, 5, 17])
def test_closed_form_equals_guessing_one_step_at_a_time(count, proxy):
  """gel_sgdm's closed forms (eq. 5 for the zero proxy) == optax.sgd(momentum) re-applied
  `count` times with the proxy gradient (zero or the last one)."""
  grads = [tree(10 + k) for k in range(4)]
  closed, loop = gel_sgdm(LR, ALPHA, proxy), guessing(optax.sgd(LR, momentum=ALPHA), proxy)
  y1, s1 = run_steps(closed, tree(0), grads)
  y2, s2 = run_steps(loop, tree(0), grads)
  close(guess(s1, y1, count)[0], guess(s2, y2, count)[0], tol=1e-5)


def test_last_gradient_proxy_reapplies_adam_with_the_last_gradient():
  """Seed 001: guesses are Adam steps driven by the last computed gradient."""
  adam = optax.adam(1e-2)
  opt = guessing(adam, 'last_gradient')
  grads = [tree(20 + k) for k in range(3)]
  y, state = run_steps(opt, tree(5), grads)
  u, _ = guess(state, y, 4)
  # By hand: continue a plain Adam loop with the last gradient four more times.
  p, s = run_steps(adam, tree(5), grads)
  start = p
  for _ in range(4):
    v, s = adam.update(grads[-1], s, p)
    p = optax.apply_updates(p, v)
  close(u, jax.tree_util.tree_map(lambda a, b: a - b, p, start), tol=1e-5)


def test_per_client_counts_under_vmap_match_separate_runs():
  opt = guessing(optax.sgd(LR, momentum=ALPHA), 'last_gradient')
  params = jax.vmap(tree)(jnp.arange(3))
  grads = jax.vmap(lambda s: tree(s + 50))(jnp.arange(3))
  state = jax.vmap(opt.init)(params)
  _, state = jax.vmap(opt.update)(grads, state, params)
  counts = jnp.array([0, 2, 5])
  batched, _ = jax.jit(jax.vmap(guess))(state, params, counts)
  for i in range(3):
    one = jax.tree_util.tree_map(lambda a: a[i], (state, params))
    u, _ = guess(*one, int(counts[i]))
    close(jax.tree_util.tree_map(lambda a: a[i], batched), u, tol=1e-6)


@pytest.mark.parametrize('tau,tau_prime,alpha', [(1, 0, 0.9), (6, 4, 0.9), (13, 0, 0.5),
                                                 (9, 20, 0.99), (4, 3, 0.0)])
def test_fednova_norm_is_the_sum_of_lemma1_coefficients(tau, tau_prime, alpha):
  np.testing.assert_allclose(momentum_coefficients_l1(tau, tau_prime, alpha),
                             np.sum(np.asarray(momentum_coefficients(tau, tau_prime, alpha))),
                             rtol=1e-5)


def test_unknown_proxy():
  with pytest.raises(ValueError, match='unknown guess proxy'):
    guessing(optax.sgd(0.1), 'median')


def test_guesses_in_a_plain_training_loop():
  """Not federated at all: least squares with SGDM; two guesses after each real step help."""
  x = jax.random.normal(jax.random.key(0), (64, 3))
  y = x @ jnp.array([1., -2., 0.5])
  loss = lambda w: jnp.mean((x @ w - y) ** 2)

  def train(guesses):
    opt = gel_sgdm(0.005, 0.9)
    w = jnp.zeros(3)
    state = opt.init(w)
    for _ in range(20):
      updates, state = opt.update(jax.grad(loss)(w), state, w)
      w = optax.apply_updates(w, updates)
      updates, state = guess(state, w, guesses)
      w = optax.apply_updates(w, updates)
    return float(loss(w))

  assert train(2) < 0.5 * train(0) < loss(jnp.zeros(3))


@pytest.mark.parametrize('momentum', [1.0, np.float32(1.0), jnp.float32(1.0), jnp.asarray(1.5)])
def test_momentum_must_lie_below_one(momentum):
  """Python, NumPy and JAX scalars alike (a JAX 1.0 gave NaN guesses before)."""
  with pytest.raises(ValueError, match='momentum must be in'):
    gel_sgdm(0.1, momentum)


def test_infinite_count_runs_the_guess_loop_to_its_limit():
  """guessing(...) with count inf sums until convergence: eq. 5's alpha / (1 - alpha) v, as
  gel_sgdm's closed form; a sum that never settles (last gradient) is NaN, never zero."""
  loop, closed = guessing(optax.sgd(LR, momentum=ALPHA), 'zero'), gel_sgdm(LR, ALPHA)
  y, state = run_steps(loop, tree(1), [tree(2)])
  y_closed, s_closed = run_steps(closed, tree(1), [tree(2)])
  u, _ = jax.jit(guess)(state, y, jnp.inf)
  close(u, guess(s_closed, y_closed, jnp.inf)[0], tol=1e-5)
  close(u, jax.tree_util.tree_map(lambda v: ALPHA / (1 - ALPHA) * v, s_closed.velocity),
        tol=1e-5)
  last = guessing(optax.sgd(LR, momentum=ALPHA), 'last_gradient')
  y, state = run_steps(last, tree(1), [tree(2)])
  u, _ = jax.jit(guess)(state, y, jnp.inf)
  assert all(np.isnan(leaf).all() for leaf in jax.tree_util.tree_leaves(u))


def test_a_transformation_after_the_gel_one_in_a_chain_is_refused():
  """``chain(guessing(scale_by_adam()), scale(-lr))`` steps like ``guessing(adam(lr))`` but its
  guesses would skip the scale (wrong sign and size): ``guess`` refuses it, naming the fix. The
  scale inside ``guessing``, or a transformation before the GeL one, is fine."""
  params, grads = tree(0), [tree(1), tree(2)]
  after = optax.chain(guessing(optax.scale_by_adam()), optax.scale(-LR))
  _, state = run_steps(after, params, grads)
  with pytest.raises(ValueError, match=r'stateless transformation \(optax\.scale, .*\(state '
                     r'EmptyState\) follows a GeL transformation .* put it inside'):
    guess(state, params, 2.)
  inside = guessing(optax.chain(optax.scale_by_adam(), optax.scale(-LR)))
  _, state = run_steps(inside, params, grads)
  _, ref_state = run_steps(guessing(optax.adam(LR)), params, grads)
  close(guess(state, params, 2.)[0], guess(ref_state, params, 2.)[0])
  before = optax.chain(optax.clip_by_global_norm(1.), gel_sgdm(LR, ALPHA))
  _, state = run_steps(before, params, grads)
  _, ref_state = run_steps(gel_sgdm(LR, ALPHA), params,
                           [optax.clip_by_global_norm(1.).update(g, None)[0] for g in grads])
  close(guess(state, params, 3.)[0], guess(ref_state, params, 3.)[0])
  # the same in a named_chain (its state an OrderedDict): its guess had the wrong sign, 6.7x
  named = optax.named_chain(('gel', guessing(optax.scale_by_adam())), ('lr', optax.scale(-LR)))
  _, state = run_steps(named, params, grads)
  with pytest.raises(ValueError, match=r'follows a GeL transformation .* in its optax\.chain'):
    guess(state, params, 2.)
  # partition's groups are side by side, not a chain: a GeL group beside another is fine
  split = optax.partition({'gel': gel_sgdm(LR, ALPHA), 'plain': optax.sgd(LR)},
                          jax.tree_util.tree_map_with_path(
                              lambda path, _: 'gel' if path[0].key == 'w' else 'plain', params))
  _, state = run_steps(split, params, grads)
  guess(state, params, 2.)


@pytest.mark.parametrize('count', [jnp.asarray([1., 2.]), float('nan'), 2.5, -1.])
def test_a_concrete_count_that_is_no_number_of_steps_is_refused(count):
  """A vector was broadcast over a leaf, NaN gave NaN (gel_sgdm) or nothing (guessing), 2.5 a
  fractional closed form (gel_sgdm) or 2 steps (guessing)."""
  params = tree(0)
  for opt in (gel_sgdm(LR, ALPHA), guessing(optax.sgd(LR, momentum=ALPHA))):
    _, state = run_steps(opt, params, [tree(1)])
    with pytest.raises(ValueError, match='guess: count must be one whole number of steps'):
      guess(state, params, count)
    guess(state, params, 2.)   # whole numbers and inf are counts
    guess(state, params, jnp.inf)


@pytest.mark.parametrize('proxy', ['zero', 'last_gradient'])
def test_a_guessing_state_round_trips_through_flax_serialization(proxy):
  """Saved with ``flax.serialization.to_bytes`` after two steps and restored into a fresh state,
  the optimiser goes on exactly as the one never saved (its steps and its guesses)."""
  from flax import serialization  # pylint: disable=g-import-not-at-top
  opt = guessing(optax.adam(0.1), proxy=proxy)
  params = {'w': jnp.asarray([1., -2., 3.]), 'b': jnp.asarray(0.5)}
  grad = lambda p: jax.tree.map(lambda x: 2 * x + 1, p)
  state = opt.init(params)
  for _ in range(2):
    updates, state = opt.update(grad(params), state, params)
    params = optax.apply_updates(params, updates)
  restored = serialization.from_bytes(opt.init(jax.tree.map(jnp.zeros_like, params)),
                                      serialization.to_bytes(state))
  assert jax.tree.structure(restored) == jax.tree.structure(state)
  same = lambda a, b: jax.tree.map(np.testing.assert_array_equal, a, b)
  for s in (state, restored):
    guessed_updates, _ = guess(s, params, 3.)
    same(guessed_updates, guess(state, params, 3.)[0])
    updates, s = opt.update(grad(params), s, params)
    same(updates, opt.update(grad(params), state, params)[0])


def test_two_gel_transformations_in_one_chain_are_refused():
  """``chain(guessing(scale_by_adam()), gel_sgdm(...))`` passed the check (only the last GeL
  state's place was read) and guessed uphill, 33x too far: the later one changes the earlier
  one's updates as any other transformation would."""
  params, grads = tree(0), [tree(1)]
  for chain in (optax.chain(guessing(optax.scale_by_adam()), gel_sgdm(LR, ALPHA)),
                optax.chain(gel_sgdm(LR, ALPHA), gel_sgdm(LR, ALPHA))):
    _, state = run_steps(chain, params, grads)
    with pytest.raises(ValueError, match='an optax.chain holds 2 GeL transformations'):
      guess(state, params, 2)


@pytest.mark.parametrize('make', [lambda: gel_sgdm(LR, ALPHA),
                                  lambda: guessing(optax.sgd(LR, momentum=ALPHA))],
                         ids=['gel_sgdm', 'guessing'])
def test_params_without_leaves_guess_nothing(make):
  """``{}`` (``guessing``'s check of a settled sum stacked no arrays: a ValueError)."""
  opt = make()
  _, state = opt.update({}, opt.init({}), {})
  for count in (0, 1, jnp.inf):
    assert guess(state, {}, count)[0] == {}


def test_a_traced_nan_count_gives_nan_in_both_implementations():
  """``gel_sgdm``'s closed form gave NaN, ``guessing``'s loop zeros (no step taken)."""
  for opt in (gel_sgdm(LR, ALPHA), guessing(optax.sgd(LR, momentum=ALPHA))):
    y, state = run_steps(opt, tree(1), [tree(2)])
    u, _ = jax.jit(guess)(state, y, jnp.float32(jnp.nan))
    assert all(np.isnan(leaf).all() for leaf in jax.tree_util.tree_leaves(u))


@pytest.mark.parametrize('lr, momentum, error, words', [
    (0.1, np.array([1.5]), ValueError, 'gel_sgdm momentum must be in'),   # diverged
    (np.array([-0.1]), 0.9, ValueError, 'gel_sgdm learning_rate must be >= 0 and finite'),
    (float('inf'), 0.9, ValueError, 'gel_sgdm learning_rate must be >= 0 and finite'),
    (True, 0.9, TypeError, 'gel_sgdm learning_rate must be a number, got True'),
    ('0.1', 0.9, TypeError, "gel_sgdm learning_rate must be a number, got '0.1'"),
    (0.1, None, TypeError, 'gel_sgdm momentum must be a number, got None'),
    # several values broadcast against the parameters, one rate per column of a kernel
    (np.array([0.1, 0.2]), 0.9, TypeError,
     r'gel_sgdm learning_rate must be one number, got an array of shape \(2,\)'),
], ids=['momentum_array', 'lr_array', 'lr_inf', 'lr_bool', 'lr_str', 'momentum_none',
        'lr_several'])
def test_hyper_parameters_of_one_element_arrays_and_other_kinds_are_checked(lr, momentum, error,
                                                                            words):
  """Only 0-d values were checked: one-element arrays passed (a momentum of 1.5 diverged,
  a negative rate ascended), a string failed deep in optax, and several values were applied
  column by column."""
  with pytest.raises(error, match=words):
    gel_sgdm(lr, momentum)


@pytest.mark.parametrize('call', [
    lambda: momentum_coefficients(3, 0, 1.0),          # NaN coefficients
    lambda: momentum_coefficients(-1, 0, 0.9),         # an empty array
    lambda: momentum_coefficients(2.5, 0, 0.9),
    lambda: momentum_coefficients_l1(3, 0, 1.0),
    lambda: momentum_coefficients_l1(-1, 0, 0.9),      # a negative norm
], ids=['alpha_one', 'tau_negative', 'tau_fraction', 'l1_alpha_one', 'l1_tau_negative'])
def test_lemma1_coefficients_refuse_what_has_no_meaning(call):
  with pytest.raises(ValueError, match='momentum_coefficients'):
    call()


def test_lemma1_coefficients_take_a_traced_alpha():
  """``if alpha == 0`` on a traced alpha raised a TracerBoolConversionError."""
  got = jax.jit(lambda a: momentum_coefficients(4, 2, a))(jnp.float32(ALPHA))
  np.testing.assert_allclose(got, momentum_coefficients(4, 2, ALPHA), rtol=1e-6)


@pytest.mark.parametrize('inner', [None, optax.sgd], ids=['none', 'factory'])
def test_guessing_refuses_what_is_no_transformation(inner):
  """An AttributeError (``... has no attribute 'init'``) before."""
  with pytest.raises(TypeError, match='guessing: inner must be an optax transformation'):
    guessing(inner)


def test_masked_gel_transformations_side_by_side_in_a_chain_guess_as_a_partition():
  """Two GeL states on disjoint ``optax.masked`` parameters change none of each other's
  updates: accepted (the check of two GeL states in a chain refused them), the guesses those
  of ``optax.partition``."""
  params, grads = tree(0), [tree(1), tree(2)]
  on_w = {'w': True, 'b': False}
  masked = optax.chain(optax.masked(gel_sgdm(LR, ALPHA), on_w),
                       optax.masked(gel_sgdm(2 * LR, 0.5), {'w': False, 'b': True}))
  split = optax.partition({'w': gel_sgdm(LR, ALPHA), 'b': gel_sgdm(2 * LR, 0.5)},
                          {'w': 'w', 'b': 'b'})
  _, state = run_steps(masked, params, grads)
  _, ref = run_steps(split, params, grads)
  close(guess(state, params, 3)[0], guess(ref, params, 3)[0])
  overlapping = optax.chain(optax.masked(gel_sgdm(LR, ALPHA), on_w), gel_sgdm(LR, ALPHA))
  _, state = run_steps(overlapping, params, grads)
  with pytest.raises(ValueError, match='an optax.chain holds 2 GeL transformations'):
    guess(state, params, 3)
