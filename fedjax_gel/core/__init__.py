"""The engine: the algorithm interface, data pools, samplers, the jitted round, evaluation.

``FederatedAlgorithm`` (with ``ClientContext`` and ``RoundInfo``) is what an algorithm is;
``FederatedData`` the flat example pool (``from_client_arrays``, ``to_device``); ``CohortSpec``
and ``sample_cohort`` draw a round's clients and budgets; ``build_round`` compiles a round
(``Backend``: how) and ``build_evaluate`` the evaluation over a ``make_eval_pool`` pool.
"""
from fedjax_gel.core.algorithm import ClientContext, FederatedAlgorithm, RoundInfo
from fedjax_gel.core.backend import Backend, fuse_small_dots
from fedjax_gel.core.evaluation import EvalPool, build_evaluate, make_eval_pool
from fedjax_gel.core.federated_data import (FederatedData, FederatedSplit, client_examples,
                                            from_client_arrays, to_device)
from fedjax_gel.core.round import RoundMetrics, build_round
from fedjax_gel.core.sampling import (SELECTIONS, WEIGHTINGS, Cohort, CohortSpec,
                                      aggregation_weights, poisson_slots, sample_budgets,
                                      sample_clients, sample_clients_poisson, sample_cohort)
from fedjax_gel.core.shuffle import cycled_permutation

__all__ = [
    'Backend', 'ClientContext', 'Cohort', 'CohortSpec', 'EvalPool', 'FederatedAlgorithm', 'FederatedData',
    'FederatedSplit', 'RoundInfo', 'RoundMetrics', 'SELECTIONS', 'WEIGHTINGS',
    'aggregation_weights', 'build_evaluate', 'build_round', 'client_examples',
    'cycled_permutation', 'from_client_arrays', 'fuse_small_dots',
    'make_eval_pool', 'poisson_slots', 'sample_budgets', 'sample_clients',
    'sample_clients_poisson', 'sample_cohort', 'to_device',
]
