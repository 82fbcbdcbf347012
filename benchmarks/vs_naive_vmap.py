"""The engine's round against a straightforward vmap + masked-scan round, in one process.

The straightforward round is what a JAX user writes in about 50 lines (``naive_round``): the
cohort's clients vmapped all at once, a ``lax.scan`` over the ``b`` local steps with steps
beyond ``tau_i`` masked, then the weighted mean of the clients' models and their mean loss. No
chunking, no budget sorting, no rewrite of the small products, XLA's defaults, one device. Its
data order (``--naive_order``): ``replace`` (default, the cheapest there is and so the strictest
baseline) draws each minibatch's examples uniformly with replacement; ``shuffle`` shuffles each
client's examples without replacement as the engine does, the way a user would (``argsort`` of
uniform scores over the largest client's ``n``, examples beyond ``n_i`` sent last, cycled when
``tau_i B > n_i``), which costs ``O(n log n)`` a client where the engine's costs
``O(tau_max B)``.

The engine's round is ``launch/run.py``'s: the devices, chunk and compile options of the
library's planner (``benchmarks/common.launch_round``), doing its full job (population gather,
partial Fisher-Yates shuffles, budget-sorted chunks, weighted aggregation and every
``RoundMetrics`` field: bytes, the clients' model spread, finiteness).

Same workload on both sides: LEAF Synthetic's training pool on the device, the logistic model,
FedAvgCM (client SGD lr 0.01 with momentum 0.9, server SGD(1)), the same cohorts (clients and
budgets ``tau_i ~ U{a..b}``, ``--budget_range``) and batch; the engine's examples through a
gradient (``RoundMetrics.examples``) are checked, every round, against ``sum_i min(tau_i, b) B``
over the clients with data, which the naive round's step masks put through by construction. Compile times apart, each side
is timed two ways, alternately (``BLOCKS`` times ``--repeats`` rounds each way, after a
warm-up), each round's model fed to the next as training feeds it (``common.chained_rounds``):
*waited*, each round waited for before the next is dispatched (the median round: its latency,
as ``launch/run.py``'s loop runs with several processes), and *in a row*, the rounds dispatched
while earlier ones run, as the loop runs in one process and as a user's Python loop over the
round runs unless it reads a result every round (the median over the blocks of a block's time
over its rounds: the throughput). The two differ by the host's dispatch of a round, which runs
beside the device's work of the round before only in a row. Both rounds take the round index as a NumPy ``int32``, as
``launch/run.py``'s loop passes it (a ``jnp.int32(r)`` built per call would add about 0.1 ms of
host dispatch to each timed round). Each cohort size runs in its own process.

Usage: ``python benchmarks/vs_naive_vmap.py [--cohorts 20,200,1000,2000,10000]
[--budget_range 13,13] [--batch_size 5] [--repeats 10] [--naive_order replace|shuffle]
[--json PATH]``; the results go to ``benchmarks/results/vs_naive_vmap[-<variant>].json``
(``common.write_results``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import common  # pylint: disable=g-import-not-at-top,wrong-import-position

LR, MOMENTUM = 0.01, 0.9
BLOCKS = 3   # alternations of the two rounds, each way of timing them


def naive_round(loss, max_budget: int, batch: int, max_count: int, order: str = 'replace'):
  """The straightforward round: ``(params, examples, offsets, counts, ids, budgets, weights,
  root, round) -> (new params, mean loss)``, jitted (the round's key folded in inside, as the
  engine does); ``order``: ``'replace'`` or ``'shuffle'``."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  def client(params, examples, offset, n, budget, key):
    if order == 'replace':
      picks = jax.random.randint(key, (max_budget * batch,), 0, jnp.maximum(n, 1))
    else:
      scores = jnp.where(jnp.arange(max_count) < n, jax.random.uniform(key, (max_count,)), 2.)
      picks = jnp.argsort(scores)[jnp.arange(max_budget * batch) % jnp.maximum(n, 1)]
    rows = (offset + picks).reshape(max_budget, batch)
    velocity = jax.tree.map(jnp.zeros_like, params)

    def step(carry, k):
      y, v = carry
      b = {name: a[rows[k]] for name, a in examples.items()}
      value, g = jax.value_and_grad(loss)(y, b)
      v_new = jax.tree.map(lambda v_, g_: MOMENTUM * v_ - LR * g_, v, g)
      y_new = jax.tree.map(jnp.add, y, v_new)
      on = k < budget
      keep = lambda new, old: jax.tree.map(lambda a, b_: jnp.where(on, a, b_), new, old)
      return (keep(y_new, y), keep(v_new, v)), jnp.where(on, value, 0.)

    (y, _), losses = jax.lax.scan(step, (params, velocity), jnp.arange(max_budget))
    return y, jnp.sum(losses) / jnp.maximum(budget, 1)

  @jax.jit
  def round_fn(params, examples, offsets, counts, ids, budgets, weights, root, r):
    key = jax.random.fold_in(root, r)
    n = counts[ids]
    budgets = jnp.where(n > 0, budgets, 0)
    w = jnp.where(n > 0, weights, 0.)
    keys = jax.random.split(key, ids.shape[0])
    ys, losses = jax.vmap(client, in_axes=(None, None, 0, 0, 0, 0))(
        params, examples, offsets[ids], n, budgets, keys)
    p = w / jnp.sum(w)
    new = jax.tree.map(lambda a: jnp.tensordot(p, a, axes=1), ys)
    return new, jnp.sum(p * losses)

  return round_fn


def measure(cohort: int, budget_range: tuple[int, int], batch: int, repeats: int,
            order: str) -> dict:
  """Runs in a fresh process: one cohort size, both rounds, timed alternately."""
  _, data, _, loss, root, params = common.synthetic_workload()
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from fedjax_gel import algorithms  # pylint: disable=g-import-not-at-top
  from fedjax_gel.core import sampling  # pylint: disable=g-import-not-at-top

  alg = algorithms.fedavgcm(loss, LR, MOMENTUM)
  spec = sampling.CohortSpec(cohort, budget_range, batch, replace=True,
                             weighting='samples_seen')
  cohorts = [sampling.sample_cohort(root, r, data.counts, spec) for r in range(repeats + 1)]
  counts = np.asarray(data.counts)
  naive = naive_round(loss, budget_range[1], batch, int(counts.max()), order)
  pool = jax.device_put(data.examples, jax.devices()[0])
  offsets, counts_d = jax.device_put((data.offsets, data.counts), jax.devices()[0])

  # compiled before the engine's round: building that registers fedjax_gel's unrolled Threefry
  # lowering for the process, and the naive round is measured as JAX compiles it by default
  t = time.perf_counter()
  naive = naive.lower(params, pool, offsets, counts_d, cohorts[0].client_ids,
                      cohorts[0].budgets, cohorts[0].weights, root, np.int32(0)).compile()
  naive_compile_s = time.perf_counter() - t

  def naive_call(c, r):
    return naive(params, pool, offsets, counts_d, c.client_ids, c.budgets, c.weights, root,
                 np.int32(r))

  jax.block_until_ready(naive_call(cohorts[0], 0))
  engine = common.launch_round(alg, params, data, root, cohort, budget_range, batch,
                               replace=True)

  seen = []   # the engine's rounds' metrics, checked after the timing

  def engine_step(state, r):
    state, metrics = engine['compiled'](state, cohorts[r], engine['pool'], root, np.int32(r))
    seen.append((r, metrics))
    return state

  def naive_step(carry, r):
    c = cohorts[r]
    return naive(carry[0], pool, offsets, counts_d, c.client_ids, c.budgets, c.weights, root,
                 np.int32(r))

  timed = {(side, wait): [] for side in ('engine', 'naive') for wait in (True, False)}
  for _ in range(BLOCKS):   # alternated, so both see the same machine load
    for wait in (True, False):
      timed['engine', wait] += common.chained_rounds(engine_step, engine['state'], repeats,
                                                     wait)[1]
      timed['naive', wait] += common.chained_rounds(naive_step, (params, None), repeats,
                                                    wait)[1]
  for r, metrics in seen:
    c = cohorts[r]
    useful = int(np.sum(np.where(counts[np.asarray(c.client_ids)] > 0,
                                 np.minimum(np.asarray(c.budgets), budget_range[1]), 0))) * batch
    assert int(metrics.examples) == useful, (int(metrics.examples), useful)
  median = {k: statistics.median(v) for k, v in timed.items()}
  return {'cohort': cohort, 'budget_range': list(budget_range), 'batch': batch,
          'naive_order': order,
          'devices': engine['devices'], 'chunk': engine['chunk'],
          'compile_s': engine['compile_s'], 'naive_compile_s': naive_compile_s,
          'round_s': median['engine', True], 'naive_round_s': median['naive', True],
          'speedup': median['naive', True] / median['engine', True],
          'chained_round_s': median['engine', False],
          'naive_chained_round_s': median['naive', False],
          'chained_speedup': median['naive', False] / median['engine', False],
          'examples_per_round': useful,
          'device': f'{jax.devices()[0].platform}: {jax.devices()[0].device_kind}'}


def budgets_text(r: dict) -> str:
  a, b = r['budget_range']
  return f'tau = {a}' if a == b else f'U{{{a}..{b}}}'


COLUMNS = [
    common.CLIENTS,
    common.Column('budgets', 'budgets', left=True, get=budgets_text),
    common.Column('naive_order', 'naive order', left=True),
    common.Column('engine_devices', 'engine devices', get=lambda r: r['devices']),
    common.Column('chunk', 'chunk', format='{:,}'),
    common.Column('engine_compile_s', 'engine compile s', 's', 'lower', '{:.2f}',
                  get=lambda r: r['compile_s']),
    common.Column('naive_compile_s', 'naive compile s', 's', '', '{:.2f}'),
    common.Column('engine_round_ms', 'engine round ms, waited', 'ms', 'lower', '{:.2f}',
                  get=lambda r: r['round_s'] * 1e3),
    common.Column('naive_round_ms', 'naive round ms, waited', 'ms', '', '{:.2f}',
                  get=lambda r: r['naive_round_s'] * 1e3),
    common.Column('speed', 'speed, waited (naive / engine; >1: the engine faster)', 'x',
                  'higher', '{:.2f}x', get=lambda r: r['speedup']),
    common.Column('engine_round_ms_in_a_row', 'engine round ms, in a row', 'ms', 'lower',
                  '{:.2f}', get=lambda r: r['chained_round_s'] * 1e3),
    common.Column('naive_round_ms_in_a_row', 'naive round ms, in a row', 'ms', '', '{:.2f}',
                  get=lambda r: r['naive_chained_round_s'] * 1e3),
    common.Column('speed_in_a_row', 'speed, in a row', 'x', 'higher', '{:.2f}x',
                  get=lambda r: r['chained_speedup']),
]
SETTING = (f'FedAvgCM (client lr {LR}, momentum {MOMENTUM}) on LEAF Synthetic; medians, the two '
           'rounds timed alternately, each round waited for and in a row')


def table(rows: list[dict]) -> str:
  return SETTING + '\n\n' + common.markdown_table(COLUMNS, common.figures(COLUMNS, rows))


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--cohorts', default='20,200,1000,2000,10000',
                 help='clients per round, comma-separated; each size in a process of its own')
  p.add_argument('--budget_range', default='13,13', help='a,b: tau_i ~ U{a..b}')
  p.add_argument('--batch_size', type=int, default=5, help='examples per local step (B)')
  p.add_argument('--repeats', type=int, default=10,
                 help=f'rounds per block; the two rounds alternate in {BLOCKS} blocks of this '
                      'many rounds each way of timing')
  p.add_argument('--naive_order', default='replace', choices=('replace', 'shuffle'),
                 help="the naive round's data order (see the module doc)")
  p.add_argument('--json', help="also write the script's own rows (seconds) to this JSON file")
  common.results_flags(p)
  p.add_argument('--single', type=int, help=argparse.SUPPRESS)
  a = p.parse_args(argv)
  variant = common.variant(p, a)
  a.json = common.json_flag(p, a.json)
  a.results_dir = common.check_results_dir(p, a.results_dir) if not a.single else ''
  cohorts = common.int_list(p, 'cohorts', a.cohorts)
  budgets = common.budget_range(p, a.budget_range)
  common.at_least(p, 1, cohorts=cohorts, batch_size=a.batch_size, repeats=a.repeats)
  if a.single:
    print(json.dumps(measure(a.single, tuple(budgets), a.batch_size, a.repeats, a.naive_order)))
    return
  rows = []
  for c in cohorts:
    rows.append(common.in_fresh_process(__file__, c, [
        '--budget_range', a.budget_range, '--batch_size', str(a.batch_size),
        '--repeats', str(a.repeats), '--naive_order', a.naive_order]))
    r = rows[-1]
    print(f'{c} clients: engine {r["round_s"] * 1e3:.2f} ms, naive '
          f'{r["naive_round_s"] * 1e3:.2f} ms ({r["speedup"]:.2f}x) each round waited for; '
          f'{r["chained_round_s"] * 1e3:.2f} and {r["naive_chained_round_s"] * 1e3:.2f} ms '
          f'({r["chained_speedup"]:.2f}x) in a row', file=sys.stderr, flush=True)
  common.report(rows, table(rows), a.json)
  common.write_results('vs_naive_vmap', COLUMNS, rows, variant_name=variant,
                       results_dir=a.results_dir, setting=SETTING, notes=a.notes)


if __name__ == '__main__':
  main()
