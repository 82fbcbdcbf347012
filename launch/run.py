"""Runs federated experiments: python launch/run.py --flagfile=launch/configs/X.flags

The flags are generated from fedjax_gel.experiment.Config's sections and the registered
algorithms' hyper-parameters (--helpfull lists them); the work is fedjax_gel.experiment.run
(fedjax_gel.experiment.cli). Bad input (flags, flag files, data files, an occupied workdir)
prints one line on stderr and exits with status 2 before anything is written; Ctrl-C (or
SIGTERM) stops after the round under way with a checkpoint and exits with status 130; a full
disk or another failed write is one line too; a run that stops making progress (--stall_timeout)
or loses one of its processes ends with one line and status 3, its last checkpoint kept for the
same command to resume from. (This text is the command's --help.)
"""
import os
import signal
import sys
import time

START = time.perf_counter()


STOPS = []   # stop signals while starting (cli.guarded takes over later)
IMPORTED = []


def _stop(signum, frame):
  """Ctrl-C or SIGTERM while starting: during the imports recorded, and the command stops once
  they are done (raised inside them, a KeyboardInterrupt broke NumPy's or jaxlib's extension
  mid-import, a crash with status 139, or was dropped in a JAX callback and the run went on);
  after them, or a second one, at once (e.g. a flag file that is a pipe nobody writes)."""
  del signum, frame
  STOPS.append(True)
  if IMPORTED or len(STOPS) > 1:
    raise KeyboardInterrupt


for _signal in (signal.SIGINT, signal.SIGTERM):
  signal.signal(_signal, _stop)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

STARTING = 'interrupted while starting, before anything was written: run the same command again'
try:
  from absl import app, flags  # pylint: disable=g-import-not-at-top,g-bad-import-order

  from fedjax_gel.experiment import cli, loop  # pylint: disable=g-import-not-at-top
  from fedjax_gel.experiment.config import ConfigError  # pylint: disable=g-import-not-at-top

  cli.define_flags(flags.FLAGS)
except KeyboardInterrupt:   # a signal's handler of another library's
  STOPS.append(True)
if STOPS:
  print(STARTING, file=sys.stderr)
  sys.exit(130)
IMPORTED.append(True)


def parse(argv):
  try:
    rest = cli.parse(argv, flags.FLAGS)
    if flags.FLAGS.only_check_args:   # absl would exit 0 before any of our checks
      sys.exit(cli.check_only(flags.FLAGS, rest))
    if STOPS:
      raise KeyboardInterrupt
    return rest
  except ConfigError as e:
    sys.exit(cli.fail(str(e)))
  except KeyboardInterrupt:
    print(STARTING, file=sys.stderr)
    sys.exit(130)


def main(argv):
  loop.STOP_REQUESTS.extend(STOPS)   # one dropped since: the command stops
  code = cli.guarded(cli.execute, flags.FLAGS, argv, START)
  # Every output is written and closed by now: exit without the interpreter's teardown of
  # JAX's runtime, which takes about half a second (benchmarks/RESULTS.md, start-up).
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)  # pylint: disable=protected-access


if __name__ == '__main__':
  app.run(main, flags_parser=parse)
