"""Federated algorithms, each a small module of pure functions the engine composes."""
from fedjax_gel.algorithms.base import ClientContext, FederatedAlgorithm, RoundInfo
from fedjax_gel.algorithms.drift import adabest, feddyn, scaffold
from fedjax_gel.algorithms.fedavg import fedavg, fedavgcm, local_sgd
from fedjax_gel.algorithms.fedexp import fedexp
from fedjax_gel.algorithms.fedmax import fedmax
from fedjax_gel.algorithms.fednova import fednova
from fedjax_gel.algorithms.fedvarp import fedvarp
from fedjax_gel.algorithms.gbo import fedgbo, mfl, mime
from fedjax_gel.algorithms.fedprox import fedprox
from fedjax_gel.algorithms.gel import fedavg_gel, gel

__all__ = ['ClientContext', 'FederatedAlgorithm', 'RoundInfo', 'adabest', 'fedavg', 'fedavg_gel',
           'fedavgcm', 'feddyn', 'fedexp', 'fedgbo', 'fedmax', 'fednova', 'fedprox', 'fedvarp', 'gel',
           'local_sgd', 'mfl', 'mime', 'scaffold']
