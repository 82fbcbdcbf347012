"""Models declared by spec: a name, a builder and the options it takes.

A ``ModelSpec`` is what the experiment needs to know about a model before it builds one for the
data: the builder ``build(input_shape, num_classes, **options) -> Model``, whether it reads
token ids (and is built with ``vocab_size=`` too), and which of the model options of the
command line (``--dropout``, ``--batch_norm``: ``experiment.config.ModelConfig``) it takes, so
that one set for a model without it is refused rather than ignored.
``fedjax_gel.models.registry`` collects the specs; ``--model`` and the user guide's table come from
it.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Callable

# The builder's own arguments, never options.
SHAPE_ARGUMENTS = ('input_shape', 'num_classes', 'vocab_size')


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """One registered model.

  Attributes:
    name: the ``--model`` value.
    build: ``(input_shape, num_classes, **options) -> Model`` (``models.from_linen`` and
      ``from_nnx`` wrap a Flax module), called with the training features' shape and the
      outputs the data needs (``max label + 1`` classes, or the size of one float target).
    tokens: it reads int token ids and is built with ``vocab_size=`` (the largest id + 1).
    options: the options it takes (``dropout``, ``batch_norm``, ...: keyword arguments of
      ``build``); None: ``build``'s keyword arguments, from its signature (``**options``: any).
    architecture: what it is, in words (the user guide's table).
    parameters: its size, in words (the user guide's table).
  """
  name: str
  build: Callable
  tokens: bool = False
  options: tuple[str, ...] | None = None
  architecture: str = ''
  parameters: str = ''

  def takes(self) -> tuple[tuple[str, ...], bool]:
    """``(options, any)``: the options it takes, and whether ``build`` takes any keyword
    (``**options``)."""
    if self.options is not None:
      return tuple(self.options), False
    try:
      params = inspect.signature(self.build).parameters
    except (TypeError, ValueError):
      return (), False
    return (tuple(p for p in params if p not in SHAPE_ARGUMENTS and
                  params[p].kind not in (inspect.Parameter.VAR_KEYWORD,
                                         inspect.Parameter.VAR_POSITIONAL)),
            any(p.kind == p.VAR_KEYWORD for p in params.values()))
