"""Experiment configuration: one flat, JSON-serialisable record, validated before anything runs."""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

DATASETS = ('leaf_synthetic', 'fedprox_synthetic', 'leaf', 'femnist', 'shakespeare', 'sent140',
            'celeba', 'mnist', 'emnist', 'cifar10', 'cifar100')
# Datasets read through TFDS data sources (--data_dir), split with --partition.
TFDS_DATASETS = ('mnist', 'emnist', 'cifar10', 'cifar100')
# Datasets read from --data_path (LEAF JSON files).
LEAF_DATASETS = ('leaf', 'femnist', 'shakespeare', 'sent140', 'celeba')
LEAF_SPLITS = ('default', 'sample', 'position', 'user')
ALGORITHMS = ('fedavg', 'fedavgcm', 'gel', 'fedavg_gel', 'fedprox', 'fedprox_gel', 'fednova',
              'fednova_gel', 'fedadam', 'fedyogi', 'fedadagrad', 'fedyogi_gel', 'fedgbo', 'mfl',
              'mimelite', 'mimexlite', 'fedmax', 'fedexp', 'scaffold', 'feddyn', 'adabest',
              'fedvarp', 'cluster_fedvarp')
# Algorithms with per-client state in the device-resident store (fedjax_gel.core.store).
STATEFUL_ALGORITHMS = ('scaffold', 'feddyn', 'adabest', 'fedvarp', 'cluster_fedvarp')
# Algorithms with a global optimiser of --gbo_optimizer's kind (fedjax_gel.optim.gbo).
GBO_ALGORITHMS = ('fedgbo', 'mfl', 'mimelite', 'mimexlite')
GBO_OPTIMIZERS = ('sgdm', 'rmsprop', 'adam')
CLIENT_SELECTIONS = ('uniform', 'cyclic', 'power_of_d')
GEL_ALGORITHMS = ('gel', 'fedavg_gel', 'fedprox_gel', 'fednova_gel', 'fedyogi_gel')
# Algorithms that fix the server optimiser (Reddi et al. 2021's forms, fedjax_gel.optim.fedopt).
FEDOPT_SERVERS = {'fedadam': 'fedadam', 'fedyogi': 'fedyogi', 'fedadagrad': 'fedadagrad',
                  'fedyogi_gel': 'fedyogi'}
SERVER_OPTIMIZERS = ('sgd', 'momentum', 'fedadam', 'fedyogi', 'fedadagrad', 'adam', 'yogi',
                     'adagrad')
GUESS_PROXIES = ('default', 'zero', 'last_gradient')


def flag(default, help_text: str):
  """A Config field: its default and its flag's help (``experiment.flags`` defines the flags)."""
  return dataclasses.field(default=default, metadata={'help': help_text})


class ConfigError(ValueError):
  """A user error in the configuration; its message is one line naming the flag."""


@dataclasses.dataclass(frozen=True)
class Config:
  """Every knob of a run; field names are ``launch/run.py``'s flag names, and each field's
  metadata holds its flag's help.

  Defaults follow the GeL paper's Synthetic FedAvgCM setting (Boukhari et al. 2023, §4 and App. E).
  """
  dataset: str = flag('leaf_synthetic', f'One of {", ".join(DATASETS)}.')
  data_path: Optional[str] = flag(None,
      'LEAF datasets: a LEAF JSON file, a directory of them (merged: FEMNIST), or a '
      'directory with train/ and test/.')
  leaf_split: str = flag('default',
      "LEAF's split of --data_path: sample (each user's samples at random), position "
      '(first samples train; Shakespeare), user (held-out users); default: position for'
      ' shakespeare, else sample.')
  split_gap: int = flag(79,
      "position split: samples skipped between train and test (LEAF's Shakespeare: 79, "
      'so no test window overlaps training).')
  char_vocabulary: str = flag('leaf', "shakespeare: leaf (LEAF's 80 characters) or tff (TFF's 86).")
  sent140_features: str = flag('bow',
      'sent140: bow (word counts, linear model) or tokens (word ids, LSTM).')
  vocab_size: int = flag(10_000, 'sent140: most frequent training words kept.')
  seq_len: int = flag(25, 'sent140 tokens: words kept per tweet (LEAF: 25).')
  image_dir: Optional[str] = flag(None, "celeba: the images (LEAF's data/raw/img_align_celeba).")
  fedprox_alpha: float = flag(1.0, 'fedprox_synthetic: alpha of Synthetic(a, b).')
  fedprox_beta: float = flag(1.0, 'fedprox_synthetic: beta of Synthetic(a, b).')
  fedprox_iid: bool = flag(False, 'fedprox_synthetic: the IID variant.')
  data_dir: Optional[str] = flag(None,
      'TFDS datasets (mnist, emnist, cifar10, cifar100): the TFDS data directory they '
      'were prepared in (ArrayRecord); nothing is downloaded.')
  num_clients: int = flag(100, 'TFDS datasets: clients the data is dealt to.')
  partition: str = flag('dirichlet',
      'TFDS datasets: dirichlet (label proportions Dir(alpha)) or pachinko (cifar100: '
      'superclasses Dir(alpha), labels Dir(beta)).')
  dirichlet_alpha: float = flag(0.5, 'TFDS datasets: Dirichlet alpha.')
  pachinko_beta: float = flag(10.0, 'TFDS cifar100 pachinko: beta.')
  train_fraction: float = flag(0.9, "Per-client train share (LEAF's 0.9).")
  split_seed: int = flag(931231, 'Seed of the per-client train/test split.')
  model: str = flag('logistic', 'Model name (see fedjax_gel.models.MODELS).')
  algorithm: str = flag('fedavgcm',
      'One or more (comma-separated, run one after another with the same seed, into '
      f'WORKDIR/<algorithm>/) of {", ".join(ALGORITHMS)}.')
  num_rounds: int = flag(300, 'Communication rounds.')
  clients_per_round: int = flag(20, 'Cohort size C.')
  sample_with_replacement: bool = flag(True,
      'Sample the cohort with replacement (the GeL code does).')
  batch_size: int = flag(5, 'Client minibatch size B.')
  budget_range: tuple = flag((4, 13), 'a,b: local steps tau_i ~ U{a..b} per client and round.')
  client_lr: float = flag(0.01, 'Client learning rate.')
  client_momentum: float = flag(0.9,
      'Client momentum of the SGDM clients (fedavgcm, GeL, FedProx, FedNova).')
  prox_mu: float = flag(0.01, 'FedProx proximal weight mu (fedprox, fedprox_gel).')
  guess_policy: str = flag('remaining',
      "GeL guessed steps tau'_i: remaining (tau - tau_i), cohort_max (max_j tau_j + k -"
      ' tau_i), inf, fixed, percent (of tau_i), none.')
  guess_tau: int = flag(0, 'remaining: the requested steps tau; 0 = b + 5.')
  guess_k: int = flag(0, 'cohort_max: the k in max_j tau_j + k.')
  guess_count: int = flag(5, 'fixed: guessed steps per client.')
  guess_percent: float = flag(25.0, 'percent: guesses as a percentage of tau_i.')
  guess_proxy: str = flag('default',
      'default, zero (momentum nudge, eq. 5) or last_gradient (re-apply the client '
      'optimiser with the last gradient); default: zero, last_gradient for fedavg_gel.')
  gbo_optimizer: str = flag('sgdm',
      'Global optimiser(s) of fedgbo, mfl, mimelite, mimexlite: sgdm, rmsprop, adam '
      '(several: each of those algorithms runs once per optimiser).')
  gbo_beta: float = flag(0.9, 'FedGBO family: SGDm/RMSProp decay, Adam beta1.')
  gbo_beta2: float = flag(0.99, 'FedGBO family: Adam beta2.')
  gbo_eps: float = flag(1e-3, 'FedGBO family: RMSProp/Adam eps (adaptivity).')
  fedmax_beta: float = flag(1.0, 'FedMAX entropy weight beta.')
  fedexp_eps: float = flag(1e-3, 'FedExP eps in its server step size eta_g.')
  feddyn_mu: float = flag(0.02, "FedDyn's regulariser weight (its paper's alpha).")
  adabest_mu: float = flag(0.02, "AdaBest's local estimate weight mu.")
  adabest_beta: float = flag(0.9, "AdaBest's server decay beta (0 and --adabest_mu=0: FedAvg).")
  fedvarp_clusters: int = flag(10,
      'cluster_fedvarp: server memories K; client i belongs to cluster i mod K.')
  client_selection: str = flag('uniform',
      'uniform; cyclic (clients in --cyclic_groups groups by id mod K; round t samples '
      'group t mod K); power_of_d (the C highest-loss of --power_d data-weighted '
      'candidates).')
  cyclic_groups: int = flag(4, 'cyclic: the number of client groups K.')
  power_d: int = flag(0, 'power_of_d: candidates d (drawn in proportion to data size); 0 = 2 x C.')
  power_loss: str = flag('full',
      "power_of_d: the candidates' local loss over all their examples (full) or one "
      'minibatch (minibatch).')
  server_optimizer: str = flag('sgd',
      f'One of {", ".join(SERVER_OPTIMIZERS)}, applied to Delta: fed* are Reddi et al. '
      "2021's forms, adam/yogi/adagrad optax's.")
  server_lr: float = flag(1.0, 'Server learning rate.')
  server_momentum: float = flag(0.0, 'Server momentum (--server_optimizer=momentum).')
  server_beta1: float = flag(0.9, 'FedOpt / Adam-type server beta1.')
  server_beta2: float = flag(0.99, 'FedOpt / Adam-type server beta2.')
  server_tau: float = flag(1e-3, 'FedOpt adaptivity tau (eps of optax forms).')
  aggregation_weights: str = flag('samples_seen',
      'samples_seen (min(tau_i B, n_i)), num_examples (n_i) or uniform.')
  seed: int = flag(0, 'Seed of cohorts, budgets, initial model and shuffles.')
  eval_every: int = flag(5, 'Evaluate every this many rounds.')
  train_eval_examples: int = flag(2048,
      'The train loss is measured on a fixed sample of this many training examples; 0: all.')
  tensorboard: bool = flag(True, 'Also write TensorBoard event files (WORKDIR/tensorboard/).')
  checkpoint_every: int = flag(50,
      'Rounds between checkpoints (0: none). Running the same command again in the same'
      ' --workdir resumes from the last one; finished runs are kept.')
  target_accuracy: float = flag(0.85, 'Accuracy for rounds_to_target.')
  chunk_size: int = flag(0, 'Clients vmapped together; 0 = automatic.')
  num_devices: int = flag(0,
      'Devices the cohort is split over (mesh axis "clients"); 0 = automatic: all when '
      'each gets at least 200 clients or the per-client store would take more than half'
      " of one device's memory, else one. On CPU every core is a device.")

  def to_json(self) -> dict:
    return dataclasses.asdict(self)

  @property
  def run_name(self) -> str:
    """The algorithm, with its optimiser for the FedGBO family (``fedgbo_sgdm``)."""
    if self.algorithm in GBO_ALGORITHMS:
      return f'{self.algorithm}_{self.gbo_optimizer}'
    return self.algorithm

  @property
  def split(self) -> str:
    """LEAF's split rule: the flag, or position for Shakespeare and sample otherwise."""
    if self.leaf_split != 'default':
      return self.leaf_split
    return 'position' if self.dataset == 'shakespeare' else 'sample'

  @property
  def candidates(self) -> int:
    """power-of-d's ``d``."""
    return self.power_d or 2 * self.clients_per_round

  @property
  def guesses(self) -> bool:
    return self.algorithm in GEL_ALGORITHMS

  @property
  def proxy(self) -> str:
    """The guess proxy: the flag, or the algorithm's default (last gradient for plain SGD)."""
    if self.guess_proxy != 'default':
      return self.guess_proxy
    return 'last_gradient' if self.algorithm == 'fedavg_gel' else 'zero'

  def guess_policy_value(self):
    """The GeL algorithms' ``GuessPolicy`` (``--guess_tau=0``: ``b + 5``, from the budgets)."""
    from fedjax_gel.algorithms.gel import GuessPolicy
    return GuessPolicy(self.guess_policy, self.guess_tau or None, self.guess_k, self.guess_count,
                       self.guess_percent)


def parse_budget_range(text: str) -> tuple[int, int]:
  """``'a,b'`` -> ``(a, b)``; raises ConfigError naming ``--budget_range``."""
  parts = [p.strip() for p in str(text).split(',')]
  try:
    a, b = (int(p) for p in parts)
  except ValueError:
    raise ConfigError(f'--budget_range must be two integers a,b (got {text!r})') from None
  return a, b


def validate(c: Config) -> Config:
  """Checks every field; raises ConfigError with one line naming the flag and the problem."""
  from fedjax_gel.algorithms.gel import GUESS_POLICIES, MAX_GUESSES
  from fedjax_gel.core.sampling import WEIGHTINGS
  from fedjax_gel.models import MODELS

  def need(ok, msg):
    if not ok:
      raise ConfigError(msg)

  def one_of(flag, value, known):
    need(value in known, f'--{flag}: unknown value {value!r}; known: {", ".join(known)}')

  for field in dataclasses.fields(c):
    value = getattr(c, field.name)
    need(not isinstance(value, float) or math.isfinite(value),
         f'--{field.name} must be a finite number (got {value})')
  one_of('dataset', c.dataset, DATASETS)
  one_of('algorithm', c.algorithm, ALGORITHMS)
  one_of('model', c.model, tuple(sorted(MODELS)))
  one_of('server_optimizer', c.server_optimizer, SERVER_OPTIMIZERS)
  one_of('aggregation_weights', c.aggregation_weights, WEIGHTINGS)
  one_of('guess_policy', c.guess_policy, GUESS_POLICIES)
  one_of('gbo_optimizer', c.gbo_optimizer, GBO_OPTIMIZERS)
  need(0 <= c.gbo_beta < 1, f'--gbo_beta must lie in [0, 1) (got {c.gbo_beta})')
  need(0 <= c.gbo_beta2 <= 1, f'--gbo_beta2 must lie in [0, 1] (got {c.gbo_beta2})')
  need(c.gbo_eps >= 0, f'--gbo_eps must be >= 0 (got {c.gbo_eps})')
  need(c.fedmax_beta >= 0, f'--fedmax_beta must be >= 0 (got {c.fedmax_beta})')
  need(c.fedexp_eps > 0, f'--fedexp_eps must be positive (got {c.fedexp_eps})')
  need(c.feddyn_mu >= 0, f'--feddyn_mu must be >= 0 (got {c.feddyn_mu})')
  need(c.adabest_mu >= 0, f'--adabest_mu must be >= 0 (got {c.adabest_mu})')
  need(0 <= c.adabest_beta <= 1, f'--adabest_beta must lie in [0, 1] (got {c.adabest_beta})')
  need(c.fedvarp_clusters >= 1,
       f'--fedvarp_clusters must be a positive integer (got {c.fedvarp_clusters})')
  one_of('client_selection', c.client_selection, CLIENT_SELECTIONS)
  need(c.cyclic_groups >= 1, f'--cyclic_groups must be a positive integer (got {c.cyclic_groups})')
  one_of('power_loss', c.power_loss, ('full', 'minibatch'))
  need(c.power_d == 0 or c.power_d >= c.clients_per_round,
       f'--power_d={c.power_d} must be at least --clients_per_round={c.clients_per_round}')
  need(c.algorithm != 'fedmax' or c.model != 'logistic',
       '--algorithm=fedmax with --model=logistic is FedAvg (no hidden layer: the penultimate '
       'activations are the inputs); use --model=mlp')
  one_of('guess_proxy', c.guess_proxy, GUESS_PROXIES)
  if c.guesses:
    need(c.guess_policy != 'inf' or c.proxy == 'zero' and c.algorithm != 'fedavg_gel',
         f'--guess_policy=inf needs momentum clients and the zero proxy (the closed-form '
         f'alpha/(1-alpha) nudge); --algorithm={c.algorithm} with --guess_proxy={c.proxy} '
         'would loop forever')
    need(c.algorithm not in ('fednova_gel', 'fedprox_gel') or c.proxy == 'zero',
         f'--guess_proxy={c.proxy}: {c.algorithm} guesses with the zero proxy only '
         '(FedNova: Lemma 1\'s ||a_i||_1; FedProx: the guess ignores the proximal term)')
    need(c.algorithm != 'fedavg_gel' or c.proxy != 'zero',
         '--guess_proxy=zero: fedavg_gel has plain SGD clients, whose zero-proxy guesses do '
         'nothing; use last_gradient, or --algorithm=gel')
  for flag in ('guess_tau', 'guess_k', 'guess_count'):
    need(0 <= getattr(c, flag) <= MAX_GUESSES,
         f'--{flag} must lie in [0, {MAX_GUESSES}] (got {getattr(c, flag)})')
  fixed_server = FEDOPT_SERVERS.get(c.algorithm)
  need(fixed_server is None or c.server_optimizer in ('sgd', fixed_server),
       f'--server_optimizer={c.server_optimizer}: --algorithm={c.algorithm} fixes its server '
       f'optimiser ({fixed_server}); use --algorithm=fedavg to combine SGD '
       'clients with another server optimiser')
  need(c.guess_percent >= 0, f'--guess_percent must be >= 0 (got {c.guess_percent})')
  need(c.prox_mu >= 0, f'--prox_mu must be >= 0 (got {c.prox_mu})')
  need(0 <= c.server_beta1 < 1, f'--server_beta1 must lie in [0, 1) (got {c.server_beta1})')
  need(0 <= c.server_beta2 < 1, f'--server_beta2 must lie in [0, 1) (got {c.server_beta2})')
  need(c.server_tau > 0, f'--server_tau must be positive (got {c.server_tau})')
  leaf_data = c.dataset in LEAF_DATASETS
  need(not leaf_data or c.data_path, f'--data_path is required with --dataset={c.dataset}')
  need(leaf_data or not c.data_path,
       f'--data_path is only read with LEAF datasets (got --dataset={c.dataset})')
  one_of('leaf_split', c.leaf_split, LEAF_SPLITS)
  need(c.split_gap >= 0, f'--split_gap must be >= 0 (got {c.split_gap})')
  one_of('char_vocabulary', c.char_vocabulary, ('leaf', 'tff'))
  one_of('sent140_features', c.sent140_features, ('bow', 'tokens'))
  need(c.vocab_size >= 1, f'--vocab_size must be a positive integer (got {c.vocab_size})')
  need(c.seq_len >= 1, f'--seq_len must be a positive integer (got {c.seq_len})')
  need(c.dataset != 'celeba' or c.image_dir, '--image_dir is required with --dataset=celeba')
  need(c.fedprox_alpha >= 0 and c.fedprox_beta >= 0,
       f'--fedprox_alpha and --fedprox_beta must be >= 0 (got {c.fedprox_alpha}, {c.fedprox_beta})')
  need(c.num_clients >= 1, f'--num_clients must be a positive integer (got {c.num_clients})')
  one_of('partition', c.partition, ('dirichlet', 'pachinko'))
  need(c.partition != 'pachinko' or c.dataset == 'cifar100',
       f'--partition=pachinko needs superclasses: --dataset=cifar100 only (got {c.dataset})')
  need(c.dirichlet_alpha > 0, f'--dirichlet_alpha must be positive (got {c.dirichlet_alpha})')
  need(c.pachinko_beta > 0, f'--pachinko_beta must be positive (got {c.pachinko_beta})')
  for flag in ('num_rounds', 'clients_per_round', 'batch_size', 'eval_every'):
    need(getattr(c, flag) > 0, f'--{flag} must be a positive integer (got {getattr(c, flag)})')
  a, b = c.budget_range
  need(a >= 1, f'--budget_range: the smallest budget must be at least 1 (got {a},{b})')
  need(a <= b, f'--budget_range: a must not exceed b (got {a},{b})')
  need(c.num_devices >= 0, f'--num_devices must be >= 0, 0 meaning automatic (got {c.num_devices})')
  need(c.chunk_size >= 0, f'--chunk_size must be >= 0, 0 meaning automatic (got {c.chunk_size})')
  need(c.train_eval_examples >= 0, '--train_eval_examples must be >= 0, 0 meaning the whole '
       f'training pool (got {c.train_eval_examples})')
  need(c.checkpoint_every >= 0,
       f'--checkpoint_every must be >= 0, 0 meaning no checkpoints (got {c.checkpoint_every})')
  need(0. < c.train_fraction < 1., f'--train_fraction must lie in (0, 1) (got {c.train_fraction})')
  need(c.client_lr > 0, f'--client_lr must be positive (got {c.client_lr})')
  need(c.server_lr > 0, f'--server_lr must be positive (got {c.server_lr})')
  need(0 <= c.client_momentum < 1, f'--client_momentum must lie in [0, 1) (got {c.client_momentum})')
  need(0 <= c.server_momentum < 1, f'--server_momentum must lie in [0, 1) (got {c.server_momentum})')
  need(0 < c.target_accuracy <= 1, f'--target_accuracy must lie in (0, 1] (got {c.target_accuracy})')
  return c
