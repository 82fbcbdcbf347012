"""The text of an error line: every user error is one line (naming the flag or file and what is
wrong), whatever the library below said or a user's value held.
"""
from __future__ import annotations

import traceback


def first_line(e: BaseException) -> str:
  """The first line of ``e``'s message (its type's name when it has none), for one-line
  errors that quote a library's reason."""
  text = str(e).strip()
  return text.splitlines()[0] if text else type(e).__name__


def shorter(text: str, width: int = 80) -> str:
  """``text`` cut to ``width`` characters (an error line quotes it)."""
  return text if len(text) <= width else text[:width - 3] + '...'


def one_line(message: str) -> str:
  """``message`` with every character that is not printable (a line break, a tab, an escape)
  written as its escape: an error is one line, whatever a user's path or value held (the
  paths an error names are ``shown`` where it is made; this keeps any other text in line)."""
  return ''.join(c if c.isprintable() else repr(c)[1:-1] for c in message)


def raised_at(e: BaseException) -> str:
  """``at FILE:LINE: Type: message`` of the innermost frame that raised ``e`` (code of the
  user's own, a registered loader or model, whose failure is one line, not a traceback)."""
  frames = traceback.extract_tb(e.__traceback__)
  at = f'at {frames[-1].filename}:{frames[-1].lineno}: ' if frames else ''
  return f'{at}{type(e).__name__}: {first_line(e)}'
