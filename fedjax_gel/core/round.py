"""One federated round as one jitted function.

``round_fn(server_state, cohort, data, root_key, round_idx) -> (server_state, RoundMetrics)``

* Clients are vmapped over a stacked pytree (leading client axis).
* Local steps are a loop over step ``k``; a client with ``k >= tau_i`` is *masked*: every leaf of
  its state is ``where(k < tau_i, new, old)`` (as ``optax.MultiSteps`` does), so a masked step is an
  exact no-op. Clients without examples take no step and carry no weight. With equal budgets
  (``CohortSpec.equal_budgets``: ``a = b`` steps) every client with examples takes ``b`` steps
  (a hand-made cohort's ``budgets`` are not read; give a spec with ``a < b`` for other
  budgets, 0 included), so no step is masked: the padding clients and those without examples
  step too, on rows of the pool, and everything they return is dropped (``real``). The
  per-step select made XLA's CPU fusion read the old momentum beside the new one (a copy of it
  every step, and the weight gradient computed in both fusions); without it the round is
  1.03-1.07x faster at 20 clients and 1.11-1.26x at 200 (``benchmarks/RESULTS.md``).
* ``server_update`` receives ``sum_i w_i upload_i / sum_i w_i`` (summed in float32, cast back to
  the upload's dtype). A round whose total weight is 0 (no client with data and weight took
  part) leaves the server state as it was (``kept_without_clients``): a server optimiser's
  momentum or FedDyn's ``h`` would otherwise move the model on no one's update.
* The cohort is sorted by ``tau_i`` and cut into chunks of ``chunk_size`` clients (static); a scan
  runs over chunks, each chunk loops to its own largest ``tau_i`` (on CPU with budgets that
  differ; else ``b`` steps, a count fixed at compile time: ``static_steps``) and adds
  ``sum_i w_i upload_i`` into running sums. Peak memory is O(chunk_size x model), and the result
  does not depend on ``chunk_size`` (up to float summation order). Stateful algorithms add
  O(cohort x row) for the gathered and the written rows.
* Devices (owner computes): with a mesh, the data pool and a per-client store are split by
  client over the mesh axis ``'clients'`` (``federated_data.to_device(data, mesh)``,
  ``store.place_state``); the cohort is routed to the devices that own its clients (``route``),
  each device runs its own clients' chunks (at most ``routed_chunk`` clients each, only the
  chunks that hold clients) on its own examples and rows, and the weighted sums meet in one
  ``psum``. One code path for the cores of a CPU, many GPUs, many processes or a TPU slice.
  Where every device holds the whole pool (``to_device(data, mesh, replicate=True)``, the
  planner's choice for a pool that fits, ``experiment.planning.replicate_pool``), the cohort is
  dealt to the devices by budget instead (``deal``): a device's share of a small cohort then
  does not depend on which clients were drawn. Routed to their owners, 20 clients over 2
  devices split as Binomial(20, 1/2), 11.8 on the busier device on average, and the other
  device waited for it (GeL's FEMNIST CNN and the Shakespeare LSTM at 20 clients: rounds
  1.10-1.15x faster dealt, ``benchmarks/RESULTS.md``).
* Per-client state (stateful algorithms, ``FederatedAlgorithm.store_row``): the cohort's rows
  are gathered from the store in the server state before the chunks run, travel with them, and
  the rows the clients return are written back after ``server_update`` (``core.store``).
* Minibatch ``k`` of client ``i`` is gathered inside the step:
  ``pool[offsets[i] + perm_i[(k B + j) mod n_i]]``; the ``[C, tau, B, ...]`` cohort tensor is never
  built.
"""
from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from fedjax_gel.core.algorithm import ClientContext, FederatedAlgorithm, RoundInfo
from fedjax_gel.core import federated_data, keys
from fedjax_gel.core import store as store_lib
from fedjax_gel.core.backend import Backend
from fedjax_gel.core.checks import positive_int
from fedjax_gel.core.devices import CLIENT_AXIS
from fedjax_gel.core.federated_data import FederatedData, gather_rows
from fedjax_gel.core.sampling import Cohort, check_cohort
from fedjax_gel.core.shuffle import data_order, examples_seen, minibatch_rows
from fedjax_gel.core.spread import mean_pairwise_cosine_distance, model_spread

tree_map = jax.tree_util.tree_map


class RoundMetrics(NamedTuple):
  """Per-round totals (scalars)."""
  train_loss: jax.Array        # sum_i w_i mean_k loss_ik / sum_i w_i (minibatch losses; NaN
                               # when no client with weight took a step)
  grad_computations: jax.Array  # sum_i tau_i minibatch gradients, + full pre-passes (ceil(n_i/B))
  examples: jax.Array          # examples through a gradient: sum_i tau_i B, + pre-pass examples
  computed_steps: jax.Array    # client-steps the chunks ran, masked ones included
  uploaded_bytes: jax.Array    # bytes the real clients uploaded
  downloaded_bytes: jax.Array  # bytes the real clients downloaded
  client_distance: jax.Array   # mean pairwise cosine distance of the clients' final models
  num_clients: jax.Array       # real clients (sampled, with data)
  finite: jax.Array            # the new server model holds no NaN or infinity, and the train
                               # loss is finite where a client took a step (a loss of NaN with
                               # a finite model: e.g. labels beyond the model's classes)
  diagnostics: Any = None      # the algorithm's own metrics ({name: scalar}; {} without)


FULL_BATCH_ROWS = 128   # rows per step of a full-batch pre-pass


class ChunkWork(NamedTuple):
  """What one chunk's clients did (leading axis: the chunk's clients)."""
  upload: Any
  weights: jax.Array
  budgets: jax.Array
  mean_loss: jax.Array
  real: jax.Array
  trips: jax.Array
  model_spread: Any            # (sum_i e_i, sum_i ||e_i||^2), e_i = u_i - u_ref (see below)
  pre_pass_grads: jax.Array    # gradient computations of the pre-pass
  pre_pass_examples: jax.Array
  examples: jax.Array          # examples each client's steps put through a gradient
  new_rows: Any = None         # stateful algorithms: the rows the clients write back


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


class Clients(NamedTuple):
  """The per-client inputs of the chunks, each ``[num_chunks, chunk_size]``."""
  client_ids: jax.Array
  budgets: jax.Array
  weights: jax.Array
  guesses: jax.Array
  slots: jax.Array     # positions in the sampled cohort (for the clients' keys)
  valid: jax.Array     # real clients (not padding)


def pad_and_sort(cohort: Cohort, guesses, num_chunks: int, chunk_size: int) -> Clients:
  """Pads the cohort to ``num_chunks * chunk_size`` with empty clients, sorts it by budget and
  cuts it into ``[num_chunks, chunk_size]``. Padding clients have budget 0 and weight 0, so they
  sort into the first (cheapest) chunk."""
  size = cohort.budgets.shape[0]
  pad = num_chunks * chunk_size - size
  fields = [jnp.pad(a, (pad, 0)) for a in (cohort.client_ids, cohort.budgets, cohort.weights,
                                            guesses)]
  slots = jnp.arange(-pad, size, dtype=jnp.int32)
  order = jnp.argsort(fields[1], stable=True)
  shape = (num_chunks, chunk_size)
  return Clients(*(a[order].reshape(shape) for a in fields),
                 jnp.maximum(slots[order], 0).reshape(shape), (slots[order] >= 0).reshape(shape))


def route(cohort: Cohort, guesses, owned: int, num_clients: int, num_devices: int,
          capacity: int) -> Clients:
  """Sends each client of the cohort to the device that owns it (device ``d`` owns clients
  ``d owned .. (d + 1) owned - 1``, ``federated_data.clients_per_owner``): leaves
  ``[num_devices, capacity]``, row ``d`` holding device ``d``'s clients sorted by budget, then
  padding slots (budget 0, weight 0, not valid) naming a client the device owns."""
  size = cohort.budgets.shape[0]
  owner = jnp.minimum(cohort.client_ids // owned, num_devices - 1)
  order = jnp.lexsort((cohort.budgets, owner))          # by owner, then by budget
  share = jnp.zeros((num_devices,), jnp.int32).at[owner].add(1)
  slot = jnp.arange(capacity)[None, :]
  valid = slot < share[:, None]
  src = order[jnp.minimum((jnp.cumsum(share) - share)[:, None] + slot, size - 1)]
  own = jnp.minimum(jnp.arange(num_devices, dtype=jnp.int32) * owned, num_clients - 1)
  return device_slots(cohort, guesses, src, valid, own[:, None])


def deal(cohort: Cohort, guesses, num_devices: int, capacity: int) -> Clients:
  """The cohort sorted by budget and dealt to the devices like cards (``[num_devices,
  capacity]``): device ``d`` gets the clients at sorted positions ``d, d + D, d + 2D, ...``, so
  every device trains the same number of clients (one more at most) with about the same steps,
  each row still sorted by budget; then padding slots (client 0, budget 0, weight 0, not valid).
  For a pool every device holds whole (``to_device(data, mesh, replicate=True)``)."""
  size = cohort.budgets.shape[0]
  order = jnp.argsort(cohort.budgets, stable=True)
  pos = jnp.arange(capacity)[None, :] * num_devices + jnp.arange(num_devices)[:, None]
  valid = pos < size
  return device_slots(cohort, guesses, order[jnp.minimum(pos, size - 1)], valid, 0)


def device_slots(cohort: Cohort, guesses, src, valid, pad_id) -> Clients:
  """The devices' slots ``[num_devices, capacity]``: cohort client ``src`` where ``valid``,
  else a padding slot naming client ``pad_id`` (budget 0, weight 0, not valid)."""
  pick = lambda a, pad: jnp.where(valid, a[src], pad)
  return Clients(pick(cohort.client_ids, pad_id), pick(cohort.budgets, 0),
                 pick(cohort.weights, 0.), pick(guesses, 0.),
                 pick(jnp.arange(cohort.budgets.shape[0], dtype=jnp.int32), 0), valid)


def kept_without_clients(took_part, new, old):
  """``new`` server state where ``took_part`` (the round's total weight is positive), else
  ``old``; a per-client store (``clients``) is taken from ``new`` as it is, written only by
  real clients and too large to select over every round."""
  pick = lambda n, o: tree_map(lambda a, b: jnp.where(took_part, a, b), n, o)
  if getattr(new, 'clients', None) is None:
    return pick(new, old)
  return pick(new._replace(clients=None), old._replace(clients=None))._replace(
      clients=new.clients)


def all_finite(tree) -> jax.Array:
  """Whether every array of ``tree`` holds no NaN or infinity (a scalar bool)."""
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(a)) for a in jax.tree.leaves(tree)]))


def tree_bytes(tree) -> int:
  """Bytes of a pytree of arrays or shape structs (static)."""
  return sum(int(np.prod(x.shape)) * x.dtype.itemsize
             for x in jax.tree_util.tree_leaves(tree))


def upload_types(train_chunk, bcast, data, client_key_root, chunk):
  """One client's upload (shapes and dtypes) from ``train_chunk``'s output on ``chunk``: a hit
  in jit's trace cache where the round already traced that chunk, in the same context."""
  work = jax.eval_shape(train_chunk, bcast, data, client_key_root, chunk)
  return tree_map(lambda u: jax.ShapeDtypeStruct(u.shape[1:], u.dtype), work.upload)


def chunk_layout(cohort_size: int, chunk_size: int, num_devices: int = 1) -> tuple[int, int]:
  """``(clients per chunk, chunks)``: equal chunks of at most ``chunk_size`` clients, rounded up
  to a multiple of ``num_devices``."""
  chunk = math.ceil(cohort_size / math.ceil(cohort_size / min(chunk_size, cohort_size)))
  chunk = math.ceil(chunk / num_devices) * num_devices
  return chunk, math.ceil(cohort_size / chunk)


def routed_chunk(cohort_size: int, chunk_size: int, num_devices: int) -> int:
  """Clients per chunk on each device of a mesh: a device's slice of ``chunk_layout``'s chunk,
  at most ``1 / ROUTED_CHUNKS`` of its mean share of the cohort."""
  return min(chunk_layout(cohort_size, chunk_size, num_devices)[0] // num_devices,
             max(1, -(-cohort_size // (num_devices * ROUTED_CHUNKS))))


def build_round(algorithm: FederatedAlgorithm, *, chunk_size: int, mesh: Mesh | None = None,
                donate_state: bool = False, backend: Backend = Backend()):
  """Builds the jitted round function.

  The batch size ``B`` and the largest budget ``b`` are read from the cohort's ``CohortSpec``
  (static: ``b B`` sizes the data-order buffer), so the sampler and the round cannot disagree.

  Args:
    algorithm: the federated algorithm.
    chunk_size: the most clients processed together (vmapped); the scan over chunks is
      sequential. The cohort is cut into equal chunks of at most this size.
    mesh: a device mesh with an axis named ``'clients'``: each device trains the cohort's
      clients it owns (``shard_map``; the pool must be ``to_device(data, mesh)``'s and the
      store ``store.place_state``'s), or, with a pool whole on every device
      (``to_device(data, mesh, replicate=True)``; not for a store split by client), its share
      of the cohort dealt by budget; the weighted sums are reduced across devices; ``None``
      runs on the default device.
    donate_state: let the round reuse the server state's buffers for the new state (a caller
      that never touches the old state again saves a copy of it, the per-client store included).
      The old state's arrays are deleted by the call, those ``server_init`` took from the
      initial parameters too: keep a copy (``jax.tree.map(jnp.copy, params)``) to start
      another algorithm from them.
    backend: how the round is compiled (``core.backend.Backend``: fused small products, static
      step counts, XLA options, the Threefry lowering); nothing it holds reads the run's
      length, and only ``fuse_small_dots`` changes numbers.

  Returns:
    ``round_fn(server_state, cohort, data, root_key, round_idx)``, jitted; it compiles once per
    cohort spec and never again from round to round. ``data`` must be on the device
    (``fedjax_gel.to_device``); host data raises ``TypeError``.
  """
  chunk_size = positive_int('build_round', 'chunk_size', chunk_size)
  stateful = algorithm.store_row is not None

  def kernels(spec, static_trips: bool):
    """The chunk functions for the cohorts of ``spec`` (a ``CohortSpec``: minibatches of ``B``,
    budgets up to ``max_budget``, whose ``max_budget B`` sizes the data-order buffer);
    ``static_trips``: every chunk loops ``max_budget`` steps."""
    batch_size, max_budget = spec.batch_size, spec.max_budget
    epochs = spec.budget_unit == 'epochs'

    def pre_pass_values(bcast, data: FederatedData, n, offsets, rows, real, client_keys):
      """Each client's ``pre_pass_fn`` at the broadcast model (the algorithm's per-client extra,
      e.g. Mime's gradient): ``(values, gradient computations, examples)``. Its batches carry
      the client's key (``ClientContext.key``) as ``batch['key']``, for a model's draws."""
      keyed = jax.vmap(lambda b, batch, k: algorithm.pre_pass_fn(b, dict(batch, key=k)),
                       in_axes=(None, 0, 0))
      fn = lambda b, batch: keyed(b, batch, client_keys)
      if algorithm.pre_pass == 'minibatch':
        # The client's first minibatch at the broadcast model: for a gradient, that of its first
        # local step, which a real client reuses; recomputed here, so it is not counted again.
        batch = gather_rows(data.examples, rows[:, :batch_size])
        first = jnp.arange(batch_size)[None, :] < (n[:, None] if epochs else batch_size)
        batch['mask'] = jnp.broadcast_to(first, rows[:, :batch_size].shape)
        return fn(bcast, batch), jnp.int32(0), jnp.int32(0)

      pos = jnp.arange(FULL_BATCH_ROWS)

      def add_rows(b, acc):   # rows b*R .. b*R + R - 1 of every client, masked beyond n_i
        p = b * FULL_BATCH_ROWS + pos
        mask = p[None, :] < n[:, None]
        idx = offsets[:, None] + jnp.minimum(p[None, :], jnp.maximum(n - 1, 0)[:, None])
        batch = dict(gather_rows(data.examples, idx), mask=mask)
        count = jnp.sum(mask, axis=1).astype(jnp.float32)
        g = fn(bcast, batch)
        return tree_map(lambda a, u: a + count.reshape((-1,) + (1,) * (u.ndim - 1)) * u, acc, g)

      shapes = jax.eval_shape(lambda: fn(bcast, dict(
          tree_map(lambda a: a[jnp.zeros((n.shape[0], 1), jnp.int32)], data.examples),
          mask=jnp.ones((n.shape[0], 1), bool))))
      zeros = tree_map(lambda s: jnp.zeros(s.shape, jnp.float32), shapes)
      n_real = jnp.where(real, n, 0)
      trips = -(-jnp.max(n_real) // FULL_BATCH_ROWS)
      total = jax.lax.fori_loop(0, trips, add_rows, zeros)
      scale = 1. / jnp.maximum(n_real, 1).astype(jnp.float32)
      values = tree_map(
          lambda t, s: (scale.reshape((-1,) + (1,) * (t.ndim - 1)) * t).astype(s.dtype),
          total, shapes)
      return values, jnp.sum(-(-n_real // batch_size)), jnp.sum(n_real)

    # The round traces each chunk kernel once: ``jax.eval_shape`` (the accumulators' shapes, the
    # upload's dtypes) and the loop over the chunks reuse its jaxpr, jit's trace cache keyed by
    # the arguments' shapes (it was traced three times, most of a round's tracing). ``inline``:
    # the jaxpr is inlined where it is used, so the program is the one a plain call gives.
    @functools.partial(jax.jit, inline=True)
    def train_chunk(bcast, data: FederatedData, client_key_root, chunk) -> ChunkWork:
      """Local work of one chunk. Uploads and weights of padding clients and clients without data
      are zero."""
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
        extra, extra_grads, extra_examples = pre_pass_values(bcast, data, n, offsets, rows,
                                                                 real, algo_keys)
      ctx = ClientContext(cohort.client_ids, n, budgets, jnp.where(real, cohort.guesses, 0.),
                          cohort.weights, algo_keys, extra, stored)
      state = jax.vmap(algorithm.client_init, in_axes=(None, 0))(bcast, ctx)
      start = jax.vmap(algorithm.client_model)(state)
      step = backend.step(jax.vmap(algorithm.client_step, in_axes=(0, 0, None)))

      def local_step(k, carry):
        state, loss_sum = carry
        idx, mask = minibatch_rows(spec, rows, k, n)
        batch = gather_rows(data.examples, idx)     # [chunk, B, ...]
        if mask is not None:
          batch['mask'] = mask
        new_state, loss = step(state, batch, bcast)
        active = k < budgets
        if not spec.equal_budgets:   # equal budgets: no real client is ever masked (see above)
          new_state = masked(active, new_state, state)
        return new_state, loss_sum + jnp.where(active, loss, 0.)

      # A static trip count (a loop XLA knows the length of) or the chunk's own largest budget
      # (a data-dependent while loop: fewer masked steps, one predicate read per step).
      trips = max_budget if static_trips else jnp.max(budgets)
      state, loss_sum = jax.lax.fori_loop(0, trips, local_step, (state, jnp.zeros(n.shape)))
      trips = jnp.asarray(trips, jnp.int32)
      upload = jax.vmap(algorithm.client_final, in_axes=(0, None, 0))(state, bcast, ctx)
      new_rows = None
      if stateful:
        upload, new_rows = upload
        new_rows = masked(real, new_rows, stored)
      w = jnp.where(real, cohort.weights, 0.)
      upload = masked(real, upload, tree_map(jnp.zeros_like, upload))   # no NaN from padding
      return ChunkWork(upload, w, budgets, loss_sum / jnp.maximum(budgets, 1), real, trips,
                       model_spread(jax.vmap(algorithm.client_model)(state), start, real),
                       extra_grads, extra_examples, examples_seen(spec, budgets, n), new_rows)

    @functools.partial(jax.jit, inline=True)
    def chunk_totals(bcast, data, client_key_root, chunk):
      """One chunk's ``sum_i w_i upload_i`` (float32), model directions and scalar totals."""
      work = train_chunk(bcast, data, client_key_root, chunk)
      w, budgets = work.weights, work.budgets
      sums = tree_map(lambda u: jnp.tensordot(w, u.astype(jnp.float32), axes=1), work.upload)
      w_trained = jnp.where(budgets > 0, w, 0.)
      totals = (jnp.sum(w), jnp.sum(work.real).astype(jnp.float32),
                jnp.sum(w_trained * work.mean_loss), jnp.sum(w_trained),
                jnp.sum(budgets) + work.pre_pass_grads, jnp.sum(work.examples) +
                work.pre_pass_examples, work.trips * budgets.shape[0])
      return (sums, work.model_spread, totals), (work.new_rows, work.real)

    def accumulate(bcast, data, client_key_root, chunks):
      """Scan over chunks, adding each chunk's weighted sums and totals; the chunks' new rows
      and real-client masks come out stacked (stateful algorithms; else None)."""
      def body(acc, chunk_inputs):
        add, rows = chunk_totals(bcast, data, client_key_root, chunk_inputs)
        return tree_map(jnp.add, acc, add), rows if stateful else None

      acc0 = jax.eval_shape(chunk_totals, bcast, data, client_key_root,
                            tree_map(lambda a: a[0], chunks))[0]
      acc0 = tree_map(lambda s: jnp.zeros(s.shape, s.dtype), acc0)
      return jax.lax.scan(body, acc0, chunks)

    return train_chunk, chunk_totals, accumulate

  def on_mesh(server_state, cohort, guesses, bcast, data, client_key_root, train_chunk,
              chunk_totals, replicated: bool):
    """Owner computes: each device trains, chunk by chunk, the clients whose examples (and
    store rows) it holds; their weighted sums meet in one ``psum``. ``replicated``: every device
    holds the whole pool, and the cohort is dealt to the devices by budget (``deal``) instead.
    Returns ``((sums, spread, totals), written, routed, uploads)`` with ``written``'s leaves
    ``[devices, capacity, ...]`` and ``uploads`` one client's upload (``upload_types``)."""
    num_devices = mesh.shape[CLIENT_AXIS]
    num_clients = data.counts.shape[0]
    owned = federated_data.clients_per_owner(num_clients, num_devices)
    size = cohort.budgets.shape[0]
    per_device = routed_chunk(size, chunk_size, num_devices)
    capacity = -(-size // per_device) * per_device
    routed = (deal(cohort, guesses, num_devices, capacity) if replicated else
              route(cohort, guesses, owned, num_clients, num_devices, capacity))
    # computed whole on every device (a few integers per client): else XLA splits the routing's
    # prefix sum over the devices, a collective every round
    routed = jax.lax.with_sharding_constraint(routed, jax.sharding.NamedSharding(mesh, P()))
    split = stateful and store_lib.split_by_client(algorithm)
    if split and replicated:
      raise ValueError(f'round_fn: {algorithm.name} keeps its per-client store split by client, '
                       'which needs the pool split by client too; pass '
                       'fedjax_gel.to_device(data, mesh) without replicate')
    if split and store_lib.num_rows(server_state.clients) != owned * num_devices:
      raise ValueError(f'round_fn: a store of {store_lib.num_rows(server_state.clients)} rows '
                       f'for {num_clients} clients on {num_devices} devices; place the state '
                       'with fedjax_gel.core.store.place_state(state, algorithm, mesh)')

    def device(bcast, examples, offsets, counts, key_root, routed, store):
      d = jax.lax.axis_index(CLIENT_AXIS)
      # this device's first pool row: its block's, or the whole pool's
      base = 0 if replicated else jax.tree.leaves(examples)[0].shape[0] * d
      local = FederatedData(examples, offsets - base, counts)
      chunks = tree_map(lambda a: a.reshape(-1, per_device), routed)   # [chunks, per_device]

      def stored_rows(ids):
        if not stateful:
          return None
        rows = ids - d * owned if split else algorithm.store_row(ids)
        return store_lib.gather(store, rows)

      def body(c, carry):
        acc, written = carry
        chunk = tree_map(lambda a: a[c], chunks)
        add, rows = chunk_totals(bcast, local, key_root, (chunk, stored_rows(chunk.client_ids)))
        if stateful:
          written = tree_map(lambda w, r: w.at[c].set(r), written, rows)
        return tree_map(jnp.add, acc, add), written

      first = tree_map(lambda a: a[0], chunks)
      first = (first, stored_rows(first.client_ids))   # a chunk as ``body`` passes it
      shapes = jax.eval_shape(chunk_totals, bcast, local, key_root, first)
      # read where the devices trace their chunks (the trace ``chunk_totals`` just made)
      uploads.append(upload_types(train_chunk, bcast, local, key_root, first))
      zeros = lambda tree, lead=(): tree_map(lambda x: jnp.zeros(lead + x.shape, x.dtype), tree)
      written = zeros(shapes[1], (chunks.valid.shape[0],)) if stateful else None
      trips = -(-jnp.sum(routed.valid) // per_device)     # this device's chunks with clients
      acc, written = jax.lax.fori_loop(0, trips, body, (zeros(shapes[0]), written))
      written = tree_map(lambda w: w.reshape((1, capacity) + w.shape[2:]), written)
      return jax.lax.psum(acc, CLIENT_AXIS), written

    store = server_state.clients if stateful else None
    uploads = []
    run = jax.shard_map(
        device, mesh=mesh, check_vma=False,
        in_specs=(P(), P() if replicated else P(CLIENT_AXIS), P(), P(), P(), P(CLIENT_AXIS),
                  P(CLIENT_AXIS) if split else P()),
        out_specs=(P(), P(CLIENT_AXIS)))
    acc, written = run(bcast, data.examples, data.offsets, data.counts, client_key_root, routed,
                       store)
    return acc, written, routed, uploads[0]

  def write_rows(clients_store, written, ids):
    """Writes the rows the clients returned (``written``: rows and real-client masks, leading
    axes matching ``ids``) into the store: on a mesh, each device into its own rows."""
    new_rows, real = written
    if mesh is None or not store_lib.split_by_client(algorithm):
      flat = lambda a: a.reshape((-1,) + a.shape[ids.ndim:])
      new = store_lib.write_mean(clients_store, algorithm.store_row(ids).reshape(-1),
                                 tree_map(flat, new_rows), flat(real))
      return store_lib.constrain(new, mesh, split=False)
    owned = store_lib.num_rows(clients_store) // mesh.shape[CLIENT_AXIS]

    def device(part, ids, new_rows, real):
      rows = ids[0] - jax.lax.axis_index(CLIENT_AXIS) * owned
      return store_lib.write_mean(part, rows, tree_map(lambda a: a[0], new_rows), real[0])
    return jax.shard_map(device, mesh=mesh, in_specs=P(CLIENT_AXIS), out_specs=P(CLIENT_AXIS),
                         check_vma=False)(clients_store, ids, new_rows, real)

  def round_fn(server_state, cohort: Cohort, data: FederatedData, root_key, round_idx,
               replicated: bool = False):
    spec = cohort.spec
    train_chunk, chunk_totals, accumulate = kernels(spec,
                                                    backend.loops_statically(spec.equal_budgets))
    size = cohort.budgets.shape[0]
    if algorithm.client_guesses is None:
      guesses = jnp.zeros(cohort.budgets.shape, jnp.float32)
    else:
      # of the steps taken: a client without data takes none (GeL's cohort_max reads them all)
      taken = steps_taken(spec, cohort.budgets, data.counts[cohort.client_ids] > 0)
      guesses = jnp.asarray(algorithm.client_guesses(taken, spec.max_budget), jnp.float32)
    bcast = algorithm.broadcast(server_state)
    client_key_root = keys.round_key(root_key, round_idx, keys.CLIENT)
    if mesh is None:   # the chunks one after another on one device
      clients = pad_and_sort(cohort, guesses, *chunk_layout(size, chunk_size)[::-1])
      stored = (store_lib.gather(server_state.clients, algorithm.store_row(clients.client_ids))
                if stateful else None)
      (sums, spread, totals), written = accumulate(bcast, data, client_key_root,
                                                   (clients, stored))
      uploads = upload_types(train_chunk, bcast, data, client_key_root,   # a chunk as the loop
                             tree_map(lambda a: a[0], (clients, stored)))  # traced it
    else:
      (sums, spread, totals), written, clients, uploads = on_mesh(
          server_state, cohort, guesses, bcast, data, client_key_root, train_chunk,
          chunk_totals, replicated)
    weight_total, num_real, loss_wsum, loss_w, grads, examples, computed = totals
    scale = jnp.where(weight_total > 0, 1. / jnp.maximum(weight_total, 1e-30), 0.)
    mean_upload = tree_map(lambda s, u: (s * scale).astype(u.dtype), sums, uploads)
    info = RoundInfo(weight_total, num_real)
    diagnostics = ({} if algorithm.diagnostics is None else
                   algorithm.diagnostics(server_state, mean_upload, info))
    new_state = kept_without_clients(
        weight_total > 0, algorithm.server_update(server_state, mean_upload, info), server_state)
    if stateful:
      new_state = new_state._replace(
          clients=write_rows(new_state.clients, written, clients.client_ids))
    up, down = tree_bytes(uploads), tree_bytes(bcast)
    train_loss = jnp.where(loss_w > 0, loss_wsum / jnp.maximum(loss_w, 1e-30), jnp.nan)
    metrics = RoundMetrics(train_loss, grads, examples, computed,
                           num_real * up, num_real * down,
                           mean_pairwise_cosine_distance(*spread, num_real), num_real,
                           all_finite(algorithm.server_params(new_state)) &
                           ((loss_w == 0) | jnp.isfinite(train_loss)),
                           {k: jnp.asarray(v, jnp.float32) for k, v in diagnostics.items()})
    return new_state, metrics

  return RoundFunction(backend.jit(round_fn, donate_argnums=(0,) if donate_state else (),
                                   static_argnames=('replicated',)), mesh, algorithm)


class RoundFunction:
  """The jitted round; refuses a data pool still on the host, a hand-made cohort that does not
  fit its spec or the pool's population (``sampling.check_cohort``) and a per-client store
  built for another population (``store.check_rows``), before jit sees them."""

  def __init__(self, jitted, mesh=None, algorithm: FederatedAlgorithm | None = None):
    self.jitted, self.mesh, self.algorithm = jitted, mesh, algorithm

  def checked(self, server_state, cohort: Cohort, data: FederatedData) -> bool:
    """The checks above; returns whether the pool is whole on every device (``replicated``)."""
    replicated = check_on_device(data, self.mesh)
    check_cohort(cohort, data.num_clients)
    if self.algorithm is not None and self.algorithm.store_row is not None:
      store_lib.check_rows(self.algorithm, server_state.clients, data.num_clients, self.mesh)
    return replicated

  def __call__(self, server_state, cohort: Cohort, data: FederatedData, root_key, round_idx):
    replicated = self.checked(server_state, cohort, data)
    return self.jitted(server_state, cohort, data, root_key, round_idx, replicated=replicated)

  def lower(self, server_state, cohort: Cohort, data: FederatedData, root_key, round_idx):
    """``jax.jit``'s ``lower`` (for ``.compile()``, memory and cost analyses)."""
    replicated = self.checked(server_state, cohort, data)
    return self.jitted.lower(server_state, cohort, data, root_key, round_idx,
                             replicated=replicated)


def check_on_device(data, mesh=None) -> bool:
  """Whether the pool is whole on every device of the round's mesh (``to_device(data, mesh,
  replicate=True)``) rather than split by client. Raises ``TypeError`` (one line naming
  ``to_device``) for a pool still on the host, or on a mesh neither split nor whole; a
  ``ValueError`` for a pool without examples."""
  if not isinstance(data, FederatedData):
    raise TypeError(f'round_fn: data must be a FederatedData on the device, got '
                    f'{type(data).__name__}')
  if data.client_names or any(isinstance(a, np.ndarray) for a in jax.tree.leaves(data)):
    raise TypeError('round_fn: the data pool is on the host; pass fedjax_gel.to_device(data) '
                    '(done once, not every round)')
  if not jax.tree.leaves(data.examples)[0].shape[0]:
    raise ValueError('round_fn: the data pool holds no examples (every client has 0 rows); a '
                     'round trains on a pool with some')
  if mesh is None:
    return False
  laid_out = lambda spec: all(a.sharding.is_equivalent_to(jax.sharding.NamedSharding(mesh, spec),
                                                          a.ndim)
                              for a in jax.tree.leaves(data.examples))
  if laid_out(P(CLIENT_AXIS)):
    return False
  if laid_out(P()):
    return True
  raise TypeError('round_fn: on a mesh the data pool must be split by client or whole on every '
                  'device; pass fedjax_gel.to_device(data, mesh)')


# On a mesh each device cuts its share of the cohort into chunks of at most 1/ROUTED_CHUNKS of
# the mean share, so that the shares' imbalance and the padding of each device's last chunk
# cost little: 1,000 clients over 4 devices (16 a chunk) computed 0.97 real slots, against 0.67
# with one 250-client chunk a device (benchmarks/population_sharding.py).
ROUTED_CHUNKS = 16
