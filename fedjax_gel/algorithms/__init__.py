"""Federated algorithms, each a small module composed from core + optim."""
from fedjax_gel.algorithms.base import ClientContext, FederatedAlgorithm, RoundInfo
from fedjax_gel.algorithms.fedavg import fedavg, fedavgcm

__all__ = ['ClientContext', 'FederatedAlgorithm', 'RoundInfo', 'fedavg', 'fedavgcm']
