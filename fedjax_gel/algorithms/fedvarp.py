"""FedVARP and ClusterFedVARP (Jhunjhunwala et al., UAI 2022): server memory of updates.

The server keeps each client's latest update ``y_j`` (initially 0) and steps on a SAGA-like
variance-reduced direction::

    v = sum_{i in S} p_i (Delta_i - y_i) + sum_j q_j y_j;     y_i <- Delta_i  (i in S)
    x <- server_optimizer(v)                                   (default SGD(1): x - v)

``p_i`` are the engine's aggregation weights over the cohort, ``q_j`` the clients' weights in the
objective (``memory_weights``, summing to 1; the paper's ``1/N``). With full participation and
``p = q``, ``v = sum_i p_i Delta_i``: FedAvg. The command line's defaults make ``p = q`` over a
full cohort: the cohort's weights ``n_i`` (``--aggregation_weights=num_examples``), the memory's
``n_j / n``; ``--aggregation_weights=uniform`` sets both to equal weights, and with
``samples_seen`` (``min(tau_i B, n_i)``, the GeL code's) the two differ, so even with every
client sampled FedVARP is not FedAvg from the second round on.

ClusterFedVARP keeps one memory per cluster: client ``j`` reads ``y_{c(j)}``, the memory term is
``sum_c q_c y_c`` with ``q_c = sum_{j in c} q_j``, and a sampled cluster's memory becomes the mean of
its sampled clients' updates. One cluster per client is FedVARP.

The memory lives in the per-client store (``fedjax_gel.core.store``): every round the server reads
all of it once for the memory term.
"""
from __future__ import annotations

import dataclasses

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_gel.core.algorithm import ClientContext, FederatedAlgorithm, RoundInfo
from fedjax_gel.algorithms.drift import client_weights, mean_row
from fedjax_gel.algorithms.fedavg import POSITIVE, check, local_sgd
from fedjax_gel.core import store
from fedjax_gel.spec import AlgorithmSpec, hparam, int_range

tree_map = jax.tree_util.tree_map


class FedVARPState(NamedTuple):
  params: Any
  opt_state: Any
  clients: Any      # y_j, one row per client (or cluster)


def fedvarp(loss_fn: Callable, client_lr: float, memory_weights,
            server_optimizer: Optional[optax.GradientTransformation] = None,
            clusters=None, name: str = 'fedvarp') -> FederatedAlgorithm:
  """Builds FedVARP with client SGD; ClusterFedVARP when ``clusters`` is given.

  FedVARP (Jhunjhunwala et al. 2022, FedVARP: Tackling the Variance Due to Partial Client
  Participation in Federated Learning): the server keeps each client's latest update ``y_j``
  (in the per-client store, initially 0) and steps on ``v = sum_{i in S} p_i (Delta_i - y_i) +
  sum_j q_j y_j``, then ``y_i <- Delta_i`` for the cohort ``S``. ClusterFedVARP keeps one
  memory per cluster (``q_c = sum_{j in c} q_j``); one cluster per client is FedVARP.

  Args:
    loss_fn: ``(params, batch) -> scalar`` mean minibatch loss.
    client_lr: client SGD learning rate.
    memory_weights: ``[N]`` weights ``q_j`` of the clients in the objective, summing to 1.
    server_optimizer: applied to ``v``; default ``optax.sgd(1.0)``.
    clusters: ``[N]`` int cluster of each client (ClusterFedVARP), or None (one memory each).
    name: display name.

  Returns:
    The stateful ``FederatedAlgorithm`` (its store holds a row per client, or per cluster).

  Raises:
    ValueError: a concrete learning rate outside its range, ``memory_weights`` not
      non-negative and summing to 1, or ``clusters`` not one per client.

  Examples:
    >>> import numpy as np
    >>> import fedjax_gel as fg
    >>> model = fg.get_model('logistic', (60,), 5)
    >>> alg = fg.algorithms.fedvarp(fg.cross_entropy_loss(model), client_lr=0.01,
    ...                             memory_weights=np.full(1000, 1 / 1000))
  """
  check(name, 'client_lr', client_lr, POSITIVE)
  server_optimizer = server_optimizer or optax.sgd(1.0)
  weights = client_weights(f'{name}: memory_weights', memory_weights)
  row_of = store.by_client
  if clusters is not None:
    row_of = store.ByTable(clusters, f'{name}: clusters')
    if len(row_of.table) != len(weights):
      raise ValueError(f'{name}: clusters must give one cluster per client, {len(weights)} as '
                       f'memory_weights (got {len(row_of.table)})')
    weights = np.bincount(row_of.table, weights=weights)   # q_c = sum_{j in c} q_j
  weights = weights.astype(np.float32)
  base = local_sgd(loss_fn, optax.sgd(client_lr), name=name)

  def server_init(params):
    return FedVARPState(params, server_optimizer.init(params), store.zeros(params, len(weights)))

  def client_final(state, x, ctx: ClientContext):
    delta = base.client_final(state, x, ctx)
    return tree_map(jnp.subtract, delta, ctx.stored), delta

  def server_update(state: FedVARPState, correction, info: RoundInfo):
    del info
    v = tree_map(jnp.add, correction, mean_row(state.clients, weights))
    updates, opt_state = server_optimizer.update(v, state.opt_state, state.params)
    return FedVARPState(optax.apply_updates(state.params, updates), opt_state, state.clients)

  return base._replace(server_init=server_init, client_final=client_final,
                       server_update=server_update, store_row=row_of)


def objective_weights(counts, uniform: bool) -> np.ndarray:
  """FedVARP's ``q_j``: ``1/N`` for uniformly weighted clients, else ``n_j / n``."""
  counts = np.asarray(counts, np.float64)
  return np.full(counts.shape, 1. / len(counts)) if uniform else counts / counts.sum()


@dataclasses.dataclass(frozen=True)
class ClusterHparams:
  fedvarp_clusters: int = hparam(
      10, 'cluster_fedvarp: server memories K; client i belongs to cluster i mod K.',
      int_range(1))


def _cluster_fedvarp(hp: ClusterHparams, s):
  population = len(s.counts)
  if hp.fedvarp_clusters > population:
    raise ValueError(f'--fedvarp_clusters={hp.fedvarp_clusters} exceeds the population of '
                     f'{population} clients')
  return fedvarp(s.loss, s.client_lr, objective_weights(s.counts, s.uniform_weights), s.server,
                 clusters=np.arange(population) % hp.fedvarp_clusters, name='cluster_fedvarp')


_FEDVARP = ('Jhunjhunwala et al. 2022, "FedVARP: Tackling the Variance Due to Partial Client '
            'Participation in Federated Learning"')
FEDVARP = AlgorithmSpec(
    'fedvarp', lambda hp, s: fedvarp(s.loss, s.client_lr,
                                     objective_weights(s.counts, s.uniform_weights), s.server),
    stateful=True, paper=_FEDVARP,
    server='server memory `y_j` of every client\'s latest `Delta_j`; `--server_optimizer` on '
    '`sum_i p_i (Delta_i - y_i) + sum_j q_j y_j` (`q_j = n_j / n`, `1/N` with '
    '`--aggregation_weights=uniform`)')
CLUSTER_FEDVARP = AlgorithmSpec(
    'cluster_fedvarp', _cluster_fedvarp, ClusterHparams, stateful=True, paper=f'{_FEDVARP}, §5',
    server='as `fedvarp` with one memory per cluster (client `i` in cluster `i mod K`), set to '
    'the mean `Delta_i` of the cluster\'s sampled clients')
