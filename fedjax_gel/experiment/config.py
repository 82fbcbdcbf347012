"""Experiment configuration: a record per component (data, model, cohort, algorithm, server,
run), JSON-serialisable, validated before anything runs (``validation``).

Every field is made with ``fedjax_gel.spec.hparam``: its default, its flag's help and its
check in one place. Each field is one flag of ``launch/run.py`` (the field's name, or the
``flag`` its metadata names: ``--server_lr`` is ``ServerConfig.lr``); the algorithm's own
hyper-parameters are the fields of its spec's record (``fedjax_gel.algorithms.registry``), held in
``AlgorithmConfig.hparams``, and the dataset's own settings those of its spec's record
(``fedjax_gel.data.registry``), held in ``DataConfig.hparams``.

From Python, ``make(**flags)`` builds a Config from flag names and ``Config.replace(**flags)``
changes some; ``dataclasses.replace`` works section by section.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np

from fedjax_gel.core.keys import SEED_MAX
from fedjax_gel.core.sampling import (BUDGET_DRAWS, BUDGET_UNITS, WEIGHTINGS, CohortSpec,
                                      poisson_slots, reads_sizes)
from fedjax_gel.data import registry as data_registry
from fedjax_gel.spec import (INT32_MAX, AlgorithmSpec, DatasetSpec, NoHparams, at_least,
                             flag_name, hparam, int_range, one_of, positive, within)
from fedjax_gel.spec.dataset import PATHS

DATASETS = tuple(s.name for s in data_registry.BUILTIN)
CLIENT_SELECTIONS = ('uniform', 'cyclic', 'power_of_d', 'poisson')
# Each server optimiser and the server settings it reads (``validation.unread_flags``), in
# --help's order
SERVER_READS = {
    'sgd': (),
    'momentum': ('server_momentum',),
    'fedadam': ('server_beta1', 'server_beta2', 'server_tau'),
    'fedyogi': ('server_beta1', 'server_beta2', 'server_tau'),
    'fedadagrad': ('server_beta1', 'server_tau'),
    'adam': ('server_beta1', 'server_beta2', 'server_tau'),
    'yogi': ('server_beta1', 'server_beta2', 'server_tau'),
    'adagrad': ('server_tau',),
}
SERVER_OPTIMIZERS = tuple(SERVER_READS)
# The (section, field) of the settings that name where a run's inputs are: their contents have
# digests (``workdir.INPUT_FIELDS``), and they are rewritten when a run and its data move
PATH_FIELDS = (*(('data', name) for name in PATHS), ('cohort', 'client_budgets'))


class ConfigError(ValueError):
  """Raised for a user error in the configuration; its message is one line naming the flag."""


# Seeds: jax.random.key keeps a seed's low 32 bits (others alias one of these), NumPy's
# RandomState takes no other (``keys.SEED_MAX``).
seed_range = int_range(0, SEED_MAX, ' (a 32-bit PRNG seed)')


def _known_dataset(name, value):
  return one_of(*data_registry.names())(name, value)


def _known_model(name, value):
  from fedjax_gel.models import MODELS   # pylint: disable=g-import-not-at-top
  return one_of(*sorted(MODELS))(name, value)


def _known_algorithm(name, value):
  from fedjax_gel.algorithms import registry   # pylint: disable=g-import-not-at-top
  return one_of(*registry.names())(name, value)


def default_weighting(client_selection: str) -> str:
  """``--aggregation_weights=default``: ``uniform`` for power-of-d, whose candidates are drawn
  in proportion to their data, so that Cho et al. 2022 average the selected models with equal
  weights (weighting them by data again would count it twice); else ``num_examples``, the GeL
  paper's ``p_i = n_i / n`` (its code's ``samples_seen`` is a flag away)."""
  return 'uniform' if client_selection == 'power_of_d' else 'num_examples'


def _finite_or_none(name, value):
  if value is None:
    return None
  ok = isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value)
  return None if ok else f'--{name}: must be a finite number (got {value!r})'


def _budget_range(name, value):
  if not isinstance(value, (tuple, list)) or len(value) != 2 or not all(
      isinstance(v, int) and not isinstance(v, bool) for v in value):
    return f'--{name}: must be two integers a,b (got {value!r})'
  a, b = value
  if a < 1:
    return f'--{name}: the smallest budget must be at least 1 (got {a},{b})'
  if b > INT32_MAX:
    return f'--{name}: the largest budget must be at most {INT32_MAX} (got {a},{b})'
  return None if a <= b else f'--{name}: a must not exceed b (got {a},{b})'


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Where the clients' data comes from and how it is split: the settings every dataset may read
  (``DatasetSpec.reads``), and the dataset's own (``hparams``: its spec's record; ``None``: the
  spec's defaults).

  A ``config.json`` of earlier versions held one flat ``data`` section of every dataset's
  settings; ``config_json.read`` reads it as these fields, the chosen dataset's own settings
  (its spec's ``hparams`` fields, by name) as ``hparams``, and drops the other datasets' (which
  its runs did not read)."""
  dataset: str = hparam('leaf_synthetic', f'One of {", ".join(DATASETS)}, or a dataset '
                        'registered with fedjax_gel.register_dataset.', _known_dataset)
  data_path: Optional[str] = hparam(
      None, 'LEAF datasets: a LEAF JSON file, a directory of them (merged: FEMNIST), or a '
      'directory with train/ and test/; subset:femnist_niid_05 and '
      'subset:shakespeare_niid_keep100 are real LEAF subsets shipped with fedjax_gel.')
  image_dir: Optional[str] = hparam(
      None, "celeba: the images (LEAF's data/raw/img_align_celeba).")
  data_dir: Optional[str] = hparam(
      None, 'TFDS datasets (mnist, emnist, cifar10, cifar100): the TFDS data directory they '
      'were prepared in (ArrayRecord); nothing is downloaded.')
  train_fraction: float = hparam(0.9, "Per-client train share (LEAF's 0.9).",
                                 within(0, 1, open_low=True, open_high=True))
  split_seed: int = hparam(931231, 'Seed of the per-client train/test split.', seed_range)
  hparams: Any = None

  def __post_init__(self):
    if self.hparams is None and _known_dataset('dataset', self.dataset) is None:
      object.__setattr__(self, 'hparams', self.spec.hparams())

  @property
  def spec(self) -> DatasetSpec:
    return data_registry.get(self.dataset)

  @property
  def flag(self) -> str:
    """The flag that names the data, for messages: ``--data_path=...`` where it is given, else
    ``--dataset=...``."""
    return f'--data_path={self.data_path}' if self.data_path else f'--dataset={self.dataset}'


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  name: str = hparam('logistic', 'Model name (see fedjax_gel.models.MODELS).', _known_model,
                     flag='model')
  dropout: float = hparam(
      0.0, 'Dropout rate of a built-in model that has dropout (all but logistic: on the '
      "classifier's input; the LSTMs also between layers), in the clients' local steps only; "
      '0: none, the published models.', within(0, 1, open_high=True))
  batch_norm: bool = hparam(
      False, "celeba_cnn: LEAF's BatchNorm after every convolution (its statistics need "
      '--model_state).')
  model_state: str = hparam(
      'none', 'What the server does with a model\'s mutable collections (BatchNorm\'s '
      'statistics): average them as FedAvg does the parameters; keep them local, a row per '
      'client (as SiloBN; FedBN keeps BatchNorm\'s scales and biases local too); or frozen at '
      'their initial values; none: the model has none (a model with some is refused).',
      one_of('none', 'average', 'local', 'frozen'))


@dataclasses.dataclass(frozen=True)
class CohortConfig:
  """Which clients train in a round, on what, and how they are weighted."""
  clients_per_round: int = hparam(20, 'Cohort size C (with --client_selection=poisson the '
                                  'expected one: q = C / N).', int_range(1))
  sample_with_replacement: bool = hparam(
      False, 'Sample the cohort with replacement (the GeL code does; its paper selects clients '
      '"uniformly at random", the default).')
  batch_size: int = hparam(5, 'Client minibatch size B.', int_range(1))
  budget_range: tuple = hparam((4, 13), 'a,b: each client\'s local work per round, in '
                               '--budget_unit, drawn by --budget_draw (default: local steps '
                               'tau_i ~ U{a..b}); C b B, a round\'s examples, must fit in '
                               'int32.', _budget_range)
  budget_unit: str = hparam(
      'steps', 'steps: --budget_range counts minibatch steps tau_i; epochs: it counts local '
      'epochs E_i, tau_i = E_i ceil(n_i / B) steps, each epoch a new shuffle of the client\'s '
      'examples whose last minibatch is short (FedAvg\'s E).', one_of(*BUDGET_UNITS))
  budget_draw: str = hparam(
      'uniform', 'uniform: U{a..b} per client and round; proportional: round(b n_i / max_j n_j) '
      'clipped to [a, b] (more data, more work); per_client: fixed per client, read from '
      '--client_budgets.', one_of(*BUDGET_DRAWS))
  client_budgets: Optional[str] = hparam(
      None, '--budget_draw=per_client: a JSON file of every training client\'s budget (in '
      '--budget_unit, within --budget_range): a list in client order, or an object {client '
      'name: budget} (LEAF user names).')
  aggregation_weights: str = hparam(
      'default', 'samples_seen (min(tau_i B, n_i), the GeL code\'s), num_examples (n_i) or '
      'uniform; default: uniform with --client_selection=power_of_d (its candidates are drawn by '
      'data size) or differential privacy (--dp_clip_norm), else num_examples (the GeL paper\'s '
      'p_i = n_i / n). Recorded as the weighting it stands for.',
      one_of('default', *WEIGHTINGS))
  client_selection: str = hparam(
      'uniform', 'uniform; cyclic (clients in --cyclic_groups groups by id mod K; round t '
      'samples group t mod K); power_of_d (the C highest-loss of --power_d data-weighted '
      'candidates); poisson (each client independently with probability q = C / N, so the '
      'cohort\'s size varies; the round has slots for all but a 1e-12 tail of it).',
      one_of(*CLIENT_SELECTIONS))
  cyclic_groups: int = hparam(4, 'cyclic: the number of client groups K.', int_range(1))
  power_d: int = hparam(0, 'power_of_d: candidates d (drawn in proportion to data size); 0 = 2 '
                        'x C.', int_range(0))
  power_loss: str = hparam(
      'full', "power_of_d: the candidates' local loss over all their examples (full) or one "
      'minibatch (minibatch).', one_of('full', 'minibatch'))

  def __post_init__(self):   # the config records the weighting 'default' stands for
    if self.aggregation_weights == 'default':
      object.__setattr__(self, 'aggregation_weights', default_weighting(self.client_selection))

  @property
  def candidates(self) -> int:
    """power-of-d's ``d``."""
    return self.power_d or 2 * self.clients_per_round

  def spec(self, counts):
    """The ``core.sampling.CohortSpec`` of this section for a training population of
    ``counts`` examples per client (power-of-d hands the sampler its clients)."""
    cyclic, poisson = (self.client_selection == s for s in ('cyclic', 'poisson'))
    return CohortSpec(self.slots(len(counts)), tuple(self.budget_range), self.batch_size,
                      self.sample_with_replacement and not poisson, self.aggregation_weights,
                      self.client_selection if cyclic or poisson else 'uniform',
                      self.cyclic_groups if cyclic else 1, self.budget_unit, self.budget_draw,
                      int(np.max(counts, initial=0))
                      if reads_sizes(self.budget_unit, self.budget_draw) else 0,
                      self.rate(len(counts)) if poisson else 0.)

  def rate(self, population: int) -> float:
    """The chance ``q`` that a given client takes part in a round: ``C / N`` (exactly so
    under Poisson sampling; uniform sampling without replacement draws ``C`` of ``N``)."""
    return min(self.clients_per_round / population, 1.)

  def slots(self, population: int) -> int:
    """The round's cohort size: ``C``, or Poisson sampling's slots for a population of
    ``population`` (``core.sampling.poisson_slots``)."""
    if self.client_selection != 'poisson':
      return self.clients_per_round
    return poisson_slots(population, self.rate(population))


@dataclasses.dataclass(frozen=True)
class AlgorithmConfig:
  """The algorithm, its clients' optimiser and its own hyper-parameters (``hparams``: its
  spec's record; ``None``: the spec's defaults)."""
  name: str = hparam('fedavgcm', 'One or more (comma-separated, run one after another with the '
                     'same seed, into WORKDIR/<algorithm>/) of the registered algorithms.',
                     _known_algorithm, flag='algorithm')
  client_lr: float = hparam(0.01, 'Client learning rate.', positive)
  client_momentum: float = hparam(
      0.9, 'Client momentum of the SGDM clients (fedavgcm, GeL, FedProx, FedNova).',
      within(0, 1, open_high=True))
  hparams: Any = None

  def __post_init__(self):
    if self.hparams is None and _known_algorithm('algorithm', self.name) is None:
      object.__setattr__(self, 'hparams', self.spec.hparams())

  @property
  def spec(self) -> AlgorithmSpec:
    from fedjax_gel.algorithms import registry   # pylint: disable=g-import-not-at-top
    return registry.get(self.name)


@dataclasses.dataclass(frozen=True)
class ServerConfig:
  """The server optimiser applied to ``Delta`` (by the algorithms that use one)."""
  optimizer: str = hparam(
      'sgd', f'One of {", ".join(SERVER_OPTIMIZERS)}, applied to Delta: fed* are Reddi et al. '
      "2021's forms, adam/yogi/adagrad optax's.", one_of(*SERVER_OPTIMIZERS),
      flag='server_optimizer')
  lr: float = hparam(1.0, 'Server learning rate.', positive, flag='server_lr')
  momentum: float = hparam(0.0, 'Server momentum (--server_optimizer=momentum).',
                           within(0, 1, open_high=True), flag='server_momentum')
  beta1: float = hparam(0.9, 'FedOpt / Adam-type server beta1.', within(0, 1, open_high=True),
                        flag='server_beta1')
  beta2: float = hparam(0.99, 'FedOpt / Adam-type server beta2.', within(0, 1, open_high=True),
                        flag='server_beta2')
  tau: float = hparam(1e-3, 'FedOpt adaptivity tau (eps of optax forms).', positive,
                      flag='server_tau')


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """How long, with what seed, and what is measured and kept."""
  num_rounds: int = hparam(300, 'Communication rounds.', int_range(1))
  seed: int = hparam(0, 'Seed of cohorts, budgets, initial model and shuffles (0 to 2**32 - 1).',
                     seed_range)
  eval_every: int = hparam(5, 'Evaluate every this many rounds.', int_range(1))
  eval_every_round_from: Optional[float] = hparam(
      None, "Also evaluate every round once a run's best test value of the main metric reaches "
      'this (at or above it for accuracy, at or below for a lower-is-better metric), so that '
      'rounds to any target beyond it are exact to the round, at the cost of an evaluation '
      'every round from there. Unset: every --eval_every rounds only.', _finite_or_none)
  eval_every_round_until: Optional[float] = hparam(
      None, 'With --eval_every_round_from: back to every --eval_every rounds once every run\'s '
      'best reaches this (the highest target of interest). Unset: every round to the end.',
      _finite_or_none)
  train_eval_examples: int = hparam(
      2048, 'The train loss is measured on a fixed sample of this many training examples; 0: all.',
      int_range(0, note=', 0 meaning the whole training pool'))
  tensorboard: bool = hparam(True, 'Also write TensorBoard event files (WORKDIR/tensorboard/).')
  checkpoint_every: int = hparam(
      50, 'Rounds between checkpoints (0: none). Running the same command again in the same '
      '--workdir resumes from the last one; finished runs are kept.',
      int_range(0, note=', 0 meaning no checkpoints'))
  target: float = hparam(
      0.85, "The target of the model's main metric for rounds_to_target: reached at or above "
      'it for accuracy, at or below it for a lower-is-better metric such as mse.')
  fuse_small_dots: bool = hparam(
      False, "On CPU, the local step's small batched matrix products as fused multiply-adds "
      '(fedjax_gel.core.backend.small_dots): rounds of hundreds of clients, or of many vmapped seeds, '
      "up to 2x faster for about a second more compile time; other last bits than XLA's "
      'library products (the default). GPUs and TPUs always run the library products.')
  client_distance: bool = hparam(
      False, "Also measure FedGBO's client drift every round (Mills et al. 2022, Fig. 1): the "
      "mean pairwise cosine distance of the clients' final models, client_distance in the "
      'records (null without) and a column of report.md.')
  chunk_size: int = hparam(0, 'Clients vmapped together; 0 = automatic.',
                           int_range(0, note=', 0 meaning automatic'))
  num_devices: int = hparam(
      0, 'Devices the cohort is split over (mesh axis "clients"); 0 = automatic: all when each '
      "gets enough of a round's work (on CPU a local step's batch x parameters of 200 LEAF "
      'Synthetic clients, so fewer clients of a larger model; on accelerators 200 clients) or '
      "the per-client store would take more than half of one device's memory, else one. On CPU "
      'every core is a device.',
      int_range(0, note=', 0 meaning automatic'))
  device_memory_gb: float = hparam(
      0., "GiB of each device's memory the planner may use; 0 = all it has (an accelerator's "
      "limit; on CPU the host's memory, which each process of several then plans with).",
      at_least(0, ", 0 meaning the device's own"))


@dataclasses.dataclass(frozen=True)
class PrivacyConfig:
  """Client-level differential privacy (``fedjax_gel.privacy``): off unless ``--dp_clip_norm``
  is positive. The privacy unit is the client; the server is trusted (no secure aggregation is
  simulated)."""
  clip_norm: float = hparam(
      0., "L2 norm each client's upload (its model delta) is clipped to, the server then taking "
      'the noised mean of DP-FedAvg (McMahan et al. 2018) with uniform weights over the '
      'expected cohort; 0: no differential privacy. With --dp_target_quantile, the first '
      "round's clip.", at_least(0, ', 0 meaning no differential privacy'), flag='dp_clip_norm')
  noise_multiplier: float = hparam(
      1.0, "The noise's std over the clip norm, in every round (with adaptive clipping, shared "
      "with the clip's count as Andrew et al. 2021's Theorem 1 does).", at_least(0),
      flag='dp_noise_multiplier')
  delta: float = hparam(1e-5, 'The delta of the (epsilon, delta) the records report.',
                        within(0, 1, open_low=True, open_high=True), flag='dp_delta')
  accountant: str = hparam(
      'rdp', "dp-accounting's accountant: rdp (Renyi DP) or pld (privacy loss distributions; "
      'Poisson sampling only).', one_of('rdp', 'pld'), flag='dp_accountant')
  target_quantile: float = hparam(
      0., 'Adaptive clipping (Andrew et al. 2021): the quantile of the update norms the clip '
      'tracks, e.g. 0.5; 0: a fixed clip.', within(0, 1, open_high=True),
      flag='dp_target_quantile')
  clip_lr: float = hparam(0.2, "Adaptive clipping: the clip's geometric learning rate eta_C.",
                          positive, flag='dp_clip_lr')
  clip_count_noise: float = hparam(
      0., "Adaptive clipping: the noise std sigma_b of the count of clients at or below the "
      'clip; 0 = the expected cohort / 20, as the paper advises.', at_least(0),
      flag='dp_clip_count_noise')
  target_epsilon: float = hparam(
      0., 'The privacy budget: the run stops after the last round whose epsilon (at --dp_delta) '
      'stays within it, before --num_rounds if need be; 0: no budget.', at_least(0),
      flag='dp_target_epsilon')

  @property
  def on(self) -> bool:
    return self.clip_norm > 0

  def count_noise(self, cohort: float) -> float:
    """Adaptive clipping's count noise ``sigma_b``: ``--dp_clip_count_noise``, or the expected
    cohort over 20."""
    return self.clip_count_noise or cohort / 20


SECTIONS = {'data': DataConfig, 'model': ModelConfig, 'cohort': CohortConfig,
            'algorithm': AlgorithmConfig, 'server': ServerConfig, 'run': RunConfig,
            'privacy': PrivacyConfig}


@dataclasses.dataclass(frozen=True)
class Config:
  """Every knob of a run, by component: one section per component, each field one flag.

  Defaults follow the GeL paper's Synthetic FedAvgCM setting (Boukhari et al. 2023, "Boosting
  Federated Learning in Resource-Constrained Networks", §4 and App. E). ``make(**flags)``
  builds one from flag names, ``replace(**flags)`` changes some, ``to_json`` is
  ``config.json`` (read back by ``config_json.read``).

  Attributes:
    data: where the clients' data comes from and how it is split, with the dataset's own
      settings (``DataConfig``, ``data.hparams``).
    model: the model and its options (``ModelConfig``).
    cohort: which clients train in a round, on what, and how they are weighted
      (``CohortConfig``).
    algorithm: the algorithm, its clients' optimiser and its own hyper-parameters
      (``AlgorithmConfig``, ``algorithm.hparams``).
    server: the server optimiser applied to ``Delta`` (``ServerConfig``).
    run: how long, with what seed, and what is measured and kept (``RunConfig``).
    privacy: client-level differential privacy, off by default (``PrivacyConfig``).

  Examples:
    >>> from fedjax_gel import experiment
    >>> config = experiment.make(algorithm='gel', guess_tau=20, num_rounds=100)
    >>> config.algorithm.hparams.guess_tau, config.run.seed
    (20, 0)
    >>> config.replace(seed=1).flags()['seed']
    1
  """
  data: DataConfig = DataConfig()
  model: ModelConfig = ModelConfig()
  cohort: CohortConfig = CohortConfig()
  algorithm: AlgorithmConfig = AlgorithmConfig()
  server: ServerConfig = ServerConfig()
  run: RunConfig = RunConfig()
  privacy: PrivacyConfig = PrivacyConfig()

  @property
  def spec(self) -> AlgorithmSpec:
    return self.algorithm.spec

  @property
  def run_name(self) -> str:
    """The algorithm's run name (with its optimiser for the FedGBO family: ``fedgbo_sgdm``)."""
    return self.spec.name_of_run(self.algorithm.hparams)

  def flags(self) -> dict:
    """The config as ``{flag: value}``: every section's fields, the dataset's own settings and
    the algorithm's hyper-parameters."""
    out = {}
    for name in SECTIONS:
      out.update(section_flags(getattr(self, name)))
    for record in (self.data.hparams, self.algorithm.hparams):
      if record is not None:
        out.update(section_flags(record))
    return out

  def replace(self, **flags) -> 'Config':
    """The config with some flags changed. With another ``algorithm`` (``dataset``), the
    hyper-parameters (settings) the two share are kept and the new one's others take their
    defaults; with another ``client_selection``, aggregation weights that were its default
    follow the new one's (``default_weighting``)."""
    now = self.flags()
    k = self.cohort
    if ('aggregation_weights' not in flags and
        k.aggregation_weights == default_weighting(k.client_selection)):
      now['aggregation_weights'] = 'default'   # follows a new --client_selection
    for key, record, own in (('algorithm', self.algorithm, hparam_flags),
                             ('dataset', self.data, dataset_flags)):
      if flags.get(key, now[key]) != now[key]:
        drop = set(section_flags(record.hparams or NoHparams())) - set(own(flags[key]))
        now = {k: v for k, v in now.items() if k not in drop}
    return make(**{**now, **flags})

  def to_json(self) -> dict:
    return dataclasses.asdict(self)


def section_flags(record) -> dict:
  """``{flag: value}`` of a record's ``hparam`` fields."""
  return {flag_name(f): getattr(record, f.name) for f in dataclasses.fields(record)
          if 'help' in f.metadata}


def section_flag_names() -> dict[str, tuple[str, dataclasses.Field]]:
  """``{flag: (section, field)}`` of the sections' fields."""
  return {flag_name(f): (name, f) for name, cls in SECTIONS.items()
          for f in dataclasses.fields(cls) if 'help' in f.metadata}


def flag_fields(c: Config) -> dict[str, dataclasses.Field]:
  """``{flag: field}`` of every flag of ``c`` (``Config.flags``)."""
  out = {k: f for k, (_, f) in section_flag_names().items()}
  for record in (c.data.hparams, c.algorithm.hparams):
    if record is not None:
      out.update({flag_name(f): f for f in dataclasses.fields(record)})
  return out


def hparam_flags(algorithm: str) -> tuple[str, ...]:
  """The flags of ``algorithm``'s own hyper-parameters (none for an unknown one)."""
  from fedjax_gel.algorithms import registry   # pylint: disable=g-import-not-at-top
  if algorithm not in registry.names():
    return ()
  return tuple(flag_name(f) for f in dataclasses.fields(registry.get(algorithm).hparams))


# Float flags of the config's sections that runs of one program may differ in (besides the
# seed), their values the program's data (``core.runs``): the learning rates and the clients'
# momentum; ``batched_flags`` adds the algorithm's float hyper-parameters.
BATCHED_FIELDS = ('client_lr', 'server_lr', 'client_momentum')


def batched_flags(c: Config) -> tuple[str, ...]:
  """The flags whose values runs of one program may differ in: the learning rates and the
  algorithm's float hyper-parameters (but those its builder reads as Python numbers, declared
  ``static`` in their metadata); each is tested against separate runs."""
  return BATCHED_FIELDS + tuple(
      flag_name(f) for f in dataclasses.fields(c.algorithm.hparams)
      if f.type in ('float', float) and not f.metadata.get('static'))


def tunable_flags(c: Config) -> tuple[str, ...]:
  """The flags a ``hparam_grid`` may vary for ``c``: its algorithm's float hyper-parameters
  that runs of one program may differ in, and the clients' momentum where its clients have
  momentum (``AlgorithmSpec.momentum``); a hyper-parameter record may say which of its fields
  its current settings read (``reads(flag)``, e.g. FedGBO's ``gbo_eps`` not with SGDm)."""
  reads = getattr(c.algorithm.hparams, 'reads', lambda flag: True)
  return tuple(f for f in batched_flags(c)
               if f == 'client_momentum' and c.spec.momentum or
               f not in BATCHED_FIELDS and reads(f))


def batch_key(c: Config) -> Config:
  """What runs of one program share: the config but its seed and ``batched_flags``."""
  return c.replace(seed=0, **{f: 0. for f in batched_flags(c)})


def dataset_flags(dataset: str) -> tuple[str, ...]:
  """The flags of ``dataset``'s own settings (none for an unknown one)."""
  if dataset not in data_registry.names():
    return ()
  return tuple(flag_name(f) for f in dataclasses.fields(data_registry.get(dataset).hparams))


def make(**flags) -> Config:
  """Builds a ``Config`` from flag values; the others take their defaults.

  Not validated (``validation.validate`` checks the values; ``run`` and ``expand`` do).

  Args:
    **flags: ``{flag: value}``, as ``launch/run.py``'s flags (``dataset='leaf', data_path=...,
      algorithm='gel', guess_tau=20``): the sections' flags, the algorithm's hyper-parameters
      and the dataset's settings; ``budget_range`` may be ``(a, b)`` or ``'a,b'``.

  Returns:
    The ``Config``.

  Raises:
    ConfigError: a name that is no flag, an unknown algorithm or dataset, a hyper-parameter of
      another algorithm, a setting of another dataset away from its default (its runs would not
      read it), or a hyper-parameter named as a flag of the experiment.

  Examples:
    >>> from fedjax_gel import experiment
    >>> experiment.make(algorithm='fedprox', prox_mu=0.1).algorithm.hparams.prox_mu
    0.1
  """
  from fedjax_gel.algorithms import registry   # pylint: disable=g-import-not-at-top
  where = section_flag_names()
  name = flags.get('algorithm', AlgorithmConfig.name)
  dataset = flags.get('dataset', DataConfig.dataset)
  problem = _known_algorithm('algorithm', name) or _known_dataset('dataset', dataset)
  if problem:
    raise ConfigError(problem)
  own, data_own = hparam_flags(name), dataset_flags(dataset)
  clash = [f for f in own + data_own if f in where]
  if clash:
    kind = f'--algorithm={name}: its hyper-parameter' if clash[0] in own else (
        f'--dataset={dataset}: its setting')
    raise ConfigError(f'{kind} --{clash[0]} is a flag of the experiment already; rename it')
  clash = [f for f in own if f in data_own]
  if clash:
    raise ConfigError(f'--algorithm={name}: its hyper-parameter --{clash[0]} is a setting of '
                      f'--dataset={dataset} too; rename one of them')
  if (flags.get('dp_clip_norm', 0) or 0) > 0 and flags.get('aggregation_weights',
                                                              'default') == 'default':
    # DP's weighting (validation.privacy_problem)
    flags = {**flags, 'aggregation_weights': 'uniform'}
  sections = {k: {} for k in SECTIONS}
  hparams, data_hparams = {}, {}
  data_fields = data_registry.hparam_fields()
  for flag, value in flags.items():
    value = value.item() if isinstance(value, np.generic) else value   # NumPy scalars
    if flag in where:
      section, field = where[flag]
      sections[section][field.name] = value
    elif flag in own:
      hparams[flag] = value
    elif flag in data_own:
      data_hparams[flag] = value
    elif flag in registry.hparam_fields():
      raise ConfigError(f'--{flag} is not a hyper-parameter of --algorithm={name} (its own: '
                        f'{", ".join(own) or "none"})')
    elif flag in data_fields:   # a setting of another dataset: refused unless at its default
      if value != data_fields[flag].default:
        raise ConfigError(f'--{flag}={value}: {data_registry.not_read(flag, dataset)}; drop '
                          'the flag')
    else:
      raise ConfigError(f'--{flag} is not a flag of fedjax_gel')
  if 'budget_range' in sections['cohort']:   # (a, b), or 'a,b' as on the command line
    given = sections['cohort']['budget_range']
    sections['cohort']['budget_range'] = (parse_budget_range(given) if isinstance(given, str)
                                          else tuple(given))
  sections['algorithm']['hparams'] = registry.get(name).hparams(**hparams)
  sections['data']['hparams'] = data_registry.get(dataset).hparams(**_by_field(
      data_registry.get(dataset).hparams, data_hparams))
  return Config(**{k: SECTIONS[k](**v) for k, v in sections.items()})


def _by_field(record: type, values: dict) -> dict:
  """``{flag: value}`` as ``{field name: value}`` of ``record``'s fields."""
  names = {flag_name(f): f.name for f in dataclasses.fields(record)}
  return {names[k]: v for k, v in values.items()}


def parse_budget_range(text: str) -> tuple[int, int]:
  """``'a,b'`` -> ``(a, b)``; raises ConfigError naming ``--budget_range``."""
  parts = [p.strip() for p in str(text).split(',')]
  try:
    a, b = (int(p) for p in parts)
  except ValueError:
    raise ConfigError(f'--budget_range must be two integers a,b (got {text!r})') from None
  return a, b
