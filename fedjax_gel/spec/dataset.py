"""Datasets declared by spec: a name, a hyper-parameter record, a loader and what it reads.

A ``DatasetSpec`` is what the experiment needs to know about a dataset before it loads it: its
own settings (``hparams``, a frozen dataclass of ``hparam`` fields: each a flag of
``launch/run.py``, shared by name with the datasets that hold a field of that name), which of
the settings every dataset may read it reads (``COMMON``) or needs, the classes its task fixes,
and the loader ``load(data, hparams) -> FederatedSplit`` that reads them (``data``: the
experiment's ``DataConfig``, its common fields; ``hparams``: the record, ``data.hparams``).
``fedjax_gel.data.registry`` collects the specs; the flags, their checks, the settings a run
does not read (``experiment.validation.unread_flags``) and the user guide's table come from it.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

from fedjax_gel.spec.hparams import NoHparams

# The settings of ``DataConfig`` beside ``dataset`` and ``split_seed`` (which every dataset
# reads) that a dataset may read (``DatasetSpec.reads``) or need (``DatasetSpec.needs``): where
# its files are, and the share of each client's examples it trains on.
COMMON = ('data_path', 'image_dir', 'data_dir', 'train_fraction')
PATHS = ('data_path', 'image_dir', 'data_dir')   # refused where the dataset does not read them


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  """One registered dataset.

  Attributes:
    name: the ``--dataset`` value.
    load: ``(DataConfig, hparams) -> FederatedSplit``, the train and test pools on the host
      (``core.federated_data.from_client_arrays`` builds a pool from per-client arrays).
    hparams: the frozen dataclass of its own settings (fields made with ``hparam``).
    data: what the data is, in words (the user guide's table).
    x: its examples' features, in words (the user guide's table).
    family: the kind of datasets it belongs to (``LEAF``, ``TFDS``), in messages: a setting
      that only the datasets of a family read is "only read with LEAF datasets".
    classes: the classes its task fixes (FEMNIST's 62), whatever labels a sample of the data
      holds; None: ``max label + 1``.
    needs: the ``COMMON`` settings it requires (``data_path``; CelebA's ``image_dir``).
    reads: the ``COMMON`` settings it reads besides those (a path it does not read is refused,
      ``train_fraction`` away from its default too).
    check: ``DataConfig -> problem or None``, a rule across its settings.
    unread: ``hparams -> {flag: why}`` of its own settings that these values of the others
      make unread (LEAF's ``--leaf_fraction`` without ``--leaf_sample``).
    checked: the experiment checks what ``load`` returns (pools, features, shapes) before it
      builds the model; the built-in loaders check their files themselves.
  """
  name: str
  load: Callable[[Any, Any], Any]
  hparams: type = NoHparams
  data: str = ''
  x: str = ''
  family: str = ''
  classes: int | None = None
  needs: tuple[str, ...] = ()
  reads: tuple[str, ...] = ('data_path', 'train_fraction')
  check: Callable[[Any], Optional[str]] | None = None
  unread: Callable[[Any], dict] | None = None
  checked: bool = True

  def read(self) -> tuple[str, ...]:
    """The ``COMMON`` settings it reads: ``needs`` and ``reads``."""
    return tuple(dict.fromkeys(self.needs + self.reads))
