"""Tests for the experiment config, the training loop's outputs and the progress line."""
from __future__ import annotations

import io
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_gel.data.errors import DataError
from fedjax_gel import models, optim
from fedjax_gel.algorithms import GuessPolicy, registry
from fedjax_gel.core import federated_data, keys
from fedjax_gel.core.backend import xla
from fedjax_gel.core.sampling import CohortSpec
from fedjax_gel.spec import Setting
from fedjax_gel.experiment import checkpoint
from fedjax_gel.experiment import config as config_lib, config_json
from fedjax_gel.experiment import loop as loop_lib
from fedjax_gel.experiment import progress as progress_lib
from fedjax_gel.experiment import api, callbacks, factories, files, planning, validation
from fedjax_gel.experiment import workdir as workdir_lib
from fedjax_gel.experiment.config import CohortConfig, ConfigError, make
from fedjax_gel.experiment.sweep import Sweep, expand

import helpers

METRIC_KEYS = {'round', 'algorithm', 'seed', 'test_accuracy', 'best_test_accuracy', 'test_loss',
               'train_loss',
               'bytes_up', 'bytes_down', 'client_rounds', 'client_distance',
               'grad_computations', 'examples', 'elapsed_s', 'client_accuracy_mean',
               'client_accuracy_p10', 'client_accuracy_p90', 'client_accuracy_std'}


class OnRound(callbacks.Callback):
  """Calls ``fn(round, cohort, metrics)`` after every round."""

  def __init__(self, fn):
    self.fn = fn

  def on_round(self, loop, done):
    self.fn(done - 1, loop.cohort, loop.metrics)


def quiet_train(exp, workdir, **kwargs):
  """``api.train`` of one run, its progress lines discarded; its summary."""
  return api.train(exp, str(workdir), err=io.StringIO(), **kwargs)[0]


def read_jsonl(path):
  return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope='module')
def base_config(tiny_leaf_file):
  return make(dataset='leaf', data_path=str(tiny_leaf_file), num_rounds=5, eval_every=2,
                clients_per_round=3, batch_size=2, budget_range=(1, 3), client_lr=0.1,
                target=0.01)


@pytest.fixture(scope='module')
def runs(base_config, tmp_path_factory):
  """name -> (config, workdir, summary, cohorts, per-round grad computations) of tiny runs."""
  variants = {
      'base': {},
      'twin': {'target': 1.0},  # same training, unreachable target
      'fedavg': {'algorithm': 'fedavg'},
      # other cohorts; an aggressive server optimiser whose accuracy peaks before the end
      'seed1': {'seed': 1, 'server_optimizer': 'adam', 'server_lr': 2.0, 'target': 0.7},
  }
  out = {}
  for name, changes in variants.items():
    c = base_config.replace(**changes)
    workdir = tmp_path_factory.mktemp(name)
    cohorts, grads = [], []

    def on_round(r, cohort, m, cohorts=cohorts, grads=grads):
      cohorts.append((r, np.asarray(cohort.client_ids).tolist(),
                      np.asarray(cohort.budgets).tolist()))
      grads.append(int(m.grad_computations))

    summary = quiet_train(factories.prepare(c), workdir, callbacks=[OnRound(on_round)])
    out[name] = (c, workdir, summary, cohorts, grads)
  return out


# --------------------------------------------------------------------------- outputs


@pytest.mark.slow
def test_config_json_round_trips(runs):
  c, workdir, *_ = runs['base']
  loaded = json.loads((workdir / 'config.json').read_text())
  assert set(loaded) == {'data', 'model', 'cohort', 'algorithm', 'server', 'run', 'privacy',
                         'data_sha256'}
  assert loaded['data_sha256'] == federated_data.digest(*factories.load_split(c))
  assert loaded['algorithm']['name'] == c.algorithm.name
  assert loaded['cohort']['budget_range'] == list(c.cohort.budget_range)
  assert config_json.read(loaded) == c


def test_a_flat_config_json_of_earlier_versions_is_read():
  """config.json before sections: a flat record of flags, holding every algorithm's
  hyper-parameters; those of other algorithms are dropped."""
  flat = {'dataset': 'leaf', 'data_path': 'x.json', 'algorithm': 'gel', 'guess_tau': 20,
          'prox_mu': 0.5, 'client_lr': 0.1, 'budget_range': [2, 3], 'seed': 4}
  c = config_json.read(flat)
  assert c == make(dataset='leaf', data_path='x.json', algorithm='gel', guess_tau=20,
                   client_lr=0.1, budget_range=(2, 3), seed=4)
  assert c.algorithm.hparams.guess_tau == 20 and c.cohort.budget_range == (2, 3)
  # --target was --target_accuracy: both forms of such a config.json keep its target.
  assert config_json.read({**flat, 'target_accuracy': 0.7}).run.target == 0.7
  sections = make(target=0.6).to_json()
  sections['run']['target_accuracy'] = sections['run'].pop('target')
  assert config_json.read(sections) == make(target=0.6)


def test_a_flat_data_section_of_earlier_versions_is_read():
  """config.json before datasets had settings of their own: one flat data section of every
  dataset's settings; the chosen dataset's become its hparams, the others are dropped, and the
  default work directory's name is the one that version gave the same command."""
  c = make(dataset='sent140', data_path='x.json', vocab_size=500, leaf_sample='niid',
           train_fraction=0.8)
  flat = {**c.to_json(), 'data': config_json.flat_data(c.data)}
  assert flat['data']['vocab_size'] == 500 and flat['data']['fedprox_iid'] is False
  assert len(flat['data']) == 23 and 'hparams' not in flat['data']   # as that version wrote it
  assert config_json.read(flat) == c
  assert config_json.read({**flat, 'data': {**flat['data'], 'num_clients': 7}}) == c
  assert c.data.hparams.vocab_size == 500 and c.flags()['leaf_sample'] == 'niid'
  assert 'num_clients' not in c.flags() and config_json.read(c.to_json()) == c
  # the names that version (6ea9724, before --fuse_small_dots too) gave these runs' folders:
  # the same command finds them again; the fused products, asked for, are other settings
  assert api.default_workdir([make()]) == 'runs/fedavgcm_leaf_synthetic_159f70e89431'
  assert api.default_workdir([c]) == 'runs/fedavgcm_sent140_156e4fddc081'
  assert api.default_workdir([make(fuse_small_dots=True)]) != api.default_workdir([make()])


def test_metrics_rounds_and_keys(runs):
  c, workdir, *_ = runs['base']
  records = read_jsonl(workdir / 'metrics.jsonl')
  assert [r['round'] for r in records] == [0, 2, 4, 5]
  for r in records:
    assert set(r) == METRIC_KEYS
    assert r['algorithm'] == c.algorithm.name and r['seed'] == c.run.seed
    assert 0 <= r['test_accuracy'] <= 1 and np.isfinite(r['test_loss'])
  # the running best, GeL's evaluation protocol
  assert [r['best_test_accuracy'] for r in records] == list(
      np.maximum.accumulate([r['test_accuracy'] for r in records]))


def test_an_algorithms_diagnostics_reach_its_records(base_config, tmp_path):
  """FedExP reports its server step size eta_g >= 1 (``FederatedAlgorithm.diagnostics``)."""
  exp = factories.prepare(base_config.replace(algorithm='fedexp'))
  quiet_train(exp, tmp_path)
  records = read_jsonl(tmp_path / 'metrics.jsonl')
  assert all(set(r) == METRIC_KEYS | {'eta_g'} for r in records)
  assert records[0]['round'] == 0 and records[0]['eta_g'] is None   # no round yet
  assert all(r['eta_g'] >= 1. for r in records[1:])
  assert 'eta_g' in (tmp_path / 'metrics.csv').read_text().splitlines()[0].split(',')


def test_grad_computations_are_cohort_budgets(runs):
  c, workdir, summary, cohorts, round_grads = runs['base']
  assert [r for r, *_ in cohorts] == list(range(c.run.num_rounds))
  budgets = [sum(b) for _, ids, b in cohorts]
  for _, ids, b in cohorts:
    assert len(ids) == len(b) == c.cohort.clients_per_round
    assert all(c.cohort.budget_range[0] <= t <= c.cohort.budget_range[1] for t in b)
  assert round_grads == budgets
  cumulative = np.concatenate([[0], np.cumsum(budgets)])
  records = read_jsonl(workdir / 'metrics.jsonl')
  grads = [r['grad_computations'] for r in records]
  assert grads == sorted(grads)
  assert grads == [int(cumulative[r['round']]) for r in records]
  assert summary['grad_computations'] == int(cumulative[-1])


@pytest.mark.parametrize('name', ['base', 'twin', 'seed1'])
def test_summary_consistent_with_metrics(runs, name):
  c, workdir, summary, *_ = runs[name]
  assert json.loads((workdir / 'summary.json').read_text()) == summary
  acc = [r['test_accuracy'] for r in read_jsonl(workdir / 'metrics.jsonl')]
  rounds = [r['round'] for r in read_jsonl(workdir / 'metrics.jsonl')]
  assert summary['final_accuracy'] == acc[-1]
  assert summary['best_accuracy'] == max(acc)
  reached = [r for r, a in zip(rounds, acc) if a >= c.run.target]
  assert summary['rounds_to_target'] == (reached[0] if reached else None)


def every_round_rounds(records, every, start, end, last):
  """The rounds ``Evaluate`` should evaluate, by hand from the records of a run alone."""
  rounds, best = [0], records[0]['best_test_accuracy']
  by_round = {r['round']: r['best_test_accuracy'] for r in records}
  for r in range(1, last + 1):
    if r % every == 0 or r == last or (best >= start and (end is None or best < end)):
      rounds.append(r)
      best = by_round.get(r, best)
  return rounds


@pytest.mark.parametrize('end', [None, 0.6])
@pytest.mark.slow
def test_every_round_evaluation_in_the_window_of_the_best(base_config, tmp_path, end):
  c = base_config.replace(num_rounds=16, eval_every=4, eval_every_round_from=0.4,
                          eval_every_round_until=end)
  quiet_train(factories.prepare(c), tmp_path)
  records = read_jsonl(tmp_path / 'metrics.jsonl')
  rounds = [r['round'] for r in records]
  assert rounds == every_round_rounds(records, 4, 0.4, end, 16)
  # the cases reach the window and (with an end) leave it
  assert any(b - a == 1 for a, b in zip(rounds, rounds[1:]))
  assert end is None or any(b - a == 4 for a, b in zip(rounds[3:], rounds[4:]))


@pytest.mark.slow
def test_a_resumed_run_evaluates_the_rounds_of_the_window_as_the_uninterrupted_one(base_config,
                                                                                   tmp_path):
  c = base_config.replace(num_rounds=16, eval_every=4, checkpoint_every=5,
                          eval_every_round_from=0.4, eval_every_round_until=0.6)
  whole, resumed = tmp_path / 'whole', tmp_path / 'resumed'
  quiet_train(factories.prepare(c), whole)
  quiet_train(factories.prepare(c.replace(num_rounds=5)), resumed)   # stopped after round 5
  quiet_train(factories.prepare(c), resumed, resume=True)   # its checkpoint, 11 rounds more
  strip = lambda rows: [{k: v for k, v in r.items() if k != 'elapsed_s'} for r in rows]
  records = read_jsonl(whole / 'metrics.jsonl')
  assert strip(read_jsonl(resumed / 'metrics.jsonl')) == strip(records)
  rounds = [r['round'] for r in records]   # the window opened at round 5 and closed
  assert rounds[:4] == [0, 4, 5, 6] and rounds[-2:] == [12, 16]


def test_target_reachable_and_unreachable(runs):
  assert runs['base'][2]['rounds_to_target'] == 0     # target 0.01
  assert runs['twin'][2]['rounds_to_target'] is None  # target 1.0 on tiny data
  seed1 = runs['seed1'][2]
  assert seed1['best_accuracy'] > seed1['final_accuracy']  # so best and final are told apart


# --------------------------------------------------------------------------- pairing, determinism


def test_same_seed_same_cohorts_across_algorithms(runs):
  assert runs['base'][3] == runs['fedavg'][3]


def test_other_seed_other_cohorts(runs):
  assert runs['base'][3] != runs['seed1'][3]


def test_same_initial_model_across_algorithms(runs):
  first = [read_jsonl(runs[n][1] / 'metrics.jsonl')[0] for n in ('base', 'fedavg')]
  for key in ('test_accuracy', 'test_loss', 'train_loss'):
    assert first[0][key] == first[1][key]
  last = [read_jsonl(runs[n][1] / 'metrics.jsonl')[-1] for n in ('base', 'fedavg')]
  assert last[0]['test_loss'] != last[1]['test_loss']  # the algorithms do differ


def test_deterministic(runs):
  strip = lambda n: [{k: v for k, v in r.items() if k != 'elapsed_s'}
                     for r in read_jsonl(runs[n][1] / 'metrics.jsonl')]
  assert strip('base') == strip('twin')


# --------------------------------------------------------------------------- units


def test_parse_budget_range():
  assert config_lib.parse_budget_range('4,13') == (4, 13)
  assert config_lib.parse_budget_range(' 2 , 2 ') == (2, 2)


@pytest.mark.parametrize('text', ['4', '4,5,6', 'a,b', '', '4.5,6', '4,'])
def test_parse_budget_range_errors(text):
  with pytest.raises(ConfigError, match='--budget_range'):
    config_lib.parse_budget_range(text)


@pytest.mark.parametrize('value', [(2.5, 3.5), (2., 3.), (True, 3), ('2', 3), (2, 3, 4)])
def test_a_budget_range_made_in_python_must_be_two_integers(value):
  """``make(budget_range=...)``, as a notebook writes it, is validated before a run: (2.5, 3.5)
  ran as (2, 3) while its config.json said 2.5, 3.5."""
  with pytest.raises(ConfigError, match=r'--budget_range: must be two integers a,b'):
    validation.validate(make(budget_range=value))
  assert make(budget_range=[2, 3]).cohort.spec(np.asarray([4, 5])).budget_range == (2, 3)


@pytest.mark.parametrize('changes, flag', [
    ({'dataset': 'nope'}, '--dataset'),
    ({'algorithm': 'nope'}, '--algorithm'),
    ({'model': 'nope'}, '--model'),
    ({'server_optimizer': 'nope'}, '--server_optimizer'),
    ({'aggregation_weights': 'nope'}, '--aggregation_weights'),
    ({'dataset': 'leaf'}, '--data_path'),
    ({'num_rounds': 0}, '--num_rounds'),
    ({'clients_per_round': -1}, '--clients_per_round'),
    ({'batch_size': 0}, '--batch_size'),
    ({'eval_every': 0}, '--eval_every'),
    ({'eval_every_round_from': 1.5}, '--eval_every_round_from must lie in (0, 1]'),
    ({'eval_every_round_from': float('nan')}, '--eval_every_round_from must be a finite'),
    ({'eval_every_round_until': 0.9}, '--eval_every_round_until needs --eval_every_round_from'),
    ({'eval_every_round_from': 0.9, 'eval_every_round_until': 0.8},
     '--eval_every_round_until=0.8 must lie above --eval_every_round_from=0.9'),
    ({'budget_range': (0, 3)}, '--budget_range'),
    ({'budget_range': (5, 4)}, '--budget_range'),
    ({'chunk_size': -1}, '--chunk_size'),
    ({'train_fraction': 1.0}, '--train_fraction'),
    ({'client_lr': 0.0}, '--client_lr'),
    ({'server_lr': -1.0}, '--server_lr'),
    ({'client_momentum': 1.0}, '--client_momentum'),
    ({'server_momentum': -0.1}, '--server_momentum'),
    ({'target': 0.0}, '--target'),
    ({'algorithm': 'adabest', 'adabest_beta': 1.5}, '--adabest_beta'),
    ({'algorithm': 'adabest', 'adabest_mu': -0.1}, '--adabest_mu'),
    ({'algorithm': 'feddyn', 'feddyn_mu': -1.0}, '--feddyn_mu'),
    ({'algorithm': 'cluster_fedvarp', 'fedvarp_clusters': 0}, '--fedvarp_clusters'),
    ({'algorithm': 'gel', 'guess_policy': 'nope'}, '--guess_policy'),
    ({'algorithm': 'fedgbo', 'gbo_beta': 1.0}, '--gbo_beta'),
    ({'algorithm': 'fedexp', 'fedexp_eps': float('nan')}, '--fedexp_eps'),
    ({'algorithm': 'fedadam', 'server_optimizer': 'adam'}, '--server_optimizer'),
    ({'algorithm': 'fedavg', 'server_optimizer': 'fedyogi'}, '--server_optimizer=fedyogi'),
    ({'algorithm': 'gel', 'server_optimizer': 'fedyogi'}, '--server_optimizer=fedyogi'),
    ({'algorithm': 'fedavg_gel', 'guess_proxy': 'zero'}, '--guess_proxy'),
    ({'algorithm': 'fedmax'}, '--algorithm=fedmax with --model=logistic'),
    ({'algorithm': 'gel', 'prox_mu': 0.1}, '--prox_mu is not a hyper-parameter of'),
    ({'no_such_flag': 1}, '--no_such_flag is not a flag'),
    ({'algorithm': 'gel', 'guess_tau': 'x'}, "--guess_tau: 'x' is not of type int"),
    ({'budget_range': (1,)}, '--budget_range'),
    ({'num_rounds': 2.0}, '--num_rounds: 2.0 is not of type int'),
    ({'tensorboard': 'no'}, "--tensorboard: 'no' is not of type bool"),
    # ranges: seeds are 32-bit PRNG seeds, counts int32 on the device
    ({'seed': 2**32}, '--seed must be an integer in [0, 4294967295]'),
    ({'seed': -1}, '--seed'),
    ({'split_seed': 2**64}, '--split_seed'),
    ({'num_rounds': 2**31}, '--num_rounds must be an integer in [1, 2147483647]'),
    ({'eval_every': 10**20}, '--eval_every'),
    ({'checkpoint_every': 2**31}, '--checkpoint_every'),
    ({'train_eval_examples': 2**31}, '--train_eval_examples'),
    ({'chunk_size': 2**31}, '--chunk_size'),
    ({'num_devices': 2**31}, '--num_devices'),
    ({'clients_per_round': 2**31}, '--clients_per_round'),
    ({'batch_size': 2**31}, '--batch_size'),
    ({'cyclic_groups': 2**31}, '--cyclic_groups'),
    ({'power_d': 2**31}, '--power_d'),
    ({'client_selection': 'power_of_d', 'clients_per_round': 2**30, 'budget_range': (1, 1),
      'batch_size': 1}, '--power_d=0'),
    ({'num_clients': 2**31}, '--num_clients'),
    ({'vocab_size': 2**31}, '--vocab_size'),
    ({'seq_len': 2**31}, '--seq_len'),
    ({'leaf_min_samples': 2**31}, '--leaf_min_samples'),
    ({'split_gap': 2**31}, '--split_gap'),
    ({'budget_range': (1, 2**31)}, '--budget_range'),
    ({'budget_range': (1, 2**16), 'batch_size': 2**16}, '--budget_range=1,65536 with'),
    ({'algorithm': 'gel', 'guess_percent': 1e30}, '--guess_percent must lie in [0, 10000000]'),
    ({'algorithm': 'gel', 'guess_tau': 10**6}, '--guess_tau'),
    ({'algorithm': 'fedprox_gel', 'guess_count': 2**31}, '--guess_count'),
    ({'algorithm': 'cluster_fedvarp', 'fedvarp_clusters': 2**31}, '--fedvarp_clusters'),
])
def test_validate_names_the_flag(changes, flag):
  with pytest.raises(ConfigError) as e:
    validation.validate(make(**changes))
  message = str(e.value)
  assert message.startswith(flag) and '\n' not in message


def test_validate_accepts_defaults():
  assert validation.validate(make()) == make()


def test_prepare_rejects_cohort_above_population(base_config):
  c = base_config.replace(sample_with_replacement=False, clients_per_round=9)
  with pytest.raises(ConfigError, match='--clients_per_round'):
    factories.prepare(c)


@pytest.mark.parametrize('labels, error, words', [
    (['a', 'b'], ConfigError, '--model=logistic.*labels.json'),
    ([-1, 0], DataError, 'labels.json.*label -1'),   # refused as the file is read
])
def test_prepare_rejects_labels_a_model_cannot_index(tmp_path, labels, error, words):
  path = tmp_path / 'labels.json'
  users = ['u0', 'u1']
  path.write_text(json.dumps({'users': users, 'user_data': {
      u: {'x': [[0.5, 1.0]] * 4, 'y': labels * 2} for u in users}}))
  c = make(dataset='leaf', data_path=str(path), clients_per_round=2)
  with pytest.raises(error, match=words):
    factories.prepare(c)


def test_check_workdir(tmp_path):
  workdir_lib.check_workdir(str(tmp_path / 'new'), overwrite=False)
  assert not (tmp_path / 'new').exists()
  (tmp_path / 'summary.json').write_text('{}')
  with pytest.raises(ConfigError, match='--workdir'):
    workdir_lib.check_workdir(str(tmp_path), overwrite=False)
  workdir_lib.check_workdir(str(tmp_path), overwrite=True)
  with pytest.raises(ConfigError, match='--workdir'):
    workdir_lib.check_workdir(str(tmp_path / 'summary.json'), overwrite=True)


# --------------------------------------------------------------------------- progress


def test_progress_line_has_rate_and_eta():
  p = progress_lib.Progress(10, stream=io.StringIO())
  assert 'ETA ?' in p.line(0)
  p.begin(0)
  p.marks[0] = (p.marks[0][0] - 2.0, 0)  # as if 2 s had passed
  line = p.line(4, 'test acc 0.5')
  assert line.startswith('round 4/10 | ')
  assert '2.00 rounds/s' in line and 'ETA 0:00:03' in line and line.endswith('| test acc 0.5')


def test_the_rate_is_the_recent_windows_so_a_checkpoint_does_not_halve_it_for_good():
  p = progress_lib.Progress(100, stream=io.StringIO())
  p.begin(0)
  t0 = p.start
  assert p.rate(10, t0 + 10) == pytest.approx(1.)
  assert p.rate(11, t0 + 20) == pytest.approx(11 / 20)   # a 9 s checkpoint after round 10
  for r in range(12, 42):
    rate = p.rate(r, t0 + 20 + (r - 11))
  assert rate == pytest.approx(1.)   # 30 s later: the window holds only rounds at 1 a second


class Terminal(io.StringIO):
  def isatty(self):
    return True


def test_a_terminal_gets_a_bar_with_rate_and_eta_and_notes_above_it():
  stream = Terminal()
  p = progress_lib.Progress(50, stream=stream, label='gel, seed 0')
  p.begin(10)
  p.update(20, 'test acc 0.5', force=True)
  p.note('gel, seed 0: diverged')
  p.close()
  out = stream.getvalue()
  assert 'gel, seed 0: 20/50 rounds |' in out and 'ETA' in out and 'test acc 0.5' in out
  assert 'gel, seed 0: diverged\n' in out and p.bar is None


def test_a_runs_phase_line_is_its_own_not_the_process_total():
  phases = loop_lib.Phases(imports=2.)
  with phases.time('compile'):
    pass
  since = dict(phases.seconds)
  phases.seconds['train'] += 3.
  assert phases.line(since) == 'train 3.0 s'
  assert phases.line().startswith('imports 2.0 s')


def test_progress_lines_name_the_run_and_its_compilation():
  stream = io.StringIO()
  p = progress_lib.Progress(10, stream=stream, label='gel, seed 0, 1')
  assert p.line(3).startswith('gel, seed 0, 1 | round 3/10 | ')
  p.compiled(1.25, 40)
  assert stream.getvalue() == ('gel, seed 0, 1: the round compiled in 1.2 s; resuming from the '
                               'checkpoint of round 40\n')


def test_progress_writes_lines_off_terminal():
  stream = io.StringIO()
  p = progress_lib.Progress(3, stream=stream)
  p.begin(0)
  p.update(1)
  assert stream.getvalue() == ''
  p.update(2, force=True)
  p.close()
  assert stream.getvalue().count('\n') == 1 and 'round 2/3' in stream.getvalue()


def test_format_seconds():
  assert progress_lib.format_seconds(3725.4) == '1:02:05'
  assert progress_lib.format_seconds(0) == '0:00:00'


def test_diverged_values_are_written_as_null(tmp_path):
  files.write_json(str(tmp_path / 's.json'), {'loss': float('nan'), 'acc': 0.5,
                                        'best': float('inf')})
  assert json.loads((tmp_path / 's.json').read_text()) == {'loss': None, 'acc': 0.5, 'best': None}


def test_every_registered_algorithm_builds_as_its_spec_declares():
  """The spec's properties (per-client state, anchor pass, guesses, a fixed server optimiser, a
  server step of its own) are those of the algorithm it builds."""
  model = models.get_model('logistic', (3,), 3)
  params = model.init(jax.random.key(0))
  started = []   # a server optimiser that notes when an algorithm starts it
  probe = optax.GradientTransformation(lambda p: started.append(1) or optax.sgd(1.).init(p),
                                       optax.sgd(1.).update)
  for spec in registry.specs():
    started.clear()
    spec.build(spec.hparams(), Setting(model, models.cross_entropy_loss(model), 0.01, 0.9, probe,
                                       np.arange(1, 26))).server_init(params)
    assert bool(started) != spec.own_server, spec.name
    c = make(algorithm=spec.name, server_lr=0.1)
    alg = factories.make_algorithm(c, model, np.arange(1, 26))
    gbo = 'gbo_optimizer' in c.flags()
    assert alg.name == c.run_name == spec.name + ('_sgdm' if gbo else '')
    server = alg.server_init(params)
    assert (alg.store_row is not None) == spec.stateful, spec.name
    assert alg.pre_pass == spec.pre_pass and (alg.client_guesses is not None) == spec.guesses
    if spec.stateful:   # a row per client (per cluster: --fedvarp_clusters=10)
      rows = 10 if spec.name == 'cluster_fedvarp' else 25
      assert jax.tree_util.tree_leaves(server.clients)[0].shape[0] == rows, spec.name
    if gbo:   # global statistics instead of a server optimiser
      assert isinstance(alg.broadcast(server)[1], optim.GBOStats), spec.name
      continue
    if spec.own_server:   # FedDyn, AdaBest, FedExP: no optimiser state
      continue
    fedopt = spec.server_optimizer is not None
    assert isinstance(server.opt_state, optim.FedOptState) == fedopt, spec.name


def test_guess_settings_reach_the_algorithms_policy():
  default = GuessPolicy('remaining')   # tau None: b + 5 from the budgets; the others unread
  assert make(algorithm='gel').algorithm.hparams.policy == default
  assert make(algorithm='gel', guess_tau=20).algorithm.hparams.policy.tau == 20
  assert make(algorithm='gel', guess_policy='cohort_max', guess_k=3,
              budget_range=(1, 9)).algorithm.hparams.policy[:3] == ('cohort_max', None, 3)
  assert make(algorithm='gel').algorithm.hparams.proxy() == 'zero'
  # The factory hands the policy to the GeL algorithms: tau' = b + 5 - tau_i for U{4..13}.
  model, budgets = models.get_model('logistic', (3,), 3), jnp.array([4, 9, 13])
  for name in ('gel', 'fedavg_gel', 'fedprox_gel', 'fednova_gel', 'fedyogi_gel'):
    alg = factories.make_algorithm(make(algorithm=name), model, np.arange(1, 26))
    np.testing.assert_array_equal(alg.client_guesses(budgets, 13), [14, 9, 5])
  alg = factories.make_algorithm(make(algorithm='gel', guess_policy='fixed', guess_count=7),
                                 model, np.arange(1, 26))
  np.testing.assert_array_equal(alg.client_guesses(budgets, 13), [7, 7, 7])
  for name in ('fedavgcm', 'fedprox', 'fednova'):
    assert factories.make_algorithm(make(algorithm=name), model,
                                    np.arange(1, 26)).client_guesses is None


def test_a_budget_range_given_as_on_the_command_line_is_read():
  """make(budget_range='2,4') failed with got ('2', ',', '4')."""
  assert make(budget_range='2,4').cohort.budget_range == (2, 4) == make(
      budget_range=[2, 4]).cohort.budget_range
  with pytest.raises(ConfigError, match='--budget_range must be two integers'):
    make(budget_range='2-4')


def test_default_aggregation_weights_follow_the_client_selection():
  """Power-of-d draws its candidates by data size, so its default weights are uniform (Cho et
  al. 2022's plain mean of the selected models); the others' are num_examples (the GeL
  paper's p_i = n_i / n). A config records the weighting itself, and an explicit one is kept."""
  assert make().cohort.aggregation_weights == 'num_examples'
  powd = make(client_selection='power_of_d')
  assert powd.cohort.aggregation_weights == 'uniform'
  assert powd.to_json()['cohort']['aggregation_weights'] == 'uniform'
  assert make().replace(client_selection='power_of_d') == powd
  assert powd.replace(client_selection='cyclic').cohort.aggregation_weights == 'num_examples'
  kept = make(client_selection='power_of_d', aggregation_weights='num_examples')
  assert kept.replace(client_selection='uniform').cohort.aggregation_weights == 'num_examples'
  assert CohortConfig(client_selection='power_of_d').aggregation_weights == 'uniform'


def test_cohort_spec_from_the_config():
  c = make(clients_per_round=7, budget_range=(2, 5), batch_size=4,
           sample_with_replacement=False, aggregation_weights='uniform')
  counts = np.array([3, 9, 5])
  assert c.cohort.spec(counts) == CohortSpec(7, (2, 5), 4, False, 'uniform')
  cyclic = c.replace(client_selection='cyclic', cyclic_groups=3)
  assert cyclic.cohort.spec(counts) == CohortSpec(7, (2, 5), 4, False, 'uniform', 'cyclic', 3)
  epochs = c.replace(budget_unit='epochs', budget_draw='proportional').cohort.spec(counts)
  assert epochs == CohortSpec(7, (2, 5), 4, False, 'uniform', budget_unit='epochs',
                              budget_draw='proportional', max_examples=9)
  assert epochs.max_budget == 5 * 3   # 5 epochs of the largest client's ceil(9 / 4) steps


@pytest.mark.parametrize('kwargs,flag', [
    (dict(algorithm='fednova_gel', guess_proxy='last_gradient'), '--guess_proxy'),
    (dict(algorithm='fedprox_gel', guess_proxy='last_gradient'), '--guess_proxy'),
    (dict(algorithm='fedavg_gel', guess_proxy='zero'), '--guess_proxy'),
    (dict(algorithm='gel', guess_policy='inf', guess_proxy='last_gradient'), '--guess_policy'),
    (dict(algorithm='fedyogi', server_optimizer='adam'), '--server_optimizer'),
    (dict(algorithm='gel', guess_count=10**9), '--guess_count'),
])
def test_guess_and_server_combinations_that_cannot_work(kwargs, flag):
  with pytest.raises(ConfigError) as e:
    validation.validate(make(**kwargs))
  assert str(e.value).startswith(flag) and '\n' not in str(e.value)


@pytest.mark.slow
def test_cyclic_selection_reaches_the_rounds(base_config, tmp_path):
  c = base_config.replace(client_selection='cyclic', cyclic_groups=2,
                          algorithm='fedexp')
  seen = []
  quiet_train(factories.prepare(c), tmp_path / 'cyc', callbacks=[
      OnRound(lambda r, cohort, m: seen.append((r, np.asarray(cohort.client_ids))))])
  assert len(seen) == 5 and all(np.all(ids % 2 == r % 2) for r, ids in seen)


def test_cyclic_groups_must_fit_the_population(base_config):
  with pytest.raises(ConfigError, match='--cyclic_groups=9 exceeds the population of 8'):
    factories.prepare(base_config.replace(client_selection='cyclic', cyclic_groups=9))


@pytest.mark.slow
def test_power_of_d_selection_runs_from_the_runner(base_config, tmp_path):
  c = base_config.replace(client_selection='power_of_d', power_d=5)
  seen = []
  quiet_train(factories.prepare(c), tmp_path / 'pod', callbacks=[
      OnRound(lambda r, cohort, m: seen.append(np.asarray(cohort.client_ids)))])
  assert len(seen) == 5 and all(len(set(ids.tolist())) == 3 for ids in seen)
  with pytest.raises(ConfigError, match='--power_d=2 must be at least --clients_per_round=3'):
    validation.validate(c.replace(power_d=2))


@pytest.mark.slow
def test_stateful_algorithms_keep_a_row_per_training_client(base_config, tmp_path):
  """The store holds every training client's row (8 clients of the tiny LEAF file; 61 floats
  of SCAFFOLD's c_i per client for its logistic model) and reports its size."""
  exp = factories.prepare(base_config.replace(algorithm='scaffold'))
  summary = quiet_train(exp, tmp_path / 'scaffold')
  params = exp.model.init(jax.random.key(0))
  row = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(params))
  assert summary['client_state_bytes'] == exp.train.num_clients * row == 8 * row
  c = base_config.replace(algorithm='cluster_fedvarp', fedvarp_clusters=9)
  with pytest.raises(ConfigError, match='--fedvarp_clusters=9 exceeds the population of 8'):
    factories.prepare(c)


def test_a_store_that_cannot_fit_is_one_clear_error(base_config, monkeypatch):
  """Memory for one chunk of one client (about 8 models), not for 8 clients' AdaBest rows
  (a model and a counter each) in half of it."""
  c = base_config.replace(algorithm='adabest', chunk_size=1, batch_size=1,
                          budget_range=(1, 1))
  exp = factories.prepare(c)
  params = exp.model.init(jax.random.key(0))
  model_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree_util.tree_leaves(params))
  assert planning.store_bytes(exp.algorithm, params) == 8 * (model_bytes + 4)
  # one chunk needs about 8 models; the store and 3 cohorts' rows (17 rows) more than half of 12
  monkeypatch.setattr(planning, 'memory_limit', lambda gib=0.: 12 * model_bytes)
  with pytest.raises(ConfigError) as e:
    factories.prepare(c)
  message = str(e.value)
  assert message.startswith('--algorithm=adabest keeps') and '\n' not in message
  assert 'for each of 8 clients' in message and '--num_devices' in message


def test_a_large_store_spreads_over_every_device():
  gib = 2**30
  assert planning.auto_num_devices(20, store_size=gib, memory=4 * gib, available=8) == 1
  assert planning.auto_num_devices(20, store_size=3 * gib, memory=4 * gib, available=8) == 8
  assert planning.auto_num_devices(4096, store_size=0, memory=4 * gib, available=8) == 8
  # CPU cores share the host's memory: spreading a store over them saves nothing.
  assert planning.auto_num_devices(20, 3 * gib, 4 * gib, available=8, shared_memory=True) == 1


SHARED = pathlib.Path(__file__).resolve().parents[2].parent / 'shared' / 'data' / 'leaf'


@pytest.mark.slow
def test_fedprox_synthetic_generator_trains(tmp_path):
  c = make(dataset='fedprox_synthetic', algorithm='fedavg', num_rounds=4, eval_every=2,
             clients_per_round=5, batch_size=10, budget_range=(2, 4), client_lr=0.05)
  exp = factories.prepare(c)
  assert exp.train.num_clients == 30 and exp.model.num_classes <= 10
  summary = quiet_train(exp, tmp_path / 'fp')
  records = workdir_lib.read_metrics(str(tmp_path / 'fp'))
  assert records[-1]['train_loss'] < records[0]['train_loss']
  assert summary['final_accuracy'] is not None


@pytest.mark.skipif(not (SHARED / 'fedprox_synthetic_1_1_subset.json').is_file(),
                    reason='../shared/data/leaf/fedprox_synthetic_1_1_subset.json not found')
@pytest.mark.slow
def test_shipped_fedprox_file_with_float_labels_loads_and_trains(tmp_path):
  c = make(dataset='leaf', data_path=str(SHARED / 'fedprox_synthetic_1_1_subset.json'),
             algorithm='fedavg', num_rounds=10, eval_every=5, clients_per_round=10,
             batch_size=10, budget_range=(5, 5), client_lr=0.05, target=0.5)
  exp = factories.prepare(c)
  assert exp.train.num_clients == 30 and exp.model.num_classes == 10
  quiet_train(exp, tmp_path / 'fp')
  records = workdir_lib.read_metrics(str(tmp_path / 'fp'))
  assert records[-1]['train_loss'] < 0.9 * records[0]['train_loss']
  assert records[-1]['test_accuracy'] > records[0]['test_accuracy']


@pytest.mark.parametrize('emitters,fused', [('quick', True), ('default', True),
                                             ('quick', False)])
@pytest.mark.slow
def test_vmapped_seeds_are_the_separate_runs(base_config, tmp_path, emitters, fused):
  """Three seeds as one vmapped program write exactly the metrics of three separate runs,
  whether compiled for compile time (``QUICK_COMPILE``) or with XLA's defaults; both at the LLVM
  level runs compile at (not the suite's); with the library's products (the default) and with
  the fused small products (``--fuse_small_dots``)."""
  configs = [base_config.replace(algorithm='gel', seed=s, fuse_small_dots=fused)
             for s in (0, 1, 2)]
  exp = factories.prepare(configs[0])
  options = exp.backend.compiler_options
  assert options == xla.compiler_options(True)   # a small round
  if emitters == 'default':
    if options is None:
      pytest.skip("one program either way: no XLA CPU legacy emitters here")
    options = helpers.DEFAULT_EMITTERS
  exp = exp._replace(backend=exp.backend._replace(
      compiler_options=helpers.as_runs_compile(options)), compiled={})
  assert planning.batchable(exp) and planning.runs_chunk_size(exp, 3) == exp.chunk_size
  together = api.train(exp, [str(tmp_path / f'v{s}') for s in (0, 1, 2)], configs,
                       err=io.StringIO())
  assert [s['runs_in_program'] for s in together] == [3, 3, 3]
  for s, c in enumerate(configs):
    alone = quiet_train(factories.with_config(exp, c), tmp_path / f's{s}')
    assert alone['runs_in_program'] == 1
    strip = lambda recs: [{k: v for k, v in r.items() if k != 'elapsed_s'} for r in recs]
    assert strip(read_jsonl(tmp_path / f'v{s}' / 'metrics.jsonl')) == strip(
        read_jsonl(tmp_path / f's{s}' / 'metrics.jsonl'))
    for key in ('final_accuracy', 'best_accuracy', 'rounds_to_target', 'grad_computations'):
      assert together[s][key] == alone[key]


def round_program(config) -> str:
  """The StableHLO of the round program the experiment layer builds for ``config``'s run."""
  exp = factories.prepare(config)
  program, hparams = factories.make_runs(exp, [config], exp.chunk_size)
  root, r = keys.root_key(config.run.seed), np.int32(0)
  state = program.init(root, hparams)
  cohort = program.sample(root, r, None)
  return program.round.lower(state, hparams, cohort, exp.train, root, r).lowered.as_text()


@pytest.mark.slow
def test_the_round_program_does_not_depend_on_the_number_of_rounds(base_config):
  """Tuning never changes numbers: a run of 40 rounds and one of 10**6 compile the same round
  (a rule reading --num_rounds chose the fused products from 5,000 client-rounds, so a run
  extended across it ran its added rounds with another program than the longer run), and
  ``--fuse_small_dots`` is what chooses them."""
  for fused in (False, True):
    short = round_program(base_config.replace(num_rounds=40, fuse_small_dots=fused))
    assert round_program(base_config.replace(num_rounds=10**6, fuse_small_dots=fused)) == short
  assert round_program(base_config.replace(num_rounds=40)) != short


@pytest.mark.slow
def test_the_client_distance_is_measured_when_asked(base_config, tmp_path):
  """--client_distance: FedGBO's drift metric in every record and in the cost table; without
  it the records hold null and the table a dash (nothing is computed for it)."""
  from fedjax_gel.experiment import report  # pylint: disable=g-import-not-at-top
  c = base_config.replace(algorithm='fedavg')
  runs = []
  for asked in (False, True):
    summary = quiet_train(factories.prepare(c.replace(client_distance=asked)),
                          tmp_path / str(asked))
    records = read_jsonl(tmp_path / str(asked) / 'metrics.jsonl')
    distances = [r['client_distance'] for r in records if r['round'] > 0]
    assert all(d > 0 for d in distances) if asked else set(distances) == {None}
    runs.append(({**summary, 'client_lr': 0.1}, records))
  plain, measured = (report.cost_table([run]).splitlines()[2].split(' | ')[4] for run in runs)
  assert plain == '-' and float(measured) > 0


def test_what_can_be_one_program(base_config):
  exp = factories.prepare(base_config)
  assert planning.batchable(exp)
  assert not planning.batchable(factories.with_config(
      exp, base_config.replace(algorithm='scaffold')))          # per-client state: one run per program
  with pytest.raises(ValueError, match='only in the seed and client_lr'):
    factories.make_runs(exp, [base_config, base_config.replace(batch_size=1)], 1)


def poisoned_client_run(base_config, tmp_path):
  """A run whose pool holds one client with infinite features, first sampled after a
  checkpoint: ``(summary, workdir, the round its update reaches the server)``."""
  c = base_config.replace(num_rounds=12, checkpoint_every=2, eval_every=2)
  exp = factories.prepare(c)
  sample = factories.make_sampler(exp)
  first = {}
  for r in range(c.run.num_rounds):
    for i in np.asarray(sample(keys.root_key(c.run.seed), r, None).client_ids).tolist():
      first.setdefault(i, r + 1)
  client = max((i for i in first if first[i] > 3), key=lambda i: first[i])
  lo, n = int(exp.train.offsets[client]), int(exp.train.counts[client])
  x = exp.train.examples['x'].at[lo:lo + n].set(jnp.inf)
  exp = exp._replace(train=exp.train._replace(examples={**exp.train.examples, 'x': x}))
  summary = quiet_train(exp, tmp_path)
  return summary, tmp_path, first[client]


@pytest.mark.slow
def test_divergence_stops_the_run_and_keeps_the_last_good_checkpoint(base_config, tmp_path):
  summary, workdir, bad_round = poisoned_client_run(base_config, tmp_path)
  assert summary['status'] == 'diverged' and summary['diverged_round'] == bad_round
  records = read_jsonl(workdir / 'metrics.jsonl')
  assert records[-1]['round'] < bad_round and all(
      np.isfinite(r['test_loss']) for r in records)
  assert summary['final_accuracy'] == records[-1]['test_accuracy']
  kept = checkpoint.rounds(str(workdir))
  assert kept and max(kept) < bad_round <= max(kept) + 2   # the last one before it
  assert not (workdir / 'model.msgpack').exists()
  assert json.loads((workdir / 'summary.json').read_text())['status'] == 'diverged'


@pytest.mark.slow
def test_a_diverged_seed_is_marked_alone(base_config, tmp_path):
  """Seeds 0 and 1 vmapped, seed 1's initial model NaN: seed 1 is marked diverged after round
  1; seed 0 finishes with exactly the metrics of its own run (both programs compiled as runs
  compile)."""
  configs = [base_config.replace(algorithm='gel', seed=s) for s in (0, 1)]
  exp = factories.prepare(configs[0])
  exp = exp._replace(backend=exp.backend._replace(
      compiler_options=helpers.as_runs_compile(exp.backend.compiler_options)), compiled={})
  bad = jax.random.key_data(keys.init_key(keys.root_key(1)))

  def init(key):
    poison = jnp.all(jax.random.key_data(key) == bad)
    return jax.tree.map(lambda p: jnp.where(poison, jnp.nan, p), exp.model.init(key))

  poisoned = exp._replace(model=exp.model._replace(init=init))
  out = api.train(poisoned, [str(tmp_path / 's0'), str(tmp_path / 's1')], configs,
                  err=io.StringIO())
  assert [s['status'] for s in out] == ['finished', 'diverged']
  assert out[1]['diverged_round'] == 1
  alone = quiet_train(factories.with_config(exp, configs[0]), tmp_path / 'alone')
  strip = lambda recs: [{k: v for k, v in r.items() if k != 'elapsed_s'} for r in recs]
  assert strip(read_jsonl(tmp_path / 's0' / 'metrics.jsonl')) == strip(
      read_jsonl(tmp_path / 'alone' / 'metrics.jsonl'))
  assert alone['status'] == 'finished'


@pytest.mark.parametrize('chunk_size,asked', [(0, 'the automatic 12'), (12, '--chunk_size=12')])
@pytest.mark.slow
def test_memory_guard_shrinks_the_chunk_before_compiling(base_config, monkeypatch, tmp_path,
                                                         chunk_size, asked):
  c = base_config.replace(clients_per_round=12, sample_with_replacement=True,
                          chunk_size=chunk_size, num_rounds=2)
  roomy = factories.prepare(c)
  assert roomy.chunk_size == 12 and roomy.notes == ()
  limit = helpers.memory_for(roomy, 5)
  monkeypatch.setattr(planning, 'memory_limit', lambda gib=0.: limit)
  exp = factories.prepare(c)
  assert exp.chunk_size == 5
  (note,) = exp.notes
  assert note.startswith(asked) and note.endswith('running 5 per chunk to fit the device memory')
  summary = quiet_train(exp, tmp_path / 'run')
  assert summary['chunk_size'] == 5 and summary['status'] == 'finished'
  # Two seeds together: 2 clients per chunk and seed (the 5 that fit, shared).
  assert planning.runs_chunk_size(exp, 2) == 2


def test_memory_guard_fails_in_one_line_when_one_client_cannot_fit(base_config, monkeypatch):
  exp = factories.prepare(base_config)
  limit = helpers.memory_for(exp, 0)
  monkeypatch.setattr(planning, 'memory_limit', lambda gib=0.: limit)
  with pytest.raises(ConfigError) as e:
    factories.prepare(base_config)
  message = str(e.value)
  assert message.startswith('--budget_range=1,3 with --batch_size=2: one client needs about')
  assert 'lower the budgets or the batch size' in message and '\n' not in message


@pytest.mark.slow
def test_default_workdir_is_the_settings_digest(base_config, tmp_path, monkeypatch):
  """The same command finds its folder again and says its runs are finished; other settings
  get another folder."""
  runs = expand(base_config)
  assert api.default_workdir(runs) == api.default_workdir(expand(base_config.replace()))
  assert api.default_workdir(runs) != api.default_workdir(
      expand(base_config.replace(num_rounds=6)))
  assert api.default_workdir(runs) != api.default_workdir(runs, Sweep(server_lrs=[1.0]))
  monkeypatch.chdir(tmp_path)
  first, second = io.StringIO(), io.StringIO()
  api.run(base_config, out=io.StringIO(), err=first)
  api.run(base_config, out=io.StringIO(), err=second)
  folder = api.default_workdir(runs)
  assert (tmp_path / folder / 'summary.json').exists()
  assert 'finished earlier' not in first.getvalue()
  assert f'finished earlier in {folder}' in second.getvalue()


@pytest.mark.parametrize('damage', [b'{"round": 2, \xff}\n', b'[2]\n', b'{"round": \n'],
                         ids=['not_utf8', 'not_an_object', 'not_json'])
def test_a_damaged_metrics_line_is_one_error_naming_the_file_and_line(tmp_path, damage):
  (tmp_path / 'metrics.jsonl').write_bytes(b'{"round": 1}\n' + damage + b'{"round": 3}\n')
  with pytest.raises(ConfigError, match=r'metrics\.jsonl line 2 is not a record \(damaged\?\)'):
    workdir_lib.read_metrics(str(tmp_path))
  (tmp_path / 'metrics.jsonl').write_bytes('{"round": 1, "note": "\u00e9"}\n'.encode())
  assert workdir_lib.read_metrics(str(tmp_path)) == [{'round': 1, 'note': '\u00e9'}]


def test_flags_a_run_does_not_read_are_not_compared_with_an_earlier_record(tmp_path):
  """A work directory of an earlier version, whose FedDyn run recorded a server learning rate
  (given to another algorithm of its command) or whose LEAF run recorded --image_dir, resumes
  under the same command: those flags were never read."""
  for recorded, now in ((make(algorithm='feddyn', server_lr=0.5), make(algorithm='feddyn')),
                        (make(image_dir='/img'), make())):
    files.write_json(str(tmp_path / 'config.json'), recorded.to_json())
    assert workdir_lib.run_status(str(tmp_path), now, False) == 'resume'
  files.write_json(str(tmp_path / 'config.json'),
                   make(algorithm='fedavgcm', server_lr=0.5).to_json())
  with pytest.raises(ConfigError, match='--server_lr=0.5 there, 1.0 now'):
    workdir_lib.run_status(str(tmp_path), make(algorithm='fedavgcm'), False)


@pytest.mark.parametrize('kwargs,match', [
    (dict(algorithms='gel'), r"Sweep: algorithms must be a list or tuple, got 'gel' \(write \['gel'\]\)"),
    (dict(seeds=3), 'Sweep: seeds must be a list or tuple, got 3'),
    (dict(hparam_grid=('prox_mu', [])), r'hparam_grid must be \(flag, values\) with at least one'),
    (dict(hparam_grid=('prox_mu', '0.1')), r'hparam_grid must be \(flag, values\)'),
    (dict(client_lrs=['0.1']), "Sweep: client_lrs must hold numbers, got '0.1'"),
    (dict(seeds=[0.5]), 'Sweep: seeds must hold whole numbers, got 0.5'),
])
def test_a_sweep_of_the_wrong_shape_is_one_line(kwargs, match):
  """A string where a list goes ("unknown value 'g'" before), an empty grid (an IndexError),
  a string among the rates (a TypeError comparing it)."""
  with pytest.raises(ConfigError, match=match):   # the grid's own shape: when it is expanded
    expand(make(algorithm='fedprox'), Sweep(**kwargs))


def test_a_sweep_takes_numpy_arrays_as_lists():
  """``np.logspace`` for the rates: "the truth value of an array is ambiguous" before."""
  sweep = Sweep(seeds=np.arange(2), client_lrs=np.logspace(-3, -1, 3),
                    server_lrs=np.array([0.5, 1.0]))
  assert sweep.seeds == (0, 1) and sweep.server_lrs == (0.5, 1.0)
  runs = expand(make(algorithm='fedavgcm'), Sweep(seeds=np.arange(2),
                                                          client_lrs=np.logspace(-3, -1, 3)))
  assert sorted((c.run.seed, round(c.algorithm.client_lr, 6)) for c in runs) == [
      (s, lr) for s in (0, 1) for lr in (0.001, 0.01, 0.1)]
  assert expand(make(algorithm='fedavgcm'), sweep)   # a grid's rows: no error


@pytest.mark.parametrize('kwargs,words', [
    (dict(c={}), r'c must be a Config \(experiment\.make\(\.\.\.\) builds one\), got dict'),
    (dict(sweep={'seeds': [1]}), 'sweep must be an experiment.Sweep, got dict'),
    (dict(callbacks=callbacks.Callback()), 'callbacks must be a list of callbacks, got Callback'),
    (dict(callbacks=[1]), 'a callback must have the hooks of experiment.callbacks.Callback'),
    (dict(out='report.txt'), 'out must be a text stream .with write., got str'),
], ids=['config_dict', 'sweep_dict', 'one_callback', 'callback_int', 'out_path'])
def test_run_refuses_arguments_of_the_wrong_kind_before_writing(tmp_path, kwargs, words):
  """They were AttributeErrors, some after config.json and the metrics were written, one after
  the runs had trained."""
  args = {'c': make(num_rounds=2), 'workdir': str(tmp_path / 'w'), **kwargs}
  with pytest.raises(TypeError, match=f'^experiment.run: {words}'):
    api.run(**args)
  assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_a_diverged_run_says_so_in_its_line(base_config, tmp_path):
  """Its line read as a finished run's (the 'final' value is its last finite evaluation)."""
  out = io.StringIO()
  api.run(base_config.replace(client_lr=3e38, num_rounds=3, eval_every=1), str(tmp_path / 'd'),
          out=out, err=io.StringIO())
  summary = json.loads((tmp_path / 'd' / 'summary.json').read_text())
  assert summary['status'] == 'diverged'
  assert (f'(diverged after round {summary["diverged_round"]}: its last finite evaluation)'
          in out.getvalue().splitlines()[0])


def test_a_setting_one_run_reads_is_kept_and_one_none_reads_is_refused():
  """One flag file serves several algorithms: --client_momentum=0.5 with FedAvg and FedAvgCM
  is FedAvgCM's (FedAvg records it as given, as before, so that the command's default work
  directory is the one an earlier version chose); the server's flags go to the algorithms
  that apply a server optimiser, FedDyn records their defaults."""
  runs = expand(make(client_momentum=0.5, server_optimizer='momentum', server_momentum=0.3),
                    Sweep(algorithms=['fedavg', 'fedavgcm', 'feddyn']))
  by_name = {x.algorithm.name: x for x in runs}
  assert by_name['fedavgcm'].algorithm.client_momentum == 0.5
  assert by_name['fedavg'].server.momentum == by_name['fedavgcm'].server.momentum == 0.3
  assert by_name['feddyn'].server.momentum == 0. and by_name['feddyn'].server.optimizer == 'sgd'
  with pytest.raises(ConfigError, match=r'--server_beta1=0.5: --server_optimizer=momentum does '
                     r'not read it; drop the flag'):
    expand(make(server_optimizer='momentum', server_beta1=0.5))
  with pytest.raises(ConfigError, match=r'--client_momentum=0.5: --algorithm=fedavg does not'):
    expand(make(algorithm='fedavg', client_momentum=0.5))
  (run,) = expand(make(algorithm='fedavg', client_momentum=0.))   # what its clients do: kept
  assert run.algorithm.client_momentum == 0.


def test_a_registered_algorithm_keeps_the_client_momentum():
  """Its spec may read --client_momentum without declaring ``momentum=True`` (which only
  built-in specs are taken at their word for): 0.5 stays 0.5, not the default."""
  from fedjax_gel.algorithms import fedavgcm  # pylint: disable=g-import-not-at-top
  from fedjax_gel.spec import AlgorithmSpec  # pylint: disable=g-import-not-at-top
  registry.register(AlgorithmSpec(
      'mine_cm', lambda hp, s: fedavgcm(s.loss, s.client_lr, s.client_momentum, s.server)))
  try:
    (run,) = expand(make(algorithm='mine_cm', client_momentum=0.5))
    assert run.algorithm.client_momentum == 0.5
  finally:
    registry.unregister('mine_cm')
