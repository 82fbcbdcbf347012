"""Progress output: a bar with the rate and ETA on a terminal (tqdm, its rate a moving
average), a plain line at each evaluation elsewhere (a log file, a pipe, a batch system's
output), its rate over the last ``WINDOW_S`` seconds of rounds (and at least the last two
updates). Either way a checkpoint or an evaluation slows the rate for a while, not for the rest
of the run (a rate averaged since the start halved at each checkpoint of a short run), and the
ETA follows it.
"""
from __future__ import annotations

import collections
import sys
import time

WINDOW_S = 30.


def format_seconds(s: float) -> str:
  s = int(round(s))
  return f'{s // 3600:d}:{s % 3600 // 60:02d}:{s % 60:02d}'


class Progress:
  """One run's (or one program's runs') progress, labelled ``label``: a tqdm bar on a terminal,
  else a line per forced update (each evaluation); ``note`` writes a line of its own."""

  def __init__(self, total_rounds: int, stream=None, label: str = ''):
    self.total = total_rounds
    self.label = label   # the run the line is about (algorithm, seed or grid), as its prefix
    self.stream = stream or sys.stderr
    self.tty = getattr(self.stream, 'isatty', lambda: False)()
    self.start = None
    self.marks = collections.deque()   # (time, round) of the recent updates
    self.bar = None

  def begin(self, round_idx: int = 0):
    """Starts the clock at round ``round_idx`` (call after compilation so the rate excludes
    it); on a terminal, shows the bar."""
    self.start = time.perf_counter()
    self.marks = collections.deque([(self.start, round_idx)])
    if self.tty:
      from tqdm import tqdm  # pylint: disable=g-import-not-at-top
      self.bar = tqdm(total=self.total, initial=round_idx, file=self.stream,
                      desc=self.label or None, unit='round', dynamic_ncols=True,
                      bar_format='{desc}: {n}/{total} rounds |{bar}| {rate_fmt} ETA {remaining}'
                                 '{postfix}')

  def rate(self, done: int, now: float | None = None) -> float:
    """Rounds per second over the recent window, with round ``done`` reached ``now``."""
    now = time.perf_counter() if now is None else now
    if not self.marks or now <= self.marks[0][0]:
      return 0.
    self.marks.append((now, done))
    while len(self.marks) > 2 and self.marks[1][0] <= now - WINDOW_S:
      self.marks.popleft()
    t0, r0 = self.marks[0]
    return (done - r0) / (now - t0)

  def line(self, done: int, extra: str = '') -> str:
    rate = self.rate(done)
    eta = (self.total - done) / rate if rate > 0 else float('nan')
    eta_s = format_seconds(eta) if eta == eta else '?'
    return (f'{self.label} | ' if self.label else '') + (
        f'round {done}/{self.total} | {rate:.2f} rounds/s | ETA {eta_s}') + (
            f' | {extra}' if extra else '')

  def update(self, done: int, extra: str = '', force: bool = False):
    """Round ``done`` reached; ``extra`` (the evaluation's figures) shown beside it. Off a
    terminal a line is written only when ``force``d."""
    if self.bar is not None:   # tqdm redraws at most every 0.1 s
      if extra:
        self.bar.set_postfix_str(extra, refresh=False)
      self.bar.update(done - self.bar.n)
      if force:
        self.bar.refresh()
    elif force:
      self.stream.write(self.line(done, extra) + '\n')
      self.stream.flush()
    else:
      self.rate(done)   # the window's marks

  def note(self, text: str):
    """A line of its own (on a terminal, above the bar)."""
    if self.bar is not None:
      self.bar.clear()
    self.stream.write(text + '\n')
    self.stream.flush()
    if self.bar is not None:
      self.bar.refresh()

  def compiled(self, seconds: float, start: int):
    """The line before the first round: compilation time, and where a resumed run starts."""
    self.note(f'{self.label}: the round compiled in {seconds:.1f} s' +
              (f'; resuming from the checkpoint of round {start}' if start else ''))

  def close(self):
    if self.bar is not None:
      self.bar.close()
      self.bar = None
