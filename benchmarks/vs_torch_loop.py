"""GeL's FEMNIST CNN or the Shakespeare LSTM: a fedjax_gel round against PyTorch, side by side.

``--model cnn`` (default): the FedAvgCM round of GeL's FEMNIST setting: the CNN of
``models.gel_femnist_cnn`` (608,702 parameters), every client ``tau = 8`` SGD-with-momentum
steps (lr 0.01, momentum 0.9) of batch ``B = 20`` on its own shuffled examples, the server
averaging the clients' models (weights ``min(tau B, n_i)``), on 200 FEMNIST-shaped random
clients of 200 examples (``common.femnist_like_workload``; FEMNIST is a download).

``--model lstm``: the same round in GeL's Shakespeare setting as this project runs it
(``launch/configs/gel_table1_shakespeare_subset.flags``): LEAF's stacked LSTM of
``models.shakespeare_lstm`` (embedding 8, two LSTMs of 256 units, dense 80 on the last
position; 817,872 parameters), batch ``B = 10``, SGD lr 0.3 with momentum 0.9, and
``tau = 4`` steps for every client (the mean of the config's ``tau_i ~ U{2..6}``), on 200
Shakespeare-shaped random clients of 200 sequences of 80 character ids
(``common.shakespeare_like_workload``). PyTorch's model is ``nn.Embedding``, one two-layer
``nn.LSTM`` and ``nn.Linear`` (``torch_lstm``).

Both sides start from the same initial model (the Flax parameters copied into the PyTorch
module) and train the same sampled clients on the same data. Three sides:

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
warm-up round, timed alternately, ``block_until_ready``; with ``--processes N``, the median
over ``N`` fresh processes run one after another, each process's own ``loop / ours`` in a
last column: this machine's speed differs from process to process), examples/s and
``ratio = PyTorch round time / fedjax_gel round time``; and the roofline: the matrix-product
FLOPs of one local step (``common.product_flops`` of the loss gradient at ``B`` examples, the
same arithmetic on every side), each side's product GFLOP/s, this CPU's float32 matrix-product
speed (``common.matmul_gflops``) and the share of it that 1.5x the loop's speed would take
(above 1: not reachable in float32 on this machine, whatever the framework).
``--xla_layers`` builds our model without ``models.layers``: the CNN with XLA's own
convolution and max pool, the LSTM with Flax's own ``nn.RNN(nn.OptimizedLSTMCell)`` (the
slow versions, kept to compare).

Needs torch (``pip install torch``; optional, not a dependency of fedjax_gel); without it the
script stops with one line.

Usage: ``python benchmarks/vs_torch_loop.py [--model cnn|lstm] [--cohorts 20,100] [--repeats 3]
[--processes 1] [--plot PNG]``; the results go to
``benchmarks/results/vs_torch_loop[-<variant>].json`` (``common.write_results``).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from typing import Callable, NamedTuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import common  # pylint: disable=g-import-not-at-top,wrong-import-position

CLIENTS, PER_CLIENT = 200, 200


class Setting(NamedTuple):
  """One model's round: its title, what builds our layers (``layers``; ``framework_layers`` with
  ``--xla_layers``), ``tau`` steps of batch ``batch``, the client optimiser, the workload
  (``workload(xla_layers)``: ``common``'s tuple) and the PyTorch model
  (``torch_model(params) -> (module, weights)``; ``weights``: Flax parameters -> the module's
  state dict)."""
  title: str
  layers: str
  framework_layers: str
  tau: int
  batch: int
  lr: float
  momentum: float
  workload: Callable
  torch_model: Callable


def torch_cnn(params):
  """GeL's FEMNIST CNN in PyTorch, and the map of its Flax ``params`` into it."""
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

  def weights(p):
    conv = lambda k: torch.tensor(np.asarray(k)).permute(3, 2, 0, 1)   # HWIO -> OIHW
    dense = lambda k: torch.tensor(np.asarray(k)).T
    out = {'conv1.weight': conv(p['conv1']['kernel']), 'conv2.weight': conv(p['conv2']['kernel']),
           'dense.weight': dense(p['dense']['kernel']), 'out.weight': dense(p['out']['kernel'])}
    out.update({f'{n}.bias': torch.tensor(np.asarray(p[n]['bias']))
                for n in ('conv1', 'conv2', 'dense', 'out')})
    return {k: v.contiguous() for k, v in out.items()}

  return CNN(), weights


def torch_lstm(params):
  """The Shakespeare stacked LSTM in PyTorch (``nn.Embedding``, one ``nn.LSTM`` of the Flax
  model's layers, ``nn.Linear`` on the last position), and the map of its Flax ``params`` into
  it. Flax's ``OptimizedLSTMCell`` has input kernels ``ii, if, ig, io`` without bias and
  recurrent kernels ``hi, hf, hg, ho`` with one; ``nn.LSTM`` stacks its gates in the same
  order ``i, f, g, o`` and has two biases: ``bias_hh`` takes Flax's, ``bias_ih`` is zero and
  frozen (``requires_grad = False``), so both train the same parameters."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  from torch import nn  # pylint: disable=g-import-not-at-top

  vocab, embed = params['embed']['embedding'].shape
  hidden, classes = params['out']['kernel'].shape
  layers = sum(k.startswith('lstms_') for k in params)

  class LSTM(nn.Module):
    def __init__(self):
      super().__init__()
      self.embed = nn.Embedding(vocab, embed)
      self.lstm = nn.LSTM(embed, hidden, layers, batch_first=True)
      self.out = nn.Linear(hidden, classes)
      for l in range(layers):
        getattr(self.lstm, f'bias_ih_l{l}').requires_grad_(False)

    def forward(self, x):
      return self.out(self.lstm(self.embed(x))[0][:, -1])

  def weights(p):
    t = lambda a: torch.tensor(np.asarray(a))
    out = {'embed.weight': t(p['embed']['embedding']), 'out.weight': t(p['out']['kernel']).T,
           'out.bias': t(p['out']['bias'])}
    for l in range(layers):
      cell = p[f'lstms_{l}']['cell']
      gates = lambda kind, part, cell=cell: [t(cell[kind + g][part]) for g in 'ifgo']
      out[f'lstm.weight_ih_l{l}'] = torch.cat(gates('i', 'kernel'), 1).T
      out[f'lstm.weight_hh_l{l}'] = torch.cat(gates('h', 'kernel'), 1).T
      out[f'lstm.bias_hh_l{l}'] = torch.cat(gates('h', 'bias'))
      out[f'lstm.bias_ih_l{l}'] = torch.zeros(4 * hidden)
    return {k: v.contiguous() for k, v in out.items()}

  return LSTM(), weights


SETTINGS = {
    'cnn': Setting('GeL FEMNIST CNN', 'fedjax_gel', 'xla', 8, 20, 0.01, 0.9,
                   lambda xla_layers: common.femnist_like_workload(
                       CLIENTS, PER_CLIENT, xla_layers=xla_layers), torch_cnn),
    # launch/configs/gel_table1_shakespeare_subset.flags: B = 10, lr 0.3, momentum 0.9 and
    # tau_i ~ U{2..6}, here its mean for every client.
    'lstm': Setting('Shakespeare LSTM', 'fedjax_gel', 'flax', 4, 10, 0.3, 0.9,
                    lambda flax_cell: common.shakespeare_like_workload(
                        CLIENTS, PER_CLIENT, flax_cell=flax_cell), torch_lstm),
}


def torch_side(s: Setting, params):
  """The PyTorch model of ``s`` with the Flax ``params`` copied in, and its two FedAvgCM rounds:
  ``(weights, initial state dict, per-client loop round, vmapped round)``."""
  import torch  # pylint: disable=g-import-not-at-top
  from torch import nn  # pylint: disable=g-import-not-at-top

  model, weights = s.torch_model(params)
  init = weights(params)
  model.load_state_dict(init)
  loss_fn = nn.CrossEntropyLoss()
  trainable = [k for k, v in model.named_parameters() if v.requires_grad]

  def round_fn(global_weights, clients, tau, generator):
    """``clients``: ``[(x, y)]`` tensors; returns the new global weights (a state dict)."""
    total = {k: torch.zeros_like(v) for k, v in global_weights.items()}
    weight_sum = 0.
    for x, y in clients:
      model.load_state_dict(global_weights)
      opt = torch.optim.SGD(model.parameters(), lr=s.lr, momentum=s.momentum)
      order = torch.cat([torch.randperm(len(x), generator=generator)
                         for _ in range(-(-tau * s.batch // len(x)))])
      for k in range(tau):
        idx = order[k * s.batch:(k + 1) * s.batch]
        opt.zero_grad()
        loss_fn(model(x[idx]), y[idx]).backward()
        opt.step()
      w = float(min(tau * s.batch, len(x)))
      weight_sum += w
      with torch.no_grad():
        for k, v in model.state_dict().items():
          total[k] += w * v
    return {k: v / weight_sum for k, v in total.items()}

  def vmap_round(global_weights, clients, tau, generator):
    """The same round with the clients vmapped (``torch.func``): every client's trainable
    parameters and momentum stacked, one ``vmap(grad(...))`` per local step over all clients'
    minibatches."""
    from torch import func  # pylint: disable=g-import-not-at-top
    xs, ys = torch.stack([x for x, _ in clients]), torch.stack([y for _, y in clients])
    size, n = xs.shape[:2]
    orders = torch.stack([torch.cat([torch.randperm(n, generator=generator)
                                     for _ in range(-(-tau * s.batch // n))])[:tau * s.batch]
                          for _ in range(size)])
    params = {k: v.detach().unsqueeze(0).repeat(size, *([1] * v.ndim))
              for k, v in global_weights.items() if k in trainable}
    frozen = {k: v for k, v in global_weights.items() if k not in params}
    velocity = {k: torch.zeros_like(v) for k, v in params.items()}
    grads = func.vmap(func.grad(
        lambda p, x, y: loss_fn(func.functional_call(model, {**frozen, **p}, (x,)), y)))
    rows = torch.arange(size)[:, None]
    for k in range(tau):
      idx = orders[:, k * s.batch:(k + 1) * s.batch]
      g = grads(params, xs[rows, idx], ys[rows, idx])
      with torch.no_grad():
        for name in params:   # torch.optim.SGD's momentum: buf = m buf + g; p -= lr buf
          velocity[name].mul_(s.momentum).add_(g[name])
          params[name].sub_(s.lr * velocity[name])
    w = torch.tensor([float(min(tau * s.batch, len(x))) for x, _ in clients])
    return {**frozen, **{k: torch.tensordot(w / w.sum(), v, dims=1) for k, v in params.items()}}

  return weights, init, round_fn, vmap_round


def to_torch(host, ids):
  import torch  # pylint: disable=g-import-not-at-top
  from fedjax_gel.core import federated_data  # pylint: disable=g-import-not-at-top
  out = []
  for i in ids:
    ex = federated_data.client_examples(host, int(i))
    x = torch.tensor(ex['x'])
    out.append((x if x.is_floating_point() else x.long(), torch.tensor(ex['y']).long()))
  return out


def check(s: Setting, algorithm, params, host, round_fn, weights):
  """Largest difference between our new model and a PyTorch round's (``round_fn``) after one
  round of ``tau = 1`` on 20 clients holding one batch each (mean gradient over the whole
  batch: no order), compared in PyTorch's layout (``weights``)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top

  from fedjax_gel.core import federated_data, keys  # pylint: disable=g-import-not-at-top
  from fedjax_gel.core import round as round_lib, sampling  # pylint: disable=g-import-not-at-top

  small = federated_data.from_client_arrays(
      [federated_data.client_examples(host, i) for i in range(20)])
  small = small._replace(examples={k: v.reshape((20, PER_CLIENT) + v.shape[1:])[:, :s.batch]
                                   .reshape((20 * s.batch,) + v.shape[1:])
                                   for k, v in small.examples.items()},
                         offsets=np.arange(20, dtype=np.int32) * s.batch,
                         counts=np.full(20, s.batch, np.int32))
  data = federated_data.to_device(small)
  root = keys.root_key(1)
  cohort = sampling.sample_cohort(root, 0, data.counts,
                                  sampling.CohortSpec(20, (1, 1), s.batch, replace=False,
                                                     weighting='samples_seen'))
  rf = common.built_round(round_lib, algorithm, 20)
  ours = rf(algorithm.server_init(params), cohort, data, root, np.int32(0))[0].params
  ours = weights(jax.device_get(ours))
  theirs = round_fn(weights(params), to_torch(small, np.asarray(cohort.client_ids)), 1,
                    torch.Generator())
  return max(float((ours[k] - theirs[k]).abs().max()) for k in ours)


def measure(model: str, cohorts: list[int], repeats: int, xla_layers: bool) -> list[dict]:
  if importlib.util.find_spec('torch') is None:
    print('error: the PyTorch side needs torch: pip install torch', file=sys.stderr)
    sys.exit(2)
  s = SETTINGS[model]
  host, data, _, loss, root, params = s.workload(xla_layers)
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top

  from fedjax_gel import algorithms  # pylint: disable=g-import-not-at-top

  ours = algorithms.fedavgcm(loss, s.lr, s.momentum)
  weights, init, torch_round, vmap_round = torch_side(s, params)
  diff = check(s, ours, params, host, torch_round, weights)
  vmap_diff = check(s, ours, params, host, vmap_round, weights)
  print(f'one round (tau = 1, 20 clients): max abs diff {diff:.1e} to the PyTorch loop, '
        f'{vmap_diff:.1e} to torch.func.vmap', file=sys.stderr)
  # The roofline: a local step's unavoidable products against this CPU's matrix-product speed.
  step_flops = common.product_flops(jax.grad(loss), params,
                                    {k: v[:s.batch] for k, v in data.examples.items()})
  peak = common.matmul_gflops()
  generator = torch.Generator().manual_seed(0)
  rows = []
  for cohort in cohorts:
    ran = common.launch_round(ours, params, data, root, cohort, s.tau, s.batch, False)
    compiled, state, pool, sample = ran['compiled'], ran['state'], ran['pool'], ran['sample']
    clients = [to_torch(host, np.asarray(sample(r).client_ids)) for r in range(repeats + 1)]
    torch_round(init, clients[0], s.tau, generator)   # warm-up
    vmap_round(init, clients[0], s.tau, generator)

    ours_t, theirs_t, vmap_t = [], [], []
    for r in range(1, repeats + 1):   # alternately, so both see the same machine load
      t = time.perf_counter()
      jax.block_until_ready(compiled(state, sample(r), pool, root, np.int32(r))[0])
      ours_t.append(time.perf_counter() - t)
      t = time.perf_counter()
      torch_round(init, clients[r], s.tau, generator)
      theirs_t.append(time.perf_counter() - t)
      t = time.perf_counter()
      vmap_round(init, clients[r], s.tau, generator)
      vmap_t.append(time.perf_counter() - t)
    row = rates({
        'model': s.title, 'tau': s.tau, 'batch': s.batch, 'lr': s.lr, 'momentum': s.momentum,
        'cohort': cohort, 'devices': ran['devices'], 'chunk': ran['chunk'],
        'layers': s.framework_layers if xla_layers else s.layers,
        'fedjax_gel_compile_s': ran['compile_s'],
        'fedjax_gel_round_s': statistics.median(ours_t),
        'torch_round_s': statistics.median(theirs_t),
        'torch_vmap_round_s': statistics.median(vmap_t),
        'max_abs_diff': diff, 'vmap_max_abs_diff': vmap_diff,
        'torch': f'{torch.__version__}, {torch.get_num_threads()} threads',
        'step_product_gflop': step_flops / 1e9, 'matmul_gflops': peak,
        'device': f'{jax.devices()[0].platform}: {jax.devices()[0].device_kind}',
    })
    rows.append(row)
    print(f'{cohort} clients: fedjax_gel {row["fedjax_gel_round_s"]:.2f} s, PyTorch loop '
          f'{row["torch_round_s"]:.2f} s ({row["ratio"]:.2f}x), torch.func.vmap '
          f'{row["torch_vmap_round_s"]:.2f} s ({row["vmap_ratio"]:.2f}x)', file=sys.stderr)
  return rows


MEDIANS = ('fedjax_gel_compile_s', 'fedjax_gel_round_s', 'torch_round_s', 'torch_vmap_round_s',
         'matmul_gflops')


def rates(row: dict) -> dict:
  """``row`` with its examples/s, ratios and product GFLOP/s computed from its round times."""
  examples = row['cohort'] * row['tau'] * row['batch']
  gflop = row['cohort'] * row['tau'] * row['step_product_gflop']
  ours, loop, vmap = row['fedjax_gel_round_s'], row['torch_round_s'], row['torch_vmap_round_s']
  return dict(row, fedjax_gel_examples_per_s=examples / ours, torch_examples_per_s=examples / loop,
              torch_vmap_examples_per_s=examples / vmap, ratio=loop / ours, vmap_ratio=vmap / ours,
              fedjax_gel_gflops=gflop / ours, torch_gflops=gflop / loop,
              torch_vmap_gflops=gflop / vmap)


def across_processes(rows: list[dict]) -> dict:
  """One cohort's rows from separate processes as one: the median of each time (and of the
  matrix-product speed), the rates recomputed from them; ``process_ratios``: each process's
  ``loop / ours``."""
  row = dict(rows[0], **{k: statistics.median(r[k] for r in rows) for k in MEDIANS})
  row['max_abs_diff'] = max(r['max_abs_diff'] for r in rows)
  row['vmap_max_abs_diff'] = max(r['vmap_max_abs_diff'] for r in rows)
  return dict(rates(row), processes=len(rows), process_ratios=[r['ratio'] for r in rows])


COLUMNS = [
    common.CLIENTS,
    common.Column('layers', 'layers', left=True),
    common.DEVICES,
    common.Column('chunk', 'chunk'),
    common.Column('fedjax_gel_compile_s', 'fedjax_gel compile s', 's', 'lower', '{:.2f}'),
    common.Column('fedjax_gel_round_s', 'fedjax_gel round s', 's', 'lower', '{:.2f}'),
    common.Column('torch_round_s', 'PyTorch loop round s', 's', '', '{:.2f}'),
    common.Column('torch_vmap_round_s', 'torch.func.vmap round s', 's', '', '{:.2f}'),
    common.Column('fedjax_gel_examples_per_s', 'fedjax_gel examples/s', 'examples/s', 'higher',
                  '{:,.0f}'),
    common.Column('torch_examples_per_s', 'PyTorch loop examples/s', 'examples/s', '',
                  '{:,.0f}'),
    common.Column('torch_vmap_examples_per_s', 'torch.func.vmap examples/s', 'examples/s', '',
                  '{:,.0f}'),
    common.Column('loop_per_ours', 'loop / ours (>1: ours faster)', 'x', 'higher', '{:.2f}',
                  get=lambda r: r['ratio']),
    common.Column('vmap_per_ours', 'vmap / ours', 'x', 'higher', '{:.2f}',
                  get=lambda r: r['vmap_ratio']),
    common.Column('fedjax_gel_gflops', 'fedjax_gel GFLOP/s', 'GFLOP/s', 'higher', '{:.0f}'),
    common.Column('loop_gflops', 'loop GFLOP/s', 'GFLOP/s', '', '{:.0f}',
                  get=lambda r: r['torch_gflops']),
    common.Column('loop_1_5x_share_of_matmul',
                  '1.5x loop / matmul speed (>1: out of reach in float32)', 'fraction', '',
                  '{:.2f}', get=lambda r: 1.5 * r['torch_gflops'] / r['matmul_gflops']),
]
PER_PROCESS = common.Column('loop_per_ours_each_process', 'loop / ours in each process', 'x',
                            'higher', '{:.2f}', left=True, get=lambda r: r.get('process_ratios'))


def columns(rows: list[dict]) -> list:
  return COLUMNS + ([PER_PROCESS] if 'processes' in rows[0] else [])


def setting(rows: list[dict]) -> str:
  r = rows[0]
  text = (f'{r["model"]}, tau = {r["tau"]}, B = {r["batch"]}, lr {r["lr"]}, momentum '
          f'{r["momentum"]}; PyTorch {r["torch"]}; models after one round against ours: max abs '
          f'diff {r["max_abs_diff"]:.1e} (loop), {r["vmap_max_abs_diff"]:.1e} (vmap); matrix '
          f'products {r["step_product_gflop"]:.3f} GFLOP a local step; this CPU\'s float32 '
          f'matrix product (2048^3): {r["matmul_gflops"]:.0f} GFLOP/s')
  if 'processes' in r:
    text += f'; times: medians over {r["processes"]} fresh processes'
  return text


def table(rows: list[dict]) -> str:
  cols = columns(rows)
  return setting(rows) + '\n\n' + common.markdown_table(cols, common.figures(cols, rows))


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--model', choices=sorted(SETTINGS), default='cnn',
                 help="GeL's FEMNIST CNN or the Shakespeare LSTM, each in its own setting")
  p.add_argument('--cohorts', default='20,100',
                 help=f'clients per round, comma-separated (at most {CLIENTS})')
  p.add_argument('--repeats', type=int, default=3, help='rounds timed on each side')
  p.add_argument('--xla_layers', action='store_true',
                 help="our CNN with XLA's own convolution and max pool, our LSTM with Flax's "
                 "own cell (the slow versions)")
  p.add_argument('--processes', type=int, default=1,
                 help='measure each cohort in this many fresh processes, one after another, '
                 'and report the median of their times (1: in this process)')
  p.add_argument('--json', help="also write the script's own rows (seconds) to this JSON file")
  p.add_argument('--single', type=int, help=argparse.SUPPRESS)   # one cohort, a JSON row
  p.add_argument('--plot', help="also plot both sides' examples/s against the cohort (PNG)")
  common.results_flags(p)
  a = p.parse_args(argv)
  variant = common.variant(p, a, ignore=('processes',))   # how it measures, not what
  a.json = common.json_flag(p, a.json)
  a.results_dir = common.check_results_dir(p, a.results_dir) if not a.single else ''
  if a.single:
    print(json.dumps(measure(a.model, [a.single], a.repeats, a.xla_layers)[0]))
    return
  cohorts = common.int_list(p, 'cohorts', a.cohorts)
  common.at_least(p, 1, cohorts=cohorts, repeats=a.repeats, processes=a.processes)
  if max(cohorts) > CLIENTS:
    p.exit(2, f'error: --cohorts: at most {CLIENTS} clients (sampled without replacement)\n')
  if a.processes == 1:
    rows = measure(a.model, cohorts, a.repeats, a.xla_layers)
  else:
    args = ['--model', a.model, '--repeats', str(a.repeats)] + ['--xla_layers'] * a.xla_layers
    rows = [across_processes([common.in_fresh_process(__file__, c, args)
                              for _ in range(a.processes)]) for c in cohorts]
    for r in rows:
      print(f'{r["cohort"]} clients: loop / ours in each of {r["processes"]} processes: '
            + ', '.join(f'{x:.2f}' for x in r['process_ratios']), file=sys.stderr)
  common.report(rows, table(rows), a.json)
  xs = [r['cohort'] for r in rows]
  s = SETTINGS[a.model]
  common.plot(a.plot, f'FedAvgCM round, {s.title}, tau={s.tau}, B={s.batch}',
              'clients per round', 'examples/s',
              {'fedjax_gel': (xs, [r['fedjax_gel_examples_per_s'] for r in rows]),
               'PyTorch per-client loop': (xs, [r['torch_examples_per_s'] for r in rows]),
               'PyTorch torch.func.vmap': (xs, [r['torch_vmap_examples_per_s'] for r in rows])})
  common.write_results('vs_torch_loop', columns(rows), rows, variant_name=variant,
                       results_dir=a.results_dir, setting=setting(rows), notes=a.notes,
                       plot=a.plot)


if __name__ == '__main__':
  main()
