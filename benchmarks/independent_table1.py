"""An independent, plain-JAX run of GeL's Table 1 on LEAF Synthetic: a speed baseline.

This script shares nothing with fedjax_gel but the data loader (``fedjax_gel.data.leaf_synthetic``):
no engine, no algorithms, no models. It is what a competent JAX user would write by hand for the
Table 1 protocol of Boukhari et al. 2023, GeL, and serves as the baseline that
``benchmarks/RESULTS.md`` sets the simulator's wall time against.

Protocol, per seed s, per client learning rate lr, per algorithm in {FedAvgCM, GeL}:

* Model: multinomial logistic regression, W [60, 5] (lecun-normal) and b [5] (zeros), initialised
  from seed s; both algorithms of one seed start from the same model.
* Round r: 20 clients drawn uniformly with replacement (key from (s, r)), each with a budget
  tau_i ~ Uniform{4..13}; batch size B = 5. Client i shuffles its own n_i examples (key from
  (s, r, slot)) and takes consecutive minibatches of 5 from the permutation, cycling around.
* Client optimiser: SGD with momentum 0.9 (v <- 0.9 v + g; w <- w - lr v), v = 0 at the start of
  every round; loss: softmax cross-entropy averaged over the minibatch.
* FedAvgCM: tau_i real steps. GeL (zero-proxy guesses): tau_i real steps, then 18 - tau_i guessed
  steps with a zero gradient (v <- 0.9 v; w <- w - lr v), 18 = 13 + 5.
* Server: w <- w - sum_i p_i (w - w_i) / sum_i p_i, p_i = min(tau_i B, n_i) (server lr 1.0).
* Test accuracy over the whole test pool at round 0 and every 5 rounds; reported: the first
  evaluated round at 85% or more (None if never). All rounds are run (no early stop).

One ``jax.jit``-ed round (``jax.vmap`` over the 20 clients, ``lax.fori_loop`` over 18 steps with
per-client masks) driven by a Python loop over rounds. Prints rounds-to-85% per (lr, algorithm)
and the whole protocol's wall and process CPU time.

``--draws project``: the random draws are fedjax_gel's instead of the script's own (the initial
model from ``models.logistic`` with ``core.keys.init_key``; round r's cohort, budgets and
shuffle keys from ``core.keys.round_key``/``client_key``; the shuffles as
``core.shuffle.cycled_permutation``), the arithmetic still the script's: run on the seeds of the
Synthetic reproduction, it pairs with it seed by seed, which tells a difference of protocol
(rounds that differ) from one of draws (rounds that agree on every seed).

Usage: ``python benchmarks/independent_table1.py [--rounds 300] [--seeds 0,1,2,3,4]
[--lrs 0.01,0.005] [--draws own|project]``; the results go to
``benchmarks/results/independent_table1[-<variant>].json`` (``common.write_results``).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # pylint: disable=wrong-import-position
import jax.numpy as jnp  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position
from jax import lax  # pylint: disable=wrong-import-position

from benchmarks import common  # pylint: disable=wrong-import-position
from fedjax_gel.data import leaf_synthetic  # pylint: disable=wrong-import-position

CLIENTS_PER_ROUND = 20
BATCH = 5
TAU_MIN, TAU_MAX = 4, 13
GEL_STEPS = TAU_MAX + 5          # 18: real steps plus zero-gradient guessed steps
MOMENTUM = 0.9
TARGET = 0.85
EVAL_EVERY = 5
ALGORITHMS = ('fedavgcm', 'gel')


def init_params(key, dim, num_classes):
  w = jax.nn.initializers.lecun_normal()(key, (dim, num_classes), jnp.float32)
  return {'W': w, 'b': jnp.zeros((num_classes,), jnp.float32)}


def loss_fn(params, x, y):
  logits = x @ params['W'] + params['b']
  return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))


def own_draws(key, r, num_clients):
  """Round ``r``'s cohort, budgets and per-slot shuffle keys, from the run's key."""
  k_clients, k_tau, k_shuffle = jax.random.split(jax.random.fold_in(key, r), 3)
  clients = jax.random.randint(k_clients, (CLIENTS_PER_ROUND,), 0, num_clients)
  taus = jax.random.randint(k_tau, (CLIENTS_PER_ROUND,), TAU_MIN, TAU_MAX + 1)
  slot_keys = jax.vmap(lambda i: jax.random.fold_in(k_shuffle, i))(
      jnp.arange(CLIENTS_PER_ROUND))
  return clients, taus, slot_keys


def own_order(key, n, max_n, pool_rows):
  """Step t's examples: a uniform permutation of the client's n examples (sorted random keys,
  padding last), taken B at a time, cycling."""
  del pool_rows
  u = jnp.where(jnp.arange(max_n) < n, jax.random.uniform(key, (max_n,)), 2.0)
  perm = jnp.argsort(u)
  return lambda t: perm[(t * BATCH + jnp.arange(BATCH)) % n]


def project_draws(root, r, num_clients):
  """fedjax_gel's draws of round ``r`` (1-based here, 0-based there) from the seed's root."""
  from fedjax_gel.core import keys  # pylint: disable=g-import-not-at-top
  i = r - 1
  clients = jax.random.randint(keys.round_key(root, i, keys.COHORT), (CLIENTS_PER_ROUND,), 0,
                               num_clients, dtype=jnp.int32)
  taus = jax.random.randint(keys.round_key(root, i, keys.BUDGET), (CLIENTS_PER_ROUND,),
                            TAU_MIN, TAU_MAX + 1, dtype=jnp.int32)
  per_client = keys.round_key(root, i, keys.CLIENT)
  slot_keys = jax.vmap(lambda c, s: jax.random.split(keys.client_key(per_client, c, s))[0])(
      clients, jnp.arange(CLIENTS_PER_ROUND, dtype=jnp.int32))
  return clients, taus, slot_keys


def project_order(key, n, max_n, pool_rows):
  """Step t's examples as fedjax_gel draws them (``core.shuffle.cycled_permutation``)."""
  from fedjax_gel.core import shuffle  # pylint: disable=g-import-not-at-top
  del max_n
  order = shuffle.cycled_permutation(key, n, GEL_STEPS * BATCH, pool_rows)
  return lambda t: order[t * BATCH + jnp.arange(BATCH)]


DRAWS = {'own': (own_draws, own_order), 'project': (project_draws, project_order)}


def make_round(x_pool, y_pool, offsets, counts, max_n, gel, draws='own'):
  """The jitted round ``(params, key, r, lr) -> params`` for FedAvgCM (gel=False) or GeL, with
  ``draws``' randomness (``DRAWS``)."""
  num_clients = offsets.shape[0]
  num_steps = GEL_STEPS if gel else TAU_MAX
  grad_fn = jax.grad(loss_fn)
  draw, order_of = DRAWS[draws]

  def client_update(params, offset, n, tau, key, lr):
    examples = order_of(key, n, max_n, x_pool.shape[0])
    last = tau if not gel else GEL_STEPS

    def step(t, state):
      w, v = state
      idx = offset + examples(t)
      g = grad_fn(w, x_pool[idx], y_pool[idx])
      real = t < tau                  # a real step; otherwise a zero-gradient guess (GeL)
      active = t < last               # this client still has steps to take
      new_v = jax.tree.map(lambda v, g: MOMENTUM * v + jnp.where(real, g, 0.0), v, g)
      new_w = jax.tree.map(lambda w, v: w - lr * v, w, new_v)
      keep = lambda new, old: jnp.where(active, new, old)
      return jax.tree.map(keep, new_w, w), jax.tree.map(keep, new_v, v)

    v0 = jax.tree.map(jnp.zeros_like, params)
    w, _ = lax.fori_loop(0, num_steps, step, (params, v0))
    return jax.tree.map(lambda g, l: g - l, params, w)   # Delta_i = w_global - w_i

  @jax.jit
  def round_fn(params, key, r, lr):
    clients, taus, slot_keys = draw(key, r, num_clients)
    n = counts[clients]
    deltas = jax.vmap(client_update, in_axes=(None, 0, 0, 0, 0, None))(
        params, offsets[clients], n, taus, slot_keys, lr)
    p = jnp.minimum(taus * BATCH, n).astype(jnp.float32)
    weights = p / jnp.sum(p)
    return jax.tree.map(lambda w, d: w - jnp.tensordot(weights, d, axes=1), params, deltas)

  return round_fn


@jax.jit
def accuracy(params, x, y):
  return jnp.mean(jnp.argmax(x @ params['W'] + params['b'], axis=1) == y)


def own_start(seed, dim, num_classes):
  """The initial model and the run's key."""
  init_key, run_key = jax.random.split(jax.random.PRNGKey(seed))
  return init_params(init_key, dim, num_classes), run_key


def project_start(seed, dim, num_classes):
  """fedjax_gel's initial model (its logistic model's Dense layer) and the seed's root key."""
  from fedjax_gel.core import keys  # pylint: disable=g-import-not-at-top
  from fedjax_gel.models.logistic import logistic  # pylint: disable=g-import-not-at-top
  root = keys.root_key(seed)
  dense = logistic((dim,), num_classes).init(keys.init_key(root))['Dense_0']
  return {'W': dense['kernel'], 'b': dense['bias']}, root


def run(round_fn, params, run_key, lr, rounds, x_test, y_test):
  """Trains for ``rounds`` rounds; the first evaluated round at TARGET test accuracy or None."""
  reached = None
  for r in range(rounds + 1):
    if r > 0:
      params = round_fn(params, run_key, r, lr)
    if r % EVAL_EVERY == 0 and reached is None:
      if float(accuracy(params, x_test, y_test)) >= TARGET:
        reached = r
  return reached


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--rounds', type=int, default=300, help='rounds of every run')
  parser.add_argument('--seeds', default='0,1,2,3,4', help='comma-separated seeds')
  parser.add_argument('--lrs', default='0.01,0.005', help='comma-separated client lrs')
  parser.add_argument('--draws', default='own', choices=sorted(DRAWS),
                      help="the script's own random draws, or fedjax_gel's (see the docstring)")
  parser.add_argument('--results_dir', default=common.RESULTS_DIR,
                      help='folder of the results JSON (benchmarks/results, from which '
                           'benchmarks/results_md.py writes RESULTS.md); empty: none written')
  parser.add_argument('--notes', default='',
                      help="a line the results keep with the figures (the machine's load, what "
                           'else ran)')
  args = parser.parse_args(argv)
  variant = common.variant(parser, args)
  args.results_dir = common.check_results_dir(parser, args.results_dir)
  try:
    seeds = [int(s) for s in args.seeds.split(',')]
    lrs = [float(s) for s in args.lrs.split(',')]
  except ValueError:
    parser.exit(2, f'error: --seeds must be comma-separated integers and --lrs numbers (got '
                   f'{args.seeds!r} and {args.lrs!r})\n')
  if args.rounds < 1 or min(seeds) < 0 or not all(0 < lr < float('inf') for lr in lrs):
    parser.exit(2, 'error: --rounds must be positive, --seeds >= 0 and --lrs positive\n')

  t0 = time.perf_counter()
  split = leaf_synthetic.load()
  load_s = time.perf_counter() - t0
  train, test = split.train, split.test
  counts_np = np.asarray(train.counts)
  x_pool = jnp.asarray(train.examples['x'])
  y_pool = jnp.asarray(train.examples['y'])
  offsets, counts = jnp.asarray(train.offsets), jnp.asarray(counts_np)
  x_test, y_test = jnp.asarray(test.examples['x']), jnp.asarray(test.examples['y'])
  dim, num_classes = x_pool.shape[1], int(np.max(train.examples['y'])) + 1
  print(f'LEAF Synthetic: {len(counts_np)} clients, {x_pool.shape[0]} train and '
        f'{x_test.shape[0]} test examples, {dim} features, {num_classes} classes '
        f'(generated in {load_s:.1f} s, not counted below)')

  wall0, cpu0 = time.perf_counter(), time.process_time()
  round_fns = {alg: make_round(x_pool, y_pool, offsets, counts, int(counts_np.max()),
                               gel=(alg == 'gel'), draws=args.draws) for alg in ALGORITHMS}
  results = {(lr, alg): [] for lr in lrs for alg in ALGORITHMS}
  for seed in seeds:
    params, run_key = (project_start if args.draws == 'project' else own_start)(
        seed, dim, num_classes)
    for lr in lrs:
      for alg in ALGORITHMS:
        results[(lr, alg)].append(
            run(round_fns[alg], params, run_key, lr, args.rounds, x_test, y_test))
  wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0

  print(f'rounds to {TARGET:.0%} test accuracy (evaluated every {EVAL_EVERY} rounds, '
        f'{args.rounds} rounds, seeds {args.seeds}, {args.draws} draws):')
  for (lr, alg), values in results.items():
    hit = [v for v in values if v is not None]
    mean = f'{np.mean(hit):.1f} ({len(hit)}/{len(values)} seeds)' if hit else 'n/a'
    print(f'  lr {lr:<6g} {alg:<9s} {values}  mean {mean}')
  print(f'total: wall {wall:.1f} s, cpu {cpu:.1f} s')
  C = common.Column
  protocol = [C('runs', 'runs'), C('rounds', 'rounds a run'),
              C('wall_s', 'wall s (the whole protocol)', 's', 'lower', '{:.1f}'),
              C('cpu_s', 'CPU s', 's', 'lower', '{:.1f}')]
  reached = [C('lr', 'client lr', format='{:g}'), C('algorithm', 'algorithm', left=True),
             C('rounds_to_85', f'rounds to {TARGET:.0%}, each seed', 'rounds', 'lower', '{}'),
             C('mean_rounds', 'mean over the seeds that reached it', 'rounds', 'lower',
               '{:.1f}')]
  rows = [{'lr': lr, 'algorithm': alg, 'rounds_to_85': [v if v is not None else '-'
                                                         for v in values],
           'mean_rounds': float(np.mean([v for v in values if v is not None]))
           if any(v is not None for v in values) else None}
          for (lr, alg), values in results.items()]
  common.write_results(
      'independent_table1', protocol,
      [{'runs': len(results) * len(seeds), 'rounds': args.rounds, 'wall_s': wall, 'cpu_s': cpu}],
      variant_name=variant, results_dir=args.results_dir, notes=args.notes,
      setting=f'GeL\'s Table 1 protocol on LEAF Synthetic, seeds {args.seeds}, client lrs '
              f'{args.lrs}, {args.draws} draws; LEAF Synthetic\'s generation not counted',
      tables=[common.table_results(f'Rounds to {TARGET:.0%} test accuracy (evaluated every '
                                   f'{EVAL_EVERY} rounds)', reached, rows)])
  return 0


if __name__ == '__main__':
  sys.exit(main())
