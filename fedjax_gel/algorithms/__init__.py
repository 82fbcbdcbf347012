"""Federated algorithms, each a small module of pure functions the engine composes."""
from fedjax_gel.algorithms.base import ClientContext, FederatedAlgorithm, RoundInfo
from fedjax_gel.algorithms.fedavg import fedavg, fedavgcm

__all__ = ['ClientContext', 'FederatedAlgorithm', 'RoundInfo', 'fedavg', 'fedavgcm']
