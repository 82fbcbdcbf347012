"""The per-client store: mean writes, dropped writers, untouched rows, gathers in the round, and
stores built for another population refused."""
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_gel import algorithms, models
from fedjax_gel.core.algorithm import FederatedAlgorithm
from fedjax_gel.core import keys
from fedjax_gel.core import store
from fedjax_gel.core.round import build_round

from helpers import cohort, init_params


@pytest.mark.slow
def test_write_mean_averages_duplicates_and_drops_non_writers():
  s = {'a': jnp.arange(12.).reshape(6, 2), 'n': jnp.arange(6, dtype=jnp.int32)}
  idx = jnp.array([4, 1, 4, 0, 1, 4, 5])
  new = {'a': jnp.arange(14.).reshape(7, 2) * 10, 'n': jnp.array([7, 8, 9, 10, 20, 11, 99])}
  writes = jnp.array([True, True, True, False, True, True, False])
  out = store.write_mean(s, idx, new, writes)
  a = np.arange(12.).reshape(6, 2)
  a[4] = np.mean([[0, 10], [40, 50], [100, 110]], axis=0)   # writers 0, 2, 5
  a[1] = np.mean([[20, 30], [80, 90]], axis=0)              # writers 1, 4
  np.testing.assert_allclose(out['a'], a)                   # rows 0 and 5: dropped writers
  np.testing.assert_array_equal(out['n'], [0, 14, 2, 3, 9, 5])   # ints: rounded means


@pytest.mark.slow
def test_write_mean_with_no_writer_changes_nothing():
  s = jnp.arange(8.).reshape(4, 2)
  out = store.write_mean(s, jnp.array([0, 3]), jnp.full((2, 2), np.nan), jnp.array([False, False]))
  np.testing.assert_array_equal(out, s)


class S(NamedTuple):
  params: Any
  clients: Any


def counting_algorithm(num_clients):
  """Each client's row counts its rounds and keeps its last budget; the server sums nothing."""
  def client_final(state, x, ctx):
    del state, x
    row = {'rounds': ctx.stored['rounds'] + 1, 'budget': ctx.budget}
    return jnp.zeros(()), row

  return FederatedAlgorithm(
      'count', lambda p: S(p, store.zeros({'rounds': jnp.zeros((), jnp.int32),
                                           'budget': jnp.zeros((), jnp.int32)}, num_clients)),
      lambda s: s.params, lambda x, ctx: {'params': x}, lambda st, b, x: (st, jnp.zeros(())),
      client_final, lambda s, u, info: s, lambda s: s.params,
      client_model=lambda st: st['params'], store_row=lambda ids: ids)


def test_round_gathers_and_writes_rows_of_real_clients_only(data):
  alg = counting_algorithm(13)
  rf = build_round(alg, chunk_size=2)
  state = alg.server_init(jnp.zeros(3))
  ids, taus = [3, 7, 12, 3, 0], [2, 5, 4, 2, 1]   # 12 has no data; 3 sampled twice
  for r in range(3):
    state, _ = rf(state, cohort(ids, taus), data, keys.root_key(0), jnp.int32(r))
  rounds = np.zeros(13, int)
  rounds[[0, 3, 7]] = 3
  np.testing.assert_array_equal(state.clients['rounds'], rounds)
  budgets = np.zeros(13, int)
  budgets[[0, 3, 7]] = [1, 2, 5]
  np.testing.assert_array_equal(state.clients['budget'], budgets)


def test_store_bytes_and_place_without_mesh():
  s = store.zeros({'w': jax.ShapeDtypeStruct((4, 3), jnp.float32)}, 10)
  assert store.row_bytes(s) == 48 and store.num_rows(s) == 10
  assert store.place(s, None) is s


@pytest.mark.parametrize('make,words', [
    (lambda loss: algorithms.scaffold(loss, 0.1, 10),
     'scaffold keeps a row per client, and its store has 10 rows for a population of 13 '
     "clients; build it for the pool's 13 clients"),
    (lambda loss: algorithms.feddyn(loss, 0.1, 0.1, 20), 'has 20 rows for a population of 13'),
    (lambda loss: algorithms.fedvarp(loss, 0.1, np.full(4, .25), clusters=[0, 1, 2, 0]),
     'fedvarp maps 4 clients to rows 0..2 of a store of 3 rows, for a population of 13'),
], ids=['scaffold_too_few_rows', 'feddyn_too_many_rows', 'cluster_table_too_short'])
def test_a_store_built_for_another_population_is_refused(data, model, make, words):
  """A client past the store's rows would read and write its last row (the gather clamps), and
  rows no client owns would dilute a mean over the store; both are a ValueError first."""
  alg = make(models.cross_entropy_loss(model))
  state = alg.server_init(init_params(model))
  rf = build_round(alg, chunk_size=2)
  with pytest.raises(ValueError, match='^round_fn: ') as e:
    rf(state, cohort([0, 1], [1, 1]), data, keys.root_key(0), jnp.int32(0))
  assert words in str(e.value)
  with pytest.raises(ValueError, match=words.split(',')[0]):
    rf.lower(state, cohort([0, 1], [1, 1]), data, keys.root_key(0), jnp.int32(0))


@pytest.mark.slow
def test_a_store_for_the_population_runs(data, model):
  loss = models.cross_entropy_loss(model)
  for alg in (algorithms.scaffold(loss, 0.1, 13),
              algorithms.fedvarp(loss, 0.1, np.full(13, 1 / 13), clusters=np.arange(13) % 3)):
    state = alg.server_init(init_params(model))
    state, _ = build_round(alg, chunk_size=2)(state, cohort([0, 12], [1, 1]), data,
                                               keys.root_key(0), jnp.int32(0))
    assert store.num_rows(state.clients) == (13 if alg.store_row is store.by_client else 3)


@pytest.mark.parametrize('make,words', [
    (lambda loss: algorithms.scaffold(loss, 0.1, 0), 'scaffold: num_clients must be a positive'),
    (lambda loss: algorithms.feddyn(loss, 0.1, 0.1, 2.5), 'feddyn: num_clients must be a'),
    (lambda loss: algorithms.adabest(loss, 0.1, 0.1, 0.5, -3), 'adabest: num_clients'),
    (lambda loss: algorithms.scaffold(loss, 0.1, 3, weights=[.5, .5]),
     r'scaffold: weights must be one finite, non-negative weight per client \(3\) summing to 1 '
     r'\(got shape \(2,\), sum 1\)'),
    (lambda loss: algorithms.scaffold(loss, 0.1, 2, weights=[.5, .6]), r'sum 1.1\)'),
    (lambda loss: algorithms.fedvarp(loss, 0.1, np.ones(3)), r'summing to 1 \(got shape \(3,\), '
     'sum 3'),
    (lambda loss: algorithms.fedvarp(loss, 0.1, []), r'fedvarp: memory_weights must be .* '
     r'\(got shape \(0,\)\)'),
    (lambda loss: algorithms.fedvarp(loss, 0.1, [.5, .5], clusters=[0, -1]),
     'fedvarp: clusters must give one non-negative integer row per client .got int64 .2,., '
     'min -1.'),
    (lambda loss: algorithms.fedvarp(loss, 0.1, [.5, .5], clusters=[0, 1, 1]),
     'fedvarp: clusters must give one cluster per client, 2 as memory_weights .got 3.'),
], ids=['scaffold_no_clients', 'feddyn_fraction', 'adabest_negative', 'scaffold_weights',
        'scaffold_weights_sum', 'fedvarp_weights_sum', 'fedvarp_no_weights', 'negative_cluster',
        'clusters_length'])
def test_stateful_algorithms_refuse_a_population_they_cannot_hold(model, make, words):
  with pytest.raises(ValueError, match=words):
    make(models.cross_entropy_loss(model))
