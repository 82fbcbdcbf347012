"""The private wrapper in the compiled round, against the plain algorithm and per-client loops."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from helpers import cohort, init_params, run, small_model, small_pool
from fedjax_gel import algorithms, models, privacy
from fedjax_gel.core import keys
from fedjax_gel.core.round import build_round
from fedjax_gel.core.backend import Backend
from fedjax_gel.privacy import aggregation

IDS, BUDGETS = [0, 3, 5, 7, 9], [2, 6, 4, 6, 3]


@pytest.fixture(scope='module')
def setting():
  data, model = small_pool(), small_model()
  alg = algorithms.fedavg(models.cross_entropy_loss(model), optax.sgd(0.5))
  return data, model, alg, init_params(model)


def deltas_by_client(alg, data, params, seed=0, round_idx=3):
  """Each client's plain upload ``x - y_i`` in its slot of the cohort: the plain round with
  all the weight on that slot."""
  out = []
  for k in range(len(IDS)):
    weights = np.eye(len(IDS))[k]
    state, _ = run(alg, data, cohort(IDS, BUDGETS, weights), params, 2, seed, round_idx)
    out.append(jax.tree.map(lambda x, y: x - y, params, alg.server_params(state)))
  return out


@pytest.mark.slow
def test_no_clipping_and_no_noise_is_the_plain_algorithm_with_uniform_weights(setting):
  data, _, alg, params = setting
  dp = privacy.private(alg, privacy.Privacy(clip_norm=1e9, noise_multiplier=0.,
                                            expected_clients=len(IDS)))
  plain, _ = run(alg, data, cohort(IDS, BUDGETS), params, 2)
  state, metrics = run(dp, data, cohort(IDS, BUDGETS), params, 2)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               alg.server_params(plain), dp.server_params(state))
  assert float(metrics.diagnostics['dp_clip_norm']) == pytest.approx(1e9)


@pytest.mark.slow
def test_the_round_clips_each_client_and_noises_the_sum_once(setting):
  data, _, alg, params = setting
  deltas = deltas_by_client(alg, data, params, seed=4)
  norms = [float(aggregation.global_norm(d)) for d in deltas]
  clip_norm, z, count = float(np.median(norms)), 0.8, 7.   # some clipped, some not
  dp = privacy.private(alg, privacy.Privacy(clip_norm, z, count))
  state, _ = run(dp, data, cohort(IDS, BUDGETS), params, 2, seed=4, round_idx=3)
  # by hand: sum of the clipped deltas, the noise of the round's server key, over W
  total = jax.tree.map(lambda *d: sum(d), *[jax.tree.map(
      lambda x, n=n: x * min(1., clip_norm / n), d) for d, n in zip(deltas, norms)])
  key = jax.random.split(keys.round_key(keys.root_key(4), 3, keys.SERVER))[0]
  step = aggregation.noised(total, clip_norm, z, count, key)
  expected = jax.tree.map(lambda x, s: x - s, params, step)   # FedAvg's server: x - mean
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
               dp.server_params(state), expected)


@pytest.mark.slow
def test_adaptive_clipping_moves_the_clip_by_the_noised_count(setting):
  data, _, alg, params = setting
  deltas = deltas_by_client(alg, data, params, seed=1, round_idx=0)
  norms = np.array([float(aggregation.global_norm(d)) for d in deltas])
  adaptive = aggregation.AdaptiveClip(target_quantile=0.5, clip_lr=0.3, count_noise_std=2.)
  settings = privacy.Privacy(float(np.min(norms)) * 1.01, 3.0, 5., adaptive)
  dp = privacy.private(alg, settings)
  state, metrics = run(dp, data, cohort(IDS, BUDGETS), params, 2, seed=1, round_idx=0)
  count_key = jax.random.split(keys.round_key(keys.root_key(1), 0, keys.SERVER))[1]
  below = np.sum((norms <= settings.clip_norm) - 0.5)
  b = aggregation.noised_fraction(below, 5., 2., count_key)
  np.testing.assert_allclose(metrics.diagnostics['dp_below_fraction'], b, rtol=1e-6)
  np.testing.assert_allclose(state.clip_norm, settings.clip_norm * np.exp(-0.3 * (b - 0.5)),
                             rtol=1e-6)


def test_a_round_without_clients_still_steps_by_the_noise(setting):
  data, _, alg, params = setting
  dp = privacy.private(alg, privacy.Privacy(1.0, 1.0, 5.))
  empty = cohort([12, 12], [3, 3])   # the client without examples: no real client
  state, _ = run(dp, data, empty, params, 2)
  moved = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), params,
                       dp.server_params(state))
  assert all(v > 0 for v in jax.tree.leaves(moved))


@pytest.mark.slow
def test_the_debug_round_agrees(setting):
  data, _, alg, params = setting
  dp = privacy.private(alg, privacy.Privacy(0.05, 0.7, 6.))
  c = cohort(IDS, BUDGETS)
  fast, _ = run(dp, data, c, params, 5)
  slow = build_round(dp, chunk_size=5, backend=Backend(debug=True))(
      dp.server_init(params), c, data, keys.root_key(0), jnp.int32(3))[0]
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               dp.server_params(fast), dp.server_params(slow))


def test_an_algorithm_with_per_client_state_is_refused(setting):
  _, model, _, _ = setting
  scaffold = algorithms.scaffold(models.cross_entropy_loss(model), 0.1, num_clients=13)
  with pytest.raises(ValueError, match='keeps state per client'):
    privacy.private(scaffold, privacy.Privacy(1., 1., 5.))
