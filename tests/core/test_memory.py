"""Memory estimates against a hand count and against XLA's own memory analysis."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_gel import algorithms, models
from fedjax_gel.core import federated_data as fd
from fedjax_gel.core import memory
from fedjax_gel.core.round import build_round
from fedjax_gel.core.sampling import CohortSpec, sample_cohort


def test_peak_bytes_counts_what_is_live_at_once():
  def f(x):        # x: 1,000 float32 (4,000 bytes, an input: not counted)
    a = jnp.exp(x)                 # a live
    b = a * 2.                     # a and b live: 8,000, the peak; a dies here
    return jnp.sum(b) + jnp.sum(x)  # b dies at its sum
  jaxpr = jax.make_jaxpr(f)(jnp.ones(1000)).jaxpr
  assert memory.peak_bytes(jaxpr) == 8000


def test_peak_bytes_adds_an_inner_programs_peak():
  inner = jax.jit(lambda x: jnp.exp(x) * 2.)   # its own peak: 8,000 bytes

  def f(x):
    a = jnp.sin(x)                 # 4,000 bytes live across the call
    return inner(x) + a
  jaxpr = jax.make_jaxpr(f)(jnp.ones(1000)).jaxpr
  # a (4,000) + the call's inner peak (8,000) + its output (4,000)
  assert memory.peak_bytes(jaxpr) == 16000


def xla_bytes_per_client(alg, params, pool, tau, batch, chunks=(4, 12)):
  """The growth of the compiled round's temporary memory per client added to the chunk."""
  temp = []
  for k in chunks:
    cohort = sample_cohort(jax.random.key(0), 0, pool.counts, CohortSpec(k, (tau, tau), batch))
    round_fn = build_round(alg, chunk_size=k)
    compiled = round_fn.lower(alg.server_init(params), cohort, pool, jax.random.key(1),
                              jnp.int32(0)).compile()
    analysis = compiled.memory_analysis()
    if analysis is None:
      pytest.skip('this backend gives no memory analysis')
    temp.append(analysis.temp_size_in_bytes)
  return (temp[1] - temp[0]) / (chunks[1] - chunks[0])


@pytest.mark.parametrize('algorithm,name,tau,batch', [
    ('fedavgcm', 'logistic', 13, 5),    # a short order: the L x L comparisons
    ('fedavgcm', 'logistic', 400, 5),   # a long order: the sort
    ('gel', 'mlp', 100, 10),            # activations, a larger model, guesses
    ('scaffold', 'mlp', 13, 5),         # control variates: a store row in, a new row out
])
def test_client_bytes_bounds_xla_without_waste(algorithm, name, tau, batch):
  rng = np.random.default_rng(0)
  pool = fd.to_device(fd.from_client_arrays([
      {'x': rng.normal(size=(40, 60)).astype(np.float32),
       'y': rng.integers(0, 5, 40).astype(np.int32)} for _ in range(16)]))
  model = models.get_model(name, (60,), 5)
  loss = models.cross_entropy_loss(model)
  params = model.init(jax.random.key(0))
  alg = {'fedavgcm': lambda: algorithms.fedavg(loss, optax.sgd(0.01, momentum=0.9)),
         'gel': lambda: algorithms.gel(loss, 0.01, 0.9),
         'scaffold': lambda: algorithms.scaffold(loss, 0.01, 16)}[algorithm]()
  spec = {k: jax.ShapeDtypeStruct(v.shape[1:], v.dtype) for k, v in pool.examples.items()}
  estimate = memory.client_bytes(alg, params, spec, batch, tau)
  measured = xla_bytes_per_client(alg, params, pool, tau, batch)
  assert measured <= estimate <= 2.5 * measured, (estimate, measured)
