"""Programs compiled for compile time (``core.devices.QUICK_COMPILE``) compute what XLA's
defaults compute, and the experiment layer picks them for small rounds only."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_gel import algorithms
from fedjax_gel.core import devices, keys
from fedjax_gel.core.round import build_round
from fedjax_gel.experiment import planning
from fedjax_gel.experiment.config import make
from helpers import DEFAULT_EMITTERS, cohort, init_params


@pytest.mark.parametrize('name', ['fedavgcm', 'gel'])
def test_a_quick_round_equals_the_default_one(data, loss, model, name):
  alg = {'fedavgcm': algorithms.fedavgcm(loss, 0.1, 0.9), 'gel': algorithms.gel(loss, 0.1)}[name]
  c = cohort([0, 1, 2, 3, 4, 5, 12], [1, 2, 3, 4, 5, 6, 3])
  out = {}
  for label, options in (('quick', devices.compiler_options(True)),
                         ('default', DEFAULT_EMITTERS)):
    state = alg.server_init(init_params(model))
    rf = build_round(alg, chunk_size=3, compiler_options=options)
    for r in range(3):
      state, metrics = rf(state, c, data, keys.root_key(0), jnp.int32(r))
    out[label] = (state.params, metrics.train_loss)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
               out['quick'], out['default'])


def test_only_small_rounds_are_compiled_for_compile_time():
  # work = clients x mean budget x batch x parameters, by hand
  logistic = {'w': jax.ShapeDtypeStruct((60, 5), jnp.float32),
              'b': jax.ShapeDtypeStruct((5,), jnp.float32)}           # 305 parameters
  quickstart = make(clients_per_round=20, budget_range=(4, 13), batch_size=5).cohort
  assert planning.quick_compile(quickstart, logistic)                 # 259,250
  large = make(clients_per_round=200, budget_range=(4, 13), batch_size=5).cohort
  assert not planning.quick_compile(large, logistic)                  # 2,592,500
  at = lambda clients: make(clients_per_round=clients, budget_range=(10, 10), batch_size=5).cohort
  assert planning.quick_compile(at(65), logistic)                     # 991,250
  assert not planning.quick_compile(at(66), logistic)                 # 1,006,500
  cnn = {'w': jax.ShapeDtypeStruct((608_702,), jnp.float32)}          # GeL's FEMNIST CNN
  assert not planning.quick_compile(make(clients_per_round=20, budget_range=(4, 13),
                                         batch_size=20).cohort, cnn)
  assert devices.compiler_options(False) is None
  assert devices.compiler_options(True) == devices.QUICK_COMPILE
