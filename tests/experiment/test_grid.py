"""Learning-rate grids as one vmapped program: each cell is the run of its own learning rates,
diverged cells are marked and do not disturb the others."""
import io
import json

import numpy as np
import pytest

from fedjax_gel.experiment import api, factories, grid, planning
from fedjax_gel.experiment.config import ConfigError, make
from fedjax_gel.experiment.sweep import Sweep

import helpers

CLIENT_LRS, SERVER_LRS = [0.03, 0.1, 1e38], [0.5, 1.0]   # client lr 1e38 overflows


def read_jsonl(path):
  return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope='module', params=['gel', 'fedyogi'])
def grid_run(request, tiny_leaf_file, tmp_path_factory):
  c = make(dataset='leaf', data_path=str(tiny_leaf_file), algorithm=request.param,
             num_rounds=4, eval_every=2, clients_per_round=3, batch_size=2, budget_range=(1, 3),
             target=0.5)
  workdir = tmp_path_factory.mktemp(f'grid_{request.param}')
  (result,) = api.run(c, str(workdir), Sweep(client_lrs=CLIENT_LRS, server_lrs=SERVER_LRS),
                      out=io.StringIO(), err=io.StringIO())
  return c, factories.prepare(c), workdir, result


@pytest.mark.slow
def test_each_cell_is_the_run_of_its_learning_rates(grid_run, tmp_path):
  """Every finite cell's test accuracy at every evaluation equals that of a separate run with
  the same seed and the cell's (client lr, server lr)."""
  c, exp, workdir, _ = grid_run
  records = read_jsonl(workdir / 'metrics.jsonl')
  for lc in CLIENT_LRS[:2]:
    for ls in SERVER_LRS:
      single = c.replace(client_lr=lc, server_lr=ls)
      out = tmp_path / f'{lc}_{ls}'
      api.train(factories.with_config(exp, single), str(out), err=io.StringIO())
      alone = [(r['round'], r['test_accuracy'], r['test_loss'])
               for r in read_jsonl(out / 'metrics.jsonl')]
      cell = [(r['round'], r['test_accuracy'], r['test_loss']) for r in records
              if np.isclose(r['client_lr'], lc) and np.isclose(r['server_lr'], ls)]
      assert [r for r, _, _ in cell] == [r for r, _, _ in alone] == [0, 2, 4]
      np.testing.assert_allclose([a for _, a, _ in cell], [a for _, a, _ in alone], atol=1e-6)
      np.testing.assert_allclose([l for _, _, l in cell], [l for _, _, l in alone], rtol=1e-4)


def test_diverged_cells_are_marked_and_the_rest_are_not(grid_run):
  c, _, workdir, result = grid_run
  assert result['client_lrs'] == CLIENT_LRS and result['server_lrs'] == SERVER_LRS
  for cell in result['cells']:
    assert cell['diverged'] == (cell['client_lr'] > 1e3), cell
    assert (cell['final_accuracy'] is None) == cell['diverged']
  assert json.loads((workdir / 'grid.json').read_text()) == result
  records = read_jsonl(workdir / 'metrics.jsonl')
  for cell in result['cells']:   # a diverged cell's records stop before it diverged
    rounds = [r['round'] for r in records if (r['client_lr'], r['server_lr']) == (
        cell['client_lr'], cell['server_lr'])]
    assert rounds == ([0] if cell['diverged'] else [0, 2, 4]), cell
  summary = json.loads((workdir / 'summary.json').read_text())
  assert summary['grid']['diverged_cells'] == 2 and summary['grid']['cells'] == 6
  bests = [cell['best_accuracy'] for cell in result['cells'] if not cell['diverged']]
  # A run's summary of the selected cell: the best of the live cells' best accuracies.
  assert summary['status'] == 'finished' and summary['best_accuracy'] == max(bests)
  best = next(c for c in result['cells'] if c['best_accuracy'] == max(bests))
  assert (summary['client_lr'], summary['server_lr']) == (best['client_lr'], best['server_lr'])


def test_heat_map_and_table(grid_run):
  _, _, workdir, result = grid_run
  pytest.importorskip('matplotlib')
  assert (workdir / 'plots' / 'grid.png').stat().st_size > 0
  table = grid.grid_table(result).splitlines()
  assert table[2] == '| | -0.3 | 0 |'
  assert table[-1] == "| 38 | x | x |"
  # one star, on the cell the run selects (by the best value over the evaluations; it was on
  # the best final value, another cell)
  chosen = grid.best_cell(result['cells'])
  assert sum(row.count('*') for row in table[4:]) == 1
  row = table[4 + [float(np.float32(x)) for x in result['client_lrs']].index(chosen['client_lr'])]
  column = [float(np.float32(x)) for x in result['server_lrs']].index(chosen['server_lr'])
  assert row.split('|')[2 + column].strip().endswith('*')


@pytest.mark.parametrize('changes,flag', [
    ({'algorithm': 'scaffold'}, '--algorithm=scaffold'),
    ({'client_selection': 'power_of_d'}, 'power_of_d'),
    ({'num_devices': 2}, '--num_devices=2'),
])
def test_unsupported_grids_name_the_flag(tiny_leaf_file, tmp_path, changes, flag):
  c = make(dataset="leaf", data_path=str(tiny_leaf_file), clients_per_round=3, **changes)
  with pytest.raises(ConfigError, match=flag):
    api.run(c, str(tmp_path), Sweep(server_lrs=[1., 2.]))
  assert not list(tmp_path.iterdir())   # nothing written


def test_the_memory_guard_shares_a_chunk_among_the_cells(tiny_leaf_file, monkeypatch):
  """Memory for 5 clients at once: 2 cells get 2 clients per chunk each; 6 cells cannot fit."""
  c = make(dataset='leaf', data_path=str(tiny_leaf_file), clients_per_round=4, batch_size=2,
             budget_range=(1, 3))
  exp = factories.prepare(c)
  limit = helpers.memory_for(exp, 5)
  monkeypatch.setattr(planning, 'memory_limit', lambda gib=0.: limit)
  exp = factories.prepare(c)
  assert exp.chunk_size == 4 and planning.check_runs_fit(exp, 2, '--server_lr_grid') == 2
  with pytest.raises(ConfigError, match=r'^--server_lr_grid: 6 runs of one client each need'):
    planning.check_runs_fit(exp, 6, '--server_lr_grid')
