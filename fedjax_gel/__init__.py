"""fedjax_gel: federated learning simulated as one compiled program per round.

Public API (everything else is an implementation module):

* engine: ``FederatedData``, ``FederatedSplit``, ``from_client_arrays``, ``to_device``,
  ``Cohort``, ``sample_cohort``, ``build_round``, ``RoundMetrics``, ``build_evaluate``,
  ``make_eval_pool``;
* algorithms: ``FederatedAlgorithm``, ``ClientContext``, ``RoundInfo``, ``fedavg``, ``fedavgcm``;
* models: ``Model``, ``get_model``, ``cross_entropy_loss``;
* sub-packages ``core``, ``algorithms``, ``models``, ``data``, ``experiment``.
"""
from fedjax_gel import algorithms, core, data, models
from fedjax_gel.algorithms import ClientContext, FederatedAlgorithm, RoundInfo, fedavg, fedavgcm
from fedjax_gel.core import (Cohort, FederatedData, FederatedSplit, RoundMetrics, build_evaluate,
                             build_round, from_client_arrays, make_eval_pool, sample_cohort,
                             to_device)
from fedjax_gel.models import Model, cross_entropy_loss, get_model

__version__ = '0.1.0'

__all__ = [
    'ClientContext', 'Cohort', 'FederatedAlgorithm', 'FederatedData', 'FederatedSplit', 'Model',
    'RoundInfo', 'RoundMetrics', 'algorithms', 'build_evaluate', 'build_round', 'core',
    'cross_entropy_loss', 'data', 'fedavg', 'fedavgcm', 'from_client_arrays', 'get_model',
    'make_eval_pool', 'models', 'sample_cohort', 'to_device',
]
