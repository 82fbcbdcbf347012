"""Generated datasets: LEAF's Synthetic and FedProx's Synthetic(alpha, beta), cached on disk
(``data.cache``) by their settings."""
from __future__ import annotations

import dataclasses

from fedjax_gel.spec import DatasetSpec, at_least, hparam


def _split(d) -> dict:
  return dict(train_fraction=d.train_fraction, split_seed=d.split_seed)


def _splitting():
  """The modules of the split, its checks and the pools (a change in them is a new cache)."""
  from fedjax_gel.data import leaf, leaf_files, leaf_preprocess  # pylint: disable=g-import-not-at-top
  return leaf_preprocess, leaf_files, leaf


def load_leaf_synthetic(d, hparams):
  del hparams
  from fedjax_gel.data import cache, leaf_synthetic  # pylint: disable=g-import-not-at-top
  split = _split(d)
  return cache.cached_split(d.dataset, split, (leaf_synthetic, *_splitting()),
                            lambda: leaf_synthetic.load(**split))


@dataclasses.dataclass(frozen=True)
class FedProxSyntheticHparams:
  fedprox_alpha: float = hparam(1.0, 'fedprox_synthetic: alpha of Synthetic(a, b).', at_least(0))
  fedprox_beta: float = hparam(1.0, 'fedprox_synthetic: beta of Synthetic(a, b).', at_least(0))
  fedprox_iid: bool = hparam(False, 'fedprox_synthetic: the IID variant.')


def load_fedprox_synthetic(d, hp: FedProxSyntheticHparams):
  from fedjax_gel.data import cache, fedprox_synthetic  # pylint: disable=g-import-not-at-top
  split = _split(d)
  settings = dict(alpha=hp.fedprox_alpha, beta=hp.fedprox_beta, iid=hp.fedprox_iid, **split)
  return cache.cached_split(
      d.dataset, settings, (fedprox_synthetic, *_splitting()),
      lambda: fedprox_synthetic.load(hp.fedprox_alpha, hp.fedprox_beta, hp.fedprox_iid, **split))


LEAF_SYNTHETIC = DatasetSpec(
    'leaf_synthetic', load_leaf_synthetic, reads=('train_fraction',),
    data="LEAF Synthetic (1,000 clients, 60 features, 5 classes), generated in memory as LEAF's "
    'script does', x='60 floats')
FEDPROX_SYNTHETIC = DatasetSpec(
    'fedprox_synthetic', load_fedprox_synthetic, FedProxSyntheticHparams,
    reads=('train_fraction',),
    data="FedProx's Synthetic(alpha, beta) (Li et al. 2020, \"Federated Optimization in "
    'Heterogeneous Networks\"): 30 clients, 60 features, 10 classes, generated as its scripts '
    'do (alpha only shifts every class\'s logit alike, so it does not change the data)',
    x='60 floats')
