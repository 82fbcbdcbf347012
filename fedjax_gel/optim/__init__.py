"""optax-style transformations: GeL's guessed updates and the FedOpt server optimisers."""
from fedjax_gel.optim.fedopt import FedOptState, fedadagrad, fedadam, fedyogi
from fedjax_gel.optim.guessed import (PROXIES, GuessingTransformation, GuessState, SGDMState,
                                      gel_sgdm, guessing, momentum_coefficients,
                                      momentum_coefficients_l1)

__all__ = ['FedOptState', 'GuessState', 'GuessingTransformation', 'PROXIES', 'SGDMState',
           'fedadagrad', 'fedadam', 'fedyogi', 'gel_sgdm', 'guessing', 'momentum_coefficients',
           'momentum_coefficients_l1']
