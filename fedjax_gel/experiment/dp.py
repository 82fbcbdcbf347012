"""The experiment layer's side of client-level differential privacy: the ``privacy.Privacy``
settings a config asks for (``--dp_*``) and the accounting of its runs' rounds, which every
evaluation record and summary carry (``dp_epsilon`` at ``--dp_delta``, ``dp_sampling_rate``),
and the rounds a privacy budget allows (``--dp_target_epsilon``).

A round's cohort is ``C`` clients drawn uniformly without replacement from the ``N`` training
clients, a round ``SampledWithoutReplacementDpEvent(N, C, ...)`` (RDP only), or each client
independently with probability ``q = C / N`` (``--client_selection=poisson``), a round
``PoissonSampledDpEvent(q, ...)`` (RDP or PLD); ``validation.privacy_problem`` refuses the other
draws. Either way the fixed denominator is ``C``, the expected cohort. Without noise
(``--dp_noise_multiplier=0``) the clipping still runs and epsilon is infinite.
"""
from __future__ import annotations

import functools
import math
from typing import Optional

from fedjax_gel import privacy
from fedjax_gel.experiment.config import Config
from fedjax_gel.privacy import aggregation


def settings(c: Config) -> Optional[privacy.Privacy]:
  """What ``privacy.private`` needs for ``c``; None without differential privacy."""
  p = c.privacy
  if not p.on:
    return None
  cohort = c.cohort.clients_per_round
  adaptive = (aggregation.AdaptiveClip(p.target_quantile, p.clip_lr, p.count_noise(cohort))
              if p.target_quantile else None)
  noise = p.noise_multiplier
  if adaptive is not None and noise == 0:   # no noise anywhere: nothing to share
    adaptive = adaptive._replace(count_noise_std=0.)
  return privacy.Privacy(p.clip_norm, noise, float(cohort), adaptive)


def record_fields(c: Config, population: int, rounds: int) -> dict:
  """``{'dp_epsilon', 'dp_sampling_rate'}`` after ``rounds`` rounds of ``c`` over ``population``
  training clients; ``{}`` without differential privacy."""
  if not c.privacy.on:
    return {}
  k = c.cohort
  kind = 'poisson' if k.client_selection == 'poisson' else 'without_replacement'
  ways = privacy.Sampling(kind, population, k.clients_per_round)
  return {'dp_epsilon': _epsilon(c.privacy, ways, rounds), 'dp_sampling_rate': ways.rate}


@functools.lru_cache(maxsize=4096)
def _epsilon(p, ways: privacy.Sampling, rounds: int) -> float:
  if rounds == 0:
    return 0.
  if p.noise_multiplier == 0:
    return math.inf
  return _one_round(p, ways).epsilon(rounds, p.delta)


@functools.lru_cache(maxsize=64)
def _one_round(p, ways: privacy.Sampling) -> privacy.Composition:
  """One round's privacy loss, which every record's epsilon composes again."""
  if p.target_quantile:
    sigma = p.count_noise(int(ways.cohort))
    event = privacy.round_event(ways, aggregation.delta_noise_multiplier(p.noise_multiplier,
                                                                         sigma), sigma)
  else:
    event = privacy.round_event(ways, p.noise_multiplier)
  return privacy.Composition(event, ways, p.accountant)


def affordable_rounds(c: Config, population: int, rounds: int) -> int:
  """The most rounds, at most ``rounds``, whose epsilon stays within ``--dp_target_epsilon``
  (``rounds`` without a budget); epsilon grows with the rounds, so a bisection finds it."""
  target = c.privacy.target_epsilon
  if not c.privacy.on or not target:
    return rounds
  spent = lambda r: record_fields(c, population, r)['dp_epsilon']
  if spent(rounds) <= target:
    return rounds
  low, high = 0, rounds   # spent(low) <= target < spent(high)
  while high - low > 1:
    mid = (low + high) // 2
    low, high = (mid, high) if spent(mid) <= target else (low, mid)
  return low
