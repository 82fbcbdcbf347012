"""The documentation's pages, README.md and docs/**/*.md, and their fenced code blocks: the
examples the tests run and the ``launch/run.py`` commands they check.

A Python example is named by a comment on the line before its fence,
``<!-- example: NAME -->``, or ``<!-- example: NAME, after: OTHER -->`` for one that continues
the session of the example ``OTHER`` (its data, model and keys). The same example may be shown
on several pages (README.md repeats two of the docs' examples): its copies must be the same code.
"""
from __future__ import annotations

import os
import pathlib
import re
import shlex
from typing import NamedTuple, Optional

REPO = pathlib.Path(__file__).resolve().parents[1]
MARKER = re.compile(r'<!-- example: (?P<name>[\w-]+)(?:, after: (?P<after>[\w-]+))? -->')
FENCE = re.compile(r'```(?P<lang>[\w-]*)\s*')
# Shell variables the pages' commands use that are not set when the tests run: a loop variable
# stands for its first value.
SHELL_VALUES = {'i': '0'}


class Block(NamedTuple):
  page: str               # relative to the repository
  line: int               # the opening fence's line, from 1
  lang: str               # python, bash, ... ('' for none)
  name: Optional[str]     # the example's name (its marker), None without one
  after: Optional[str]    # the example it continues
  code: str

  @property
  def where(self) -> str:
    return f'{self.page}:{self.line}'


def pages() -> list[str]:
  """README.md and every Markdown page of the documentation site."""
  docs = sorted(p.relative_to(REPO).as_posix() for p in (REPO / 'docs').rglob('*.md'))
  return ['README.md', *docs]


def blocks(lang: Optional[str] = None) -> list[Block]:
  """The fenced code blocks of every page (of language ``lang``), in page order."""
  found = []
  for page in pages():
    lines = (REPO / page).read_text().splitlines()
    i = 0
    while i < len(lines):
      fence = FENCE.fullmatch(lines[i])
      if fence:
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == '```'), None)
        assert end is not None, f'{page}:{i + 1}: a code block without its closing fence'
        marker = MARKER.fullmatch(lines[i - 1].strip()) if i else None
        found.append(Block(page, i + 1, fence['lang'], marker and marker['name'],
                           marker and marker['after'], '\n'.join(lines[i + 1:end]) + '\n'))
        i = end
      i += 1
  return [b for b in found if lang is None or b.lang == lang]


def examples() -> dict[str, Block]:
  """The named Python examples by name (one copy of each; ``check_copies`` compares them)."""
  found = {}
  for block in blocks('python'):
    if block.name is not None:
      found.setdefault(block.name, block)
  return found


def example(name: str) -> str:
  """The code of the example ``name``."""
  found = examples()
  if name not in found:
    raise KeyError(f'no page has the example {name!r} (<!-- example: {name} -->); '
                   f'there are {sorted(found)}')
  return found[name].code


def run(name: str, code: Optional[str] = None, scope: Optional[dict] = None) -> dict:
  """Runs the example ``name`` (or ``code`` in its place) in ``scope`` (a fresh one by
  default), after the examples it continues; returns the scope."""
  block = examples()[name]
  scope = {} if scope is None else scope
  if block.after is not None:
    run(block.after, scope=scope)
  text = block.code if code is None else code
  exec(compile(text, f'{block.where} ({name})', 'exec'), scope)   # pylint: disable=exec-used
  return scope


def launcher_commands() -> list[tuple[str, list[str]]]:
  """Every ``launch/run.py`` command of the pages' bash blocks: where it is and its arguments
  (continued lines joined, comments dropped, shell variables set)."""
  found = []
  for block in blocks('bash'):
    text = re.sub(r'\\\n\s*', ' ', block.code)
    for line in text.splitlines():
      line = re.sub(r'(^|\s)#.*', '', line)
      for command in re.finditer(r'launch/run\.py\b([^;&|\'"]*)', line):
        args = shlex.split(command.group(1))
        args = [re.sub(r'\$(\w+)', lambda m: SHELL_VALUES.get(m[1], m[0]), a) for a in args]
        found.append((block.where, args))
  return found


def relative_links(page: str) -> list[str]:
  """The targets of the Markdown links of ``page`` that are not web addresses or anchors."""
  text = re.sub(r'```.*?```', '', (REPO / page).read_text(), flags=re.S)
  targets = re.findall(r'\]\(([^)\s]+)\)', text)
  return [t for t in targets if not re.match(r'[a-z]+:|#', t)]


def link_exists(page: str, target: str) -> bool:
  """Whether the file a relative link of ``page`` points to exists."""
  path = target.split('#')[0]
  return (REPO / os.path.dirname(page) / path).exists()
