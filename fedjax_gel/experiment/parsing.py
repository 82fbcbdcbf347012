"""Reading the command line: flag files checked before absl reads them (``check_flagfile``;
a pipe or device read once, ``staged_pipes``), absl's parsing with every complaint turned into
one line naming the flag, and the flag file and line it came from (``parse``).

The flags naming files or folders (``PATHS``) have ``~`` and ``$VARIABLES`` expanded after
parsing, wherever they were given: a flag file is read by no shell. A variable that is not set
is an error, not a folder named ``$VARIABLE``.
"""
from __future__ import annotations

import os
import re
import select
import sys
import tempfile
import time

from absl import flags

from fedjax_gel.core import paths
from fedjax_gel.core.paths import shown
from fedjax_gel.experiment import config as config_lib
from fedjax_gel.experiment.config import ConfigError
from fedjax_gel.experiment.messages import one_line, shorter

# Flags that name a file or folder: ``~`` and ``$VARIABLES`` expanded (``expand_paths``).
PATHS = ('workdir', 'compilation_cache', *(name for _, name in config_lib.PATH_FIELDS))


def flagfile_args(argv) -> list[tuple[int, str]]:
  """``(index, path)`` of each ``--flagfile`` on the command line, in order, as absl reads it
  (stripped, ``~`` expanded; empty ones left out): ``index`` is the argument holding the path,
  ``--flagfile=PATH`` itself or the one after ``--flagfile``."""
  found = []
  for i, arg in enumerate(argv):
    if arg == '--':
      break
    name, eq, value = arg.removeprefix('-').removeprefix('-').partition('=')
    if arg.startswith('-') and name == 'flagfile':
      found.append((i, value) if eq else (i + 1, argv[i + 1] if i + 1 < len(argv) else ''))
  return [(i, os.path.expanduser(p.strip())) for i, p in found if p.strip()]


FLAGFILE_BYTES = 1 << 20   # a flag file larger than this is no flag file (e.g. a data file)
FLAGFILE_DEPTH = 100       # flag files including flag files: no deeper (a chain of them)
FLAGFILE_LINES = 10_000    # flag lines of a flag file with the files it includes, all told


def check_flagfile(path: str, including: tuple = (), reals: tuple = ()
                   ) -> list[tuple[str, int, str]]:
  """A flag file's syntax, before absl reads it: a regular file of UTF-8 text (at most
  ``FLAGFILE_BYTES``) whose lines are blank, comments (``#`` or ``//`` in the first column) or
  ``--name=value`` (``--name`` for booleans), its nested ``--flagfile``s too (at most
  ``FLAGFILE_DEPTH`` deep and ``FLAGFILE_LINES`` lines in all: a file included twice by each
  of 30 nested files is read 2**30 times). The first problem is a ConfigError naming the file
  and the line. Returns every flag line as ``(file, line number, text)``, the nested files'
  included, so that absl's complaint about a value can name its line (``parse``).
  ``including``: the files that include it, outermost first; ``reals``: their real paths."""
  named = f'--flagfile={shown(path)}'
  where = f' (included by {shown(including[-1])})' if including else ''
  if len(including) >= FLAGFILE_DEPTH:
    raise ConfigError(f'{named}{where}: flag files nested more than {FLAGFILE_DEPTH} deep (each '
                      'including the next); include fewer levels')
  real = os.path.realpath(path)
  if real in reals:
    raise ConfigError(f'{named} includes itself (through '
                      f'{" -> ".join(map(shown, including))})')
  try:
    if os.path.isdir(path):
      raise ConfigError(f'{named}{where}: a directory, not a flag file')
    problem = paths.not_regular(path)   # a nested pipe: read only once; a device: never ends
    if problem:
      raise ConfigError(f'{named}{where}: {problem}; write the flags to a file')
    with paths.open_regular(path) as f:
      data = f.read(FLAGFILE_BYTES + 1)
  except OSError as e:
    hint = ''
    if including and not os.path.isabs(path):   # absl's rule, which users may not expect
      hint = (f'; a flag file\'s --flagfile is read from the current directory '
              f'({shown(os.getcwd())}), not from the including file\'s folder')
    raise ConfigError(f'{named}{where}: cannot be read ({e.strerror}){hint}') from None
  if len(data) > FLAGFILE_BYTES:
    raise ConfigError(f'{named}{where}: larger than a flag file can be (over '
                      f'{FLAGFILE_BYTES >> 20} MiB)')
  try:
    lines = data.decode('utf-8').splitlines()
  except UnicodeDecodeError:
    raise ConfigError(f'{named}{where}: not a text file (not UTF-8)') from None
  found = []
  for number, line in enumerate(lines, 1):
    if not line.strip() or line.startswith(('#', '//')):
      continue
    text = line.strip()
    name, _, value = text.removeprefix('-').removeprefix('-').partition('=')
    if not text.startswith('-') or not name or any(ch.isspace() for ch in name):
      raise ConfigError(f'{named} line {number}: {shorter(text)!r} is not a flag; '
                        'write --name=value')
    if name == 'flagfile':
      if not value.strip():
        raise ConfigError(f'{named} line {number}: --flagfile needs a file name')
      found += check_flagfile(os.path.expanduser(value.strip()), including + (path,),
                              reals + (real,))
    found.append((path, number, text))
    if len(found) > FLAGFILE_LINES:
      raise ConfigError(f'{named} line {number}: over {FLAGFILE_LINES:,} flag lines with the '
                        'flag files it includes (one included many times over?)')
  return found


PIPE_WAIT_S = 10.   # seconds a flag file that is a pipe may take to be written whole


def read_pipe(path: str, limit: int = FLAGFILE_BYTES + 1) -> bytes:
  """Up to ``limit`` bytes of the flag file ``path`` that is a pipe or a device (``<(...)``,
  ``/dev/stdin``), until its writer closes it. Nothing waits forever: the open does not block
  (a named pipe no program writes to), and reading ends after ``PIPE_WAIT_S``; that, a socket
  or a failed open is a ConfigError naming the file."""
  named = f'--flagfile={shown(path)}'
  what = paths.kind_of(path)
  if what not in ('a named pipe', 'a character device'):
    raise ConfigError(f'{named}: not a regular file ({what}); write the flags to a file')
  try:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
  except OSError as e:
    raise ConfigError(f'{named}: cannot be read ({e.strerror})') from None
  chunks, size, deadline = [], 0, time.monotonic() + PIPE_WAIT_S
  waiting = select.poll()
  waiting.register(fd, select.POLLIN)
  try:
    while size < limit:   # a pipe read before its writer came would read as empty: poll first
      if not waiting.poll(max(0., deadline - time.monotonic()) * 1000):
        raise ConfigError(f'{named}: not written to its end within {PIPE_WAIT_S:g} s (a named '
                          'pipe no program writes to?); write the flags to a file')
      try:
        block = os.read(fd, limit - size)
      except BlockingIOError:
        continue
      if not block:
        break
      chunks.append(block)
      size += len(block)
  finally:
    os.close(fd)
  return b''.join(chunks)


def staged_pipes(argv, folder: str) -> tuple[list[str], dict]:
  """``(argv, {staged file: its pipe})``: ``argv`` with each ``--flagfile`` that is a pipe
  (``<(...)``, ``/dev/stdin``) or device read once (``read_pipe``) into a file in ``folder``,
  which the checks and absl then read in its place."""
  out, staged_from = list(argv), {}
  for i, path in flagfile_args(argv):
    if not os.path.exists(path) or os.path.isdir(path) or os.path.isfile(path):
      continue
    staged = os.path.join(folder, f'flags{i}')
    data = read_pipe(path)
    with open(staged, 'wb') as g:
      g.write(data)
    inline = argv[i].lstrip('-').startswith('flagfile=')   # else the argument after --flagfile
    out[i] = f'--flagfile={staged}' if inline else staged
    staged_from[staged] = path
  return out, staged_from


def parse(argv, values: flags.FlagValues = flags.FLAGS):
  """absl's parsing after ``check_flagfile``; a bad flag is a ConfigError of one line (naming
  the flag file and line it came from, when one line of them holds it). A flag file that is a
  pipe is read once (``staged_pipes``)."""
  with tempfile.TemporaryDirectory() as folder:
    argv, staged_from = staged_pipes(argv, folder)
    try:
      rest = parse_files(argv, values)
    except ConfigError as e:   # named as the user named them
      text = str(e)
      for staged, pipe in staged_from.items():
        text = text.replace(staged, shown(pipe))
      raise ConfigError(text) from None
  expand_paths(values)
  return rest


HELP = re.compile(r'--?(help|helpshort|helpfull|helpxml|\?)(=\w*)?')   # --helpfull=1 too


def parse_files(argv, values: flags.FlagValues):
  """``parse`` once every flag file is a regular file. Help (``--help``, ``--helpfull``,
  ``-h``, ...) is printed and exits with status 0 (absl's help exits with 1; ``-h`` is not
  absl's)."""
  lines = [x for _, path in flagfile_args(argv[1:]) for x in check_flagfile(path)]
  ends = argv.index('--') if '--' in argv[1:] else len(argv)   # then positional arguments
  argv = [argv[0]] + ['--help' if a == '-h' else a for a in argv[1:ends]] + argv[ends:]
  try:
    return values(argv)
  except SystemExit as e:
    if e.code == 1 and any(HELP.fullmatch(a) for a in argv[1:ends]):
      sys.stdout.flush()
      raise SystemExit(0) from None
    raise
  except flags.Error as e:
    text = (escaped(str(e), argv[1:ends]).splitlines() or ['bad flags'])[0]
    text = text.removeprefix('ERROR:: ').removeprefix('ERROR: ')
    unknown = re.search(r"Unknown command line flag '([^']+)'", text)
    origin = [f'--flagfile={shown(p)} line {n}: ' for p, n, line in lines
              if (line.lstrip('-').split('=')[0] == unknown.group(1) if unknown else
                  f'flag {line}:' in text)]
    origin = origin[0] if len(origin) == 1 else ''   # the same text twice: no guess
    raise ConfigError(shorter(origin + text, 300)) from None
  except ValueError as e:   # absl's logging flags check their values themselves
    text = (escaped(str(e), argv[1:ends]).splitlines() or ['bad flags'])[0]
    if not text.startswith('--'):   # --logger_levels=jax:LOUD: "Unknown level: 'LOUD'"
      text = f"{text} (absl's logging flags: --logger_levels=name:LEVEL,...)"
    raise ConfigError(shorter(text, 300)) from None


def escaped(text: str, args) -> str:
  """absl's message ``text`` with the line breaks (and other unprintable characters) of the
  names and values of the command line's ``args`` escaped (``one_line``), so that its first
  line holds the whole of a message quoting such a value (absl joins several by lines)."""
  for arg in args:
    for part in arg.lstrip('-').partition('='):
      if part and not part.isprintable():
        text = text.replace(part, one_line(part))
  return text


def expand_path(flag: str, text: str) -> str:
  """``text`` with ``~`` and ``$VARIABLES`` expanded; a ConfigError naming ``--flag`` when a
  variable is not set, a ``${`` is not closed, ``~user`` names no user, or the path starts with
  ``-`` (a flag before it given no value took the next flag as its value: ``--workdir
  --only_check_args`` ran into a folder named ``--only_check_args``; write ``./-name``)."""
  given = f'--{flag}={shown(text)}'
  if text.startswith('-'):
    raise ConfigError(f'{given}: a path cannot start with "-" (was --{flag} given no '
                      f'value?); write {shown("./" + text)} for such a name')
  path = os.path.expanduser(os.path.expandvars(text))
  if re.search(r'\$\{[^}]*$', path):
    raise ConfigError(f'{given}: a "${{" without its closing "}}"')
  unset = re.search(r'\$(\w+|\{[^}]*\})', path)
  if unset:
    raise ConfigError(f'{given}: the environment variable {shown(unset.group(1).strip("{}"))} '
                      'is not set')
  if path.startswith('~'):
    raise ConfigError(f'{given}: no user {path[1:].split(os.sep)[0]!r} to expand ~ for')
  return path


def expand_paths(values: flags.FlagValues):
  """Expands ``~`` and ``$VARIABLES`` in the path flags (``PATHS``) that ``values`` has, in
  place (their ``present`` is kept)."""
  for name in PATHS:
    if name in values and values[name].value:
      values[name].value = expand_path(name, values[name].value)
