"""The report's tables against hand-made summaries and metrics."""
import math
import statistics

import pytest

from fedjax_gel.experiment import report
from fedjax_gel.experiment.report import cost_table, rounds_table


def summary(alg, seed, rounds, best, final):
  return {'algorithm': alg, 'seed': seed, 'rounds_to_target': rounds, 'best_accuracy': best,
          'final_accuracy': final, 'target_accuracy': 0.85}


def test_rounds_table_by_hand():
  rows = rounds_table([
      summary('gel', 1, 110, 0.90, 0.89), summary('fedavgcm', 0, 150, 0.89, 0.88),
      summary('gel', 0, 120, 0.92, 0.91), summary('fedavgcm', 1, None, 0.84, 0.83),
  ]).splitlines()
  assert rows[0].startswith('| algorithm | seeds | rounds to 85% per seed | mean rounds to 85%')
  assert rows[2] == '| gel | 0,1 | 120, 110 | 115.0 | 0.9100 | 0.9000 |'
  assert rows[3] == '| fedavgcm | 0,1 | 150, - | 150.0 (1/2 reached) | 0.8650 | 0.8550 |'


def test_rounds_table_gives_the_epsilon_spent_and_inf_without_noise():
  private = lambda seed, eps: {**summary('dp_fedavg', seed, None, 0.5, 0.4), 'dp_epsilon': eps}
  rows = rounds_table([private(0, 2.0), private(1, 3.0)]).splitlines()
  assert rows[0].endswith(' epsilon spent |') and rows[2].endswith('| 2.5 |')
  rows = rounds_table([private(0, None), private(1, None)]).splitlines()   # null: infinite
  assert rows[2].endswith('| inf |')


def record(rnd, acc, up, grads):
  return {'round': rnd, 'test_accuracy': acc, 'bytes_up': up, 'bytes_down': 2 * up,
          'grad_computations': grads, 'client_rounds': 2 * rnd, 'client_distance': 1e-3}


def test_cost_table_by_hand():
  mib = 2 ** 20
  avg = ({'algorithm': 'fedavg', 'client_lr': 0.1, 'best_accuracy': 0.6},
         [record(0, 0.1, 0, 0), record(5, 0.5, mib, 100), record(10, 0.6, 2 * mib, 200)])
  gbo = ({'algorithm': 'fedgbo_sgdm', 'client_lr': 0.3, 'best_accuracy': 0.8},
         [record(0, 0.1, 0, 0), record(5, 0.65, 2 * mib, 100), record(10, 0.8, 4 * mib, 200)])
  rows = cost_table([avg, gbo]).splitlines()
  assert 'rounds to 0.6000 (fedavg best)' in rows[0]
  # 2 MiB over 2 clients x 10 rounds: 102.4 KiB up per client and round, twice that down.
  assert rows[2] == ('| fedavg | 0.1 | 102.40 | 204.80 | 1.00e-03 | 0.6000 | 10 | 2.00 | 200 | '
                     '10 | 2.00 | 200 |')
  assert rows[3] == ('| fedgbo_sgdm | 0.3 | 204.80 | 409.60 | 1.00e-03 | 0.8000 | 10 | 4.00 | '
                     '200 | 5 | 2.00 | 100 |')


def run(alg, seed, accs, step=10):
  """A run evaluated every ``step`` rounds with test accuracies ``accs``; 1 MiB up, 2 down and
  10 gradients per round."""
  mib = 2 ** 20
  records = [{'round': step * i, 'test_accuracy': a, 'bytes_up': step * i * mib,
              'bytes_down': 2 * step * i * mib, 'grad_computations': 10 * step * i}
             for i, a in enumerate(accs)]
  return {'algorithm': alg, 'seed': seed, 'target_accuracy': 0.85}, records


def test_mean_ci_by_hand():
  mean, half = report.mean_ci([100, 110])
  assert mean == 105 and abs(half - 12.706 * 7.0710678 / 1.4142136) < 1e-3   # t_{0.975, 1}
  mean, half = report.mean_ci([1., 2., 3., 4., 5.])
  assert mean == 3 and abs(half - 2.776 * 1.5811388 / 2.2360680) < 1e-4     # t_{0.975, 4}
  assert math.isnan(report.mean_ci([7.])[1])


def test_baseline_pairing():
  names = ['fedprox', 'fedprox_gel', 'fedavgcm', 'gel', 'fednova_gel', 'fedyogi']
  assert report.baseline_of('fedprox_gel', names) == 'fedprox'
  assert report.baseline_of('gel', names) == 'fedavgcm'
  assert report.baseline_of('fednova_gel', names) == 'fedprox'   # fednova did not run: first
  assert report.baseline_of('fedyogi', names) == 'fedprox'


def test_paired_table_by_hand():
  #            round:  0    10   20   30    40    50
  runs = [run('fedavgcm', 0, [0.1, 0.5, 0.8, 0.84, 0.86, 0.88]),    # reaches 85% at 40
          run('fedavgcm', 1, [0.1, 0.6, 0.8, 0.86, 0.87, 0.88]),    # at 30
          run('gel', 0, [0.1, 0.7, 0.86, 0.87, 0.89, 0.90]),        # at 20
          run('gel', 1, [0.1, 0.7, 0.84, 0.88, 0.89, 0.90])]        # at 30
  rows = report.paired_table(runs).splitlines()
  assert rows[0].startswith('| algorithm | baseline | seeds reaching 85% | rounds to 85% (mean')
  half = 12.706 * 7.0710678 / 1.4142136   # both pairs of rounds differ by 10
  assert rows[2] == (f'| fedavgcm | - | 2/2 | 35.0 +- {half:.1f} | - | - | 350 | 35.00 | '
                     '70.00 |')
  # speedup (35 - 25) / 25; beyond: gel at 40 (seed 0) 0.89, at 30 (seed 1) 0.88 -> +4, +3 pp
  beyond_half = 12.706 * 0.7071068 / 1.4142136
  # two seeds: Fieller's interval is unbounded (t_{0.975, 1} = 12.7 swamps mean(R_gel))
  assert rows[3] == (f'| gel | fedavgcm | 2/2 | 25.0 +- {half:.1f} | +40.0% (unbounded; 2/2 '
                     f'seeds) | 3.50 +- {beyond_half:.2f} | 250 | 25.00 | 50.00 |')


def test_speedup_ci_bounds_are_where_the_paired_t_test_turns():
  # Fieller's bounds q = 1 + s are where the mean of d_k = R_base,k - q R_k is exactly
  # t_{0.975, n-1} standard errors from 0: checked directly, without the quadratic.
  base = [150., 140., 160., 135., 155., 148.]
  gel = [120., 118., 125., 116., 130., 112.]
  s, low, high = report.speedup_ci(base, gel)
  assert s == pytest.approx(sum(base) / sum(gel) - 1)
  assert low < s < high
  for bound in (low, high):
    d = [b - (1 + bound) * g for b, g in zip(base, gel)]
    t = statistics.mean(d) / (statistics.stdev(d) / math.sqrt(len(d)))
    assert abs(t) == pytest.approx(2.571, rel=1e-9)   # t_{0.975, 5}
  # just inside the interval the paired t-test does not reject
  d = [b - (1 + (low + high) / 2) * g for b, g in zip(base, gel)]
  assert abs(statistics.mean(d) / (statistics.stdev(d) / math.sqrt(6))) < 2.571


def test_speedup_ci_edge_cases():
  s, low, high = report.speedup_ci([150., 120., 90.], [100., 80., 60.])   # every seed +50%
  assert (s, low, high) == pytest.approx((0.5, 0.5, 0.5))
  s, low, high = report.speedup_ci([150.], [100.])
  assert s == 0.5 and math.isnan(low) and math.isnan(high)
  with pytest.raises(ValueError, match='same seeds'):
    report.speedup_ci([1., 2.], [1.])
  assert report.speedup_text(0.171, 0.12, 0.24, 38, 40) == '+17.1% (+12.0% to +24.0%; 38/40 seeds)'
  # the initial model already meets the target: round 0 on both sides, a speedup undefined
  # (a ZeroDivisionError stopped every report before)
  assert all(map(math.isnan, report.speedup_ci([0., 0.], [0., 0.])))
  assert all(map(math.isnan, report.speedup_ci([5.], [0.])))
  assert report.speedup_text(*report.speedup_ci([0.], [0.]), 1, 1) == (
      '- (target met at round 0; 1/1 seeds)')
  assert report.speedup_ci([0., 0.], [5., 10.])[0] == -1.


def test_paired_table_speedup_only_over_seeds_both_reached():
  #       round:  0    10    20    30
  runs = [run('fedavgcm', 0, [0.1, 0.5, 0.86, 0.9]),   # 20
          run('fedavgcm', 1, [0.1, 0.5, 0.8, 0.86]),   # 30
          run('fedavgcm', 2, [0.1, 0.5, 0.8, 0.8]),    # never: seed 2 leaves the pair
          run('gel', 0, [0.1, 0.86, 0.9, 0.9]),        # 10
          run('gel', 1, [0.1, 0.5, 0.86, 0.9]),        # 20
          run('gel', 2, [0.1, 0.86, 0.9, 0.9])]        # 10
  row = report.paired_table(runs).splitlines()[3].split(' | ')
  # over seeds 0 and 1: 25 / 15 - 1, not the means over different seed sets (25 / 13.3 - 1)
  assert row[2:5] == ['3/3', f'13.3 +- {report.mean_ci([10, 20, 10])[1]:.1f}',
                      '+66.7% (unbounded; 2/3 seeds)']


def test_paired_table_when_a_run_never_reaches_the_target():
  runs = [run('fedprox', 0, [0.1, 0.9]), run('fedprox_gel', 0, [0.1, 0.5])]
  rows = report.paired_table(runs).splitlines()
  assert rows[2] == '| fedprox | - | 1/1 | 10.0 | - | - | 100 | 10.00 | 20.00 |'
  assert rows[3] == '| fedprox_gel | fedprox | 0/1 | - | - | -35.00 | - | - | - |'


def test_paired_table_when_the_initial_models_meet_the_target():
  """Both reach the target at round 0: the table says so where the speedup would be (the
  report stopped with a ZeroDivisionError before)."""
  runs = [run('fedavgcm', 0, [0.9, 0.95]), run('gel', 0, [0.9, 0.97])]
  row = report.paired_table(runs).splitlines()[3].split(' | ')
  assert row[2:5] == ['1/1', '0.0', '- (target met at round 0; 1/1 seeds)']
  assert row[5] == '-'   # the accuracy beyond target at round 0: the same initial model's


def test_an_algorithm_whose_every_learning_rate_diverged_is_named_and_left_out():
  """Its runs of every learning rate were merged into one row (four rates averaged, the
  diverged runs shown as ordinary ones)."""
  records = [record(0, 0.3, 0, 0), record(50, 0.86, 100, 500)]
  runs = [({**summary('fedavg', s, 50, 0.9 - lr, 0.8), 'client_lr': lr}, records)
          for s in (0, 1) for lr in (0.1, 0.3)]
  runs += [({**summary('fedavgcm', s, None, 0.3, 0.3), 'client_lr': lr, 'status': 'diverged'},
            records[:1]) for s in (0, 1) for lr in (0.1, 0.3)]
  assert [(s['algorithm'], s['client_lr']) for s, _ in report.kept_runs(runs, 'client_lr')] == [
      ('fedavg', 0.1), ('fedavg', 0.1)]
  text = report.report_text(runs, 'client_lr')
  assert 'fedavg 0.1, fedavgcm: every value diverged (left out below)' in text.splitlines()[0]
  assert '| fedavgcm |' not in text


def test_a_tie_of_learning_rates_goes_to_the_first_given():
  runs = [({**summary('fedavg', 0, 50, 0.9, 0.8), 'client_lr': lr}, []) for lr in (0.3, 0.1)]
  assert report.best_values(runs) == {'fedavg': 0.3}
  assert 'on a tie, the first value given' in report.SELECTION_RULE


def test_a_report_of_runs_that_all_diverged_says_so():
  """An IndexError in the paired table when every value of every algorithm diverged."""
  records = [record(0, 0.3, 0, 0)]
  runs = [({**summary('fedavgcm', 0, None, 0.3, 0.3), 'client_lr': lr, 'status': 'diverged'},
           records) for lr in (0.1, 0.3)]
  text = report.report_text(runs, 'client_lr')
  assert text.splitlines()[-1] == 'No table: every run diverged.'
  assert 'fedavgcm: every value diverged (left out below)' in text


def test_t_95_beyond_the_table_is_students_not_the_normals():
  """Beyond 30 degrees of freedom it was 1.96: a 40-seed interval 3% too narrow, and a jump from
  2.042 at 31 values to 1.96 at 32. Reference quantiles: R's ``qt(0.975, nu)``."""
  exact = {31: 2.039513, 39: 2.022691, 60: 2.000298, 120: 1.979930, 1000: 1.962339}
  for nu, t in exact.items():
    assert abs(report.t_95(nu + 1) - t) < 1e-4, nu
  assert report.t_95(31) == 2.042 and report.t_95(31) > report.t_95(32) > report.t_95(33)


def test_rounds_to_target():
  recs = [{'round': 0, 'test_accuracy': 0.1}, {'round': 5, 'test_accuracy': 0.85},
          {'round': 10, 'test_accuracy': 0.8}, {'round': 15, 'test_accuracy': 0.9}]
  assert report.rounds_to_target(recs, 0.85) == 5
  assert report.rounds_to_target(recs, 0.05) == 0
  assert report.rounds_to_target(recs, 0.86) == 15
  assert report.rounds_to_target(recs, 0.95) is None
  assert report.rounds_to_target([], 0.5) is None
