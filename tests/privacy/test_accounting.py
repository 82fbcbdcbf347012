"""Epsilon against dp_accounting called directly, and the identities the accounting rests on."""
import dp_accounting
import pytest
from dp_accounting import pld, rdp

from fedjax_gel import privacy
from fedjax_gel.privacy import aggregation

POISSON = privacy.Sampling('poisson', population=1000, cohort=20)
FIXED = privacy.Sampling('without_replacement', population=1000, cohort=20)


def direct(event, rounds, delta, accountant):
  return accountant.compose(dp_accounting.SelfComposedDpEvent(event, rounds)).get_epsilon(delta)


@pytest.mark.parametrize('kind', ['rdp', 'pld'])
@pytest.mark.slow
def test_poisson_rounds_are_accounted_as_the_library_does(kind):
  event = privacy.round_event(POISSON, 1.1)
  accountant = (rdp.RdpAccountant() if kind == 'rdp' else pld.PLDAccountant())
  expected = direct(dp_accounting.PoissonSampledDpEvent(0.02, dp_accounting.GaussianDpEvent(1.1)),
                    100, 1e-5, accountant)
  assert privacy.epsilon(event, 100, 1e-5, POISSON, kind) == expected


def test_a_fixed_size_cohort_is_sampled_without_replacement_replacing_one_client():
  """Replacing one client moves the clipped sum by up to 2C: the library's multiplier (std
  over sensitivity) is half the noise multiplier."""
  event = privacy.round_event(FIXED, 1.1)
  accountant = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
  expected = direct(dp_accounting.SampledWithoutReplacementDpEvent(
      1000, 20, dp_accounting.GaussianDpEvent(0.55)), 100, 1e-5, accountant)
  assert privacy.epsilon(event, 100, 1e-5, FIXED) == expected
  with pytest.raises(ValueError, match='--dp_accountant=rdp'):
    privacy.epsilon(event, 100, 1e-5, FIXED, 'pld')


def test_epsilon_grows_with_the_rounds_and_is_zero_before_any():
  event = privacy.round_event(POISSON, 1.0)
  eps = [privacy.epsilon(event, r, 1e-5, POISSON) for r in (0, 1, 10, 100, 1000)]
  assert eps[0] == 0 and all(a < b for a, b in zip(eps, eps[1:]))


def test_adaptive_clipping_costs_what_one_query_of_the_total_multiplier_costs():
  """Andrew et al. 2021, Theorem 1: the deltas at z_Delta and the count at 2 sigma_b compose to
  one Gaussian query of multiplier z (exactly, in RDP, without sampling)."""
  z, sigma_b = 1.0, 5.0
  z_delta = aggregation.delta_noise_multiplier(z, sigma_b)
  whole = privacy.Sampling('poisson', population=1000, cohort=1000)   # rate 1: no sampling
  both = privacy.epsilon(privacy.round_event(whole, z_delta, sigma_b), 50, 1e-5, whole)
  one = privacy.epsilon(privacy.round_event(whole, z), 50, 1e-5, whole)
  assert both == pytest.approx(one, rel=1e-6)


def test_samplings_without_an_event_are_refused():
  with pytest.raises(ValueError, match='Poisson sampling or a fixed-size cohort'):
    privacy.round_event(privacy.Sampling('with_replacement', 1000, 20), 1.0)


def test_adaptive_clipping_costs_one_query_of_the_total_multiplier_replacing_one_client_too():
  """With a fixed-size cohort (replacing one client: the sum moves by 2C, the centred count by
  1) the two queries still cost what one Gaussian query of multiplier z does."""
  z, sigma_b = 1.0, 5.0
  z_delta = aggregation.delta_noise_multiplier(z, sigma_b)
  both = privacy.epsilon(privacy.round_event(FIXED, z_delta, sigma_b), 50, 1e-5, FIXED)
  one = privacy.epsilon(privacy.round_event(FIXED, z), 50, 1e-5, FIXED)
  assert both == pytest.approx(one, rel=1e-6)
