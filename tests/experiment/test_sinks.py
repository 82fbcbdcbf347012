"""The metric sinks read back: metrics.csv through pandas, the TensorBoard event files through
their own record format and protocol buffers, both equal to metrics.jsonl."""
from __future__ import annotations

import io
import json
import math

import pytest

import helpers
from fedjax_gel.experiment import api, factories, files
from fedjax_gel.experiment.config import make
from fedjax_gel.experiment.sweep import Sweep


@pytest.fixture(scope='module')
def run_dirs(tiny_leaf_file, tmp_path_factory):
  """A run and a 2-cell grid (one cell diverges: client lr 1e38)."""
  c = make(dataset='leaf', data_path=str(tiny_leaf_file), algorithm='gel', num_rounds=4,
             eval_every=2, clients_per_round=3, batch_size=2, budget_range=(1, 3))
  one = tmp_path_factory.mktemp('one')
  api.train(factories.prepare(c), str(one), err=io.StringIO())
  grid = tmp_path_factory.mktemp('grid')
  api.run(c.replace(client_lr=0.1), str(grid),
          Sweep(client_lrs=[0.1, 1e38], server_lrs=[1.0]), out=io.StringIO(),
          err=io.StringIO())
  return one, grid


def records(workdir):
  return [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]


@pytest.mark.slow
def test_csv_loads_with_pandas_and_equals_the_jsonl(run_dirs):
  pandas = pytest.importorskip('pandas')
  for workdir in run_dirs:
    table = pandas.read_csv(workdir / 'metrics.csv')
    expected = records(workdir)
    assert list(table.columns) == list(expected[0])
    assert len(table) == len(expected)
    for row, record in zip(table.to_dict('records'), expected):
      for key, value in record.items():
        if value is None:
          assert math.isnan(row[key]), key
        else:
          assert row[key] == value, key


def test_tensorboard_events_hold_every_numeric_field(run_dirs):
  one, grid = run_dirs
  (events,) = list((one / 'tensorboard').glob('events.out.tfevents.*'))
  scalars = {(tag, step): value for tag, step, value in helpers.read_events(events)}
  expected = records(one)
  for record in expected:
    for key in ('test_accuracy', 'test_loss', 'train_loss', 'grad_computations'):
      assert scalars[key, record['round']] == pytest.approx(record[key], rel=1e-6)
  assert {step for _, step in scalars} == {r['round'] for r in expected}
  cells = sorted(p.name for p in (grid / 'tensorboard').iterdir())
  assert cells == ['client_lr=0.1,server_lr=1', 'client_lr=1e+38,server_lr=1']


@pytest.mark.slow
def test_a_resumed_runs_events_are_rewritten_from_its_records(tiny_leaf_file, tmp_path):
  """Resumed from its checkpoint (here the final one, summary.json gone as after a kill in the
  last writes), a run's TensorBoard folder holds its metrics.jsonl's records once each, and
  nothing an earlier process left there (events of rounds it never recorded, or twice)."""
  from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
  c = make(dataset='leaf', data_path=str(tiny_leaf_file), algorithm='fedavg', num_rounds=4,
           eval_every=1, checkpoint_every=2, clients_per_round=3, batch_size=2,
           budget_range=(1, 3))
  quiet = dict(out=io.StringIO(), err=io.StringIO(), plots=False)
  api.run(c, str(tmp_path), **quiet)
  (tmp_path / 'summary.json').unlink()
  stale = SummaryWriter(str(tmp_path / 'tensorboard'))
  stale.add_scalar('test_accuracy', 7., 3)   # a round recorded twice, with another value
  stale.add_scalar('test_accuracy', 7., 9)   # a round never recorded
  stale.close()
  api.run(c, str(tmp_path), **quiet)
  (events,) = list((tmp_path / 'tensorboard').glob('events.out.tfevents.*'))
  scalars = [(tag, step, value) for tag, step, value in helpers.read_events(events)
             if tag == 'test_accuracy']
  expected = [('test_accuracy', r['round'], pytest.approx(r['test_accuracy'], rel=1e-6))
              for r in records(tmp_path)]
  assert scalars == expected and [s for _, s, _ in scalars] == [0, 1, 2, 3, 4]


def test_a_failed_tensorboard_write_names_its_folder(tmp_path):
  """tensorboardX's OSError on a full disk names no file: the one line said 'a file: no space
  left'; it names the run's TensorBoard folder, and errors naming their file pass as they are."""
  import errno  # pylint: disable=g-import-not-at-top
  from fedjax_gel.experiment import cli  # pylint: disable=g-import-not-at-top
  folder = str(tmp_path / 'tensorboard')
  with pytest.raises(OSError) as e:
    with files.naming(folder):
      raise OSError(errno.ENOSPC, 'No space left on device')
  assert e.value.filename == folder and e.value.errno == errno.ENOSPC
  assert cli.os_error(e.value).startswith(f'{folder}: no space left on the device')
  with pytest.raises(OSError) as e:
    with files.naming(folder):
      raise OSError(errno.EACCES, 'Permission denied', '/elsewhere/file')
  assert e.value.filename == '/elsewhere/file'
