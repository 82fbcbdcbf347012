"""Client-level privacy accounting with Google's ``dp-accounting`` library (no accountant of our
own): a DP round is one sampled Gaussian query, or two composed with adaptive clipping, and
``epsilon`` composes it over the rounds run.

The sampling the round actually used decides the event and the neighbouring relation:

* Poisson sampling (each client independently with rate ``q``):
  ``PoissonSampledDpEvent(q, ...)``, adding or removing one client;
* a fixed-size cohort drawn uniformly without replacement (``C`` of ``N``):
  ``SampledWithoutReplacementDpEvent(N, C, ...)``, replacing one client (RDP only: the
  library's PLD accountant does not take it).

Sampling with replacement, power-of-d and cyclic selection have no event in the library: a DP
run with them is refused (``event`` raises). The privacy unit is the client; the server is
trusted (no secure aggregation is simulated).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import dp_accounting
from absl import logging
from dp_accounting import pld, rdp

ACCOUNTANTS = ('rdp', 'pld')
"""The ``dp-accounting`` accountants ``epsilon`` and ``Composition`` take (``kind``)."""


class Sampling(NamedTuple):
  """How a round's cohort was drawn, which decides the event and the neighbouring relation.

  Attributes:
    kind: ``'poisson'`` (each client with rate ``cohort / population``; add or remove one
      client) or ``'without_replacement'`` (exactly ``cohort`` of ``population``; replace one
      client).
    population: ``N``, the clients.
    cohort: the expected (Poisson) or exact cohort size.
  """
  kind: str
  population: int
  cohort: float

  @property
  def rate(self) -> float:
    """The probability that a given client takes part in a round."""
    return self.cohort / self.population


def round_event(sampling: Sampling, noise_multiplier: float,
                count_noise_std: Optional[float] = None) -> dp_accounting.DpEvent:
  """One DP round's ``dp_accounting`` event, subsampled as the cohort was drawn.

  The Gaussian sum of clipped updates, composed with the Gaussian count of adaptive clipping
  when its noise is given. The library's multiplier is the noise std over the query's L2
  sensitivity between neighbours: adding or removing one client moves the sum by ``C`` and the
  centred count (Andrew et al. 2021, Differentially Private Learning with Adaptive Clipping) by
  1/2; replacing one client moves them by ``2C`` and 1.

  Args:
    sampling: how the round's cohort was drawn.
    noise_multiplier: the sum's noise std over the clip norm ``C``.
    count_noise_std: the noise std of adaptive clipping's count; None: a fixed clip norm.

  Returns:
    A ``PoissonSampledDpEvent`` or ``SampledWithoutReplacementDpEvent``.

  Raises:
    ValueError: a sampling the library has no event of (with replacement, power-of-d, cyclic).
  """
  scale = 1. if sampling.kind == 'poisson' else 0.5   # sensitivity C, or 2C replacing one
  query = dp_accounting.GaussianDpEvent(noise_multiplier * scale)
  if count_noise_std is not None:
    query = dp_accounting.ComposedDpEvent(
        [query, dp_accounting.GaussianDpEvent(2 * count_noise_std * scale)])
  if sampling.kind == 'poisson':
    return dp_accounting.PoissonSampledDpEvent(sampling.rate, query)
  if sampling.kind == 'without_replacement':
    return dp_accounting.SampledWithoutReplacementDpEvent(
        sampling.population, int(sampling.cohort), query)
  raise ValueError(f'no privacy accounting for cohorts drawn {sampling.kind!r}: use Poisson '
                   'sampling or a fixed-size cohort drawn without replacement')


def accountant(sampling: Sampling, kind: str = 'rdp') -> dp_accounting.PrivacyAccountant:
  """A fresh accountant of ``kind`` (``ACCOUNTANTS``) for ``sampling``'s neighbouring relation:
  add or remove one client under Poisson sampling, replace one for a fixed-size cohort."""
  relation = (dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE if sampling.kind == 'poisson'
              else dp_accounting.NeighboringRelation.REPLACE_ONE)
  if kind == 'rdp':
    return rdp.RdpAccountant(neighboring_relation=relation)
  if kind == 'pld':
    return pld.PLDAccountant(neighboring_relation=relation)
  raise ValueError(f'unknown accountant {kind!r}: one of {", ".join(ACCOUNTANTS)}')


class Composition:
  """One round's event, composed over any number of rounds: ``epsilon(rounds, delta)``.

  An RDP accountant composes ``T`` rounds as ``T`` times one round's RDP curve, which is computed
  once here and scaled for every ``T`` (as the library does for a ``SelfComposedDpEvent``: a
  run's records each cost one optimisation over the orders, not a new curve, which is slow to
  compute for a fixed-size cohort); a PLD accountant composes the event again each time.

  Args:
    event: one round's event (``round_event``).
    sampling: how the cohorts are drawn (the neighbouring relation).
    kind: the accountant, one of ``ACCOUNTANTS``.

  Raises:
    ValueError: the accountant cannot account for the event (PLD with a fixed-size cohort, or
      with adaptive clipping's composed query), or an unknown accountant.

  Examples:
    >>> from fedjax_gel import privacy
    >>> sampling = privacy.Sampling('poisson', population=1000, cohort=10)
    >>> spent = privacy.Composition(privacy.round_event(sampling, 1.0), sampling)
    >>> [round(spent.epsilon(t, 1e-5), 2) for t in (0, 100)]
    [0.0, 1.21]
  """

  def __init__(self, event: dp_accounting.DpEvent, sampling: Sampling, kind: str = 'rdp'):
    self.event, self.sampling, self.kind = event, sampling, kind
    acc = accountant(sampling, kind)
    if not acc.supports(event):
      raise ValueError(f'the {kind} accountant cannot account for this round (cohorts drawn '
                       f'{sampling.kind.replace("_", " ")}'
                       f'{", adaptive clipping" if _composed(event) else ""}): use '
                       '--dp_accountant=rdp')
    self._curve = None
    if kind == 'rdp':
      # the library logs a warning for each order whose series does not converge (large q,
      # small z) and leaves that order out of the optimum: nothing for the user to act on
      verbosity = logging.get_verbosity()
      logging.set_verbosity(logging.ERROR)
      try:
        acc.compose(event)
      finally:
        logging.set_verbosity(verbosity)
      self._curve = (acc._orders, acc._rdp)   # pylint: disable=protected-access

  def epsilon(self, rounds: int, delta: float) -> float:
    """The epsilon at ``delta`` after ``rounds`` rounds (0 after none)."""
    if rounds == 0:
      return 0.
    if self._curve is not None:
      orders, curve = self._curve
      return float(rdp.compute_epsilon(orders, rounds * curve, delta)[0])
    acc = accountant(self.sampling, self.kind)
    return float(acc.compose(dp_accounting.SelfComposedDpEvent(self.event, rounds)).get_epsilon(
        delta))


def _composed(event) -> bool:
  return isinstance(getattr(event, 'event', None), dp_accounting.ComposedDpEvent)


def epsilon(event: dp_accounting.DpEvent, rounds: int, delta: float, sampling: Sampling,
            kind: str = 'rdp') -> float:
  """The epsilon at ``delta`` after ``rounds`` rounds of ``event`` (``Composition``).

  Args:
    event: one round's event (``round_event``).
    rounds: the rounds run (0: epsilon 0).
    delta: the target delta.
    sampling: how the cohorts are drawn.
    kind: the accountant, one of ``ACCOUNTANTS``.

  Returns:
    The epsilon.

  Raises:
    ValueError: as ``Composition``.
  """
  return Composition(event, sampling, kind).epsilon(rounds, delta)
