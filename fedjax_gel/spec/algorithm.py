"""Algorithms declared by spec: a name, a hyper-parameter record, a builder and properties.

An ``AlgorithmSpec`` is what an experiment needs to know about an algorithm before it builds
one: its hyper-parameters (a frozen dataclass whose fields carry their default, help text and
check, ``hparam``), how to build the ``FederatedAlgorithm`` from them and from the experiment's
``Setting`` (model, loss, client learning rate, server optimiser, population), and properties
the experiment plans with (per-client state, a pre-pass over the clients' data such as Mime's,
guessed steps, a fixed server optimiser). ``fedjax_gel.algorithms.registry`` collects the
specs; the command line's flags, their validation and the user guide's algorithm table are
generated from it.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from fedjax_gel.core.algorithm import FederatedAlgorithm
from fedjax_gel.spec.hparams import NoHparams, problems


class Setting(NamedTuple):
  """What a builder gets from the experiment besides the algorithm's own hyper-parameters.

  ``client_lr``, ``client_momentum`` and the server optimiser's learning rate may be traced
  values when several runs train as one program (``core.runs``).

  Attributes:
    model: the ``fedjax_gel.models.Model``.
    loss: ``loss(params, batch)``, the model's task loss (``models.task_loss``).
    client_lr: the clients' learning rate (``--client_lr``).
    client_momentum: the clients' momentum (``--client_momentum``).
    server: the server's ``optax.GradientTransformation``, applied to ``Delta``.
    counts: the training clients' example counts (the population).
    uniform_weights: the clients are weighted equally (not by their data).
  """
  model: Any
  loss: Callable
  client_lr: Any
  client_momentum: Any
  server: Any
  counts: np.ndarray
  uniform_weights: bool = False


@dataclasses.dataclass(frozen=True)
class AlgorithmSpec:
  """One registered algorithm.

  Attributes:
    name: the ``--algorithm`` value.
    build: ``(hparams, Setting) -> FederatedAlgorithm``.
    hparams: the frozen dataclass of its hyper-parameters (fields made with ``hparam``; a
      field's name is its flag's, shared by every algorithm that reads it).
    client: what its clients do, in words (tables).
    server: what its server does, in words (tables).
    paper: the paper (authors, year, title) and where in it.
    momentum: its clients read ``Setting.client_momentum``.
    stateful: it keeps a row per client (``FederatedAlgorithm.store_row``).
    pre_pass: ``FederatedAlgorithm.pre_pass``.
    guesses: it takes guessed steps (``FederatedAlgorithm.client_guesses``).
    server_optimizer: the server optimiser it fixes (FedOpt), else None: the experiment's.
    own_server: its server step is its own (FedDyn, AdaBest, FedExP, the FedGBO family): it
      applies no server optimiser, so ``Setting.server`` and the ``--server_*`` flags are not
      read (the experiment layer refuses them unless another algorithm of the command reads
      them).
    base: with ``server_optimizer``, the algorithm it is with that server optimiser; the
      experiment layer refuses ``base`` with ``server_optimizer`` in its favour (one name per
      run: ``fedyogi``, not ``fedavg`` with ``--server_optimizer=fedyogi``).
    check: ``config -> problem or None``, a rule across its hyper-parameters and the rest of
      the experiment's ``Config`` (the model, the budgets, ...), checked after every field's
      own check.
    run_name: ``hparams -> name`` of its runs, when it differs from ``name``.
    variants: hyper-parameters that take several values at once (``--gbo_optimizer=sgdm,adam``:
      the algorithm runs once per value, a sweep), their runs told apart by ``run_name``.
    paired_with: the algorithm its runs are compared with in reports when both ran (GeL's
      speedups: ``fedavgcm`` for ``gel``), else the command's first.
    upload_delta: its upload is its model delta and nothing else, so client-level differential
      privacy can clip and noise it (``fedjax_gel.privacy.private``); the others are refused
      with ``--dp_clip_norm``.
    private: it is differentially private by definition (``dp_fedavg``): it needs
      ``--dp_clip_norm``.
  """
  name: str
  build: Callable[[Any, Setting], FederatedAlgorithm]
  hparams: type = NoHparams
  client: str = 'SGD'
  server: str = '`--server_optimizer` on `Delta`'
  paper: str = ''
  momentum: bool = False
  stateful: bool = False
  pre_pass: str = 'none'
  guesses: bool = False
  server_optimizer: str | None = None
  own_server: bool = False
  base: str = ''
  check: Callable[[Any], Optional[str]] | None = None
  run_name: Callable[[Any], str] | None = None
  variants: tuple[str, ...] = ()
  paired_with: str = ''
  upload_delta: bool = False
  private: bool = False

  def problems(self, config) -> list[str]:
    """What is wrong with ``config.algorithm.hparams`` for this algorithm, and with the rest of
    ``config`` for them (``check``), one line each."""
    found = problems(config.algorithm.hparams)
    if not found and self.check is not None:
      found += [p for p in [self.check(config)] if p]
    return found

  def name_of_run(self, hparams) -> str:
    return self.name if self.run_name is None else self.run_name(hparams)
