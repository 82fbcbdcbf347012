"""Runs federated experiments: python launch/run.py --flagfile=launch/configs/X.flags

The flags are generated from fedjax_gel.experiment.Config's sections and the registered
algorithms' hyper-parameters (--helpfull lists them); the work is fedjax_gel.experiment.run
(fedjax_gel.experiment.cli). Bad input (flags, flag files, data files, an occupied workdir)
prints one line on stderr and exits with status 2 before anything is written; Ctrl-C (or
SIGTERM) stops after the round under way with a checkpoint and exits with status 130; a full
disk or another failed write is one line too; a run that stops making progress (--stall_timeout)
or loses one of its processes ends with one line and status 3, its last checkpoint kept for the
same command to resume from.
"""
import functools
import os
import signal
import sys
import time

START = time.perf_counter()


STARTING = 'interrupted while starting, before anything was written: run the same command again'


def starting():
  """Imports the command (absl, fedjax_gel, JAX: seconds) and defines its flags; returns the
  process's ``fedjax_gel.experiment.runtime.Runtime``, whose stop token takes every stop signal
  from then on (recorded, then a KeyboardInterrupt at once: e.g. a flag file that is a pipe
  nobody writes). Ctrl-C or SIGTERM during the imports is only recorded, and the command
  stops (status 130) once they are done: raised inside them, a KeyboardInterrupt broke NumPy's
  or jaxlib's extension mid-import (a crash with status 139), or was dropped in a JAX callback
  and the run went on; a second one stops it at once."""
  stops = []

  def hold(signum, frame):
    del signum, frame
    stops.append(True)
    if len(stops) > 1:
      raise KeyboardInterrupt

  for s in (signal.SIGINT, signal.SIGTERM):
    signal.signal(s, hold)
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  try:
    from absl import app, flags  # pylint: disable=g-import-not-at-top,unused-import
    from fedjax_gel.experiment import cli, runtime as runtime_lib  # pylint: disable=g-import-not-at-top
    cli.define_flags(flags.FLAGS)
    # --help: this text, then the main flags by section (absl lists the main module's own)
    sys.modules['__main__'].__doc__ = (__doc__ + cli.overview(flags.FLAGS)).replace('%', '%%')
    runtime = runtime_lib.Runtime()
    for s in runtime_lib.STOP_SIGNALS:
      signal.signal(s, runtime.stop.interrupt)
  except KeyboardInterrupt:   # a second one, or a signal's handler of another library's
    stops.append(True)
  if stops:
    print(STARTING, file=sys.stderr)
    sys.exit(130)
  return runtime


def parse(runtime, argv):
  from absl import flags  # pylint: disable=g-import-not-at-top
  from fedjax_gel.experiment import cli, parsing  # pylint: disable=g-import-not-at-top
  from fedjax_gel.experiment.config import ConfigError  # pylint: disable=g-import-not-at-top
  try:
    rest = parsing.parse(argv, flags.FLAGS)
    if flags.FLAGS.only_check_args:   # absl would exit 0 before any of our checks
      sys.exit(cli.check_only(flags.FLAGS, rest))
    if runtime.stop:   # one whose KeyboardInterrupt was lost
      raise KeyboardInterrupt
    return rest
  except ConfigError as e:
    sys.exit(cli.fail(str(e)))
  except KeyboardInterrupt:
    print(STARTING, file=sys.stderr)
    sys.exit(130)


def main(runtime, argv):
  from absl import flags  # pylint: disable=g-import-not-at-top
  from fedjax_gel.experiment import cli  # pylint: disable=g-import-not-at-top
  code = cli.guarded(runtime, cli.execute, flags.FLAGS, argv, runtime, START)
  # Every output is written and closed by now: exit without the interpreter's teardown of
  # JAX's runtime, which takes about half a second (docs/speed.md, start-up).
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)  # pylint: disable=protected-access


if __name__ == '__main__':
  RUNTIME = starting()
  from absl import app  # pylint: disable=g-import-not-at-top  # loaded by starting, held
  app.run(functools.partial(main, RUNTIME), flags_parser=functools.partial(parse, RUNTIME))
