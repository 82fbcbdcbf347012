"""The planner's chunk rule (``planning.default_chunk_size``) by hand: the memory it budgets and
the budget-sorted chunks of cohorts whose budgets differ; its device rule by hand and on two
CPU devices."""
import pytest
import jax

from fedjax_gel.core import backend
from fedjax_gel.experiment.planning import default_chunk_size

import helpers


def test_default_chunk_size_respects_memory(model):
  params = helpers.init_params(model)   # 15 float32 = 60 bytes
  assert default_chunk_size(10_000, params, 16, 5, memory_bytes=1 << 30) == 10_000
  per_client = 8 * 60 + 2 * 5 * 16
  assert default_chunk_size(10_000, params, 16, 5, memory_bytes=4 * 100 * per_client) == 100
  assert default_chunk_size(10, params, 16, 5, memory_bytes=1) == 1


def test_default_chunk_size_cuts_heterogeneous_cohorts_into_budget_sorted_chunks(model,
                                                                               monkeypatch):
  params = model.init(jax.random.key(0))
  big = 1 << 30
  monkeypatch.setattr(jax, 'default_backend', lambda: 'cpu')   # each chunk loops its own budget
  # Equal budgets: one chunk. Budgets that differ: about 16 chunks, never below 32 clients
  # per device, never above what memory allows.
  assert default_chunk_size(2000, params, 16, 5, memory_bytes=big, equal_budgets=True) == 2000
  assert default_chunk_size(2000, params, 16, 5, memory_bytes=big, equal_budgets=False) == 125
  assert default_chunk_size(2000, params, 16, 5, 2, memory_bytes=big,
                            equal_budgets=False) == 125
  assert default_chunk_size(20, params, 16, 5, memory_bytes=big, equal_budgets=False) == 20
  assert default_chunk_size(300, params, 16, 5, 4, memory_bytes=big, equal_budgets=False) == 128
  assert default_chunk_size(2000, params, 16, 5, memory_bytes=1, equal_budgets=False) == 1


def test_accelerators_keep_heterogeneous_cohorts_in_one_chunk(model, monkeypatch):
  """On an accelerator every chunk loops to the budget range's largest ``b`` (``core.round``'s
  ``default_static_steps``), so budget-sorted chunks would only run more, smaller loops: memory
  alone sets the chunk."""
  params = model.init(jax.random.key(0))   # 15 float32 = 60 bytes
  monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
  assert backend.default_static_steps(False) and backend.default_static_steps(True)
  assert default_chunk_size(2000, params, 16, 5, memory_bytes=1 << 30,
                            equal_budgets=False) == 2000
  per_client = 8 * 60 + 2 * 5 * 16
  assert default_chunk_size(2000, params, 16, 5, memory_bytes=4 * 100 * per_client,
                            equal_budgets=False) == 100
  monkeypatch.setattr(jax, 'default_backend', lambda: 'cpu')
  assert backend.default_static_steps(True) and not backend.default_static_steps(False)


def test_cpu_devices_are_used_when_each_gets_enough_work():
  from fedjax_gel.core import devices  # pylint: disable=g-import-not-at-top
  synthetic = 5 * 305   # LEAF Synthetic's step: B = 5 of a 60 -> 5 logistic model
  # the same decisions as the client rule for LEAF Synthetic (measured: 2 devices slower at
  # 200 clients, faster at 400)
  for cohort in (20, 399, 400, 10_000):
    assert (devices.auto_num_devices(cohort, 2, synthetic) ==
            devices.auto_num_devices(cohort, 2) == (2 if cohort >= 400 else 1))
  cnn = 20 * 608_702   # GeL's FEMNIST CNN, B = 20
  assert devices.auto_num_devices(20, 2, cnn) == 2
  assert devices.auto_num_devices(2, 2, cnn) == 2 and devices.auto_num_devices(1, 2, cnn) == 1
  assert devices.auto_num_devices(3, 8, cnn) == 1   # fewer clients than devices
  assert devices.auto_num_devices(20, 2) == 1       # no work given: 200 clients per device


TWO_DEVICES = '''
import jax, numpy as np
from fedjax_gel import algorithms, models
from fedjax_gel.core import devices, evaluation, federated_data as fd
from fedjax_gel.experiment import planning
assert jax.device_count() == 2
rng = np.random.default_rng(0)
host = fd.from_client_arrays([{'x': rng.random((30, 60), np.float32),
                               'y': rng.integers(0, 5, 30).astype(np.int32)} for _ in range(40)])
# LEAF Synthetic's logistic model (305 parameters) at B = 5: 200 clients a device; the MLP's
# (4,229 parameters) 15
for name, cohort, want in (('mlp', 40, 2), ('logistic', 40, 1), ('logistic', 400, 2)):
  model = models.get_model(name, (60,), 5)
  params = model.init(jax.random.key(0))
  alg = algorithms.fedavgcm(models.cross_entropy_loss(model), 0.1, 0.9)
  mesh, _ = planning.devices_and_chunk(alg, params, host, cohort, 5, True)
  assert (1 if mesh is None else mesh.size) == want, (name, cohort, mesh)
# a replicated model read on the first device: the evaluation runs there once
mesh = devices.client_mesh(2)
server = devices.replicate(params, mesh)
first = jax.devices()[0]
local = devices.local_copy(server, first)
assert all(a.devices() == {first} for a in jax.tree.leaves(local))
jax.tree.map(np.testing.assert_array_equal, local, params)
pool = evaluation.make_eval_pool(host)
evaluate = evaluation.build_evaluate(model.apply)
out = evaluate(local, pool)
assert out['loss'].devices() == {first}
np.testing.assert_array_equal(out['loss'], evaluate(params, pool)['loss'])
# an experiment of the MLP's 40 clients a round spreads over both; a learning-rate grid of it,
# which runs on one device, is planned on one
import io, json, tempfile
from fedjax_gel.experiment import api, factories
from fedjax_gel.experiment.config import make
from fedjax_gel.experiment.sweep import Sweep
leaf = tempfile.mktemp(suffix='.json')
x = rng.normal(size=(40, 12, 60))
with open(leaf, 'w') as f:
  json.dump({'users': [f'u{i}' for i in range(40)], 'num_samples': [12] * 40,
             'user_data': {f'u{i}': {'x': x[i].tolist(), 'y': (np.arange(12) % 5).tolist()}
                           for i in range(40)}}, f)
c = make(dataset='leaf', data_path=leaf, model='mlp', algorithm='fedavg', num_rounds=1,
         eval_every=1, clients_per_round=40, batch_size=5, budget_range=(1, 1))
exp = factories.prepare(c)
assert exp.mesh.size == 2 and factories.prepare(c, grid=True).mesh is None
# its pool (40 x 12 examples) fits whole on both devices: the round deals the cohort by budget
assert exp.train.examples['x'].sharding.is_fully_replicated
assert planning.replicate_pool(exp.algorithm, host, exp.mesh)
assert not planning.replicate_pool(exp.algorithm, host, None)          # one device
room = 2 * planning.pool_bytes(host) / planning.REPLICATED_POOL_FRACTION   # two copies' memory
assert planning.replicate_pool(exp.algorithm, host, exp.mesh, memory_bytes=int(room) + 1)
assert not planning.replicate_pool(exp.algorithm, host, exp.mesh, memory_bytes=int(room) - 16)
scaffold = algorithms.scaffold(models.cross_entropy_loss(model), 0.1, 40)
assert not planning.replicate_pool(scaffold, host, exp.mesh)   # its store is split by client
api.run(c, tempfile.mkdtemp(), Sweep(server_lrs=[0.5, 1.0]), out=io.StringIO(),
        err=io.StringIO())
print('TWO-DEVICES-OK')
'''


@pytest.mark.slow
def test_two_cpu_devices_plan_by_work_and_evaluate_on_the_first():
  """On two CPU devices: the automatic choice by work, the evaluation on the first device, a
  learning-rate grid on one, and the pool whole on both devices where it fits (not for a store
  split by client)."""
  helpers.run_on_cpu_devices(TWO_DEVICES, 'TWO-DEVICES-OK', 2)
