"""The public API's docstrings are in one style, Google's, as the API reference renders them.

The public names are each package's ``__all__`` (and the algorithm registry's). Every one has a
docstring whose first line is a one-line summary (a sentence ending in a full stop, then a blank
line or nothing); every function or class among them that takes arguments names each one in an
``Args:`` section, or, for a NamedTuple or a dataclass, each field in an ``Attributes:`` section;
the sections parse without a warning; and ``Examples:`` run as doctests. Docstrings are read
and parsed as mkdocstrings reads them (griffe, Google style, with mkdocs.yml's options); a
constant's is the string literal after its assignment, which the reference shows under its name.
"""
from __future__ import annotations

import dataclasses
import doctest
import functools
import importlib
import inspect
import logging
import types

import pytest

MODULES = ('fedjax_gel', 'fedjax_gel.core', 'fedjax_gel.algorithms',
           'fedjax_gel.algorithms.registry', 'fedjax_gel.optim', 'fedjax_gel.privacy',
           'fedjax_gel.models', 'fedjax_gel.data', 'fedjax_gel.spec', 'fedjax_gel.experiment')
# Fields every Flax module has (its place in a module tree), documented by Flax.
FLAX_FIELDS = ('parent', 'name')


def public_names() -> list[tuple[str, str]]:
  return [(m, n) for m in MODULES for n in importlib.import_module(m).__all__]


def griffe_module():
  """griffe (mkdocstrings' reader and parser); the test is skipped without it."""
  return pytest.importorskip('griffe', reason="griffe (mkdocstrings' parser) is not installed "
                             "(pip install -e '.[docs]')")


@functools.lru_cache(maxsize=None)
def static_package():
  """The package as griffe reads it from the sources (what the API reference renders)."""
  griffe = griffe_module()
  loader = griffe.GriffeLoader(docstring_parser=griffe.Parser.google)
  package = loader.load('fedjax_gel')
  loader.resolve_aliases(implicit=False, external=False)
  return package


def constant_docstring(module: str, name: str) -> str | None:
  """The docstring after a constant's assignment, followed to the module that assigns it."""
  member = static_package()[module.removeprefix('fedjax_gel').lstrip('.')] if (
      module != 'fedjax_gel') else static_package()
  target = member[name]
  target = target.final_target if target.is_alias else target
  return target.docstring.value if target.docstring else None


def own_docstring(obj) -> str | None:
  """The object's own docstring (a class's, not inherited: ``inspect.getdoc`` would give a
  subclass its base's)."""
  doc = vars(obj).get('__doc__') if isinstance(obj, type) else getattr(obj, '__doc__', None)
  return inspect.cleandoc(doc) if doc else None


def is_record(cls) -> bool:
  return dataclasses.is_dataclass(cls) or (issubclass(cls, tuple) and hasattr(cls, '_fields'))


def fields(cls) -> list[str]:
  """A NamedTuple's or a dataclass's fields that its constructor takes."""
  if dataclasses.is_dataclass(cls):
    return [f.name for f in dataclasses.fields(cls) if f.init and f.name not in FLAX_FIELDS]
  return list(cls._fields)


def arguments(obj) -> list[str]:
  """The arguments a function takes, or a class's constructor where the package defines it
  (an exception that keeps ``Exception``'s takes none of its own)."""
  if isinstance(obj, type):
    own = [k for k in obj.__mro__ if k.__module__.startswith('fedjax_gel')
           and ('__init__' in vars(k) or '__new__' in vars(k))]
    if not own:
      return []
    obj = obj.__init__ if '__init__' in vars(own[0]) else obj.__new__
  params = inspect.signature(obj).parameters.values()
  return [p.name for p in params if p.name not in ('self', 'cls')]


def parse(doc: str, caplog) -> tuple[list, list[str]]:
  """The docstring's sections as griffe parses them with mkdocs.yml's options, and its
  warnings (an argument not in the signature is left to the site's build, which knows it)."""
  griffe = griffe_module()
  caplog.clear()
  with caplog.at_level(logging.WARNING, logger='griffe'):
    sections = griffe.Docstring(doc).parse(griffe.Parser.google, warn_missing_types=False,
                                           returns_multiple_items=False,
                                           warn_unknown_params=False)
  return sections, [r.getMessage() for r in caplog.records]


def documented(sections, kind: str) -> set[str]:
  return {item.name.lstrip('*') for s in sections if s.kind.value == kind for item in s.value}


def is_documented_itself(obj) -> bool:
  """Whether ``obj`` carries its own docstring (a module, a class or a function); a constant's
  is read from the source (``constant_docstring``)."""
  return isinstance(obj, (type, types.FunctionType, types.ModuleType)) or (
      callable(obj) and hasattr(obj, '__wrapped__'))


def docstring_of(module: str, name: str) -> tuple[object, str | None]:
  """``module.name`` and its docstring."""
  obj = getattr(importlib.import_module(module), name)
  return obj, own_docstring(obj) if is_documented_itself(obj) else constant_docstring(module, name)


def problems(module: str, name: str, caplog) -> list[str]:
  """What is wrong with the docstring of ``module.name`` (nothing: an empty list)."""
  obj, doc = docstring_of(module, name)
  callable_ = is_documented_itself(obj)
  if not doc:
    return ['no docstring']
  lines = doc.splitlines()
  found = []
  if not lines[0].strip().endswith('.') or (len(lines) > 1 and lines[1].strip()):
    found.append(f'the first line is no one-line summary: {lines[0]!r}')
  sections, warnings = parse(doc, caplog)
  found += [f'griffe: {w}' for w in warnings]
  if isinstance(obj, type) and is_record(obj):
    needed, kind, title = fields(obj), 'attributes', 'Attributes:'
  elif isinstance(obj, types.ModuleType) or not callable_:
    needed, kind, title = [], 'parameters', 'Args:'
  else:
    needed, kind, title = arguments(obj), 'parameters', 'Args:'
  missing = [n for n in needed if n not in documented(sections, kind)]
  if missing:
    found.append(f'{title} does not name {", ".join(missing)}')
  if any(s.kind.value == 'admonition' and s.title.lower() == 'example' for s in sections):
    found.append('"Example:" is an admonition, its code no code block: write "Examples:"')
  return found


def examples(doc: str, caplog) -> str:
  """The code of the docstring's ``Examples:`` section, as a doctest's text."""
  sections, _ = parse(doc, caplog)
  return '\n\n'.join(text for s in sections if s.kind.value == 'examples'
                      for kind, text in s.value if kind.value == 'examples')


def test_every_public_name_is_documented(caplog):
  """One failure lists every offending name (``module.name: what``)."""
  offending = {}
  for module, name in public_names():
    found = problems(module, name, caplog)
    if found:
      offending[f'{module}.{name}'] = found
  assert not offending, '\n'.join(f'{k}: {"; ".join(v)}' for k, v in sorted(offending.items()))


@pytest.mark.slow
def test_every_example_runs(caplog, tmp_path, monkeypatch):
  """Each docstring's ``Examples:`` run as a doctest (outputs compared), in a namespace and a
  folder of its own; one failure lists every example that fails, with doctest's report."""
  runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
  seen, failed, ran = set(), [], 0
  for module, name in public_names():
    obj, doc = docstring_of(module, name)
    key = id(obj) if is_documented_itself(obj) else (module, name)
    if not doc or key in seen:
      continue
    seen.add(key)
    text = examples(doc, caplog)
    if not text:
      continue
    folder = tmp_path / f'{module}.{name}'
    folder.mkdir()
    monkeypatch.chdir(folder)
    report = []
    test = doctest.DocTestParser().get_doctest(text, {}, f'{module}.{name}', None, 0)
    if runner.run(test, out=report.append).failed:
      failed.append(''.join(report))
    ran += 1
  assert ran >= 40, ran   # the examples are found
  assert not failed, '\n'.join(failed)


def test_the_registry_lists_its_public_functions():
  """``algorithms.registry`` names what it defines for users in ``__all__`` (its imports are
  not its API), so the test above and the reference see all of it."""
  from fedjax_gel.algorithms import registry  # pylint: disable=g-import-not-at-top
  defined = {n for n, v in vars(registry).items() if not n.startswith('_') and (
      getattr(v, '__module__', None) == registry.__name__)}
  assert defined <= set(registry.__all__), defined - set(registry.__all__)


def test_the_check_sees_a_missing_argument(caplog):
  """The check reads sections as griffe does: an undocumented argument is named."""
  def documented_badly(a, b):
    """Adds.

    Args:
      a: one.
    """
    return a + b
  module = types.ModuleType('fedjax_gel._doc_probe')
  module.f = documented_badly
  module.__all__ = ['f']
  import sys  # pylint: disable=g-import-not-at-top
  sys.modules[module.__name__] = module
  try:
    assert problems(module.__name__, 'f', caplog) == ['Args: does not name b']
  finally:
    del sys.modules[module.__name__]
