"""Specs: what the experiment layer knows of an algorithm, a dataset or a model before building.

Each spec is registered by name (``fedjax_gel.algorithms.registry``,
``fedjax_gel.data.registry``, ``fedjax_gel.models.registry``).

* ``hparams``: hyper-parameter records, frozen dataclasses of ``hparam`` fields (default, help,
  check), and the checks; the experiment's own configuration sections are made of them too;
* ``algorithm``: ``AlgorithmSpec`` and the ``Setting`` its builder gets;
* ``dataset``: ``DatasetSpec``;
* ``model``: ``ModelSpec``;
* ``registry``: ``Registry``, the specs of one kind by name.

Every flag of ``launch/run.py`` beyond the experiment's sections is a field of a registered
spec's ``hparams``, and the user guide's tables of algorithms, datasets and models are generated
from the registries.
"""
from fedjax_gel.spec.algorithm import AlgorithmSpec, Setting
from fedjax_gel.spec.dataset import DatasetSpec
from fedjax_gel.spec.hparams import (FLOAT32_MAX, INT32_MAX, TYPES, Check, NoHparams, at_least,
                                     check_record_class, field_problem, flag_name, hparam,
                                     int_range, one_of, positive, problems, within)
from fedjax_gel.spec.model import ModelSpec
from fedjax_gel.spec.registry import Registry

__all__ = [
    'AlgorithmSpec', 'Check', 'DatasetSpec', 'FLOAT32_MAX', 'INT32_MAX', 'ModelSpec', 'NoHparams', 'Registry', 'Setting',
    'TYPES', 'at_least', 'check_record_class', 'field_problem', 'flag_name', 'hparam',
    'int_range', 'one_of', 'positive', 'problems', 'within',
]
