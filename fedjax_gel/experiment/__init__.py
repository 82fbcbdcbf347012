"""Experiments: ``run(config, workdir)`` trains and writes what a ``Config`` (and a ``Sweep``)
asks for; the loop, its callbacks and sinks, the planner and the work directory behind it."""
from fedjax_gel.experiment.api import Sweep, expand, run
from fedjax_gel.experiment.config import Config, ConfigError, make, validate

__all__ = ['Config', 'ConfigError', 'Sweep', 'expand', 'make', 'run', 'validate']
