"""The training loop: data, model and algorithm from a Config; metrics, summary and progress.

Outputs in ``workdir``: ``config.json``; ``metrics.jsonl``, one JSON object per evaluation
(``round, algorithm, seed, test_accuracy, test_loss, train_loss, grad_computations, examples,
elapsed_s``); ``summary.json`` (``final_accuracy, best_accuracy, rounds_to_target``, ...).
Everything that can be wrong with the input is checked before anything is written.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import signal
import time
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import serialization

from fedjax_gel import algorithms, models, optim
from fedjax_gel.core import (devices, evaluation, federated_data, keys, memory,
                             round as round_lib, sampling, selection, store)
from fedjax_gel.experiment import checkpoint
from fedjax_gel.experiment import config as config_lib
from fedjax_gel.experiment import report
from fedjax_gel.experiment.config import Config, ConfigError, validate
from fedjax_gel.experiment.progress import Progress


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
  if c.dataset == 'leaf_synthetic':
    from fedjax_gel.data import leaf_synthetic
    return leaf_synthetic.load(train_fraction=c.train_fraction, split_seed=c.split_seed)
  if c.dataset == 'fedprox_synthetic':
    from fedjax_gel.data import fedprox_synthetic
    return fedprox_synthetic.load(c.fedprox_alpha, c.fedprox_beta, c.fedprox_iid,
                                  train_fraction=c.train_fraction, split_seed=c.split_seed)
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


class MemoryPlan(NamedTuple):
  """What the memory guard knows before compiling (``fit_memory``)."""
  client_bytes: int   # one client's working set in a chunk (``core.memory.client_bytes``)
  free_bytes: int     # per device, after the data and the server state; the store not included
  devices: int        # devices a chunk is spread over with their own memory (1: shared, CPU)


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
  memory: MemoryPlan | None = None
  notes: tuple = ()     # what was changed to make the run fit (printed by launch/run.py)


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
  mesh = devices.client_mesh(c.num_devices or auto_num_devices(
      c.clients_per_round, store_bytes(algorithm, params), memory_limit(), jax.device_count(),
      shared_memory=jax.default_backend() == 'cpu'))
  num_devices = 1 if mesh is None else mesh.size
  chunk = c.chunk_size or round_lib.default_chunk_size(
      c.clients_per_round, params, example_bytes(split.train), c.batch_size, num_devices,
      budget_range=tuple(c.budget_range))
  test_pool, train_pool = (evaluation.make_eval_pool(split.test),
                           evaluation.make_eval_pool(split.train))
  plan = memory_plan(c, params, algorithm, train, (test_pool, train_pool), num_devices)
  exp = Experiment(c, model, algorithm, train, test_pool, train_pool,
                   min(chunk, c.clients_per_round), mesh, plan)
  exp = fit_memory(exp)
  return exp._replace(train=devices.replicate(train, mesh))   # placed once, not every round


def with_config(exp: Experiment, c: Config) -> Experiment:
  """The same data, model, chunks and devices for another algorithm or seed of ``c``.

  Only ``algorithm`` and ``seed`` (and what they alone read) may differ from ``exp.config``.
  """
  validate(c)
  algorithm = make_algorithm(c, exp.model, np.asarray(exp.train.counts))
  return fit_memory(exp._replace(config=c, algorithm=algorithm, notes=()))


def example_bytes(data: federated_data.FederatedData) -> int:
  return sum(np.asarray(v[:1]).nbytes for v in data.examples.values())


def memory_limit() -> int:
  """Bytes one device may use: the accelerator's limit, or the host's physical memory."""
  stats = jax.devices()[0].memory_stats() or {}
  if 'bytes_limit' in stats:
    return int(stats['bytes_limit'])
  return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')


# A chunk's working set may take this much of the memory left after the data, the server state
# and the per-client store (the rest: XLA's own buffers and the estimate's error).
CHUNK_MEMORY_FRACTION = 0.75


def memory_plan(c: Config, params, algorithm, train, pools, num_devices: int) -> MemoryPlan:
  """The memory of one client of a chunk and what is free for chunks on each device
  (``params``: the model's parameters or their shapes).

  Resident on each device: the training pool and the evaluation pools (on CPU the devices are
  one host's cores, each with its copy) and about four copies of the server model (the state,
  its optimiser and the donated copy).
  """
  spec = {k: jax.ShapeDtypeStruct(np.shape(v)[1:], np.asarray(v[:1]).dtype)
          for k, v in train.examples.items()}
  per_client = memory.client_bytes(algorithm, params, spec, c.batch_size, c.budget_range[1])
  shared = jax.default_backend() == 'cpu'
  data = round_lib.tree_bytes((train.examples, pools)) * (num_devices if shared else 1)
  free = memory_limit() - data - 4 * round_lib.tree_bytes(params)
  return MemoryPlan(per_client, free, 1 if shared else num_devices)


def chunk_capacity(plan: MemoryPlan, store_need: int) -> int:
  """Clients one chunk can hold, over all its devices."""
  room = int(CHUNK_MEMORY_FRACTION * (plan.free_bytes - store_need))
  return max(0, room // plan.client_bytes) * plan.devices


def fit_memory(exp: Experiment) -> Experiment:
  """The memory guard, before anything compiles: a per-client store that cannot fit
  fails (``check_store_memory``); a chunk larger than the memory left holds is shrunk to what
  fits, with a note; a single client that cannot fit fails with one line saying what it needs."""
  c = exp.config
  params = jax.eval_shape(exp.model.init, jax.random.key(0))
  num_devices = 1 if exp.mesh is None else exp.mesh.size
  store_need = check_store_memory(c, exp.algorithm, params, num_devices)
  fits = chunk_capacity(exp.memory, store_need)
  gib = lambda b: f'{b / 2**30:.2f} GiB'
  if exp.memory.free_bytes - store_need <= 0:
    raise ConfigError(
        f'--dataset={c.dataset}: the data, the model and the client state take more than the '
        f'{gib(memory_limit())} of device memory; use a smaller dataset or model')
  if fits < 1:
    raise ConfigError(
        f'--budget_range={c.budget_range[0]},{c.budget_range[1]} with --batch_size='
        f'{c.batch_size}: one client needs about {gib(exp.memory.client_bytes)} in a round, but '
        f'only {gib(max(0, exp.memory.free_bytes - store_need))} of device memory is left after '
        'the data and model; lower the budgets or the batch size')
  if exp.chunk_size <= fits:
    return exp
  asked = f'--chunk_size={c.chunk_size}' if c.chunk_size else f'the automatic {exp.chunk_size}'
  note = (f'{asked} clients per chunk would need about '
          f'{exp.chunk_size * exp.memory.client_bytes / 2**30:.1f} GiB; running {fits} per chunk '
          'to fit the device memory')
  return exp._replace(chunk_size=fits, notes=exp.notes + (note,))


def store_bytes(algorithm, params, num_devices: int = 1) -> int:
  """Bytes of the per-client store on each device (0 for algorithms without client state)."""
  if algorithm.store_row is None:
    return 0
  clients = jax.eval_shape(algorithm.server_init, params).clients
  rows = -(-store.num_rows(clients) // num_devices)
  return rows * store.row_bytes(clients)


def auto_num_devices(cohort_size: int, store_size: int, memory: int, available: int,
                     shared_memory: bool = False) -> int:
  """``--num_devices=0``: every device for large cohorts (``core.devices.auto_num_devices``) or
  for a per-client store that would take more than half of one device's memory, else one.
  ``shared_memory``: the devices share one memory (CPU cores), so spreading saves none."""
  if store_size > memory // 2 and not shared_memory:
    return available
  return devices.auto_num_devices(cohort_size, available)


def check_store_memory(c: Config, algorithm, params, num_devices: int) -> int:
  """Bytes of the per-client store on each device, with the round's three cohort-sized copies
  of rows; fails early when they cannot fit in half of each device's memory.

  CPU devices are cores of one host: there the whole store must fit in the host's memory.
  """
  if algorithm.store_row is None:
    return 0
  if jax.default_backend() == 'cpu':
    num_devices = 1
  clients = jax.eval_shape(algorithm.server_init, params).clients
  row = store.row_bytes(clients)
  # The store's share of each device, and the cohort's gathered, new and averaged rows.
  need = -(-store.num_rows(clients) // num_devices) * row + 3 * c.clients_per_round * row
  have = memory_limit()
  if need > have // 2:
    raise ConfigError(
        f'--algorithm={c.algorithm} keeps {row} bytes of state for each of '
        f'{store.num_rows(clients)} clients: {need / 2**30:.1f} GiB per device on '
        f'{num_devices} device(s), more than half of the {have / 2**30:.1f} GiB available; '
        'use fewer clients or a smaller model, or split it over more accelerators '
        '(--num_devices)')
  return need


def check_workdir(workdir: str, overwrite: bool, *outputs: str):
  """Refuses to clobber an earlier run's outputs unless asked to, or to write into a file."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ConfigError(f'--workdir={workdir} exists and is not a directory')
  for name in outputs or ('metrics.jsonl', 'summary.json'):
    if os.path.exists(os.path.join(workdir, name)) and not overwrite:
      raise ConfigError(f'--workdir={workdir} already holds a run ({name}); choose another '
                        'directory or pass --overwrite')


def run_status(workdir: str, c: Config, overwrite: bool, extra: dict | None = None) -> str:
  """What ``workdir`` holds for the run ``c``: ``'new'`` (nothing, or ``overwrite``),
  ``'done'`` (this run, finished: ``summary.json``), ``'resume'`` (this run, unfinished: it
  continues from its last checkpoint, or from the start without one) or ``'extend'`` (this run
  with fewer ``num_rounds``: it continues from its final state, ``extend``). A run of another
  configuration there (``c`` and the ``extra`` fields of its ``config.json``) is a ConfigError
  naming the first differing flag."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ConfigError(f'--workdir={workdir} exists and is not a directory')
  saved = os.path.join(workdir, 'config.json')
  if overwrite or not os.path.exists(saved):
    check_workdir(workdir, overwrite)
    return 'new'
  try:
    with open(saved) as f:
      before = json.load(f)
  except (OSError, ValueError):
    raise ConfigError(f'{saved} is unreadable; choose another --workdir or pass --overwrite'
                      ) from None
  now = json.loads(json.dumps({**c.to_json(), **(extra or {})}))
  ignore = ('checkpoint_every',)
  differ = [k for k in {**now, **before} if k not in ignore and before.get(k) != now.get(k)]
  if (differ == ['num_rounds'] and extra is None and isinstance(before['num_rounds'], int) and
      now['num_rounds'] > before['num_rounds']):
    return check_extend(workdir, before['num_rounds'])
  if differ:
    k = differ[0]
    raise ConfigError(f'--workdir={workdir} already holds a run of another configuration '
                      f'(--{k}={before.get(k)} there, {now.get(k)} now); choose another '
                      'directory or pass --overwrite')
  if os.path.exists(os.path.join(workdir, 'summary.json')):
    return 'done'
  return 'resume'   # its checkpoints are read by check_resume


def check_resume(exp: Experiment, workdir: str):
  """The checkpoints an unfinished run left in ``workdir`` hold states of ``exp``'s shapes: read
  before anything is written, so that a checkpoint of another model or algorithm is one line
  (``checkpoint.CheckpointError``) with nothing touched."""
  target = jax.eval_shape(
      lambda: exp.algorithm.server_init(exp.model.init(keys.init_key(keys.root_key(0)))))
  checkpoint.check(workdir, target, ('metrics_bytes', 'totals', 'distance'))


def check_extend(workdir: str, rounds: int) -> str:
  """``'extend'`` when the run in ``workdir`` (of ``rounds`` rounds) can go on: unfinished, or
  finished with its final state kept; else a ConfigError naming ``--num_rounds``."""
  summary = os.path.join(workdir, 'summary.json')
  if not os.path.exists(summary):
    return 'extend'
  try:
    status = read_json(summary).get('status', 'finished')
  except (OSError, ValueError):
    raise ConfigError(f'{summary} is unreadable; choose another --workdir or pass --overwrite'
                      ) from None
  if status != 'finished':
    raise ConfigError(f'--num_rounds: the run in {workdir} diverged and cannot be extended; '
                      'pass --overwrite to start it again')
  if rounds not in checkpoint.rounds(workdir):
    raise ConfigError(f'--num_rounds: the run in {workdir} finished after {rounds} rounds '
                      'without keeping its final state (an earlier version); pass --overwrite '
                      'to start it again')
  return 'extend'


def extend(workdir: str, c: Config):
  """Makes the run in ``workdir`` an unfinished run of ``c.num_rounds`` rounds: its summary goes
  (first, so that a kill leaves an unfinished run) and its config is rewritten; it then resumes
  from its final state like any unfinished run."""
  summary = os.path.join(workdir, 'summary.json')
  if os.path.exists(summary):
    os.remove(summary)
  write_json(os.path.join(workdir, 'config.json'), c.to_json())


def remove_checkpoints(workdir: str, keep: int | None = None):
  """Removes a run's checkpoints but the one of round ``keep`` (a finished run's final state,
  kept so that the run can be extended); also those a kill left behind."""
  for r in checkpoint.rounds(workdir):
    if r != keep:
      os.remove(checkpoint.path(workdir, r))


def make_workdir(workdir: str):
  """Creates the work directory; a path that cannot be one is a ConfigError."""
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise ConfigError(f'--workdir={workdir} cannot be created: {e.strerror}') from None


def finite(obj):
  """Replaces NaN and infinities (a diverged run) by None, so the JSON stays valid."""
  if isinstance(obj, float) and not math.isfinite(obj):
    return None
  if isinstance(obj, dict):
    return {k: finite(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [finite(v) for v in obj]
  return obj


def write_text(path: str, text: str):
  """Writes ``path`` whole or not at all (``checkpoint.write_atomic``)."""
  checkpoint.write_atomic(path, text.encode())


def write_json(path: str, obj):
  write_text(path, json.dumps(finite(obj), indent=2, allow_nan=False) + '\n')


def read_json(path: str) -> dict:
  with open(path) as f:
    return json.load(f)


def read_metrics(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [json.loads(line) for line in f]


def rounds_to_target(records, target: float) -> Optional[int]:
  """First evaluated round whose test accuracy reaches ``target``, else None."""
  hit = report.first_reaching(records, target)
  return None if hit is None else hit['round']


def make_sampler(exp: Experiment, root) -> Callable:
  """``sample(round, server_state) -> Cohort`` of the config's selection rule (power-of-d reads
  the candidates' losses at ``server_state``'s model; the others ignore it)."""
  c = exp.config
  example_loss = models.per_example_cross_entropy(exp.model)
  spec = cohort_spec(c)

  def sample(r, server_state):
    ids = None
    if c.client_selection == 'power_of_d':   # the candidates' losses at the current model
      ids = selection.power_of_d(
          root, r, exp.algorithm.server_params(server_state), exp.train,
          per_example_loss=example_loss, d=c.candidates, cohort_size=c.clients_per_round,
          mode=c.power_loss, batch_size=c.batch_size)
    return sampling.sample_cohort(root, r, exp.train.counts, spec, client_ids=ids)
  return sample


def cohort_spec(c: Config) -> sampling.CohortSpec:
  """The config's ``CohortSpec`` (power-of-d hands the sampler its clients)."""
  cyclic = c.client_selection == 'cyclic'
  return sampling.CohortSpec(c.clients_per_round, tuple(c.budget_range), c.batch_size,
                             c.sample_with_replacement, c.aggregation_weights,
                             'cyclic' if cyclic else 'uniform', c.cyclic_groups if cyclic else 1)


def json_line(record: dict) -> str:
  """One ``metrics.jsonl`` line (NaN and infinities written as null)."""
  return json.dumps(finite(record), allow_nan=False) + '\n'


def seeds_fit(exp: Experiment, num_seeds: int) -> bool:
  """Whether ``num_seeds`` seeds of ``exp`` run as one vmapped program: on one device, without
  per-client state or power-of-d selection, and with all seeds' chunks within the memory of one
  automatic chunk (``round.default_chunk_size`` of the seeds' cohorts together) and within the
  memory guard's capacity (``chunk_capacity``)."""
  c = exp.config
  if (num_seeds < 2 or exp.mesh is not None or exp.algorithm.store_row is not None or
      c.client_selection == 'power_of_d'):
    return False
  params = jax.eval_shape(exp.model.init, jax.random.key(0))
  chunk = round_lib.chunk_layout(c.clients_per_round, exp.chunk_size)[0]
  fit = round_lib.default_chunk_size(num_seeds * c.clients_per_round, params,
                                     example_bytes(exp.train), c.batch_size)
  return num_seeds * chunk <= min(fit, chunk_capacity(exp.memory, 0))


def train(exp: Experiment, workdir: str,
          on_round: Callable[[int, sampling.Cohort, round_lib.RoundMetrics], None] | None = None,
          progress: Progress | None = None, compiled: dict | None = None,
          resume: bool = False) -> dict:
  """Runs ``num_rounds`` rounds, evaluating every ``eval_every`` and after the last, with a
  checkpoint every ``checkpoint_every`` rounds and the final server model in ``model.msgpack``.

  ``compiled``: a dict shared by runs of one ``Experiment``'s data; runs whose configs differ only
  in the seed reuse the compiled round (the seed is an argument of the round, not a constant).
  ``resume``: continue from the work directory's last checkpoint (``run_status`` said
  ``'resume'``). Returns the summary (also written to ``summary.json``).
  """
  return train_runs(exp, [exp.config], [workdir], on_round, progress, compiled, resume)[0]


def train_seeds(exp: Experiment, configs, workdirs, progress: Progress | None = None,
                compiled: dict | None = None, resume: bool = False) -> list[dict]:
  """``train`` for configs that differ only in the seed, as one program vmapped over the seeds
  (each seed its own model, cohorts, budgets and shuffles: the same as its own run); one
  summary per seed. Use where ``seeds_fit``."""
  base = dataclasses.replace(configs[0], seed=0)
  if any(dataclasses.replace(x, seed=0) != base for x in configs):
    raise ValueError('train_seeds: the configs may differ only in the seed')
  return train_runs(exp, list(configs), list(workdirs), None, progress, compiled, resume)


class Interrupted(KeyboardInterrupt):
  """Ctrl-C stopped the loop after a whole round, whose checkpoint was written (the same run
  resumes from it)."""

  def __init__(self, round_idx: int):
    super().__init__(f'interrupted after round {round_idx}')
    self.round = round_idx


@contextlib.contextmanager
def deferred_interrupt():
  """Within it, a first Ctrl-C (SIGINT) only sets the returned flag, so that the loop can stop
  between rounds; a second one interrupts at once. Outside the main thread: no-op."""
  flag = []

  def handler(signum, frame):
    del signum, frame
    if flag:
      raise KeyboardInterrupt
    flag.append(True)

  try:
    previous = signal.signal(signal.SIGINT, handler)
  except ValueError:   # not the main thread: signals stay as they are
    yield flag
    return
  try:
    yield flag
  finally:
    signal.signal(signal.SIGINT, previous)


def run_rounds(c: Config, start: int, progress: Progress, step, record, save,
               stopped=lambda: False) -> float:
  """The loop of a run (or of a grid's cells): ``step(r)`` trains round ``r`` for rounds
  ``start .. num_rounds - 1``; ``record(done)`` evaluates at round 0 (unless resuming), every
  ``eval_every`` rounds and after the last; ``save(done)`` checkpoints every
  ``checkpoint_every`` rounds but the last; ``stopped()`` ends it early (every run diverged).
  Ctrl-C ends it after the round under way with a checkpoint of it (even with
  ``checkpoint_every = 0``) and raises ``Interrupted``. Returns the seconds the rounds took."""
  if not start:
    record(0)
  progress.begin(start)
  t = time.perf_counter()
  with deferred_interrupt() as interrupted:
    for r in range(start, c.num_rounds):
      step(r)
      done = r + 1
      if done % c.eval_every == 0 or done == c.num_rounds:
        record(done)
      else:
        progress.update(done)
      checkpoint_due = c.checkpoint_every and done % c.checkpoint_every == 0
      if (checkpoint_due or interrupted) and done < c.num_rounds:
        save(done)
      if interrupted and done < c.num_rounds:
        progress.close()
        raise Interrupted(done)
      if stopped():
        break
  progress.close()
  return time.perf_counter() - t


def resume_round(workdirs) -> int:
  """The last round every one of ``workdirs`` has a checkpoint of (0: none)."""
  common = set.intersection(*(set(checkpoint.rounds(w)) for w in workdirs))
  return max(common, default=0)


def train_runs(exp, configs, workdirs, on_round=None, progress=None, compiled=None,
               resume: bool = False):
  """One run (``len(configs) == 1``) or several seeds vmapped (``train_seeds``). ``resume``:
  continue from the runs' last common checkpoint, if any (``run_status`` checked them)."""
  batched = len(configs) > 1
  c = configs[0]
  start = resume_round(workdirs) if resume else 0
  for x, w in zip(configs, workdirs):
    make_workdir(w)
    if not start:
      remove_checkpoints(w)
      write_json(os.path.join(w, 'config.json'), x.to_json())
      open(os.path.join(w, 'metrics.jsonl'), 'w').close()

  roots = [keys.root_key(x.seed) for x in configs]
  init = lambda root: exp.algorithm.server_init(exp.model.init(keys.init_key(root)))

  def place(state):   # on the mesh once; the per-client store sharded over it
    state = devices.replicate(state, exp.mesh)
    if exp.algorithm.store_row is not None:
      state = state._replace(clients=store.place(state.clients, exp.mesh))
    return state
  compiled = {} if compiled is None else compiled
  evaluate = compiled.setdefault('evaluate', evaluation.build_evaluate(exp.model.apply))
  progress = progress or Progress(c.num_rounds)
  progress.label = f'{c.run_name}, seed {", ".join(str(x.seed) for x in configs)}'
  progress.note(f'{progress.label}: compiling')
  t0 = time.perf_counter()
  if batched:
    root = jnp.stack(roots)
    state = jax.jit(jax.vmap(init))(root)
    # every seed's cohort in one call (the same draws as its own run's sampler)
    cohorts = jax.jit(jax.vmap(lambda key, r: make_sampler(exp, key)(r, None), in_axes=(0, None)))
    sample = lambda r, state: cohorts(root, r)
  else:
    root = roots[0]
    state = place(init(root))
    sample = make_sampler(exp, root)
  runs = [dict(records=[], totals=dict(grad_computations=0, examples=0, bytes_up=0,
                                       bytes_down=0, client_rounds=0), distance=0.,
               diverged=None) for _ in configs]
  if start:   # the checkpointed states, and the metrics as they stood then
    target = init(roots[0])
    loaded = [checkpoint.restore(w, start, target) for w in workdirs]
    if batched:
      state = jax.tree.map(lambda *a: jnp.stack(a), *(st for st, _ in loaded))
    else:
      state = place(loaded[0][0])
    for w, run, (_, meta) in zip(workdirs, runs, loaded):
      run['records'] = read_metrics(w)
      run['totals'], run['distance'] = dict(meta['totals']), meta['distance']
  cohort0 = sample(start, state)
  key = ('round', dataclasses.replace(c, seed=0), len(configs))
  if key not in compiled:
    round_fn = round_lib.build_round(exp.algorithm, chunk_size=exp.chunk_size, mesh=exp.mesh,
                                     donate_state=True)
    if batched:
      round_fn = jax.jit(jax.vmap(round_fn, in_axes=(0, 0, None, 0, None)), donate_argnums=(0,))
    compiled[key] = round_fn.lower(state, cohort0, exp.train, root, jnp.int32(start)).compile()
  round_fn = compiled[key]
  compile_s = time.perf_counter() - t0

  progress.compiled(compile_s, start)
  pending = []
  pick = (lambda tree, i: jax.tree.map(lambda a: a[i], tree)) if batched else (lambda t, i: t)

  def flush():
    """Adds the rounds since the last flush to the totals (a host sync), and marks a run
    diverged at the first round whose server model is not finite."""
    for done, m in pending:
      m = jax.device_get(m)
      for i, run in enumerate(runs):
        mi = pick(m, i)
        if run['diverged']:
          continue
        if not bool(mi.finite):
          run['diverged'] = done
          x = configs[i]
          progress.note(f'{x.run_name} on {x.dataset}, seed {x.seed}: diverged (the server model '
                        f'is not finite after round {done}); stopped, its last good checkpoint '
                        'kept')
          continue
        for total, field in (('grad_computations', 'grad_computations'),
                             ('examples', 'examples'), ('bytes_up', 'uploaded_bytes'),
                             ('bytes_down', 'downloaded_bytes'), ('client_rounds', 'num_clients')):
          run['totals'][total] += int(getattr(mi, field))
    if pending:
      distance = jax.device_get(pending[-1][1].client_distance)
      for i, run in enumerate(runs):
        if not run['diverged']:
          run['distance'] = float(pick(distance, i))
    pending.clear()

  def save(done):
    flush()
    for i, (w, run) in enumerate(zip(workdirs, runs)):
      if run['diverged']:   # its last good checkpoint stays the last one
        continue
      meta = {'metrics_bytes': os.path.getsize(os.path.join(w, 'metrics.jsonl')),
              'totals': run['totals'], 'distance': run['distance']}
      checkpoint.save(w, done, pick(state, i), meta)

  def record(done):   # host sync only when evaluating
    flush()
    for i, (x, w, run) in enumerate(zip(configs, workdirs, runs)):
      if run['diverged']:
        continue
      # each seed's model on its own: the numbers of its separate run, to the bit
      params = pick(exp.algorithm.server_params(state), i)
      test, tr = evaluate(params, exp.test_pool), evaluate(params, exp.train_pool)
      accuracy = float(test['accuracy'])
      rec = {'round': done, 'algorithm': x.run_name, 'seed': x.seed, 'test_accuracy': accuracy,
             'best_test_accuracy': max([accuracy] +
                                       [r['best_test_accuracy'] for r in run['records']]),
             'test_loss': float(test['loss']), 'train_loss': float(tr['loss']), **run['totals'],
             'client_distance': run['distance'],
             'elapsed_s': round(time.perf_counter() - t0, 3)}
      run['records'].append(rec)
      with open(os.path.join(w, 'metrics.jsonl'), 'a') as f:
        f.write(json_line(rec))
    best = max(run['records'][-1]['best_test_accuracy'] for run in runs)
    last = runs[0]['records'][-1]
    status = (f'test acc {last["test_accuracy"]:.4f} (best {last["best_test_accuracy"]:.4f})'
              if not batched else f'{len(runs)} seeds, best test acc {best:.4f}')
    progress.update(done, status, force=True)

  def step(r):
    nonlocal state
    cohort = cohort0 if r == start else sample(r, state)
    state, m = round_fn(state, cohort, exp.train, root, jnp.int32(r))
    pending.append((r + 1, m))
    if on_round is not None:
      on_round(r, cohort, m)

  train_s = run_rounds(c, start, progress, step, record, save,
                       stopped=lambda: all(run['diverged'] for run in runs))
  save(c.num_rounds)   # the final states (not of diverged runs): a later run can extend them

  summaries = []
  for i, (x, w, run) in enumerate(zip(configs, workdirs, runs)):
    records = run['records']
    summary = {
        'algorithm': x.run_name, 'dataset': x.dataset, 'seed': x.seed, 'rounds': x.num_rounds,
        'client_lr': x.client_lr,
        'final_accuracy': records[-1]['test_accuracy'],
        'best_accuracy': max(r['test_accuracy'] for r in records),
        'target_accuracy': x.target_accuracy,
        'rounds_to_target': rounds_to_target(records, x.target_accuracy),
        'status': 'diverged' if run['diverged'] else 'finished',
        'diverged_round': run['diverged'],
        **run['totals'],
        'compile_s': round(compile_s, 3), 'train_s': round(train_s, 3),
        'rounds_per_s': round(x.num_rounds / train_s, 3) if train_s > 0 else None,
        'chunk_size': exp.chunk_size, 'seeds_vmapped': len(configs),
        'client_state_bytes': (0 if exp.algorithm.store_row is None else
                               round_lib.tree_bytes(pick(state.clients, i))),
    }
    finished = not run['diverged']   # a diverged run: no final model, its last good checkpoint
    if finished:
      params = jax.device_get(pick(exp.algorithm.server_params(state), i))
      checkpoint.write_atomic(os.path.join(w, 'model.msgpack'), serialization.to_bytes(params))
    write_json(os.path.join(w, 'summary.json'), summary)   # last: the run is finished
    if finished:   # replaced by model and summary, but for the final state
      remove_checkpoints(w, keep=x.num_rounds)
    summaries.append(summary)
  return summaries
