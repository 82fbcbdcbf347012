"""Client-level differential privacy for any algorithm whose upload is its model delta: the
``private`` wrapper clips each client's upload inside the vmapped round and replaces the
server's mean by DP-FedAvg's noised fixed-denominator mean (``aggregation``), with the clip norm
adapted round by round when asked (Andrew et al. 2021).

The uploads are weighted uniformly (``--aggregation_weights=uniform``: a client's influence is
bounded by the clip norm whatever its data), summed over every chunk and device by the engine,
and noised once, with the round's server key (``core.keys.SERVER``): a DP run is reproducible to
the bit like any other. The noise is released in every round, with clients or without (an
empty Poisson round), so the server steps in every round.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from fedjax_gel.core.algorithm import FederatedAlgorithm, RoundInfo
from fedjax_gel.privacy import aggregation


class Privacy(NamedTuple):
  """Client-level DP settings for ``private``.

  Attributes:
    clip_norm: the (initial) clip norm ``C``.
    noise_multiplier: the total noise multiplier ``z`` (noise std over ``C``), shared with
      adaptive clipping's count where there is one.
    expected_clients: ``W``, the expected number of clients a round (the fixed denominator).
    adaptive: adaptive clipping's settings; None: a fixed ``C``.
  """
  clip_norm: float
  noise_multiplier: float
  expected_clients: float
  adaptive: Optional[aggregation.AdaptiveClip] = None

  @property
  def delta_noise_multiplier(self) -> float:
    """The deltas' share of ``z`` (all of it without adaptive clipping)."""
    if self.adaptive is None:
      return self.noise_multiplier
    return aggregation.delta_noise_multiplier(self.noise_multiplier,
                                              self.adaptive.count_noise_std)


class PrivateServer(NamedTuple):
  inner: object
  clip_norm: jax.Array   # float32 scalar: this round's C


class PrivateBroadcast(NamedTuple):
  inner: object
  clip_norm: jax.Array


class PrivateUpload(NamedTuple):
  """A client's clipped upload and its centred bit ``[||Delta_i|| <= C] - 1/2``; as the server's
  mean, the noised mean and the noised fraction ``b`` of clients at or below ``C``."""
  delta: object
  below: jax.Array


def private(algorithm: FederatedAlgorithm, settings: Privacy) -> FederatedAlgorithm:
  """Makes an algorithm client-level differentially private (DP-FedAvg's aggregation).

  DP-FedAvg (McMahan et al. 2018, Learning Differentially Private Recurrent Language Models):
  each client's upload is clipped to L2 norm ``C`` and the server's mean replaced by the
  noised fixed-denominator mean ``(sum_i m_i clip(Delta_i, C) + N(0, (z C)^2 I)) / W``, noised
  once a round with the round's server key, in every round; with ``settings.adaptive`` the clip
  norm adapts (Andrew et al. 2021). Each round reports ``dp_clip_norm`` (and
  ``dp_below_fraction``) as diagnostics. The clients should be weighted uniformly.

  Args:
    algorithm: an algorithm whose upload is its model delta, the whole of it (FedAvg, FedAvgCM,
      GeL, FedProx, the FedOpt servers).
    settings: the DP settings.

  Returns:
    The private ``FederatedAlgorithm``.

  Raises:
    ValueError: an algorithm with per-client state (a store): what it keeps per client is not
      protected.

  Examples:
    >>> import optax
    >>> import fedjax_gel as fg
    >>> from fedjax_gel import privacy
    >>> model = fg.get_model('logistic', (60,), 5)
    >>> alg = privacy.private(fg.fedavg(fg.cross_entropy_loss(model), optax.sgd(0.1)),
    ...                       privacy.Privacy(clip_norm=1.0, noise_multiplier=1.0,
    ...                                       expected_clients=20))
  """
  if algorithm.store_row is not None:
    raise ValueError(f'{algorithm.name} keeps state per client, which differential privacy '
                     'does not protect: choose an algorithm whose upload is its model delta')
  z_delta = settings.delta_noise_multiplier
  adaptive = settings.adaptive

  def server_init(params):
    return PrivateServer(algorithm.server_init(params), jnp.float32(settings.clip_norm))

  def broadcast(state: PrivateServer):
    return PrivateBroadcast(algorithm.broadcast(state.inner), state.clip_norm)

  def client_final(client, bcast: PrivateBroadcast, ctx):
    clipped, norm = aggregation.clip(algorithm.client_final(client, bcast.inner, ctx),
                                     bcast.clip_norm)
    return PrivateUpload(clipped, (norm <= bcast.clip_norm).astype(jnp.float32) - 0.5)

  def aggregate(state: PrivateServer, upload_sum: PrivateUpload, info: RoundInfo, key):
    del info
    k_delta, k_count = jax.random.split(key)
    delta = aggregation.noised(upload_sum.delta, state.clip_norm, z_delta,
                               settings.expected_clients, k_delta)
    below = (jnp.float32(0.) if adaptive is None else aggregation.noised_fraction(
        upload_sum.below, settings.expected_clients, adaptive.count_noise_std, k_count))
    return PrivateUpload(delta, below)

  def server_update(state: PrivateServer, mean: PrivateUpload, info: RoundInfo):
    clip_norm = (state.clip_norm if adaptive is None else
                 aggregation.next_clip(state.clip_norm, mean.below, adaptive))
    return PrivateServer(algorithm.server_update(state.inner, mean.delta, info),
                         clip_norm.astype(jnp.float32))

  def diagnostics(state: PrivateServer, mean: PrivateUpload, info: RoundInfo):
    own = {'dp_clip_norm': state.clip_norm}
    if adaptive is not None:
      own['dp_below_fraction'] = mean.below
    inner = ({} if algorithm.diagnostics is None else
             algorithm.diagnostics(state.inner, mean.delta, info))
    return {**inner, **own}

  return algorithm._replace(
      server_init=server_init, broadcast=broadcast,
      client_init=lambda bcast, ctx: algorithm.client_init(bcast.inner, ctx),
      client_step=lambda client, batch, bcast: algorithm.client_step(client, batch, bcast.inner),
      client_final=client_final, server_update=server_update,
      server_params=lambda state: algorithm.server_params(state.inner),
      pre_pass_fn=(None if algorithm.pre_pass_fn is None else
                   lambda bcast, batch: algorithm.pre_pass_fn(bcast.inner, batch)),
      diagnostics=diagnostics, aggregate=aggregate)
