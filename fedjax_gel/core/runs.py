"""R independent runs as one compiled program: the round vmapped over runs.

A group of seeds, a learning-rate grid and a grid over any other float hyper-parameter are one
thing here: runs that share the data, the model and every shape, each with its own root key
(its seed) and its own values of the hyper-parameters that differ between them. Those values
are *data*: ``hparams`` is a dict ``name -> [R]`` array, an argument of the program, and the
algorithm is built from them inside the vmapped function (optax and the algorithms take arrays
wherever they take a float). Hyper-parameters the runs share stay constants of the program, so a
batch of seeds compiles to the same arithmetic as one run of it.

Every run of a batch draws its own cohorts, budgets and shuffles from its own root key, exactly
as its separate run would: ``jax.vmap`` changes how the work is laid out, not the values (up to
float summation order in batched matrix products).

A batch of one needs no ``vmap``: ``build_runs(..., batched=False)`` gives the same functions on
one run's unstacked state, which is also the path for a mesh of devices and for samplers that
read the model (power-of-d).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax

from fedjax_gel.core.algorithm import FederatedAlgorithm
from fedjax_gel.core.backend import Backend
from fedjax_gel.core.round import build_round


class RunsProgram(NamedTuple):
  """The compiled pieces of R runs (``[R]`` leading axes when ``batched``).

  * ``init(roots, hparams) -> states``: each run's server state from its own initial model;
  * ``sample(roots, r, reads) -> cohorts``: each run's cohort of round ``r`` (a sampler that
    ranks clients by loss reads ``(the run's server model, the training pool)``; the others
    take ``None``);
  * ``round(states, hparams, cohorts, data, roots, r) -> (states, RoundMetrics)``;
  * ``server_params(states, hparams) -> params``: the runs' server models.
  """
  init: Callable
  sample: Callable
  round: Callable
  server_params: Callable
  batched: bool


def build_runs(make_algorithm: Callable[[dict], FederatedAlgorithm],
               init_params: Callable[[jax.Array], object],
               sample: Callable, *, chunk_size: int,
               batched: bool = True, shared_key: bool = False, mesh=None,
               donate_state: bool = True, backend: Backend = Backend(),
               client_distance: bool = False) -> RunsProgram:
  """The functions that train R runs as one program.

  Args:
    make_algorithm: ``hparams -> FederatedAlgorithm`` (``hparams``: a dict of scalars, empty when
      the runs differ only in their seeds).
    init_params: ``root key -> initial model parameters``.
    sample: ``(root key, round, reads) -> Cohort``; ``reads``: ``(server params, training
      pool)`` for a sampler that ranks clients by loss, else ``None``.
    chunk_size: clients vmapped together within each run (``build_round``).
    batched: vmap over a leading run axis; ``False``: one run, no run axis (a mesh needs this).
    shared_key: the runs share one root key (one seed: a grid over hyper-parameters), so they
      share their initial model and every cohort, which is sampled once and broadcast to the
      runs (``roots`` is then one key, and ``sample`` returns one cohort).
    mesh: devices for one run's cohort (``build_round``); only when not ``batched``.
    donate_state: the round reuses the buffers of the states it is given.
    backend: how ``init``, ``sample`` and ``round`` are compiled (``build_round``'s;
      ``server_params``, a trivial program also called inside other traces, takes XLA's
      defaults).
    client_distance: the rounds measure the client distance (``build_round``'s).
  """
  if backend.debug:
    raise ValueError('build_runs: the debug backend runs one round at a time (build_round)')
  jit = backend.jit
  def init(root, hp):
    return make_algorithm(hp).server_init(init_params(root))

  def server_params(state, hp):
    return make_algorithm(hp).server_params(state)

  if not batched:   # one run: its hyper-parameters are constants (``hparams`` is ``{}``)
    return RunsProgram(jit(init), jit(sample), _OneRun(build_round(
        make_algorithm({}), chunk_size=chunk_size, mesh=mesh, donate_state=donate_state,
        backend=backend, client_distance=client_distance)), jax.jit(server_params), False)

  def one_round(state, hp, cohort, data, root, r):
    # traced inside the vmapped program, whose options are the outer jit's
    return build_round(make_algorithm(hp), chunk_size=chunk_size,
                       backend=backend._replace(compiler_options=None),
                       client_distance=client_distance)(
        state, cohort, data, root, r)

  def init_runs(roots, hp):
    # One run after another (``lax.map``), not ``vmap``: XLA's CPU runtime (JAX 0.10.2) can
    # deadlock, at random, on a vmapped Flax LSTM initialisation (the Shakespeare model hung
    # forever on about half the tries); the initialisation runs once, so its speed is moot.
    if shared_key:
      return jax.lax.map(lambda h: init(roots, h), hp)
    return jax.lax.map(lambda a: init(*a), (roots, hp))

  per_run = None if shared_key else 0   # the axis of roots and cohorts
  return RunsProgram(
      jit(init_runs),
      jit(sample if shared_key else jax.vmap(sample, in_axes=(0, None, None))),
      jit(jax.vmap(one_round, in_axes=(0, 0, per_run, None, per_run, None)),
          donate_argnums=(0,) if donate_state else ()),
      jax.jit(jax.vmap(server_params)), True)


class _OneRun:
  """One run's round with the batched round's signature (``hparams`` ignored: ``{}``)."""

  def __init__(self, round_fn):
    self.round_fn = round_fn

  def __call__(self, state, hparams, cohort, data, root, r):
    del hparams
    return self.round_fn(state, cohort, data, root, r)

  def lower(self, state, hparams, cohort, data, root, r):
    del hparams
    return _Lowered(self.round_fn.lower(state, cohort, data, root, r))


class _Lowered:

  def __init__(self, lowered):
    self.lowered = lowered

  @property
  def out_info(self):
    return self.lowered.out_info

  def compile(self):
    compiled = self.lowered.compile()
    return lambda state, hparams, cohort, data, root, r: compiled(state, cohort, data, root, r)


def run_slice(tree, i: int, batched: bool):
  """Run ``i``'s part of a batched pytree (the tree itself when not ``batched``)."""
  return jax.tree.map(lambda a: a[i], tree) if batched else tree
