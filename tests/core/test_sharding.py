"""Multi-device rounds on 8 simulated CPU devices equal the single-device round."""
import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# 30 clients of 0..39 examples (6 features, 3 classes), a logistic model and its initial params.
POOL = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np
    from fedjax_gel import algorithms, models
    from fedjax_gel.core import federated_data as fd, keys, sampling, store
    from fedjax_gel.core.devices import client_mesh, replicate
    from fedjax_gel.core.round import build_round
    assert jax.device_count() == 8, jax.devices()
    rng = np.random.default_rng(SEED)
    w = rng.normal(size=(6, 3))
    clients = []
    for n in rng.integers(0, 40, size=30):
      x = rng.normal(size=(int(n), 6)).astype(np.float32)
      clients.append({'x': x, 'y': np.argmax(x @ w, 1).astype(np.int32)})
    data = fd.to_device(fd.from_client_arrays(clients))
    model = models.get_model('logistic', (6,), 3)
    loss = models.cross_entropy_loss(model)
    root = keys.root_key(0)
    params = model.init(keys.init_key(root))
''')

SCRIPT = POOL.replace('SEED', '0') + textwrap.dedent('''
    alg = algorithms.fedavgcm(loss, 0.05, 0.9)
    spec = sampling.CohortSpec(21, (1, 7), 4)
    c = sampling.sample_cohort(root, 0, data.counts, spec)
    out = []
    for devices, chunk in [(1, 21), (8, 5), (4, 21), (2, 3)]:
      rf = build_round(alg, chunk_size=chunk, mesh=client_mesh(devices))
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


STATEFUL = POOL.replace('SEED', '1') + textwrap.dedent('''
    spec = sampling.CohortSpec(21, (1, 7), 4)
    for alg in [algorithms.scaffold(loss, 0.05, 30),
                algorithms.fedvarp(loss, 0.05, np.full(30, 1 / 30))]:
      out = []
      for devices, chunk in [(1, 21), (8, 5)]:
        mesh = client_mesh(devices)
        rf = build_round(alg, chunk_size=chunk, mesh=mesh, donate_state=True)
        fresh = jax.tree_util.tree_map(jnp.copy, params)   # the donated state owns its buffers
        state, pool = replicate((alg.server_init(fresh), data), mesh)   # as the runner does
        state = state._replace(clients=store.place(state.clients, mesh))
        if mesh is not None:
          assert len(jax.tree_util.tree_leaves(pool)[0].sharding.device_set) == 8
        for r in range(3):
          c = sampling.sample_cohort(root, r, data.counts, spec)
          state, _ = rf(state, c, pool, root, jnp.int32(r))
        out.append(state)
      leaf = jax.tree_util.tree_leaves(out[1].clients)[0]
      assert leaf.shape[0] == 32, leaf.shape                 # 30 rows padded for 8 devices
      assert leaf.sharding.spec == jax.sharding.PartitionSpec('clients'), leaf.sharding
      assert len({s.device for s in leaf.addressable_shards}) == 8
      jax.tree_util.tree_map(
          lambda a, b: np.testing.assert_allclose(a, b[:a.shape[0]] if a.ndim == b.ndim and
                                                  a.shape != b.shape else b, rtol=2e-5,
                                                  atol=2e-6), out[0], out[1])
    print('STORE-OK')
''')


def run_on_eight_devices(script, token):
  env = dict(os.environ, XLA_FLAGS='--xla_force_host_platform_device_count=8',
             JAX_PLATFORMS='cpu', PYTHONPATH=REPO)
  out = subprocess.run([sys.executable, '-c', script], env=env, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert token in out.stdout


def test_eight_cpu_devices_match_one():
  run_on_eight_devices(SCRIPT, 'SHARDED-OK')


def test_client_store_sharded_over_eight_devices_matches_one():
  """SCAFFOLD's and FedVARP's stores, split over 8 devices (30 rows padded to 32), give the
  single-device rounds' models and rows."""
  run_on_eight_devices(STATEFUL, 'STORE-OK')
