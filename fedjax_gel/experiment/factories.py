"""Factories: the data, the model, the algorithm and the sampler a ``Config`` names.

``prepare(config)`` builds them all and checks them (with the memory planner) before anything
is written; ``with_config`` swaps the algorithm or seed of a prepared experiment.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_gel import algorithms, models, optim
from fedjax_gel.core import devices, evaluation, federated_data, sampling
from fedjax_gel.core import keys, runs as runs_lib, selection
from fedjax_gel.experiment import config as config_lib
from fedjax_gel.experiment import planning
from fedjax_gel.experiment.config import Config, ConfigError, validate


def server_optimizer(c: Config) -> optax.GradientTransformation:
  """The server optimiser applied to ``Delta``.

  ``fedadam``/``fedyogi``/``fedadagrad`` are Reddi et al. 2021's forms (``fedjax_gel.optim``,
  no bias correction); ``adam``/``yogi``/``adagrad`` are optax's own. The FedOpt algorithms
  (``--algorithm=fedadam`` ...) fix their server optimiser whatever ``--server_optimizer`` says.
  """
  lr, b1, b2, tau = c.server_lr, c.server_beta1, c.server_beta2, c.server_tau
  name = config_lib.FEDOPT_SERVERS.get(c.algorithm, c.server_optimizer)
  return {
      'sgd': lambda: optax.sgd(lr),
      'momentum': lambda: optax.sgd(lr, momentum=c.server_momentum),
      'fedadam': lambda: optim.fedadam(lr, b1, b2, tau),
      'fedyogi': lambda: optim.fedyogi(lr, b1, b2, tau),
      'fedadagrad': lambda: optim.fedadagrad(lr, b1, tau),
      'adam': lambda: optax.adam(lr, b1=b1, b2=b2, eps=tau),
      'yogi': lambda: optax.yogi(lr, b1=b1, b2=b2, eps=tau),
      'adagrad': lambda: optax.adagrad(lr, eps=tau),
  }[name]()


def load_split(c: Config) -> federated_data.FederatedSplit:
  """Loads the train/test pools the config names (host side). Raises DataError on bad files."""
  if c.dataset in ('leaf_synthetic', 'fedprox_synthetic'):   # generated: cached on disk
    from fedjax_gel.data import cache, fedprox_synthetic, leaf, leaf_synthetic
    split = dict(train_fraction=c.train_fraction, split_seed=c.split_seed)
    if c.dataset == 'leaf_synthetic':
      return cache.cached_split(c.dataset, split, (leaf_synthetic, leaf),
                                lambda: leaf_synthetic.load(**split))
    settings = dict(alpha=c.fedprox_alpha, beta=c.fedprox_beta, iid=c.fedprox_iid, **split)
    return cache.cached_split(
        c.dataset, settings, (fedprox_synthetic, leaf),
        lambda: fedprox_synthetic.load(c.fedprox_alpha, c.fedprox_beta, c.fedprox_iid, **split))
  if c.dataset in config_lib.TFDS_DATASETS:
    from fedjax_gel.data import tfds_data
    try:
      return tfds_data.load(c.dataset, c.num_clients, c.dirichlet_alpha, c.partition,
                            c.pachinko_beta, seed=c.split_seed, data_dir=c.data_dir)
    except ImportError as e:
      raise ConfigError(f'--dataset={c.dataset}: {e}') from None
  from fedjax_gel.data import leaf, leaf_tasks
  args = dict(train_fraction=c.train_fraction, seed=c.split_seed, split=c.split)
  if c.dataset == 'shakespeare':
    return leaf_tasks.load_shakespeare(c.data_path, c.char_vocabulary, gap=c.split_gap, **args)
  if c.dataset == 'sent140':
    return leaf_tasks.load_sent140(c.data_path, c.sent140_features, c.vocab_size, c.seq_len,
                                   **args)
  if c.dataset == 'femnist':
    return leaf_tasks.load_femnist(c.data_path, **args)
  if c.dataset == 'celeba':
    return leaf_tasks.load_celeba(c.data_path, c.image_dir, **args)
  return leaf.load(c.data_path, gap=c.split_gap, **args)


def make_model(c: Config, split: federated_data.FederatedSplit) -> models.Model:
  """``--model`` for the data's input shape and classes (``max label + 1``); token models get
  ``vocab_size = max id + 1`` over train and test."""
  x = np.asarray(split.train.examples['x'])
  if not np.issubdtype(x.dtype, np.number):
    raise ConfigError(f'--model={c.model} needs numeric features; this dataset holds '
                      f'{x.dtype.kind == "U" and "strings" or x.dtype} (text: use '
                      '--dataset=shakespeare or --dataset=sent140)')
  tokens = np.issubdtype(x.dtype, np.integer)
  if tokens != (c.model in models.TOKEN_MODELS):
    need = f'one of {", ".join(models.TOKEN_MODELS)}' if tokens else 'a model of numbers'
    raise ConfigError(f'--model={c.model}: {c.data_path or c.dataset} holds '
                      f'{"token ids" if tokens else "numeric features"}; use {need}')
  y = np.concatenate([np.asarray(split.train.examples['y']), np.asarray(split.test.examples['y'])])
  if not np.issubdtype(y.dtype, np.integer) or y.min() < 0:
    got = 'string labels' if y.dtype.kind == 'U' else f'label {y.min()}'
    raise ConfigError(f'--model={c.model} needs labels 0, 1, ...; {c.data_path or c.dataset} '
                      f'holds {got}')
  vocab = None
  if tokens:
    vocab = int(max(x.max(initial=0), np.asarray(split.test.examples['x']).max(initial=0))) + 1
  return models.get_model(c.model, x.shape[1:], int(y.max()) + 1, vocab_size=vocab)


def gbo_optimizer(c: Config) -> optim.GlobalBiasedOptimizer:
  """The FedGBO-family optimiser ``--gbo_optimizer`` names (``--gbo_beta`` is SGDm's and
  RMSProp's decay and Adam's beta1)."""
  if c.gbo_optimizer == 'sgdm':
    return optim.gbo_sgdm(c.client_lr, b1=c.gbo_beta)
  if c.gbo_optimizer == 'rmsprop':
    return optim.gbo_rmsprop(c.client_lr, decay=c.gbo_beta, eps=c.gbo_eps)
  return optim.gbo_adam(c.client_lr, b1=c.gbo_beta, b2=c.gbo_beta2, eps=c.gbo_eps)


def memory_weights(c: Config, counts) -> np.ndarray:
  """FedVARP's ``q_j``: ``1/N`` with ``--aggregation_weights=uniform``, else ``n_j / n``."""
  counts = np.asarray(counts, np.float64)
  if c.aggregation_weights == 'uniform':
    return np.full(counts.shape, 1. / len(counts))
  return counts / counts.sum()


def make_algorithm(c: Config, model: models.Model, counts) -> algorithms.FederatedAlgorithm:
  """The algorithm ``--algorithm`` names, with its client and server optimisers (Boukhari et al.
  2023, GeL, Table 3): SGD clients for FedAvg, FedOpt, FedExP, SCAFFOLD, FedDyn, AdaBest and
  FedVARP; SGDM for FedAvgCM, FedProx, FedNova and GeL. ``counts``: the training clients' example
  counts (the population of the stateful algorithms)."""
  loss = models.cross_entropy_loss(model)
  server, lr, mom = server_optimizer(c), c.client_lr, c.client_momentum
  population, policy = len(counts), c.guess_policy_value()
  build = {
      'fedavg': lambda: algorithms.fedavg(loss, optax.sgd(lr), server),
      'fedavgcm': lambda: algorithms.fedavgcm(loss, lr, mom, server),
      'gel': lambda: algorithms.gel(loss, lr, mom, server, c.proxy, policy),
      'fedavg_gel': lambda: algorithms.fedavg_gel(loss, lr, server, c.proxy, policy),
      'fedprox': lambda: algorithms.fedprox(loss, lr, c.prox_mu, mom, server),
      'fedprox_gel': lambda: algorithms.fedprox_gel(loss, lr, c.prox_mu, mom, server, policy),
      'fednova': lambda: algorithms.fednova(loss, lr, mom, server),
      'fednova_gel': lambda: algorithms.fednova_gel(loss, lr, mom, server, policy),
      'fedyogi_gel': lambda: algorithms.gel(loss, lr, mom, server, c.proxy, policy,
                                            'fedyogi_gel'),
      'fedgbo': lambda: algorithms.fedgbo(loss, gbo_optimizer(c)),
      'mfl': lambda: algorithms.mfl(loss, gbo_optimizer(c)),
      'mimelite': lambda: algorithms.mime(loss, gbo_optimizer(c), full_batch=True),
      'mimexlite': lambda: algorithms.mime(loss, gbo_optimizer(c), full_batch=False),
      'fedmax': lambda: algorithms.fedmax(model, lr, c.fedmax_beta, server),
      'fedexp': lambda: algorithms.fedexp(loss, lr, c.fedexp_eps),
      'scaffold': lambda: algorithms.scaffold(loss, lr, population, server),
      'feddyn': lambda: algorithms.feddyn(loss, lr, c.feddyn_mu, population),
      'adabest': lambda: algorithms.adabest(loss, lr, c.adabest_mu, c.adabest_beta, population),
      'fedvarp': lambda: algorithms.fedvarp(loss, lr, memory_weights(c, counts), server),
      'cluster_fedvarp': lambda: algorithms.fedvarp(
          loss, lr, memory_weights(c, counts), server,
          clusters=np.arange(population) % c.fedvarp_clusters),
  }
  if c.algorithm in build:
    return build[c.algorithm]()._replace(name=c.run_name)
  return algorithms.fedavg(loss, optax.sgd(lr), server, c.algorithm)   # fedadam, fedyogi, ...


class Experiment(NamedTuple):
  """Everything a run needs, built and checked before the first round."""
  config: Config
  model: models.Model
  algorithm: algorithms.FederatedAlgorithm
  train: federated_data.FederatedData   # on device
  test_pool: evaluation.EvalPool
  train_pool: evaluation.EvalPool
  chunk_size: int
  mesh: object = None   # jax.sharding.Mesh over the 'clients' axis, or None on one device
  memory: planning.MemoryPlan | None = None
  notes: tuple = ()     # what was changed to make the run fit (printed by launch/run.py)
  # Compiled programs that depend on the data and the model only (evaluation, the sampler),
  # shared by every algorithm and seed of the experiment (``with_config`` keeps the dict).
  compiled: dict | None = None


def prepare(c: Config) -> Experiment:
  """Validates the config, loads the data and builds model and algorithm (writes nothing)."""
  validate(c)
  split = load_split(c)
  population = split.train.num_clients
  if not c.sample_with_replacement and c.clients_per_round > population:
    raise ConfigError(f'--clients_per_round={c.clients_per_round} exceeds the population of '
                      f'{population} clients without replacement')
  if c.client_selection == 'power_of_d' and c.candidates > population:
    raise ConfigError(f'--power_d={c.candidates} exceeds the population of {population} clients')
  if c.client_selection == 'cyclic':
    smallest = population // c.cyclic_groups
    if smallest == 0:
      raise ConfigError(f'--cyclic_groups={c.cyclic_groups} exceeds the population of '
                        f'{population} clients')
    if not c.sample_with_replacement and c.clients_per_round > smallest:
      raise ConfigError(f'--clients_per_round={c.clients_per_round} exceeds the smallest cyclic '
                        f'group ({smallest} clients) without replacement')
  model = make_model(c, split)
  if c.algorithm == 'cluster_fedvarp' and c.fedvarp_clusters > population:
    raise ConfigError(f'--fedvarp_clusters={c.fedvarp_clusters} exceeds the population of '
                      f'{population} clients')
  algorithm = make_algorithm(c, model, split.train.counts)
  train = federated_data.to_device(split.train)
  if c.num_devices > jax.device_count():
    raise ConfigError(f'--num_devices={c.num_devices} but only {jax.device_count()} '
                      f'{jax.default_backend()} devices are present')
  params = jax.eval_shape(model.init, jax.random.key(0))
  mesh, chunk = planning.devices_and_chunk(algorithm, params, split.train, c.clients_per_round,
                                           c.batch_size, tuple(c.budget_range), c.num_devices,
                                           c.chunk_size)
  num_devices = 1 if mesh is None else mesh.size
  test_pool = evaluation.make_eval_pool(split.test)
  train_pool = evaluation.make_eval_pool(split.train, max_examples=c.train_eval_examples,
                                         seed=c.split_seed)
  plan = planning.memory_plan(c, params, algorithm, train, (test_pool, train_pool), num_devices)
  exp = Experiment(c, model, algorithm, train, test_pool, train_pool, chunk, mesh, plan,
                   compiled={})
  exp = planning.fit_memory(exp)
  return exp._replace(train=devices.replicate(train, mesh))   # placed once, not every round


def with_config(exp: Experiment, c: Config) -> Experiment:
  """The same data, model, chunks and devices for another algorithm or seed of ``c``.

  Only ``algorithm`` and ``seed`` (and what they alone read) may differ from ``exp.config``.
  """
  validate(c)
  algorithm = make_algorithm(c, exp.model, np.asarray(exp.train.counts))
  return planning.fit_memory(exp._replace(config=c, algorithm=algorithm, notes=()))


def make_sampler(exp: Experiment) -> Callable:
  """``sample(root, round, server_params) -> Cohort`` of the config's selection rule
  (power-of-d reads the candidates' losses at ``server_params``; the others ignore them, and
  take ``None``)."""
  c = exp.config
  example_loss = models.per_example_cross_entropy(exp.model)
  spec = cohort_spec(c)

  def sample(root, r, params):
    ids = None
    if c.client_selection == 'power_of_d':   # the candidates' losses at the current model
      ids = selection.power_of_d(
          root, r, params, exp.train, per_example_loss=example_loss, d=c.candidates,
          cohort_size=c.clients_per_round, mode=c.power_loss, batch_size=c.batch_size)
    return sampling.sample_cohort(root, r, exp.train.counts, spec, client_ids=ids)
  return sample


# Float fields that runs of one program may differ in (besides the seed), their values the
# program's data (``core.runs``): the learning rates, each tested against separate runs. Other
# float hyper-parameters join this list once a test shows their batch equal to separate runs.
BATCHED_FIELDS = ('client_lr', 'server_lr')


def batch_key(c: Config) -> Config:
  """What runs of one program share: the config but its seed and ``BATCHED_FIELDS``."""
  return dataclasses.replace(c, seed=0, **{f: 0. for f in BATCHED_FIELDS})


def make_runs(exp: Experiment, configs, chunk_size: int) -> tuple[runs_lib.RunsProgram, dict]:
  """The program of ``configs``' runs (one ``batch_key``) on ``exp``'s data and model, and its
  ``hparams``: the ``BATCHED_FIELDS`` whose values differ between the runs, as ``[R]`` arrays.
  One run is not vmapped (``core.runs``); several need ``planning.batchable(exp)``."""
  if any(batch_key(x) != batch_key(configs[0]) for x in configs):
    raise ValueError('make_runs: the configs may differ only in the seed and ' +
                     ', '.join(BATCHED_FIELDS))
  varying = [f for f in BATCHED_FIELDS if len({getattr(x, f) for x in configs}) > 1]
  hparams = {f: jnp.asarray([getattr(x, f) for x in configs], jnp.float32) for f in varying}
  base, counts = configs[0], np.asarray(exp.train.counts)

  def algorithm(hp):   # hp: traced values of the varying fields, inside the vmapped program
    return make_algorithm(dataclasses.replace(base, **hp), exp.model, counts)

  program = runs_lib.build_runs(
      algorithm, lambda root: exp.model.init(keys.init_key(root)), make_sampler(exp),
      chunk_size=chunk_size, batched=len(configs) > 1,
      shared_key=len({x.seed for x in configs}) == 1, mesh=exp.mesh,
      fuse_dots=planning.fuse_dots(exp, len(configs)))
  return program, hparams


def cohort_spec(c: Config) -> sampling.CohortSpec:
  """The config's ``CohortSpec`` (power-of-d hands the sampler its clients)."""
  cyclic = c.client_selection == 'cyclic'
  return sampling.CohortSpec(c.clients_per_round, tuple(c.budget_range), c.batch_size,
                             c.sample_with_replacement, c.aggregation_weights,
                             'cyclic' if cyclic else 'uniform', c.cyclic_groups if cyclic else 1)

