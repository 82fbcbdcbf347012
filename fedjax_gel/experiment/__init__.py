"""Experiments: ``run(config, workdir)`` trains and writes what a ``Config`` (and a ``Sweep``)
asks for, as one process of a command (``Runtime``: its stop token, writer and agreements
between processes); the loop, its callbacks and sinks, the planner and the work directory
behind it."""
from fedjax_gel.experiment.api import run
from fedjax_gel.experiment.config import Config, ConfigError, make
from fedjax_gel.experiment.validation import validate
from fedjax_gel.experiment.runtime import Runtime
from fedjax_gel.experiment.sweep import Sweep, expand

__all__ = ['Config', 'ConfigError', 'Runtime', 'Sweep', 'expand', 'make', 'run', 'validate']
