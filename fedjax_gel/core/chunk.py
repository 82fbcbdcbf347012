"""The chunk stage of a round: one chunk of clients' local work, vmapped, and what it adds to
the round's running sums (``ChunkTotals``).

A chunk's clients each take up to ``tau_i`` local steps; a client with ``k >= tau_i`` is masked
(``masked``: every leaf of its state is ``where(k < tau_i, new, old)``, as ``optax.MultiSteps``
does), so a masked step is an exact no-op, and with equal budgets no step is masked at all (see
``core.round``). Minibatch ``k`` of client ``i`` is gathered inside the step from the pool.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_gel.core import keys
from fedjax_gel.core.algorithm import ClientContext, FederatedAlgorithm
from fedjax_gel.core.federated_data import FederatedData, gather_rows
from fedjax_gel.core.pre_pass import pre_pass_values
from fedjax_gel.core.shuffle import data_order, examples_seen, minibatch_rows
from fedjax_gel.core.spread import model_spread

tree_map = jax.tree_util.tree_map


class ChunkWork(NamedTuple):
  """What one chunk's clients did (leading axis: the chunk's clients)."""
  upload: Any
  weights: jax.Array
  budgets: jax.Array
  mean_loss: jax.Array
  real: jax.Array
  trips: jax.Array
  model_spread: Any            # (sum_i e_i, sum_i ||e_i||^2), e_i = u_i - u_ref (core.spread);
                               # () unless the round measures the client distance
  pre_pass_grads: jax.Array    # gradient computations of the pre-pass
  pre_pass_examples: jax.Array
  examples: jax.Array          # examples each client's steps put through a gradient
  new_rows: Any = None         # stateful algorithms: the rows the clients write back


class ChunkTotals(NamedTuple):
  """What a chunk adds to the round's running sums (the chunks' totals add leaf by leaf)."""
  upload_sum: Any              # sum_i w_i upload_i, float32
  spread: Any                  # model_spread's sums
  weight: jax.Array            # sum_i w_i
  clients: jax.Array           # real clients (float32)
  loss_sum: jax.Array          # sum_i w_i mean_k loss_ik over the clients that stepped
  loss_weight: jax.Array       # their sum_i w_i
  grad_computations: jax.Array  # sum_i tau_i + the pre-pass's
  examples: jax.Array          # examples through a gradient, the pre-pass's included
  computed_steps: jax.Array    # client-steps the chunk ran, masked ones included


def masked(active, new, old):
  """``where(active, new, old)`` leaf by leaf; ``active`` is ``[chunk]``, leaves ``[chunk, ...]``."""
  def pick(n, o):
    return jnp.where(active.reshape(active.shape + (1,) * (n.ndim - 1)), n, o)
  return tree_map(pick, new, old)


def steps_taken(spec, budgets, real) -> jax.Array:
  """The local steps ``tau_i`` the clients take: ``b`` for every ``real`` client with equal
  budgets (whatever a hand-made cohort's array says), else its budget capped at ``b``; 0 for
  padding and clients without data."""
  return jnp.where(real, spec.max_budget if spec.equal_budgets else
                   jnp.minimum(budgets, spec.max_budget), 0)


def chunk_kernels(algorithm: FederatedAlgorithm, spec, backend, static_trips: bool,
                  drift: bool = False):
  """``(train_chunk, chunk_totals)`` for the cohorts of ``spec`` (a ``CohortSpec``: minibatches
  of ``B``, budgets up to ``max_budget``, whose ``max_budget B`` sizes the data-order buffer);
  ``static_trips``: every chunk loops ``max_budget`` steps, else to its own largest budget;
  ``drift``: the chunk's model spread (``core.spread``) for the round's client distance.

  ``train_chunk(bcast, data, client_key_root, (clients, stored rows)) -> ChunkWork``;
  ``chunk_totals(same) -> (ChunkTotals, (new rows, real))``. A round traces each once: the
  shapes it needs beside its loop hit jit's trace cache, and ``inline`` puts the jaxpr where it
  is used, so the program is the one a plain call gives."""
  stateful = algorithm.store_row is not None

  @functools.partial(jax.jit, inline=True)
  def train_chunk(bcast, data: FederatedData, client_key_root, chunk) -> ChunkWork:
    """Local work of one chunk; uploads and weights of padding and data-less clients are 0."""
    cohort, stored = chunk
    n = data.counts[cohort.client_ids]
    offsets = data.offsets[cohort.client_ids]
    ckeys = jax.vmap(lambda i, s: keys.client_key(client_key_root, i, s))(cohort.client_ids,
                                                                          cohort.slots)
    shuffle_keys, algo_keys = jax.vmap(lambda k: tuple(jax.random.split(k)))(ckeys)
    pool_rows = jax.tree.leaves(data.examples)[0].shape[0]   # bounds every client's n
    rows = offsets[:, None] + data_order(spec, shuffle_keys, n, pool_rows)
    real = cohort.valid & (n > 0)                          # clients without data take no step
    budgets = steps_taken(spec, cohort.budgets, real)
    extra, extra_grads, extra_examples = None, jnp.int32(0), jnp.int32(0)
    if algorithm.pre_pass != 'none':
      extra, extra_grads, extra_examples = pre_pass_values(algorithm, spec, bcast, data, n,
                                                           offsets, rows, real, algo_keys)
    ctx = ClientContext(client_id=cohort.client_ids, num_examples=n, budget=budgets,
                        guesses=jnp.where(real, cohort.guesses, 0.), weight=cohort.weights,
                        key=algo_keys, pre_pass=extra, stored=stored)
    state = jax.vmap(algorithm.client_init, in_axes=(None, 0))(bcast, ctx)
    start = jax.vmap(algorithm.client_model)(state) if drift else None
    step = backend.step(jax.vmap(algorithm.client_step, in_axes=(0, 0, None)))

    def local_step(k, carry):
      state, loss_sum = carry
      idx, mask = minibatch_rows(spec, rows, k, n)
      batch = gather_rows(data.examples, idx)     # [chunk, B, ...]
      if mask is not None:
        batch['mask'] = mask
      new_state, loss = step(state, batch, bcast)
      active = k < budgets
      if not spec.equal_budgets:   # equal budgets: no real client is ever masked
        new_state = masked(active, new_state, state)
      return new_state, loss_sum + jnp.where(active, loss, 0.)

    # A static trip count (a loop XLA knows the length of) or the chunk's own largest budget
    # (a data-dependent while loop: fewer masked steps, one predicate read per step).
    trips = spec.max_budget if static_trips else jnp.max(budgets)
    state, loss_sum = jax.lax.fori_loop(0, trips, local_step, (state, jnp.zeros(n.shape)))
    upload = jax.vmap(algorithm.client_final, in_axes=(0, None, 0))(state, bcast, ctx)
    new_rows = None
    if stateful:
      upload, new_rows = upload
      new_rows = masked(real, new_rows, stored)
    upload = masked(real, upload, tree_map(jnp.zeros_like, upload))   # no NaN from padding
    return ChunkWork(
        upload=upload, weights=jnp.where(real, cohort.weights, 0.), budgets=budgets,
        mean_loss=loss_sum / jnp.maximum(budgets, 1), real=real,
        trips=jnp.asarray(trips, jnp.int32),
        model_spread=(model_spread(jax.vmap(algorithm.client_model)(state), start, real)
                      if drift else ()),
        pre_pass_grads=extra_grads, pre_pass_examples=extra_examples,
        examples=examples_seen(spec, budgets, n), new_rows=new_rows)

  @functools.partial(jax.jit, inline=True)
  def chunk_totals(bcast, data, client_key_root, chunk):
    """One chunk's ``ChunkTotals``, and its new rows and real-client mask (``None`` rows for
    an algorithm without a store)."""
    work = train_chunk(bcast, data, client_key_root, chunk)
    w, budgets = work.weights, work.budgets
    w_trained = jnp.where(budgets > 0, w, 0.)
    totals = ChunkTotals(
        upload_sum=tree_map(lambda u: jnp.tensordot(w, u.astype(jnp.float32), axes=1),
                            work.upload),
        spread=work.model_spread, weight=jnp.sum(w),
        clients=jnp.sum(work.real).astype(jnp.float32),
        loss_sum=jnp.sum(w_trained * work.mean_loss), loss_weight=jnp.sum(w_trained),
        grad_computations=jnp.sum(budgets) + work.pre_pass_grads,
        examples=jnp.sum(work.examples) + work.pre_pass_examples,
        computed_steps=work.trips * budgets.shape[0])
    return totals, (work.new_rows, work.real)

  return train_chunk, chunk_totals


def upload_types(train_chunk, bcast, data, client_key_root, chunk):
  """One client's upload (shapes and dtypes) from ``train_chunk``'s output on ``chunk``: a hit
  in jit's trace cache where the round already traced that chunk, in the same context."""
  work = jax.eval_shape(train_chunk, bcast, data, client_key_root, chunk)
  return tree_map(lambda u: jax.ShapeDtypeStruct(u.shape[1:], u.dtype), work.upload)
