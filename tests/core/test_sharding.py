"""Multi-device rounds on 8 simulated CPU devices equal the single-device round."""
import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np
    from fedjax_gel import algorithms, models
    from fedjax_gel.core import federated_data as fd, keys, sampling
    from fedjax_gel.core.devices import client_mesh
    from fedjax_gel.core.round import build_round
    assert jax.device_count() == 8, jax.devices()
    rng = np.random.default_rng(0)
    w = rng.normal(size=(6, 3))
    clients = []
    for n in rng.integers(0, 40, size=30):
      x = rng.normal(size=(int(n), 6)).astype(np.float32)
      clients.append({'x': x, 'y': np.argmax(x @ w, 1).astype(np.int32)})
    data = fd.to_device(fd.from_client_arrays(clients))
    model = models.get_model('logistic', (6,), 3)
    alg = algorithms.fedavgcm(models.cross_entropy_loss(model), 0.05, 0.9)
    root = keys.root_key(0)
    params = model.init(keys.init_key(root))
    c = sampling.sample_cohort(root, 0, data.counts, cohort_size=21, budget_range=(1, 7),
                               replace=True, batch_size=4)
    out = []
    for devices, chunk in [(1, 21), (8, 5), (4, 21), (2, 3)]:
      rf = build_round(alg, batch_size=4, max_budget=7, chunk_size=chunk,
                       mesh=client_mesh(devices))
      state, m = rf(alg.server_init(params), c, data, root, jnp.int32(0))
      out.append((state.params, m))
    for params_d, m in out[1:]:
      jax.tree_util.tree_map(
          lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6),
          params_d, out[0][0])
      np.testing.assert_allclose(m.train_loss, out[0][1].train_loss, rtol=1e-6)
      assert int(m.grad_computations) == int(out[0][1].grad_computations)
      assert int(m.examples) == 4 * int(m.grad_computations)
      # Each device loops its slice of a chunk to the slice's largest budget: never fewer steps
      # than are useful, never more than every slot running the cohort's largest budget.
      assert int(m.grad_computations) <= int(m.computed_steps) <= 24 * int(np.max(c.budgets))
    print('SHARDED-OK')
''')


def test_eight_cpu_devices_match_one():
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8',
             JAX_PLATFORMS='cpu', PYTHONPATH=REPO)
  out = subprocess.run([sys.executable, '-c', SCRIPT], env=env, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert 'SHARDED-OK' in out.stdout
