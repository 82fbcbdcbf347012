"""What the benchmark scripts share: the LEAF Synthetic, CNN and LSTM workloads, timing, a
step's product FLOPs and the machine's matrix-product speed, integer-list flags, output: the
tables they print (``Column``, ``markdown_table``) and the results they write
(``write_results``: ``benchmarks/results/<benchmark>[-<variant>].json``, from which
``benchmarks/results_md.py`` writes ``benchmarks/RESULTS.md``)."""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import inspect
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

BENCHMARKS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCHMARKS)
RESULTS_DIR = os.path.join(BENCHMARKS, 'results')
# The command line as it was given, with XLA_FLAGS if the caller set them: read when this module
# is imported, before a script's set-up (``xla.configure_cpu``) adds its own to the environment.
_COMMAND = [os.path.relpath(os.path.abspath(sys.argv[0]), REPO)
            if sys.argv and sys.argv[0].endswith('.py') else (sys.argv[0] if sys.argv else ''),
            *sys.argv[1:]]
_XLA_FLAGS = os.environ.get('XLA_FLAGS')


def synthetic_workload(population: int = 0, cpu_devices: int | None = None):
  """LEAF Synthetic's training pool on device, the logistic model (60 -> 5), its loss, the root
  key of seed 0 and the initial params: ``(split, data, model, loss, root, params)``.

  Sets XLA's CPU backend up first as ``launch/run.py`` does (``xla.configure_cpu``: every
  core a device, small loops one kernel; no effect on GPU or TPU), so it must run before JAX
  starts; ``cpu_devices`` presents that many instead of one per
  core. ``population`` > 1,000 repeats the clients: client ``j`` holds a copy of LEAF client
  ``j mod 1000``'s rows (the pool grows with the population, as a real one would: about 23 MB
  per 1,000 clients; clients' rows must follow one another, ``federated_data.check_pool``).
  """
  xla = xla_module()
  xla.configure_cpu(cpu_devices)
  import numpy as np  # pylint: disable=g-import-not-at-top

  from fedjax_gel import models  # pylint: disable=g-import-not-at-top
  from fedjax_gel.core import federated_data, keys  # pylint: disable=g-import-not-at-top
  from fedjax_gel.data import leaf_synthetic  # pylint: disable=g-import-not-at-top

  split = leaf_synthetic.load()
  train = split.train
  if population:
    reps = -(-population // train.num_clients)
    rows = len(next(iter(train.examples.values())))
    shift = np.repeat(np.arange(reps) * rows, train.num_clients)[:population]
    tile = lambda a: np.tile(np.asarray(a), reps)[:population]
    train = train._replace(
        examples={k: np.concatenate([np.asarray(v)] * reps) for k, v in train.examples.items()},
        offsets=tile(train.offsets) + shift, counts=tile(train.counts),
        client_names=tuple(str(i) for i in range(population)))
  model = models.get_model('logistic', (60,), 5)
  root = keys.root_key(0)
  return (split, federated_data.to_device(train), model, models.cross_entropy_loss(model), root,
          model.init(keys.init_key(root)))


# (tau, B) of the three workloads the round benchmarks share: LEAF Synthetic's logistic
# regression, GeL's FEMNIST CNN and LEAF's Shakespeare LSTM in their papers' settings.
ROUND_WORKLOADS = {'synthetic': (13, 5), 'cnn': (8, 20), 'lstm': (4, 10)}


def round_workload(name: str, clients: int, xla_layers: bool = False,
                   cpu_devices: int | None = 1):
  """``(data, loss, root, params)`` of one of ``ROUND_WORKLOADS`` on one device (or
  ``cpu_devices``; None: every core a device, as ``launch/run.py``): LEAF Synthetic, or at
  least ``clients`` FEMNIST- or Shakespeare-shaped random clients of 200 examples (at least
  100: a round's cohort is drawn from them); ``xla_layers``: the CNN with XLA's own
  convolution and pool, the LSTM as Flax's own cell."""
  if name == 'cnn':
    workload = femnist_like_workload(max(clients, 100), 200, cpu_devices, xla_layers)
  elif name == 'lstm':
    workload = shakespeare_like_workload(max(clients, 100), 200, cpu_devices, xla_layers)
  else:
    workload = synthetic_workload(cpu_devices=cpu_devices)
  _, data, _, loss, root, params = workload
  return data, loss, root, params


def random_clients_workload(num_clients: int, per_client: int, examples, build_model,
                            cpu_devices: int | None = None):
  """``num_clients`` random clients of ``per_client`` examples each (``examples(rng, n)``: a
  client's ``{'x', 'y'}`` arrays; numpy generator of seed 0) and the model ``build_model()``,
  built after every CPU core is presented as a device (as ``synthetic_workload``). Returns
  ``(host pool, pool on device, model, loss, root key, initial params)``."""
  xla = xla_module()
  xla.configure_cpu(cpu_devices)
  import numpy as np  # pylint: disable=g-import-not-at-top

  from fedjax_gel import models  # pylint: disable=g-import-not-at-top
  from fedjax_gel.core import federated_data, keys  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(0)
  host = federated_data.from_client_arrays([examples(rng, per_client)
                                            for _ in range(num_clients)])
  model = build_model()
  root = keys.root_key(0)
  return (host, federated_data.to_device(host), model, models.cross_entropy_loss(model), root,
          model.init(keys.init_key(root)))


def femnist_like_workload(num_clients: int, per_client: int, cpu_devices: int | None = None,
                          xla_layers: bool = False):
  """GeL's FEMNIST CNN (608,702 parameters) on FEMNIST-shaped random data: ``num_clients``
  clients of ``per_client`` images (784 floats in [0, 1)) and labels (62 classes), seed 0.
  FEMNIST itself is a download; the speed of a step does not depend on the pixel values.
  Returns ``random_clients_workload``'s tuple; ``xla_layers`` builds the CNN with XLA's own
  convolution and max pool (``TwoConvCNN``).
  """
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from fedjax_gel import models  # pylint: disable=g-import-not-at-top

  def examples(rng, n):
    return {'x': rng.random((n, 784), np.float32), 'y': rng.integers(0, 62, n).astype(np.int32)}

  def build_model():
    module = models.TwoConvCNN(62, kernel=5, padding='VALID', hidden=512, xla_layers=xla_layers)
    return models.from_linen('gel_femnist_cnn', module, (784,), jnp.float32, 62)

  return random_clients_workload(num_clients, per_client, examples, build_model, cpu_devices)


def shakespeare_like_workload(num_clients: int, per_client: int, cpu_devices: int | None = None,
                              flax_cell: bool = False):
  """LEAF's Shakespeare LSTM (``models.shakespeare_lstm``, 817,872 parameters) on
  Shakespeare-shaped random data: ``num_clients`` clients of ``per_client`` int32 sequences of
  80 character ids and next-character labels, both uniform over LEAF's 80 characters, seed 0.
  A step's speed does not depend on the characters. Returns ``random_clients_workload``'s tuple;
  ``flax_cell`` runs the LSTMs as Flax's own cell instead of ``models.layers.lstm``.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top

  from fedjax_gel import models  # pylint: disable=g-import-not-at-top

  def examples(rng, n):
    return {'x': rng.integers(0, 80, (n, 80)).astype(np.int32),
            'y': rng.integers(0, 80, n).astype(np.int32)}

  return random_clients_workload(num_clients, per_client, examples,
                                 lambda: models.shakespeare_lstm((80,), 80, fused=not flax_cell),
                                 cpu_devices)


def time_rounds(compiled, state, cohorts, data, root) -> list[float]:
  """Seconds of each round ``1 .. len(cohorts) - 1`` of a compiled round function, after a
  warm-up round on ``cohorts[0]`` (``block_until_ready``; the round index a NumPy int32, as
  ``launch/run.py`` passes it)."""
  import time  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  jax.block_until_ready(compiled(state, cohorts[0], data, root, np.int32(0)))
  times = []
  for r in range(1, len(cohorts)):
    t = time.perf_counter()
    jax.block_until_ready(compiled(state, cohorts[r], data, root, np.int32(r)))
    times.append(time.perf_counter() - t)
  return times


def chained_rounds(step, carry, rounds: int, wait_each: bool):
  """Runs ``carry = step(carry, r)`` for ``r = 1 .. rounds``, each round's output fed to the
  next as a training loop feeds it; returns ``(carry, seconds)``. ``wait_each``: each round is
  waited for before the next is dispatched, and ``seconds`` lists each round's time (its
  latency; ``launch/run.py``'s loop runs so with several processes). Otherwise the rounds are
  dispatched while earlier ones run, as the loop runs them in one process, and ``seconds`` is
  one figure: the whole sequence's time over ``rounds``."""
  import time  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top
  jax.block_until_ready(carry)
  seconds, start = [], time.perf_counter()
  for r in range(1, rounds + 1):
    carry = step(carry, r)
    if wait_each:
      jax.block_until_ready(carry)
      seconds.append(time.perf_counter() - start)
      start = time.perf_counter()
  if not wait_each:
    jax.block_until_ready(carry)
    seconds.append((time.perf_counter() - start) / rounds)
  return carry, seconds


def product_flops(fn, *args) -> int:
  """Floating-point operations of the matrix products and convolutions ``fn(*args)`` traces
  (2 per multiply-add; a ``scan`` body counted ``length`` times, other nested programs once):
  the arithmetic a step cannot avoid, counted from its jaxpr, since XLA's cost analysis
  counts a loop's body once. Convolutions count every kernel tap, padding included."""
  import math  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top
  from jax.extend import core as jcore  # pylint: disable=g-import-not-at-top

  def count(jaxpr, times):
    total = 0
    for eqn in jaxpr.eqns:
      name, out = eqn.primitive.name, math.prod(eqn.outvars[0].aval.shape)
      if name == 'dot_general':
        (contract, _), _ = eqn.params['dimension_numbers']
        lhs = eqn.invars[0].aval.shape
        total += times * 2 * out * math.prod(lhs[i] for i in contract)
      elif name == 'conv_general_dilated':
        rhs, spec = eqn.invars[1].aval.shape, eqn.params['dimension_numbers'].rhs_spec
        total += times * 2 * out * math.prod(rhs[i] for i in spec[1:])
      inner = times * eqn.params['length'] if name == 'scan' else times
      for value in eqn.params.values():
        for sub in value if isinstance(value, (tuple, list)) else (value,):
          if isinstance(sub, jcore.ClosedJaxpr):
            total += count(sub.jaxpr, inner)
          elif isinstance(sub, jcore.Jaxpr):
            total += count(sub, inner)
    return total

  return count(jax.make_jaxpr(fn)(*args).jaxpr, 1)


def matmul_gflops(size: int = 2048, repeats: int = 10) -> float:
  """This machine's float32 matrix-product speed: GFLOP/s of the fastest of ``repeats``
  jitted ``size x size x size`` products (XLA's library call, all of its threads)."""
  import time  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  a = jax.random.normal(jax.random.key(0), (size, size), jnp.float32)
  dot = jax.jit(jnp.dot)
  jax.block_until_ready(dot(a, a))
  best = float('inf')
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(dot(a, a))
    best = min(best, time.perf_counter() - t)
  return 2 * size ** 3 / best / 1e9


def xla_module():
  """``fedjax_gel.core.backend.xla``, or ``core.devices`` in a checkout from before the backend
  package (``paired_checkouts.py --before``)."""
  try:
    from fedjax_gel.core.backend import xla  # pylint: disable=g-import-not-at-top
  except ImportError:
    from fedjax_gel.core import devices as xla  # pylint: disable=g-import-not-at-top
  return xla


def built_round(round_lib, algorithm, chunk: int, mesh=None, compiler_options=None,
                fuse_small_dots: bool | None = None):
  """``round_lib.build_round`` (this checkout's or an earlier one's, before the ``Backend``
  record) with the fused small products where ``fuse_small_dots`` asks (None: on CPU only, as
  the published configurations run them)."""
  import jax  # pylint: disable=g-import-not-at-top
  if 'backend' not in inspect.signature(round_lib.build_round).parameters:
    return round_lib.build_round(algorithm, chunk_size=chunk, mesh=mesh,
                                 fuse_dots=fuse_small_dots, compiler_options=compiler_options)
  if fuse_small_dots is None:
    fuse_small_dots = jax.default_backend() == 'cpu'
  from fedjax_gel.core.backend import Backend  # pylint: disable=g-import-not-at-top
  return round_lib.build_round(algorithm, chunk_size=chunk, mesh=mesh, backend=Backend(
      fuse_small_dots=fuse_small_dots, compiler_options=compiler_options))


def launch_compiler_options(params, cohort: int, budgets: tuple[int, int], batch: int):
  """The XLA options ``launch/run.py`` compiles a round of ``cohort`` clients with
  (``experiment.planning.quick_compile``: compiled for compile time when the round is small)."""
  xla = xla_module()
  from fedjax_gel.experiment import config, planning  # pylint: disable=g-import-not-at-top
  k = config.CohortConfig(clients_per_round=cohort, batch_size=batch, budget_range=budgets)
  return xla.compiler_options(planning.quick_compile(k, params))


def launch_round(algorithm, params, data, root, cohort: int, tau, batch: int,
                 replace: bool) -> dict:
  """The round as ``launch/run.py`` sets it up for ``cohort`` clients of budget ``tau`` (or
  ``tau_i ~ U{a..b}`` for ``tau = (a, b)``) in a long run: the devices, chunk and compile
  options of the library's planner (``experiment.planning``), state and pool placed on the
  devices once, compiled and run once (warm-up). Returns ``compiled, state, pool, sample``
  (round -> cohort), ``devices``, ``chunk`` (clients per chunk as the round runs them: on
  several devices each device's, ``round.routed_chunk``) and ``compile_s``."""
  import time  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from fedjax_gel.core import federated_data, store  # pylint: disable=g-import-not-at-top
  from fedjax_gel.core import round as round_lib, sampling  # pylint: disable=g-import-not-at-top
  from fedjax_gel.experiment import planning  # pylint: disable=g-import-not-at-top

  budgets = (tau, tau) if isinstance(tau, int) else tuple(tau)
  mesh, chunk = planning.devices_and_chunk(algorithm, params, data, cohort, batch,
                                           budgets[0] == budgets[1])
  num_used = 1 if mesh is None else mesh.size
  round_fn = built_round(round_lib, algorithm, chunk, mesh,
                         launch_compiler_options(params, cohort, budgets, batch))
  spec = sampling.CohortSpec(cohort, budgets, batch, replace=replace,
                             weighting='samples_seen')

  def sample(r):
    return sampling.sample_cohort(root, r, data.counts, spec)

  state = store.place_state(algorithm.server_init(params), algorithm, mesh)
  pool = federated_data.to_device(data, mesh, planning.replicate_pool(algorithm, data, mesh))
  t = time.perf_counter()
  compiled = round_fn.lower(state, sample(0), pool, root, np.int32(0)).compile()
  compile_s = time.perf_counter() - t
  jax.block_until_ready(compiled(state, sample(0), pool, root, np.int32(0)))
  return dict(compiled=compiled, state=state, pool=pool, sample=sample, devices=num_used,
              chunk=device_chunk(cohort, chunk, mesh), compile_s=compile_s)


def device_chunk(cohort: int, chunk_size: int, mesh) -> int:
  """The clients one device vmaps at once in a round built with ``chunk_size`` on ``mesh``
  (None: one device): each device's cut of its share on several (``routing.routed_chunk``)."""
  try:
    from fedjax_gel.core import routing  # pylint: disable=g-import-not-at-top
  except ImportError:   # a checkout from before the round's stages (paired_checkouts)
    from fedjax_gel.core import round as routing  # pylint: disable=g-import-not-at-top
  if mesh is None:
    return routing.chunk_layout(cohort, chunk_size)[0]
  return routing.routed_chunk(cohort, chunk_size, mesh.size)


def in_fresh_process(script: str, cohort: int, args: list[str]) -> dict:
  """Runs ``python script --single cohort *args`` (a benchmark measuring one cohort size in a
  process of its own, so that its peak memory and compilations are its own) and returns the
  JSON row it prints last; exits with its error output when it fails."""
  proc = subprocess.run([sys.executable, script, '--single', str(cohort), *args],
                        capture_output=True, text=True, check=False)
  if proc.returncode:
    lines = proc.stderr.strip().splitlines()
    why = f' {lines[0]}' if len(lines) == 1 else f'\n{proc.stderr[-3000:]}'   # its own one line
    sys.exit(f'error: the {cohort}-client measurement failed:{why}')
  return json.loads(proc.stdout.strip().splitlines()[-1])


def timed_processes(commands: list[list[str]], what: str, cwd: str | None = None,
                    env: dict | None = None) -> float:
  """Runs ``commands`` as processes at once, their output discarded, and returns the seconds
  from the first start to the last exit. ``commands[0]`` starts last (process 0 of a run of
  several, which the others wait for); exits with the error output of the first that failed
  (``what`` names the command)."""
  logs = [tempfile.TemporaryFile('w+') for _ in commands]   # no pipe fills up
  t = time.perf_counter()
  procs = {i: subprocess.Popen(commands[i], cwd=cwd, stdout=subprocess.DEVNULL, stderr=logs[i],
                               text=True, env=env) for i in reversed(range(len(commands)))}
  for p in procs.values():
    p.wait()
  wall = time.perf_counter() - t
  for i, log in enumerate(logs):   # process 0's failure first: the cause
    log.seek(0)
    err = log.read()
    log.close()
    if procs[i].returncode:
      which = f' (process {i})' if len(commands) > 1 else ''
      sys.exit(f'{what} failed{which}:\n{err[-2000:]}')
  return wall


def coordinator_address() -> str:
  """``127.0.0.1:PORT`` with a port free now, for process 0 of a multi-process run to serve."""
  import socket  # pylint: disable=g-import-not-at-top
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return f'127.0.0.1:{s.getsockname()[1]}'


def int_list(parser, flag: str, text: str) -> list[int]:
  """``'a,b,...'`` -> ints, or exit 2 with one line naming ``--flag``."""
  try:
    return [int(x) for x in text.split(',')]
  except ValueError:
    parser.exit(2, f'error: --{flag} must be comma-separated integers (got {text!r})\n')


def at_least(parser, low: int, **flags):
  """Exit 2 with one line naming the first of ``flags`` (``flag=value``, a number or a list of
  them) whose value is below ``low``."""
  for flag, value in flags.items():
    for v in value if isinstance(value, list) else [value]:
      if v < low:
        parser.exit(2, f'error: --{flag} must be {"positive" if low == 1 else f">= {low}"} '
                       f'(got {v})\n')


def budget_range(parser, text: str) -> tuple[int, int]:
  """``'a,b'`` with ``1 <= a <= b``, or exit 2 with one line naming ``--budget_range``."""
  budgets = int_list(parser, 'budget_range', text)
  if len(budgets) != 2 or not 1 <= budgets[0] <= budgets[1]:
    parser.exit(2, f'error: --budget_range must be a,b with 1 <= a <= b (got {text!r})\n')
  return budgets[0], budgets[1]


def host() -> str:
  try:
    import psutil  # pylint: disable=g-import-not-at-top
    memory = f', {psutil.virtual_memory().total / 2**30:.0f} GiB memory'
  except ImportError:
    memory = ''
  return f'{platform.machine()}, {os.cpu_count()} cores{memory}'


def json_flag(parser, path: str | None) -> str | None:
  """``--json``'s path, its folder made before anything is measured; else exit 2 with one line
  (a missing folder failed after every measurement, losing them)."""
  if path:
    folder = os.path.dirname(os.path.abspath(path))
    try:
      os.makedirs(folder, exist_ok=True)
    except OSError as e:
      parser.exit(2, f'error: --json={path}: cannot make its folder ({e.strerror or e})\n')
    if os.path.isdir(path) or not os.access(folder, os.W_OK):
      parser.exit(2, f'error: --json={path}: not a file this user can write\n')
  return path


def report(rows: list[dict], table: str, json_path: str | None):
  """Prints the device, the host and the table; writes the rows to ``json_path`` if given."""
  print(f'device: {rows[0]["device"]}; host: {host()}\n')
  print(table)
  if json_path:
    with open(json_path, 'w') as f:
      json.dump(rows, f, indent=2)


def plot(path: str | None, title: str, xlabel: str, ylabel: str, series: dict, log: str = ''):
  """Writes a line plot of ``series`` (``name -> (xs, ys)``) to ``path`` (PNG) when given and
  matplotlib is installed (``pip install -e '.[plot]'``); ``log``: axes on a log scale, ``'x'``,
  ``'y'`` or ``'xy'``."""
  if not path:
    return
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
  except ImportError:
    print(f'note: {path} not written: matplotlib is not installed', flush=True)
    return
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(6, 4))
  for name, (xs, ys) in series.items():
    ax.plot(xs, ys, marker='o', label=name)
  if 'x' in log:
    ax.set_xscale('log')
  if 'y' in log:
    ax.set_yscale('log')
  ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
  ax.grid(True, alpha=0.3)
  ax.legend()
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)


# ---------------------------------------------------------------------------------------------
# Tables and results.


@dataclasses.dataclass(frozen=True)
class Column:
  """One column of a benchmark's table: ``field``, the figure's name in the rows of its results
  (its unit in the name: ``round_ms``, ``compile_s``), ``heading`` (with its unit), ``unit``,
  ``better`` (``'higher'``, ``'lower'`` or ``''`` for a setting or a reference) and ``format``
  (a ``str.format`` template, or ``'times'``: ``12x``, ``1.4x`` below 10; a text figure takes
  it only where it has a bare ``{}``, as ```{}``` for code); a list value is
  formatted item by item and joined by ``join``. ``get`` reads the figure from a script's own
  row (default: ``row[field]``; None or absent: ``-``); ``left``: a text column."""
  field: str
  heading: str
  unit: str = ''
  better: str = ''
  format: str = '{}'
  join: str = ', '
  left: bool = False
  get: Callable[[dict], Any] | None = None

  def spec(self) -> dict:
    """The column as the results' JSON holds it (everything but ``get``)."""
    spec = {'field': self.field, 'heading': self.heading, 'unit': self.unit,
            'better': self.better, 'format': self.format}
    if self.join != ', ':
      spec['join'] = self.join
    if self.left:
      spec['left'] = True
    return spec


# The columns most benchmarks share: the cohort, the devices, compile time and the round's time
CLIENTS = Column('clients', 'clients', format='{:,}', get=lambda r: r['cohort'])
DEVICES = Column('devices', 'devices')
CHUNK = Column('chunk', 'chunk', format='{:,}', get=lambda r: r['chunk_size'])
COMPILE_S = Column('compile_s', 'compile s', 's', 'lower', '{:.2f}')
ROUND_MS = Column('round_ms', 'round ms', 'ms', 'lower', '{:.2f}', get=lambda r: r['round_s'] * 1e3)


def format_value(value, fmt: str = '{}', join: str = ', ') -> str:
  """A figure as a table shows it: ``-`` for None, a string as it is, a list item by item."""
  if value is None:
    return '-'
  if isinstance(value, list):
    return join.join(format_value(v, fmt, join) for v in value)
  if isinstance(value, str):   # text, or a figure a table gave as text: as it is
    return fmt.format(value) if value and '{}' in fmt else value
  if fmt == 'times':
    return f'{value:.1f}x' if value < 10 else f'{value:.0f}x'
  return fmt.format(value)


def figures(columns: list[Column], rows: list[dict]) -> list[dict]:
  """The rows' figures, one dict per row, named by the columns' fields, in their units."""
  out = []
  for row in rows:
    out.append({c.field: (c.get(row) if c.get else row.get(c.field)) for c in columns})
  return out


def markdown_table(columns: list, rows: list[dict]) -> str:
  """``rows`` (figures named by the columns' fields) as a markdown table, after a line saying
  which way is better for each figure that has a direction. ``columns``: ``Column``s or their
  JSON specs."""
  cols = [c.spec() if isinstance(c, Column) else c for c in columns]
  better = {way: [c['heading'] for c in cols if c.get('better') == way]
            for way in ('higher', 'lower')}
  lines = []
  said = [f'{way} is better: ' + ', '.join(f'"{h}"' for h in headings)
          for way, headings in better.items() if headings]
  if said:
    text = '; '.join(said)
    lines += [text[0].upper() + text[1:] + '.', '']
  lines.append('| ' + ' | '.join(c['heading'] for c in cols) + ' |')
  lines.append('|' + ''.join('---|' if c.get('left') else '---:|' for c in cols))
  for row in rows:
    lines.append('| ' + ' | '.join(
        format_value(row.get(c['field']), c.get('format', '{}'), c.get('join', ', '))
        for c in cols) + ' |')
  return '\n'.join(lines)


def cpu_model() -> str:
  """The processor's model name (``/proc/cpuinfo``), else ``platform.processor()``."""
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith('model name'):
          return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine() or 'unknown CPU'


def memory_gib() -> float | None:
  """The host's memory in GiB (``/proc/meminfo``), None where it is not there to read."""
  try:
    with open('/proc/meminfo') as f:
      for line in f:
        if line.startswith('MemTotal:'):
          return int(line.split()[1]) / 2**20
  except (OSError, ValueError, IndexError):
    pass
  return None


def machine() -> str:
  """What ran the benchmark: the host (processor, cores, memory) and JAX's devices."""
  import jax  # pylint: disable=g-import-not-at-top
  memory = memory_gib()
  host_text = (f'{cpu_model()}, {os.cpu_count()} cores'
               + (f', {memory:.0f} GiB memory' if memory else ''))
  devices = jax.devices()
  if devices[0].platform == 'cpu':
    return f'{host_text}, no accelerator; JAX {jax.__version__}, CPU backend'
  return (f'{len(devices)} x {devices[0].device_kind} ({devices[0].platform}); host: '
          f'{host_text}; JAX {jax.__version__}')


def source_commit(repo: str = REPO) -> str:
  """``git rev-parse --short HEAD`` of ``repo``, with ``+dirty`` when a tracked file differs from
  it (results, plots and RESULTS.md aside: the benchmarks write them), or ``unknown``."""
  def git(*args):
    return subprocess.run(['git', '-C', repo, *args], capture_output=True, text=True,
                          check=True).stdout.strip()
  try:
    head = git('rev-parse', '--short', 'HEAD')
    changed = git('status', '--porcelain', '--untracked-files=no', '--', '.',
                  ':!benchmarks/results', ':!benchmarks/plots', ':!benchmarks/RESULTS.md')
  except (OSError, subprocess.CalledProcessError):
    return 'unknown'
  return head + ('+dirty' if changed else '')


# Options that say how long or how often a benchmark measures, or where it writes, not what it
# measures: they do not make a variant of its results.
NOT_SETTINGS = frozenset({'json', 'plot', 'single', 'results_dir', 'notes', 'repeats', 'pairs',
                          'rounds', 'top', 'help'})


def variant(parser: argparse.ArgumentParser, args: argparse.Namespace,
            ignore: tuple[str, ...] = ()) -> str:
  """The setting ``args`` measure, for the results' file name: every option not at its default
  (but those of ``NOT_SETTINGS`` and ``ignore``), as ``name=value`` joined by ``+``, sorted;
  ``''`` for the defaults. Call it right after ``parse_args``."""
  parts = []
  for action in parser._actions:   # pylint: disable=protected-access
    name = action.dest
    if (name in NOT_SETTINGS or name in ignore or action.help == argparse.SUPPRESS
        or not action.option_strings):
      continue
    value = getattr(args, name, None)
    if value is None or value == action.default:
      continue
    parts.append(name if value is True else f'{name}={value}')
  return re.sub(r'[^A-Za-z0-9_.,=+-]', '-', '+'.join(sorted(parts)))


def results_flags(parser: argparse.ArgumentParser):
  """Adds ``--results_dir`` and ``--notes``: where ``write_results`` writes, and a line for it."""
  parser.add_argument('--results_dir', default=RESULTS_DIR,
                      help='folder of the results JSON (benchmarks/results, from which '
                           'benchmarks/results_md.py writes RESULTS.md); empty: none written')
  parser.add_argument('--notes', default='',
                      help="a line the results keep with the figures (the machine's load, what "
                           'else ran)')


def check_results_dir(parser: argparse.ArgumentParser, path: str) -> str:
  """``--results_dir``, made before anything is measured, or exit 2 with one line."""
  if path:
    try:
      os.makedirs(path, exist_ok=True)
    except OSError as e:
      parser.exit(2, f'error: --results_dir={path}: cannot make it ({e.strerror or e})\n')
    if not os.access(path, os.W_OK):
      parser.exit(2, f'error: --results_dir={path}: not a folder this user can write\n')
  return path


def command_line() -> str:
  """The command that ran this process, as a shell line (``XLA_FLAGS=...`` first if set)."""
  line = 'python ' + ' '.join(shlex.quote(a) for a in _COMMAND)
  return (f'XLA_FLAGS={shlex.quote(_XLA_FLAGS)} ' if _XLA_FLAGS else '') + line


def results_path(name: str, variant_name: str = '', results_dir: str = RESULTS_DIR) -> str:
  """``<results_dir>/<name>[-<variant>].json``."""
  return os.path.join(results_dir, name + (f'-{variant_name}' if variant_name else '') + '.json')


def write_results(name: str, columns: list[Column], rows: list[dict], *, variant_name: str = '',
                  results_dir: str | None = RESULTS_DIR, setting: str = '', notes: str = '',
                  plot: str | None = None, tables: list[dict] | None = None,
                  command: str | None = None) -> str | None:
  """Writes the results of one run of benchmark ``name`` to ``results_path`` (replacing what an
  earlier run of the same setting wrote) and returns the path; nothing where ``results_dir`` is
  empty. The file holds ``benchmark``, ``variant``, ``command`` (this process's command line),
  ``commit`` (``source_commit``), ``machine``, ``date`` (UTC), ``setting`` (the line over the
  table), ``columns`` (``Column.spec``), ``figures`` (the rows' figures, ``figures``),
  ``notes``, and where given ``plot`` (relative to ``benchmarks/``) and further ``tables``
  (``{'title', 'columns', 'figures'}``, each made by ``table_results``). On an accelerator the
  platform leads the variant (``gpu+...``), so a GPU's figures do not replace a CPU's."""
  if not results_dir:
    return None
  import jax  # pylint: disable=g-import-not-at-top
  platform_name = jax.devices()[0].platform
  if platform_name != 'cpu':
    variant_name = '+'.join(p for p in (platform_name, variant_name) if p)
  result = {
      'benchmark': name, 'variant': variant_name, 'command': command or command_line(),
      'commit': source_commit(), 'machine': machine(),
      'date': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%dT%H:%M:%SZ'),
      'setting': setting, 'columns': [c.spec() for c in columns],
      'figures': figures(columns, rows), 'notes': notes}
  if plot and os.path.exists(plot):
    result['plot'] = os.path.relpath(os.path.abspath(plot), BENCHMARKS)
  if tables:
    result['tables'] = tables
  os.makedirs(results_dir, exist_ok=True)
  path = results_path(name, variant_name, results_dir)
  with open(path, 'w') as f:
    json.dump(result, f, indent=1)
    f.write('\n')
  print(f'results: {os.path.relpath(path)}', file=sys.stderr)
  return path


def table_results(title: str, columns: list[Column], rows: list[dict]) -> dict:
  """A further table of a run's results (``write_results``'s ``tables``)."""
  return {'title': title, 'columns': [c.spec() for c in columns],
          'figures': figures(columns, rows)}
