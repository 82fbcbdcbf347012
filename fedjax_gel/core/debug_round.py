"""The debug backend: a round with its clients one by one, in a plain Python loop, eagerly.

``debug_round(algorithm, server_state, cohort, data, root_key, round_idx)`` computes what
``build_round``'s round computes, written as the algorithm's definition reads: for each client
of the cohort its key, its data order, its pre-pass, ``tau_i`` calls of ``client_step`` on its
minibatches and its upload, then the weighted mean of the uploads, the server update, the store
write and the metrics. No ``vmap``, no chunks, no masks, no ``jit``: a ``print`` or a breakpoint
inside an algorithm's functions stops at every client and step, and the tests take it as the
reference the vmapped round must agree with (``tests/core/test_debug_round.py``; up to float
summation order). ``build_round(..., backend=Backend(debug=True))`` returns it as a round
function. It is slow (every operation dispatched on its own): a handful of clients and steps.

Its metrics are the round's, except ``computed_steps``, which counts the steps the clients took
(the vmapped round also counts the masked ones of its chunks); ``client_distance`` is computed
from its definition, ``mean_{i<j} (1 - cos(y_i, y_j))`` over the real clients' final models.
"""
from __future__ import annotations

import itertools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from fedjax_gel.core import keys
from fedjax_gel.core import store as store_lib
from fedjax_gel.core.algorithm import ClientContext, FederatedAlgorithm, RoundInfo
from fedjax_gel.core.chunk import steps_taken
from fedjax_gel.core.federated_data import FederatedData, gather_rows
from fedjax_gel.core.round import (RoundMetrics, all_finite, cohort_guesses, kept_without_clients,
                                   tree_bytes)
from fedjax_gel.core.sampling import Cohort, check_cohort
from fedjax_gel.core.shuffle import data_order, examples_seen, minibatch_rows

tree_map = jax.tree_util.tree_map


class ClientWork(NamedTuple):
  """What one client did."""
  upload: Any
  row: Any                  # the row it writes back (stateful algorithms), else None
  mean_loss: jax.Array      # mean of its minibatch losses (0 without a step)
  model: Any                # its final model
  steps: int                # tau_i
  pre_pass_grads: int       # gradient computations of its pre-pass
  pre_pass_examples: int


def client_pre_pass(algorithm: FederatedAlgorithm, spec, bcast, data: FederatedData, client,
                    rows, key):
  """One client's pre-pass value, gradient computations and examples: its first minibatch (of
  its data order ``rows``), or all of its examples as one batch."""
  b, n = spec.batch_size, int(data.counts[client])
  if algorithm.pre_pass == 'minibatch':
    first = jnp.arange(b) < (n if spec.budget_unit == 'epochs' else b)
    return algorithm.pre_pass_fn(bcast, dict(gather_rows(data.examples, rows[:b]), mask=first,
                                             key=key)), 0, 0
  everything = gather_rows(data.examples, data.offsets[client] + jnp.arange(n))
  return (algorithm.pre_pass_fn(bcast, dict(everything, mask=jnp.ones((n,), bool), key=key)),
          -(-n // b), n)


def train_client(algorithm: FederatedAlgorithm, spec, bcast, data: FederatedData, client, slot,
                 budget, weight, guess, key_root, stored) -> ClientWork:
  """One client's local work."""
  n, offset = data.counts[client], data.offsets[client]
  shuffle_key, key = jax.random.split(keys.client_key(key_root, client, slot))
  pool_rows = jax.tree.leaves(data.examples)[0].shape[0]
  rows = offset + data_order(spec, shuffle_key[None], n[None], pool_rows)[0]
  tau = int(steps_taken(spec, budget, n > 0))
  extra, grads, seen = None, 0, 0
  if algorithm.pre_pass != 'none':
    extra, grads, seen = client_pre_pass(algorithm, spec, bcast, data, client, rows, key)
  ctx = ClientContext(client_id=client, num_examples=n, budget=jnp.int32(tau), guesses=guess,
                      weight=weight, key=key, pre_pass=extra, stored=stored)
  state = algorithm.client_init(bcast, ctx)
  losses = []
  for k in range(tau):
    idx, mask = minibatch_rows(spec, rows[None], k, n[None])
    batch = gather_rows(data.examples, idx[0])
    if mask is not None:
      batch['mask'] = mask[0]
    state, loss = algorithm.client_step(state, batch, bcast)
    losses.append(loss)
  upload = algorithm.client_final(state, bcast, ctx)
  upload, row = upload if algorithm.store_row is not None else (upload, None)
  mean_loss = jnp.mean(jnp.stack(losses)) if losses else jnp.float32(0.)
  return ClientWork(upload=upload, row=row, mean_loss=mean_loss,
                    model=algorithm.client_model(state), steps=tau, pre_pass_grads=grads,
                    pre_pass_examples=seen)


def debug_round(algorithm: FederatedAlgorithm, server_state, cohort: Cohort, data: FederatedData,
                root_key, round_idx):
  """One round, client by client (the module's doc); returns ``(server_state, RoundMetrics)``."""
  spec = cohort.spec
  bcast = algorithm.broadcast(server_state)
  key_root = keys.round_key(root_key, round_idx, keys.CLIENT)
  guesses = cohort_guesses(algorithm, cohort, data)
  done = []   # (client, weight, ClientWork) of the clients with examples
  for slot in range(cohort.budgets.shape[0]):
    client = cohort.client_ids[slot]
    if int(data.counts[client]) == 0 or not bool(cohort.taking_part[slot]):
      continue   # no examples, or an absent slot: no step, no weight
    done.append((client, cohort.weights[slot], train_client(
        algorithm, spec, bcast, data, client, jnp.int32(slot), cohort.budgets[slot],
        cohort.weights[slot], guesses[slot], key_root,
        store_lib.rows_of(algorithm, server_state, client))))
  works = [work for _, _, work in done]

  weight = sum((float(w) for _, w, _ in done), 0.)
  if done:
    upload_like = works[0].upload
  else:   # no client with data: an upload's structure, from a client of the pool with some
    other = jnp.argmax(data.counts > 0).astype(jnp.int32)
    upload_like = train_client(algorithm, spec, bcast, data, other, jnp.int32(0),
                               cohort.budgets[0], cohort.weights[0], guesses[0], key_root,
                               store_lib.rows_of(algorithm, server_state, other)).upload
  info = RoundInfo(weight_total=jnp.float32(weight), num_clients=jnp.float32(len(done)))
  total = tree_map(lambda u: jnp.zeros(u.shape, jnp.float32), upload_like)
  for _, w, work in done:   # sum_i w_i upload_i, in float32
    total = tree_map(lambda t, u: t + w * u.astype(jnp.float32), total, work.upload)
  if algorithm.aggregate is None:
    mean_upload = tree_map(lambda t, u: (t / weight if weight > 0 else 0. * t).astype(u.dtype),
                           total, upload_like)
  else:
    mean_upload = tree_map(lambda m, u: m.astype(u.dtype), algorithm.aggregate(
        server_state, total, info, keys.round_key(root_key, round_idx, keys.SERVER)),
                           upload_like)
  diagnostics = ({} if algorithm.diagnostics is None else
                 algorithm.diagnostics(server_state, mean_upload, info))
  stepped = algorithm.server_update(server_state, mean_upload, info)
  new_state = (stepped if algorithm.aggregate is not None else
               kept_without_clients(jnp.asarray(weight > 0), stepped, server_state))
  if algorithm.store_row is not None and done:
    rows = jnp.stack([jnp.asarray(algorithm.store_row(c)) for c, _, _ in done])
    new = tree_map(lambda *r: jnp.stack(r), *[work.row for work in works])
    new_state = new_state._replace(clients=store_lib.write_mean(
        new_state.clients, rows, new, jnp.ones((len(done),), bool)))

  trained = [(float(w), work) for _, w, work in done if work.steps > 0]
  loss_weight = sum(w for w, _ in trained)
  train_loss = (sum(w * float(work.mean_loss) for w, work in trained) / loss_weight
                if loss_weight > 0 else float('nan'))
  models = [ravel_pytree(work.model)[0].astype(jnp.float32) for work in works]
  distances = [1. - float(jnp.dot(a, b) / (jnp.linalg.norm(a) * jnp.linalg.norm(b)))
               for a, b in itertools.combinations(models, 2)]
  return new_state, RoundMetrics(
      train_loss=jnp.float32(train_loss),
      grad_computations=jnp.int32(sum(w.steps + w.pre_pass_grads for w in works)),
      examples=jnp.int32(sum(int(examples_seen(spec, jnp.int32(work.steps), data.counts[c])) +
                             work.pre_pass_examples for c, _, work in done)),
      computed_steps=jnp.int32(sum(w.steps for w in works)),
      uploaded_bytes=jnp.float32(len(done) * tree_bytes(upload_like)),
      downloaded_bytes=jnp.float32(len(done) * tree_bytes(bcast)),
      client_distance=jnp.float32(np.mean(distances) if distances else 0.),
      num_clients=jnp.float32(len(done)),
      finite=all_finite(algorithm.server_params(new_state)) & jnp.asarray(
          loss_weight == 0 or bool(np.isfinite(train_loss))),
      diagnostics={k: jnp.asarray(v, jnp.float32) for k, v in diagnostics.items()})


class DebugRound:
  """``debug_round`` as a round function (``build_round``'s with ``Backend(debug=True)``): the
  round's checks of the cohort and the store first; nothing to compile (no ``lower``)."""

  def __init__(self, algorithm: FederatedAlgorithm):
    self.algorithm = algorithm

  def __call__(self, server_state, cohort: Cohort, data: FederatedData, root_key, round_idx):
    check_cohort(cohort, data.num_clients)
    if self.algorithm.store_row is not None:
      store_lib.check_rows(self.algorithm, server_state.clients, data.num_clients)
    return debug_round(self.algorithm, server_state, cohort, data, root_key, round_idx)
