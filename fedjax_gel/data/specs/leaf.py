"""LEAF's datasets read from its JSON files (``--data_path``; Caldas et al. 2018, "LEAF: A
Benchmark for Federated Settings"): any numeric LEAF file and the FEMNIST, Shakespeare, Sent140
and CelebA tasks (``data.leaf``, ``data.leaf_tasks``), sampled and split by LEAF's rules
(``data.leaf_preprocess``)."""
from __future__ import annotations

import dataclasses

from fedjax_gel.data.leaf_preprocess import SAMPLINGS, Sampling
from fedjax_gel.data.leaf_tasks import CLASSES
from fedjax_gel.spec import DatasetSpec, hparam, int_range, one_of, within


@dataclasses.dataclass(frozen=True)
class LeafHparams:
  """LEAF's split and its sampling of raw ``all_data`` files (``preprocess.sh``)."""
  leaf_split: str = hparam(
      'default', "LEAF's split of --data_path: sample (each user's samples at random), position "
      '(first samples train; Shakespeare), user (held-out users); default: position for '
      'shakespeare, else sample.', one_of('default', 'sample', 'position', 'user'))
  leaf_sample: str = hparam(
      'none', "LEAF datasets: LEAF's sampling of raw all_data files before the split "
      '(preprocess.sh -s): none, niid (whole users) or iid (samples pooled).',
      one_of(*SAMPLINGS))
  leaf_fraction: float = hparam(0.1, "LEAF's --sf: fraction of each file's samples kept.",
                                within(0, 1, open_low=True))
  leaf_iid_users: float = hparam(
      0.01, "LEAF's --iu: iid sampling's users, as a fraction of each file's users.",
      within(0, 1, open_low=True))
  leaf_min_samples: int = hparam(
      -1, "LEAF's -k: users with at most this many samples are dropped (after the sampling); "
      '-1: none.', int_range(-1, note=', -1 meaning no filter'))


@dataclasses.dataclass(frozen=True)
class LeafGapHparams(LeafHparams):
  split_gap: int = hparam(
      79, "position split: samples skipped between train and test (LEAF's Shakespeare: 79, so "
      'no test window overlaps training).', int_range(0))


@dataclasses.dataclass(frozen=True)
class ShakespeareHparams(LeafGapHparams):
  char_vocabulary: str = hparam("leaf", "shakespeare: leaf (LEAF's 80 characters) or tff "
                                "(TFF's 86).", one_of('leaf', 'tff'))


@dataclasses.dataclass(frozen=True)
class Sent140Hparams(LeafHparams):
  sent140_features: str = hparam(
      'bow', 'sent140: bow (word counts, linear model) or tokens (word ids, LSTM).',
      one_of('bow', 'tokens'))
  vocab_size: int = hparam(10_000, 'sent140: most frequent training words kept.',
                           int_range(1))
  seq_len: int = hparam(25, 'sent140 tokens: words kept per tweet (LEAF: 25).', int_range(1))


def sampling(d, hp: LeafHparams) -> Sampling:
  """LEAF's sampling and user filter of raw files."""
  return Sampling(hp.leaf_sample, hp.leaf_fraction, hp.leaf_iid_users, hp.leaf_min_samples,
                  d.split_seed)


def split_rule(d, hp: LeafHparams) -> str:
  """LEAF's split rule: ``--leaf_split``, or position for Shakespeare and sample otherwise."""
  if hp.leaf_split != 'default':
    return hp.leaf_split
  return 'position' if d.dataset == 'shakespeare' else 'sample'


# The settings of the split a LEAF loader makes (LEAF's sampling, which needs its raw files too,
# is refused by ``data.leaf.load`` itself).
SPLIT_SETTINGS = ('leaf_split', 'train_fraction', 'split_seed', 'split_gap')


def check_split_unset(d, data_path: str):
  """A folder of LEAF's split output is read as it is: a split setting away from its default
  would change nothing, so it is a ConfigError rather than recorded as if it had."""
  from fedjax_gel.experiment.config import ConfigError  # pylint: disable=g-import-not-at-top
  records = (d, d.hparams)
  for name in SPLIT_SETTINGS:
    for record in records:
      field = {f.name: f for f in dataclasses.fields(record)}.get(name)
      if field is not None and getattr(record, name) != field.default:
        raise ConfigError(f'--{name}={getattr(record, name)}: --data_path={data_path} holds '
                          "train/ and test/ (LEAF's split output), which are read as they are; "
                          f'leave --{name} at its default ({field.default}) or point '
                          "--data_path at LEAF's raw all_data/")


def _arguments(d, hp: LeafHparams) -> tuple[str, dict]:
  """The resolved ``--data_path`` (``subset:<name>``: a shipped subset) and the split's
  arguments of every LEAF loader."""
  from fedjax_gel.data import leaf, subsets  # pylint: disable=g-import-not-at-top
  path = subsets.resolve(d.data_path)
  if leaf.holds_split(path):
    check_split_unset(d, d.data_path)
  return path, dict(train_fraction=d.train_fraction, seed=d.split_seed, split=split_rule(d, hp),
                    sampling=sampling(d, hp))


def load_leaf(d, hp: LeafGapHparams):
  from fedjax_gel.data import leaf  # pylint: disable=g-import-not-at-top
  path, args = _arguments(d, hp)
  return leaf.load(path, gap=hp.split_gap, **args)


def load_femnist(d, hp: LeafHparams):
  from fedjax_gel.data import leaf_tasks  # pylint: disable=g-import-not-at-top
  path, args = _arguments(d, hp)
  return leaf_tasks.load_femnist(path, **args)


def load_shakespeare(d, hp: ShakespeareHparams):
  from fedjax_gel.data import leaf_tasks  # pylint: disable=g-import-not-at-top
  path, args = _arguments(d, hp)
  return leaf_tasks.load_shakespeare(path, hp.char_vocabulary, gap=hp.split_gap, **args)


def load_sent140(d, hp: Sent140Hparams):
  from fedjax_gel.data import leaf_tasks  # pylint: disable=g-import-not-at-top
  path, args = _arguments(d, hp)
  return leaf_tasks.load_sent140(path, hp.sent140_features, hp.vocab_size, hp.seq_len, **args)


def load_celeba(d, hp: LeafHparams):
  from fedjax_gel.data import leaf_tasks  # pylint: disable=g-import-not-at-top
  path, args = _arguments(d, hp)
  return leaf_tasks.load_celeba(path, d.image_dir, **args)


def _unread(hp: LeafHparams) -> dict:
  """LEAF's sampling rates are read only by its sampling."""
  if hp.leaf_sample == 'none':
    return dict.fromkeys(('leaf_fraction', 'leaf_iid_users'), 'read only with --leaf_sample')
  if hp.leaf_sample != 'iid':
    return {'leaf_iid_users': f'read only with --leaf_sample=iid (got {hp.leaf_sample})'}
  return {}


def _spec(name, load, hparams, data, x, needs=('data_path',)) -> DatasetSpec:
  return DatasetSpec(name, load, hparams, data=data, x=x, family='LEAF', needs=needs,
                     reads=('train_fraction',), classes=CLASSES.get(name), unread=_unread,
                     checked=False)


LEAF = _spec('leaf', load_leaf, LeafGapHparams,
             'any numeric LEAF JSON (`--data_path`), e.g. '
             '`../shared/data/leaf/fedprox_synthetic_1_1_subset.json` (float labels such as '
             '`4.0` are read as classes)', 'as in the file')
FEMNIST = _spec('femnist', load_femnist, LeafHparams,
                "LEAF FEMNIST (`--data_path`: a JSON file or LEAF's `all_data/` directory, whose "
                'files are merged)', '`28 x 28 x 1`')
SHAKESPEARE = _spec('shakespeare', load_shakespeare, ShakespeareHparams,
                    'LEAF Shakespeare, next character from 80; `--char_vocabulary=leaf` (80 '
                    'characters) or `tff` (86), one extra id for characters outside it',
                    '80 character ids')
SENT140 = _spec('sent140', load_sent140, Sent140Hparams,
                'LEAF Sent140; `--sent140_features=bow` (counts of the `--vocab_size` most '
                'frequent training words, for `logistic`) or `tokens` (the first `--seq_len` '
                'word ids, for `sent140_lstm`); labels 0/1 or `"0"/"4"`', 'counts or ids')
CELEBA = _spec('celeba', load_celeba, LeafHparams,
               'LEAF CelebA: image names in the JSON, images from `--image_dir`, resized to 84 '
               'x 84', '`84 x 84 x 3`', needs=('data_path', 'image_dir'))
