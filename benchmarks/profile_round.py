"""Where a round's time goes: the compiled round's kernels ranked by time (``jax.profiler``).

FedAvgCM (client SGD lr 0.01 with momentum 0.9) on one device, one of three workloads:
``--workload synthetic``, LEAF Synthetic (logistic regression, ``tau = 13``, ``B = 5``) in one
chunk; ``--workload cnn``, GeL's FEMNIST CNN on FEMNIST-shaped data (``tau = 8``, ``B = 20``;
``common.femnist_like_workload``) with ``launch/run.py``'s default chunk (one client at a time
for this model), ``--xla_layers`` building it with XLA's own convolution and max pool;
``--workload lstm``, LEAF's Shakespeare LSTM on Shakespeare-shaped data (``tau = 4``,
``B = 10``; ``common.shakespeare_like_workload``), the default chunk too (one client),
``--xla_layers`` running Flax's own LSTM cell. The round is compiled with the planner's options,
as ``launch/run.py`` compiles it (for a round as small as 20 synthetic clients, XLA's legacy
emitters, its local-step loop one kernel: ``core.backend.xla.configure_cpu``). Every kernel's name
is followed by the shape it writes. After a warm-up round, ``--rounds`` rounds run under
``jax.profiler.trace``; the trace's events are summed per kernel name (thunk runtime events on
CPU; the wrappers of loops and whole executions are left out) and divided by the rounds.
``share`` is a kernel's time over the summed time of all kernels (on CPU two threads may run
kernels at once, so the sum can exceed the round's wall time, which is printed too). On a GPU
the events are the kernels the device's streams ran (``kernel_events``), named as XLA names
them (a kernel's ``writes`` is left empty where the name is not an HLO instruction's).
``--timeline`` (CPU) adds where a round's wall time goes around its kernels (``timeline``): the
host's dispatch, the wait for the first kernel (XLA's runtime hands the program to its thread
pool), the kernels' span and the wait after the last one until the caller sees the result.

Usage: ``python benchmarks/profile_round.py [--workload synthetic|cnn|lstm] [--clients 200]
[--fuse_dots auto|true|false] [--xla_layers] [--top 12] [--timeline]`` (``--fuse_dots auto``, the
default: fused small products on CPU only, as the published configurations run the round); the
results go to ``benchmarks/results/profile_round[-<variant>].json`` (``common.write_results``):
the round's time (and its timeline) as the main table, the kernels as a further one.
"""
from __future__ import annotations

import argparse
import collections
import glob
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import common  # pylint: disable=g-import-not-at-top,wrong-import-position

import re  # pylint: disable=g-import-not-at-top,wrong-import-position,wrong-import-order

WRAPPERS = ('ThunkExecutor', 'while', 'PjitFunction', 'block_until_ready')
ROUND = 'profile_round: a round and the wait for it'   # the host's event around each round


def profile(workload: str, clients: int, fuse_dots: bool | None, xla_layers: bool,
            rounds: int):
  """``(median round ms, [(kernel, us per round, calls per round)], chunk, compiled HLO text)``,
  slowest first."""
  tau, batch = common.ROUND_WORKLOADS[workload]
  data, loss, root, params = common.round_workload(workload, clients, xla_layers)
  import jax
  import numpy as np

  from fedjax_gel import algorithms
  from fedjax_gel.core import round as round_lib, sampling
  from fedjax_gel.experiment import planning  # pylint: disable=g-import-not-at-top

  alg = algorithms.fedavgcm(loss, 0.01, 0.9)
  state = alg.server_init(params)
  chunk = (clients if workload == 'synthetic' else planning.default_chunk_size(
      clients, params, planning.example_bytes(data), batch))
  rf = common.built_round(round_lib, alg, chunk, None,
                          common.launch_compiler_options(params, clients, (tau, tau), batch),
                          fuse_small_dots=fuse_dots)
  spec = sampling.CohortSpec(clients, (tau, tau), batch,
                             replace=True, weighting='samples_seen')   # the GeL code's
  cohorts = [sampling.sample_cohort(root, r, data.counts, spec) for r in range(rounds + 1)]
  compiled = rf.lower(state, cohorts[0], data, root, np.int32(0)).compile()
  times = common.time_rounds(compiled, state, cohorts, data, root)
  total, calls = collections.Counter(), collections.Counter()
  with tempfile.TemporaryDirectory() as trace_dir:
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0   # no event per Python call: the host's times stay its own
    with jax.profiler.trace(trace_dir, profiler_options=options):
      for r in range(1, rounds + 1):
        with jax.profiler.TraceAnnotation(ROUND):
          jax.block_until_ready(compiled(state, cohorts[r], data, root, np.int32(r)))
    path = glob.glob(os.path.join(trace_dir, '**', '*.xplane.pb'), recursive=True)[0]
    trace = jax.profiler.ProfileData.from_file(path)
    for event in kernel_events(trace):
      total[event.name] += event.duration_ns
      calls[event.name] += 1
  ranked = [(k, v / rounds / 1e3, calls[k] / rounds) for k, v in total.most_common()]
  return statistics.median(times) * 1e3, ranked, chunk, compiled.as_text(), trace


def timeline(trace) -> dict:
  """Per traced round on CPU, the medians (us) of: the call's host work until it returns
  (``dispatch``), its start to the first kernel's (``to first kernel``), the first kernel's
  start to the last one's end (``kernels span``) and their summed time (``kernels``), the last
  kernel's end to the end of the wait for the round (``after last kernel``), and how often
  consecutive kernels ran on different threads (``thread changes``)."""
  events = [(e.start_ns, e.start_ns + e.duration_ns, line.name, e.name, host_line(line))
            for plane in trace.planes for line in plane.lines for e in line.events]
  host = sorted(e for e in events if e[4] and (e[3] == ROUND or e[3].startswith('PjitFunction')))
  kernels = sorted(e for e in events if not e[4] and not e[3].startswith(WRAPPERS)
                   and not e[3].startswith(('end:', 'ThreadpoolListener')))
  stats = collections.defaultdict(list)
  for whole in (e for e in host if e[3] == ROUND):
    mine = [k for k in kernels if whole[0] <= k[0] < whole[1]]
    calls = [e for e in host if e[3] != ROUND and whole[0] <= e[0] <= whole[1]]
    if not mine or not calls:
      continue
    call, last = min(calls), max(k[1] for k in mine)
    stats['dispatch'].append((call[1] - call[0]) / 1e3)
    stats['to first kernel'].append((mine[0][0] - call[0]) / 1e3)
    stats['kernels span'].append((last - mine[0][0]) / 1e3)
    stats['kernels'].append(sum(k[1] - k[0] for k in mine) / 1e3)
    stats['after last kernel'].append((whole[1] - last) / 1e3)
    stats['thread changes'].append(sum(a[2] != b[2] for a, b in zip(mine, mine[1:])))
  return {k: statistics.median(v) for k, v in stats.items()}


def kernel_events(trace):
  """The trace's kernel events: on a GPU the kernels its streams ran (the device planes'
  ``Stream`` lines; their module and op lines summarise the same time), on CPU the thunks the
  runtime ran (every line but Python's, without the wrappers of loops and executions)."""
  gpus = [plane for plane in trace.planes if plane.name.startswith('/device:GPU')]
  if gpus:
    lines = [line for plane in gpus for line in plane.lines]
    streams = [line for line in lines if line.name.startswith('Stream')]
    if not streams:   # a trace without stream lines: XLA's op line holds the same kernels
      print('note: no GPU stream lines in the trace (lines: '
            f"{sorted({line.name for line in lines})}); XLA's op lines used", file=sys.stderr)
      streams = [line for line in lines if line.name == 'XLA Ops']
    return [e for line in streams for e in line.events]
  return [e for plane in trace.planes for line in plane.lines if not host_line(line)
          for e in line.events if not e.name.startswith(WRAPPERS)]


def host_line(line) -> bool:
  """Whether a trace line is the Python thread's (named after the interpreter: ``python``,
  ``python3``, ...), whose events are the host's, not kernels."""
  return line.name.startswith('python')


def output_shape(hlo: str, kernel: str) -> str:
  """The shape the instruction named ``kernel`` writes, from the compiled HLO ('' if absent)."""
  match = re.search(r'\n\s*%?' + re.escape(kernel) + r' = (\([^)]*\)|\S+) ', hlo)
  return re.sub(r'\{[^}]*\}', '', match.group(1)) if match else ''   # layouts left out


def short(kernel: str, width: int = 100) -> str:
  """A kernel's name cut to ``width`` characters (a cuDNN kernel's template arguments run to
  hundreds)."""
  return kernel if len(kernel) <= width else kernel[:width - 3] + '...'


KERNEL_COLUMNS = [
    common.Column('kernel', 'kernel', format='`{}`', left=True, get=lambda r: short(r['kernel'])),
    common.Column('writes', 'writes', format='`{}`', left=True),
    common.Column('us_per_round', 'us per round', 'us', 'lower', '{:,.0f}'),
    common.Column('calls_per_round', 'calls per round', '', '', '{:.0f}'),
    common.Column('share', 'share (of the kernels summed)', 'fraction', '', '{:.2f}'),
]
ROUND_COLUMNS = [
    common.Column('clients', 'clients', format='{:,}'),
    common.Column('chunk', 'chunk', format='{:,}'),
    common.Column('round_ms', 'round ms (median)', 'ms', 'lower', '{:.2f}'),
    common.Column('kernels_ms', 'kernels summed, ms a round', 'ms', 'lower', '{:.2f}'),
]
TIMELINE_COLUMNS = [
    common.Column('dispatch_us', 'dispatch us', 'us', 'lower', '{:,.0f}',
                  get=lambda r: r['dispatch']),
    common.Column('to_first_kernel_us', 'call to first kernel us', 'us', 'lower', '{:,.0f}',
                  get=lambda r: r['to first kernel']),
    common.Column('kernels_span_us', "kernels' span us", 'us', 'lower', '{:,.0f}',
                  get=lambda r: r['kernels span']),
    common.Column('kernels_us', 'kernels us (summed)', 'us', 'lower', '{:,.0f}',
                  get=lambda r: r['kernels']),
    common.Column('after_last_kernel_us', "last kernel to the wait's end us", 'us', 'lower',
                  '{:,.0f}', get=lambda r: r['after last kernel']),
    common.Column('thread_changes', 'thread changes', '', 'lower', '{:.0f}',
                  get=lambda r: r['thread changes']),
]


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--workload', default='synthetic', choices=tuple(common.ROUND_WORKLOADS),
                 help="LEAF Synthetic, GeL's FEMNIST CNN or the Shakespeare LSTM")
  p.add_argument('--clients', type=int, default=0,
                 help='clients per round (default: 200 for synthetic, 20 for cnn and lstm)')
  p.add_argument('--fuse_dots', default='auto', choices=('auto', 'true', 'false'),
                 help="the round's fused small products (core.backend.small_dots); auto: on CPU, as "
                 'the published configurations run them')
  p.add_argument('--xla_layers', action='store_true',
                 help="cnn: XLA's own convolution and max pool instead of models.layers; "
                      "lstm: Flax's LSTM cell instead of models.layers.lstm")
  p.add_argument('--rounds', type=int, default=0,
                 help='default: 20 (synthetic), 3 (cnn, lstm)')
  p.add_argument('--top', type=int, default=12, help='kernels shown, slowest first')
  p.add_argument('--timeline', action='store_true',
                 help="CPU: also each round's time from the call to its first kernel, the "
                      "kernels' span and the time from its last kernel to the wait's end")
  common.results_flags(p)
  a = p.parse_args(argv)
  variant = common.variant(p, a)
  a.results_dir = common.check_results_dir(p, a.results_dir)
  model = a.workload != 'synthetic'
  clients = a.clients or (20 if model else 200)
  rounds = a.rounds or (3 if model else 20)
  common.at_least(p, 1, clients=clients, rounds=rounds, top=a.top)
  if a.xla_layers and not model:
    p.exit(2, 'error: --xla_layers: only with --workload cnn or lstm\n')
  fuse = {'auto': None, 'true': True, 'false': False}[a.fuse_dots]
  round_ms, ranked, chunk, hlo, trace = profile(a.workload, clients, fuse, a.xla_layers,
                                                rounds)
  summed = sum(us for _, us, _ in ranked)
  layers = ', xla_layers' if a.xla_layers else ''
  title = (f'{a.workload}, {clients} clients (chunk {chunk}), fuse_dots={a.fuse_dots}{layers}: '
           f'round {round_ms:.2f} ms (median of {rounds}); kernels sum to {summed / 1e3:.2f} ms '
           'a round')
  print(title + '\n')
  kernels = [{'kernel': name, 'writes': output_shape(hlo, name), 'us_per_round': us,
              'calls_per_round': n, 'share': us / summed} for name, us, n in ranked[:a.top]]
  print(common.markdown_table(KERNEL_COLUMNS, common.figures(KERNEL_COLUMNS, kernels)))
  summary = {'clients': clients, 'chunk': chunk, 'round_ms': round_ms, 'kernels_ms': summed / 1e3}
  columns = list(ROUND_COLUMNS)
  if a.timeline:
    if any(plane.name.startswith('/device:GPU') for plane in trace.planes):
      print('\n--timeline: CPU only (a GPU round is timed by its streams above)')
    else:
      summary.update(timeline(trace))
      columns += TIMELINE_COLUMNS
      print('\nThe round (medians over the traced rounds, under the profiler):\n')
      print(common.markdown_table(columns, common.figures(columns, [summary])))
  common.write_results(
      'profile_round', columns, [summary], variant_name=variant, results_dir=a.results_dir,
      setting=f'FedAvgCM, {a.workload}, fuse_dots={a.fuse_dots}{layers}; {rounds} rounds traced',
      notes=a.notes, tables=[common.table_results(
          f'The {a.top} slowest kernels (per round)', KERNEL_COLUMNS, kernels)])


if __name__ == '__main__':
  main()
