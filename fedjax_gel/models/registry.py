"""The registry of models: every ``ModelSpec`` that ``--model`` and ``get_model`` build by name.

Adding a built-in model is one module holding its builder and its ``ModelSpec`` plus one entry
in ``BUILTIN`` below; from your own code, ``register_model(ModelSpec(...))`` (or
``register_model(name, build, tokens=...)``) before building configs or flags.
"""
from __future__ import annotations

from typing import Callable, Iterator, Mapping

from fedjax_gel.models.cnn import CELEBA_CNN, CIFAR_CNN, FEMNIST_CNN, GEL_FEMNIST_CNN
from fedjax_gel.models.logistic import LOGISTIC, MLP_SPEC
from fedjax_gel.models.rnn import SENT140_LSTM, SHAKESPEARE_LSTM
from fedjax_gel.spec import ModelSpec, Registry

BUILTIN = (LOGISTIC, MLP_SPEC, FEMNIST_CNN, GEL_FEMNIST_CNN, CELEBA_CNN, CIFAR_CNN,
           SHAKESPEARE_LSTM, SENT140_LSTM)

MODEL_SPECS: Registry[ModelSpec] = Registry('model')


def _check(spec: ModelSpec):
  if not callable(spec.build):
    raise ValueError(f'register_model: build must be callable, got {type(spec.build).__name__}')


def register_model(spec: ModelSpec | str, build: Callable | None = None, *,
                   tokens: bool = False) -> ModelSpec:
  """Registers a model: ``--model=<name>``, ``get_model(name, ...)``, the user guide's table.

  Call it before building configs or flags. ``build(input_shape, num_classes, **options) ->
  Model`` (``from_linen`` / ``from_nnx`` wrap a Flax module) is called with the training
  features' shape ``[*input_shape]`` and the outputs it needs: ``max label + 1`` classes for
  integer labels, the size of one target for float targets (a regression model: its
  ``Model.task`` says how it is scored).

  Args:
    spec: the model's ``ModelSpec``; or its name, with ``build`` (``register_model(name, build,
      tokens=False)`` is ``register_model(ModelSpec(name, build, tokens))``: its options are
      ``build``'s keyword arguments).
    build: with a name, the builder.
    tokens: with a name, the model reads int token ids and is built with ``vocab_size=`` (the
      largest id + 1) too.

  Returns:
    The registered ``ModelSpec``.

  Raises:
    ValueError: a name taken, or a ``build`` that is not callable.

  Examples:
    >>> import jax.numpy as jnp
    >>> import flax.linen as nn
    >>> import fedjax_gel as fg
    >>> from fedjax_gel import models
    >>> def two_layer(input_shape, num_classes, dropout=0.):
    ...   module = nn.Sequential([nn.Dense(32), nn.relu, nn.Dense(num_classes)])
    ...   return models.from_linen('two_layer', module, input_shape, jnp.float32, num_classes)
    >>> spec = fg.register_model(models.ModelSpec('two_layer', two_layer))
    >>> fg.get_model('two_layer', (60,), 5).num_classes
    5
    >>> models.unregister_model('two_layer')
  """
  if not isinstance(spec, ModelSpec):
    spec = ModelSpec(spec, build, tokens=tokens)
  return MODEL_SPECS.register(spec, _check)


def unregister_model(name: str):
  """Removes a registered model (tests that register a toy one clean up with it).

  Args:
    name: the model's name.

  Raises:
    ValueError: a built-in model (``get_model`` keeps built-in models once built).
  """
  if name in MODEL_SPECS.builtin:
    raise ValueError(f'unregister_model: {name!r} is a built-in model')
  MODEL_SPECS.unregister(name)


def get(name: str) -> ModelSpec:
  """The spec of ``name``; ``KeyError`` for an unknown one."""
  return MODEL_SPECS.get(name)


def names() -> tuple[str, ...]:
  return MODEL_SPECS.names()


def specs() -> tuple[ModelSpec, ...]:
  return MODEL_SPECS.specs()


def token_models() -> tuple[str, ...]:
  """The models of token ids (``ModelSpec.tokens``)."""
  return tuple(s.name for s in specs() if s.tokens)


class Builders(Mapping):
  """``{name: build}`` of the registered models, read-only (``models.MODELS``)."""

  def __getitem__(self, name: str) -> Callable:
    return get(name).build

  def __iter__(self) -> Iterator[str]:
    return iter(names())

  def __len__(self) -> int:
    return len(names())


def markdown_table() -> str:
  """The user guide's table of models (docs/user-guide.md): name, architecture, parameters,
  options."""
  rows = ['| `--model` | architecture | parameters | options |', '|---|---|---|---|']
  for spec in specs():
    options = ', '.join(f'`--{o}`' for o in spec.takes()[0]) or '-'
    tokens = ' (token ids)' if spec.tokens else ''
    rows.append(f'| `{spec.name}`{tokens} | {spec.architecture} | {spec.parameters} | '
                f'{options} |')
  return '\n'.join(rows)


MODEL_SPECS.add_builtin(BUILTIN)
