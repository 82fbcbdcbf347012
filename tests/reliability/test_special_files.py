"""Special files, hostile summaries, deep flag files and control characters in paths: each is
one line on stderr naming the file (and field), exit status 2, no traceback, nothing written
lost, and nothing waits forever.

* A named pipe, a character device or a socket where the command reads or writes a file (the
  work directory's outputs and checkpoints, ``--data_path``, ``--client_budgets``, a CelebA
  image, ``--flagfile``, the report's ``--out``) is refused, not opened: a pipe blocked the
  command for good. The tests run in this process under ``no_hang``, which turns a wait of
  over ``HANG_S`` into a failure (a blocked ``open`` is interrupted by the alarm).
* ``python -m fedjax_gel.report`` checks the type of every field it reads of a run
  (``compare.SUMMARY_FIELDS``, ``RECORD_FIELDS``).
* Flag files nest at most ``parsing.FLAGFILE_DEPTH`` deep (2,000 ended in a RecursionError).
* A path with a line break is quoted (``'a\\nb'``), the error still one line.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import threading

import pytest

import helpers
from fedjax_gel import report as report_cli
from fedjax_gel.core import paths
from fedjax_gel.data import leaf_tasks
from fedjax_gel.data.errors import DataError
from fedjax_gel.experiment import cli, files, parsing
from fedjax_gel.experiment import workdir as workdir_lib

QUICK = ('--flagfile=launch/configs/quickstart.flags', '--algorithm=fedavgcm',
         '--clients_per_round=5', '--num_rounds=2', '--eval_every=2', '--tensorboard=false',
         '--noplots')
HANG_S = 20


class Hung(BaseException):
  """The code under test waited longer than ``HANG_S`` (a BaseException: no handler of the
  command's takes it for an error of its own)."""


@pytest.fixture(autouse=True)
def no_hang():
  """Every test of this file fails (``Hung``) where it waits over ``HANG_S`` seconds."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  def alarm(*_):
    raise Hung(f'waited over {HANG_S} s')
  previous = signal.signal(signal.SIGALRM, alarm)
  signal.setitimer(signal.ITIMER_REAL, HANG_S)
  try:
    yield
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def listing(folder) -> dict:
  """Every entry under ``folder`` with its kind and, for a regular file, its bytes."""
  out = {}
  for root, dirs, names in os.walk(folder):
    for n in dirs + names:
      p = os.path.join(root, n)
      out[os.path.relpath(p, folder)] = (open(p, 'rb').read() if os.path.isfile(p) else
                                         paths.kind_of(p))
  return out


def plant(path, kind: str = 'fifo'):
  """A named pipe (or a bound socket, kept open by the caller) at ``path``."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  if kind == 'fifo':
    os.mkfifo(path)
    return None
  server = socket.socket(socket.AF_UNIX)
  server.bind(os.path.relpath(path))   # a relative name: sockets' names are short
  return server


# --------------------------------------------------------------------------- outputs


@pytest.mark.parametrize('name', [
    'metrics.jsonl', 'config.json', 'summary.json', 'report.md', 'runs.json',
    'plots/accuracy_rounds.png', 'tensorboard/events', 'checkpoint-2', 'checkpoint-2/meta.msgpack',
    'checkpoint-2/state/manifest.ocdbt'])
def test_a_named_pipe_among_the_outputs_is_refused_before_anything_is_written(tmp_path, name):
  workdir = tmp_path / 'w'
  (workdir / 'seen.txt').parent.mkdir()
  (workdir / 'seen.txt').write_text('kept')
  plant(str(workdir / name))
  before = listing(workdir)
  for overwrite in ((), ('--overwrite',)):
    proc = helpers.cli_run(*QUICK, f'--workdir={workdir}', *overwrite)
    helpers.assert_one_line_error(proc, str(workdir / name), 'not a regular file (a named pipe)')
    assert listing(workdir) == before


def test_a_socket_at_an_output_is_refused(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  server = plant(str(tmp_path / 'w' / 'metrics.jsonl'), 'socket')
  with server:
    proc = helpers.cli_run(*QUICK, f'--workdir={tmp_path / "w"}')
  helpers.assert_one_line_error(proc, 'metrics.jsonl', 'not a regular file (a socket)')


def test_a_named_pipe_as_the_workdir_is_refused(tmp_path):
  os.mkfifo(tmp_path / 'w')
  proc = helpers.cli_run(*QUICK, f'--workdir={tmp_path / "w"}')
  helpers.assert_one_line_error(proc, f'--workdir={tmp_path / "w"}', 'not a directory')


@pytest.mark.parametrize('when', ['checked', 'planted_after_the_check'])
def test_the_opens_of_outputs_and_inputs_never_wait_on_a_special_file(tmp_path, monkeypatch,
                                                                     when):
  """Every open of a file written or read back refuses a pipe at its name; one planted between
  the check and the open (the check finding nothing) by the open itself (``O_NONBLOCK``, then
  ``fstat``)."""
  if when != 'checked':
    monkeypatch.setattr(paths, 'not_regular', lambda *_, **__: None)
  os.mkfifo(tmp_path / 'metrics.jsonl')
  for use in (files.open_append, files.open_new, lambda p: files.truncate(p, 0),
              paths.open_regular, files.digest, files.read_json,
              lambda p: workdir_lib.read_metrics(os.path.dirname(p))):
    with pytest.raises(paths.NotRegularFile, match='not a regular file'):
      with contextlib.ExitStack() as stack:
        opened = use(str(tmp_path / 'metrics.jsonl'))
        if hasattr(opened, '__exit__'):
          stack.enter_context(opened)
  for special in ('/dev/zero', '/dev/null'):
    with pytest.raises(paths.NotRegularFile, match=r'not a regular file \(a character device\)'):
      paths.open_regular(special)
  os.close(paths.regular_fd(tmp_path / 'new', os.O_WRONLY | os.O_CREAT))   # a new file: fine
  os.replace(tmp_path / 'metrics.jsonl', tmp_path / files.LOCK)
  assert files.holder(str(tmp_path)) is None   # a pipe as .lock: no holder named, no wait


# --------------------------------------------------------------------------- inputs


def leaf_file(path):
  path.write_text(json.dumps({'users': ['a', 'b'], 'num_samples': [4, 4], 'user_data': {
      u: {'x': [[float(i), 1.] for i in range(4)], 'y': [0, 1, 0, 1]} for u in 'ab'}}))
  return path


@pytest.mark.parametrize('case', ['data_path', 'data_path_device', 'leaf_dir', 'client_budgets',
                                  'client_budgets_socket'])
def test_a_special_input_file_is_refused(tmp_path, monkeypatch, case):
  monkeypatch.chdir(tmp_path)
  fifo, server = tmp_path / 'fifo.json', None
  if case == 'client_budgets_socket':
    server = plant(str(tmp_path / 'fifo.json'), 'socket')
  else:
    os.mkfifo(fifo)
  leaf = ('--dataset=leaf', '--model=logistic', '--clients_per_round=2', '--num_rounds=1')
  if case == 'data_path':
    args, words = (*leaf, f'--data_path={fifo}'), (str(fifo), 'not a regular file (a named pipe)')
  elif case == 'data_path_device':
    args, words = (*leaf, '--data_path=/dev/zero'), ('/dev/zero', '(a character device)')
  elif case == 'leaf_dir':
    (tmp_path / 'leaf').mkdir()
    leaf_file(tmp_path / 'leaf' / 'a.json')
    os.replace(fifo, tmp_path / 'leaf' / 'b.json')
    args = (*leaf, f'--data_path={tmp_path / "leaf"}')
    words = (str(tmp_path / 'leaf' / 'b.json'), 'not a regular file (a named pipe)')
  else:
    what = 'a socket' if server else 'a named pipe'
    args = (*QUICK, '--budget_draw=per_client', f'--client_budgets={fifo}')
    words = (f'--client_budgets={fifo}', f'not a regular file ({what})')
  with server or contextlib.nullcontext():
    proc = helpers.cli_run(*args, f'--workdir={tmp_path / "w"}')
  helpers.assert_one_line_error(proc, *words)
  assert not (tmp_path / 'w').exists()


def test_a_special_image_file_is_refused(tmp_path):
  os.mkfifo(tmp_path / 'face.png')
  with pytest.raises(DataError, match=r'face\.png: not a regular file \(a named pipe\)'):
    leaf_tasks.read_image(str(tmp_path), 'face.png')


def test_a_named_pipe_as_a_flag_file_is_read_when_written_and_refused_when_not(tmp_path,
                                                                              monkeypatch):
  """``--flagfile=PIPE`` stays a feature: a pipe a program writes is read; one nothing
  writes to is one line after ``parsing.PIPE_WAIT_S`` (it waited forever); a socket at once."""
  fifo = tmp_path / 'flags'
  os.mkfifo(fifo)
  writer = threading.Thread(target=lambda: fifo.write_text('--seed=7\n--num_rounds=3\n'))
  writer.start()
  values = cli.flags.FlagValues()
  cli.define_flags(values)
  parsing.parse(['run.py', f'--flagfile={fifo}'], values)
  writer.join()
  assert (values.seed, values.num_rounds) == (7, 3)
  monkeypatch.setattr(parsing, 'PIPE_WAIT_S', 0.2)
  helpers.assert_one_line_error(helpers.cli_run(f'--flagfile={fifo}'), f'--flagfile={fifo}:',
                                'not written to its end within 0.2 s')
  monkeypatch.chdir(tmp_path)
  with plant(str(tmp_path / 'sock'), 'socket'):
    helpers.assert_one_line_error(helpers.cli_run(f'--flagfile={tmp_path / "sock"}'),
                                  'not a regular file (a socket)')
  (tmp_path / 'outer.flags').write_text(f'--flagfile={fifo}\n')   # a nested pipe: refused
  helpers.assert_one_line_error(helpers.cli_run(f'--flagfile={tmp_path / "outer.flags"}'),
                                f'--flagfile={fifo} (included by', 'a named pipe')


# --------------------------------------------------------------------------- the report


@pytest.fixture(scope='module')
def finished(tmp_path_factory):
  """A finished 2-round run's work directory."""
  workdir = tmp_path_factory.mktemp('finished') / 'run'
  proc = helpers.cli_run(*QUICK, f'--workdir={workdir}')
  assert proc.returncode == 0, proc.stderr
  return workdir


def report(*args):
  """``python -m fedjax_gel.report args`` in this process, as a CompletedProcess."""
  err, out = io.StringIO(), io.StringIO()
  with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
    code = report_cli.main([str(a) for a in args])
  return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def edited(finished, tmp_path, change):
  """A copy of the finished run whose summary is ``change(summary)``, without its own checksum
  (as a version before it wrote it)."""
  run = tmp_path / 'run'
  shutil.copytree(finished, run)
  summary = json.loads((run / 'summary.json').read_text())
  del summary['summary_sha256']
  (run / 'summary.json').write_text(json.dumps(change(summary)))
  return run


@pytest.mark.parametrize('change, words', [
    (lambda s: {**s, 'final_accuracy': 'high'}, ["'final_accuracy'", 'a finite number', '"high"']),
    (lambda s: {**s, 'rounds_to_target': [1]}, ["'rounds_to_target'", 'or null', '[1]']),
    (lambda s: {**s, 'seed': 'x'}, ["'seed'", 'a whole number >= 0']),
    (lambda s: {**s, 'seed': True}, ["'seed'", '(got true)']),
    (lambda s: {**s, 'best_accuracy': {'a': {'b': 1}}}, ["'best_accuracy'", '{"a": {"b": 1}}']),
    (lambda s: {**s, 'target_accuracy': None}, ["'target_accuracy'", '(got null)']),
    (lambda s: {**s, 'algorithm': 3}, ["'algorithm'", 'a non-empty string']),
    (lambda s: {**s, 'metric': {'name': 5}}, ["'metric'"]),
    (lambda s: {**s, 'final_client_accuracy_p10': 'low'}, ["'final_client_accuracy_p10'"]),
    (lambda s: {k: v for k, v in s.items() if k != 'client_lr'}, ["no 'client_lr'"]),
    (lambda s: [s], ['summary.json']),
], ids=['str', 'list', 'seed_str', 'seed_bool', 'nested', 'null', 'algorithm', 'metric',
        'optional', 'missing', 'not_an_object'])
def test_a_summary_of_the_wrong_types_is_one_line(finished, tmp_path, change, words):
  run = edited(finished, tmp_path, change)
  proc = report(run, '--out', tmp_path / 'report')
  helpers.assert_one_line_error(proc, str(run / 'summary.json'), *words)
  assert not (tmp_path / 'report').exists()


def test_a_record_of_the_wrong_type_is_one_line(finished, tmp_path):
  run = edited(finished, tmp_path, lambda s: s)
  records = [json.loads(l) for l in (run / 'metrics.jsonl').read_text().splitlines()]
  records[1]['bytes_up'] = '12 KiB'
  (run / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))
  summary = json.loads((run / 'summary.json').read_text())
  summary['outputs_sha256']['metrics.jsonl'] = files.digest(str(run / 'metrics.jsonl'))
  (run / 'summary.json').write_text(json.dumps(summary))
  helpers.assert_one_line_error(report(run, '--out', tmp_path / 'report'),
                                f'{run / "metrics.jsonl"} line 2', "'bytes_up'", '"12 KiB"')
  assert report(edited(finished, tmp_path / 'ok', lambda s: s), '--out',
                tmp_path / 'report').returncode == 0   # the unedited copy reports


@pytest.mark.parametrize('where', ['summary.json', 'metrics.jsonl', 'out/report.md', 'out/plots'])
def test_a_named_pipe_in_a_run_or_the_report_folder_is_refused(finished, tmp_path, where):
  run = edited(finished, tmp_path, lambda s: s)
  target = tmp_path / where if where.startswith('out/') else run / where
  if target.exists():
    target.unlink()
  plant(str(target))
  proc = report(run, '--out', tmp_path / 'out')
  helpers.assert_one_line_error(proc, str(target), 'not a regular file (a named pipe)')


# --------------------------------------------------------------------------- flag files


def chain(folder, count: int):
  """``count`` flag files, each including the next; the last sets --seed=5. The first's path."""
  for i in range(count):
    last = i == count - 1
    (folder / f'f{i}.flags').write_text('--seed=5\n' if last else
                                        f'--flagfile={folder / f"f{i + 1}.flags"}\n')
  return folder / 'f0.flags'


def test_deeply_nested_flag_files_are_one_line(tmp_path):
  proc = helpers.cli_run(f'--flagfile={chain(tmp_path, 2000)}')
  depth = parsing.FLAGFILE_DEPTH
  helpers.assert_one_line_error(proc, f'--flagfile={tmp_path / f"f{depth}.flags"}',
                                f'(included by {tmp_path / f"f{depth - 1}.flags"})',
                                f'nested more than {depth} deep')
  values = cli.flags.FlagValues()   # as deep as allowed: absl reads it
  cli.define_flags(values)
  for f in tmp_path.iterdir():
    f.unlink()
  parsing.parse(['run.py', f'--flagfile={chain(tmp_path, depth)}'], values)
  assert values.seed == 5


def test_flag_files_included_many_times_over_are_one_line(tmp_path):
  """Each of 30 files including the next twice: 2**30 reads, bounded by
  ``parsing.FLAGFILE_LINES``."""
  for i in range(30):
    (tmp_path / f'f{i}.flags').write_text(f'--flagfile={tmp_path / f"f{i + 1}.flags"}\n' * 2)
  (tmp_path / 'f30.flags').write_text('--seed=5\n')
  proc = helpers.cli_run(f'--flagfile={tmp_path / "f0.flags"}')
  helpers.assert_one_line_error(proc, f'over {parsing.FLAGFILE_LINES:,} flag lines')


@pytest.mark.parametrize('args, words', [
    (['--flagfile=a\nb'], ["--flagfile='a\\nb': cannot be read"]),
    (['--flagfile=launch/configs/quickstart.flags', '--workdir=-x\ny'],
     ["--workdir='-x\\ny': a path cannot start", "write './-x\\ny'"]),
    (['--flagfile=launch/configs/quickstart.flags', 'stray\nargument'],
     ["unexpected arguments: 'stray\\nargument'"]),
    (['--flagfile=launch/configs/quickstart.flags', '--data_path=$NO_SUCH_VAR_XYZ\n'],
     ["--data_path='$NO_SUCH_VAR_XYZ\\n'", 'not set']),
    (['--num_rounds=1\nx'], ['flag --num_rounds=1\\nx: invalid literal for int()']),   # absl's
    (['--no\nflag'], ["Unknown command line flag 'no\\nflag'"]),
    (['--flagfile=launch/configs/quickstart.flags', '--seeds=1,x\n'], ['--seeds', '1,x']),
])
def test_a_line_break_in_a_path_or_value_keeps_the_error_one_line(args, words):
  helpers.assert_one_line_error(helpers.cli_run(*args), *words)


def test_a_line_break_in_a_nested_flag_file_or_a_workdir_keeps_the_error_one_line(tmp_path):
  (tmp_path / 'outer.flags').write_text('--flagfile=no\tsuch\n')
  proc = helpers.cli_run(f'--flagfile={tmp_path / "outer.flags"}')
  helpers.assert_one_line_error(proc, "--flagfile='no\\tsuch' (included by", 'cannot be read')
  (tmp_path / 'a\nfile').write_text('')   # a file where the work directory goes
  proc = helpers.cli_run(*QUICK, f'--workdir={tmp_path / "a"}\nfile')
  helpers.assert_one_line_error(proc, 'a\\nfile', 'exists and is not a directory')
