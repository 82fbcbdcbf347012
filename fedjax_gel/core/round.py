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
  1.03-1.07x faster at 20 clients and 1.11-1.26x at 200 (``docs/speed.md``).
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
  1.10-1.15x faster dealt, ``docs/speed.md``).
* Per-client state (stateful algorithms, ``FederatedAlgorithm.store_row``): the cohort's rows
  are gathered from the store in the server state before the chunks run, travel with them, and
  the rows the clients return are written back after ``server_update`` (``core.store``).
* Minibatch ``k`` of client ``i`` is gathered inside the step:
  ``pool[offsets[i] + perm_i[(k B + j) mod n_i]]``; the ``[C, tau, B, ...]`` cohort tensor is never
  built.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from fedjax_gel.core import chunk as chunk_lib
from fedjax_gel.core import keys, routing
from fedjax_gel.core import store as store_lib
from fedjax_gel.core.algorithm import FederatedAlgorithm, RoundInfo
from fedjax_gel.core.backend import Backend
from fedjax_gel.core.checks import positive_int
from fedjax_gel.core.devices import CLIENT_AXIS
from fedjax_gel.core.federated_data import FederatedData
from fedjax_gel.core.sampling import Cohort, check_cohort
from fedjax_gel.core.spread import mean_pairwise_cosine_distance

tree_map = jax.tree_util.tree_map


class RoundMetrics(NamedTuple):
  """Per-round totals (scalars), the round function's second result.

  Attributes:
    train_loss: ``sum_i w_i mean_k loss_ik / sum_i w_i`` over the minibatch losses; NaN when
      no client with weight took a step.
    grad_computations: ``sum_i tau_i`` minibatch gradients, plus full pre-passes
      (``ceil(n_i / B)`` each).
    examples: examples through a gradient: ``sum_i tau_i B``, plus pre-pass examples.
    computed_steps: client-steps the chunks ran, masked ones included.
    uploaded_bytes: bytes the real clients uploaded.
    downloaded_bytes: bytes the real clients downloaded.
    client_distance: mean pairwise cosine distance of the clients' final models (NaN unless
      ``build_round``'s ``client_distance``).
    num_clients: real clients (sampled, with data).
    finite: the new server model holds no NaN or infinity, and the train loss is finite where
      a client took a step (a loss of NaN with a finite model: e.g. labels beyond the model's
      classes).
    diagnostics: the algorithm's own metrics (``{name: scalar}``; ``{}`` without).
  """
  train_loss: jax.Array
  grad_computations: jax.Array
  examples: jax.Array
  computed_steps: jax.Array
  uploaded_bytes: jax.Array
  downloaded_bytes: jax.Array
  client_distance: jax.Array
  num_clients: jax.Array
  finite: jax.Array
  diagnostics: Any = None


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


def cohort_guesses(algorithm: FederatedAlgorithm, cohort: Cohort, data: FederatedData):
  """Each cohort slot's guessed steps (``FederatedAlgorithm.client_guesses``; zeros without),
  from the steps the clients take: a client without data or an absent slot takes none (GeL's
  ``cohort_max`` reads them all)."""
  if algorithm.client_guesses is None:
    return jnp.zeros(cohort.budgets.shape, jnp.float32)
  taken = chunk_lib.steps_taken(cohort.spec, cohort.budgets,
                                (data.counts[cohort.client_ids] > 0) & cohort.taking_part)
  return jnp.asarray(algorithm.client_guesses(taken, cohort.spec.max_budget), jnp.float32)


def round_metrics(algorithm: FederatedAlgorithm, totals: chunk_lib.ChunkTotals, uploads, bcast,
                  new_state, diagnostics, drift: bool) -> RoundMetrics:
  """The metrics stage: the round's ``RoundMetrics`` from its totals (``uploads``, ``bcast``:
  one client's upload and the broadcast, for the bytes)."""
  t = totals
  train_loss = jnp.where(t.loss_weight > 0, t.loss_sum / jnp.maximum(t.loss_weight, 1e-30),
                         jnp.nan)
  return RoundMetrics(
      train_loss=train_loss, grad_computations=t.grad_computations, examples=t.examples,
      computed_steps=t.computed_steps, uploaded_bytes=t.clients * tree_bytes(uploads),
      downloaded_bytes=t.clients * tree_bytes(bcast),
      client_distance=(mean_pairwise_cosine_distance(*t.spread, t.clients) if drift else
                       jnp.float32(jnp.nan)),
      num_clients=t.clients,
      finite=all_finite(algorithm.server_params(new_state)) & (
          (t.loss_weight == 0) | jnp.isfinite(train_loss)),
      diagnostics={k: jnp.asarray(v, jnp.float32) for k, v in diagnostics.items()})


def build_round(algorithm: FederatedAlgorithm, *, chunk_size: int, mesh: Mesh | None = None,
                donate_state: bool = False, backend: Backend = Backend(),
                client_distance: bool = False):
  """Builds the jitted round function of ``algorithm``.

  The round runs the stages ``pre_pass`` and ``chunk`` (each chunk's local work and totals),
  ``routing`` (the chunks on one device or a mesh), the server update, ``store.write_back`` and
  ``round_metrics``. The batch size ``B`` and the largest budget ``b`` are read from the cohort's
  ``CohortSpec`` (static: ``b B`` sizes the data-order buffer), so the sampler and the round cannot
  disagree.

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
    client_distance: measure FedGBO's client drift (``RoundMetrics.client_distance``, Mills et
      al. 2022, Fig. 1): each chunk sums its clients' unit model changes (``core.spread``);
      else the metric is NaN and nothing is computed for it.

  Returns:
    ``round_fn(server_state, cohort, data, root_key, round_idx) -> (server_state,
    RoundMetrics)``, jitted; it compiles once per cohort spec and never again from round to
    round. ``data`` must be on the device (``fedjax_gel.to_device``); host data raises
    ``TypeError``, a hand-made cohort that does not fit its spec or the pool a ``ValueError``.

  Raises:
    ValueError: ``chunk_size`` is not a positive integer, or a debug backend with a mesh.

  Examples:
    >>> import jax.numpy as jnp, optax
    >>> import fedjax_gel as fg
    >>> from fedjax_gel.core import keys
    >>> from fedjax_gel.data import leaf_synthetic
    >>> train = fg.to_device(leaf_synthetic.load().train)
    >>> model = fg.get_model('logistic', (60,), 5)
    >>> alg = fg.fedavg(fg.cross_entropy_loss(model), optax.sgd(0.01))
    >>> root = keys.root_key(0)
    >>> state = alg.server_init(model.init(keys.init_key(root)))
    >>> spec = fg.CohortSpec(cohort_size=20, budget_range=(4, 13), batch_size=5)
    >>> round_fn = fg.build_round(alg, chunk_size=20)
    >>> for r in range(3):
    ...   cohort = fg.sample_cohort(root, r, train.counts, spec)
    ...   state, metrics = round_fn(state, cohort, train, root, jnp.int32(r))
    >>> int(metrics.num_clients)
    20
  """
  chunk_size = positive_int('build_round', 'chunk_size', chunk_size)
  if backend.debug:
    from fedjax_gel.core import debug_round  # pylint: disable=g-import-not-at-top
    if mesh is not None:
      raise ValueError('build_round: the debug backend runs on one device (mesh=None)')
    return debug_round.DebugRound(algorithm)

  def round_fn(server_state, cohort: Cohort, data: FederatedData, root_key, round_idx,
               replicated: bool = False):
    static = backend.loops_statically(cohort.spec.equal_budgets)
    kernels = chunk_lib.chunk_kernels(algorithm, cohort.spec, backend, static, client_distance)
    bcast = algorithm.broadcast(server_state)
    work = (server_state, cohort, cohort_guesses(algorithm, cohort, data), bcast, data,
            keys.round_key(root_key, round_idx, keys.CLIENT), *kernels)
    if mesh is None:
      totals, written, clients, uploads = routing.on_one_device(algorithm, chunk_size, *work)
    else:
      totals, written, clients, uploads = routing.on_mesh(algorithm, mesh, chunk_size, *work,
                                                          replicated)
    info = RoundInfo(weight_total=totals.weight, num_clients=totals.clients)
    if algorithm.aggregate is None:
      scale = jnp.where(totals.weight > 0, 1. / jnp.maximum(totals.weight, 1e-30), 0.)
      mean_upload = tree_map(lambda s, u: (s * scale).astype(u.dtype), totals.upload_sum,
                             uploads)
    else:   # its own mean, and a step in every round (noise is released without clients too)
      mean_upload = tree_map(lambda m, u: m.astype(u.dtype), algorithm.aggregate(
          server_state, totals.upload_sum, info,
          keys.round_key(root_key, round_idx, keys.SERVER)), uploads)
    diagnostics = ({} if algorithm.diagnostics is None else
                   algorithm.diagnostics(server_state, mean_upload, info))
    stepped = algorithm.server_update(server_state, mean_upload, info)
    new_state = (stepped if algorithm.aggregate is not None else
                 kept_without_clients(totals.weight > 0, stepped, server_state))
    if algorithm.store_row is not None:
      new_state = new_state._replace(clients=store_lib.write_back(
          algorithm, mesh, new_state.clients, written, clients.client_ids))
    return new_state, round_metrics(algorithm, totals, uploads, bcast, new_state, diagnostics,
                                    client_distance)

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
