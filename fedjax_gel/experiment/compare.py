"""One report over finished runs made by separate commands (``python -m fedjax_gel.report``).

Every folder under the given directories that holds a finished run (``config.json`` and
``summary.json``, which a run writes last) is read. The runs must be comparable: the same data
(every ``DataConfig`` setting), model and target (of the model's main metric); the settings in which they differ
(algorithms, seeds, learning rates, budgets, ...) are listed in the report's settings table;
input files are compared by content, not by path: runs whose ``config.json`` record the digest
of an input (``workdir.INPUT_FIELDS``: the data, the clients' budgets) must share it, wherever
the file was read from. A
run that is there twice (the same algorithm, seed, client learning rate and grid value) is
refused, as are grids (``grid.json``; their ``report.md`` is their own). The report is the one a
single command over the same runs writes: ``report.md`` (title, settings, the tables) and
``plots/``, with links to every run's config.
"""
from __future__ import annotations

import json
import os
import sys

from fedjax_gel import spec as spec_lib
from fedjax_gel.core import paths
from fedjax_gel.core.paths import shown
from fedjax_gel.experiment import config as config_lib, config_json
from fedjax_gel.experiment import files, outputs, validation, workdir as workdir_lib
from fedjax_gel.experiment.config import Config, ConfigError
from fedjax_gel.experiment.messages import first_line
from fedjax_gel.experiment.report import CLIENT_SPREAD
from fedjax_gel.core.tasks import Metric


def find_runs(directory: str) -> list[str]:
  """The finished runs' folders under ``directory`` (itself included), sorted."""
  if not os.path.isdir(directory):
    what = 'no such directory' if not os.path.exists(directory) else 'not a directory'
    raise ConfigError(f'{shown(directory)}: {what}')
  found = []
  for root, dirs, names in os.walk(directory):
    dirs.sort()
    if 'grid.json' in names:
      raise ConfigError(f'{root}: a learning-rate grid; its own report.md compares its cells')
    if 'summary.json' in names and 'config.json' in names:
      found.append(root)
  if not found:
    raise ConfigError(f'{directory}: no finished run (a folder with config.json and '
                      'summary.json) under it')
  return found


# what a report says of a finished run whose files changed: it cannot retrain it
LEAVE_OUT = 'leave the run out of the report, or train it again (launch/run.py --overwrite)'


def _number(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) <= sys.float_info.max


def _count(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _name(v) -> bool:
  return isinstance(v, str) and v.strip() != ''


def _or_null(kind: tuple) -> tuple:
  check, what = kind
  return (lambda v: v is None or check(v)), f'{what} or null'


# The kinds of value a report reads: (check, what a value must be).
NUMBER, COUNT, NAME = ((_number, 'a finite number'), (_count, 'a whole number >= 0'),
                       (_name, 'a non-empty string'))
# Every field a report reads of a run's summary.json and of each metrics.jsonl record
# (``{m}``: the name of the run's main metric): (field, whether it must be there, kind).
SUMMARY_FIELDS = (
    ('algorithm', True, NAME), ('seed', True, COUNT), ('client_lr', True, NUMBER),
    ('target_{m}', True, NUMBER), ('final_{m}', True, NUMBER), ('best_{m}', True, NUMBER),
    ('rounds_to_target', True, _or_null(COUNT)), ('status', False, NAME),
    ('diverged_round', False, _or_null(COUNT)),
    *((f'final_client_{{m}}_{k}', False, _or_null(NUMBER)) for k in CLIENT_SPREAD))
RECORD_FIELDS = (
    ('round', True, COUNT), ('test_{m}', True, NUMBER), ('train_loss', True, _or_null(NUMBER)),
    *((k, True, NUMBER) for k in ('grad_computations', 'bytes_up', 'bytes_down',
                                  'client_rounds')),
    ('client_distance', True, _or_null(NUMBER)))   # null unless --client_distance


def metric_of(summary: dict) -> Metric:
  """The summary's ``metric`` (absent: accuracy), which names its other fields; a ValueError
  saying what it must be when it is not an object of a ``name`` (an identifier) and
  ``higher_is_better`` (true or false)."""
  m = summary.get('metric', {})
  if not (isinstance(m, dict) and set(m) <= {'name', 'higher_is_better'} and
          isinstance(m.get('name', ''), str) and m.get('name', 'accuracy').isidentifier() and
          isinstance(m.get('higher_is_better', True), bool)):
    raise ValueError("its field 'metric' must be an object of a name and higher_is_better "
                     f'(got {shorter_json(m)})')
  return Metric(**m)


def fields_problem(obj, fields: tuple, metric: str) -> str | None:
  """The first of ``fields`` (``SUMMARY_FIELDS``, ``RECORD_FIELDS``) that ``obj`` lacks
  (where it must be there) or holds of another kind, in words (``no 'seed'``, ``its field
  'seed' must be ...``); None when every one is right."""
  if not isinstance(obj, dict):
    return f'not a JSON object (got {shorter_json(obj)})'
  for name, required, (check, what) in fields:
    key = name.format(m=metric)
    if key not in obj:
      if required:
        return f'no {key!r}'
    elif not check(obj[key]):
      return f'its field {key!r} must be {what} (got {shorter_json(obj[key])})'
  return None


def shorter_json(value, width: int = 60) -> str:
  """``value`` as JSON on one line, cut to ``width`` characters (an error line quotes it)."""
  text = json.dumps(value, default=str)
  return text if len(text) <= width else text[:width - 3] + '...'


def check_results(run_dir: str, summary, records: list):
  """The schema check of what a report reads of a finished run: its summary and each metric
  record hold every field of ``SUMMARY_FIELDS`` and ``RECORD_FIELDS`` that must be there,
  each of its kind; else a ConfigError naming the file (and line) and the field."""
  file = shown(os.path.join(run_dir, 'summary.json'))
  try:
    problem = fields_problem(summary, (), '')   # a JSON object, first
    metric = None if problem else metric_of(summary).name
  except ValueError as e:
    problem = str(e)
  problem = problem or fields_problem(summary, SUMMARY_FIELDS, metric)
  if problem:
    raise ConfigError(f'{file}: not the summary of a finished run fedjax_gel can report '
                      f'({problem}); {LEAVE_OUT}')
  file = shown(os.path.join(run_dir, 'metrics.jsonl'))
  if not records:
    raise ConfigError(f'{file}: no records; {LEAVE_OUT}')
  for number, record in enumerate(records, 1):
    problem = fields_problem(record, RECORD_FIELDS, metric)
    if problem:
      raise ConfigError(f'{file} line {number}: not a record fedjax_gel can report ({problem}); '
                        f'{LEAVE_OUT}')


def load_run(run_dir: str) -> tuple[Config, dict, list[dict], dict]:
  """``(config, summary, metric records, input digests)`` of a finished run (``{field: digest}``
  of the ``workdir.INPUT_FIELDS`` its ``config.json`` records); a ConfigError naming the file that
  is not a regular file (``files.check_outputs``), cannot be read, changed since the run
  finished (``workdir.check_finished``: the checksums the run recorded), whose settings are not
  of their fields' types, or that lacks a field the report reads or holds it of another kind
  (``check_results``)."""
  files.check_outputs(run_dir)   # a named pipe among them would be waited on forever
  workdir_lib.check_finished(run_dir, LEAVE_OUT)
  parts = {}
  for name in ('config.json', 'summary.json', 'metrics.jsonl'):
    path = os.path.join(run_dir, name)
    try:
      parts[name] = (workdir_lib.read_metrics(run_dir) if name == 'metrics.jsonl' else
                     files.read_json(path))
    except OSError as e:
      raise ConfigError(f'{shown(path)}: cannot be read ({e.strerror})') from None
    except ConfigError:   # read_metrics': the line that is not a record
      raise
    except (ValueError, RecursionError):
      raise ConfigError(f'{shown(path)}: not valid JSON (damaged?)') from None
  try:
    config = config_json.read(parts['config.json'])
    found = [p for r in [*(getattr(config, s) for s in config_lib.SECTIONS),
                         config.data.hparams, config.algorithm.hparams]
             for p in spec_lib.problems(r, checks=False)]
    if found:
      raise ConfigError(found[0])
  except (ConfigError, TypeError, ValueError, AttributeError) as e:   # Attribute: not an object
    raise ConfigError(f'{shown(os.path.join(run_dir, "config.json"))}: not a fedjax_gel config '
                      f'({first_line(e)})') from None
  summary, records = parts['summary.json'], parts['metrics.jsonl']
  check_results(run_dir, summary, records)
  digests = {f: parts['config.json'][f] for f in workdir_lib.INPUT_FIELDS
             if f in parts['config.json']}
  return config, summary, records, digests


def comparable_flags(c: Config) -> dict:
  """What runs must share to be compared, as the runs of one command do: the data section, the
  model, the cohort section (clients, budgets, batch, selection, weights), the rounds, the
  evaluations and the target (runs of 20 and 40 clients a round, or evaluated every round and
  every fifth, gave a paired speedup); not the settings the runs do not read
  (``validation.unread_flags``), nor input paths (``config.PATH_FIELDS``), compared by their
  digests (``check_comparable``)."""
  skip = {name for _, name in config_lib.PATH_FIELDS} | set(validation.unread_flags(c))
  flags = {**config_lib.section_flags(c.data), **config_lib.section_flags(c.data.hparams),
           'model': c.model.name,
           **config_lib.section_flags(c.cohort), 'num_rounds': c.run.num_rounds,
           'eval_every': c.run.eval_every,
           'eval_every_round_from': c.run.eval_every_round_from,
           'eval_every_round_until': c.run.eval_every_round_until,
           'train_eval_examples': c.run.train_eval_examples,
           'target': c.run.target}
  return {k: v for k, v in flags.items() if k not in skip}


def check_comparable(configs: list[Config], run_dirs: list[str], digests: list[dict]):
  """A ConfigError naming the first setting two runs do not share, with both values; then
  one for runs whose inputs differ (the ``digests`` their ``config.json`` records,
  ``load_run``'s; a run of an earlier version may record none)."""
  first = comparable_flags(configs[0])
  for c, w in zip(configs[1:], run_dirs[1:]):
    for flag, value in comparable_flags(c).items():
      if value != first.get(flag):
        raise ConfigError(f'the runs differ in --{flag}: {first.get(flag)!r} in {run_dirs[0]}, '
                          f'{value!r} in {w}; a report compares runs of the same data, model, '
                          'cohort, rounds, evaluations and target')
  for field, what in workdir_lib.INPUT_FIELDS.items():
    if any(field not in d for d in digests):   # a run of an earlier version: by path, then
      named = [workdir_lib.input_flag(c, field) for c in configs]
      other = next((i for i, n in enumerate(named) if n != named[0]), None)
      if other is not None:
        raise ConfigError(f'the runs differ in {named[0]} ({run_dirs[0]}) and {named[other]} '
                          f'({run_dirs[other]}), and a run of an earlier version records no '
                          f'digest of its {what}')
    recorded = [(w, d[field]) for w, d in zip(run_dirs, digests) if field in d]
    for w, d in recorded[1:]:
      if d != recorded[0][1]:
        raise ConfigError(f'the runs were trained on different {what} ({field} '
                          f'{str(recorded[0][1])[:12]!r} in {recorded[0][0]}, {str(d)[:12]!r} '
                          f'in {w}); a report compares runs of the same data, model and target')


def run_key(summary: dict) -> tuple:
  """What tells two runs of one report apart: algorithm, seed, client lr, grid value."""
  return tuple(json.dumps(v, sort_keys=True) for k, v in sorted(summary.items())
               if k in ('algorithm', 'seed', 'client_lr') or k.startswith('grid_'))


def tuned_flag(configs: list[Config]) -> str | None:
  """``'client_lr'`` when an algorithm ran with several client learning rates (the report then
  keeps each algorithm's best, as ``--client_lr_grid`` does), else None."""
  lrs = {}
  for c in configs:
    lrs.setdefault(c.run_name, set()).add(c.algorithm.client_lr)
  return 'client_lr' if any(len(v) > 1 for v in lrs.values()) else None


def check_report_dir(report_dir: str):
  """``--out`` is a folder of reports (new, or one this command wrote), not a file, a run's
  folder or a command's work directory, whose ``report.md`` and ``plots/`` are that command's;
  else a ConfigError."""
  if not report_dir.strip():
    raise ConfigError('--out is empty: name the folder for report.md and plots/')
  if os.path.exists(report_dir) and not os.path.isdir(report_dir):
    what = paths.kind_of(report_dir) or 'a file'
    raise ConfigError(f'--out={shown(report_dir)}: {what}, not a folder')
  files.check_outputs(report_dir)   # report.md or plots/ a named pipe, a link, ...
  owned = [n for n in ('runs.json', 'config.json', 'summary.json', 'grid.json')
           if os.path.exists(os.path.join(report_dir, n))]
  if owned:
    raise ConfigError(f'--out={report_dir}: the folder of a run or of a command ({owned[0]}), '
                      'whose report.md and plots/ are its own; choose another --out')
  folder = os.path.dirname(os.path.realpath(report_dir))
  while True:   # nor inside one: a run's checkpoint, plots/ or tensorboard/ folder
    has = lambda name, d=folder: os.path.exists(os.path.join(d, name))
    if has('runs.json') or has('config.json') and has('metrics.jsonl'):
      raise ConfigError(f'--out={report_dir}: inside {folder}, the folder of a run or of a '
                        'command, whose files are its own (a report in a checkpoint would '
                        'damage it); choose another --out')
    if os.path.dirname(folder) == folder:
      return
    folder = os.path.dirname(folder)


def compare(directories: list[str], report_dir: str) -> str:
  """Writes ``report_dir/report.md`` and ``plots/`` for every finished run under
  ``directories``; returns a line saying what it did."""
  run_dirs = list(dict.fromkeys(w for d in directories for w in find_runs(d)))
  loaded = [load_run(w) for w in run_dirs]
  configs = [c for c, *_ in loaded]
  check_comparable(configs, run_dirs, [digest for *_, digest in loaded])
  seen = {}
  for (_, summary, *_), w in zip(loaded, run_dirs):
    key = run_key(summary)
    if key in seen:
      raise ConfigError(f'the same run twice ({summary.get("algorithm")}, seed '
                        f'{summary.get("seed")}): {seen[key]} and {w}; name one of them')
    seen[key] = w
  results = [(summary, records) for _, summary, records, _ in loaded]
  check_report_dir(report_dir)
  try:
    os.makedirs(report_dir, exist_ok=True)
  except OSError as e:
    raise ConfigError(f'--out={report_dir}: cannot make it ({e.strerror or e})') from None
  _, plotted = outputs.write_runs_report(configs, run_dirs, results, tuned_flag(configs),
                                         report_dir)
  return (f'report: {os.path.join(report_dir, "report.md")} ({len(run_dirs)} runs from '
          f'{len(directories)} folder(s){", with plots/" if plotted else ""})')
