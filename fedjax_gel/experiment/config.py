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


class ConfigError(ValueError):
  """A user error in the configuration; its message is one line naming the flag."""


@dataclasses.dataclass(frozen=True)
class Config:
  """Every knob of a run; field names are the runner's flag names.

  Defaults follow the GeL paper's Synthetic FedAvgCM setting (Boukhari et al. 2023, §4 and App. E).
  """
  dataset: str = 'leaf_synthetic'
  data_path: Optional[str] = None
  leaf_split: str = 'default'           # sample | position | user; default: position for
                                        # shakespeare (LEAF), sample otherwise
  split_gap: int = 79                   # position split: samples skipped after train (LEAF: 79)
  char_vocabulary: str = 'leaf'         # shakespeare: leaf (80 characters) | tff (86)
  sent140_features: str = 'bow'         # sent140: bow (word counts) | tokens (word ids)
  vocab_size: int = 10_000              # sent140: most frequent training words kept
  seq_len: int = 25                     # sent140 tokens: words per tweet (LEAF: 25)
  image_dir: Optional[str] = None       # celeba: LEAF's data/raw/img_align_celeba
  fedprox_alpha: float = 1.0            # fedprox_synthetic: Synthetic(alpha, beta)
  fedprox_beta: float = 1.0
  fedprox_iid: bool = False             # fedprox_synthetic: the IID variant
  data_dir: Optional[str] = None        # TFDS datasets: where they were prepared
  num_clients: int = 100                # TFDS datasets: clients the split is dealt to
  partition: str = 'dirichlet'          # TFDS datasets: dirichlet | pachinko (cifar100)
  dirichlet_alpha: float = 0.5          # Dir(alpha) label proportions (pachinko: superclasses)
  pachinko_beta: float = 10.0           # pachinko: Dir(beta) over a superclass's labels
  train_fraction: float = 0.9           # LEAF's by-sample split
  split_seed: int = 931231
  model: str = 'logistic'
  algorithm: str = 'fedavgcm'
  num_rounds: int = 300
  clients_per_round: int = 20
  sample_with_replacement: bool = True  # the GeL code samples with replacement
  batch_size: int = 5
  budget_range: tuple = (4, 13)         # tau_i ~ U{a..b}
  client_lr: float = 0.01
  client_momentum: float = 0.9          # SGDM clients: fedavgcm, GeL, FedProx, FedNova
  prox_mu: float = 0.01                 # fedprox, fedprox_gel (GeL's experiments: 0.01)
  guess_policy: str = 'remaining'       # GeL algorithms: see algorithms.GuessPolicy
  guess_tau: int = 0                    # remaining: tau' = tau - tau_i; 0 means b + 5
  guess_k: int = 0                      # cohort_max: tau' = max_j tau_j + k - tau_i
  guess_count: int = 5                  # fixed: tau' = count
  guess_percent: float = 25.0           # percent: tau' = floor(percent / 100 * tau_i)
  guess_proxy: str = 'default'          # zero (eq. 5) or last_gradient (Dhasade et al. 2021)
  gbo_optimizer: str = 'sgdm'           # fedgbo, mfl, mimelite, mimexlite: sgdm|rmsprop|adam
  gbo_beta: float = 0.9                 # SGDm / RMSProp decay, Adam's beta1
  gbo_beta2: float = 0.99               # Adam's beta2
  gbo_eps: float = 1e-3                 # RMSProp / Adam (FedGBO's experiments: 1e-3)
  fedmax_beta: float = 1.0              # FedMAX's entropy weight
  fedexp_eps: float = 1e-3              # FedExP's eps in eta_g
  feddyn_mu: float = 0.02               # FedDyn's alpha (Varno et al. 2022, App. D.5: 0.02)
  adabest_mu: float = 0.02              # AdaBest's mu (AdaBest, Varno et al. 2022, App. D.5: 0.02)
  adabest_beta: float = 0.9             # AdaBest's beta (Varno et al. 2022, Fig. 7: 0.8-1.0)
  fedvarp_clusters: int = 10            # cluster_fedvarp: K memories, client i in cluster i mod K
  client_selection: str = 'uniform'     # uniform | cyclic | power_of_d
  cyclic_groups: int = 4                # cyclic: K groups, round t samples group t mod K
  power_d: int = 0                      # power_of_d: candidates d; 0 means 2 x clients_per_round
  power_loss: str = 'full'              # power_of_d: candidates' loss on all / one minibatch
  server_optimizer: str = 'sgd'         # fedadam/fedyogi/fedadagrad algorithms fix their own
  server_lr: float = 1.0
  server_momentum: float = 0.0          # server_optimizer=momentum only
  server_beta1: float = 0.9             # FedOpt (Reddi et al. 2021)
  server_beta2: float = 0.99
  server_tau: float = 1e-3              # FedOpt's adaptivity
  aggregation_weights: str = 'samples_seen'
  seed: int = 0
  eval_every: int = 5
  checkpoint_every: int = 50            # rounds between checkpoints; 0: none
  target_accuracy: float = 0.85         # GeL paper: 85% on Synthetic (its code uses 81%)
  chunk_size: int = 0                   # 0: from model size and device memory
  num_devices: int = 0                  # devices the cohort is split over; 0: automatic

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
  need(c.checkpoint_every >= 0,
       f'--checkpoint_every must be >= 0, 0 meaning no checkpoints (got {c.checkpoint_every})')
  need(0. < c.train_fraction < 1., f'--train_fraction must lie in (0, 1) (got {c.train_fraction})')
  need(c.client_lr > 0, f'--client_lr must be positive (got {c.client_lr})')
  need(c.server_lr > 0, f'--server_lr must be positive (got {c.server_lr})')
  need(0 <= c.client_momentum < 1, f'--client_momentum must lie in [0, 1) (got {c.client_momentum})')
  need(0 <= c.server_momentum < 1, f'--server_momentum must lie in [0, 1) (got {c.server_momentum})')
  need(0 < c.target_accuracy <= 1, f'--target_accuracy must lie in (0, 1] (got {c.target_accuracy})')
  return c
