"""The command line (``launch/run.py``): flags generated from the config's sections and the
registered algorithms' hyper-parameters (one absl flag per field, its help from the field's
metadata) and the sweep's list flags, read by ``parsing.parse``; and ``execute``, which runs
what the flags ask for and maps every user error to one line on stderr and exit status 2
(Ctrl-C: 130).

``main(argv)`` does it all on flags of its own, so that tests and notebooks can run a command
in-process.

``algorithm`` and the hyper-parameters that algorithms take several values of
(``AlgorithmSpec.variants``: ``--gbo_optimizer``) take comma-separated lists (a sweep:
``sweep.Sweep``), as do ``--seeds``, ``--client_lr_grid`` and ``--server_lr_grid``;
``--hparam_grid`` takes ``NAME:v1,v2,...``.
"""
from __future__ import annotations

import errno
import os
import re
import sys
import textwrap
import time

from absl import flags, logging

from fedjax_gel.core.backend import compilation_cache
from fedjax_gel.experiment import api, cluster, files, loop as loop_lib
from fedjax_gel.experiment import runtime as runtime_lib
from fedjax_gel.experiment import watchdog
from fedjax_gel.experiment.messages import first_line, one_line, shorter
from fedjax_gel.experiment.parsing import parse
from fedjax_gel.experiment import sweep as sweep_lib
from fedjax_gel.algorithms import registry
from fedjax_gel.data import registry as data_registry
from fedjax_gel.experiment import config as config_lib
from fedjax_gel.core.paths import shown
from fedjax_gel.spec import INT32_MAX, field_problem
from fedjax_gel.experiment.config import Config, ConfigError, parse_budget_range



def lists() -> tuple[str, ...]:
  """The flags of the config that take several values (a sweep): ``--algorithm`` and the
  registered algorithms' ``variants``."""
  return ('algorithm',) + registry.variant_flags()


DEFINE = {'str': flags.DEFINE_string, 'Optional[str]': flags.DEFINE_string,
          'int': flags.DEFINE_integer, 'float': flags.DEFINE_float,
          'Optional[float]': flags.DEFINE_float, 'bool': flags.DEFINE_bool,
          'tuple': flags.DEFINE_string}


def config_fields() -> dict:
  """``{flag: field}`` of every flag made from a field: the config's sections, then the
  registered datasets' settings and the registered algorithms' hyper-parameters."""
  return {**{k: f for k, (_, f) in config_lib.section_flag_names().items()},
          **data_registry.hparam_fields(), **registry.hparam_fields()}


def define_flags(values: flags.FlagValues = flags.FLAGS):
  """Defines every flag of ``launch/run.py`` on ``values`` (the algorithms' flags from the
  registry as it is now)."""
  listed = lists()
  flags.DEFINE_string('workdir', None, 'Output directory (default: '
                      'runs/<algorithms>_<dataset>_<digest of the settings>: the same command, the '
                      'same folder).', flag_values=values)
  flags.DEFINE_bool('overwrite', False, 'Replace the outputs of an earlier run in --workdir.',
                    flag_values=values)
  flags.DEFINE_bool('plots', True, 'Write plots/*.png with report.md (and a grid\'s heat map; '
                    'needs matplotlib). --noplots: report.md and the metrics alone, e.g. for '
                    'many short commands compared later (python -m fedjax_gel.report).',
                    flag_values=values)
  flags.DEFINE_string('compilation_cache', compilation_cache.default_dir(),
                      "Folder of JAX's persistent compilation cache (compiled programs reused "
                      'by later processes); empty: off. Default '
                      f'${compilation_cache.ENV} if set, else the user cache folder.',
                      flag_values=values)
  for name, field in config_fields().items():
    help_text = field.metadata['help']
    if name == 'algorithm':
      help_text += f' Registered: {", ".join(registry.names())}.'
    if name in listed:
      flags.DEFINE_list(name, [field.default], help_text, flag_values=values)
    elif name == 'budget_range':
      flags.DEFINE_string(name, '%d,%d' % field.default, help_text, flag_values=values)
    else:
      kind = field.type if isinstance(field.type, str) else field.type.__name__
      DEFINE[kind](name, field.default, help_text, flag_values=values)
  flags.DEFINE_alias('algorithms', 'algorithm', flag_values=values)
  flags.DEFINE_list('seeds', [], 'Several seeds (overrides --seed): every algorithm runs with '
                    'each, paired, into WORKDIR/seed<S>/; a table of rounds to target ends the '
                    'output.', flag_values=values)
  flags.DEFINE_list('client_lr_grid', [], 'Several client learning rates: every algorithm runs '
                    'with each, and the report keeps, per algorithm, the one with the best '
                    'accuracy.', flag_values=values)
  flags.DEFINE_list('server_lr_grid', [], 'Several server learning rates: every algorithm (and '
                    'seed) trains the grid --client_lr_grid (else --client_lr) x '
                    '--server_lr_grid as one vmapped program, each cell its own model, into '
                    'WORKDIR/.../grid.json with a heat map in plots/grid.png; diverged cells are '
                    'marked.', flag_values=values)
  flags.DEFINE_string('hparam_grid', '', 'NAME:v1,v2,...: several values of a float '
                      'hyper-parameter of the algorithms (e.g. prox_mu:0.001,0.01,0.1, '
                      'client_momentum:0.5,0.9): every algorithm that has it runs with each, into '
                      'WORKDIR/.../NAME<v>/, as one program where they fit, and the report keeps '
                      'each algorithm\'s best value.', flag_values=values)
  flags.DEFINE_bool('vmap_seeds', True, 'Train the runs that differ only in seed and client '
                    'learning rate as one program vmapped over them where they fit (one device, '
                    'no per-client state or power-of-d; the same numbers as one run each).',
                    flag_values=values)
  flags.DEFINE_integer('num_processes', 1, 'Processes running this same command together (JAX '
                       "multi-process: every program spans all their devices, process 0 writes); "
                       "0: from the cluster's environment (SLURM, Open MPI, TPU pods).",
                       lower_bound=0, upper_bound=INT32_MAX, flag_values=values)
  flags.DEFINE_integer('process_id', 0, 'This process among --num_processes (0 writes).',
                       lower_bound=0, upper_bound=INT32_MAX, flag_values=values)
  flags.DEFINE_string('coordinator_address', '', "HOST:PORT of process 0's coordinator (with "
                      '--num_processes > 1).', flag_values=values)
  flags.DEFINE_integer('heartbeat_timeout', 100, 'Seconds without news from a process after '
                       'which the others stop (several processes; JAX\'s default).', lower_bound=1,
                       upper_bound=INT32_MAX, flag_values=values)
  flags.DEFINE_integer('initialization_timeout', 300, 'Seconds the processes of a run wait '
                       'for each other at the start (several processes; JAX\'s default).',
                       lower_bound=1, upper_bound=INT32_MAX, flag_values=values)
  flags.DEFINE_float('stall_timeout', 0., 'Seconds a round (its dispatch and the wait for the '
                     'round two before it) or an evaluation may wait before the run stops with '
                     f'status {watchdog.EXIT_STALLED} and one line (its last checkpoint kept: the '
                     f'same command resumes); 0: the larger of {watchdog.MIN_STALL_S:.0f} s and '
                     f'{watchdog.STALL_ROUNDS} mean rounds ({watchdog.GAP_FACTOR} times the longest '
                     f'evaluation), {watchdog.FIRST_S:.0f} s until {watchdog.MEASURED_ROUNDS} '
                     'rounds were timed. With several processes, one silent for '
                     f'{watchdog.PEER_TIMEOUT_S:.0f} s (at most half --heartbeat_timeout) stops '
                     'the others so too.', lower_bound=0., flag_values=values)


# --help's groups: the config's sections, then the command's own flags
COMMAND_FLAGS = ('workdir', 'overwrite', 'plots', 'seeds', 'client_lr_grid', 'server_lr_grid',
                 'hparam_grid', 'compilation_cache', 'stall_timeout', 'num_processes')
HELP_WIDTH = 100


def first_sentence(text: str, width: int) -> str:
  """``text``'s first sentence (more where it is a few words, e.g. a list's first item), cut
  to ``width`` characters with '...'."""
  text = ' '.join(text.split())
  cut = re.split(r'(?<=[.;])\s', text, maxsplit=1)[0].rstrip('.;')
  return shorter((text if len(cut) < 40 else cut).rstrip('.;'), width)


def overview(values: flags.FlagValues = flags.FLAGS) -> str:
  """``--help``'s listing: the main flags grouped by the config's sections, then the command's
  own, one line each with its default; the algorithms' and datasets' own settings by name
  (absl's ``--helpfull``, which the listing ends by naming, gives every flag's whole text)."""
  groups: dict[str, list[str]] = {}
  for name, (section, _) in config_lib.section_flag_names().items():
    groups.setdefault(section, []).append(name)
  groups['command'] = list(COMMAND_FLAGS)
  lines = []
  for section, names in groups.items():
    lines.append(f'\n{section}:')
    for name in names:
      flag = values[name]
      default = flag.default_as_str or "''"
      head = f'  --{name}={default.strip(chr(39))}'
      room = HELP_WIDTH - max(len(head), 34) - 2
      lines.append(f'{head:<34}  {first_sentence(flag.help, max(room, 30))}')
  own = sorted(set(registry.hparam_fields()) - set(config_lib.section_flag_names()))
  data_own = sorted(set(data_registry.hparam_fields()) - set(config_lib.section_flag_names()))
  wrap = lambda label, names: textwrap.wrap(
      f'{label}: {", ".join("--" + n for n in names)}', HELP_WIDTH, subsequent_indent='    ')
  lines += ['', *wrap('the algorithms\' own settings', own),
            *wrap('the datasets\' own settings', data_own), '']
  return '\n'.join(lines) + '\n'


def typed(flag: str, items, kind):
  """``items`` as ``kind``s, or a ConfigError naming ``--flag``."""
  try:
    return [kind(x) for x in items]
  except ValueError:
    raise ConfigError(f'--{flag} must hold {kind.__name__}s (got {shown(",".join(items))})'
                      ) from None


def from_flags(values: flags.FlagValues = flags.FLAGS) -> tuple[Config, sweep_lib.Sweep]:
  """The Config and the sweep the parsed flags ask for (not yet validated: ``sweep.expand``).

  The dataset gets its own settings from the flags, and a setting of another dataset given
  away from its default is refused (``experiment.make``). Every algorithm of ``--algorithm``
  gets its own hyper-parameters from the flags; a
  hyper-parameter flag given on the command line is checked even when no algorithm of the
  command reads it, and is not refused (``experiment.make`` refuses it): one flag file serves
  several algorithms (the quickstart's GeL flags with ``--algorithm=fedavg``)."""
  given, listed = {}, lists()
  for name in config_fields():
    value = values[name].value
    if name in listed:
      if not value:
        raise ConfigError(f'--{name} needs at least one value')
      value = value[0]
    elif name == 'budget_range':
      value = parse_budget_range(value)
    given[name] = value
  hparams = registry.hparam_fields()
  for name, field in {**data_registry.hparam_fields(), **hparams}.items():
    problem = values[name].present and field_problem(field, given[name])
    if problem:
      raise ConfigError(problem)
  sections = {k: v for k, v in given.items() if k not in hparams and k != 'algorithm'}
  configs = []
  for name in values.algorithm:
    own = config_lib.hparam_flags(name)
    configs.append(config_lib.make(**sections, algorithm=name, **{k: given[k] for k in own}))
  seeds = typed('seeds', values.seeds, int)
  for seed in seeds:
    problem = config_lib.seed_range('seeds', seed)
    if problem:
      raise ConfigError(problem)
  sweep = sweep_lib.Sweep(
      seeds=seeds,
      algorithms=[x.algorithm for x in configs],
      variants={name: list(values[name].value) for name in listed if name != 'algorithm'},
      client_lrs=typed('client_lr_grid', values.client_lr_grid, float),
      server_lrs=typed('server_lr_grid', values.server_lr_grid, float),
      hparam_grid=hparam_grid(values.hparam_grid))
  return configs[0], sweep


def hparam_grid(text: str) -> tuple:
  """``--hparam_grid``'s ``NAME:v1,v2,...`` as ``(NAME, [v1, v2, ...])``; ``()`` when empty."""
  if not text:
    return ()
  name, colon, values = text.partition(':')
  if not colon or not name.strip() or not values.strip():
    raise ConfigError(f'--hparam_grid must be NAME:v1,v2,... (got {text!r})')
  return name.strip(), typed('hparam_grid', values.split(','), float)


def fail(message: str) -> int:
  """One line ``error: message`` on stderr; exit status 2."""
  print(f'error: {one_line(message)}', file=sys.stderr)
  return 2


def leaving(code: int, watch, runtime: runtime_lib.Runtime) -> int:
  """``code``, once a refusal or a stop every process shares has left JAX's runtime with the
  others (``Runtime.leave``); ``watch`` (the command's ``watchdog.Watchdog``) has told them
  first that this process is done: once it left, the coordinator may be gone, and a call to it
  ends the process (status 134)."""
  watch.finish('done')
  runtime.leave()
  return code


def fail_together(message: str, watch, runtime: runtime_lib.Runtime) -> int:
  """``fail`` before the runs' first collective, the other processes told
  (``Runtime.stop_others``)."""
  runtime.stop_others(message)
  return leaving(fail(message), watch, runtime)


def interrupted(e: KeyboardInterrupt) -> int:
  """Ctrl-C: one line saying where the runs stand and how to go on; exit status 130."""
  done = getattr(e, 'round', None)   # loop.Interrupted: stopped between rounds
  where = f' after round {done}, with a checkpoint of it' if done is not None else ''
  print(f'interrupted{where}: run the same command to continue (finished runs are kept, '
        'the others resume from their last checkpoint)', file=sys.stderr)
  return 130


def os_error(e: OSError) -> str:
  """One line for a failed read or write: the file, the reason, what to do."""
  where = (shown(files.target_of(os.fsdecode(e.filename)))
           if isinstance(e.filename, (str, bytes)) else e.filename or 'a file')
  if e.errno in (errno.ENOSPC, errno.EDQUOT):
    return (f'{where}: no space left on the device; free some and run the same command again '
            '(it resumes from the last checkpoint, which a full disk never damages)')
  if e.errno == errno.ELOOP:
    return (f'{where} is a symbolic link; fedjax_gel writes only regular files in its work '
            'directory: remove it and run the same command again')
  return f'{where}: {e.strerror or e}'


def out_of_memory(e: BaseException) -> str | None:
  """One line for XLA running out of memory (a ``jax.errors.JaxRuntimeError`` whose message
  starts with ``RESOURCE_EXHAUSTED``, compiling or running a program): what to lower; None for
  any other error."""
  import jax  # pylint: disable=g-import-not-at-top
  if not isinstance(e, jax.errors.JaxRuntimeError) or not str(e).startswith('RESOURCE_EXHAUSTED'):
    return None
  return (f'XLA ran out of memory ({shorter(first_line(e), 120)}); lower --chunk_size '
          '(clients trained at once) or --device_memory_gb (the memory chunks are planned for) '
          'and run the command again (it resumes from the last checkpoint), or lower '
          '--clients_per_round (another run)')


def check_command(values: flags.FlagValues, argv):
  """The command line's own rules beyond each flag's check: no stray arguments, a named
  ``--workdir`` where one is given or several processes share it; else a ConfigError."""
  if len(argv) > 1:
    raise ConfigError(f'unexpected arguments: {" ".join(map(shown, argv[1:]))}')
  if values['workdir'].present and not values.workdir:   # e.g. --workdir=$OUT, OUT unset
    raise ConfigError('--workdir is empty: name a folder, or leave the flag out for the default '
                      'runs/<algorithms>_<dataset>_<digest>/')
  if values.num_processes != 1 and not values.workdir:   # a default name is each one's clock
    raise ConfigError(f'--num_processes={values.num_processes} needs --workdir: every process '
                      'must name the same work directory')


def execute(values: flags.FlagValues, argv, runtime: runtime_lib.Runtime,
            start: float | None = None) -> int:
  """Runs the parsed flags' experiments as ``runtime`` (the process's ``runtime.Runtime``);
  returns the exit status. ``start``: the process' ``time.perf_counter()`` before its imports
  (the ``imports`` phase)."""
  logging.set_verbosity(logging.ERROR)   # keep JAX's and TFDS's notices off stderr
  try:
    check_command(values, argv)
  except ConfigError as e:
    return fail(str(e))
  from fedjax_gel.core.backend.xla import configure_cpu  # pylint: disable=g-import-not-at-top
  try:   # before JAX starts its backends
    cluster.initialize(values.coordinator_address, values.num_processes, values.process_id,
                       values.heartbeat_timeout, values.initialization_timeout)
  except ValueError as e:
    return fail(str(e))
  watchdog.defer_xla_abort(values.stall_timeout)   # the watchdog names a stalled round
  configure_cpu()   # before JAX starts: each CPU core a device of the mesh, small loops fused
  runtime.share_stops()   # several processes: a stop signal stops them all, at one round
  watch = watchdog.for_command(values.stall_timeout, values.heartbeat_timeout)
  code = None
  try:
    code = run_command(values, start, watch, runtime)
    return code
  finally:   # a process that ends alone tells the others (they stop too); one that ends with
    # them told them so already (``leaving``, the end of ``run_command``): a no-op then
    ended = 'on an error' if code is None else f'with exit status {code}'
    watch.finish('stopped', f'it ended {ended} (its own line says why)')


def run_command(values: flags.FlagValues, start: float | None, watch,
                runtime: runtime_lib.Runtime) -> int:
  """``execute`` once the processes have joined and JAX is set up: the runs, and the exit
  status of how they ended (``watch``: the command's ``watchdog.Watchdog``)."""
  try:
    compilation_cache.enable(values.compilation_cache)
  except OSError as e:
    why = ('a file, not a folder' if os.path.isfile(values.compilation_cache) else
           e.strerror or e)
    if values['compilation_cache'].present:
      return fail_together(f'--compilation_cache={values.compilation_cache}: cannot use it as the '
                           f'compilation cache ({why})', watch, runtime)
    print(f'note: no compilation cache in {values.compilation_cache} ({why}); every program is '
          'compiled afresh')
  from fedjax_gel.data.errors import DataError  # pylint: disable=g-import-not-at-top
  phases = loop_lib.Phases(imports=time.perf_counter() - start if start else 0.)
  stops = runtime.stop
  try:
    with runtime.telling_others():
      config, sweep = from_flags(values)
      if stops:   # a stop while starting (launch/run.py), or one whose KeyboardInterrupt was lost
        raise KeyboardInterrupt
    api.run(config, values.workdir, sweep, overwrite=values.overwrite, vmap=values.vmap_seeds,
            plots=values.plots, phases=phases, callbacks=[watch], runtime=runtime)
  except (ConfigError, DataError) as e:   # a refusal every process shares
    return leaving(fail(str(e)), watch, runtime)
  except KeyboardInterrupt as e:   # a stop every process shares (told, or agreed after a round)
    return leaving(interrupted(e), watch, runtime)
  except OSError as e:   # the disk, permissions, a link planted mid-run: one line
    return fail(os_error(e))
  except Exception as e:  # pylint: disable=broad-except
    if oom := out_of_memory(e):   # XLA's RESOURCE_EXHAUSTED: one line, what to lower
      return fail(oom)
    if stops:   # a KeyboardInterrupt turned into another error where it landed (an import)
      return interrupted(KeyboardInterrupt())
    if not runtime.lost_peer(e):
      raise
    print(f'error: process {values.process_id} lost the other processes of the run '
          f'({first_line(e)}); it stops: start every process again with the same command to '
          f'resume {watchdog.resume_from(watch.workdirs)}', file=sys.stderr)
    return watchdog.EXIT_STALLED
  if stops:   # asked to stop in a run's last round, or while writing the report
    return leaving(interrupted(KeyboardInterrupt()), watch, runtime)
  watch.finish('done')   # while every process is still here (see ``leaving``)
  runtime.sync('finished')   # process 0, the coordinator, ends last
  if runtime.writes:
    total = f', total {time.perf_counter() - start:.1f} s' if start else ''
    print(f'all runs: {phases.line()}{total}', file=sys.stderr)
  return 0


def check_only(values: flags.FlagValues, argv) -> int:
  """absl's ``--only_check_args`` ("validate args and exit"): every check of the command line
  that needs neither the data nor the work directory (``check_command``,
  ``sweep.checked_configs``); one line and status 2 for the first problem, else a line naming
  the runs and status 0. Nothing is read or written and JAX's backends are not started."""
  try:
    check_command(values, argv)
    configs = sweep_lib.checked_configs(*from_flags(values))
  except ConfigError as e:
    return fail(str(e))
  print(f'the flags are valid: {len(configs)} run{"s" * (len(configs) != 1)} '
        f'({", ".join(dict.fromkeys(x.run_name for x in configs))}); the data and the work '
        'directory were not checked')
  return 0


def main(argv) -> int:
  """``launch/run.py argv[1:]`` in this process, on flags of its own; the exit status."""
  values = flags.FlagValues()
  define_flags(values)
  try:
    rest = parse(argv, values)
  except ConfigError as e:
    return fail(str(e))
  runtime = runtime_lib.Runtime()
  return guarded(runtime, execute, values, rest, runtime)


def guarded(runtime: runtime_lib.Runtime, fn, *args) -> int:
  """``fn(*args)``'s exit status, with a Ctrl-C or SIGTERM before or after the rounds
  (imports, flags, data, compilation) one line too (``Runtime.guarding``; the rounds defer
  both: ``Runtime.deferring``)."""
  with runtime.guarding():
    try:
      return fn(*args)
    except KeyboardInterrupt as e:
      return interrupted(e)
