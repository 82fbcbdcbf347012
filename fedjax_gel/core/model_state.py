"""Models with randomness and mutable state in the clients' local steps (dropout, BatchNorm).

A model may draw random numbers when it trains (Flax's rng streams, e.g. ``'dropout'``) and
keep *mutable collections* beside its parameters (e.g. BatchNorm's running statistics,
``'batch_stats'``): its variables are then ``models.Variables(params, state)``. Algorithms
optimise the parameters only; ``with_model_state`` wraps any ``FederatedAlgorithm`` so that

* every local step of client ``i`` trains the model in training mode (``train=True``) with a
  key of its own, ``fold_in(fold_in(ctx.key, MODEL_KEY), k)`` for step ``k`` (``ctx.key``
  derives from the seed, the round, the client and its cohort slot: ``core.keys``), one key
  per stream folded in by the stream's position; evaluation runs with ``train=False`` and no
  key;
* the model's state starts from what the server's *policy* says, is updated by every step the
  client takes (masked steps leave it), and ends the round as the policy says:

  ``average`` (FedAvg, McMahan et al. 2017, applied to the statistics as to the parameters):
  clients start from the server's state and upload their final state; the server's becomes
  their weighted mean ``sum_i w_i s_i / sum_i w_i``, the weights of the parameters' mean.

  ``local``: each client keeps its own state in a per-client store, a row per
  client (``core.store.by_client``, split over a mesh with the clients' data); a client starts
  from its row, or from the server's initial state the first time it is sampled, and writes
  its final state back. Nothing is uploaded. The global model is evaluated with the mean of
  the states of the clients sampled so far (a pooled test set belongs to no client); the
  initial state before any. These are local *statistics*, as SiloBN keeps them (Andreux et al.
  2020, "Siloed Federated Learning for Multi-Centric Histopathology Datasets"); FedBN (Li et
  al. 2021, "FedBN: Federated Learning on Non-IID Features via Local Batch Normalization")
  keeps the BatchNorm layers' scales and biases local too, which here are parameters the
  algorithm averages like the others.

  ``frozen``: the state is never changed: clients start from the server's initial state, their
  updates are dropped, and evaluation uses the initial state. (BatchNorm in training mode still
  normalises with each minibatch's statistics.)

The loss carries the state out of the step. The wrapper hands the inner ``client_step`` a
minibatch with one more entry, ``batch['model'] = ModelInputs(rng, state)``; the model's
loss (``models.task_loss``) reads it and, training a model with state, returns ``(loss,
new_state)``. An algorithm takes its gradients with ``value_and_grad`` / ``grad`` of this
module (``jax``'s, with ``has_aux`` when the batch asks for it) and returns the loss it got,
a ``StepLoss`` then, as ``client_step``'s second output. Every algorithm of
``fedjax_gel.algorithms`` does; an algorithm that takes ``jax.value_and_grad`` itself is refused
with one line when its model has state. The pre-pass of an algorithm (Mime's gradient at the
broadcast model) trains the model as a local step does (minibatch statistics, the key
``fold_in(fold_in(ctx.key, MODEL_KEY), PRE_PASS_STEP)``; the engine hands a pre-pass batch the
client's ``ctx.key`` as ``batch['key']``), reading the broadcast state and writing nothing.

A batch-statistics collection and ``--budget_unit=epochs`` are refused: an epoch's short last
minibatch is padded, and the statistics would take the padding in.

A model without streams or collections needs no wrapper: ``with_model_state`` returns the
algorithm itself, so runs of such models are the same programs as before.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_gel.core import store as store_lib
from fedjax_gel.core.algorithm import ClientContext, FederatedAlgorithm, RoundInfo

tree_map = jax.tree_util.tree_map

POLICIES = ('average', 'local', 'frozen')
MODEL_KEY = 0x6d6f64   # folded into a client's key for its model's draws (part of the
                       # reproducibility contract, as the purposes of ``core.keys``)
BATCH_ENTRY = 'model'  # the minibatch entry the wrapper adds
PRE_PASS_STEP = 2**31 - 1   # the pre-pass's step in its key (local steps count from 0)


class Variables(NamedTuple):
  """The variables of a model with mutable collections (``models.Variables``).

  Algorithms optimise the params; the server treats the state by a policy (``POLICIES``).

  Attributes:
    params: the trainable parameters.
    state: ``{collection: pytree}``, e.g. ``{'batch_stats': ...}``.
  """
  params: Any
  state: Any


class ModelInputs(NamedTuple):
  """What the wrapper adds to a minibatch (``batch['model']``) for the model's loss, which then
  trains the model (``train=True``).

  Attributes:
    rng: the step's key.
    state: the model's mutable collections (``{collection: pytree}``), or None for a model
      without.
  """
  rng: Any
  state: Any = None


class StepLoss(NamedTuple):
  """``value_and_grad``'s loss when the model's state changed in the step: the scalar loss and
  the new state."""
  value: jax.Array
  state: Any


def returns_state(batch) -> bool:
  """Whether a loss of ``batch`` returns ``(loss, new_state)``: a training step of a model with
  mutable collections."""
  inputs = batch.get(BATCH_ENTRY) if isinstance(batch, dict) else None
  return inputs is not None and inputs.state is not None


def value_and_grad(loss_fn: Callable) -> Callable:
  """``jax.value_and_grad(loss_fn)`` for a client's local step: ``(params, batch) -> (loss,
  grads)``, ``loss`` a ``StepLoss(value, new_state)`` when the step trained a model with state
  (``returns_state``). ``client_step`` returns that loss as it got it."""
  def fn(params, batch):
    if not returns_state(batch):
      return jax.value_and_grad(loss_fn)(params, batch)
    (value, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, batch)
    return StepLoss(value, state), grads
  return fn


def grad(loss_fn: Callable) -> Callable:
  """``jax.grad(loss_fn)``, dropping a new model state (see ``value_and_grad``)."""
  def fn(params, batch):
    if not returns_state(batch):
      return jax.grad(loss_fn)(params, batch)
    return jax.grad(loss_fn, has_aux=True)(params, batch)[0]
  return fn


class ModelClient(NamedTuple):
  inner: Any        # the algorithm's client state
  state: Any        # the model's state, or None
  key: jax.Array    # the client's model key this round
  step: jax.Array   # local steps taken (int32)


class ModelBroadcast(NamedTuple):
  inner: Any
  state: Any


class ModelServer(NamedTuple):
  """The wrapped server state: the algorithm's (its store moved to ``clients``), the model's
  state (the initial one under ``local`` and ``frozen``), and the per-client store, or None."""
  inner: Any
  state: Any
  clients: Any = None


class Rows(NamedTuple):
  """A row of the wrapped store: the algorithm's row (or None) and the client's model state
  with whether it was written (``local``; else None)."""
  inner: Any
  local: Any


class LocalRow(NamedTuple):
  state: Any
  written: jax.Array   # float32 1 once the client wrote its state


def check_budget_unit(model, budget_unit: str) -> None:
  """A ValueError (one line) for a model with batch statistics trained in epochs: an epoch's
  short last minibatch is padded, and the statistics would take the padding in."""
  if model.collections and budget_unit == 'epochs':
    raise ValueError(f'model {model.name!r} keeps {", ".join(map(repr, model.collections))}, '
                     "whose batch statistics would take in the padding rows of an epoch's short "
                     'last minibatch: --budget_unit=epochs is for models without (use steps)')


def with_model_state(algorithm: FederatedAlgorithm, model, policy: str | None = None,
                     num_clients: int | None = None) -> FederatedAlgorithm:
  """``algorithm`` training ``model`` with its rng streams and mutable collections.

  Args:
    algorithm: any algorithm whose loss is the model's (``models.task_loss``).
    model: a ``models.Model``; its ``rngs`` and ``collections`` say what it needs.
    policy: what the server does with the model's state, one of ``POLICIES`` (module
      docstring); needed, and only read, when the model has collections.
    num_clients: the population (``local``: a row per client).

  Returns ``algorithm`` itself for a model without streams or collections. A model with
  collections and no ``policy``, an unknown policy, ``local`` without ``num_clients`` or beside
  an algorithm whose own store is not a row per client are ValueErrors (one line).
  """
  rngs, collections = tuple(model.rngs), tuple(model.collections)
  unset = policy in (None, 'none')
  if not collections and not unset:
    raise ValueError(f'--model_state={policy}: model {model.name!r} keeps no mutable '
                     'collections (no BatchNorm statistics); leave --model_state=none')
  if not rngs and not collections:
    return algorithm
  if collections and policy not in POLICIES:
    raise ValueError(
        f'model {model.name!r} keeps the mutable collection{"s" * (len(collections) > 1)} '
        f'{", ".join(map(repr, collections))}; choose what the server does with '
        f'{"them" if len(collections) > 1 else "it"}: --model_state=average (FedAvg), local '
        '(per client, as SiloBN) or frozen' + ('' if unset else f' (got {policy!r})'))
  inner_store = algorithm.store_row is not None
  local = policy == 'local'
  if local and (num_clients is None or int(num_clients) < 1):
    raise ValueError('with_model_state: --model_state=local keeps a row per client and needs '
                     'the population (num_clients)')
  if local and inner_store and algorithm.store_row is not store_lib.by_client:
    raise ValueError(f'--model_state=local keeps a row per client, and {algorithm.name} keeps '
                     'its own store by another index (e.g. by cluster); choose average or frozen')
  stateful = inner_store or local

  def split_inner(state):
    """The algorithm's state and its store (None for an algorithm without)."""
    if not inner_store:
      return state, None
    return state._replace(clients=None), state.clients

  def server_init(variables):
    params, state = (variables.params, variables.state) if collections else (variables, None)
    inner, inner_rows = split_inner(algorithm.server_init(params))
    clients = None
    if stateful:
      local_rows = None
      if local:
        row = LocalRow(state, jnp.zeros((), jnp.float32))
        local_rows = store_lib.zeros(row, int(num_clients))
      clients = Rows(inner_rows, local_rows)
    return ModelServer(inner, state, clients)

  def joined(state: ModelServer):
    """The algorithm's own server state, its store put back."""
    if not inner_store:
      return state.inner
    return state.inner._replace(clients=state.clients.inner)

  def broadcast(state: ModelServer):
    return ModelBroadcast(algorithm.broadcast(joined(state)), state.state)

  def inner_ctx(ctx: ClientContext) -> ClientContext:
    return ctx._replace(stored=ctx.stored.inner if stateful else None)

  def client_init(bcast: ModelBroadcast, ctx: ClientContext):
    state = bcast.state
    if local:
      row = ctx.stored.local
      state = tree_map(lambda own, first: jnp.where(row.written > 0, own, first), row.state,
                       state)
    return ModelClient(algorithm.client_init(bcast.inner, inner_ctx(ctx)), state,
                       jax.random.fold_in(ctx.key, MODEL_KEY), jnp.zeros((), jnp.int32))

  def client_step(client: ModelClient, batch, bcast: ModelBroadcast):
    if 'mask' in batch:   # only an epoch's minibatches are masked
      check_budget_unit(model, 'epochs')
    batch = dict(batch, **{BATCH_ENTRY: ModelInputs(jax.random.fold_in(client.key, client.step),
                                                    client.state)})
    try:
      inner, loss = algorithm.client_step(client.inner, batch, bcast.inner)
    except TypeError as e:
      if collections and 'Gradient only defined for scalar-output functions' in str(e):
        raise TypeError(
            f'{algorithm.name}: model {model.name!r} has mutable state, whose loss returns '
            '(loss, new state); take its gradients with fedjax_gel.core.model_state.'
            'value_and_grad, not jax.value_and_grad') from e
      raise
    state = client.state
    if collections:
      if not isinstance(loss, StepLoss):
        raise TypeError(f'{algorithm.name}: client_step must return the loss '
                        'model_state.value_and_grad gave it (a StepLoss carrying the model\'s '
                        f'new state), got {type(loss).__name__}')
      loss, state = loss
    return ModelClient(inner, state, client.key, client.step + 1), loss

  def client_final(client: ModelClient, bcast: ModelBroadcast, ctx: ClientContext):
    out = algorithm.client_final(client.inner, bcast.inner, inner_ctx(ctx))
    upload, inner_row = out if inner_store else (out, None)
    if policy == 'average':
      upload = (upload, client.state)
    if not stateful:
      return upload
    local_row = LocalRow(client.state, jnp.ones((), jnp.float32)) if local else None
    return upload, Rows(inner_row, local_row)

  def server_update(state: ModelServer, upload, info: RoundInfo):
    inner_upload, model_upload = upload if policy == 'average' else (upload, None)
    inner, inner_rows = split_inner(algorithm.server_update(joined(state), inner_upload, info))
    clients = state.clients._replace(inner=inner_rows) if stateful else None
    return ModelServer(inner, model_upload if policy == 'average' else state.state, clients)

  def server_params(state: ModelServer):
    params = algorithm.server_params(joined(state))
    if not collections:
      return params
    return Variables(params, evaluated_state(state))

  def evaluated_state(state: ModelServer):
    if not local:
      return state.state
    rows = state.clients.local
    count = jnp.sum(rows.written)
    mean = lambda s: jnp.tensordot(rows.written, s.astype(jnp.float32), axes=1) / count
    return tree_map(lambda s, first: jnp.where(count > 0, mean(s), first).astype(first.dtype),
                    rows.state, state.state)

  def pre_pass_fn(bcast: ModelBroadcast, batch):
    batch = dict(batch)
    key = jax.random.fold_in(jax.random.fold_in(batch.pop('key'), MODEL_KEY), PRE_PASS_STEP)
    batch[BATCH_ENTRY] = ModelInputs(key, bcast.state)
    return algorithm.pre_pass_fn(bcast.inner, batch)

  def diagnostics(state: ModelServer, upload, info: RoundInfo):
    inner_upload = upload[0] if policy == 'average' else upload
    return algorithm.diagnostics(joined(state), inner_upload, info)

  def aggregate(state: ModelServer, upload_sum, info: RoundInfo, key):
    if policy in ('average', 'local'):   # averaged statistics the algorithm does not protect
      raise ValueError(f'{algorithm.name} aggregates its uploads itself (differential '
                       f'privacy); with --model_state={policy} the model\'s averaged '
                       'statistics would reach the released model unprotected: choose frozen')
    return algorithm.aggregate(joined(state), upload_sum, info, key)

  return algorithm._replace(
      server_init=server_init, broadcast=broadcast, client_init=client_init,
      client_step=client_step, client_final=client_final, server_update=server_update,
      server_params=server_params,
      pre_pass_fn=None if algorithm.pre_pass_fn is None else pre_pass_fn,
      client_model=lambda client: algorithm.client_model(client.inner),
      store_row=(algorithm.store_row if inner_store else
                 store_lib.by_client if local else None),
      diagnostics=None if algorithm.diagnostics is None else diagnostics,
      aggregate=None if algorithm.aggregate is None else aggregate)
