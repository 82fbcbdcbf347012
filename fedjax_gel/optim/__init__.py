"""optax transformations: GeL's guessed updates, FedGBO's optimisers, FedOpt's servers.

GeL's guessed updates (Boukhari et al. 2023, GeL: ``gel_sgdm``, ``guessing``, ``guess``), FedGBO's
global biased optimisers (Mills et al. 2022, FedGBO: ``gbo_sgdm``, ``gbo_rmsprop``, ``gbo_adam``)
and the FedOpt server optimisers (Reddi et al. 2021, Adaptive Federated Optimization: ``fedadam``,
``fedyogi``, ``fedadagrad``). Every factory returns an ``optax.GradientTransformationExtraArgs``
(learning rates may be optax schedules), usable in any JAX training loop and inside optax's
combinators. Guessed steps are taken by ``guess(opt_state, params, count)``, which finds the GeL
state wherever it sits.
"""
from fedjax_gel.optim.fedopt import FedOptState, fedadagrad, fedadam, fedyogi
from fedjax_gel.optim.gbo import (KINDS as GBO_KINDS, GBOAdaptiveState, GBOCountState,
                                  GBOServerState, GBOStats, GlobalBiasedOptimizer, gbo, gbo_adam,
                                  gbo_adaptive, gbo_client, gbo_inverse, gbo_rmsprop, gbo_server,
                                  gbo_sgdm, gbo_track)
from fedjax_gel.optim.guess_replay import MAX_INFINITE_GUESSES
from fedjax_gel.optim.guess_wrappers import GuessRefusedError
from fedjax_gel.optim.guessed import (PROXIES, GeLSGDMState, GuessState, NoGuessStateError,
                                      check_guessable, gel_sgdm, guess, guessing,
                                      has_guess_state, momentum_coefficients,
                                      momentum_coefficients_l1)

__all__ = [
    'FedOptState', 'GBOAdaptiveState', 'GBOCountState', 'GBOServerState', 'GBOStats', 'GBO_KINDS',
    'GeLSGDMState', 'GlobalBiasedOptimizer', 'GuessRefusedError', 'GuessState',
    'MAX_INFINITE_GUESSES', 'NoGuessStateError', 'PROXIES', 'check_guessable', 'fedadagrad',
    'fedadam', 'fedyogi', 'gbo', 'gbo_adam', 'gbo_adaptive', 'gbo_client', 'gbo_inverse',
    'gbo_rmsprop', 'gbo_server', 'gbo_sgdm', 'gbo_track', 'gel_sgdm', 'guess', 'guessing',
    'has_guess_state', 'momentum_coefficients', 'momentum_coefficients_l1',
]
