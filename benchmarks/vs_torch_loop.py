"""GeL's FEMNIST CNN: a fedjax_gel round against a per-client PyTorch training loop, side by side.

The FedAvgCM round of GeL's FEMNIST setting: the CNN of ``models.gel_femnist_cnn`` (608,702
parameters), every client ``tau = 8`` SGD-with-momentum steps (lr 0.01, momentum 0.9) of batch
``B = 20`` on its own shuffled examples, the server averaging the clients' models (weights
``min(tau B, n_i)``). Both sides start from the same initial model (the Flax parameters copied
into the PyTorch module) and train the same sampled clients on the same data: 200 FEMNIST-shaped
random clients of 200 examples (``common.femnist_like_workload``; FEMNIST is a download).

* fedjax_gel: ``sample_cohort`` plus the compiled round, with ``launch/run.py``'s device and
  chunk defaults.
* PyTorch: the loop an FL researcher writes: for each client, load the global weights, a fresh
  ``torch.optim.SGD(momentum=0.9)``, ``tau`` steps on minibatches of a ``torch.randperm`` of
  its examples, then add its weighted parameters to the average. The client datasets are torch
  tensors before the clock starts; torch uses its default threads (one per core).
* PyTorch vmapped, the best a PyTorch user can do without writing kernels: ``torch.func.vmap``
  of ``torch.func.grad`` over the clients' stacked parameters, momentum and minibatches, the
  same SGD-with-momentum update by hand, one weighted sum at the end.

Before timing, one round of each side on clients holding exactly one batch each (``tau = 1``,
so the data order cannot differ) checks that they compute our model: ``max abs diff``.
Reported per cohort size: compile time, round time (median of ``--repeats`` rounds after a
warm-up round, timed alternately, ``block_until_ready``), examples/s and
``ratio = PyTorch round time / fedjax_gel round time``. ``--xla_layers`` builds our CNN with
XLA's own convolution and max pool instead of ``models.layers`` (the comparison in RESULTS.md).

Needs torch (``pip install torch``; optional, not a dependency of fedjax_gel); without it the
script stops with one line.

Usage: ``python benchmarks/vs_torch_loop.py [--cohorts 20,100] [--repeats 3] [--plot PNG]``
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

TAU, BATCH, LR, MOMENTUM = 8, 20, 0.01, 0.9
CLIENTS, PER_CLIENT = 200, 200


def torch_side(params):
  """The PyTorch CNN with the Flax ``params`` copied in, and its per-client FedAvgCM round."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  from torch import nn  # pylint: disable=g-import-not-at-top

  class CNN(nn.Module):
    def __init__(self):
      super().__init__()
      self.conv1, self.conv2 = nn.Conv2d(1, 32, 5), nn.Conv2d(32, 64, 5)
      self.dense, self.out = nn.Linear(1024, 512), nn.Linear(512, 62)

    def forward(self, x):
      x = torch.max_pool2d(torch.relu(self.conv1(x.view(-1, 1, 28, 28))), 2)
      x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
      x = x.permute(0, 2, 3, 1).flatten(1)    # Flax's [H, W, C] order into the dense layer
      return self.out(torch.relu(self.dense(x)))

  p = params
  conv = lambda k: torch.tensor(np.asarray(k)).permute(3, 2, 0, 1)   # HWIO -> OIHW
  dense = lambda k: torch.tensor(np.asarray(k)).T
  init = {'conv1.weight': conv(p['conv1']['kernel']), 'conv2.weight': conv(p['conv2']['kernel']),
          'dense.weight': dense(p['dense']['kernel']), 'out.weight': dense(p['out']['kernel'])}
  init.update({f'{n}.bias': torch.tensor(np.asarray(p[n]['bias']))
               for n in ('conv1', 'conv2', 'dense', 'out')})
  model = CNN()
  model.load_state_dict({k: v.contiguous() for k, v in init.items()})
  loss_fn = nn.CrossEntropyLoss()

  def round_fn(global_weights, clients, tau, generator):
    """``clients``: ``[(x, y)]`` tensors; returns the new global weights (a state dict)."""
    total = {k: torch.zeros_like(v) for k, v in global_weights.items()}
    weight_sum = 0.
    for x, y in clients:
      model.load_state_dict(global_weights)
      opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
      order = torch.cat([torch.randperm(len(x), generator=generator)
                         for _ in range(-(-tau * BATCH // len(x)))])
      for k in range(tau):
        idx = order[k * BATCH:(k + 1) * BATCH]
        opt.zero_grad()
        loss_fn(model(x[idx]), y[idx]).backward()
        opt.step()
      w = float(min(tau * BATCH, len(x)))
      weight_sum += w
      with torch.no_grad():
        for k, v in model.state_dict().items():
          total[k] += w * v
    return {k: v / weight_sum for k, v in total.items()}

  def vmap_round(global_weights, clients, tau, generator):
    """The same round with the clients vmapped (``torch.func``): every client's parameters and
    momentum stacked, one ``vmap(grad(...))`` per local step over all clients' minibatches."""
    from torch import func  # pylint: disable=g-import-not-at-top
    xs, ys = torch.stack([x for x, _ in clients]), torch.stack([y for _, y in clients])
    size, n = xs.shape[:2]
    orders = torch.stack([torch.cat([torch.randperm(n, generator=generator)
                                     for _ in range(-(-tau * BATCH // n))])[:tau * BATCH]
                          for _ in range(size)])
    params = {k: v.detach().unsqueeze(0).repeat(size, *([1] * v.ndim))
              for k, v in global_weights.items()}
    velocity = {k: torch.zeros_like(v) for k, v in params.items()}
    grads = func.vmap(func.grad(
        lambda p, x, y: loss_fn(func.functional_call(model, p, (x,)), y)))
    rows = torch.arange(size)[:, None]
    for k in range(tau):
      idx = orders[:, k * BATCH:(k + 1) * BATCH]
      g = grads(params, xs[rows, idx], ys[rows, idx])
      with torch.no_grad():
        for name in params:   # torch.optim.SGD's momentum: buf = m buf + g; p -= lr buf
          velocity[name].mul_(MOMENTUM).add_(g[name])
          params[name].sub_(LR * velocity[name])
    w = torch.tensor([float(min(tau * BATCH, len(x))) for x, _ in clients])
    return {k: torch.tensordot(w / w.sum(), v, dims=1) for k, v in params.items()}

  return model, init, round_fn, vmap_round


def to_torch(host, ids):
  import torch  # pylint: disable=g-import-not-at-top
  from fedjax_gel.core import federated_data  # pylint: disable=g-import-not-at-top
  out = []
  for i in ids:
    ex = federated_data.client_examples(host, int(i))
    out.append((torch.tensor(ex['x']), torch.tensor(ex['y']).long()))
  return out


def check(algorithm, params, host, round_fn, init):
  """Largest difference between our new model and a PyTorch round's (``round_fn``) after one
  round of ``tau = 1`` on 20 clients holding one batch each (mean gradient over the whole
  batch: no order)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top

  from fedjax_gel.core import federated_data, keys  # pylint: disable=g-import-not-at-top
  from fedjax_gel.core import round as round_lib, sampling  # pylint: disable=g-import-not-at-top

  small = federated_data.from_client_arrays(
      [federated_data.client_examples(host, i) for i in range(20)])
  small = small._replace(examples={k: v.reshape((20, PER_CLIENT) + v.shape[1:])[:, :BATCH]
                                   .reshape((20 * BATCH,) + v.shape[1:])
                                   for k, v in small.examples.items()},
                         offsets=np.arange(20, dtype=np.int32) * BATCH,
                         counts=np.full(20, BATCH, np.int32))
  data = federated_data.to_device(small)
  root = keys.root_key(1)
  cohort = sampling.sample_cohort(root, 0, data.counts,
                                  sampling.CohortSpec(20, (1, 1), BATCH, replace=False))
  rf = round_lib.build_round(algorithm, chunk_size=20)
  ours = rf(algorithm.server_init(params), cohort, data, root, np.int32(0))[0].params
  theirs = round_fn(init, to_torch(small, np.asarray(cohort.client_ids)), 1, torch.Generator())
  pairs = [(ours['conv1']['kernel'], theirs['conv1.weight'].permute(2, 3, 1, 0)),
           (ours['conv2']['kernel'], theirs['conv2.weight'].permute(2, 3, 1, 0)),
           (ours['dense']['kernel'], theirs['dense.weight'].T),
           (ours['out']['kernel'], theirs['out.weight'].T)]
  pairs += [(ours[n]['bias'], theirs[f'{n}.bias']) for n in ('conv1', 'conv2', 'dense', 'out')]
  return max(float(np.max(np.abs(np.asarray(jax.device_get(a)) - b.numpy()))) for a, b in pairs)


def measure(cohorts: list[int], repeats: int, xla_layers: bool) -> list[dict]:
  if importlib.util.find_spec('torch') is None:
    print('error: the PyTorch side needs torch: pip install torch', file=sys.stderr)
    sys.exit(2)
  host, data, _, loss, root, params = common.femnist_like_workload(
      CLIENTS, PER_CLIENT, xla_layers=xla_layers)
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top

  from fedjax_gel import algorithms  # pylint: disable=g-import-not-at-top

  ours = algorithms.fedavgcm(loss, LR, MOMENTUM)
  _, init, torch_round, vmap_round = torch_side(params)
  diff = check(ours, params, host, torch_round, init)
  vmap_diff = check(ours, params, host, vmap_round, init)
  print(f'one round (tau = 1, 20 clients): max abs diff {diff:.1e} to the PyTorch loop, '
        f'{vmap_diff:.1e} to torch.func.vmap', file=sys.stderr)
  generator = torch.Generator().manual_seed(0)
  rows = []
  for cohort in cohorts:
    ran = common.launch_round(ours, params, data, root, cohort, TAU, BATCH, False)
    compiled, state, pool, sample = ran['compiled'], ran['state'], ran['pool'], ran['sample']
    clients = [to_torch(host, np.asarray(sample(r).client_ids)) for r in range(repeats + 1)]
    torch_round(init, clients[0], TAU, generator)   # warm-up
    vmap_round(init, clients[0], TAU, generator)

    ours_t, theirs_t, vmap_t = [], [], []
    for r in range(1, repeats + 1):   # alternately, so both see the same machine load
      t = time.perf_counter()
      jax.block_until_ready(compiled(state, sample(r), pool, root, np.int32(r))[0])
      ours_t.append(time.perf_counter() - t)
      t = time.perf_counter()
      torch_round(init, clients[r], TAU, generator)
      theirs_t.append(time.perf_counter() - t)
      t = time.perf_counter()
      vmap_round(init, clients[r], TAU, generator)
      vmap_t.append(time.perf_counter() - t)
    ours_s, theirs_s = statistics.median(ours_t), statistics.median(theirs_t)
    vmap_s = statistics.median(vmap_t)
    examples = cohort * TAU * BATCH
    rows.append({
        'cohort': cohort, 'devices': ran['devices'], 'chunk': ran['chunk'],
        'layers': 'xla' if xla_layers else 'fedjax_gel', 'fedjax_gel_compile_s': ran['compile_s'], 'fedjax_gel_round_s': ours_s,
        'torch_round_s': theirs_s, 'fedjax_gel_examples_per_s': examples / ours_s,
        'torch_examples_per_s': examples / theirs_s, 'ratio': theirs_s / ours_s,
        'torch_vmap_round_s': vmap_s, 'torch_vmap_examples_per_s': examples / vmap_s,
        'vmap_ratio': vmap_s / ours_s, 'max_abs_diff': diff, 'vmap_max_abs_diff': vmap_diff, 'torch': f'{torch.__version__}, {torch.get_num_threads()} threads',
        'device': f'{jax.devices()[0].platform}: {jax.devices()[0].device_kind}',
    })
    print(f'{cohort} clients: fedjax_gel {ours_s:.2f} s, PyTorch loop {theirs_s:.2f} s '
          f'({theirs_s / ours_s:.2f}x), torch.func.vmap {vmap_s:.2f} s ({vmap_s / ours_s:.2f}x)',
          file=sys.stderr)
  return rows


def table(rows: list[dict]) -> str:
  out = [f'PyTorch {rows[0]["torch"]}; models after one round against ours: max abs diff '
         f'{rows[0]["max_abs_diff"]:.1e} (loop), {rows[0]["vmap_max_abs_diff"]:.1e} (vmap)\n',
         '| clients | layers | devices | chunk | fedjax_gel compile s | fedjax_gel round s | '
         'PyTorch loop round s | torch.func.vmap round s | fedjax_gel examples/s | '
         'PyTorch loop examples/s | torch.func.vmap examples/s | loop / ours | vmap / ours |',
         '|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|']
  for r in rows:
    out.append(f'| {r["cohort"]:,} | {r["layers"]} | {r["devices"]} | {r["chunk"]} | '
               f'{r["fedjax_gel_compile_s"]:.2f} | {r["fedjax_gel_round_s"]:.2f} | '
               f'{r["torch_round_s"]:.2f} | {r["torch_vmap_round_s"]:.2f} | '
               f'{r["fedjax_gel_examples_per_s"]:,.0f} | {r["torch_examples_per_s"]:,.0f} | '
               f'{r["torch_vmap_examples_per_s"]:,.0f} | {r["ratio"]:.2f} | '
               f'{r["vmap_ratio"]:.2f} |')
  return '\n'.join(out)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--cohorts', default='20,100')
  p.add_argument('--repeats', type=int, default=3)
  p.add_argument('--xla_layers', action='store_true',
                 help="our CNN with XLA's own convolution and max pool (the slow version)")
  p.add_argument('--json', help='also write the rows to this JSON file')
  p.add_argument('--plot', help="also plot both sides' examples/s against the cohort (PNG)")
  a = p.parse_args(argv)
  cohorts = common.int_list(p, 'cohorts', a.cohorts)
  if min(cohorts + [a.repeats]) <= 0:
    p.exit(2, 'error: --cohorts and --repeats must be positive\n')
  if max(cohorts) > CLIENTS:
    p.exit(2, f'error: --cohorts: at most {CLIENTS} clients (sampled without replacement)\n')
  rows = measure(cohorts, a.repeats, a.xla_layers)
  common.report(rows, table(rows), a.json)
  xs = [r['cohort'] for r in rows]
  common.plot(a.plot, f'FedAvgCM round, GeL FEMNIST CNN, tau={TAU}, B={BATCH}',
              'clients per round', 'examples/s',
              {'fedjax_gel': (xs, [r['fedjax_gel_examples_per_s'] for r in rows]),
               'PyTorch per-client loop': (xs, [r['torch_examples_per_s'] for r in rows]),
               'PyTorch torch.func.vmap': (xs, [r['torch_vmap_examples_per_s'] for r in rows])})


if __name__ == '__main__':
  main()
