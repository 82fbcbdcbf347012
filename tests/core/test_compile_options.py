"""Programs compiled for compile time (``core.backend.xla.QUICK_COMPILE``) compute what XLA's
defaults compute, and the experiment layer picks them for small rounds only."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_gel import algorithms
from fedjax_gel.core import keys
from fedjax_gel.core.backend import Backend, xla
from fedjax_gel.core.round import build_round
from fedjax_gel.experiment import planning
from fedjax_gel.experiment.config import make
from helpers import DEFAULT_EMITTERS, as_runs_compile, cohort, init_params


@pytest.mark.parametrize('name', ['fedavgcm', 'gel'])
@pytest.mark.slow
def test_a_quick_round_equals_the_default_one(data, loss, model, name):
  if xla.compiler_options(True) is None:
    pytest.skip("one program either way: no XLA CPU legacy emitters here (jaxlib >= 0.11 or "
                "not CPU)")
  alg = {'fedavgcm': algorithms.fedavgcm(loss, 0.1, 0.9), 'gel': algorithms.gel(loss, 0.1)}[name]
  c = cohort([0, 1, 2, 3, 4, 5, 12], [1, 2, 3, 4, 5, 6, 3])
  out = {}
  for label, options in (('quick', xla.compiler_options(True)),
                         ('default', DEFAULT_EMITTERS)):
    state = alg.server_init(init_params(model))
    rf = build_round(alg, chunk_size=3, backend=Backend(compiler_options=as_runs_compile(options)))
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
  assert xla.compiler_options(False) is None


def test_cpu_compile_options_go_to_the_cpu_backend_only(monkeypatch):
  """XLA CPU's option is passed on CPU only, and only where jaxlib has it (0.11 removed the
  legacy emitters; an unknown option is an error there)."""
  if xla.QUICK_COMPILE:   # this jaxlib knows the option: a program compiles with it
    compiled = jax.jit(lambda x: x + 1, compiler_options=xla.QUICK_COMPILE)
    np.testing.assert_array_equal(compiled(jnp.ones(2)), 2.)
  options = {'xla_cpu_use_fusion_emitters': False}
  monkeypatch.setattr(xla, 'QUICK_COMPILE', options)
  monkeypatch.setattr(jax, 'default_backend', lambda: 'cpu')
  assert xla.compiler_options(True) == options and xla.compiler_options(False) is None
  monkeypatch.setattr(jax, 'default_backend', lambda: 'gpu')
  assert xla.compiler_options(True) is None
  monkeypatch.setattr(jax, 'default_backend', lambda: 'cpu')
  monkeypatch.setattr(xla, 'QUICK_COMPILE', {})   # jaxlib >= 0.11
  assert xla.compiler_options(True) is None


CONFIGURE = """
import os, sys
from fedjax_gel.core.backend import xla
first = xla.configure_cpu(3)
import jax, jax.numpy as jnp
loop = lambda x: jax.lax.fori_loop(0, 5, lambda i, c: c * 1.5 + 1., x)   # 8 KiB a step
hlo = jax.jit(loop).lower(jnp.ones(1024)).compile().as_text()
print(first, xla.configure_cpu(3), jax.device_count(), 'xla_cpu_small_call' in hlo)
print(os.environ['XLA_FLAGS'])
"""


@pytest.mark.parametrize('preset', [
    '', '--xla_force_host_platform_device_count=2 '
        '--xla_backend_extra_options=xla_cpu_small_while_loop_byte_threshold=1024'])
@pytest.mark.slow
def test_configure_cpu_sets_devices_and_small_loops_unless_xla_flags_do(preset):
  """In a fresh process: cores as devices and a loop over 8 KiB compiled as one kernel (XLA's
  own threshold is 1 KiB); options that ``XLA_FLAGS`` sets already are the user's, kept; after
  JAX has started nothing changes."""
  import os
  import subprocess
  import sys
  env = {**os.environ, 'XLA_FLAGS': preset, 'JAX_PLATFORMS': 'cpu'}
  out = subprocess.run([sys.executable, '-c', CONFIGURE], env=env, capture_output=True,
                       text=True, check=True).stdout.splitlines()
  if preset:
    assert out == ['True False 2 False', preset]
  else:
    assert out[0] == 'True False 3 True'
    assert out[1] == f'{xla.CPU_DEVICES_FLAG}=3 {xla.SMALL_LOOP_FLAG}'


def test_a_small_quick_round_runs_its_local_steps_as_one_kernel(data, loss, model):
  """The local-step loop of a small model, its products fused (``core.backend.small_dots``), compiled
  for compile time: nothing in it calls a library, so with the suite's (and ``launch/run.py``'s)
  threshold XLA compiles the whole loop, which carries the data pool, as one kernel."""
  if xla.compiler_options(True) is None:
    pytest.skip("XLA CPU's legacy emitters only (jaxlib < 0.11, the CPU backend)")
  alg = algorithms.fedavgcm(loss, 0.1, 0.9)
  rf = build_round(alg, chunk_size=7, backend=Backend(
      fuse_small_dots=True, compiler_options=xla.compiler_options(True)))
  c = cohort([0, 1, 2, 3, 4, 5, 12], [4] * 7)
  hlo = rf.lower(alg.server_init(init_params(model)), c, data, keys.root_key(0),
                 jnp.int32(0)).compile().as_text()
  pool = jax.tree.leaves(data.examples)[0]
  pool_type = f'{pool.dtype}[{",".join(map(str, pool.shape))}]'.replace('float32', 'f32')
  calls = [line for line in hlo.splitlines() if 'xla_cpu_small_call' in line]
  assert any(pool_type in line for line in calls), (pool_type, calls)
