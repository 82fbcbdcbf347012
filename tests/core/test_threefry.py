"""The unrolled Threefry-2x32 lowering on CPU: the same function as JAX's, one kernel, and only
within a ``Backend``'s lowering (nothing process-wide outlives it)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.random import threefry_2x32

from fedjax_gel import algorithms, models
from fedjax_gel.core.backend import Backend, threefry
from fedjax_gel.core.round import build_round

from helpers import cohort, init_params

# Known-answer vectors of Threefry-2x32 with 20 rounds (Salmon et al. 2011, Random123's
# kat_vectors): (key, counter, output).
KAT = [((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6b200159, 0x99ba4efe)),
       ((0xffffffff, 0xffffffff), (0xffffffff, 0xffffffff), (0x1cb996fc, 0xbb002be7)),
       ((0x13198a2e, 0x03707344), (0x243f6a88, 0x85a308d3), (0xc4923a9c, 0x483df7a0))]


def numpy_threefry(key, x1, x2):
  """An oracle in NumPy uint64 arithmetic reduced mod 2^32, written from the paper's
  description (rounds, rotations, key schedule) rather than from ``core.backend.threefry``."""
  m = np.uint64(0xFFFFFFFF)
  k = [np.uint64(key[0]), np.uint64(key[1])]
  k.append(k[0] ^ k[1] ^ np.uint64(0x1BD11BDA))
  x = [(x1.astype(np.uint64) + k[0]) & m, (x2.astype(np.uint64) + k[1]) & m]
  rot = [13, 15, 26, 6, 17, 29, 16, 24]
  for rnd in range(20):
    r = np.uint64(rot[rnd % 8])
    x[0] = (x[0] + x[1]) & m
    x[1] = (((x[1] << r) | (x[1] >> (np.uint64(32) - r))) & m) ^ x[0]
    if rnd % 4 == 3:
      s = rnd // 4 + 1
      x[0] = (x[0] + k[s % 3]) & m
      x[1] = (x[1] + k[(s + 1) % 3] + np.uint64(s)) & m
  return x[0].astype(np.uint32), x[1].astype(np.uint32)


def test_known_answers_of_the_unrolled_lowering_and_the_oracle():
  for key, ctr, out in KAT:
    u = lambda v: np.array([v], np.uint32)
    with threefry.unrolled_on_cpu():
      got = jax.jit(threefry_2x32)(np.array(key, np.uint32), np.array(ctr, np.uint32))
    assert tuple(int(v) for v in np.asarray(got)) == out
    ref = numpy_threefry(key, u(ctr[0]), u(ctr[1]))
    assert (int(ref[0][0]), int(ref[1][0])) == out


def test_unrolled_lowering_computes_threefry_in_one_loopless_program():
  rng = np.random.default_rng(0)
  key = rng.integers(0, 2**32, 2, dtype=np.uint64).astype(np.uint32)
  count = rng.integers(0, 2**32, 2000, dtype=np.uint64).astype(np.uint32)
  fn = Backend().jit(threefry_2x32)
  got = np.asarray(fn(key, count))
  ref = numpy_threefry(key, count[:1000], count[1000:])
  np.testing.assert_array_equal(got, np.concatenate(ref))
  # counters of several axes, and none
  grid = count.reshape(2, 50, 20)
  want = np.concatenate([a.reshape(50, 20) for a in numpy_threefry(key, grid[0], grid[1])])
  np.testing.assert_array_equal(np.asarray(fn(key, grid)).reshape(100, 20), want)
  assert fn(key, count[:0]).shape == (0,)
  if jax.default_backend() == 'cpu':
    assert ' while(' not in fn.lower(key, count).compile().as_text()
    with threefry.unrolled_on_cpu(), threefry.unrolled_on_cpu():   # nested
      draws = jax.jit(lambda k: jax.random.randint(k, (50,), 0, 7))
      assert ' while(' not in draws.lower(jax.random.key(0)).compile().as_text()
    assert set(np.asarray(draws(jax.random.key(0))).tolist()) <= set(range(7))


def test_building_and_running_a_round_leaves_jax_lowering_as_it_was(data, model):
  """A round lowers its hashes unrolled; the user's own programs, lowered after it, keep JAX's
  rule (on CPU a loop), and draw the same bits."""
  alg = algorithms.fedavgcm(models.cross_entropy_loss(model), 0.1, 0.9)
  params = init_params(model)
  rf = build_round(alg, chunk_size=2)
  rf(alg.server_init(params), cohort([1, 4], [2, 3]), data, jax.random.key(0), jnp.int32(1))
  mine = jax.jit(lambda k: jax.random.bits(k, (8,), jnp.uint32))
  if jax.default_backend() == 'cpu':
    assert ' while(' in mine.lower(jax.random.key(5)).compile().as_text()
    with Backend().lowering():
      unrolled = jax.jit(lambda k: jax.random.bits(k, (8,), jnp.uint32))
      assert ' while(' not in unrolled.lower(jax.random.key(5)).compile().as_text()
    np.testing.assert_array_equal(mine(jax.random.key(5)), unrolled(jax.random.key(5)))


def test_blocks_closed_out_of_order_leave_jax_rule_in_place():
  """Two blocks (two threads' programs) closed in the other order than opened: JAX's rule is
  back once both are."""
  hashed = lambda: jax.jit(lambda k: jax.random.bits(k, (8,), jnp.uint32)).lower(
      jax.random.key(5)).compile().as_text()
  if jax.default_backend() != 'cpu':
    pytest.skip('the unrolled lowering is a CPU one')
  first, second = threefry.unrolled_on_cpu(), threefry.unrolled_on_cpu()
  first.__enter__()
  second.__enter__()
  first.__exit__(None, None, None)
  assert ' while(' not in hashed()   # the second block still holds it
  second.__exit__(None, None, None)
  assert ' while(' in hashed()
