"""The algorithm interface: a value made of pure functions; the engine owns vmap, masks, chunks.

Modelled on FedJAX (an algorithm is init + apply, client work split into init / step / final) and
optax (pure functions, NamedTuple states). An algorithm never loops over clients: the engine vmaps
``client_init``, ``client_step`` and ``client_final`` over a chunk of clients, masks steps past each
client's budget, and hands ``server_update`` the weighted mean of the uploads.

Stateful algorithms (SCAFFOLD, FedDyn, AdaBest, FedVARP) keep a row per client in a store inside
their server state (field ``clients``, leaves ``[rows, ...]``); the engine gathers the cohort's
rows, hands each client its row, and writes back the rows clients return (``fedjax_gel.core.store``).

The interface lives in ``core`` with the engine that runs it: ``fedjax_gel.algorithms`` depends on
``core``, never the reverse.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax

PyTree = Any


class ClientContext(NamedTuple):
  """What a client knows about itself in a round (scalars; vmapped by the engine).

  Attributes:
    client_id: int32 population id.
    num_examples: int32 ``n_i``.
    budget: int32 ``tau_i``, local gradient steps this round.
    guesses: float32 ``tau'_i``, guessed steps after the budget (GeL: from
      ``FederatedAlgorithm.client_guesses``; 0 for other algorithms); may be ``inf``.
    weight: float32 unnormalised aggregation weight.
    key: PRNG key for the algorithm's own draws (independent of the data shuffle).
    pre_pass: the client's value of the algorithm's pre-pass (``FederatedAlgorithm.pre_pass``),
      computed by the engine at the broadcast model before local training; else None.
    stored: the client's row of the per-client store (stateful algorithms), else None.
  """
  client_id: jax.Array
  num_examples: jax.Array
  budget: jax.Array
  guesses: jax.Array
  weight: jax.Array
  key: jax.Array
  pre_pass: Any = None
  stored: Any = None


class RoundInfo(NamedTuple):
  """Cohort-level totals the engine passes to ``server_update``.

  Attributes:
    weight_total: ``sum_i w_i`` over the real clients.
    num_clients: the real clients in the cohort.
  """
  weight_total: jax.Array
  num_clients: jax.Array


class FederatedAlgorithm(NamedTuple):
  """A federated algorithm as pure functions.

  Attributes:
    name: display name.
    server_init: ``params -> server_state``.
    broadcast: ``server_state -> what every client receives`` (e.g. the model ``x``).
    client_init: ``(broadcast, ClientContext) -> client_state``.
    client_step: ``(client_state, batch, broadcast) -> (client_state, loss)``: one gradient step;
      gradients taken with ``core.model_state.value_and_grad`` and its loss returned as it came
      (for a model with mutable state it carries the new state: ``core.model_state``).
    client_final: ``(client_state, broadcast, ClientContext) -> upload`` (a pytree).
    server_update: ``(server_state, mean_upload, RoundInfo) -> server_state``, with
      ``mean_upload = sum_i w_i upload_i / sum_i w_i``.
    server_params: ``server_state -> params`` of the global model (for evaluation).
    pre_pass: per-client extras the algorithm asks the engine for: ``'none'``, ``'full_batch'``
      or ``'minibatch'``. Before local training the engine evaluates ``pre_pass_fn`` on each
      client's examples, all of them (``FULL_BATCH_ROWS`` at a time, a mean weighted by rows,
      counted as ``ceil(n_i / B)`` gradient computations) or its first local minibatch (the
      first step's, not counted again), and hands the result over as ``ClientContext.pre_pass``
      (Mime's gradient at the broadcast model, its "anchor").
    pre_pass_fn: ``(broadcast, batch) -> pytree``, a mean over the batch's real rows
      (``batch['mask']``) at the broadcast model; needed when ``pre_pass != 'none'``.
    client_model: ``client_state -> the client's model``, for the spread of client models
      (mean pairwise cosine distance) the engine reports.
    store_row: ``None`` for an algorithm without per-client state. Otherwise ``client_ids ->
      rows`` (``core.store.by_client``, one row per client, which a mesh splits with the
      clients' data; or e.g. a cluster id) and the algorithm is *stateful*: its server
      state is a NamedTuple with a field ``clients``, the store (leaves ``[rows, ...]``); each
      client reads its row as ``ClientContext.stored`` and its ``client_final`` returns
      ``(upload, new_row)``. ``server_update`` sees the store as it was before the round; the
      engine then writes into the store ``server_update`` returns, for every row that real clients
      (sampled, with data) wrote, the mean of what they wrote. Other rows keep their values.
    diagnostics: ``None``, or ``(server_state, mean_upload, RoundInfo) -> {name: scalar}``: the
      algorithm's own per-round metrics (e.g. FedExP's server step size), computed from what
      ``server_update`` receives; the engine returns them in ``RoundMetrics.diagnostics`` and
      the experiment's records carry the last round's values under their names.
    aggregate: ``None``: the server averages the uploads, ``sum_i w_i upload_i / sum_i w_i``,
      and keeps its state in a round without clients. Otherwise ``(server_state, upload_sum,
      RoundInfo, key) -> mean_upload`` from the weighted sum over every chunk and device, with
      the round's server key (``core.keys.SERVER``), called in every round, with clients or
      not: client-level differential privacy's noised fixed-denominator mean
      (``fedjax_gel.privacy.private``).
    client_guesses: ``None`` for an algorithm without guessed steps. Otherwise ``(budgets,
      max_budget) -> tau'_i``: the round asks it for every client's guess count (float32
      ``[C]`` from the cohort's budgets ``[C]`` and the largest budget ``b`` of its spec) and
      hands it over as ``ClientContext.guesses`` (GeL; ``fedjax_gel.algorithms.GuessPolicy``).
  """
  name: str
  server_init: Callable[[PyTree], PyTree]
  broadcast: Callable[[PyTree], PyTree]
  client_init: Callable[[PyTree, ClientContext], PyTree]
  client_step: Callable[[PyTree, PyTree, PyTree], tuple[PyTree, jax.Array]]
  client_final: Callable[[PyTree, PyTree, ClientContext], PyTree]
  server_update: Callable[[PyTree, PyTree, RoundInfo], PyTree]
  server_params: Callable[[PyTree], PyTree]
  pre_pass: str = 'none'
  pre_pass_fn: Optional[Callable[[PyTree, PyTree], PyTree]] = None
  client_model: Callable[[PyTree], PyTree] = lambda state: state.params
  store_row: Optional[Callable[[jax.Array], jax.Array]] = None
  client_guesses: Optional[Callable[[jax.Array, int], jax.Array]] = None
  diagnostics: Optional[Callable[[PyTree, PyTree, RoundInfo], dict]] = None
  aggregate: Optional[Callable[[PyTree, PyTree, RoundInfo, jax.Array], PyTree]] = None
