"""The rounds-to-target table against hand-made summaries."""
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
  assert 'rounds to 0.6000 (fedavg max)' in rows[0]
  # 2 MiB over 2 clients x 10 rounds: 102.4 KiB up per client and round, twice that down.
  assert rows[2] == ('| fedavg | 0.1 | 102.40 | 204.80 | 1.00e-03 | 0.6000 | 10 | 2.00 | 200 | '
                     '10 | 2.00 | 200 |')
  assert rows[3] == ('| fedgbo_sgdm | 0.3 | 204.80 | 409.60 | 1.00e-03 | 0.8000 | 10 | 4.00 | '
                     '200 | 5 | 2.00 | 100 |')
