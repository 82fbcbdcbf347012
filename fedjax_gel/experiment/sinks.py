"""Metric sinks: where the evaluations' records go, each a loop callback.

* ``JsonlWriter``: ``metrics.jsonl``, one JSON object per record (NaN written as ``null``);
* ``CsvWriter``: ``metrics.csv`` with a header (``pandas.read_csv`` loads it);
* ``TensorBoardWriter``: TensorBoard event files under ``tensorboard/`` (tensorboardX's protocol
  buffers, no TensorFlow), one scalar per numeric field and round, appended at each evaluation;
  rewritten from the records at the start, as ``metrics.csv`` is, so that a resumed run's events
  are its ``metrics.jsonl``'s: none lost in a kill, none twice.

Each writes from the loop's own thread and holds no file open between evaluations: a failed
write (a full disk) is an ``OSError`` naming its file, raised where it happens, and the command
ends with one line (``cli.os_error``); what a failed write left half-written is rewritten or cut
back when the same command resumes.

A work directory shared by several runs (a grid's cells) gets their records in one file, told
apart by their tags (e.g. ``client_lr, server_lr``), and one TensorBoard folder per run.
"""
from __future__ import annotations

import csv
import math
import os
import shutil
import socket
import struct
import time

from fedjax_gel.experiment import callbacks, files


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
        f.write(''.join(files.json_line(r) for r in recs))


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
  for each run sharing a work directory; every numeric field of a record that has a value (not
  NaN or infinite: ``null`` in ``metrics.jsonl``) is a scalar at its round, one event per record.
  At the start each run's folder is written afresh from its records (a resumed run's: those of
  ``metrics.jsonl`` up to its checkpoint), so that a resumed run's events are an uninterrupted
  one's: none that a killed or failed run left is lost, and none appears twice.

  The events are appended to the run's event file at each evaluation, from the loop's thread,
  as ``metrics.jsonl``'s lines are (``files.open_append``; TensorBoard's record format:
  ``event_bytes``). tensorboardX's ``SummaryWriter`` is not used: it writes from a thread of its
  own fed through a queue of 10 events, and on a full disk that thread died of the ``OSError``
  while the loop went on adding events, waiting forever for room in the queue; the command hung
  holding its work directory's lock, so the same command run again was refused as a second
  writer. Written here, nothing is left to flush or to close, and no thread to wait for."""

  SKIP = ('round', 'seed')

  def on_start(self, loop):
    self.paths = {}
    for i, run in enumerate(loop.runs):
      name = ','.join(f'{k}={v:g}' for k, v in run.tags.items())
      logdir = os.path.join(run.workdir, 'tensorboard', name)
      shutil.rmtree(logdir, ignore_errors=True)
      os.makedirs(logdir, exist_ok=True)
      self.paths[i] = path = os.path.join(logdir, event_file_name())
      events = [self.event(loop, i, record) for record in run.records]
      with files.open_new(path, 'wb') as f:
        f.write(event_bytes([version_event()] + events))

  def event(self, loop, i: int, record: dict):
    """Run ``i``'s ``record`` as an ``Event``: its finite numbers but the round, the seed and
    the run's tags, scalars at the record's round."""
    from tensorboardX.proto import event_pb2, summary_pb2  # pylint: disable=g-import-not-at-top
    values = [summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in record.items()
              if k not in self.SKIP and k not in loop.runs[i].tags
              and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    return event_pb2.Event(wall_time=time.time(), step=record['round'],
                           summary=summary_pb2.Summary(value=values))

  def on_evaluate(self, loop, done, records):
    del done   # each record holds its round
    for i, record in records.items():
      with files.open_append(self.paths[i], 'ab') as f:
        f.write(event_bytes([self.event(loop, i, record)]))


def event_file_name() -> str:
  """An event file's name as TensorBoard looks for it (``events.out.tfevents.<time>.<host>``)."""
  return f'events.out.tfevents.{int(time.time())}.{socket.gethostname()}'


def version_event():
  """The ``Event`` an event file starts with: its format's version."""
  from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
  return event_pb2.Event(wall_time=time.time(), file_version='brain.Event:2')


def event_bytes(events) -> bytes:
  """``events`` as records of an event file (TFRecord): each its length (uint64), the length's
  masked CRC-32C, the serialised ``Event`` and its masked CRC-32C, little-endian."""
  from tensorboardX.record_writer import masked_crc32c  # pylint: disable=g-import-not-at-top
  out = []
  for event in events:
    data = event.SerializeToString()
    header = struct.pack('<Q', len(data))
    out += [header, struct.pack('<I', masked_crc32c(header)), data,
            struct.pack('<I', masked_crc32c(data))]
  return b''.join(out)
