"""Local work from the experiment layer: epochs, budgets proportional to data and per-client
budget files (names, order, bad files), as the CLI's flags and from Python."""
import io
import json
import os

import numpy as np
import pytest

from fedjax_gel.core import keys
from fedjax_gel.experiment import api, factories
from fedjax_gel.experiment.config import ConfigError, make


@pytest.fixture(scope='module')
def base(tiny_leaf_file):
  return make(dataset='leaf', data_path=str(tiny_leaf_file), num_rounds=2, eval_every=1,
              clients_per_round=3, batch_size=5, budget_range=(1, 3), client_lr=0.1)


def metrics(workdir):
  return [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]


@pytest.mark.slow
def test_epochs_from_the_config(base, tmp_path):
  """Every client of the tiny file holds 10-11 training examples: an epoch is 3 minibatches of
  B = 5 (the last short) and puts every example through a gradient once."""
  c = base.replace(budget_unit='epochs', budget_range=(2, 2))
  exp = factories.prepare(c)
  counts = np.asarray(exp.train.counts)
  api.train(exp, str(tmp_path), err=io.StringIO())
  rows = metrics(tmp_path)
  sample = factories.make_sampler(exp)
  ids = [np.asarray(sample(keys.root_key(c.run.seed), r, None).client_ids) for r in (0, 1)]
  seen = sum(int(2 * counts[i].sum()) for i in ids)
  steps = sum(int(2 * np.sum(-(-counts[i] // 5))) for i in ids)
  assert (rows[-1]['examples'], rows[-1]['grad_computations']) == (seen, steps)


@pytest.mark.parametrize('form', ['list', 'names'])
def test_per_client_budgets_file(base, tmp_path, form):
  names = list(factories.load_split(base).train.client_names)   # u0 .. u7
  budgets = [i % 3 + 1 for i in range(len(names))]
  path = tmp_path / 'budgets.json'
  path.write_text(json.dumps(budgets if form == 'list' else dict(zip(names, budgets))))
  exp = factories.prepare(base.replace(budget_draw='per_client', client_budgets=str(path)))
  np.testing.assert_array_equal(exp.client_budgets, budgets)
  c = factories.make_sampler(exp)(keys.root_key(0), 0, None)
  np.testing.assert_array_equal(np.asarray(c.budgets),
                                np.asarray(budgets)[np.asarray(c.client_ids)])


@pytest.mark.parametrize('content,words', [
    ('[1, 2', 'not valid JSON'),
    ('[1, 2, 3]', 'expected a list of'),
    ('{"nobody": 2}', "no budget for client"),
    ('"3"', 'expected a list of'),
    (None, 'cannot read it'),
    ('[1, 2, 3, 1, 2, 3, 9, 1]', "budget 9 is not an integer within --budget_range=1,3"),
    ('[1, 2, 3, 1, 2, 3, true, 1]', 'budget True is not an integer'),
    ('[1, 2, 3, 1, 2, 3, 1.5, 1]', 'budget 1.5 is not an integer'),
    ('{"u0": 1, "u0": 3}', "client 'u0' is given twice"),   # the last one was kept
    ('fifo', 'not a regular file (a named pipe)'),
    ('folder', 'not a regular file (a directory'),
])
def test_bad_budget_files_are_one_line_errors(base, tmp_path, content, words):
  path = tmp_path / 'budgets.json'
  if content == 'fifo':   # a named pipe: open() waited for a writer forever
    os.mkfifo(path)
  elif content == 'folder':
    path.mkdir()
  elif content is not None:
    path.write_text(content)
  with pytest.raises(ConfigError, match='--client_budgets=') as e:
    factories.prepare(base.replace(budget_draw='per_client', client_budgets=str(path)))
  assert words in str(e.value) and '\n' not in str(e.value)


def test_budget_file_and_draw_go_together(base):
  with pytest.raises(ConfigError, match='--client_budgets is required with'):
    factories.prepare(base.replace(budget_draw='per_client'))
  with pytest.raises(ConfigError, match='--client_budgets is required with'):
    factories.prepare(base.replace(client_budgets='x.json'))


def test_proportional_budgets(base):
  exp = factories.prepare(base.replace(budget_draw='proportional', budget_range=(1, 4)))
  counts = np.asarray(exp.train.counts)
  c = factories.make_sampler(exp)(keys.root_key(0), 0, None)
  n = counts[np.asarray(c.client_ids)]
  np.testing.assert_array_equal(np.asarray(c.budgets), np.clip(np.round(4 * n / counts.max()),
                                                               1, 4))
