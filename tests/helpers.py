"""Shared test helpers: a small federated pool, the engine's data order rebuilt by hand,
``launch/run.py`` run in this process, and a script run on several CPU devices."""
import contextlib
import functools
import io
import os
import pathlib
import re
import socket
import struct
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_gel import models
from fedjax_gel.core.backend import xla
from fedjax_gel.core.backend import Backend
from fedjax_gel.core import federated_data as fd
from fedjax_gel.core import keys
from fedjax_gel.core.round import build_round
from fedjax_gel.core.sampling import Cohort, CohortSpec
from fedjax_gel.core.shuffle import cycled_permutation

B, TAU_MAX = 3, 6
EMPTY_CLIENT = 12
# XLA's CPU defaults, for a program of a test (the suite compiles with ``QUICK_COMPILE``'s
# emitters: tests/conftest.py; None where jaxlib has no other emitters).
DEFAULT_EMITTERS = {'xla_cpu_use_fusion_emitters': True} if xla.LEGACY_EMITTERS else None
# XLA's default LLVM optimisation level. The suite compiles at level 0 (tests/conftest.py), which
# can change a float result in its last bits (e.g. where a multiply and an add become one
# instruction), so a test of a bit-identity that runs promise between two different programs
# compiles both as a run does: ``as_runs_compile(options)`` (with XLA's default CPU preset too,
# which the suite also changes).
RUNS_COMPILE = {'xla_backend_optimization_level': 3,
                 **({'xla_cpu_opt_preset': 'CPU_OPT_PRESET_DEFAULT'} if xla.LEGACY_EMITTERS
                    else {})}


def as_runs_compile(options: dict | None) -> dict:
  """``jax.jit``'s ``compiler_options`` ``options`` at XLA's default LLVM level and preset."""
  return {**(options or {}), **RUNS_COMPILE}


def as_runs_environment() -> dict:
  """``os.environ`` for a child process whose programs compile at XLA's default LLVM level and
  preset."""
  flags = re.sub(r'--xla_(backend_optimization_level|cpu_opt_preset)=\S*', '',
                 os.environ.get('XLA_FLAGS', ''))
  return {**os.environ, 'XLA_FLAGS': ' '.join(flags.split())}


def small_pool():
  """12 clients with 2..30 examples of 4 features, 3 classes, then one client without data."""
  rng = np.random.default_rng(0)
  w = rng.normal(size=(4, 3))
  clients = []
  for n in [2, 5, 9, 17, 4, 30, 7, 11, 3, 13, 8, 6]:
    x = (rng.normal(size=(n, 4)) + rng.normal()).astype(np.float32)
    clients.append({'x': x, 'y': np.argmax(x @ w, 1).astype(np.int32)})
  clients.append({'x': np.zeros((0, 4), np.float32), 'y': np.zeros((0,), np.int32)})
  return fd.to_device(fd.from_client_arrays(clients))


def small_model():
  return models.get_model('logistic', (4,), 3)


def init_params(model, seed=0):
  return model.init(keys.init_key(keys.root_key(seed)))


def cohort(ids, budgets, weights=None, batch_size=B, max_budget=TAU_MAX):
  """A hand-made cohort (batch ``B``, budgets up to ``TAU_MAX`` unless given)."""
  ids = jnp.asarray(ids, jnp.int32)
  w = jnp.ones(ids.shape, jnp.float32) if weights is None else jnp.asarray(weights, jnp.float32)
  spec = CohortSpec(int(ids.shape[0]), (1, max_budget), batch_size)
  return Cohort(ids, jnp.asarray(budgets, jnp.int32), w, spec)


def with_guesses(alg, guesses):
  """``alg`` with the given guess count per cohort slot (instead of its guess policy)."""
  counts = jnp.asarray(guesses, jnp.float32)
  return alg._replace(client_guesses=lambda budgets, max_budget: counts)


def run(alg, data, c, params, chunk_size, seed=0, round_idx=3, static_steps=None,
        compiler_options=None, client_distance=False):
  """One engine round from ``params``; returns ``(server_state, metrics)``. With the fused
  small products on CPU, as the published configurations of long runs train (the algorithms'
  oracle tests check that path; ``test_small_dots`` and ``test_debug_round`` the other)."""
  rf = build_round(alg, chunk_size=chunk_size, backend=Backend(
      fuse_small_dots=jax.default_backend() == 'cpu', static_steps=static_steps,
      compiler_options=compiler_options), client_distance=client_distance)
  return rf(alg.server_init(params), c, data, keys.root_key(seed), jnp.int32(round_idx))


@functools.cache
def grad_of(fn):
  """``jax.jit(jax.grad(fn))``, built once per function: the oracles' loops take many small
  steps, each of which ``jax.grad`` alone would trace again and run op by op."""
  return jax.jit(jax.grad(fn))


@functools.cache
def value_and_grad_of(fn):
  """``jax.jit(jax.value_and_grad(fn))``, built once per function (``grad_of``)."""
  return jax.jit(jax.value_and_grad(fn))


# the data order's permutation, compiled once per length (run op by op, it took a seventh of an
# oracle test's time)
_permutation = jax.jit(cycled_permutation, static_argnums=2)


def minibatches(data, client_id, slot, tau, seed=0, round_idx=3):
  """The engine's documented data order, rebuilt by hand: perm_i[(k B + j) mod n_i]."""
  ck = keys.client_key(keys.round_key(keys.root_key(seed), round_idx, keys.CLIENT),
                       client_id, slot)
  shuffle_key = jax.random.split(ck)[0]
  n, off = int(data.counts[client_id]), int(data.offsets[client_id])
  order = np.asarray(_permutation(shuffle_key, n, TAU_MAX * B))
  for k in range(tau):
    rows = off + order[k * B:(k + 1) * B]
    yield {name: v[rows] for name, v in data.examples.items()}


def assert_trees_close(a, b, tol=1e-6):
  jax.tree_util.tree_map(lambda u, v: np.testing.assert_allclose(u, v, rtol=tol, atol=tol), a, b)


def memory_for(exp, clients: int) -> int:
  """A memory limit under which one chunk of a prepared ``exp`` holds exactly ``clients``
  clients (the memory guard, ``planning.fit_memory``)."""
  from fedjax_gel.experiment import planning  # pylint: disable=g-import-not-at-top
  resident = planning.memory_limit() - exp.memory.free_bytes
  return resident + int((clients + 0.5) * exp.memory.client_bytes / planning.CHUNK_MEMORY_FRACTION)


REPO = pathlib.Path(__file__).resolve().parents[1]


def cli_run(*args):
  """The command ``launch/run.py args`` in this process (from the repository's root): its exit
  status and output, as a ``CompletedProcess``."""
  from fedjax_gel.experiment import cli  # pylint: disable=g-import-not-at-top
  out, err = io.StringIO(), io.StringIO()
  with contextlib.chdir(REPO), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = cli.main(['run.py', *args])
  return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def run_on_cpu_devices(script: str, token: str, count: int):
  """Runs ``script`` (Python source) in a fresh process that sees ``count`` CPU devices, with
  the suite's XLA flags kept (its programs compiled for compile time: tests/conftest.py); it
  must exit 0 and print ``token``."""
  env = dict(os.environ, JAX_PLATFORMS='cpu', PYTHONPATH=str(REPO),
             XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} "
                       f'--xla_force_host_platform_device_count={count}'.strip())
  out = subprocess.run([sys.executable, '-c', script], env=env, capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert token in out.stdout


def assert_one_line_error(proc, *names):
  """Exit status 2, no traceback, and one line on stderr holding every one of ``names``."""
  output = proc.stdout + proc.stderr
  assert proc.returncode == 2, output
  assert 'Traceback' not in output
  lines = proc.stderr.splitlines()
  assert len(lines) == 1 and lines[0].strip(), proc.stderr
  for name in names:
    assert name in lines[0], lines[0]


def read_events(path):
  """``(tag, step, value)`` of every scalar in a TensorBoard event file, reading its records
  (``uint64 length, uint32 crc, data, uint32 crc``) and their ``Event`` protocol buffers."""
  from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
  data, out, at = pathlib.Path(path).read_bytes(), [], 0
  while at < len(data):
    (length,) = struct.unpack('<Q', data[at:at + 8])
    event = event_pb2.Event.FromString(data[at + 12:at + 12 + length])
    at += 12 + length + 4
    for value in event.summary.value:
      out.append((value.tag, event.step, value.simple_value))
  return out


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def together(count: int, devices, args, *, wait: bool = True, own: dict | None = None):
  """Starts ``count`` processes of ``launch/run.py args`` as one run (JAX's multi-controller
  runtime, a fresh coordinator port) with ``devices`` CPU devices each (or ``devices[i]`` for
  process ``i``; process 0 last), ``own[i]`` more flags of process ``i``'s own; ``wait``:
  returns their ``(returncode, stdout, stderr)`` in process order, else the processes."""
  port = free_port()
  each = devices if isinstance(devices, (list, tuple)) else [devices] * count
  env = lambda i: {**os.environ, 'XLA_FLAGS': f"{os.environ.get('XLA_FLAGS', '')} "
                   f'--xla_force_host_platform_device_count={each[i]}'}
  procs = {i: subprocess.Popen(
      [sys.executable, 'launch/run.py', *args, *(own or {}).get(i, ()),
       f'--num_processes={count}', f'--process_id={i}',
       f'--coordinator_address=127.0.0.1:{port}'], cwd=REPO, env=env(i), text=True,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in reversed(range(count))}
  if not wait:
    return [procs[i] for i in range(count)]
  outs = {i: p.communicate(timeout=400) for i, p in procs.items()}
  return [(procs[i].returncode, *outs[i]) for i in range(count)]


def ours(text: str) -> list[str]:
  """The lines of ``text`` but gloo's own (``[Gloo] Rank i is connected to ... peer ranks``,
  sometimes cut in two by another thread's output, which can leave a line of nothing but
  whitespace: dropped too)."""
  return [l for l in text.splitlines()
          if l.strip() and '[Gloo]' not in l and 'peer ranks' not in l]
