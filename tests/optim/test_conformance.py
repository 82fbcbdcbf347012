"""Conformance of every public transformation in ``fedjax_gel.optim`` with optax's contract.

Each transformation is checked under ``jit`` and ``vmap``; inside ``optax.chain``,
``named_chain``, ``inject_hyperparams`` (a schedule, and a hyper-parameter changed under ``jit``)
and ``MultiSteps``; on nested-dict, bf16 and float16 params with its state's dtypes kept. For the
GeL transformations, guesses taken through ``optim.guess`` after each combinator equal the
un-wrapped transformation's, but MultiSteps', which are refused (``test_wrappers.py`` goes through
every wrapper).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_gel import optim

LR = 0.05
SCHEDULE = optax.linear_schedule(0.1, 0.01, 4)


def params_like(dtype=jnp.float32, seed=0):
  k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
  return {'dense': {'w': jax.random.normal(k1, (3, 2)).astype(dtype),
                    'b': jax.random.normal(k2, (2,)).astype(dtype)},
          'scale': jax.random.normal(k3, ()).astype(dtype)}


def grads_like(params, seed):
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(100 + seed), len(leaves))
  return treedef.unflatten([jax.random.normal(k, x.shape).astype(x.dtype)
                            for k, x in zip(keys, leaves)])


def stats_like(params):
  """Non-trivial FedGBO statistics (m != 0, v != 1) for the extra argument ``stats``."""
  g = grads_like(params, 7)
  return optim.GBOStats(jax.tree.map(lambda x: 0.3 * x, g),
                          jax.tree.map(lambda x: 1. + x * x, g))


class Case(NamedTuple):
  """A public transformation: ``make(learning_rate)``, its hyper-parameter to change, the extra
  arguments its ``update`` needs, and whether it holds a GeL state."""
  make: Callable[..., optax.GradientTransformation]
  hparam: str                      # changed under jit inside inject_hyperparams
  extra: Callable[[dict], dict] = lambda params: {}
  gel: bool = False


def _gbo(factory, **kw):
  return lambda learning_rate=LR: factory(learning_rate, **kw)


CASES = {
    'gel_sgdm_zero': Case(lambda learning_rate=LR, momentum=0.9: optim.gel_sgdm(
        learning_rate, momentum), 'momentum', gel=True),
    'gel_sgdm_last_gradient': Case(lambda learning_rate=LR, momentum=0.9: optim.gel_sgdm(
        learning_rate, momentum, 'last_gradient'), 'momentum', gel=True),
    'guessing_adam_last_gradient': Case(lambda learning_rate=LR: optim.guessing(
        optax.adam(learning_rate), 'last_gradient'), 'learning_rate', gel=True),
    'guessing_sgdm_zero': Case(lambda learning_rate=LR: optim.guessing(
        optax.sgd(learning_rate, momentum=0.9)), 'learning_rate', gel=True),
    'fedadam': Case(lambda learning_rate=LR, b1=0.9: optim.fedadam(learning_rate, b1),
                    'b1'),
    'fedyogi': Case(lambda learning_rate=LR, b1=0.9: optim.fedyogi(learning_rate, b1),
                    'b1'),
    'fedadagrad': Case(lambda learning_rate=LR, b1=0.9: optim.fedadagrad(learning_rate, b1),
                       'b1'),
    'gbo_client_adam': Case(_gbo(optim.gbo_client, b1=0.9, b2=0.99), 'learning_rate',
                            lambda p: {'stats': stats_like(p)}),
    'gbo_client_sgdm': Case(_gbo(optim.gbo_client, b1=0.8), 'learning_rate',
                            lambda p: {'stats': stats_like(p)._replace(v=None)}),
    'gbo_inverse_rmsprop': Case(_gbo(optim.gbo_inverse, b1=None, b2=0.9), 'learning_rate',
                                lambda p: {'stats': stats_like(p)._replace(m=None),
                                           'num_steps': 2.5}),
    'gbo_server_adam': Case(_gbo(optim.gbo_server, b1=0.9, b2=0.99), 'learning_rate',
                            lambda p: {'num_steps': 3.}),
    'gbo_adaptive_adam': Case(_gbo(optim.gbo_adaptive, b1=0.9, b2=0.99), 'learning_rate'),
    'gbo_track_adam': Case(lambda learning_rate=None, b1=0.9: optim.gbo_track(b1, 0.99), 'b1'),
}
GEL_CASES = [name for name, case in CASES.items() if case.gel]


def close(a, b, tol=1e-6):
  jax.tree.map(lambda u, v: np.testing.assert_allclose(
      np.asarray(u, np.float32), np.asarray(v, np.float32), rtol=tol, atol=tol), a, b)


def run(tx, params, steps, extra, start=0, state=None):
  """``steps`` updates with gradients ``start, start + 1, ...``; returns (updates, state)."""
  state = tx.init(params) if state is None else state
  updates = None
  for s in range(start, start + steps):
    updates, state = tx.update(grads_like(params, s), state, params, **extra)
  return updates, state


def guesses_of(state, params, count=3.):
  return optim.guess(state, params, count)[0]


@pytest.mark.parametrize('name', CASES)
@pytest.mark.slow
def test_jit_and_vmap_equal_eager(name):
  case = CASES[name]
  tx, p = case.make(), params_like()
  extra = case.extra(p)
  eager_u, eager_s = run(tx, p, 2, extra)
  state = jax.jit(tx.init)(p)
  update = jax.jit(lambda g, s, p: tx.update(g, s, p, **extra))
  for s in range(2):
    u, state = update(grads_like(p, s), state, p)
  close(u, eager_u)
  close(state, eager_s)
  # vmap over three independent parameter sets (extra arguments shared).
  batch = jax.tree.map(lambda *x: jnp.stack(x), *[params_like(seed=i) for i in range(3)])
  grads = jax.tree.map(lambda *x: jnp.stack(x), *[grads_like(params_like(seed=i), i)
                                                  for i in range(3)])
  vu, _ = jax.vmap(lambda g, s, p: tx.update(g, s, p, **extra))(grads, jax.vmap(tx.init)(batch),
                                                                 batch)
  for i in range(3):
    pi = params_like(seed=i)
    ui, _ = tx.update(grads_like(pi, i), tx.init(pi), pi, **extra)
    close(jax.tree.map(lambda x: x[i], vu), ui)


@pytest.mark.parametrize('name', CASES)
@pytest.mark.slow
def test_chain_and_named_chain_keep_updates_and_guesses(name):
  case = CASES[name]
  p = params_like()
  extra = case.extra(p)
  ref_u, ref_s = run(case.make(), p, 2, extra)
  for tx in (optax.chain(optax.scale(1.), case.make()),
             optax.named_chain(('identity', optax.identity()), ('ours', case.make()))):
    u, s = run(tx, p, 2, extra)
    close(u, ref_u)
    if case.gel:
      close(guesses_of(s, p), guesses_of(ref_s, p))


GUESSING_INNER = {'guessing_adam_last_gradient': (optax.adam, {}, 'last_gradient'),
                  'guessing_sgdm_zero': (optax.sgd, {'momentum': 0.9}, 'zero')}


def check_guessing_with_injected_inner(factory, kwargs, proxy, p):
  """guessing's hyper-parameters are injected into its inner optimiser; inject_hyperparams around
  guessing would rebuild it every step, which is refused with the way to do it."""
  around = optax.inject_hyperparams(lambda learning_rate: optim.guessing(
      factory(learning_rate, **kwargs), proxy))(learning_rate=LR)
  with pytest.raises(ValueError, match='inject them into inner'):
    run(around, p, 1, {})
  # A schedule injected into the inner optimiser equals the schedule given to it.
  tx = optim.guessing(optax.inject_hyperparams(factory)(learning_rate=SCHEDULE, **kwargs), proxy)
  u, s = run(tx, p, 3, {})
  ref_u, ref_s = run(optim.guessing(factory(SCHEDULE, **kwargs), proxy), p, 3, {})
  close(u, ref_u)
  close(guesses_of(s, p), guesses_of(ref_s, p))
  # A learning rate changed in the state between jitted steps takes effect, guesses included.
  tx = optim.guessing(optax.inject_hyperparams(factory)(learning_rate=LR, **kwargs), proxy)
  ref = optim.guessing(optax.inject_hyperparams(factory)(learning_rate=0.5, **kwargs), proxy)
  check_changed_under_jit(tx, lambda s: s.inner_state.hyperparams, 'learning_rate', p, {},
                          lambda: run(ref, p, 2, {}), gel=True)


def check_changed_under_jit(tx, hyperparams, name, p, extra, reference, gel):
  """Step 1 jitted, ``hyperparams(state)[name] = 0.5``, step 2 jitted: its updates (and guesses)
  equal ``reference() -> (updates, state)`` built with the value 0.5."""
  update = jax.jit(lambda g, s: tx.update(g, s, p, **extra))
  _, state = update(grads_like(p, 0), tx.init(p))
  hyperparams(state)[name] = jnp.asarray(0.5, jnp.float32)
  u, state = update(grads_like(p, 1), state)
  ref_u, ref_state = reference()
  close(u, ref_u)
  if gel:
    close(guesses_of(state, p), guesses_of(ref_state, p))


@pytest.mark.parametrize('name', CASES)
@pytest.mark.slow
def test_inject_hyperparams_schedule_and_changed_value_under_jit(name):
  case = CASES[name]
  p = params_like()
  extra = case.extra(p)
  if name in GUESSING_INNER:
    check_guessing_with_injected_inner(*GUESSING_INNER[name], p)
    return
  if name != 'gbo_track_adam':   # the one transformation without a learning rate
    # A schedule injected equals the schedule given to the transformation itself.
    injected = optax.inject_hyperparams(case.make)(learning_rate=SCHEDULE)
    u, s = run(injected, p, 3, extra)
    ref_u, ref_s = run(case.make(SCHEDULE), p, 3, extra)
    close(u, ref_u)
    if case.gel:
      close(guesses_of(s, p), guesses_of(ref_s, p))
  # A hyper-parameter changed in the state between jitted steps takes effect.
  def reference():
    _, ref_state = run(case.make(), p, 1, extra)
    return case.make(**{case.hparam: 0.5}).update(grads_like(p, 1), ref_state, p, **extra)
  check_changed_under_jit(optax.inject_hyperparams(case.make)(), lambda s: s.hyperparams,
                          case.hparam, p, extra, reference, case.gel)


@pytest.mark.parametrize('name', CASES)
@pytest.mark.slow
def test_multisteps_applies_the_mean_gradient_every_k(name):
  """Updates as optax documents them; guesses refused around a GeL transformation (its
  every_k_schedule, which says which guessed steps would apply an update, is not in its state)
  and exact around MultiSteps inside ``guessing`` (``tests/optim/test_wrappers.py``)."""
  case = CASES[name]
  p = params_like()
  extra = case.extra(p)
  tx = optax.MultiSteps(case.make(), every_k_schedule=2)
  u1, s = run(tx, p, 1, extra)
  u2, s = run(tx, p, 1, extra, start=1, state=s)
  close(u1, jax.tree.map(jnp.zeros_like, u1), tol=0)
  mean = jax.tree.map(lambda a, b: (a + b) / 2, grads_like(p, 0), grads_like(p, 1))
  inner = case.make()
  ref_u, _ = inner.update(mean, inner.init(p), p, **extra)
  close(u2, ref_u, tol=1e-5)
  if case.gel:
    with pytest.raises(optim.guessed.GuessRefusedError, match=r'optax\.MultiSteps .*'
                       r'every_k_schedule is not in its state'):
      guesses_of(s, p)


@pytest.mark.parametrize('dtype', [jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize('name', CASES)
@pytest.mark.slow
def test_low_precision_params_keep_their_dtypes(name, dtype):
  case = CASES[name]
  p = params_like(dtype)
  extra = case.extra(params_like())   # statistics stay float32
  tx = case.make()
  state0 = tx.init(p)
  u, state = run(tx, p, 2, extra)
  assert jax.tree.map(lambda x: x.dtype, u) == jax.tree.map(lambda x: x.dtype, p)
  assert jax.tree.structure(state) == jax.tree.structure(state0)
  assert ([jnp.asarray(x).dtype for x in jax.tree.leaves(state)] ==
          [jnp.asarray(x).dtype for x in jax.tree.leaves(state0)])
  assert all(bool(jnp.all(jnp.isfinite(x.astype(jnp.float32)))) for x in jax.tree.leaves(u))
  if case.gel:
    g = guesses_of(state, p)
    assert jax.tree.map(lambda x: x.dtype, g) == jax.tree.map(lambda x: x.dtype, p)
    close(g, guesses_of(run(case.make(), params_like(), 2, extra)[1], params_like()), tol=0.1)


@pytest.mark.parametrize('name', GEL_CASES)
def test_guesses_reach_a_partition_group_and_leave_the_others(name):
  case = CASES[name]
  p = params_like()
  labels = {'dense': {'w': 'gel', 'b': 'gel'}, 'scale': 'other'}
  tx = optax.partition({'gel': case.make(), 'other': optax.sgd(LR)}, labels)
  _, s = run(tx, p, 2, {})
  sub = p['dense']
  ref = case.make()
  ref_state = ref.init(sub)
  for step in range(2):
    _, ref_state = ref.update(grads_like(p, step)['dense'], ref_state, sub)
  g = guesses_of(s, p)
  close(g['dense'], guesses_of(ref_state, sub))
  assert float(g['scale']) == 0.


@pytest.mark.parametrize('build', [
    lambda: optim.gel_sgdm(LR, 0.9),
    lambda: optim.guessing(optax.sgd(LR, momentum=0.9)),
    lambda: optax.chain(optax.clip_by_global_norm(100.), optim.gel_sgdm(LR, 0.9)),
    lambda: optax.inject_hyperparams(optim.gel_sgdm)(learning_rate=LR, momentum=0.9),
    lambda: optim.guessing(optax.MultiSteps(optax.sgd(LR, momentum=0.9), every_k_schedule=1)
                           .gradient_transformation()),
], ids=['gel_sgdm', 'guessing', 'chain', 'inject_hyperparams', 'guessing_multisteps'])
@pytest.mark.slow
def test_infinite_zero_proxy_guesses_are_the_closed_form_however_built(build):
  """``alpha / (1 - alpha) v`` (GeL, eq. 5 with tau' = inf), never a silent zero."""
  p = params_like()
  _, state = run(build(), p, 3, {})
  _, ref = run(optim.gel_sgdm(LR, 0.9), p, 3, {})
  expect = jax.tree.map(lambda v: 0.9 / 0.1 * v, ref.velocity)
  close(jax.jit(optim.guess)(state, p, jnp.inf)[0], expect, tol=1e-5)


def test_guess_without_a_gel_state_is_a_clear_error():
  p = params_like()
  state = optax.chain(optax.clip(1.), optax.adam(LR)).init(p)
  with pytest.raises(optim.NoGuessStateError, match='holds no GeL state'):
    optim.guess(state, p, 2)


def test_infinite_last_gradient_guesses_are_not_finite():
  p = params_like()
  _, state = run(optim.guessing(optax.sgd(LR), 'last_gradient'), p, 1, {})
  u = optim.guess(state, p, jnp.inf)[0]
  assert all(bool(jnp.all(jnp.isnan(x))) for x in jax.tree.leaves(u))
  _, state = run(optim.gel_sgdm(LR, 0.9, 'last_gradient'), p, 1, {})
  u = optim.guess(state, p, jnp.inf)[0]
  assert not any(bool(jnp.any(jnp.isfinite(x))) for x in jax.tree.leaves(u))
