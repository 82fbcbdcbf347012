"""``config.json``: a run's ``Config`` as written (``Config.to_json``) and read back, in this
version's layout and in those of earlier versions, so that their runs still resume, compare and
name their folders.

The layouts read: sections (``Config.to_json``); a flat record of flags (before sections, every
algorithm's hyper-parameters side by side); sections with a flat ``data`` section (before
datasets had settings of their own: every dataset's settings side by side); and
``target_accuracy`` for ``target`` in either.
"""
from __future__ import annotations

import dataclasses

from fedjax_gel.algorithms import registry
from fedjax_gel.data import registry as data_registry
from fedjax_gel.experiment.config import (SECTIONS, AlgorithmConfig, CohortConfig, Config,
                                          DataConfig, dataset_flags, hparam_flags, make,
                                          section_flag_names, section_flags)
from fedjax_gel.spec import hparam


def read(d: dict) -> Config:
  """The inverse of ``Config.to_json`` (keys outside the sections are ignored), reading the
  layouts of earlier versions too (the module's docstring)."""
  if 'data' not in d:   # a flat record of flags
    name = d.get('algorithm', AlgorithmConfig.name)
    dataset = d.get('dataset', DataConfig.dataset)
    keep = set(section_flag_names()) | set(hparam_flags(name)) | set(dataset_flags(dataset))
    d = {('target' if k == 'target_accuracy' else k): v for k, v in d.items()}
    return make(**{k: v for k, v in d.items() if k in keep})
  sections = {k: dict(d.get(k, {})) for k in SECTIONS}
  if 'target_accuracy' in sections['run']:   # before --target_accuracy became --target
    sections['run']['target'] = sections['run'].pop('target_accuracy')
  algo = sections['algorithm']
  hparams = algo.pop('hparams', None) or {}
  algo['hparams'] = AlgorithmConfig(algo.get('name', AlgorithmConfig.name)).spec.hparams(
      **hparams)
  sections['data'] = data_section(sections['data'])
  sections['cohort']['budget_range'] = tuple(sections['cohort'].get(
      'budget_range', CohortConfig.budget_range))
  return Config(**{k: SECTIONS[k](**v) for k, v in sections.items()})


def data_section(data: dict) -> dict:
  """The ``DataConfig`` fields of a ``config.json``'s ``data`` section: its common fields and
  ``hparams``, the dataset's record. A flat section (earlier versions: every dataset's settings
  side by side) gives the chosen dataset's own settings, by name, to ``hparams`` and drops the
  others, which its runs did not read. A dataset this process does not know (registered by
  the code that ran it) keeps the settings the file holds, read back as a record of them."""
  common = {f.name for f in dataclasses.fields(DataConfig)} - {'hparams'}
  name = data.get('dataset', DataConfig.dataset)
  known = name in data_registry.names()
  own = data.get('hparams')
  if own is None:   # a flat section
    names = {f.name for f in dataclasses.fields(data_registry.get(name).hparams)} if known else ()
    own = {k: v for k, v in data.items() if k in names}
  out = {k: v for k, v in data.items() if k in common}
  out['hparams'] = (data_registry.get(name).hparams(**own) if known else read_back(own))
  return out


def read_back(values: dict):
  """A frozen record of ``values`` (the settings of a dataset this process does not know), its
  fields typed by the values (so that ``problems(checks=False)`` reads them)."""
  fields = [(k, type(v).__name__ if v is not None else 'Optional[str]',
             hparam(v, 'read back from a config.json')) for k, v in values.items()]
  record = dataclasses.make_dataclass('ReadBack', fields, frozen=True)
  return record()


def flat_data(d: DataConfig) -> dict:
  """The data section as ``config.json`` held it before datasets had settings of their own:
  the common fields and every built-in dataset's settings, the chosen dataset's as set, the
  others at their defaults (``api.default_workdir`` names a command's folder by it, so that a
  command finds the runs an earlier version wrote)."""
  defaults = {}
  for spec in data_registry.BUILTIN:
    for f in dataclasses.fields(spec.hparams):
      defaults.setdefault(f.name, f.default)
  common = section_flags(d)
  return {**common, **defaults, **dataclasses.asdict(d.hparams)} if d.hparams is not None else {
      **common, **defaults}


def extras(d: dict) -> dict:
  """The fields of a ``config.json`` that are not the Config's (a grid's, for example)."""
  known = set(SECTIONS) if 'data' in d else (
      set(section_flag_names()) | set(registry.hparam_fields()) |
      set(data_registry.hparam_fields()))
  return {k: v for k, v in d.items() if k not in known}
