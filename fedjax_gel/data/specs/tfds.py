"""Image datasets read through TFDS data sources (``data.tfds_data``), dealt to clients by a
Dirichlet or Pachinko partition (``data.partition``)."""
from __future__ import annotations

import dataclasses

from fedjax_gel.data.tfds_data import DATASETS
from fedjax_gel.spec import DatasetSpec, hparam, int_range, one_of, positive


@dataclasses.dataclass(frozen=True)
class TfdsHparams:
  num_clients: int = hparam(100, 'TFDS datasets: clients the data is dealt to.',
                            int_range(1))
  partition: str = hparam(
      'dirichlet', 'TFDS datasets: dirichlet (label proportions Dir(alpha)) or pachinko '
      '(cifar100: superclasses Dir(alpha), labels Dir(beta)).', one_of('dirichlet', 'pachinko'))
  dirichlet_alpha: float = hparam(0.5, 'TFDS datasets: Dirichlet alpha.', positive)
  pachinko_beta: float = hparam(10.0, 'TFDS cifar100 pachinko: beta.', positive)


def load(d, hp: TfdsHparams):
  from fedjax_gel.data import tfds_data  # pylint: disable=g-import-not-at-top
  from fedjax_gel.experiment.config import ConfigError  # pylint: disable=g-import-not-at-top
  try:
    return tfds_data.load(d.dataset, hp.num_clients, hp.dirichlet_alpha, hp.partition,
                          hp.pachinko_beta, seed=d.split_seed, data_dir=d.data_dir)
  except ImportError as e:
    raise ConfigError(f'--dataset={d.dataset}: {e}') from None


def _superclasses(d):
  if d.hparams.partition == 'pachinko' and d.dataset != 'cifar100':
    return (f'--partition=pachinko needs superclasses: --dataset=cifar100 only (got '
            f'{d.dataset})')
  return None


def _unread(hp: TfdsHparams) -> dict:
  if hp.partition == 'pachinko':
    return {}
  return {'pachinko_beta': f'read only with --partition=pachinko (got {hp.partition})'}


def _spec(name: str, data: str) -> DatasetSpec:
  return DatasetSpec(
      name, load, TfdsHparams, data=data, family='TFDS', classes=DATASETS[name].num_classes,
      reads=('data_dir',), check=_superclasses, unread=_unread, checked=False,
      x='images in `[0, 1]`')


_SOURCE = ('TFDS data source (`--data_dir`, prepared beforehand in ArrayRecord format; nothing '
           'is downloaded), dealt to `--num_clients` clients by `--partition=dirichlet` '
           '(`Dir(alpha p)` label proportions, `--dirichlet_alpha`)')
MNIST = _spec('mnist', f'MNIST, a {_SOURCE}')
EMNIST = _spec('emnist', f'EMNIST (62 classes), a {_SOURCE}')
CIFAR10 = _spec('cifar10', f'CIFAR-10, a {_SOURCE}')
CIFAR100 = _spec('cifar100', f'CIFAR-100, a {_SOURCE} or `pachinko` (superclasses `Dir(alpha)`, '
                 'labels within `Dir(--pachinko_beta)`)')
