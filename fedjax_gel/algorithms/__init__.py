"""Federated algorithms, each a small module of pure functions the engine composes."""
from fedjax_gel.core.algorithm import ClientContext, FederatedAlgorithm, RoundInfo
from fedjax_gel.algorithms.drift import adabest, feddyn, scaffold
from fedjax_gel.algorithms.fedavg import fedavg, fedavgcm, local_sgd
from fedjax_gel.algorithms.fedexp import fedexp
from fedjax_gel.algorithms.fedmax import fedmax
from fedjax_gel.algorithms.fednova import fednova, fednova_gel
from fedjax_gel.algorithms.fedvarp import fedvarp
from fedjax_gel.algorithms.gbo import fedgbo, mfl, mime
from fedjax_gel.algorithms.fedprox import fedprox, fedprox_gel
from fedjax_gel.algorithms.gel import GUESS_POLICIES, GuessPolicy, fedavg_gel, gel

__all__ = ['ClientContext', 'FederatedAlgorithm', 'GUESS_POLICIES', 'GuessPolicy', 'RoundInfo',
           'adabest', 'fedavg', 'fedavg_gel', 'fedavgcm', 'feddyn', 'fedexp', 'fedgbo', 'fedmax',
           'fednova', 'fednova_gel', 'fedprox', 'fedprox_gel', 'fedvarp', 'gel', 'local_sgd', 'mfl',
           'mime', 'scaffold']
