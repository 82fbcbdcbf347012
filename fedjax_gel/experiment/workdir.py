"""The work directory: what a run writes and reads back (``config.json``, ``metrics.jsonl``,
``summary.json``, checkpoints), and what an earlier run there means for this one.

Everything is written whole or not at all and never through a symbolic link
(``experiment.files``); NaN and infinities (a diverged run) are written as JSON ``null``. A
finished run's ``summary.json`` holds the checksums of its ``metrics.jsonl``, ``metrics.csv``,
``model.msgpack`` and ``grid.json`` (``outputs_sha256``), of its ``config.json``'s settings
(``settings_sha256``) and of its own fields (``summary_sha256``): a finished run whose outputs,
settings or summary changed or were cut since is reported in one line, not taken for finished
or extended. A checkpoint holds the checksum of
``metrics.jsonl`` as it stood at its round (``checkpoint.check`` compares it).
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil

import numpy as np

from fedjax_gel.core import paths
from fedjax_gel.experiment import checkpoint, files, validation
from fedjax_gel.experiment import config as config_lib, config_json
from fedjax_gel.experiment.config import Config, ConfigError


def check_folder(workdir: str):
  """A ``--workdir`` that cannot be a folder is a ConfigError: a file, or a symbolic link to
  nothing or round a loop."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ConfigError(f'--workdir={workdir} exists and is not a directory')
  if os.path.islink(workdir) and not os.path.exists(workdir):
    try:
      os.stat(workdir)
    except OSError as e:
      if e.errno == errno.ELOOP:
        raise ConfigError(f'--workdir={workdir} is a symbolic link that leads round a loop of '
                          'links') from None
      if e.errno != errno.ENOENT:
        raise ConfigError(f'--workdir={workdir} is a symbolic link to {os.readlink(workdir)}, '
                          f'which cannot be reached ({e.strerror})') from None
    raise ConfigError(f'--workdir={workdir} is a symbolic link to {os.readlink(workdir)}, '
                      'which does not exist')


def check_workdir(workdir: str, overwrite: bool, *outputs: str):
  """Refuses to clobber an earlier run's outputs unless asked to, or to write into a file."""
  check_folder(workdir)
  for name in outputs or ('metrics.jsonl', 'summary.json'):
    if os.path.exists(os.path.join(workdir, name)) and not overwrite:
      raise ConfigError(f'--workdir={workdir} already holds a run ({name}); choose another '
                        'directory or pass --overwrite')


def run_names(workdir: str, workdirs) -> list[str]:
  """The runs' folders relative to the top ``workdir`` (``.`` for a single run), sorted."""
  return sorted({os.path.relpath(w, workdir) for w in workdirs})


def check_top(workdir: str, workdirs, overwrite: bool):
  """The top of ``workdir`` gets this command's ``report.md``, ``plots/`` and ``runs.json`` (its
  runs' folders): a ConfigError, unless ``overwrite``, when they would replace another
  command's: a single run there under a sweep's folders, or a report of runs this command
  leaves out (a command with more seeds or algorithms than the last one is fine)."""
  if overwrite or not os.path.isdir(workdir):
    return
  names = run_names(workdir, workdirs)
  if names != ['.'] and os.path.exists(os.path.join(workdir, 'config.json')):
    raise ConfigError(f'--workdir={workdir} holds a single run (config.json) whose report a '
                      'sweep would replace; choose another directory or pass --overwrite')
  listed = os.path.join(workdir, 'runs.json')
  if not os.path.exists(listed):
    return
  before = files.read_json_as(listed, list, 'is unreadable; choose another --workdir or pass '
                              '--overwrite')
  left_out = sorted(set(map(str, before)) - set(names))
  if left_out:
    raise ConfigError(f'--workdir={workdir} holds the report of runs this command leaves out '
                      f'({left_out[0]}, in {listed}); choose another directory or pass '
                      '--overwrite')


def run_status(workdir: str, c: Config, overwrite: bool, extra: dict | None = None) -> str:
  """What ``workdir`` holds for the run ``c``: ``'new'`` (nothing, or ``overwrite``),
  ``'done'`` (this run, finished: ``summary.json``), ``'resume'`` (this run, unfinished: it
  continues from its last checkpoint, or from the start without one) or ``'extend'`` (this run
  with fewer ``num_rounds``: it continues from its final state, ``extend``). A run of another
  configuration there (``c`` and the ``extra`` fields of its ``config.json``) is a ConfigError
  naming the first differing flag."""
  saved = os.path.join(workdir, 'config.json')   # absent unless workdir is a folder
  if overwrite or not os.path.exists(saved):
    check_workdir(workdir, overwrite)
    return 'new'
  before = files.read_json_as(saved, object, 'is unreadable; choose another --workdir or pass '
                              '--overwrite')
  unreadable = ConfigError(f'{saved} holds no configuration fedjax_gel can read; choose another '
                           '--workdir or pass --overwrite')
  if not before:   # {} (or [], null): every flag at its default is no run's record
    raise unreadable
  try:
    before = {**config_json.read(before).flags(), **config_json.extras(before)}
  except (TypeError, ValueError, KeyError, AttributeError):   # AttributeError: not an object
    raise unreadable from None
  now = json.loads(json.dumps({**c.flags(), **(extra or {})}))
  before = json.loads(json.dumps(before))
  # where and how the run is computed (``NOT_SETTINGS``: a run resumes under other
  # ``PLACEMENT_FLAGS``, ``placement_notes``); check_inputs' fields; the settings the run does
  # not read (an earlier version recorded them)
  ignore = (*NOT_SETTINGS, *INPUT_FIELDS, *validation.unread_flags(c))
  differ = [k for k in {**now, **before} if k not in ignore and before.get(k) != now.get(k)]
  if (differ == ['num_rounds'] and extra is None and isinstance(before['num_rounds'], int) and
      now['num_rounds'] > before['num_rounds']):
    return check_extend(workdir, before['num_rounds'])
  if ('server_lr_grid' in before) != (extra is not None):
    kind = 'a learning-rate grid' if extra is None else 'a run that is not a learning-rate grid'
    raise ConfigError(f'--workdir={workdir} already holds {kind}; choose another directory or '
                      'pass --overwrite')
  if differ:   # a raised --num_rounds alone extends: name what else differs
    k = next((d for d in differ if d != 'num_rounds'), differ[0])
    raise ConfigError(f'--workdir={workdir} already holds a run of another configuration '
                      f'(--{k}={before.get(k)} there, {now.get(k)} now); choose another '
                      'directory or pass --overwrite')
  if os.path.exists(os.path.join(workdir, 'summary.json')):
    check_finished(workdir)
    return 'done'
  return 'resume'   # its checkpoints are read by check_resume


# Flags that decide on which devices and in which chunks a round's clients run, not what they
# compute: the same run under other values sums its clients' updates in another order (the
# same numbers up to float rounding; tests/experiment/test_long_runs.py), so a run resumes or
# is extended under other values, with a note (``placement_notes``), and a finished run is
# taken as done whatever they are now.
PLACEMENT_FLAGS = ('num_devices', 'chunk_size', 'device_memory_gb')
# Flags that name where and how a run was computed, not what it computed: no difference in them
# makes another run, and reports do not list them as settings.
NOT_SETTINGS = (*PLACEMENT_FLAGS, 'tensorboard', 'checkpoint_every')


def placement_notes(workdir: str, c: Config) -> list[str]:
  """A note for each ``PLACEMENT_FLAGS`` value of ``c`` that differs from the one the run in
  ``workdir`` recorded (an unfinished run about to resume, or a finished one extended)."""
  before = files.read_json(os.path.join(workdir, 'config.json')).get('run', {})
  now = c.flags()
  return [f'{workdir}: resumed with --{k}={now[k]} (its rounds so far ran with --{k}={before[k]}); '
          'the rounds from here on sum the clients\' updates in another order, the same numbers '
          'up to float rounding' for k in PLACEMENT_FLAGS
          if isinstance(before, dict) and k in before and before[k] != now[k]]


# The fields of a run's config.json that record the digests of its inputs (SHA-256): the data
# (``federated_data.digest`` of the pools as loaded) and, with --budget_draw=per_client, the
# clients' budgets as read; each with what it names.
DATA_FIELD = 'data_sha256'
INPUT_FIELDS = {DATA_FIELD: 'data', 'client_budgets_sha256': 'client budgets'}


def input_digests(exp) -> dict:
  """The digests of a prepared experiment's inputs (``INPUT_FIELDS``): its data
  (``exp.data_sha256``), and its clients' budgets where it read them (``exp.client_budgets``)."""
  digests = {DATA_FIELD: exp.data_sha256}
  if exp.client_budgets is not None:
    digests['client_budgets_sha256'] = hashlib.sha256(
        np.ascontiguousarray(exp.client_budgets, np.int32).tobytes()).hexdigest()
  return digests


def config_record(c: Config, digests: dict, extra: dict | None = None) -> dict:
  """A run's ``config.json``: ``c``'s sections, the ``extra`` fields (a grid's) and the
  ``digests`` of its inputs (``input_digests``)."""
  return {**c.to_json(), **(extra or {}), **digests}


def input_flag(c: Config, field: str) -> str:
  """The flag that names the input whose digest is ``field``."""
  if field == DATA_FIELD:
    return c.data.flag
  return f'--client_budgets={c.cohort.client_budgets}'


def check_inputs(workdir: str, c: Config, digests: dict):
  """The run in ``workdir`` (one ``run_status`` found of ``c``'s configuration) was trained on
  the inputs of these ``digests``, else a ConfigError naming the first input's flag. A digest
  its ``config.json`` does not record (an earlier version) is taken as it is."""
  file = os.path.join(workdir, 'config.json')
  saved = files.read_json(file)
  for field, digest in digests.items():
    before = saved.get(field)
    if before is None or before == digest:
      continue
    if not isinstance(before, str):
      raise ConfigError(f'{file}: its {field} is not a digest (edited?); choose another '
                        '--workdir or pass --overwrite')
    what = INPUT_FIELDS[field]
    raise ConfigError(f'{input_flag(c, field)}: the run in {workdir} was trained on other {what} '
                      f'than these (its config.json records {field} {before[:12]!r}, the {what} '
                      f'now {digest[:12]!r}); choose another --workdir or pass --overwrite')


def record_inputs(workdir: str, config: dict):
  """A run resumed: its ``config.json`` is rewritten as ``config`` (``config_json``, whose
  fields it holds) where it lacks an input's digest (an earlier version) or recorded other
  ``PLACEMENT_FLAGS`` values; else left as it is."""
  file = os.path.join(workdir, 'config.json')
  saved = files.read_json(file)
  placed = lambda record: {k: record.get('run', {}).get(k) for k in PLACEMENT_FLAGS}
  if (any(k in config and k not in saved for k in INPUT_FIELDS) or
      placed(saved) != placed(config)):
    files.write_json(file, config)


# A finished run's outputs whose checksums its summary.json holds.
CHECKSUMMED = ('metrics.jsonl', 'metrics.csv', 'model.msgpack', 'grid.json')


def outputs_sha256(workdir: str) -> dict:
  """``{name: sha256}`` of the ``CHECKSUMMED`` outputs ``workdir`` holds."""
  return {name: files.digest(os.path.join(workdir, name)) for name in CHECKSUMMED
          if os.path.isfile(os.path.join(workdir, name))}


def settings_sha256(config) -> str:
  """SHA-256 of a ``config.json``'s fields but those naming where its inputs are
  (``config.PATH_FIELDS``: rewritten when a run and its data move), as JSON reads them."""
  config = json.loads(json.dumps(config))
  for section, name in config_lib.PATH_FIELDS:
    if isinstance(config, dict) and isinstance(config.get(section), dict):
      config[section].pop(name, None)
  return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


def summary_sha256(summary: dict) -> str:
  """SHA-256 of a ``summary.json``'s fields but ``summary_sha256`` itself, as JSON reads them."""
  fields = {k: v for k, v in json.loads(json.dumps(files.finite(summary))).items()
            if k != 'summary_sha256'}
  return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def write_summary(workdir: str, summary: dict):
  """Writes a finished run's ``summary.json`` (last: it marks the run finished) with the
  checksums of its outputs (``outputs_sha256``), of its settings (``settings_sha256``) and of
  its own fields (``summary_sha256``)."""
  summary['outputs_sha256'] = outputs_sha256(workdir)
  config = files.read_json(os.path.join(workdir, 'config.json'))
  summary['settings_sha256'] = settings_sha256(config)
  summary['summary_sha256'] = summary_sha256(summary)
  files.write_json(os.path.join(workdir, 'summary.json'), summary)


RETRAIN = 'pass --overwrite to train the run again'


def check_finished(workdir: str, remedy: str = RETRAIN):
  """A finished run's ``summary.json`` reads, its fields match their checksum and its outputs
  theirs, and its ``config.json`` its settings' (``settings_sha256``); else a ConfigError naming
  the file and ending with ``remedy``. (Summaries of versions before these checksums have none
  of them: their ``outputs_sha256`` must still be a name-to-checksum table.)"""
  file = os.path.join(workdir, 'summary.json')
  saved = files.read_json_as(file, dict, f'is damaged (unreadable or cut); {remedy}')
  own, outputs = saved.get('summary_sha256'), saved.get('outputs_sha256') or {}
  if own is not None and own != summary_sha256(saved) or not isinstance(outputs, dict):
    raise ConfigError(f'{file} changed since the run finished (its checksum does not match); '
                      f'{remedy}')
  for name, digest in outputs.items():
    if name not in CHECKSUMMED:   # an edited summary names no file outside these
      raise ConfigError(f'{os.path.join(workdir, "summary.json")} is damaged (it names '
                        f'{str(name)[:80]!r}); {remedy}')
    file = os.path.join(workdir, name)
    if not os.path.isfile(file):
      raise ConfigError(f'{file} of the finished run is missing; {remedy}')
    if files.digest(file) != digest:
      raise ConfigError(f'{file} changed since the run finished (its checksum in summary.json '
                        f'does not match); {remedy}')
  settings = saved.get('settings_sha256')
  file = os.path.join(workdir, 'config.json')
  if settings is not None and settings != settings_sha256(
      files.read_json_as(file, object, f'is unreadable; {remedy}')):
    raise ConfigError(f'{file}: its settings changed since the run finished (their checksum in '
                      f'summary.json does not match); {remedy}')


def check_resume(workdir: str, target) -> list[str]:
  """The checkpoints an unfinished run left in ``workdir`` are intact and hold states of
  ``target``'s shapes (``api.checkpoint_target``): read before anything is written, so that a
  checkpoint of another model or algorithm, or none intact, is one line
  (``checkpoint.CheckpointError``) with nothing touched. Returns notes on damaged ones."""
  return checkpoint.check(workdir, target, ('runs',))


def start(workdir: str, config_json: dict):
  """A new run's work directory: its ``config.json``, an empty ``metrics.jsonl``, and nothing
  of an earlier run there (``--overwrite``): its summary goes first, so that a kill at any
  point leaves an unfinished run of the new configuration, never the old run's outputs taken
  for the new one's."""
  for name in ('summary.json', 'grid.json', 'model.msgpack', 'report.md', 'metrics.csv'):
    if os.path.lexists(os.path.join(workdir, name)):
      os.remove(os.path.join(workdir, name))
  remove_checkpoints(workdir)
  for name in ('tensorboard', 'plots'):
    folder = os.path.join(workdir, name)
    if os.path.islink(folder):
      os.remove(folder)
    shutil.rmtree(folder, ignore_errors=True)
  files.write_json(os.path.join(workdir, 'config.json'), config_json)
  with files.open_new(os.path.join(workdir, 'metrics.jsonl')):
    pass


def check_extend(workdir: str, rounds: int) -> str:
  """``'extend'`` when the run in ``workdir`` (of ``rounds`` rounds, or those its summary says
  it ran) can go on: unfinished, or finished with its final state kept; else a ConfigError
  naming ``--num_rounds``."""
  summary = os.path.join(workdir, 'summary.json')
  if not os.path.exists(summary):
    return 'extend'
  found = files.read_json_as(summary, dict, 'is unreadable; choose another --workdir or pass '
                             '--overwrite')
  status = found.get('status', 'finished')
  # the rounds it ran: fewer than asked where a privacy budget ended it (--dp_target_epsilon)
  rounds = found.get('rounds', rounds) if isinstance(found.get('rounds'), int) else rounds
  if status != 'finished':
    raise ConfigError(f'--num_rounds: the run in {workdir} diverged and cannot be extended; '
                      'pass --overwrite to start it again')
  check_finished(workdir)   # its outputs as they were written, before any is cut or replaced
  if rounds not in checkpoint.rounds(workdir):
    raise ConfigError(f'--num_rounds: the run in {workdir} finished after {rounds} rounds '
                      'without keeping its final state (an earlier version); pass --overwrite '
                      'to start it again')
  return 'extend'


def extend(workdir: str, config: dict):
  """Makes the run in ``workdir`` an unfinished run of its ``config`` (``config_json``: more
  ``num_rounds``): its summary goes (first, so that a kill leaves an unfinished run) and its
  config is rewritten; it then resumes from its final state like any unfinished run."""
  summary = os.path.join(workdir, 'summary.json')
  if os.path.exists(summary):
    os.remove(summary)
  files.write_json(os.path.join(workdir, 'config.json'), config)


def remove_checkpoints(workdir: str, keep: int | None = None):
  """Removes a run's checkpoints but the one of round ``keep`` (a finished run's final state,
  kept so that the run can be extended); also those a kill left behind, and (``keep`` None: the
  run starts afresh) the damaged ones set aside, which a finished run keeps for inspection."""
  for r in checkpoint.rounds(workdir):
    if r != keep:
      checkpoint.remove(workdir, r)
  for left in checkpoint.leftovers(workdir):
    if keep is not None and left.endswith('.damaged'):
      continue
    if os.path.isdir(left):
      shutil.rmtree(left)
    else:
      os.remove(left)


def make_workdir(workdir: str) -> list[str]:
  """Creates the work directory; returns the folders it created, deepest last. A path that
  cannot be one is a ConfigError."""
  check_folder(workdir)
  created, folder = [], os.path.abspath(workdir)
  while not os.path.exists(folder):
    created.insert(0, folder)
    folder = os.path.dirname(folder)
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise ConfigError(f'--workdir={workdir} cannot be created: {e.strerror}') from None
  return created


def remove_if_empty(created: list[str]):
  """Removes the folders ``make_workdir`` created (deepest first) while they are empty: a
  command refused before it wrote anything leaves nothing behind."""
  for folder in reversed(created):
    try:
      os.rmdir(folder)
    except OSError:
      return


def read_metrics(workdir: str) -> list[dict]:
  """The records of ``workdir/metrics.jsonl``; a ConfigError naming the file and the first line
  that is not a JSON object."""
  path = os.path.join(workdir, 'metrics.jsonl')
  records = []
  with paths.open_regular(path) as f:   # decoded line by line: a bad byte is that line's problem
    for number, line in enumerate(f, 1):
      try:
        record = json.loads(line.decode('utf-8'))
        if not isinstance(record, dict):
          raise ValueError('not an object')
      except (ValueError, RecursionError):   # UnicodeDecodeError is a ValueError
        raise ConfigError(f'{path} line {number} is not a record (damaged?); pass --overwrite '
                          'to train the run again') from None
      records.append(record)
  return records
