"""SCAFFOLD, FedDyn, AdaBest and (Cluster)FedVARP in the engine against independent oracles:
a per-client reference loop written from the papers' formulas, closed forms of the server
recursions (seed 003, Remarks 3-5) and equivalences (AdaBest beta = mu = 0 and FedVARP with full
participation are FedAvg)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_gel import algorithms
from fedjax_gel.algorithms import drift
from fedjax_gel.core.algorithm import RoundInfo
from fedjax_gel.core import keys
from fedjax_gel.core.round import build_round

from helpers import (EMPTY_CLIENT, TAU_MAX, assert_trees_close, cohort, grad_of, init_params,
                     minibatches)

LR, MU, BETA, N = 0.1, 0.05, 0.7, 13
tree_map = jax.tree_util.tree_map
# (ids, budgets) per round: client 0 comes back after a gap, the empty client never counts.
ROUNDS = [([0, 3, 5, EMPTY_CLIENT], [2, 1, 3, 4]), ([3, 7, 1], [1, 4, 2]),
          ([0, 3, 7, 9], [3, 2, 1, 5])]


def engine(alg, params, data, rounds=ROUNDS, chunk_size=2):
  rf = build_round(alg, chunk_size=chunk_size)
  state = alg.server_init(params)
  for r, (ids, taus) in enumerate(rounds):
    state, _ = rf(state, cohort(ids, taus), data, keys.root_key(0), jnp.int32(r))
  return state


def local_sgd(data, loss, x, cid, slot, tau, r, correction, mu=0.):
  """``tau`` steps of ``y <- y - lr (grad + correction + mu (y - x))`` on the engine's batches."""
  y = x
  for batch in minibatches(data, cid, slot, tau, round_idx=r):
    g = grad_of(loss)(y, batch)
    y = tree_map(lambda y, g, c, x0: y - LR * (g + c + mu * (y - x0)), y, g, correction, x)
  return y


def mean(trees):
  return tree_map(lambda *ls: sum(ls) / len(ls), *trees)


def sub(a, b):
  return tree_map(jnp.subtract, a, b)


def scale(s, a):
  return tree_map(lambda v: s * v, a)


def reference(kind, data, loss, x, rounds=ROUNDS):
  """The papers' per-client loops with uniform weights: ``(params, {client: row})``."""
  zero = tree_map(jnp.zeros_like, x)
  rows, c, h, avg, last = {}, zero, zero, x, {}
  counts = np.asarray(data.counts)
  for r, (ids, taus) in enumerate(rounds):
    t, deltas, dcs, new_rows = r + 1, [], [], {}
    for slot, (cid, tau) in enumerate(zip(ids, taus)):
      if counts[cid] == 0:
        continue
      row = rows.get(cid, zero)
      if kind == 'scaffold':
        y = local_sgd(data, loss, x, cid, slot, tau, r, sub(c, row))
        d = sub(x, y)
        new = tree_map(lambda ci, c0, d: ci - c0 + d / (tau * LR), row, c, d)
        dcs.append(sub(new, row))
      elif kind == 'feddyn':
        y = local_sgd(data, loss, x, cid, slot, tau, r, scale(-1., row), MU)
        d = sub(x, y)
        new = tree_map(lambda hi, d: hi + MU * d, row, d)
      else:
        y = local_sgd(data, loss, x, cid, slot, tau, r, scale(-1., row))
        d = sub(x, y)
        new = tree_map(lambda hi, d: hi / (t - last.get(cid, 0)) + MU * d, row, d)
        last[cid] = t
      deltas.append(d)
      new_rows[cid] = new
    g_bar = mean(deltas)
    if kind == 'scaffold':
      x = sub(x, g_bar)
      c = tree_map(lambda c, dc: c + len(deltas) / N * dc, c, mean(dcs))   # the paper's form
    elif kind == 'feddyn':
      h = tree_map(lambda h, g: h + len(deltas) / N * g, h, g_bar)
      x = sub(sub(x, g_bar), h)
    else:
      new_avg = sub(x, g_bar)
      x = sub(new_avg, scale(BETA, sub(avg, new_avg)))
      avg = new_avg
    rows.update(new_rows)
  return x, rows


def stored(state, cid):
  clients = state.clients.h if hasattr(state.clients, 'h') else state.clients
  return tree_map(lambda s: s[cid], clients)


@pytest.mark.parametrize('kind', ['scaffold', 'feddyn', 'adabest'])
@pytest.mark.slow
def test_three_rounds_match_the_per_client_reference(kind, data, loss, model):
  x = init_params(model)
  alg = {'scaffold': lambda: drift.scaffold(loss, LR, N),
         'feddyn': lambda: drift.feddyn(loss, LR, MU, N),
         'adabest': lambda: drift.adabest(loss, LR, MU, BETA, N)}[kind]()
  state = engine(alg, x, data)
  ref_x, ref_rows = reference(kind, data, loss, x)
  assert_trees_close(state.params, ref_x, tol=1e-5)
  for cid in range(N):
    want = ref_rows.get(cid, tree_map(jnp.zeros_like, x))
    assert_trees_close(stored(state, cid), want, tol=1e-5)
  assert set(ref_rows) == {0, 1, 3, 5, 7, 9}
  if kind == 'adabest':
    np.testing.assert_array_equal(state.clients.last_round,
                                  [3, 2, 0, 3, 0, 1, 0, 3, 0, 3, 0, 0, 0])
    assert int(state.round) == 3


@pytest.mark.slow
def test_scaffold_full_participation_one_step_by_hand(data, loss, model):
  """Two rounds, every client, one step each: round 1 has ``c = c_i = 0`` so ``c_i+ = g_i^1``
  and ``c+ = mean_i g_i^1``; round 2 steps on ``g_i^2 + c - c_i``, whose mean over clients is
  ``mean_i g_i^2``: ``x2 = x1 - lr mean_i g_i^2``, ``c_i++ = g_i^2``, ``c++ = mean_i g_i^2``."""
  ids = list(range(12))   # every client with data; the empty one weighs nothing in c
  x0 = init_params(model)
  alg = drift.scaffold(loss, LR, N, weights=(np.arange(N) != EMPTY_CLIENT) / 12)
  state = engine(alg, x0, data, rounds=[(ids, [1] * 12)] * 2, chunk_size=5)
  grads = [[grad_of(loss)(x, next(minibatches(data, i, i, 1, round_idx=r))) for i in ids]
           for r, x in [(0, x0)]]
  x1 = sub(x0, scale(LR, mean(grads[0])))
  grads.append([grad_of(loss)(x1, next(minibatches(data, i, i, 1, round_idx=1))) for i in ids])
  x2 = sub(x1, scale(LR, mean(grads[1])))
  assert_trees_close(state.params, x2, tol=1e-5)
  assert_trees_close(alg.broadcast(state)[1], mean(grads[1]), tol=1e-4)
  for i in ids:
    assert_trees_close(stored(state, i), grads[1][i], tol=1e-4)


def test_scaffold_control_moves_by_the_participating_fraction(data, loss, model):
  """First round, ``c = c_i = 0``: ``c+ = |P| / N * mean_i Delta_i / (tau_i lr)``."""
  x = init_params(model)
  ids, taus = [2, 6, 9], [3, 1, 2]
  alg = drift.scaffold(loss, LR, N)
  state = engine(alg, x, data, rounds=[(ids, taus)])
  zero = tree_map(jnp.zeros_like, x)
  per_step = [scale(1. / (tau * LR), sub(x, local_sgd(data, loss, x, i, s, tau, 0, zero)))
              for s, (i, tau) in enumerate(zip(ids, taus))]
  assert_trees_close(alg.broadcast(state)[1], scale(3 / N, mean(per_step)), tol=1e-4)


@pytest.mark.slow
def test_scaffold_control_is_the_clients_mean_with_duplicates(data, loss, model):
  """A client sampled twice writes the mean of its two ``c_i+``; ``c`` stays ``sum_j q_j c_j``
  for any weights ``q``."""
  x = init_params(model)
  q = np.arange(1., N + 1) / np.arange(1., N + 1).sum()
  alg = drift.scaffold(loss, LR, N, weights=q)
  rounds = [([2, 6, 2, 9], [3, 1, 2, 2]), ([6, 6, 1], [2, 4, 1]), ([2, 0, 9, 9], [1, 3, 2, 5])]
  state = engine(alg, x, data, rounds=rounds)
  c = alg.broadcast(state)[1]
  want = tree_map(lambda rows: np.tensordot(q, np.asarray(rows, np.float64), axes=1),
                  state.clients)
  assert_trees_close(c, want, tol=1e-6)
  assert float(np.abs(np.asarray(state.clients['Dense_0']['bias'][6])).sum()) > 0


def random_updates(x, rounds, seed=0):
  rng = np.random.default_rng(seed)
  return [tree_map(lambda a: jnp.asarray(rng.normal(size=a.shape), a.dtype) * 0.1, x)
          for _ in range(rounds)]


def test_adabest_server_h_is_the_remark3_power_series(loss, model):
  """``h^t = sum_{s<=t} beta^(t-s+1) g_bar^s`` and ``x^t = theta_bar^t - h^t``, ``theta_bar^t =
  x^{t-1} - g_bar^t``."""
  x0 = init_params(model)
  alg = drift.adabest(loss, LR, MU, BETA, N)
  state, gs = alg.server_init(x0), random_updates(x0, 6)
  x = x0
  for t, g in enumerate(gs, start=1):
    state = alg.server_update(state, g, RoundInfo(jnp.float32(1.), jnp.float32(4.)))
    h = tree_map(lambda *ls: sum(BETA ** (t - s + 1) * l for s, l in enumerate(ls, start=1)),
                 *gs[:t])
    theta_bar = sub(x, g)
    x = sub(theta_bar, h)
    assert_trees_close(sub(state.average, state.params), h, tol=1e-5)
    assert_trees_close(state.params, x, tol=1e-5)


def test_feddyn_server_is_adabest_with_beta_one_at_full_participation(loss, model):
  """FedDyn: ``h^t = sum_s |P^s| / N g_bar^s`` (its recursion summed); with ``|P^s| = N`` its
  models are AdaBest's with ``beta = 1`` (seed 003, Remark 5)."""
  x0 = init_params(model)
  dyn, best = drift.feddyn(loss, LR, MU, N), drift.adabest(loss, LR, MU, 1., N)
  gs = random_updates(x0, 5, seed=1)
  parts = [3., 5., 13., 1., 8.]
  s_dyn = dyn.server_init(x0)
  for t, (g, p) in enumerate(zip(gs, parts), start=1):
    s_dyn = dyn.server_update(s_dyn, g, RoundInfo(jnp.float32(p), jnp.float32(p)))
    h = tree_map(lambda *ls: sum(q / N * l for q, l in zip(parts, ls)), *gs[:t])
    assert_trees_close(s_dyn.h, h, tol=1e-5)
  s_dyn, s_best = dyn.server_init(x0), best.server_init(x0)
  for g in gs:
    full = RoundInfo(jnp.float32(N), jnp.float32(N))
    s_dyn, s_best = dyn.server_update(s_dyn, g, full), best.server_update(s_best, g, full)
    assert_trees_close(s_dyn.params, s_best.params, tol=1e-5)


@pytest.mark.slow
def test_adabest_with_beta_and_mu_zero_is_fedavg(data, loss, model):
  """Seed 003, Remark 4; the same cohorts, budgets and data order."""
  x = init_params(model)
  best = engine(drift.adabest(loss, LR, 0., 0., N), x, data)
  avg = engine(algorithms.fedavg(loss, optax.sgd(LR)), x, data)
  assert_trees_close(best.params, avg.params, tol=1e-6)


def full_rounds(budgets):
  return [(list(range(12)), taus) for taus in budgets]


@pytest.mark.slow
def test_fedvarp_with_full_participation_is_fedavg(data, loss, model):
  x = init_params(model)
  rng = np.random.default_rng(3)
  rounds = full_rounds(rng.integers(1, TAU_MAX + 1, size=(4, 12)).tolist())
  q = np.where(np.arange(N) == EMPTY_CLIENT, 0., 1 / 12)   # the clients with data
  varp = engine(algorithms.fedvarp(loss, LR, q), x, data, rounds,
                chunk_size=5)
  avg = engine(algorithms.fedavg(loss, optax.sgd(LR)), x, data, rounds, chunk_size=5)
  assert_trees_close(varp.params, avg.params, tol=1e-5)
  memory = varp.clients['Dense_0']['kernel']
  assert float(jnp.abs(memory[:EMPTY_CLIENT]).min()) > 0   # memory of every client with data
  assert not jnp.any(memory[EMPTY_CLIENT])


def varp_reference(data, loss, x, q, clusters, rounds=ROUNDS):
  """``v = mean_i (Delta_i - y_{c(i)}) + sum_c q_c y_c``; a sampled cluster's memory becomes the
  mean of its clients' ``Delta_i``."""
  zero = tree_map(jnp.zeros_like, x)
  memory, counts = {}, np.asarray(data.counts)
  q_c = np.bincount(clusters, weights=q)
  for r, (ids, taus) in enumerate(rounds):
    corrections, written = [], {}
    for slot, (cid, tau) in enumerate(zip(ids, taus)):
      if counts[cid] == 0:
        continue
      d = sub(x, local_sgd(data, loss, x, cid, slot, tau, r, zero))
      corrections.append(sub(d, memory.get(clusters[cid], zero)))
      written.setdefault(clusters[cid], []).append(d)
    held = zero
    for k, y in memory.items():
      held = tree_map(lambda h, y, k=k: h + q_c[k] * y, held, y)
    x = sub(x, tree_map(jnp.add, mean(corrections), held))
    memory.update({k: mean(ds) for k, ds in written.items()})
  return x, memory


@pytest.mark.parametrize('num_clusters', [None, 3])
@pytest.mark.slow
def test_fedvarp_partial_participation_matches_reference(data, loss, model, num_clusters):
  x = init_params(model)
  q = np.asarray(data.counts, np.float64)
  q = q / q.sum()
  clusters = np.arange(N) if num_clusters is None else np.arange(N) % num_clusters
  alg = algorithms.fedvarp(loss, LR, q, clusters=None if num_clusters is None else clusters)
  state = engine(alg, x, data)
  ref_x, memory = varp_reference(data, loss, x, q, clusters)
  assert_trees_close(state.params, ref_x, tol=1e-5)
  rows = N if num_clusters is None else num_clusters
  for k in range(rows):
    want = memory.get(k, tree_map(jnp.zeros_like, x))
    assert_trees_close(tree_map(lambda s: s[k], state.clients), want, tol=1e-5)
