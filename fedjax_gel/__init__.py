"""fedjax_gel: federated learning simulated as one compiled program per round.

Public API (everything else is an implementation module):

* engine: ``FederatedData``, ``FederatedSplit``, ``from_client_arrays``, ``to_device``,
  ``CohortSpec``, ``Cohort``, ``sample_cohort``, ``build_round``, ``RoundMetrics``,
  ``build_evaluate``, ``make_eval_pool``;
* algorithms: ``FederatedAlgorithm``, ``ClientContext``, ``RoundInfo``, ``fedavg``, ``fedavgcm``,
  ``gel``, ``GuessPolicy`` (the rest in ``algorithms``);
* optimisers: ``optim`` (GeL's ``gel_sgdm``, ``guessing`` and ``guess``; FedGBO; FedOpt);
* models and datasets: ``Model``, ``get_model``, ``cross_entropy_loss``, ``register_model``,
  ``register_dataset`` (your own, by ``spec.ModelSpec`` and ``spec.DatasetSpec``, usable by
  name from the command line and ``experiment``);
* sub-packages ``core``, ``algorithms``, ``optim``, ``models``, ``data``, ``spec``,
  ``experiment``.
"""
from fedjax_gel import algorithms, core, data, models, optim, spec
from fedjax_gel.algorithms import (ClientContext, FederatedAlgorithm, GuessPolicy, RoundInfo,
                                   fedavg, fedavgcm, gel)
from fedjax_gel.core import (Cohort, CohortSpec, FederatedData, FederatedSplit, RoundMetrics,
                             build_evaluate, build_round, from_client_arrays, make_eval_pool,
                             sample_cohort, to_device)
from fedjax_gel.data import register_dataset
from fedjax_gel.models import Model, cross_entropy_loss, get_model, register_model

__version__ = '0.1.0'

__all__ = [
    'ClientContext', 'Cohort', 'CohortSpec', 'FederatedAlgorithm', 'FederatedData',
    'FederatedSplit', 'GuessPolicy', 'Model', 'RoundInfo', 'RoundMetrics', 'algorithms',
    'build_evaluate', 'build_round', 'core', 'cross_entropy_loss', 'data', 'fedavg', 'fedavgcm',
    'from_client_arrays', 'gel', 'get_model', 'make_eval_pool', 'models', 'optim',
    'register_dataset', 'register_model', 'sample_cohort', 'spec', 'to_device',
]
