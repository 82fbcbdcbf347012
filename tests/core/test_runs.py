"""Runs trained as one program (``core.runs``): their initialisation."""
import pytest
import subprocess
import sys
import textwrap

import helpers

# Builds the batched program of 2 runs of the Shakespeare LSTM (seeds i, i + 1), initialises
# them 4 times and checks each run's state against that run initialised alone. A vmapped
# initialisation of this model deadlocked XLA's CPU runtime on most tries (JAX 0.10.2): the
# process then sleeps forever, so the check runs in a child process with a time limit.
SCRIPT = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from fedjax_gel import algorithms, models
    from fedjax_gel.core import keys, runs
    model = models.shakespeare_lstm((80,), 80)
    make = lambda hp: algorithms.fedavgcm(models.cross_entropy_loss(model), 0.1)
    init_params = lambda root: model.init(keys.init_key(root))
    program = runs.build_runs(make, init_params, lambda *a: None, chunk_size=2)
    alone = jax.jit(lambda root: make({}).server_init(init_params(root)))
    for i in range(4):
      roots = jnp.stack([keys.root_key(2 * i), keys.root_key(2 * i + 1)])
      states = jax.block_until_ready(program.init(roots, {}))
      for j in range(2):
        want = alone(roots[j])
        jax.tree.map(lambda a, b: np.testing.assert_array_equal(a[j], b), states, want)
    print('initialised')
""")


@pytest.mark.slow
def test_batched_lstm_init_finishes_and_equals_each_run_alone():
  # two programs compared to the bit: compiled as runs compile, not as the suite does
  done = subprocess.run([sys.executable, '-c', SCRIPT], capture_output=True, text=True,
                        timeout=120, env=helpers.as_runs_environment())
  assert done.returncode == 0, done.stderr[-2000:]
  assert 'initialised' in done.stdout
