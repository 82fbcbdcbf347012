"""``optim.guess`` through optax's and optax.contrib's wrappers around ``gel_sgdm``, ``guessing``.

Every row of ``ROWS`` builds an optimiser, trains it a few steps (params moving) and either
matches an independent oracle, the optimiser's own ``update`` applied ``COUNT`` times in a Python
loop with the proxy gradient (zero, or the last gradient on the GeL transformation's parameters;
zero on the others, which take no guessed steps) and the applied updates summed, or is refused
with one line naming the wrapper. A refused row is then guessed again with the optimiser given
(``guess(..., optimizer=tx)``), which replays it: it matches the oracle on every parameter, or
(``Row.replayed``) is refused with ``optimizer=`` too.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_gel import algorithms, optim
from fedjax_gel.core.algorithm import ClientContext
from fedjax_gel.optim.guessed import GuessRefusedError, check_guessable

LR, ALPHA, COUNT, STEPS = 0.1, 0.9, 4, 4
DENSE, SCALE = {'dense': True, 'scale': False}, {'dense': False, 'scale': True}


def params0():
  return {'dense': {'w': jnp.array([1., -2., 3.]), 'b': jnp.array([.5, -.5])},
          'scale': jnp.array(2.)}


def grad(step, params):
  return jax.tree.map(lambda x: jnp.cos(x * (step + 1.)) + 0.1 * step, params)


class Row(NamedTuple):
  """``build() -> tx``; ``gel``: the parameters the GeL transformation acts on (top-level keys);
  ``value``: reduce_on_plateau's loss for a training step (a constant plateau shrinks the scale)
  and ``None`` for the replay's steps (improving losses keep it); ``refused``: a pattern the one
  line must match (the wrapper's name); ``nan``: the guesses are NaN; ``replayed``: for a
  refused row, ``None`` when ``optimizer=`` replays it (the refusal then says so), else what it
  is still refused for; ``lookahead``: params are ``optax.LookaheadParams``."""
  build: Callable[[], optax.GradientTransformation]
  proxy: str = 'zero'
  gel: tuple = ('dense', 'scale')
  value: bool = False
  refused: str | None = None
  nonfinite_last: bool = False
  nan: bool = False
  replayed: str | None = None
  lookahead: bool = False


def gel(proxy='zero', lr=LR):
  return optim.gel_sgdm(lr, ALPHA, proxy)


def sgdm_guessing(proxy='zero'):
  return optim.guessing(optax.sgd(LR, momentum=ALPHA), proxy)


PLATEAU = dict(patience=1, factor=0.5, accumulation_size=1)
WARMUP = optax.linear_schedule(0.02, LR, 6)

ROWS = {
    # -- followed ---------------------------------------------------------------------------
    'chain_clip_before_gel_sgdm': Row(
        lambda: optax.chain(optax.clip_by_global_norm(1.), gel('last_gradient')),
        'last_gradient'),
    'named_chain_guessing_adam': Row(lambda: optax.named_chain(
        ('clip', optax.clip(0.5)), ('gel', optim.guessing(optax.adam(LR), 'last_gradient'))),
        'last_gradient'),
    'zero_nans_before_gel_sgdm': Row(
        lambda: optax.chain(optax.zero_nans(), gel('last_gradient')), 'last_gradient'),
    'inject_hyperparams_gel_sgdm_schedule': Row(
        lambda: optax.inject_hyperparams(optim.gel_sgdm)(learning_rate=WARMUP, momentum=ALPHA)),
    'inject_hyperparams_gel_sgdm_last_gradient': Row(lambda: optax.inject_hyperparams(
        optim.gel_sgdm)(learning_rate=LR, momentum=ALPHA, proxy='last_gradient'),
        'last_gradient'),
    'masked_gel_sgdm': Row(lambda: optax.masked(gel('last_gradient'), DENSE), 'last_gradient',
                           gel=('dense',)),
    'masked_guessing_on_a_subtree': Row(
        lambda: optax.masked(sgdm_guessing('last_gradient'), SCALE), 'last_gradient',
        gel=('scale',)),
    'masked_gel_then_masked_sgdm_on_other_leaves': Row(lambda: optax.chain(
        optax.masked(gel(), DENSE), optax.masked(optax.sgd(LR, momentum=ALPHA), SCALE)),
        gel=('dense',)),
    'masked_gel_sgdm_then_masked_guessing_adam': Row(lambda: optax.chain(
        optax.masked(gel('last_gradient'), DENSE),
        optax.masked(optim.guessing(optax.adam(LR), 'last_gradient'), SCALE)), 'last_gradient'),
    'partition_guessing_and_sgd': Row(lambda: optax.partition(
        {'gel': sgdm_guessing('last_gradient'), 'other': optax.sgd(LR)},
        {'dense': 'gel', 'scale': 'other'}), 'last_gradient', gel=('dense',)),
    'partition_gel_sgdm_and_frozen': Row(lambda: optax.partition(
        {'gel': gel(), 'frozen': optax.set_to_zero()}, {'dense': 'frozen', 'scale': 'gel'}),
        gel=('scale',)),
    'apply_if_finite_gel_sgdm_after_a_nan': Row(
        lambda: optax.apply_if_finite(gel(), 3), nonfinite_last=True),
    'apply_if_finite_guessing_last_gradient': Row(
        lambda: optax.apply_if_finite(sgdm_guessing('last_gradient'), 3), 'last_gradient'),
    'gel_sgdm_then_reduce_on_plateau': Row(lambda: optax.chain(
        gel('last_gradient'), optax.contrib.reduce_on_plateau(**PLATEAU)), 'last_gradient',
        value=True),
    'guessing_then_reduce_on_plateau': Row(lambda: optax.chain(
        sgdm_guessing(), optax.contrib.reduce_on_plateau(**PLATEAU)), value=True),
    'gel_sgdm_then_snapshot': Row(lambda: optax.chain(
        gel('last_gradient'), optax.snapshot('norm', optax.tree.norm)), 'last_gradient'),
    'inject_hyperparams_chain_gel_sgdm_reduce_on_plateau': Row(lambda: optax.inject_hyperparams(
        lambda learning_rate: optax.chain(gel(lr=learning_rate),
                                          optax.contrib.reduce_on_plateau(**PLATEAU)))(
        learning_rate=LR), value=True),
    'guessing_multisteps_mid_accumulation': Row(lambda: optim.guessing(optax.MultiSteps(
        optax.sgd(LR, momentum=ALPHA), 3).gradient_transformation(), 'last_gradient'),
        'last_gradient'),
    'guessing_schedule_free': Row(lambda: optim.guessing(
        optax.contrib.schedule_free(optax.sgd(WARMUP), WARMUP))),
    'guessing_apply_if_finite_adam': Row(
        lambda: optim.guessing(optax.apply_if_finite(optax.adam(LR), 2))),
    # -- refused ----------------------------------------------------------------------------
    'schedule_free_gel_sgdm': Row(lambda: optax.contrib.schedule_free(gel(), LR),
                                  refused=r'optax\.contrib\.schedule_free'),
    'multisteps_gel_sgdm': Row(lambda: optax.MultiSteps(gel(), 3).gradient_transformation(),
                               refused=r'optax\.MultiSteps'),
    'lookahead_gel_sgdm': Row(lambda: optax.lookahead(gel(), 2, 0.5), refused=r'optax\.lookahead',
                              lookahead=True),
    'lookahead_gel_sgdm_last_gradient': Row(
        lambda: optax.lookahead(gel('last_gradient'), 3, 0.5), 'last_gradient',
        refused=r'optax\.lookahead', lookahead=True),
    'schedule_free_guessing_last_gradient': Row(
        lambda: optax.contrib.schedule_free(sgdm_guessing('last_gradient'), LR), 'last_gradient',
        refused=r'optax\.contrib\.schedule_free'),
    'gel_sgdm_then_scale': Row(lambda: optax.chain(gel(), optax.scale(2.)),
                               refused=r'stateless transformation \(optax\.scale'),
    'gel_sgdm_last_gradient_then_scale': Row(
        lambda: optax.chain(gel('last_gradient'), optax.scale(2.)), 'last_gradient',
        refused=r'stateless transformation \(optax\.scale'),
    'masked_gel_then_stateless_masked_sgd': Row(lambda: optax.chain(
        optax.masked(gel(), DENSE), optax.masked(optax.sgd(LR), SCALE)),
        refused=r'optax\.masked\(\.\.\.\) follows .* optax\.partition'),
    'masked_gel_last_gradient_then_stateless_masked_sgd': Row(lambda: optax.chain(
        optax.masked(gel('last_gradient'), DENSE), optax.masked(optax.sgd(LR), SCALE)),
        'last_gradient', gel=('dense',), refused=r'optax\.masked\(\.\.\.\) follows'),
    'gel_sgdm_then_freeze': Row(lambda: optax.chain(gel(), optax.freeze(SCALE)),
                                refused=r'optax\.masked'),
    'scale_by_adam_before_gel_sgdm': Row(lambda: optax.chain(optax.scale_by_adam(), gel()),
                                         refused=r'ScaleByAdamState comes before'),
    'scale_by_adam_before_gel_sgdm_last_gradient': Row(
        lambda: optax.chain(optax.scale_by_adam(), gel('last_gradient')), 'last_gradient',
        refused=r'ScaleByAdamState comes before', replayed=r"optimiser's own last input"),
    'clip_gel_sgdm_last_gradient_then_scale': Row(lambda: optax.chain(
        optax.clip(0.5), gel('last_gradient'), optax.scale(2.)), 'last_gradient',
        refused=r'optax\.scale', replayed=r"chain's first member"),
    'multisteps_gel_sgdm_last_gradient': Row(
        lambda: optax.MultiSteps(gel('last_gradient'), 3).gradient_transformation(),
        'last_gradient', refused=r'optax\.MultiSteps', replayed=r"optimiser's own last input"),
    'gel_sgdm_then_reduce_on_plateau_then_scale': Row(lambda: optax.chain(
        gel(), optax.contrib.reduce_on_plateau(**PLATEAU), optax.scale(2.)), value=True,
        refused=r'optax\.scale', replayed=r"needs 'value'"),
    'guessing_reduce_on_plateau_inside': Row(lambda: optim.guessing(optax.chain(
        optax.sgd(LR), optax.contrib.reduce_on_plateau(**PLATEAU))), value=True,
        refused=r"needs 'value'.*reduce_on_plateau", replayed=r"needs 'value'"),
    'gel_sgdm_then_apply_every': Row(lambda: optax.chain(gel(), optax.apply_every(2)),
                                     refused=r'optax\.apply_every'),
    'conditionally_transform_gel_sgdm': Row(lambda: optax.conditionally_transform(
        gel(), lambda step: step < 100), refused=r'optax\.conditionally_transform'),
    'conditionally_mask_gel_sgdm': Row(lambda: optax.conditionally_mask(
        gel(), lambda step: step < 100), refused=r'optax\.conditionally_mask'),
    'mechanize_gel_sgdm': Row(lambda: optax.contrib.mechanize(gel()),
                              refused=r'optax\.contrib\.mechanize'),
    'flatten_gel_sgdm': Row(lambda: optax.flatten(gel()), refused=r'optax\.flatten'),
    'flatten_gel_sgdm_last_gradient': Row(lambda: optax.flatten(gel('last_gradient')),
                                          'last_gradient', refused=r'optax\.flatten',
                                          replayed=r'optax\.flatten'),
    'gel_sgdm_then_masked_gel_sgdm_on_it': Row(lambda: optax.chain(
        gel(), optax.masked(gel(), DENSE)), refused='holds 2 GeL transformations'),
    'apply_if_finite_gel_sgdm_last_gradient_after_a_nan': Row(
        lambda: optax.apply_if_finite(gel('last_gradient'), 3), 'last_gradient',
        nonfinite_last=True, nan=True),
}
FOLLOWED = [name for name, row in ROWS.items() if row.refused is None and not row.nan]
REPLAYED = [name for name, row in ROWS.items() if row.refused and row.replayed is None]


def extra(row, step):
  if not row.value:
    return {}
  return {'value': jnp.float32(1. if step < STEPS else -100. * step)}   # a plateau, then better


def train(row):
  """``STEPS`` steps (the last gradient NaN for ``nonfinite_last``): (tx, state, params, g)."""
  tx = row.build()
  p = optax.LookaheadParams.init_synced(params0()) if row.lookahead else params0()
  state = tx.init(p)
  for step in range(STEPS):
    g = grad(step, p.fast if row.lookahead else p)
    if row.nonfinite_last and step == STEPS - 1:
      g = jax.tree.map(lambda x: x.at[...].set(jnp.nan), g)
    u, state = tx.update(g, state, p, **extra(row, step))
    p = optax.apply_updates(p, u)
  return tx, state, p, g


def oracle(row, tx, state, p, last):
  """The optimiser's own updates for ``COUNT`` steps with the proxy gradient, summed."""
  on = lambda tree: {k: v if k in row.gel else jax.tree.map(jnp.zeros_like, v)
                     for k, v in tree.items()}
  like = p.fast if row.lookahead else p   # the gradients' shape
  proxy = on(last) if row.proxy == 'last_gradient' else jax.tree.map(jnp.zeros_like, like)
  total = jax.tree.map(jnp.zeros_like, p)
  for step in range(STEPS, STEPS + COUNT):
    u, state = tx.update(proxy, state, p, **extra(row, step))
    p = optax.apply_updates(p, u)
    total = jax.tree.map(jnp.add, total, u)
  return total


def close(a, b, tol=1e-5):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=tol, atol=tol), a, b)


# One jit shared by every row (retraced per state structure and optimiser).
_guess = jax.jit(optim.guess, static_argnames='optimizer')


@pytest.mark.parametrize('name', FOLLOWED)
@pytest.mark.slow
def test_followed_wrappers_guess_what_the_optimiser_applies(name):
  row = ROWS[name]
  tx, state, p, last = train(row)
  got, _ = _guess(state, p, jnp.float32(COUNT))
  want = oracle(row, tx, state, p, last)
  for key in p:
    if key in row.gel:
      close(got[key], want[key])
    else:   # no GeL transformation acts there: no guessed steps
      close(got[key], jax.tree.map(jnp.zeros_like, p[key]), tol=0)
  assert any(float(jnp.abs(x).max()) > 1e-4 for x in jax.tree.leaves(got))   # not trivial


@pytest.mark.parametrize('name', [n for n, row in ROWS.items() if row.refused or row.nan])
@pytest.mark.slow
def test_other_wrappers_are_refused_in_one_line_naming_them(name):
  row = ROWS[name]
  tx, state, p, _ = train(row)
  if row.nan:   # known only at run time: NaN, never a silent number
    got, _ = _guess(state, p, jnp.float32(COUNT))
    assert all(np.isnan(x).all() for x in jax.tree.leaves(got))
    close(_guess(state, p, jnp.float32(0.))[0], jax.tree.map(jnp.zeros_like, p), tol=0)
    return
  with pytest.raises(GuessRefusedError, match=row.refused) as refusal:
    optim.guess(state, p, COUNT)
  assert '\n' not in str(refusal.value) and str(refusal.value).startswith('guess: ')
  assert ('or pass optimizer= to guess' in str(refusal.value)) == (row.replayed is None)
  with pytest.raises(GuessRefusedError, match=row.refused):
    check_guessable(state, p)
  if row.replayed is not None:   # a replay cannot give it either
    for check in (optim.guess, lambda s, p, c, optimizer: check_guessable(s, p,
                                                                          optimizer=optimizer)):
      with pytest.raises(GuessRefusedError, match=row.replayed) as refusal:
        check(state, p, COUNT, optimizer=tx)
      assert '\n' not in str(refusal.value) and str(refusal.value).startswith('guess: ')


@pytest.mark.parametrize('name', REPLAYED)
@pytest.mark.slow
def test_refused_wrappers_replayed_with_the_optimiser_guess_what_it_applies(name):
  """With ``optimizer=tx`` the refusal is replaced by ``tx`` replayed with the proxy: the oracle
  on every parameter (``tx`` is handed the proxy whole)."""
  row = ROWS[name]
  tx, state, p, last = train(row)
  check_guessable(state, p, optimizer=tx)
  got, _ = _guess(state, p, jnp.float32(COUNT), optimizer=tx)
  want = oracle(row, tx, state, p, last)
  size = max(float(jnp.abs(x).max()) for x in jax.tree.leaves(want))
  assert size > 0   # not trivial; relative to it (mechanize's learned scale starts at 1e-8)
  close(jax.tree.map(lambda x: x / size, got), jax.tree.map(lambda x: x / size, want))


def test_the_table_is_wide_enough():
  assert len(FOLLOWED) >= 15 and len(ROWS) - len(FOLLOWED) >= 15 and len(REPLAYED) >= 15


def test_the_brief_schedule_free_report_is_refused_and_its_replay_is_exact():
  """``schedule_free(gel_sgdm)``'s guesses were the inner SGDM's (4-6 times the last applied
  update where eq. 5 gives 3.095): its averaging weights are outside its state, so it is
  refused; ``guessing(schedule_free(...))`` replays it (``ROWS``)."""
  _, state, p, _ = train(ROWS['schedule_free_gel_sgdm'])
  with pytest.raises(GuessRefusedError, match='guessing\\(optax.contrib.schedule_free'):
    optim.guess(state, p, 4)


def test_stateless_masked_members_cannot_be_told_apart():
  """Why ``chain(masked(gel_sgdm, m), masked(sgd(.1), other))`` is refused: with ``other``
  covering the GeL parameters the chain scales their updates by -0.1, and both states are the
  same; written as ``optax.partition`` it is followed."""
  disjoint = optax.chain(optax.masked(gel(), DENSE), optax.masked(optax.sgd(LR), SCALE))
  covering = optax.chain(optax.masked(gel(), DENSE),
                         optax.masked(optax.sgd(LR), {'dense': True, 'scale': True}))
  p = params0()
  assert jax.tree.structure(disjoint.init(p)) == jax.tree.structure(covering.init(p))
  split = optax.partition({'gel': gel(), 'other': optax.sgd(LR)},
                          {'dense': 'gel', 'scale': 'other'})
  row = Row(lambda: split, gel=('dense',))
  tx, state, p, last = train(row)
  close(optim.guess(state, p, COUNT)[0]['dense'], oracle(row, tx, state, p, last)['dense'])


@pytest.mark.parametrize('name', ['guessing_then_reduce_on_plateau',
                                  'apply_if_finite_gel_sgdm_after_a_nan',
                                  'masked_gel_then_masked_sgdm_on_other_leaves'])
@pytest.mark.slow
def test_per_client_counts_under_vmap_including_inf(name):
  """Three clients, counts 0, 4 and inf under one jitted vmap: each as guessed alone."""
  row = ROWS[name]
  _, state, p, _ = train(row)
  batch = lambda tree: jax.tree.map(lambda x: jnp.stack([x, x, x]), tree)
  counts = jnp.array([0., 4., jnp.inf], jnp.float32)
  got, _ = jax.jit(jax.vmap(optim.guess))(batch(state), batch(p), counts)
  for i, count in enumerate(counts):
    close(jax.tree.map(lambda x: x[i], got), optim.guess(state, p, count)[0])
  inf = jax.tree.map(lambda x: x[2], got)
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(inf))   # zero proxy: eq. 5's limit


def test_reduce_on_plateau_scales_eq5_by_its_held_scale():
  """``chain(gel_sgdm, reduce_on_plateau)``: guesses are ``scale * alpha (1 - alpha^c) / (1 -
  alpha) v`` (GeL, eq. 5) with the scale the plateaus left (0.5^3 after three)."""
  row = ROWS['gel_sgdm_then_reduce_on_plateau']._replace(proxy='zero')
  tx = optax.chain(gel(), optax.contrib.reduce_on_plateau(**PLATEAU))
  _, state, p, _ = train(row._replace(build=lambda: tx))
  scale = float(state[1].scale)
  assert scale == 0.5 ** (STEPS - 1)
  nudge = ALPHA * (1 - ALPHA ** COUNT) / (1 - ALPHA)
  close(optim.guess(state, p, COUNT)[0], jax.tree.map(lambda v: scale * nudge * v,
                                                      state[0].velocity))


def test_the_reported_false_refusal_is_replayed_exactly():
  """The user's ``chain(masked(gel_sgdm(.1, .9), w), masked(sgd(.1), b))``: refused from its
  state alone (a stateless masked member after GeL), replayed with ``optimizer=``: eq. 5 on ``w``
  (the masked SGD, on ``b`` only, adds nothing for a zero gradient), for any count."""
  tx = optax.chain(optax.masked(optim.gel_sgdm(.1, .9), {'w': True, 'b': False}),
                   optax.masked(optax.sgd(.1), {'w': False, 'b': True}))
  p = {'w': jnp.array([1., -2., 3.]), 'b': jnp.array([.5, -.5])}
  state = tx.init(p)
  for step in range(3):
    u, state = tx.update(grad(step, p), state, p)
    p = optax.apply_updates(p, u)
  with pytest.raises(GuessRefusedError, match='or pass optimizer= to guess'):
    optim.guess(state, p, 4)
  v = state[0].inner_state.velocity['w']
  for count, nudge in ((0, 0.), (4, .9 * (1 - .9 ** 4) / .1), (jnp.inf, .9 / .1)):
    got, _ = _guess(state, p, jnp.float32(count), optimizer=tx)
    close(got, {'w': nudge * v, 'b': jnp.zeros(2)})


def test_an_optimizer_that_did_not_make_the_state_is_refused():
  row = ROWS['gel_sgdm_then_scale']
  _, state, p, _ = train(row)
  for other in (optax.chain(gel()), optax.chain(gel(), optax.scale(2.), optax.scale(1.))):
    with pytest.raises(GuessRefusedError, match='optimizer= is not the optimiser') as refusal:
      optim.guess(state, p, COUNT, optimizer=other)
    assert '\n' not in str(refusal.value)
  with pytest.raises(TypeError, match='optimizer= must be the optax transformation'):
    optim.guess(state, p, COUNT, optimizer=optax.sgd)


@pytest.mark.parametrize('name', ['masked_gel_then_stateless_masked_sgd', 'multisteps_gel_sgdm',
                                  'lookahead_gel_sgdm'])
@pytest.mark.slow
def test_per_client_counts_under_vmap_through_the_replay(name):
  """Three clients, counts 0, 4 and inf replayed under one jitted vmap: each as guessed alone;
  ``inf`` the settled sum (MultiSteps' accumulating steps apply exact zeros: not settled by
  them), never a silent zero."""
  row = ROWS[name]
  tx, state, p, last = train(row)
  batch = lambda tree: jax.tree.map(lambda x: jnp.stack([x, x, x]), tree)
  counts = jnp.array([0., COUNT, jnp.inf], jnp.float32)
  got, _ = jax.jit(jax.vmap(lambda s, p, c: optim.guess(s, p, c, optimizer=tx)))(
      batch(state), batch(p), counts)
  at = lambda i: jax.tree.map(lambda x: x[i], got)
  close(at(0), jax.tree.map(jnp.zeros_like, p), tol=0)
  close(at(1), oracle(row, tx, state, p, last))
  close(at(2), _guess(state, p, jnp.float32(1000), optimizer=tx)[0], tol=1e-4)
  assert float(max(jnp.abs(x).max() for x in jax.tree.leaves(at(2)))) > 1e-3


def test_a_replayed_last_gradient_without_end_is_nan():
  row = ROWS['gel_sgdm_last_gradient_then_scale']
  tx, state, p, _ = train(row)
  got, _ = _guess(state, p, jnp.float32(jnp.inf), optimizer=tx)
  assert all(np.isnan(x).all() for x in jax.tree.leaves(got))


def test_local_sgd_replays_a_client_optimiser_its_state_does_not_describe():
  """``local_sgd`` hands ``guess`` its client optimiser: the reported chain, vmapped over clients
  with guesses 0, 4 and inf, guesses as ``guess(..., optimizer=tx)`` does."""
  tx = ROWS['masked_gel_then_stateless_masked_sgd'].build()
  loss = lambda params, batch: sum(jnp.sum(jnp.sin(x + batch)) for x in jax.tree.leaves(params))
  alg = algorithms.local_sgd(loss, tx, client_guesses=lambda budgets, cap: budgets * 0.)
  x = params0()
  alg.server_init(x)
  counts = jnp.array([0., COUNT, jnp.inf], jnp.float32)

  def client(c):
    state = alg.client_init(x, None)
    for step in range(STEPS):
      state, _ = alg.client_step(state, jnp.float32(step), x)
    ctx = ClientContext(jnp.int32(0), jnp.int32(1), jnp.int32(STEPS), c, jnp.float32(1.),
                        jax.random.key(0))
    delta = alg.client_final(state, x, ctx)
    want, _ = optim.guess(state.opt_state, state.params, c, optimizer=tx)
    return delta, optax.tree_utils.tree_sub(x, optax.apply_updates(state.params, want))

  got, want = jax.jit(jax.vmap(client))(counts)
  close(got, want, tol=0)
