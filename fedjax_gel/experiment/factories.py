"""Factories: the data, the model, the algorithm and the sampler a ``Config`` names.

``prepare(config)`` builds them all and checks them (with the memory planner) before anything
is written; ``with_config`` swaps the algorithm or seed of a prepared experiment.
"""
from __future__ import annotations

import dataclasses
import json
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fedjax_gel import algorithms, models, optim, privacy
from fedjax_gel.core import evaluation, federated_data, sampling
from fedjax_gel.core.backend import Backend, xla
from fedjax_gel.core import keys, model_state, paths, runs as runs_lib, selection
from fedjax_gel import spec as spec_lib
from fedjax_gel.data import registry as data_registry
from fedjax_gel.data.errors import DataError
from fedjax_gel.experiment import config as config_lib, dp
from fedjax_gel.experiment import planning
from fedjax_gel.experiment.config import Config, ConfigError, batch_key, batched_flags
from fedjax_gel.experiment.messages import first_line, raised_at
from fedjax_gel.experiment.validation import validate


def server_optimizer(c: Config, lr=None) -> optax.GradientTransformation:
  """The server optimiser applied to ``Delta`` (``lr``: the server learning rate, when it is
  traced; else the config's).

  ``fedadam``/``fedyogi``/``fedadagrad`` are Reddi et al. 2021's forms (``fedjax_gel.optim``,
  no bias correction); ``adam``/``yogi``/``adagrad`` are optax's own. An algorithm whose spec
  fixes its server optimiser (FedOpt) gets that one whatever ``--server_optimizer`` says.
  """
  s = c.server
  lr = s.lr if lr is None else lr
  b1, b2, tau = s.beta1, s.beta2, s.tau
  return {
      'sgd': lambda: optax.sgd(lr),
      'momentum': lambda: optax.sgd(lr, momentum=s.momentum),
      'fedadam': lambda: optim.fedadam(lr, b1, b2, tau),
      'fedyogi': lambda: optim.fedyogi(lr, b1, b2, tau),
      'fedadagrad': lambda: optim.fedadagrad(lr, b1, tau),
      'adam': lambda: optax.adam(lr, b1=b1, b2=b2, eps=tau),
      'yogi': lambda: optax.yogi(lr, b1=b1, b2=b2, eps=tau),
      'adagrad': lambda: optax.adagrad(lr, eps=tau),
  }[c.spec.server_optimizer or s.optimizer]()


def load_split(c: Config) -> federated_data.FederatedSplit:
  """Loads the train/test pools the config names (host side): its dataset's loader
  (``DatasetSpec.load``), what it returns checked where the spec asks for it
  (``registered_split``). Raises DataError on bad files."""
  d = c.data
  if d.spec.checked:
    return registered_split(d)
  return d.spec.load(d, d.hparams)


def registered_split(d: config_lib.DataConfig) -> federated_data.FederatedSplit:
  """A registered dataset's loader (``DatasetSpec.load``), its result checked: a FederatedSplit of
  two well-formed pools (``federated_data.check_pool``; text, which ``make_model`` refuses with
  a hint, included) with the same features, ``x`` and ``y`` among them (``check_examples``
  then requires examples on both sides). The test pool may hold other clients (held-out
  clients, as ``--leaf_split=user``)."""
  where = f'--dataset={d.dataset}'
  try:
    split = d.spec.load(d, d.hparams)
  except (ConfigError, DataError, OSError):   # already one line
    raise
  except Exception as e:  # pylint: disable=broad-except
    raise DataError(f'{where}: its loader failed {raised_at(e)}') from None
  if not isinstance(split, federated_data.FederatedSplit):
    raise ConfigError(f'{where}: its loader returned a {type(split).__name__}, not a '
                      'FederatedSplit(train, test)')
  pools = {'train': split.train, 'test': split.test}
  for part, pool in pools.items():
    if not isinstance(pool, federated_data.FederatedData) or not {'x', 'y'} <= set(pool.examples):
      raise ConfigError(f"{where}: the loader's {part} pool must be a FederatedData with "
                        "features 'x' and 'y'")
    try:
      federated_data.check_pool(pool, f"{where}: the loader's {part} pool", text=True)
    except ValueError as e:
      raise ConfigError(str(e)) from None
  train, test = (split.train.examples, split.test.examples)
  if {k: np.shape(v)[1:] for k, v in train.items()} != {k: np.shape(v)[1:] for k, v in test.items()}:
    raise ConfigError(f"{where}: the loader's train and test pools hold features of different "
                      'names or shapes')
  for part, examples in (('train', train), ('test', test)):
    for name, v in examples.items():
      if np.issubdtype(np.asarray(v).dtype, np.inexact) and not np.isfinite(v).all():
        raise DataError(f"{where}: the loader's {part} pool holds a feature {name!r} that is not "
                        'finite (NaN or infinity)')
  return split


def check_examples(c: Config, split: federated_data.FederatedSplit):
  """Both pools hold examples, else a DataError naming the data: the rounds would gather from
  an empty pool, and an empty test pool would report an accuracy of 0 (LEAF files whose users
  have no samples on one side, a split that leaves no sample for testing)."""
  for part, pool in (('train', split.train), ('test', split.test)):
    if not int(np.asarray(pool.counts).sum()):
      raise DataError(f'{c.data.flag}: its {part} pool holds no examples '
                      f'({pool.num_clients} clients, none with an example there); nothing to '
                      f'{"train" if part == "train" else "evaluate"} on')


def task_classes(dataset: str) -> int | None:
  """The classes of ``dataset`` where its task fixes them (``DatasetSpec.classes``: LEAF's
  FEMNIST, Sent140, CelebA and the TFDS image sets), else None (the data's largest label
  decides)."""
  return data_registry.get(dataset).classes


# Classes (max label + 1) beyond this many and this many times the distinct labels are taken
# for a stray label (one label 1,000,000 among 10 classes built a model of 1,000,001 outputs).
SPARSE_CLASSES, SPARSE_RATIO = 100_000, 1_000


def check_classes(name: str, where: str, y: np.ndarray, classes: int):
  """A classifier's labels ``y`` (classes ``max label + 1``) name at least two classes and not
  far more classes than labels they hold (``SPARSE_*``), else a ConfigError: one class scores
  accuracy 1 by construction."""
  if classes == 1:
    raise ConfigError(f'--model={name}: {where} holds only label 0, one class; a classifier '
                      'needs at least two (its accuracy would be 1 by construction)')
  distinct = len(np.unique(y))
  if classes > SPARSE_CLASSES and classes > SPARSE_RATIO * distinct:
    raise ConfigError(f'--model={name}: {where} holds {distinct} distinct labels up to '
                      f'{classes - 1}, a model of {classes} classes; number the labels '
                      f'0..{distinct - 1}')


def make_model(c: Config, split: federated_data.FederatedSplit) -> models.Model:
  """``--model`` for the data's input shape and outputs: the task's classes where they are fixed
  (``task_classes``: FEMNIST's 62, ...; a label beyond them is refused), else ``max label + 1``
  for integer labels, the size of one target for float targets (regression); token models get
  ``vocab_size = max id + 1`` over train and test. Its task's main metric is what the
  experiment tracks (``models.tasks``)."""
  name, where = c.model.name, c.data.data_path or c.data.dataset
  x = np.asarray(split.train.examples['x'])
  if not np.issubdtype(x.dtype, np.number):
    raise ConfigError(f'--model={name} needs numeric features; this dataset holds '
                      f'{x.dtype.kind == "U" and "strings" or x.dtype} (text: use '
                      '--dataset=shakespeare or --dataset=sent140)')
  tokens = np.issubdtype(x.dtype, np.integer)
  if tokens != models.registry.get(name).tokens:
    need = (f'one of {", ".join(models.registry.token_models())}' if tokens else
            'a model of numbers')
    held = f'integer features ({x.dtype}: token ids)' if tokens else 'numeric features'
    also = (' (images of integer pixels: give the loader\'s x as float32, e.g. x / 255)' if tokens
            else '')
    raise ConfigError(f'--model={name}: {where} holds {held}; use {need}{also}')
  y = np.concatenate([np.asarray(split.train.examples['y']), np.asarray(split.test.examples['y'])])
  targets = np.issubdtype(y.dtype, np.floating)
  top = spec_lib.INT32_MAX - 1   # the classes, max label + 1, are an int32 too
  if not targets and (not np.issubdtype(y.dtype, np.integer) or y.min(initial=0) < 0 or
                      y.max(initial=0) > top):
    got = ('string labels' if y.dtype.kind == 'U' else
           f'label {y.max() if y.max(initial=0) > top else y.min()}')
    raise ConfigError(f'--model={name} needs labels 0, 1, ... up to {top} (or float targets); '
                      f'{where} holds {got}')
  if targets and not np.isfinite(y).all():
    raise ConfigError(f'--model={name}: {where} holds targets that are not finite')
  vocab = None
  if tokens:
    vocab = int(max(x.max(initial=0), np.asarray(split.test.examples['x']).max(initial=0))) + 1
  outputs = int(np.prod(y.shape[1:])) if targets else int(y.max(initial=0)) + 1
  fixed = task_classes(c.data.dataset)
  if fixed is not None and not targets:
    if outputs > fixed:
      raise ConfigError(f'--dataset={c.data.dataset} has {fixed} classes, 0..{fixed - 1}; {where} '
                        f'holds label {outputs - 1}')
    outputs = fixed   # not fewer for a sample of the data that lacks the last classes
  elif not targets:
    check_classes(name, where, y, outputs)
  try:
    model = models.get_model(name, x.shape[1:], outputs, vocab_size=vocab,
                             dropout=c.model.dropout, batch_norm=c.model.batch_norm)
  except models.OptionError as e:
    raise ConfigError(str(e)) from None
  except Exception as e:  # pylint: disable=broad-except
    if name in models.BUILTIN_MODELS:   # traced when built: e.g. a CNN given 60 features
      if not isinstance(e, (ValueError, TypeError)):
        raise
      raise ConfigError(f'--model={name} does not take the examples of {where} (shape '
                        f'{x.shape[1:]}): {first_line(e)}') from None
    raise ConfigError(f'--model={name}: building it for inputs {x.shape[1:]} and {outputs} '
                      f'outputs failed {raised_at(e)}') from None
  try:   # before any round (the round refuses it too, when traced)
    model_state.check_budget_unit(model, c.cohort.budget_unit)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  task = model.task
  if task.main not in task.metrics:
    raise ConfigError(f'--model={name}: its task ({task.name}) names {task.main!r} its main '
                      f'metric, which is none of its metrics ({", ".join(task.metrics)})')
  if targets and task is models.CLASSIFICATION:
    raise ConfigError(f'--model={name} is a classifier; {where} holds float targets (a '
                      'regression model declares task=models.REGRESSION)')
  if task is models.CLASSIFICATION and y.ndim != 1:
    raise ConfigError(f'--model={name} is a classifier, which takes one integer label per '
                      f'example; {where} holds labels of shape {y.shape[1:]} per example'
                      + (' (flatten them: y.reshape(-1))' if y.shape[1:] == (1,) else ''))
  if not targets and task is models.REGRESSION:
    raise ConfigError(f'--model={name} is a regression model; {where} holds integer labels, '
                      'not float targets')
  if task.main == 'accuracy' and not 0 < c.run.target <= 1:
    raise ConfigError(f'--target must lie in (0, 1] (got {c.run.target:g}): --model={name} is '
                      'scored by accuracy')
  if task is models.REGRESSION and c.run.target < 0:
    raise ConfigError(f'--target must be >= 0 (got {c.run.target:g}): --model={name} is scored '
                      'by its mean squared error, which is never negative')
  return model


def make_algorithm(c: Config, model: models.Model, counts, traced: dict | None = None
                   ) -> algorithms.FederatedAlgorithm:
  """The algorithm ``c`` names, built by its spec (``fedjax_gel.algorithms.registry``) from its
  hyper-parameters and the experiment's ``Setting``. ``counts``: the training clients' example
  counts (the population of the stateful algorithms). ``traced``: values of ``batched_flags``
  that replace the config's (inside a program of several runs, ``make_runs``). A problem the
  builder finds (e.g. more clusters than clients) is a ConfigError."""
  traced = traced or {}
  a = c.algorithm
  own = {f.name for f in dataclasses.fields(a.hparams)}
  hparams = dataclasses.replace(a.hparams, **{k: v for k, v in traced.items() if k in own})
  setting = spec_lib.Setting(
      model, models.task_loss(model), traced.get('client_lr', a.client_lr),
      traced.get('client_momentum', a.client_momentum),
      server_optimizer(c, traced.get('server_lr')), np.asarray(counts),
      c.cohort.aggregation_weights == 'uniform')
  try:
    algorithm = c.spec.build(hparams, setting)._replace(name=c.run_name)
    private = dp.settings(c)
    if private is not None:   # clipped inside, the model's state wrapped around it
      algorithm = privacy.private(algorithm, private)
    algorithm = model_state.with_model_state(algorithm, model, c.model.model_state,
                                             num_clients=len(counts))
  except ValueError as e:
    raise ConfigError(str(e)) from None
  return algorithm


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
  # How every program of the experiment is compiled: its XLA options (``planning.quick_compile``);
  # a run's program adds its config's ``--fuse_small_dots`` (``make_runs``).
  backend: Backend = Backend()
  # --budget_draw=per_client: every training client's budget (``load_client_budgets``).
  client_budgets: np.ndarray | None = None
  # ``federated_data.digest`` of the train and test pools as loaded: a run's config.json
  # records it, and a run is not resumed, extended or taken as done on other data.
  data_sha256: str = ''


def prepare(c: Config, grid: bool = False) -> Experiment:
  """Validates the config, loads the data and builds model and algorithm (writes nothing).
  ``grid``: for a learning-rate grid, which runs on one device (the automatic choice)."""
  validate(c)
  split = load_split(c)
  check_examples(c, split)
  check_population(c.cohort, split.train.num_clients)
  model = make_model(c, split)
  algorithm = make_algorithm(c, model, split.train.counts)
  r, k = c.run, c.cohort
  if r.num_devices > jax.device_count():
    raise ConfigError(f'--num_devices={r.num_devices} but only {jax.device_count()} '
                      f'{jax.default_backend()} devices are present')
  try:   # a model built for other inputs (a CNN on 60 features) fails here, not mid-run
    params = jax.eval_shape(model.init, jax.random.key(0))
  except (ValueError, TypeError) as e:
    raise ConfigError(f'--model={c.model.name} does not take the examples of '
                      f'{c.data.data_path or c.data.dataset} (shape '
                      f'{np.shape(split.train.examples["x"])[1:]}): {first_line(e)}') from None
  try:   # in epochs a budget's steps depend on the largest client: known once data is loaded
    spec = k.spec(split.train.counts)
  except ValueError as e:
    raise ConfigError(f'--clients_per_round, --budget_range, --budget_unit and --batch_size: '
                      f'{first_line(e).removeprefix("CohortSpec: ")}') from None
  memory_bytes = planning.memory_limit(r.device_memory_gb)
  mesh, chunk = planning.devices_and_chunk(algorithm, params, split.train, spec.cohort_size,
                                           k.batch_size, spec.equal_budgets,
                                           r.num_devices or (1 if grid else 0),
                                           r.chunk_size, memory_bytes)
  num_devices = 1 if mesh is None else mesh.size
  test_pool = evaluation.make_eval_pool(split.test)
  train_pool = evaluation.make_eval_pool(split.train, max_examples=r.train_eval_examples,
                                         seed=c.data.split_seed)
  replicate = planning.replicate_pool(algorithm, split.train, mesh, memory_bytes)
  plan = planning.memory_plan(c, params, algorithm, split.train, (test_pool, train_pool),
                              num_devices, replicate)
  exp = Experiment(c, model, algorithm, split.train, test_pool, train_pool, chunk, mesh, plan,
                   compiled={}, backend=Backend(compiler_options=xla.compiler_options(
                       planning.quick_compile(k, params, split.train.counts))),
                   client_budgets=load_client_budgets(k, split.train),
                   data_sha256=federated_data.digest(split.train, split.test))
  exp = planning.fit_memory(exp)
  # placed once, not every round; on a mesh the training pool is whole on every device where it
  # fits (the round deals the cohort by budget), else split by client (each device holds its own
  # clients' examples); the evaluation pools stay on this process' first device, where the
  # evaluation runs (callbacks.Evaluate)
  return exp._replace(train=federated_data.to_device(split.train, mesh, replicate))


def load_client_budgets(k: config_lib.CohortConfig, train) -> np.ndarray | None:
  """``--client_budgets``: every training client's budget, ``[num_clients]`` int32 in client
  order (None unless ``--budget_draw=per_client``). The file holds a JSON list in client order
  or an object ``{client name: budget}`` naming every client; each budget an integer within
  ``--budget_range``. Anything else is a ConfigError naming the file."""
  if k.budget_draw != 'per_client':
    return None
  where = f'--client_budgets={k.client_budgets}'

  def unique(pairs):   # a name given twice kept its last budget without a word
    named = {}
    for name, value in pairs:
      if name in named:
        raise ConfigError(f'{where}: client {name!r} is given twice')
      named[name] = value
    return named
  problem = paths.not_regular(k.client_budgets)   # a named pipe was waited on forever
  if problem:
    raise ConfigError(f'{where}: {problem}')
  try:
    with paths.open_regular(k.client_budgets, 'r', encoding='utf-8') as f:
      found = json.load(f, object_pairs_hook=unique)
  except OSError as e:
    raise ConfigError(f'{where}: cannot read it ({e.strerror})') from None
  except ConfigError:
    raise
  except (ValueError, RecursionError) as e:
    raise ConfigError(f'{where}: not valid JSON ({str(e)[:80]})') from None
  names = list(train.client_names)
  if isinstance(found, dict):
    known = set(names)
    missing = [n for n in names if n not in found]
    extra = [n for n in found if n not in known]
    if missing or extra:
      which = (f'no budget for client {missing[0]!r}' if missing else
               f'client {extra[0]!r} is not in the training data')
      raise ConfigError(f'{where}: {which} ({len(missing)} missing, {len(extra)} unknown of '
                        f'{len(names)} clients)')
    found = [found[n] for n in names]
  if not isinstance(found, list) or len(found) != train.num_clients:
    raise ConfigError(f'{where}: expected a list of {train.num_clients} budgets (one per '
                      'training client, in order) or an object {client name: budget}')
  a, b = k.budget_range
  for i, v in enumerate(found):
    if isinstance(v, bool) or not isinstance(v, int) or not a <= v <= b:
      raise ConfigError(f'{where}: client {names[i] if names else i}\'s budget {v!r} is not an '
                        f'integer within --budget_range={a},{b}')
  return np.asarray(found, np.int32)


def check_population(k: config_lib.CohortConfig, population: int):
  """The cohort can be drawn from ``population`` clients (else a ConfigError)."""
  poisson = k.client_selection == 'poisson'
  if (poisson or not k.sample_with_replacement) and k.clients_per_round > population:
    raise ConfigError(f'--clients_per_round={k.clients_per_round} exceeds the population of '
                      f'{population} clients ' + ('(Poisson sampling\'s rate C / N would exceed '
                                                   '1)' if poisson else 'without replacement'))
  if k.client_selection == 'power_of_d' and k.candidates > population:
    raise ConfigError(f'--power_d={k.candidates} exceeds the population of {population} clients')
  if k.client_selection == 'cyclic':
    smallest = population // k.cyclic_groups
    if smallest == 0:
      raise ConfigError(f'--cyclic_groups={k.cyclic_groups} exceeds the population of '
                        f'{population} clients')
    if not k.sample_with_replacement and k.clients_per_round > smallest:
      raise ConfigError(f'--clients_per_round={k.clients_per_round} exceeds the smallest cyclic '
                        f'group ({smallest} clients) without replacement')


def with_config(exp: Experiment, c: Config) -> Experiment:
  """The same data, model, chunks and devices for another algorithm or seed of ``c``.

  Only ``algorithm`` and ``seed`` (and what they alone read) may differ from ``exp.config``.
  """
  validate(c)
  algorithm = make_algorithm(c, exp.model, np.asarray(exp.train.counts))
  return planning.fit_memory(exp._replace(config=c, algorithm=algorithm, notes=()))


def make_sampler(exp: Experiment) -> Callable:
  """``sample(root, round, reads) -> Cohort`` of the config's selection rule: power-of-d
  reads the candidates' losses, ``reads = (server params, training pool)`` (the pool an
  argument, not a constant of the program: over several processes it spans devices no process
  holds all of); the others ignore it, and take ``None``."""
  k = exp.config.cohort
  example_loss = models.per_example_loss(exp.model)
  spec = k.spec(exp.train.counts)
  budgets = None if exp.client_budgets is None else jnp.asarray(exp.client_budgets)

  def sample(root, r, reads):
    ids = None
    if k.client_selection == 'power_of_d':   # the candidates' losses at the current model
      params, train = reads
      ids = selection.power_of_d(
          root, r, params, train, per_example_loss=example_loss, d=k.candidates,
          cohort_size=k.clients_per_round, mode=k.power_loss, batch_size=k.batch_size)
    return sampling.sample_cohort(root, r, exp.train.counts, spec, client_ids=ids,
                                  client_budgets=budgets)
  return sample


def make_runs(exp: Experiment, configs, chunk_size: int) -> tuple[runs_lib.RunsProgram, dict]:
  """The program of ``configs``' runs (one ``batch_key``) on ``exp``'s data and model, and its
  ``hparams``: the ``batched_flags`` whose values differ between the runs, as ``[R]`` arrays.
  One run is not vmapped (``core.runs``); several need ``planning.batchable(exp)``."""
  fields = batched_flags(configs[0])
  if any(batch_key(x) != batch_key(configs[0]) for x in configs):
    raise ValueError('make_runs: the configs may differ only in the seed and ' +
                     ', '.join(fields))
  values = {f: [x.flags()[f] for x in configs] for f in fields}
  hparams = {f: jnp.asarray(v, jnp.float32) for f, v in values.items() if len(set(v)) > 1}
  base, counts = configs[0], np.asarray(exp.train.counts)

  def algorithm(traced):   # the varying fields' values, inside the vmapped program
    return make_algorithm(base, exp.model, counts, traced)

  program = runs_lib.build_runs(
      algorithm, lambda root: exp.model.init(keys.init_key(root)), make_sampler(exp),
      chunk_size=chunk_size, batched=len(configs) > 1,
      shared_key=len({x.run.seed for x in configs}) == 1, mesh=exp.mesh,
      backend=exp.backend._replace(   # on CPU only (``RunConfig.fuse_small_dots``)
          fuse_small_dots=base.run.fuse_small_dots and jax.default_backend() == 'cpu'),
      client_distance=base.run.client_distance)
  return program, hparams
