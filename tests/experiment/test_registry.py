"""An algorithm defined outside the package: its spec registered, it runs end to end through the
library entry point and the command line, with its own flag, check and row of the user guide's
table."""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import pathlib

import optax
import pytest

from fedjax_gel import algorithms
from fedjax_gel.algorithms import registry
from fedjax_gel.spec import AlgorithmSpec, hparam, within
from fedjax_gel.experiment import api, cli
from fedjax_gel.experiment.config import ConfigError, make
from fedjax_gel.experiment.validation import validate

USER_GUIDE = pathlib.Path(__file__).resolve().parents[2] / 'docs' / 'user-guide.md'


@dataclasses.dataclass(frozen=True)
class DampedHparams:
  damping: float = hparam(0.5, 'damped_fedavg: the server moves by this fraction of Delta.',
                          within(0, 1))


def damped_fedavg(hp: DampedHparams, s) -> algorithms.FederatedAlgorithm:
  """FedAvg whose server steps ``x <- x - damping Delta``: 1 is FedAvg, 0 never moves."""
  return algorithms.fedavg(s.loss, optax.sgd(s.client_lr), optax.sgd(hp.damping))


DAMPED = AlgorithmSpec('damped_fedavg', damped_fedavg, DampedHparams,
                       server='`x - damping Delta`', paper='a test of the registry')


@pytest.fixture
def damped():
  registry.register(DAMPED)
  yield DAMPED
  registry.unregister(DAMPED.name)


def tiny(tiny_leaf_file, **flags):
  return make(dataset='leaf', data_path=str(tiny_leaf_file), num_rounds=4, eval_every=2,
              clients_per_round=3, batch_size=2, budget_range=(1, 3), **flags)


def losses(workdir) -> list[float]:
  return [json.loads(line)['test_loss'] for line in
          (pathlib.Path(workdir) / 'metrics.jsonl').read_text().splitlines()]


@pytest.mark.slow
def test_a_registered_algorithm_runs_through_the_library_entry_point(damped, tiny_leaf_file,
                                                                     tmp_path):
  quiet = dict(out=io.StringIO(), err=io.StringIO(), plots=False)
  still = api.run(tiny(tiny_leaf_file, algorithm='damped_fedavg', damping=0.),
                  str(tmp_path / 'still'), **quiet)
  assert still[0]['algorithm'] == 'damped_fedavg' and still[0]['status'] == 'finished'
  assert len(set(losses(tmp_path / 'still'))) == 1   # damping 0: the model never moves
  api.run(tiny(tiny_leaf_file, algorithm='damped_fedavg', damping=1.), str(tmp_path / 'full'),
          **quiet)
  api.run(tiny(tiny_leaf_file, algorithm='fedavg'), str(tmp_path / 'fedavg'), **quiet)
  assert losses(tmp_path / 'full') == losses(tmp_path / 'fedavg')   # damping 1: FedAvg
  assert len(set(losses(tmp_path / 'full'))) > 1


def main(*args):
  out, err = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = cli.main(['run.py', *args])
  return code, out.getvalue(), err.getvalue()


@pytest.mark.slow
def test_a_registered_algorithm_gets_its_flag_and_check_on_the_command_line(
    damped, tiny_leaf_file, tmp_path):
  common = ['--dataset=leaf', f'--data_path={tiny_leaf_file}', '--num_rounds=2',
            '--eval_every=2', '--clients_per_round=3', '--batch_size=2', '--budget_range=1,3',
            '--algorithm=damped_fedavg']
  code, _, err = main(*common, '--damping=1.5', f'--workdir={tmp_path / "bad"}')
  assert code == 2 and err == 'error: --damping must lie in [0, 1] (got 1.5)\n'
  assert not (tmp_path / 'bad').exists()
  code, out, err = main(*common, '--damping=0.25', f'--workdir={tmp_path / "ok"}')
  assert code == 0, err
  config = json.loads((tmp_path / 'ok' / 'config.json').read_text())
  assert config['algorithm']['name'] == 'damped_fedavg'
  assert config['algorithm']['hparams'] == {'damping': 0.25}
  assert 'damped_fedavg on leaf' in out


def test_unregistered_the_algorithm_and_its_flag_are_gone(tiny_leaf_file):
  with pytest.raises(ConfigError, match='--algorithm: unknown value'):
    validate(tiny(tiny_leaf_file, algorithm='damped_fedavg'))
  code, _, err = main('--damping=0.5')
  assert code == 2 and 'damping' in err


def test_the_registry_refuses_a_second_spec_of_a_name_or_a_clashing_hyper_parameter(damped):
  with pytest.raises(ValueError, match='registered already'):
    registry.register(dataclasses.replace(DAMPED))

  @dataclasses.dataclass(frozen=True)
  class Clash:
    prox_mu: float = hparam(0.5, 'another prox_mu')

  with pytest.raises(ValueError, match="'prox_mu' differs"):
    registry.register(AlgorithmSpec('clash', damped_fedavg, Clash))
  assert 'clash' not in registry.names()
  # a name is a value of --algorithm (commas separate names) and a run's folder name
  for name in ('../escape', 'a/b', '', 'a,b', 'fedavg ', 'my alg', 3):
    with pytest.raises(ValueError, match="an algorithm's name must be an identifier"):
      registry.register(dataclasses.replace(DAMPED, name=name))
    assert name not in registry.names()


@dataclasses.dataclass(frozen=True)
class PlainHparams:
  zeta: float = 0.5   # no hparam(): its value never reached the runs


@dataclasses.dataclass
class UnfrozenHparams:
  damping: float = hparam(0.5, 'damped_fedavg: the server moves by this fraction of Delta.')


@pytest.mark.parametrize('change,words', [
    (dict(hparams=PlainHparams), "hyper-parameter 'zeta' of PlainHparams is a plain field"),
    (dict(hparams=DampedHparams()), 'hparams must be a frozen dataclass \\(the class itself\\)'),
    (dict(hparams=UnfrozenHparams), 'hparams UnfrozenHparams must be frozen'),
    (dict(build='damped_fedavg'), 'build must be a function'),
], ids=['plain_field', 'an_instance', 'not_frozen', 'build_a_name'])
def test_the_registry_refuses_a_spec_its_runs_could_not_use(change, words):
  """Each passed ``register`` and failed later: deep at ``make`` or ``run`` (an unhashable
  type, "'DH' object is not callable"), or silently (a plain field's value reset to its
  default by ``expand``)."""
  with pytest.raises(ValueError, match=f"register\\('other'\\): {words}"):
    registry.register(dataclasses.replace(DAMPED, name='other', **change))
  assert 'other' not in registry.names()


def test_the_user_guide_table_is_the_registry_s():
  assert registry.markdown_table() in USER_GUIDE.read_text()
