"""Differential privacy through the experiment layer: the flags, the refusals, the records'
epsilon against dp_accounting called directly, and a resumed DP run."""
import io
import json
import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import rdp

from fedjax_gel.experiment import api, factories, validation
from fedjax_gel.experiment.config import ConfigError, make

from helpers import cli_run


def train(c, workdir):
  api.train(factories.prepare(c), str(workdir), err=io.StringIO())
  return [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]


@pytest.fixture(scope='module')
def private(tiny_leaf_file):
  return make(dataset='leaf', data_path=str(tiny_leaf_file), algorithm='dp_fedavg',
              num_rounds=12, eval_every=3, clients_per_round=3, batch_size=2,
              budget_range=(1, 3), client_lr=0.1, dp_clip_norm=0.5, dp_noise_multiplier=1.2,
              dp_delta=1e-4)


@pytest.mark.slow
def test_every_record_carries_the_epsilon_dp_accounting_gives(private, tmp_path):
  records = train(private, tmp_path)
  population = factories.prepare(private).train.counts.shape[0]
  assert private.cohort.aggregation_weights == 'uniform'   # DP's default weighting
  eps = []
  for r in records:
    accountant = rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    event = dp_accounting.SampledWithoutReplacementDpEvent(
        population, 3, dp_accounting.GaussianDpEvent(1.2 / 2))   # replacing one: 2C
    expected = (accountant.compose(dp_accounting.SelfComposedDpEvent(event, r['round']))
                .get_epsilon(1e-4) if r['round'] else 0.)
    assert r['dp_epsilon'] == expected and r['dp_sampling_rate'] == 3 / population
    eps.append(r['dp_epsilon'])
  assert all(a < b for a, b in zip(eps, eps[1:])) and math.isfinite(eps[-1])
  summary = json.loads((tmp_path / 'summary.json').read_text())
  assert summary['dp_epsilon'] == eps[-1]
  assert records[-1]['dp_clip_norm'] == 0.5


@pytest.mark.slow
def test_the_issues_poisson_command_trains_with_the_epsilon_dp_accounting_gives(tmp_path):
  """The quick start's flags with DP-FedAvg over Poisson-sampled cohorts, as launch/run.py
  runs them: every record's epsilon is the library's for PoissonSampledDpEvent(q = C / N) over
  its rounds, adding or removing one client, and the cohorts' sizes vary."""
  out = cli_run('--flagfile=launch/configs/quickstart.flags', '--algorithm=dp_fedavg',
                '--dp_clip_norm=1', '--dp_noise_multiplier=1.0', '--dp_delta=1e-5',
                '--client_selection=poisson', '--num_rounds=40', f'--workdir={tmp_path}',
                '--noplots')
  assert out.returncode == 0, out.stderr
  records = [json.loads(line) for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  q = records[0]['dp_sampling_rate']
  assert q == 20 / round(20 / q) < 0.1   # C / N for the N training clients
  for r in records[1:]:
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(1.0))
    expected = rdp.RdpAccountant().compose(
        dp_accounting.SelfComposedDpEvent(event, r['round'])).get_epsilon(1e-5)
    assert r['dp_epsilon'] == pytest.approx(expected, rel=1e-12)
  eps = [r['dp_epsilon'] for r in records]
  assert eps[0] == 0 and all(a < b for a, b in zip(eps, eps[1:])) and math.isfinite(eps[-1])
  per_round = np.diff([r['client_rounds'] for r in records]) / 5   # evaluated every 5 rounds
  assert len(set(per_round)) > 1 and 10 < per_round.mean() < 30   # about C = 20 a round


@pytest.mark.slow
def test_adaptive_clipping_moves_the_clip_and_its_run_resumes_to_the_bit(private, tmp_path):
  """Over Poisson-sampled cohorts, whose sizes and absent slots are part of what resumes."""
  c = private.replace(dp_target_quantile=0.5, dp_clip_lr=0.5, dp_clip_count_noise=1.0,
                      checkpoint_every=3, client_selection='poisson')
  whole = train(c, tmp_path / 'whole')
  assert len({r['dp_clip_norm'] for r in whole[1:]}) > 1   # the clip moved
  train(c.replace(num_rounds=6), tmp_path / 'resumed')   # stopped at a checkpoint
  err = io.StringIO()
  api.train(factories.prepare(c), str(tmp_path / 'resumed'), err=err, resume=True)
  assert 'resuming from the checkpoint of round 6' in err.getvalue()
  again = [json.loads(line) for line in
           (tmp_path / 'resumed' / 'metrics.jsonl').read_text().splitlines()]
  strip = lambda rows: [{k: v for k, v in r.items() if k != 'elapsed_s'} for r in rows]
  assert strip(again) == strip(whole)


@pytest.mark.parametrize('changes, message', [
    ({'algorithm': 'dp_fedavg'}, '--algorithm=dp_fedavg needs --dp_clip_norm > 0'),
    ({'algorithm': 'scaffold', 'dp_clip_norm': 1.}, '--dp_clip_norm=1: --algorithm=scaffold'),
    ({'algorithm': 'fednova', 'dp_clip_norm': 1.}, '--dp_clip_norm=1: --algorithm=fednova'),
    ({'dp_clip_norm': 1., 'aggregation_weights': 'samples_seen'},
     '--aggregation_weights=samples_seen: differential privacy weighs clients uniformly'),
    ({'dp_clip_norm': 1., 'sample_with_replacement': True}, '--sample_with_replacement'),
    ({'dp_clip_norm': 1., 'client_selection': 'cyclic'}, '--client_selection=cyclic'),
    ({'dp_clip_norm': 1., 'dp_accountant': 'pld'}, '--dp_accountant=pld: dp-accounting\'s PLD '
     'accountant does not account for a fixed-size cohort'),
    ({'dp_clip_norm': 1., 'dp_accountant': 'pld', 'client_selection': 'poisson',
      'dp_target_quantile': 0.5}, '--dp_accountant=pld: dp-accounting\'s PLD accountant does not '
     'account for adaptive clipping'),
    ({'dp_clip_norm': 1., 'dp_target_quantile': 0.5, 'dp_clip_count_noise': 0.4},
     '--dp_clip_count_noise=0.4 leaves nothing'),
    ({'dp_clip_norm': 1., 'model_state': 'local'}, '--model_state=local'),
    ({'dp_clip_norm': 1., 'budget_draw': 'proportional'}, '--budget_draw=proportional'),
    ({'dp_clip_norm': 1., 'algorithm': 'gel', 'guess_policy': 'cohort_max',
      'budget_unit': 'epochs'}, '--guess_policy=cohort_max with --budget_unit=epochs'),
    ({'dp_clip_norm': -1.}, '--dp_clip_norm must be >= 0'),
    ({'dp_clip_norm': 1., 'dp_delta': 1.}, '--dp_delta must lie in (0, 1)'),
])
def test_what_differential_privacy_cannot_protect_or_account_is_refused(changes, message):
  with pytest.raises(ConfigError) as e:
    validation.validate(make(**changes))
  assert str(e.value).startswith(message) and '\n' not in str(e.value)


def test_the_dp_flags_are_unread_without_differential_privacy():
  unread = validation.unread_flags(make(dp_noise_multiplier=2.))
  assert 'dp_noise_multiplier' in unread and 'dp_clip_norm' not in unread
  assert 'dp_clip_lr' in validation.unread_flags(make(dp_clip_norm=1.))
  assert 'dp_clip_lr' not in validation.unread_flags(make(dp_clip_norm=1., dp_target_quantile=.5))


@pytest.mark.slow
def test_a_privacy_budget_stops_the_run_after_its_last_affordable_round(private, tmp_path):
  population = factories.prepare(private).train.counts.shape[0]

  def spent(rounds):
    accountant = rdp.RdpAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    event = dp_accounting.SampledWithoutReplacementDpEvent(
        population, 3, dp_accounting.GaussianDpEvent(1.2 / 2))
    return accountant.compose(dp_accounting.SelfComposedDpEvent(event, rounds)).get_epsilon(1e-4)

  budget = (spent(7) + spent(8)) / 2   # round 7 fits, round 8 would not
  err = io.StringIO()
  api.train(factories.prepare(private.replace(dp_target_epsilon=budget)), str(tmp_path), err=err)
  records = [json.loads(line) for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  assert [r['round'] for r in records] == [0, 3, 6, 7]   # the last round evaluated
  assert records[-1]['dp_epsilon'] == spent(7) <= budget
  summary = json.loads((tmp_path / 'summary.json').read_text())
  assert summary['rounds'] == 7 and summary['status'] == 'finished'
  assert 'allows 7 of its 12 rounds' in err.getvalue()
  assert sorted(p.name for p in tmp_path.glob('checkpoint-*')) == ['checkpoint-7']
  # more rounds asked of the stopped run: it extends from its last round, and the budget
  # still allows none beyond round 7
  err = io.StringIO()
  api.train(factories.prepare(private.replace(dp_target_epsilon=budget, num_rounds=20)),
            str(tmp_path), err=err)
  again = [json.loads(line) for line in (tmp_path / 'metrics.jsonl').read_text().splitlines()]
  strip = lambda rows: [{k: v for k, v in r.items() if k != 'elapsed_s'} for r in rows]
  assert strip(again) == strip(records), err.getvalue()
  assert 'allows 7 of its 20 rounds' in err.getvalue()


@pytest.mark.slow
def test_a_budget_no_round_fits_is_refused_and_zero_noise_spends_infinity(private, tmp_path):
  with pytest.raises(ConfigError, match='--dp_target_epsilon=0.001: one round already spends'):
    api.train(factories.prepare(private.replace(dp_target_epsilon=1e-3)), str(tmp_path / 'a'),
              err=io.StringIO())
  records = train(private.replace(dp_noise_multiplier=0., dp_target_quantile=0.5, num_rounds=3),
                  tmp_path / 'b')   # clipped, adapted, not private: epsilon is infinite,
  assert records[0]['dp_epsilon'] == 0 and records[-1]['dp_epsilon'] is None   # JSON's null
