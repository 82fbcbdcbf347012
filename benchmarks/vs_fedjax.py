"""The same FedAvgCM workload in FedJAX and in fedjax_gel, side by side, in one process.

Two workloads (``--workload``), each in its paper's setting, client SGD lr 0.01 with momentum
0.9, server SGD lr 1, cohorts drawn with replacement (the same clients on both sides), the same
Flax model and loss on both sides:

* ``synthetic`` (default): LEAF Synthetic logistic regression (60 -> 5) on its 1,000 clients,
  every client ``tau = 13`` steps of ``B = 5``.
* ``cnn``: GeL's FEMNIST CNN (``models.gel_femnist_cnn``, 608,702 parameters), ``tau = 8`` steps
  of ``B = 20``, on FEMNIST-shaped random clients of 200 images (``common.femnist_like_workload``;
  FEMNIST is a download), as many clients as the largest cohort (at least 100). The CNN takes
  the patches convolution on CPU and GPU, XLA's own on TPU (``models.layers``), on both
  sides.

Reported per cohort size: fedjax_gel's compile time and FedJAX's first round (which holds the
compilation of FedJAX's jitted step only at the first cohort size: later sizes reuse it), round time
(median of ``--repeats`` rounds after a warm-up round, timed alternately, ``block_until_ready``),
examples/s, and ``speedup = FedJAX round time / fedjax_gel round time``.

* FedJAX (0.0.17): ``fedjax.algorithms.fed_avg.federated_averaging`` with its default
  ``for_each_client`` backend (a jitted step, Python loops over clients and steps). Two times:
  the round as a FedJAX user runs it (the cohort's client datasets fetched with
  ``InMemoryFederatedData.get_client``, then ``algorithm.apply``), and ``apply`` alone (client
  datasets built before the clock starts). ``speedup`` is against the whole round,
  ``speedup (apply)`` against ``apply`` alone.
* fedjax_gel: ``sample_cohort`` plus the compiled round (``launch/run.py``'s defaults: every CPU
  core a device, large cohorts split over them; the planner's chunk).

FedJAX calls ``jax.tree_map``, which recent JAX removed; the script aliases it to
``jax.tree.map`` before importing fedjax. Needs ``pip install fedjax`` (it brings dm-haiku);
without it the script stops with one line.

Usage: ``python benchmarks/vs_fedjax.py [--workload synthetic|cnn] [--cohorts 20,200,1000]
[--repeats 5] [--json PATH] [--plot PNG]``; the results go to
``benchmarks/results/vs_fedjax[-<variant>].json`` (``common.write_results``).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import common  # pylint: disable=g-import-not-at-top,wrong-import-position

LR, MOMENTUM = 0.01, 0.9
TITLES = {'synthetic': 'LEAF Synthetic', 'cnn': 'GeL FEMNIST CNN'}


def workload(name: str, cohorts: list[int]):
  """``(host pool, pool on device, loss, root key, initial params)`` of ``--workload``."""
  if name == 'cnn':
    host, data, _, loss, root, params = common.femnist_like_workload(max(cohorts + [100]), 200)
    return host, data, loss, root, params
  split, data, _, loss, root, params = common.synthetic_workload()
  return split.train, data, loss, root, params


def fedjax_side(loss, train_np, names, tau: int, batch: int):
  """FedJAX's FedAvg with client SGD momentum over ``InMemoryFederatedData``."""
  import fedjax  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top

  data = fedjax.InMemoryFederatedData(train_np)
  grad_fn = jax.grad(lambda params, batch, rng: loss(params, batch))
  algorithm = fedjax.algorithms.fed_avg.federated_averaging(
      grad_fn, fedjax.optimizers.sgd(LR, momentum=MOMENTUM), fedjax.optimizers.sgd(1.0),
      fedjax.ShuffleRepeatBatchHParams(batch_size=batch, num_steps=tau))

  def clients(ids, round_idx):
    rngs = jax.random.split(jax.random.key(round_idx), len(ids))
    return [(names[i], data.get_client(names[i]), rngs[j]) for j, i in enumerate(ids)]
  return algorithm, clients


def fedjax_setup(host, loss, tau: int, batch: int):
  """``fedjax_side`` on every client of ``host`` (a fedjax_gel pool on the host), named
  ``c00000``, ``c00001``, ...; FedJAX's removed ``jax.tree_map`` aliased first."""
  import jax  # pylint: disable=g-import-not-at-top
  jax.tree_map = jax.tree.map   # fedjax 0.0.17 still calls the removed alias

  from fedjax_gel.core import federated_data  # pylint: disable=g-import-not-at-top

  names = [f'c{i:05d}'.encode() for i in range(host.num_clients)]
  train_np = {names[i]: federated_data.client_examples(host, i) for i in range(host.num_clients)}
  return fedjax_side(loss, train_np, names, tau, batch)


def fedjax_round(algorithm, state, clients, ids, round_idx: int) -> tuple[float, float]:
  """Seconds of one FedJAX round on clients ``ids`` as a FedJAX user runs it (the cohort's
  client datasets fetched, then ``apply``, waited for) and of its ``apply`` alone."""
  import jax  # pylint: disable=g-import-not-at-top
  t = time.perf_counter()
  cohort = clients(ids, round_idx)
  t_apply = time.perf_counter()
  jax.block_until_ready(algorithm.apply(state, cohort)[0].params)
  done = time.perf_counter()
  return done - t, done - t_apply


def measure(name: str, cohorts: list[int], repeats: int) -> list[dict]:
  if importlib.util.find_spec('fedjax') is None:
    print('error: the FedJAX side needs fedjax: pip install fedjax (it brings dm-haiku)',
          file=sys.stderr)
    sys.exit(2)
  tau, batch = common.ROUND_WORKLOADS[name]
  host, data, loss, root, params = workload(name, cohorts)
  theirs, their_clients = fedjax_setup(host, loss, tau, batch)
  import jax
  import numpy as np

  from fedjax_gel import algorithms

  ours = algorithms.fedavgcm(loss, LR, MOMENTUM)

  rows = []
  for cohort in cohorts:
    ran = common.launch_round(ours, params, data, root, cohort, tau, batch, True)
    compiled, state, pool, sample = ran['compiled'], ran['state'], ran['pool'], ran['sample']

    their_state = theirs.init(params)
    ids = [np.asarray(sample(r).client_ids) for r in range(repeats + 1)]
    their_first = fedjax_round(theirs, their_state, their_clients, ids[0], 0)[0]   # includes compiling its step

    ours_t, theirs_t, apply_t = [], [], []
    for r in range(1, repeats + 1):   # alternately, so both see the same machine load
      t = time.perf_counter()
      out, _ = compiled(state, sample(r), pool, root, np.int32(r))
      jax.block_until_ready(out)
      ours_t.append(time.perf_counter() - t)
      whole, apply = fedjax_round(theirs, their_state, their_clients, ids[r], r)
      theirs_t.append(whole)
      apply_t.append(apply)
    ours_s, theirs_s = statistics.median(ours_t), statistics.median(theirs_t)
    apply_s = statistics.median(apply_t)
    examples = cohort * tau * batch
    rows.append({
        'workload': TITLES[name], 'tau': tau, 'batch': batch,
        'cohort': cohort, 'devices': ran['devices'], 'chunk': ran['chunk'],
        'fedjax_gel_compile_s': ran['compile_s'],
        'fedjax_first_round_s': their_first, 'fedjax_gel_round_s': ours_s,
        'fedjax_round_s': theirs_s, 'fedjax_apply_s': apply_s,
        'fedjax_gel_examples_per_s': examples / ours_s,
        'fedjax_examples_per_s': examples / theirs_s, 'speedup': theirs_s / ours_s,
        'speedup_apply': apply_s / ours_s,
        'device': f'{jax.devices()[0].platform}: {jax.devices()[0].device_kind}',
    })
    print(f'{cohort} clients: fedjax_gel {ours_s * 1e3:.2f} ms, FedJAX {theirs_s * 1e3:.1f} ms, '
          f'{times(theirs_s / ours_s)}', file=sys.stderr)
  return rows


def times(ratio: float) -> str:
  """``12x``, or ``1.4x`` below 10."""
  return f'{ratio:.1f}x' if ratio < 10 else f'{ratio:.0f}x'


COLUMNS = [
    common.CLIENTS,
    common.DEVICES,
    common.Column('chunk', 'chunk', format='{:,}'),
    common.Column('fedjax_gel_compile_s', 'fedjax_gel compile s', 's', 'lower', '{:.2f}'),
    common.Column('fedjax_first_round_s', 'FedJAX first round s', 's', '', '{:.2f}'),
    common.Column('fedjax_gel_round_ms', 'fedjax_gel round ms', 'ms', 'lower', '{:.2f}',
                  get=lambda r: r['fedjax_gel_round_s'] * 1e3),
    common.Column('fedjax_round_ms', 'FedJAX round ms', 'ms', '', '{:.1f}',
                  get=lambda r: r['fedjax_round_s'] * 1e3),
    common.Column('fedjax_apply_ms', 'FedJAX apply ms', 'ms', '', '{:.1f}',
                  get=lambda r: r['fedjax_apply_s'] * 1e3),
    common.Column('fedjax_gel_examples_per_s', 'fedjax_gel examples/s', 'examples/s', 'higher',
                  '{:,.0f}'),
    common.Column('fedjax_examples_per_s', 'FedJAX examples/s', 'examples/s', '', '{:,.0f}'),
    common.Column('speedup', 'speedup (FedJAX round / ours)', 'x', 'higher', 'times'),
    common.Column('speedup_apply', 'speedup (apply)', 'x', 'higher', 'times'),
]


def setting(rows: list[dict]) -> str:
  r = rows[0]
  return f'{r["workload"]}, tau = {r["tau"]}, B = {r["batch"]}, lr {LR}, momentum {MOMENTUM}'


def table(rows: list[dict]) -> str:
  return setting(rows) + '\n\n' + common.markdown_table(COLUMNS, common.figures(COLUMNS, rows))


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--workload', choices=sorted(TITLES), default='synthetic',
                 help='LEAF Synthetic logistic regression or GeL\'s FEMNIST CNN')
  p.add_argument('--cohorts', default='20,200,1000',
                 help='clients per round, comma-separated')
  p.add_argument('--repeats', type=int, default=5, help='rounds timed on each side')
  p.add_argument('--json', help="also write the script's own rows (seconds) to this JSON file")
  p.add_argument('--plot', help='also plot both sides\' examples/s against the cohort (PNG)')
  common.results_flags(p)
  a = p.parse_args(argv)
  variant = common.variant(p, a)
  a.json = common.json_flag(p, a.json)
  a.results_dir = common.check_results_dir(p, a.results_dir)
  cohorts = common.int_list(p, 'cohorts', a.cohorts)
  common.at_least(p, 1, cohorts=cohorts, repeats=a.repeats)
  rows = measure(a.workload, cohorts, a.repeats)
  common.report(rows, table(rows), a.json)
  xs = [r['cohort'] for r in rows]
  tau, batch = common.ROUND_WORKLOADS[a.workload]
  common.plot(a.plot, f'FedAvgCM round, {TITLES[a.workload]}, tau={tau}, B={batch}',
              'clients per round',
              'examples/s', {'fedjax_gel': (xs, [r['fedjax_gel_examples_per_s'] for r in rows]),
                             'FedJAX 0.0.17': (xs, [r['fedjax_examples_per_s'] for r in rows])},
              log='xy')
  common.write_results('vs_fedjax', COLUMNS, rows, variant_name=variant,
                       results_dir=a.results_dir, setting=setting(rows), notes=a.notes,
                       plot=a.plot)


if __name__ == '__main__':
  main()
