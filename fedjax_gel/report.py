"""``python -m fedjax_gel.report DIR [DIR ...] [--out REPORT_DIR]``: one ``report.md`` with plots
over finished runs made by separate commands (``experiment.compare``). Exit status 2 with one
line for directories without runs, damaged files or runs that cannot be compared."""
from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      prog='python -m fedjax_gel.report',
      description=('One report.md with plots over finished runs made by separate commands. '
                   'Exit status 2 with one line for directories without runs, damaged files '
                   'or runs that cannot be compared.'))
  parser.add_argument('directories', nargs='+', metavar='DIR',
                      help='work directories of finished runs, seed groups or commands')
  parser.add_argument('--out', default='report',
                      help='where report.md and plots/ go (default: ./report)')
  args = parser.parse_args(argv)
  from fedjax_gel.experiment import compare  # pylint: disable=g-import-not-at-top
  from fedjax_gel.experiment.config import ConfigError  # pylint: disable=g-import-not-at-top
  from fedjax_gel.experiment.cli import fail, os_error  # pylint: disable=g-import-not-at-top
  try:
    print(compare.compare(args.directories, args.out))
  except ConfigError as e:
    return fail(str(e))
  except OSError as e:
    return fail(os_error(e))
  return 0


if __name__ == '__main__':
  sys.exit(main())
