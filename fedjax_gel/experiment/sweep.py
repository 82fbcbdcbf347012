"""A command's runs: ``expand`` turns a ``Config`` and a ``Sweep`` (seeds, algorithms, their
variants, learning rates, one hyper-parameter's values) into one validated ``Config`` per run,
with every check that needs neither the data nor a work directory (``checked_configs``)."""
from __future__ import annotations

import dataclasses
import numbers
from typing import Mapping, Sequence

import numpy as np

from fedjax_gel.core import checks
from fedjax_gel.experiment import config as config_lib, grid as grid_lib
from fedjax_gel.experiment.config import Config, ConfigError, ServerConfig
from fedjax_gel.experiment.validation import OWN_SERVER, unread_flags, validate


@dataclasses.dataclass(frozen=True)
class Sweep:
  """What one invocation runs besides ``config`` itself: the command line's list flags.

  Every algorithm (once per value of each of its ``AlgorithmSpec.variants`` in ``variants``:
  the FedGBO family once per global optimiser) with every seed and client learning rate (or
  every value of ``hparam_grid``'s hyper-parameter); ``server_lrs`` make each of those a
  ``client_lrs x server_lrs`` grid (``experiment.grid``). An empty field: the config's value.

  Attributes:
    seeds: the runs' seeds (whole numbers).
    algorithms: the algorithms, by name or as ``AlgorithmConfig`` (with hyper-parameters of
      their own).
    variants: ``{flag: values}`` of hyper-parameters that algorithms take several values of
      (``AlgorithmSpec.variants``): ``{'gbo_optimizer': ['sgdm', 'adam']}`` runs each algorithm
      of the FedGBO family twice.
    client_lrs: the clients' learning rates, one run each (a grid's rows with ``server_lrs``).
    server_lrs: the server's learning rates, a grid's columns.
    hparam_grid: ``(flag, values)``: a float hyper-parameter of the algorithms
      (``config.batched_flags``), one run per value for each algorithm that has it, the runs
      of one algorithm one program where they fit; the report keeps each algorithm's best
      value, as with ``client_lrs``.

  Raises:
    ConfigError: a field that is no list (or, for ``variants``, no map of lists), or seeds and
      learning rates that are no numbers.

  Examples:
    >>> from fedjax_gel import experiment
    >>> sweep = experiment.Sweep(seeds=[0, 1], algorithms=['fedavgcm', 'gel'])
    >>> runs = experiment.expand(experiment.make(num_rounds=10), sweep)
    >>> [(c.run.seed, c.algorithm.name) for c in runs]
    [(0, 'fedavgcm'), (0, 'gel'), (1, 'fedavgcm'), (1, 'gel')]
  """
  seeds: Sequence[int] = ()
  algorithms: Sequence = ()
  variants: Mapping[str, Sequence] = dataclasses.field(default_factory=dict)
  client_lrs: Sequence[float] = ()
  server_lrs: Sequence[float] = ()
  hparam_grid: tuple = ()

  def __post_init__(self):
    if not isinstance(self.variants, Mapping) or not all(
        checks.is_listed(v) for v in self.variants.values()):
      raise ConfigError(f'Sweep: variants must map flags to lists, got {self.variants!r}')
    object.__setattr__(self, 'variants', {k: list(np.asarray(v).tolist() if isinstance(
        v, np.ndarray) else v) for k, v in self.variants.items()})
    for field in dataclasses.fields(self):
      if field.name == 'variants':
        continue
      value = getattr(self, field.name)
      if not checks.is_listed(value):
        raise ConfigError(f'Sweep: {field.name} must be a list or tuple, got {value!r}'
                          + (f' (write [{value!r}])' if isinstance(value, str) else ''))
      if isinstance(value, np.ndarray):   # NumPy's own scalars and truth values: Python's
        object.__setattr__(self, field.name, tuple(value.tolist()))
    for name, whole in (('seeds', True), ('client_lrs', False), ('server_lrs', False)):
      bad = [v for v in getattr(self, name) if isinstance(v, (bool, np.bool_)) or not (
          checks.is_whole(v) if whole else isinstance(v, numbers.Real))]
      if bad:
        raise ConfigError(f'Sweep: {name} must hold {"whole " if whole else ""}numbers, got '
                          f'{bad[0]!r}')


def expand(c: Config, sweep: Sweep = Sweep()) -> list[Config]:
  """Expands a ``Config`` and a ``Sweep`` into one validated ``Config`` per run.

  Seeds x algorithms (x their variants) x client learning rates (with ``server_lrs``, the
  client learning rates are a grid's rows, not separate runs) x ``hparam_grid``'s values.

  Args:
    c: the base ``Config``.
    sweep: the lists to run over.

  Returns:
    The runs' configs, seed by seed, then algorithm by algorithm.

  Raises:
    ConfigError: a value repeated in a list, a learning rate not positive and finite, a
      setting no run reads away from its default, or a config ``validate`` refuses.
  """
  lists = {name_of_flag(f.name): getattr(sweep, f.name) for f in dataclasses.fields(sweep)
           if f.name not in ('hparam_grid', 'variants')}   # check_hparam_grid
  for name, values in {**lists, **sweep.variants}.items():
    if name == 'algorithm':
      values = [a if isinstance(a, str) else a.name for a in values]
    if len(set(values)) != len(values):
      raise ConfigError(f'--{name} needs distinct values (got {list(values)})')
  for name in ('client_lrs', 'server_lrs'):
    if not all(0 < v < 3e38 for v in getattr(sweep, name)):   # float32 cells: about their top
      raise ConfigError(f'--{name_of_flag(name)} needs positive, finite learning rates below '
                        f'3e38 (got {",".join(map(str, getattr(sweep, name)))})')
  seeds = sweep.seeds or [c.run.seed]
  lrs = sweep.client_lrs or [c.algorithm.client_lr]
  if sweep.server_lrs:
    lrs = lrs[:1]   # the grid's rows: one program per algorithm and seed
  if len({f'{v:g}' for v in sweep.client_lrs}) != len(sweep.client_lrs):
    raise ConfigError(f'--client_lr_grid: values too close to tell apart in directory names '
                      f'(got {",".join(map(str, sweep.client_lrs))})')
  variants = read_variants([validate(x) for a in (sweep.algorithms or [c.algorithm])   # a
                            for x in algorithm_variants(c, a, sweep)])   # typo's error first
  check_hparam_grid(sweep, variants)
  return [validate(y) for s in seeds for x in variants for lr in lrs
          for y in hparam_variants(x.replace(seed=s, client_lr=lr), sweep)]


def read_variants(configs: list[Config]) -> list[Config]:
  """A setting away from its default that no run of the command reads
  (``validation.unread_flags``: another dataset's, another server optimiser's, ...) is a
  ConfigError naming it: it would change nothing, and the runs' records listed it as if it had.
  One flag file serves several algorithms and datasets, so a setting one run reads is kept, and
  recorded as given by the others (``--client_momentum=0`` for FedProx beside FedAvg); the server
  optimiser's flags go to the algorithms that apply one, those with a server step of their own
  (FedDyn, AdaBest, FedExP, the FedGBO family) run with the flags' defaults, which their
  ``config.json`` records."""
  unread = [unread_flags(x) for x in configs]
  first = configs[0]
  fields, values = config_lib.flag_fields(first), first.flags()
  for flag, why in unread[0].items():
    value = values[flag]
    if value != fields[flag].default and all(flag in u for u in unread):
      if all(u[flag] == OWN_SERVER.format(f'--algorithm={x.algorithm.name}')
             for x, u in zip(configs, unread)):   # one line for the algorithms together
        names = ','.join(dict.fromkeys(x.algorithm.name for x in configs))
        why = OWN_SERVER.format(f'--algorithm={names}')
      raise ConfigError(f'--{flag}={value}: {why}; drop the flag')
  default = ServerConfig()
  return [dataclasses.replace(x, server=default) if x.spec.own_server else x for x in configs]


def hparam_variants(c: Config, sweep: Sweep) -> list[Config]:
  """``c`` once per value of ``sweep.hparam_grid`` when its algorithm reads that flag."""
  if not sweep.hparam_grid or sweep.hparam_grid[0] not in config_lib.tunable_flags(c):
    return [c]
  flag, values = sweep.hparam_grid
  return [c.replace(**{flag: v}) for v in values]


def tuned_flag(sweep: Sweep) -> str | None:
  """The flag of ``sweep.hparam_grid`` when it holds several values."""
  return sweep.hparam_grid[0] if sweep.hparam_grid and len(sweep.hparam_grid[1]) > 1 else None


def check_hparam_grid(sweep: Sweep, configs: list[Config]):
  """``--hparam_grid``: a float hyper-parameter that some algorithm of the command reads,
  distinct finite values, and no other grid beside it (ConfigError otherwise; ``tunable_flags``)."""
  if not sweep.hparam_grid:
    return
  if len(sweep.hparam_grid) != 2 or not checks.is_listed(sweep.hparam_grid[1]) or not len(
      sweep.hparam_grid[1]):
    raise ConfigError(f'Sweep: hparam_grid must be (flag, values) with at least one value, '
                      f'got {sweep.hparam_grid!r}')
  flag, values = sweep.hparam_grid
  if flag in ('client_lr', 'server_lr'):
    raise ConfigError(f'--hparam_grid={flag}: use --{flag}_grid')
  if sweep.client_lrs or sweep.server_lrs:
    raise ConfigError('--hparam_grid: one grid at a time (not with --client_lr_grid or '
                      '--server_lr_grid)')
  if not any(flag in config_lib.tunable_flags(x) for x in configs):
    names = ','.join(dict.fromkeys(x.algorithm.name for x in configs))
    raise ConfigError(f'--hparam_grid: --{flag} is no float hyper-parameter of '
                      f'--algorithm={names}')
  if len({f'{v:g}' for v in values}) != len(values) or not all(-3e38 < v < 3e38 for v in values):
    raise ConfigError(f'--hparam_grid={flag}: needs distinct finite values, told apart by their '
                      f'directory names (got {",".join(map(str, values))})')


def algorithm_variants(c: Config, algorithm, sweep: Sweep) -> list[Config]:
  """``c`` with ``algorithm`` (a name: its hyper-parameters shared with ``c``'s algorithm
  kept, the others their defaults; or an ``AlgorithmConfig``), once per value of each of
  ``sweep.variants`` that its spec takes several values of (``AlgorithmSpec.variants``: the
  FedGBO family's global optimiser)."""
  if isinstance(algorithm, str):
    c = c.replace(algorithm=algorithm)
  else:
    c = dataclasses.replace(c, algorithm=algorithm)
  configs = [c]
  for flag, values in sweep.variants.items():
    if values and flag in c.spec.variants:
      configs = [x.replace(**{flag: v}) for x in configs for v in values]
  return configs


def name_of_flag(field: str) -> str:
  return {'seeds': 'seeds', 'algorithms': 'algorithm', 'client_lrs': 'client_lr_grid',
          'server_lrs': 'server_lr_grid', 'hparam_grid': 'hparam_grid'}[field]


def checked_configs(c: Config, sweep: Sweep = Sweep()) -> list[Config]:
  """``expand``, and with a server learning-rate grid each run's grid check: every check that
  needs neither the data nor a work directory (``--only_check_args`` runs these only)."""
  configs = expand(c, sweep)
  if sweep.server_lrs:
    for x in configs:
      grid_lib.check_grid(x)
  return configs
