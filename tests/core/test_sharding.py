"""Multi-device rounds on 8 simulated CPU devices equal the single-device round: the pool and
the per-client store split by client over the devices, each device training its own clients."""
import textwrap

import pytest

import helpers

# 30 clients of 0..39 examples (6 features, 3 classes), a logistic model and its initial params.
POOL = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np
    from fedjax_gel import algorithms, models
    from fedjax_gel.core import federated_data as fd, keys, sampling, store
    from fedjax_gel.core.devices import client_mesh
    from fedjax_gel.core.round import build_round
    from fedjax_gel.core.routing import chunk_layout
    assert jax.device_count() == 8, jax.devices()
    rng = np.random.default_rng(SEED)
    w = rng.normal(size=(6, 3))
    clients = []
    for n in rng.integers(0, 40, size=30):
      x = rng.normal(size=(int(n), 6)).astype(np.float32)
      clients.append({'x': x, 'y': np.argmax(x @ w, 1).astype(np.int32)})
    host = fd.from_client_arrays(clients)
    data = fd.to_device(host)
    model = models.get_model('logistic', (6,), 3)
    loss = models.cross_entropy_loss(model)
    root = keys.root_key(0)
    params = model.init(keys.init_key(root))
''')

SCRIPT = POOL.replace('SEED', '0') + textwrap.dedent('''
    alg = algorithms.fedavgcm(loss, 0.05, 0.9)
    spec = sampling.CohortSpec(21, (1, 7), 4, replace=True)
    c = sampling.sample_cohort(root, 0, data.counts, spec)
    out = []
    # split by client (owner computes), then the pool whole on every device (dealt by budget)
    for devices, chunk, whole in [(1, 21, False), (8, 5, False), (4, 21, False), (2, 3, True),
                                  (8, 5, True)]:
      mesh = client_mesh(devices)
      rf = build_round(alg, chunk_size=chunk, mesh=mesh)
      pool = fd.to_device(host, mesh, replicate=whole)
      assert whole == (mesh is not None and pool.examples['x'].sharding.is_fully_replicated)
      state, m = rf(alg.server_init(params), c, pool, root, jnp.int32(0))
      out.append((state.params, m, chunk_layout(21, chunk, devices)[0] // devices, devices))
    for params_d, m, per_device, devices in out[1:]:
      jax.tree_util.tree_map(
          lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6),
          params_d, out[0][0])
      np.testing.assert_allclose(m.train_loss, out[0][1].train_loss, rtol=1e-6)
      assert int(m.grad_computations) == int(out[0][1].grad_computations)
      assert int(m.examples) == 4 * int(m.grad_computations)
      # Each device loops each of its chunks to the chunk's largest budget: never fewer steps
      # than are useful, never more than every slot of its chunks running the largest budget.
      slots = 21 + devices * (per_device - 1)
      assert int(m.grad_computations) <= int(m.computed_steps) <= slots * int(np.max(c.budgets))
    # 8 devices, one client per chunk: every computed step is a real one
    assert int(out[1][1].computed_steps) == int(out[1][1].grad_computations)
    # each device holds only its own clients' examples (owner blocks of 4 clients)
    mesh = client_mesh(8)
    split = fd.to_device(host, mesh)
    counts = np.asarray(host.counts)
    blocks, rows = fd.owner_blocks(counts, 8)
    assert rows == max(counts[4 * d:4 * d + 4].sum() for d in range(8))
    for shard in split.examples['x'].addressable_shards:
      d = shard.index[0].start // rows
      assert shard.data.shape[0] == rows
      for i in blocks[d]:
        lo = int(split.offsets[i]) - d * rows
        np.testing.assert_array_equal(np.asarray(shard.data)[lo:lo + counts[i]],
                                      fd.client_examples(host, i)['x'])
    try:   # a pool on one device only is refused before it is read at the wrong rows
      rf(alg.server_init(params), c, data, root, jnp.int32(0))
      raise AssertionError('not refused')
    except TypeError as e:
      assert 'to_device(data, mesh)' in str(e), e
    # dealt by budget: every device trains 2 or 3 of the 21 clients, one chunk each at chunk 5
    # (routed_chunk), whatever clients were drawn; every computed step of a chunk of one is real
    assert int(out[4][1].computed_steps) <= 8 * 3 * int(np.max(c.budgets))
    # Poisson sampling: the absent slots go to no device, routed to owners or dealt
    spec = sampling.CohortSpec(sampling.poisson_slots(30, 0.4), (1, 7), 4, selection='poisson',
                               rate=0.4)
    c = sampling.sample_cohort(root, 1, data.counts, spec)
    ref, rm = build_round(alg, chunk_size=30)(alg.server_init(params), c, data, root,
                                              jnp.int32(1))
    for devices, whole in [(8, False), (2, True)]:
      mesh = client_mesh(devices)
      state, m = build_round(alg, chunk_size=5, mesh=mesh)(
          alg.server_init(params), c, fd.to_device(host, mesh, replicate=whole), root,
          jnp.int32(1))
      jax.tree_util.tree_map(
          lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6), state.params,
          ref.params)
      assert int(m.num_clients) == int(rm.num_clients) < int(np.sum(c.present)) + 1
      assert int(m.grad_computations) == int(rm.grad_computations)
    assert int(np.sum(c.present)) < spec.cohort_size
    print('SHARDED-OK')
''')


STATEFUL = POOL.replace('SEED', '1') + textwrap.dedent('''
    spec = sampling.CohortSpec(21, (1, 7), 4, replace=True)
    for alg, split in [
        (algorithms.scaffold(loss, 0.05, 30), True),
        (algorithms.fedvarp(loss, 0.05, np.full(30, 1 / 30)), True),
        (algorithms.fedvarp(loss, 0.05, np.full(30, 1 / 30), clusters=np.arange(30) % 4), False)]:
      out = []
      for devices, chunk in [(1, 21), (8, 5)]:
        mesh = client_mesh(devices)
        rf = build_round(alg, chunk_size=chunk, mesh=mesh, donate_state=True)
        fresh = jax.tree_util.tree_map(jnp.copy, params)   # the donated state owns its buffers
        state = store.place_state(alg.server_init(fresh), alg, mesh)   # as the runner does
        # a store split by client needs its clients on their owners; a whole one takes a pool
        # whole on every device, and the cohort dealt by budget
        pool = fd.to_device(host, mesh, replicate=not split)
        if split and mesh is not None:
          try:
            rf(state, sampling.sample_cohort(root, 0, data.counts, spec),
               fd.to_device(host, mesh, replicate=True), root, jnp.int32(0))
            raise AssertionError('not refused')
          except ValueError as e:
            assert 'split by client' in str(e), e
        for r in range(3):   # with replacement: some clients write their row twice
          c = sampling.sample_cohort(root, r, data.counts, spec)
          state, _ = rf(state, c, pool, root, jnp.int32(r))
        out.append(state)
      leaf = jax.tree_util.tree_leaves(out[1].clients)[0]
      if split:   # 30 rows padded for 8 devices, 4 on each (the rows of its own clients)
        assert leaf.shape[0] == 32, leaf.shape
        assert leaf.sharding.spec == jax.sharding.PartitionSpec('clients'), leaf.sharding
        assert {s.data.shape[0] for s in leaf.addressable_shards} == {4}
      else:       # 4 cluster rows, whole on every device
        assert leaf.shape[0] == 4 and leaf.sharding.is_fully_replicated, leaf.sharding
      assert len({s.device for s in leaf.addressable_shards}) == 8
      jax.tree_util.tree_map(
          lambda a, b: np.testing.assert_allclose(a, b[:a.shape[0]] if a.ndim == b.ndim and
                                                  a.shape != b.shape else b, rtol=2e-5,
                                                  atol=2e-6), out[0], out[1])
    print('STORE-OK')
''')


# Fewer clients than devices (some devices own none), clients without examples, a cohort of one
# and one larger than the population (drawn with replacement), over 8 and 3 devices; and
# power-of-d's full loss read from a split pool, against each client's mean loss.
EDGES = textwrap.dedent('''
import jax, jax.numpy as jnp, numpy as np
from fedjax_gel import algorithms, models
from fedjax_gel.core import federated_data as fd, keys, sampling, store, selection
from fedjax_gel.core.devices import client_mesh
from fedjax_gel.core.round import build_round
rng = np.random.default_rng(3)
for sizes in POPULATIONS:
  clients=[{'x': rng.normal(size=(n,4)).astype(np.float32), 'y': rng.integers(0,3,n).astype(np.int32)} for n in sizes]
  host=fd.from_client_arrays(clients)
  model=models.get_model('logistic',(4,),3); loss=models.cross_entropy_loss(model)
  root=keys.root_key(0); params=model.init(keys.init_key(root))
  N=len(sizes)
  # SCAFFOLD (a round with a store) at both cohort sizes; FedAvgCM at the larger only
  for alg, cohorts in [(algorithms.fedavgcm(loss,0.05,0.9), (7,)),
                       (algorithms.scaffold(loss,0.05,N), (1, 7))]:
    for C in cohorts:
      spec=sampling.CohortSpec(C,(1,4),2,replace=True)
      outs=[]
      for D,chunk in [(1,C),(8,3),(3,2)][:MESHES]:
        mesh=client_mesh(D)
        rf=build_round(alg, chunk_size=chunk, mesh=mesh)
        st=store.place_state(alg.server_init(params), alg, mesh)
        pool=fd.to_device(host, mesh)
        for r in range(3):
          c=sampling.sample_cohort(root,r,pool.counts,spec)
          st,m=rf(st,c,pool,root,jnp.int32(r))
        outs.append((st,m))
      for st,m in outs[1:]:
        np.testing.assert_allclose(m.train_loss, outs[0][1].train_loss, rtol=1e-5, atol=1e-6)
        assert int(m.grad_computations)==int(outs[0][1].grad_computations)
        jax.tree.map(lambda a,b: np.testing.assert_allclose(np.asarray(a)[:np.shape(b)[0]] if np.ndim(a) else a, b, rtol=1e-5, atol=1e-6), st, outs[0][0])
  # power-of-d full loss on split pool vs numpy
  mesh=client_mesh(8); pool=fd.to_device(host, mesh)
  ex=models.per_example_loss(model)
  ids=jnp.arange(N, dtype=jnp.int32)
  got=selection.client_losses(ex, params, pool, ids, 'full', 2, None)
  ref=[float(np.mean(ex(params, {k: jnp.asarray(v) for k,v in c.items()}))) if len(c['y']) else 0. for c in clients]
  np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-5, atol=1e-6)
print('EDGE-OK')
''')


def run_on_eight_devices(script, token):
  helpers.run_on_cpu_devices(script, token, 8)


@pytest.mark.slow
def test_eight_cpu_devices_match_one():
  run_on_eight_devices(SCRIPT, 'SHARDED-OK')


@pytest.mark.slow
def test_client_store_sharded_over_eight_devices_matches_one():
  """SCAFFOLD's and FedVARP's stores, split over 8 devices
  (30 rows padded to 32), and ClusterFedVARP's store, whole on every device, give the
  single-device rounds' models and rows."""
  run_on_eight_devices(STATEFUL, 'STORE-OK')


@pytest.mark.parametrize('populations, meshes', [([[5, 0, 7, 0, 3]], 3), ([[0, 4], [9]], 2)])
@pytest.mark.slow
def test_populations_smaller_than_the_mesh_and_empty_clients_match_one_device(populations,
                                                                             meshes):
  # two processes: the suite's two workers can run them side by side; the 3-device mesh
  # (8 clients' rows padded to 9) on the first population only
  run_on_eight_devices(f'POPULATIONS = {populations}\nMESHES = {meshes}\n' + EDGES, 'EDGE-OK')
