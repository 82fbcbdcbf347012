"""Experiment configuration: one flat, JSON-serialisable record, validated before anything runs."""
from __future__ import annotations

import dataclasses
from typing import Optional

DATASETS = ('leaf_synthetic', 'leaf')
ALGORITHMS = ('fedavg', 'fedavgcm')
SERVER_OPTIMIZERS = ('sgd', 'momentum', 'adam', 'yogi', 'adagrad')


class ConfigError(ValueError):
  """A user error in the configuration; its message is one line naming the flag."""


@dataclasses.dataclass(frozen=True)
class Config:
  """Every knob of a run; field names are the runner's flag names.

  Defaults follow the GeL paper's Synthetic FedAvgCM setting (seed 000, §4 and App. E).
  """
  dataset: str = 'leaf_synthetic'
  data_path: Optional[str] = None
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
  client_momentum: float = 0.9          # fedavgcm only
  server_optimizer: str = 'sgd'
  server_lr: float = 1.0
  server_momentum: float = 0.0          # server_optimizer=momentum only
  aggregation_weights: str = 'samples_seen'
  seed: int = 0
  eval_every: int = 5
  target_accuracy: float = 0.85         # GeL paper: 85% on Synthetic (its code uses 81%)
  chunk_size: int = 0                   # 0: from model size and device memory
  num_devices: int = 0                  # devices the cohort is split over; 0: automatic

  def to_json(self) -> dict:
    return dataclasses.asdict(self)


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
  from fedjax_gel.core.sampling import WEIGHTINGS
  from fedjax_gel.models import MODELS

  def need(ok, msg):
    if not ok:
      raise ConfigError(msg)

  def one_of(flag, value, known):
    need(value in known, f'--{flag}: unknown value {value!r}; known: {", ".join(known)}')

  one_of('dataset', c.dataset, DATASETS)
  one_of('algorithm', c.algorithm, ALGORITHMS)
  one_of('model', c.model, tuple(sorted(MODELS)))
  one_of('server_optimizer', c.server_optimizer, SERVER_OPTIMIZERS)
  one_of('aggregation_weights', c.aggregation_weights, WEIGHTINGS)
  need(c.dataset != 'leaf' or c.data_path, '--data_path is required with --dataset=leaf')
  need(c.dataset == 'leaf' or not c.data_path,
       f'--data_path is only read with --dataset=leaf (got --dataset={c.dataset})')
  for flag in ('num_rounds', 'clients_per_round', 'batch_size', 'eval_every'):
    need(getattr(c, flag) > 0, f'--{flag} must be a positive integer (got {getattr(c, flag)})')
  a, b = c.budget_range
  need(a >= 1, f'--budget_range: the smallest budget must be at least 1 (got {a},{b})')
  need(a <= b, f'--budget_range: a must not exceed b (got {a},{b})')
  need(c.num_devices >= 0, f'--num_devices must be >= 0, 0 meaning automatic (got {c.num_devices})')
  need(c.chunk_size >= 0, f'--chunk_size must be >= 0, 0 meaning automatic (got {c.chunk_size})')
  need(0. < c.train_fraction < 1., f'--train_fraction must lie in (0, 1) (got {c.train_fraction})')
  need(c.client_lr > 0, f'--client_lr must be positive (got {c.client_lr})')
  need(c.server_lr > 0, f'--server_lr must be positive (got {c.server_lr})')
  need(0 <= c.client_momentum < 1, f'--client_momentum must lie in [0, 1) (got {c.client_momentum})')
  need(0 <= c.server_momentum < 1, f'--server_momentum must lie in [0, 1) (got {c.server_momentum})')
  need(0 < c.target_accuracy <= 1, f'--target_accuracy must lie in (0, 1] (got {c.target_accuracy})')
  return c
