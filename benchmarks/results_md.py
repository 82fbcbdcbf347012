"""Writes ``benchmarks/RESULTS.md`` from the benchmarks' results, ``benchmarks/results/*.json``.

Each benchmark script writes its results there when it runs (``common.write_results``: one file
per benchmark and setting, ``<benchmark>[-<variant>].json``, replaced by the next run of that
setting). This script turns them into RESULTS.md: per benchmark what it measures (the first
paragraph of the script's docstring), then per setting its command, machine, commit and date
and the table of its figures, nothing else. RESULTS.md is only ever written by this script:
change a figure by running its benchmark (or, for one transcribed from the earlier hand-kept
file, by replacing it with a measurement), then run this script. Its history is git's.

Usage: ``python benchmarks/results_md.py [--results_dir benchmarks/results] [--out
benchmarks/RESULTS.md] [--check]`` (``--check``: write nothing, exit 1 if ``--out`` is not what
the results give).
"""
from __future__ import annotations

import argparse
import ast
import glob
import json
import os
import sys

BENCHMARKS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCHMARKS)

import common  # pylint: disable=g-import-not-at-top,wrong-import-position

# The order of the sections; a benchmark not listed comes after these, by name.
ORDER = ('round_throughput', 'vs_naive_vmap', 'heterogeneous_budgets', 'device_scaling',
         'population_sharding', 'end_to_end', 'startup', 'dropout_cost', 'vs_fedjax',
         'vs_torch_loop', 'independent_table1', 'profile_round', 'paired_checkouts')
TRANSCRIBED = 'transcribed from RESULTS.md'
# The fields every results file has (common.write_results writes them all).
FIELDS = ('benchmark', 'variant', 'command', 'commit', 'machine', 'date', 'setting', 'columns',
          'figures', 'notes')

HEADER = """\
# Benchmark results

<!-- Written by `python benchmarks/results_md.py` from benchmarks/results/*.json: do not edit
     this file; run a benchmark (it writes its JSON there), then that command. -->

The current figures of the benchmarks in `benchmarks/`, one section per benchmark and one table
per setting it was run with, each from the JSON file the benchmark wrote
(`benchmarks/results/<benchmark>[-<setting>].json`: the command, the machine, the commit and
the date, the figures by name with their units, and notes). A benchmark run again replaces its
setting's file; `python benchmarks/results_md.py` then writes this file anew. Earlier figures
are in git's history of this file and of `benchmarks/results/`.

Figures marked *transcribed* were copied, unchanged, from the hand-kept RESULTS.md these files
replaced, with the command, machine, commit and date it gave them (`unknown` where it gave
none); they were not measured again. Throughput never includes compilation, which is reported
apart. On the 2-core development machine the same command's milliseconds spread by about
+-15% from run to run and hour to hour; ratios measured within one process (to the batched
limit, to FedJAX, between device counts) move less. Why the engine is built as it is, with the
measurements that decided it, and what was tried and dropped: `docs/speed.md`.
"""


def what_it_measures(name: str) -> str:
  """The first paragraph of ``benchmarks/<name>.py``'s docstring, on one line."""
  path = os.path.join(BENCHMARKS, f'{name}.py')
  if not os.path.exists(path):
    return ''
  with open(path) as f:
    doc = ast.get_docstring(ast.parse(f.read())) or ''
  return ' '.join(doc.split('\n\n')[0].split())


def load(results_dir: str) -> list[dict]:
  """Every results file of ``results_dir``, in the order RESULTS.md shows them: by ``ORDER``,
  then the default setting first, then by setting."""
  results = []
  for path in glob.glob(os.path.join(results_dir, '*.json')):
    with open(path) as f:
      result = json.load(f)
    missing = [k for k in FIELDS if k not in result]
    if missing:
      sys.exit(f'error: {path}: no {", ".join(missing)} (see common.write_results)')
    results.append(result)
  rank = lambda r: (ORDER.index(r['benchmark']) if r['benchmark'] in ORDER else len(ORDER),
                    r['benchmark'], r['variant'] != '', r['variant'])
  return sorted(results, key=rank)


def section(result: dict) -> list[str]:
  """One setting's part of RESULTS.md."""
  variant = result['variant']
  lines = [f'### {"Default setting" if not variant else f"Setting `{variant}`"}', '']
  lines += ['```bash', result['command'], '```', '']
  lines.append(f'- machine: {result["machine"]}')
  commit = result['commit']
  lines.append(f'- commit: {commit if commit == "unknown" else f"`{commit}`"}; '
               f'date: {result["date"]}')
  if result.get('source'):
    lines.append(f'- *{result["source"]}*: not measured again')
  lines.append('')
  if result['setting']:
    lines += [result['setting'], '']
  lines += [common.markdown_table(result['columns'], result['figures']), '']
  for table in result.get('tables', []):
    lines += [table['title'] + ':', '', common.markdown_table(table['columns'], table['figures']),
              '']
  if result['notes']:
    lines += [result['notes'], '']
  if result.get('plot'):
    lines += [f'![{result["benchmark"]}]({result["plot"]})', '']
  return lines


def render(results_dir: str = common.RESULTS_DIR) -> str:
  """RESULTS.md's text from the results in ``results_dir``."""
  lines = [HEADER]
  benchmark = None
  for result in load(results_dir):
    if result['benchmark'] != benchmark:
      benchmark = result['benchmark']
      lines += [f'## `{benchmark}.py`', '']
      said = what_it_measures(benchmark)
      if said:
        lines += [said, '']
    lines += section(result)
  return '\n'.join(lines).rstrip('\n') + '\n'


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--results_dir', default=common.RESULTS_DIR,
                 help='the folder of the results JSON files')
  p.add_argument('--out', default=os.path.join(BENCHMARKS, 'RESULTS.md'),
                 help='the markdown file written')
  p.add_argument('--check', action='store_true',
                 help='write nothing; exit 1 if --out is not what the results give')
  a = p.parse_args(argv)
  text = render(a.results_dir)
  if a.check:
    try:
      with open(a.out) as f:
        same = f.read() == text
    except OSError:
      same = False
    if not same:
      print(f'{a.out} is not what {a.results_dir} gives: run python benchmarks/results_md.py',
            file=sys.stderr)
    return 0 if same else 1
  with open(a.out, 'w') as f:
    f.write(text)
  print(f'{os.path.relpath(a.out)}: {text.count(chr(10))} lines from '
        f'{len(glob.glob(os.path.join(a.results_dir, "*.json")))} results', file=sys.stderr)
  return 0


if __name__ == '__main__':
  sys.exit(main())
