"""DP aggregation against per-client numpy loops and the papers' equations."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from fedjax_gel.privacy import aggregation


def deltas_of(norms, shape=(3, 4), seed=0):
  """Client deltas ``{'w': [K, 3, 4], 'b': [K, 4]}`` of the given L2 norms."""
  rng = np.random.default_rng(seed)
  out = {'w': [], 'b': []}
  for n in norms:
    w, b = rng.normal(size=shape), rng.normal(size=shape[1:])
    s = n / np.sqrt(np.sum(w ** 2) + np.sum(b ** 2))
    out['w'].append(w * s)
    out['b'].append(b * s)
  return {k: jnp.asarray(np.stack(v), jnp.float32) for k, v in out.items()}


def test_clipping_scales_only_the_deltas_above_the_norm():
  deltas = deltas_of([0.5, 1.0, 3.0, 10.0])
  clipped, norms = jax.vmap(aggregation.clip, in_axes=(0, None))(deltas, 2.0)
  np.testing.assert_allclose(norms, [0.5, 1.0, 3.0, 10.0], rtol=1e-5)
  for i, n in enumerate([0.5, 1.0, 3.0, 10.0]):   # per client, by hand
    scale = min(1., 2.0 / n)
    for k in deltas:
      np.testing.assert_allclose(clipped[k][i], np.asarray(deltas[k][i]) * scale, rtol=1e-5)
  np.testing.assert_allclose(jax.vmap(aggregation.global_norm)(clipped),
                             [0.5, 1.0, 2.0, 2.0], rtol=1e-5)


@pytest.mark.slow
def test_the_noised_mean_is_the_clipped_sum_over_the_expected_count_plus_its_noise():
  deltas = deltas_of([0.5, 3.0, 10.0, 1.5, 2.5])
  present = jnp.asarray([1, 1, 0, 1, 1])
  mean, _ = aggregation.noised_mean(deltas, present, 2.0, 0., 8., jax.random.key(0))
  for k in deltas:   # no noise: the per-client loop
    total = sum(np.asarray(deltas[k][i]) * min(1., 2.0 / n) for i, n in
                enumerate([0.5, 3.0, 10.0, 1.5, 2.5]) if present[i])
    np.testing.assert_allclose(mean[k], total / 8., rtol=1e-5, atol=1e-7)
  # with noise: over many keys, the noise is N(0, (z C / W)^2) in every coordinate
  z, clip_norm, count = 1.3, 2.0, 8.
  draws = jax.vmap(lambda k: aggregation.noised_mean(deltas, present, clip_norm, z, count, k)[0])(
      jax.random.split(jax.random.key(1), 4000))
  noise = np.concatenate([np.asarray(draws[k] - mean[k]).reshape(4000, -1) for k in deltas], 1)
  std = z * clip_norm / count
  assert abs(noise.std() / std - 1) < 0.01
  assert abs(noise.mean()) < 4 * std / np.sqrt(noise.size)
  # chi-square on the squared standardised noise of each draw (16 coordinates each)
  chi2 = np.sum((noise / std) ** 2, axis=1)
  assert stats.kstest(chi2, stats.chi2(noise.shape[1]).cdf).pvalue > 1e-3


def test_adaptive_clipping_follows_the_papers_geometric_update():
  norms = jnp.asarray([0.5, 1.0, 3.0, 10.0, 0.1])
  present = jnp.asarray([1, 1, 1, 1, 0])
  settings = aggregation.AdaptiveClip(target_quantile=0.5, clip_lr=0.2, count_noise_std=0.)
  settings = settings._replace(target_quantile=0.8)
  new = aggregation.adapted_clip(2.0, norms, present, 4., settings, jax.random.key(0))
  b = 2 / 4   # 0.5 and 1.0 of the 4 present are at most 2.0: below the target, C grows
  np.testing.assert_allclose(new, 2.0 * np.exp(-0.2 * (b - 0.8)), rtol=1e-6)
  assert new > 2.0
  settings = settings._replace(count_noise_std=3.)
  key = jax.random.key(5)
  noisy = aggregation.adapted_clip(2.0, norms, present, 4., settings, key)
  noise = 3. * jax.random.normal(key, (), jnp.float32)
  # the centred count: (sum (b_i - 1/2) + noise) / W + 1/2, with sum (b_i - 1/2) = 0 here
  np.testing.assert_allclose(noisy, 2.0 * np.exp(-0.2 * ((0 + noise) / 4 + 0.5 - 0.8)),
                             rtol=1e-5)
  # with an expected count above the present clients, the centring counts only those present
  three = aggregation.adapted_clip(2.0, norms, present, 8., settings._replace(count_noise_std=0.),
                                   key)
  np.testing.assert_allclose(three, 2.0 * np.exp(-0.2 * ((2 * 0.5 - 2 * 0.5) / 8 + 0.5 - 0.8)),
                             rtol=1e-6)


def test_the_deltas_noise_multiplier_leaves_the_total_at_z():
  z, sigma_b = 1.0, 5.0
  z_delta = aggregation.delta_noise_multiplier(z, sigma_b)
  np.testing.assert_allclose(z_delta ** -2 + (2 * sigma_b) ** -2, z ** -2)
  with pytest.raises(ValueError, match='must exceed half of it'):
    aggregation.delta_noise_multiplier(1.0, 0.5)
