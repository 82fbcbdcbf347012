"""A one-line progress report with rounds/s and ETA."""
from __future__ import annotations

import sys
import time


def format_seconds(s: float) -> str:
  s = int(round(s))
  return f'{s // 3600:d}:{s % 3600 // 60:02d}:{s % 60:02d}'


class Progress:
  """Rewrites one status line on a terminal; prints one line per evaluation otherwise."""

  def __init__(self, total_rounds: int, stream=None, label: str = ''):
    self.total = total_rounds
    self.label = label   # the run the line is about (algorithm, seed or grid), as its prefix
    self.stream = stream or sys.stderr
    self.tty = getattr(self.stream, 'isatty', lambda: False)()
    self.start = None
    self.start_round = 0

  def begin(self, round_idx: int = 0):
    """Starts the clock (call after compilation so the rate excludes it)."""
    self.start, self.start_round = time.perf_counter(), round_idx

  def line(self, done: int, extra: str = '') -> str:
    elapsed = time.perf_counter() - (self.start or time.perf_counter())
    rate = (done - self.start_round) / elapsed if elapsed > 0 else 0.
    eta = (self.total - done) / rate if rate > 0 else float('nan')
    eta_s = format_seconds(eta) if eta == eta else '?'
    return (f'{self.label} | ' if self.label else '') + (
        f'round {done}/{self.total} | {rate:.2f} rounds/s | ETA {eta_s}') + (
            f' | {extra}' if extra else '')

  def update(self, done: int, extra: str = '', force: bool = False):
    if self.tty:
      self.stream.write('\r' + self.line(done, extra).ljust(100))
      self.stream.flush()
    elif force:
      self.stream.write(self.line(done, extra) + '\n')
      self.stream.flush()

  def note(self, text: str):
    """A line of its own (on a terminal, below the status line)."""
    self.stream.write(('\r' + ' ' * 100 + '\r' if self.tty else '') + text + '\n')
    self.stream.flush()

  def compiled(self, seconds: float, start: int):
    """The line before the first round: compilation time, and where a resumed run starts."""
    self.note(f'{self.label}: the round compiled in {seconds:.1f} s' +
              (f'; resuming from the checkpoint of round {start}' if start else ''))

  def close(self):
    if self.tty:
      self.stream.write('\n')
      self.stream.flush()
