"""The round engine against independent oracles: plain optax loops, masking, chunking."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_gel import algorithms, models, optim
from fedjax_gel.core import federated_data as fd
from fedjax_gel.core import keys
from fedjax_gel.core import round as round_lib
from fedjax_gel.core.backend import Backend
from fedjax_gel.core.round import build_round
from fedjax_gel.core.routing import chunk_layout, deal
from fedjax_gel.core.sampling import CohortSpec, sample_cohort

from helpers import (B, EMPTY_CLIENT, TAU_MAX, as_runs_compile, cohort, grad_of, init_params,
                     minibatches, run, value_and_grad_of)


@pytest.mark.parametrize('momentum', [0.0, 0.9])
@pytest.mark.slow
def test_one_client_equals_plain_optax_loop(data, model, momentum):
  loss = models.cross_entropy_loss(model)
  opt = optax.sgd(0.1, momentum=momentum or None)
  alg = algorithms.fedavg(loss, opt)
  params = init_params(model)
  tau, cid = 5, 7
  state, metrics = run(alg, data, cohort([cid], [tau]), params, chunk_size=1)
  y, opt_state, losses = params, opt.init(params), []
  for batch in minibatches(data, cid, 0, tau):
    l, g = value_and_grad_of(loss)(y, batch)
    u, opt_state = opt.update(g, opt_state, y)
    y = optax.apply_updates(y, u)
    losses.append(l)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6),
                         state.params, y)
  np.testing.assert_allclose(metrics.train_loss, np.mean(losses), rtol=1e-6)
  assert int(metrics.grad_computations) == tau and int(metrics.examples) == tau * B


def fedavg_by_hand(data, loss, params, ids, taus, weights, lr):
  """x' = sum_i p_i y_i, each y_i from its own plain SGD loop over its minibatches."""
  ys = []
  for slot, (cid, tau) in enumerate(zip(ids, taus)):
    y = params
    for batch in minibatches(data, cid, slot, tau):
      y = jax.tree_util.tree_map(lambda p, g: p - lr * g, y, grad_of(loss)(y, batch))
    ys.append(y)
  total = sum(weights)
  return jax.tree_util.tree_map(lambda *leaves: sum(w * v for w, v in zip(weights, leaves)) / total,
                                *ys)


@pytest.mark.parametrize('ids,taus,weights', [
    ([2, 5], [3, 6], [1.0, 3.0]),
    ([5, 2, 8], [6, 1, 3], [2.0, 1.0, 1.0]),   # largest budget first: the engine sorts them
])
@pytest.mark.slow
def test_weighted_mean_of_clients_by_hand(data, model, ids, taus, weights):
  """FedAvg with server SGD(1); each client keeps its slot whatever the sort by budget does."""
  loss = models.cross_entropy_loss(model)
  alg = algorithms.fedavg(loss, optax.sgd(0.2))
  params = init_params(model)
  state, metrics = run(alg, data, cohort(ids, taus, weights), params, chunk_size=2)
  expect = fedavg_by_hand(data, loss, params, ids, taus, weights, 0.2)
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                         state.params, expect)
  assert int(metrics.grad_computations) == sum(taus)


def test_client_drawn_twice_gets_two_shuffles(data, model):
  alg = algorithms.fedavg(models.cross_entropy_loss(model), optax.sgd(0.2))
  params = init_params(model)
  first, _ = run(alg, data, cohort([5, 5], [4, 4], [1., 0.]), params, chunk_size=2)
  second, _ = run(alg, data, cohort([5, 5], [4, 4], [0., 1.]), params, chunk_size=2)
  assert not np.allclose(first.params['Dense_0']['kernel'], second.params['Dense_0']['kernel'])


def test_clients_without_data_and_zero_weight_cohorts_change_nothing(data, model):
  alg = algorithms.fedavgcm(models.cross_entropy_loss(model), 0.1, 0.9)
  params = init_params(model)
  state, m = run(alg, data, cohort([12, 12], [5, 3]), params, chunk_size=2)   # empty client
  jax.tree_util.tree_map(np.testing.assert_array_equal, state.params, params)
  assert int(m.grad_computations) == 0
  state, m = run(alg, data, cohort([3, 4], [5, 3], [0., 0.]), params, chunk_size=2)
  jax.tree_util.tree_map(np.testing.assert_array_equal, state.params, params)
  # the clients stepped, but a mean weighted by zero weights has no value: NaN, not 0.0
  assert int(m.grad_computations) == 8 and np.isnan(float(m.train_loss))


def test_budgets_above_max_budget_are_cut(data, model):
  alg = algorithms.fedavg(models.cross_entropy_loss(model), optax.sgd(0.2))
  params = init_params(model)
  over, m = run(alg, data, cohort([7], [TAU_MAX + 4]), params, chunk_size=1)
  at, _ = run(alg, data, cohort([7], [TAU_MAX]), params, chunk_size=1)
  jax.tree_util.tree_map(np.testing.assert_array_equal, over.params, at.params)
  assert int(m.grad_computations) == TAU_MAX


def test_masked_steps_are_exact_noops(data, model):
  """Client 4 (tau 2) is bit-identical whether its chunk stops at step 2 or runs 4 masked steps."""
  alg = algorithms.fedavgcm(models.cross_entropy_loss(model), 0.1, 0.9)
  params = init_params(model)
  # Same compiled program (chunk of 2, the chunk's largest budget as its trip count, as on CPU);
  # the weight-0 partner only sets that trip count.
  short, m_short = run(alg, data, cohort([4, 9], [2, 2], [1., 0.]), params, chunk_size=2,
                       static_steps=False)
  long, m_long = run(alg, data, cohort([4, 9], [2, 6], [1., 0.]), params, chunk_size=2,
                     static_steps=False)
  assert int(m_short.computed_steps) == 4 and int(m_long.computed_steps) == 12
  jax.tree_util.tree_map(np.testing.assert_array_equal, short.params, long.params)
  moved = jax.tree_util.tree_map(lambda a, b: np.abs(a - b).max(), short.params, params)
  assert max(jax.tree_util.tree_leaves(moved)) > 0


def _has_while(jaxpr) -> bool:
  """Whether a data-dependent loop (``while``) appears anywhere in ``jaxpr``."""
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == 'while':
      return True
    for p in eqn.params.values():
      for sub in p if isinstance(p, (tuple, list)) else (p,):
        inner = getattr(sub, 'jaxpr', None)
        if isinstance(sub, jax.extend.core.Jaxpr) and _has_while(sub):
          return True
        if isinstance(inner, jax.extend.core.Jaxpr) and _has_while(inner):
          return True
  return False


@pytest.mark.parametrize('budget_range', [(4, 4), (1, TAU_MAX)])
@pytest.mark.slow
def test_static_step_count_gives_the_same_round(data, model, budget_range):
  """A trip count fixed at compile time (every chunk loops b steps, the rest masked) against
  the chunk's own largest budget: the same models and losses, bit for bit; equal budgets
  (a = b), or an accelerator, get the static loop by default, so the round has no
  data-dependent loop."""
  alg = algorithms.fedavgcm(models.cross_entropy_loss(model), 0.1, 0.9)
  params = init_params(model)
  spec = CohortSpec(9, budget_range, B)
  c = sample_cohort(keys.root_key(5), 2, data.counts, spec)
  out = {}
  for static in (None, True, False):   # compiled as runs compile, not as the suite does
    rf = build_round(alg, chunk_size=3, backend=Backend(static_steps=static,
                                                       compiler_options=as_runs_compile(None)))
    args = (alg.server_init(params), c, data, keys.root_key(5), jnp.int32(2))
    out[static] = rf(*args)
    if static is not None:
      traced = build_round(alg, chunk_size=3, backend=Backend(static_steps=static)).jitted
      assert _has_while(jax.make_jaxpr(traced)(*args).jaxpr) == (not static)
  for other in (True, None):
    jax.tree_util.tree_map(np.testing.assert_array_equal, out[False][0], out[other][0])
    np.testing.assert_array_equal(out[False][1].train_loss, out[other][1].train_loss)
  default_static = budget_range[0] == budget_range[1] or jax.default_backend() != 'cpu'
  jaxpr = jax.make_jaxpr(build_round(alg, chunk_size=3).jitted)(
      alg.server_init(params), c, data, keys.root_key(5), jnp.int32(2)).jaxpr
  assert _has_while(jaxpr) == (not default_static)
  if budget_range[0] == budget_range[1]:   # every chunk computes b steps a client, as the
    # dynamic loop would
    assert int(out[None][1].computed_steps) == int(out[False][1].computed_steps) == 9 * 4


def test_zero_budget_client_uploads_nothing(data, model):
  alg = algorithms.fedavg(models.cross_entropy_loss(model), optax.sgd(0.1))
  params = init_params(model)
  state, _ = run(alg, data, cohort([3], [0]), params, chunk_size=1)
  jax.tree_util.tree_map(np.testing.assert_array_equal, state.params, params)


@pytest.mark.parametrize('algorithm', ['fedavg', 'fedavgcm'])
@pytest.mark.slow
def test_chunk_size_does_not_change_the_result(data, model, algorithm):
  loss = models.cross_entropy_loss(model)
  alg = (algorithms.fedavg(loss, optax.sgd(0.1)) if algorithm == 'fedavg'
         else algorithms.fedavgcm(loss, 0.05, 0.9))
  params = init_params(model)
  c = sample_cohort(keys.root_key(1), 4, data.counts, CohortSpec(19, (1, TAU_MAX), B,
                                                                    replace=True))
  # The chunk's largest budget as its trip count (the CPU's default; static_steps)
  results = [run(alg, data, c, params, chunk_size=cs, static_steps=False)
             for cs in (1, 7, 19, 100)]
  has_data = np.asarray(data.counts)[np.asarray(c.client_ids)] > 0
  assert not has_data.all()   # the empty client 12 is in this cohort: it must take no step
  useful = int(np.sum(np.asarray(c.budgets)[has_data]))
  for state, metrics in results[1:]:
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6),
                           state.params, results[0][0].params)
    np.testing.assert_allclose(metrics.train_loss, results[0][1].train_loss, rtol=1e-6)
    assert int(metrics.grad_computations) == useful
  # Sorting by budget lets chunks stop early: chunked runs compute fewer masked steps.
  assert int(results[1][1].computed_steps) < int(results[2][1].computed_steps)
  assert int(results[0][1].computed_steps) == useful
  # One chunk (chunk_size >= cohort) loops every client to the largest budget.
  largest = int(np.max(np.asarray(c.budgets)[has_data]))
  assert int(results[2][1].computed_steps) == int(results[3][1].computed_steps) == 19 * largest


@pytest.mark.slow
def test_round_compiles_once(data, model):
  traces = []
  loss = models.cross_entropy_loss(model)

  def counting_loss(p, b):
    traces.append(1)
    return loss(p, b)

  alg = algorithms.fedavgcm(counting_loss, 0.1, 0.9)
  rf = build_round(alg, chunk_size=4)
  root = keys.root_key(0)
  state = alg.server_init(init_params(model))
  spec = CohortSpec(10, (1, TAU_MAX), B, replace=False)
  for r in range(4):
    c = sample_cohort(root, r, data.counts, spec)
    state, _ = rf(state, c, data, root, jnp.int32(r))
  n_traces = len(traces)
  assert n_traces >= 1
  c = sample_cohort(root, 9, data.counts, spec)
  rf(state, c, data, root, jnp.int32(9))
  assert len(traces) == n_traces   # no retrace for a new round


def test_host_pool_raises_type_error_naming_to_device(model):
  alg = algorithms.fedavg(models.cross_entropy_loss(model), optax.sgd(0.1))
  rng = np.random.default_rng(0)
  host = fd.from_client_arrays([{'x': rng.normal(size=(n, 4)).astype(np.float32),
                                 'y': np.zeros(n, np.int32)} for n in (3, 5)])
  rf = build_round(alg, chunk_size=2)
  with pytest.raises(TypeError, match='to_device'):
    rf(alg.server_init(init_params(model)), cohort([0, 1], [2, 3]), host, keys.root_key(0),
       jnp.int32(0))


def test_pool_without_examples_is_refused_in_one_line(model):
  """Every client with 0 rows: an IndexError from inside the traced round before."""
  alg = algorithms.fedavgcm(models.cross_entropy_loss(model), 0.1, 0.9)
  empty = fd.to_device(fd.from_client_arrays([{'x': np.zeros((0, 4), np.float32),
                                               'y': np.zeros(0, np.int32)}] * 2))
  with pytest.raises(ValueError, match='round_fn: the data pool holds no examples'):
    build_round(alg, chunk_size=2)(alg.server_init(init_params(model)), cohort([0, 1], [2, 3]),
                                   empty, keys.root_key(0), jnp.int32(0))


@pytest.mark.slow
def test_round_for_one_spec_gives_the_same_result_twice(data, model):
  alg = algorithms.fedavgcm(models.cross_entropy_loss(model), 0.1, 0.9)
  rf = build_round(alg, chunk_size=3)
  params = init_params(model)
  c = sample_cohort(keys.root_key(2), 1, data.counts, CohortSpec(7, (2, TAU_MAX), B))
  out = [rf(alg.server_init(params), c, data, keys.root_key(2), jnp.int32(1)) for _ in range(2)]
  jax.tree_util.tree_map(np.testing.assert_array_equal, out[0], out[1])


@pytest.mark.parametrize('size,chunk,devices,expect', [
    (20, 20, 1, (20, 1)), (20, 100, 1, (20, 1)), (10_000, 2_750, 1, (2_500, 4)),
    (21, 5, 8, (8, 3)), (19, 7, 1, (7, 3)), (1, 1, 1, (1, 1)), (2_000, 2_000, 2, (2_000, 1)),
])
def test_chunk_layout_by_hand(size, chunk, devices, expect):
  assert chunk_layout(size, chunk, devices) == expect


@pytest.mark.parametrize('momentum', [0., 0.9])
@pytest.mark.slow
def test_equal_budgets_run_unmasked_and_match_the_masked_round(data, model, momentum):
  """A spec with ``a = b`` runs every step unmasked; the round equals the masked round of the
  same clients under a spec with ``a < b`` and every budget ``b``, with a client without
  examples (12) and padding slots (7 clients in chunks of 3) whose work must be dropped. The
  equal-budgets round reads no budget from a hand-made cohort: 0s there change nothing."""
  alg = algorithms.fedavg(models.cross_entropy_loss(model), optax.sgd(0.05, momentum=momentum))
  params = init_params(model)
  ids, weights = [12, 1, 5, 3, 8, 0, 9], [1., 2., 1., 3., 1., 1., 2.]
  equal = cohort(ids, [TAU_MAX] * 7, weights)
  equal = type(equal)(equal.client_ids, equal.budgets, equal.weights,
                      CohortSpec(7, (TAU_MAX, TAU_MAX), B))
  assert equal.spec.equal_budgets and not cohort(ids, [TAU_MAX] * 7).spec.equal_budgets
  runs = as_runs_compile(None)   # two programs: compiled as runs compile, not as the suite does
  unmasked, m1 = run(alg, data, equal, params, chunk_size=3, compiler_options=runs)
  masked, m2 = run(alg, data, cohort(ids, [TAU_MAX] * 7, weights), params, chunk_size=3,
                   compiler_options=runs)
  # Plain SGD: the same to the bit. With momentum the masked program's per-step select changes
  # XLA's fusion of the momentum's update, which from jaxlib 0.12 rounds a parameter's last bit
  # differently (1.2e-7 seen; the same to the bit with jaxlib 0.10 and 0.11).
  same = (np.testing.assert_array_equal if momentum == 0 else
          functools.partial(np.testing.assert_allclose, rtol=1e-6, atol=1e-7))
  jax.tree_util.tree_map(same, unmasked.params, masked.params)
  same(m1.train_loss, m2.train_loss)
  assert int(m1.grad_computations) == int(m2.grad_computations) == 6 * TAU_MAX
  zeros = type(equal)(equal.client_ids, jnp.zeros(7, jnp.int32), equal.weights, equal.spec)
  jax.tree_util.tree_map(np.testing.assert_array_equal,
                         run(alg, data, zeros, params, chunk_size=3, compiler_options=runs
                             )[0].params, unmasked.params)


@pytest.mark.slow
def test_deal_gives_every_device_the_same_number_of_clients_sorted_by_budget():
  """Hand case: 7 clients over 3 devices, sorted by budget (ties in cohort order) and dealt
  like cards; every client once, padding slots empty."""
  budgets = [3, 1, 4, 1, 5, 9, 2]
  c = cohort([10, 11, 12, 13, 14, 15, 16], budgets, [1.] * 7)
  dealt = deal(c, jnp.arange(7, dtype=jnp.float32) / 10, 3, 3)
  # sorted: slots 1, 3, 6, 0, 2, 4, 5 (budgets 1, 1, 2, 3, 4, 5, 9)
  np.testing.assert_array_equal(dealt.slots, [[1, 0, 5], [3, 2, 0], [6, 4, 0]])
  np.testing.assert_array_equal(dealt.valid, [[1, 1, 1], [1, 1, 0], [1, 1, 0]])
  np.testing.assert_array_equal(dealt.client_ids, [[11, 10, 15], [13, 12, 0], [16, 14, 0]])
  np.testing.assert_array_equal(dealt.budgets, [[1, 3, 9], [1, 4, 0], [2, 5, 0]])
  np.testing.assert_allclose(dealt.guesses, [[.1, 0., .5], [.3, .2, 0.], [.6, .4, 0.]])
  np.testing.assert_array_equal(dealt.weights, [[1, 1, 1], [1, 1, 0], [1, 1, 0]])


def test_the_round_refuses_hand_made_budgets_its_spec_would_not_run(data, model):
  """Budgets beyond the spec's ``b`` (which the round would cut to ``b``), and client ids past
  the population, are a ValueError before anything is traced."""
  alg = algorithms.fedavg(models.cross_entropy_loss(model), optax.sgd(0.05))
  kind = type(cohort([1, 2], [1, 1]))
  bad = kind(np.array([1, 2], np.int32), np.array([1, TAU_MAX + 1], np.int32),
             np.ones(2, np.float32), CohortSpec(2, (1, TAU_MAX), B))
  with pytest.raises(ValueError, match=rf'budgets must lie in \[0, {TAU_MAX}\]'):
    run(alg, data, bad, init_params(model), chunk_size=2)
  # an id past the population (the round would clamp it to the last client's rows)
  past = kind(np.array([1, data.num_clients], np.int32), np.array([1, 1], np.int32),
              np.ones(2, np.float32), CohortSpec(2, (1, TAU_MAX), B))
  with pytest.raises(ValueError, match=rf'client_ids must lie in \[0, {data.num_clients}\)'):
    run(alg, data, past, init_params(model), chunk_size=2)


@pytest.mark.parametrize('chunk_size', [0, -2, 2.5, '4', True, None])
def test_build_round_refuses_a_chunk_size_that_is_not_a_positive_integer(model, chunk_size):
  alg = algorithms.fedavg(models.cross_entropy_loss(model), optax.sgd(0.05))
  with pytest.raises(ValueError, match=rf'build_round: chunk_size must be a positive integer, '
                     rf'got {chunk_size!r}'):
    build_round(alg, chunk_size=chunk_size)
  assert build_round(alg, chunk_size=np.int64(3)) is not None


def test_the_round_refuses_an_empty_cohort(data, model):
  alg = algorithms.fedavg(models.cross_entropy_loss(model), optax.sgd(0.05))
  empty = type(cohort([1], [1]))(np.zeros(0, np.int32), np.zeros(0, np.int32),
                                 np.zeros(0, np.float32), CohortSpec(1, (1, TAU_MAX), B))
  with pytest.raises(ValueError, match=r'Cohort: no clients \(client_ids, budgets and weights '
                     r'are empty\)'):
    run(alg, data, empty, init_params(model), chunk_size=2)


@pytest.mark.parametrize('name', ['fedavg_server_momentum', 'fedadam', 'feddyn'])
@pytest.mark.slow
def test_a_round_without_clients_leaves_the_server_as_it_was(data, loss, model, name):
  """A cohort whose only client holds no data: the server optimiser's momentum, Adam's moments
  and FedDyn's h moved the model on no one's update (by 0.06, 0.24 and h / alpha)."""
  n = int(data.counts.shape[0])
  alg = {'fedavg_server_momentum': algorithms.fedavg(loss, optax.sgd(0.1),
                                                     optax.sgd(1.0, momentum=0.9)),
         'fedadam': algorithms.fedavg(loss, optax.sgd(0.1), optim.fedadam(0.3)),
         'feddyn': algorithms.feddyn(loss, 0.1, 0.5, n)}[name]
  rf = build_round(alg, chunk_size=2)
  state, _ = rf(alg.server_init(init_params(model)), cohort([1, 5], [3, 4]), data,
                keys.root_key(0), jnp.int32(0))
  after, metrics = rf(state, cohort([EMPTY_CLIENT, EMPTY_CLIENT], [3, 4]), data,
                      keys.root_key(0), jnp.int32(1))
  assert int(metrics.num_clients) == 0
  assert np.isnan(float(metrics.train_loss))   # no minibatch loss to average (was 0.0)
  for a, b in zip(jax.tree_util.tree_leaves(state), jax.tree_util.tree_leaves(after)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_a_nan_training_loss_with_a_finite_model_is_not_finite():
  """Labels beyond the model's classes: each minibatch's loss is NaN (the label's log-probability
  is gathered out of range) while the gradient, and so the model, stay finite: the round said
  ``finite`` and a run trained on. A round whose clients take no step stays finite."""
  rng = np.random.default_rng(0)
  clients = [{'x': rng.normal(size=(10, 3)).astype(np.float32),
              'y': rng.integers(3, 5, size=10).astype(np.int32)} for _ in range(4)]
  train = fd.to_device(fd.from_client_arrays(clients))
  model = models.get_model('logistic', (3,), 2)
  alg = algorithms.fedavg(models.cross_entropy_loss(model), optax.sgd(0.1))
  root = keys.root_key(0)
  state = alg.server_init(model.init(keys.init_key(root)))
  spec = CohortSpec(cohort_size=2, budget_range=(1, 3), batch_size=4)
  new, m = build_round(alg, chunk_size=2)(state, sample_cohort(root, 0, train.counts, spec), train,
                                          root, 0)
  assert np.isnan(float(m.train_loss)) and not bool(m.finite)
  assert round_lib.all_finite(new.params)


def test_the_round_refuses_a_cohort_drawn_from_another_population(data, model):
  """Ids drawn from 100 clients ran on a smaller pool, clamped to its last client's rows."""
  alg = algorithms.fedavg(models.cross_entropy_loss(model), optax.sgd(0.05))
  spec = CohortSpec(3, (1, TAU_MAX), B)
  other = sample_cohort(keys.root_key(0), 0, jnp.full((data.num_clients + 7,), 5, jnp.int32),
                        spec)
  assert other.population == data.num_clients + 7
  with pytest.raises(ValueError, match=rf'Cohort: drawn from a population of '
                     rf'{data.num_clients + 7} clients, but the pool holds {data.num_clients}'):
    run(alg, data, other, init_params(model), chunk_size=2)
