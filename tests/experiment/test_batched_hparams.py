"""Runs that differ in a float hyper-parameter of their algorithm train as one program
(``config.batched_flags``): every such hyper-parameter of every registered algorithm traces,
and a batch gives the numbers of its separate runs."""
from __future__ import annotations

import io
import json

import jax
import numpy as np
import pytest

from fedjax_gel.algorithms import registry
from fedjax_gel.core import keys
from fedjax_gel.experiment import api, config as config_lib, factories
from fedjax_gel.experiment.config import make


@pytest.fixture(scope='module')
def base(tiny_leaf_file):
  return make(dataset='leaf', data_path=str(tiny_leaf_file), num_rounds=4, eval_every=2,
              clients_per_round=3, batch_size=2, budget_range=(1, 3), fedvarp_clusters=2,
              algorithm='cluster_fedvarp')


@pytest.fixture(scope='module')
def experiments(base):
  return {m: factories.prepare(base.replace(model=m)) for m in ('logistic', 'mlp')}


@pytest.mark.slow
def test_every_batched_hyper_parameter_of_every_algorithm_traces(base, experiments):
  """A program of two runs that differ in it builds, initialises and runs a round (traced)."""
  traced = []
  for spec in registry.specs():
    c = base.replace(algorithm=spec.name, model='mlp' if spec.name == 'fedmax' else 'logistic',
                     **({'dp_clip_norm': 1.} if spec.private else {}))
    exp = factories.with_config(experiments[c.model.name], c)
    for flag in config_lib.batched_flags(c)[2:]:   # beyond the learning rates (test_grid)
      value = c.flags()[flag]
      program, hparams = factories.make_runs(exp, [c, c.replace(**{flag: value / 2 or 0.1})], 3)
      assert list(hparams) == [flag]
      root = keys.root_key(0)
      state = jax.eval_shape(program.init, root, hparams)
      cohort = jax.eval_shape(program.sample, root, np.int32(0), None)
      jax.eval_shape(program.round, state, hparams, cohort, exp.train, root, np.int32(0))
      traced.append(flag)
  assert {'client_momentum', 'prox_mu', 'gbo_beta', 'fedexp_eps', 'fedmax_beta',
          'adabest_beta'} <= set(traced)


def records(workdir):
  return [json.loads(line) for line in (workdir / 'metrics.jsonl').read_text().splitlines()]


@pytest.mark.parametrize('algorithm,flag,values', [('fedprox', 'prox_mu', (0.01, 2.0)),
                                                   ('fedgbo', 'gbo_beta', (0.5, 0.9)),
                                                   ('fednova', 'client_momentum', (0.5, 0.9))])
@pytest.mark.slow
def test_a_batch_over_a_hyper_parameter_gives_its_separate_runs(base, experiments, tmp_path,
                                                                algorithm, flag, values):
  configs = [base.replace(algorithm=algorithm, **{flag: v}) for v in values]
  exp = factories.with_config(experiments['logistic'], configs[0])
  together = api.train(exp, [str(tmp_path / f'b{i}') for i in range(2)], configs,
                       err=io.StringIO())
  assert [s['runs_in_program'] for s in together] == [2, 2]
  batched = [records(tmp_path / f'b{i}') for i in range(2)]
  for i, c in enumerate(configs):
    api.train(factories.with_config(exp, c), str(tmp_path / f's{i}'), err=io.StringIO())
    alone = records(tmp_path / f's{i}')
    assert [r['round'] for r in alone] == [r['round'] for r in batched[i]] == [0, 2, 4]
    for key in ('test_loss', 'train_loss', 'test_accuracy'):
      np.testing.assert_allclose([r[key] for r in batched[i]], [r[key] for r in alone],
                                 rtol=1e-5, atol=1e-7)
  assert batched[0][-1]['test_loss'] != batched[1][-1]['test_loss']   # it does differ
