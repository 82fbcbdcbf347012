"""The rounds-to-target table against hand-made summaries."""
from fedjax_gel.experiment.report import rounds_table


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
