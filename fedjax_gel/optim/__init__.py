"""optax-style transformations: GeL's guessed updates, FedGBO's global biased optimisers and the
FedOpt server optimisers."""
from fedjax_gel.optim.fedopt import FedOptState, fedadagrad, fedadam, fedyogi
from fedjax_gel.optim.gbo import (KINDS as GBO_KINDS, GBOStats, GlobalBiasedOptimizer, gbo,
                                  gbo_adam, gbo_rmsprop, gbo_sgdm)
from fedjax_gel.optim.guessed import (PROXIES, GuessingTransformation, GuessState, SGDMState,
                                      gel_sgdm, guessing, momentum_coefficients,
                                      momentum_coefficients_l1)

__all__ = ['FedOptState', 'GBOStats', 'GBO_KINDS', 'GlobalBiasedOptimizer', 'gbo', 'gbo_adam',
           'gbo_rmsprop', 'gbo_sgdm', 'GuessState', 'GuessingTransformation', 'PROXIES', 'SGDMState',
           'fedadagrad', 'fedadam', 'fedyogi', 'gel_sgdm', 'guessing', 'momentum_coefficients',
           'momentum_coefficients_l1']
