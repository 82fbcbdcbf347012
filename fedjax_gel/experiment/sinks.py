"""Metric sinks: where the evaluations' records go, each a loop callback.

* ``JsonlWriter``: ``metrics.jsonl``, one JSON object per record (NaN written as ``null``);
* ``CsvWriter``: ``metrics.csv`` with a header (``pandas.read_csv`` loads it);
* ``TensorBoardWriter``: TensorBoard event files under ``tensorboard/`` (tensorboardX, which
  needs no TensorFlow), one scalar per numeric field and round, flushed every few seconds and
  at the end; rewritten from the records at the start, as ``metrics.csv`` is, so that a resumed
  run's events are its ``metrics.jsonl``'s: none lost in a kill, none twice.

A work directory shared by several runs (a grid's cells) gets their records in one file, told
apart by their tags (e.g. ``client_lr, server_lr``), and one TensorBoard folder per run.
"""
from __future__ import annotations

import csv
import math
import os
import shutil
import time

from fedjax_gel.experiment import callbacks, files, workdir as workdir_lib


def by_workdir(loop, records: dict) -> dict:
  """``workdir -> [record]`` in run order."""
  out: dict = {}
  for i, record in sorted(records.items()):
    out.setdefault(loop.runs[i].workdir, []).append(record)
  return out


class JsonlWriter(callbacks.Callback):
  """Appends each evaluation's records to ``metrics.jsonl`` (which a resumed run's checkpoint
  cut back to its round)."""

  def on_evaluate(self, loop, done, records):
    for w, recs in by_workdir(loop, records).items():
      with files.open_append(os.path.join(w, 'metrics.jsonl')) as f:
        f.write(''.join(workdir_lib.json_line(r) for r in recs))


class CsvWriter(callbacks.Callback):
  """``metrics.csv``: the records of ``metrics.jsonl`` as a table with a header row (columns:
  the first record's fields); rewritten from the records at the start, so that a resumed run's
  file matches its ``metrics.jsonl``."""

  NAME = 'metrics.csv'

  def on_start(self, loop):
    self.columns = {}
    for w, idx in callbacks.groups(loop).items():
      rows = [r for i in idx for r in loop.runs[i].records]
      rows.sort(key=lambda r: r['round'])   # as metrics.jsonl holds them: by round, then run
      self.columns[w] = list(rows[0]) if rows else None
      with files.open_new(os.path.join(w, self.NAME), newline='') as f:
        if rows:
          self.write(f, w, rows, header=True)

  def write(self, f, w, rows, header):
    writer = csv.DictWriter(f, self.columns[w], extrasaction='ignore')
    if header:
      writer.writeheader()
    writer.writerows({k: cell(v) for k, v in r.items()} for r in rows)

  def on_evaluate(self, loop, done, records):
    for w, recs in by_workdir(loop, records).items():
      header = self.columns[w] is None
      if header:
        self.columns[w] = list(recs[0])
      with files.open_append(os.path.join(w, self.NAME), newline='') as f:
        self.write(f, w, recs, header)


def cell(value):
  """A CSV cell: NaN, infinities and None are empty (``read_csv`` reads them as NaN)."""
  if value is None or isinstance(value, float) and not math.isfinite(value):
    return ''
  return value


class TensorBoardWriter(callbacks.Callback):
  """TensorBoard event files: ``WORKDIR/tensorboard/`` for a run, ``.../tensorboard/<tags>/``
  for each run sharing a work directory; every numeric field of a record is a scalar at its
  round. At the start each run's folder is written afresh from its records (a resumed run's:
  those of ``metrics.jsonl`` up to its checkpoint), so that events buffered when a run was
  killed are not lost and none appears twice."""

  SKIP = ('round', 'seed')

  def on_start(self, loop):
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
    self.writers, self.logdirs = {}, {}
    for i, run in enumerate(loop.runs):
      name = ','.join(f'{k}={v:g}' for k, v in run.tags.items())
      self.logdirs[i] = logdir = os.path.join(run.workdir, 'tensorboard', name)
      shutil.rmtree(logdir, ignore_errors=True)
      with files.naming(logdir):
        self.writers[i] = SummaryWriter(logdir)
      for record in run.records:
        self.add(loop, i, record)
    self.flush()

  def add(self, loop, i: int, record: dict):
    with files.naming(self.logdirs[i]):
      for k, v in record.items():
        if (k not in self.SKIP and k not in loop.runs[i].tags and isinstance(v, (int, float))
            and not isinstance(v, bool)):
          self.writers[i].add_scalar(k, v, record['round'])

  def flush(self):
    for i, w in self.writers.items():
      with files.naming(self.logdirs[i]):
        w.flush()
    self.flushed = time.monotonic()

  FLUSH_S = 5.   # events reach the disk at most this many seconds late (and at the end)

  def on_evaluate(self, loop, done, records):
    del done   # each record holds its round
    for i, record in records.items():
      self.add(loop, i, record)
    if time.monotonic() - self.flushed > self.FLUSH_S:   # a flush per record costs more than
      self.flush()                                         # the rounds of a small run

  def close(self, loop, *args):
    del args
    for i, w in self.writers.items():
      with files.naming(self.logdirs[i]):
        w.close()

  on_interrupt = close
  on_end = close
