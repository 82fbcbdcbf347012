"""Cohort and budget samplers, paired across algorithms by (seed, round)."""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_gel.core import keys
from fedjax_gel.core.checks import INT32_MAX, is_whole, positive_int
from fedjax_gel.core.shuffle import epoch_steps

WEIGHTINGS = ('samples_seen', 'num_examples', 'uniform')
"""The aggregation weightings ``CohortSpec.weighting`` takes (``aggregation_weights``)."""
SELECTIONS = ('uniform', 'cyclic', 'poisson')
"""The client selections ``CohortSpec.selection`` takes."""
# Poisson sampling's slots: the chance that a round draws more clients than its slots hold
POISSON_TAIL = 1e-12
BUDGET_UNITS = ('steps', 'epochs')
BUDGET_DRAWS = ('uniform', 'proportional', 'per_client')


def reads_sizes(budget_unit: str, budget_draw: str) -> bool:
  """Whether budgets of this unit and draw read the clients' sizes, and so the population's
  largest (``CohortSpec.max_examples``): epochs, or budgets proportional to the data."""
  return budget_unit == 'epochs' or budget_draw == 'proportional'


@dataclasses.dataclass(frozen=True)
class CohortSpec:
  """How a round's cohort is drawn: given once, read by the sampler and by the round.

  A client's local work is ``u_i`` units in ``[a, b]`` (``budget_range``), drawn by
  ``budget_draw`` and counted in ``budget_unit``:

  * ``'steps'``: ``tau_i = u_i`` minibatch steps of ``B`` examples, taken from the client's
    examples shuffled once per round and cycled when ``tau_i B > n_i`` (the GeL protocol);
  * ``'epochs'``: ``u_i = E_i`` passes over the client's data, ``tau_i = E_i ceil(n_i / B)``
    steps: each epoch is a new shuffle of the client's examples cut into ``ceil(n_i / B)``
    minibatches, the last one short (``n_i - (ceil(n_i / B) - 1) B`` examples; its other rows
    masked through ``batch['mask']``, which the loss must honour, as the built-in losses do).
    This is FedJAX's ``ShuffleRepeatBatchHParams(num_epochs=E, drop_remainder=False)`` except
    that FedJAX batches across epoch boundaries (``ceil(E n_i / B)`` steps, only the very last
    minibatch short) where every epoch here ends on its own short minibatch, as a PyTorch
    ``DataLoader(shuffle=True)`` epoch does.

  ``budget_draw``: ``'uniform'``, ``u_i ~ U{a..b}`` per client and round; ``'proportional'``,
  ``u_i = clip(round(b n_i / n_max), a, b)`` (``n_max = max_examples``, the population's largest
  client: more data, more work); ``'per_client'``, a fixed ``u_i`` per client given to
  ``sample_cohort`` (``client_budgets``; e.g. the devices' speeds).

  Attributes:
    cohort_size: ``C``, clients per round.
    budget_range: ``(a, b)``, ``1 <= a <= b``: the units' range; ``max_budget`` (from ``b``)
      sizes the round's data-order buffer and its longest loop.
    batch_size: ``B``, examples per local step (also in the ``samples_seen`` weights).
    replace: sample clients with replacement (default False: the GeL paper selects its clients
      "uniformly at random"; the GeL code samples with replacement).
    weighting: aggregation weights, one of ``WEIGHTINGS`` (default ``num_examples``, the GeL
      paper's ``p_i = n_i / n``; the GeL code's is ``samples_seen``).
    selection: ``'uniform'``, ``'cyclic'`` (``groups`` groups; Cho et al. 2023) or
      ``'poisson'`` (each client independently with probability ``rate``; ``cohort_size`` is
      then the round's slots, ``poisson_slots``, and the slots no drawn client fills are
      absent: ``Cohort.present``).
    groups: cyclic participation's number of groups ``K``.
    budget_unit: one of ``BUDGET_UNITS``.
    budget_draw: one of ``BUDGET_DRAWS``.
    max_examples: the population's largest ``n_i`` (``int(counts.max())``): needed by
      ``'epochs'`` and ``'proportional'``.
    rate: Poisson sampling's ``q`` in ``(0, 1]`` (read only with ``selection='poisson'``).

  Raises:
    ValueError: a field outside its range or not one of its values (a reversed or empty budget
      range, a size below 1 or not a whole number, an unknown weighting, ...), or a round of
      more than ``INT32_MAX`` examples.

  Examples:
    >>> import fedjax_gel as fg
    >>> spec = fg.CohortSpec(cohort_size=20, budget_range=(4, 13), batch_size=5)
    >>> spec.max_budget
    13
    >>> fg.CohortSpec(cohort_size=10, budget_range=(1, 2), batch_size=32, budget_unit='epochs',
    ...               max_examples=100).max_budget
    8
  """
  cohort_size: int
  budget_range: tuple[int, int]
  batch_size: int
  replace: bool = False
  weighting: str = 'num_examples'
  selection: str = 'uniform'
  groups: int = 1
  budget_unit: str = 'steps'
  budget_draw: str = 'uniform'
  max_examples: int = 0
  rate: float = 0.

  def __post_init__(self):
    given = self.budget_range
    if not isinstance(given, (tuple, list)) or len(given) != 2 or not all(map(is_whole, given)):
      raise ValueError(f'CohortSpec: budget_range must be (a, b) of integers, got {given!r}')
    object.__setattr__(self, 'budget_range', tuple(int(b) for b in given))
    a, b = self.budget_range
    if not 1 <= a <= b:
      raise ValueError(f'CohortSpec: budget_range (a, b) needs 1 <= a <= b, got ({a}, {b})')
    for name in ('cohort_size', 'batch_size', 'groups'):
      object.__setattr__(self, name, positive_int('CohortSpec', name, getattr(self, name)))
    if not isinstance(self.replace, (bool, np.bool_)):
      raise ValueError(f'CohortSpec: replace must be True or False, got {self.replace!r}')
    object.__setattr__(self, 'replace', bool(self.replace))
    if self.weighting not in WEIGHTINGS:
      raise ValueError(f'CohortSpec: unknown weighting {self.weighting!r}; known: '
                       f'{", ".join(WEIGHTINGS)}')
    if self.selection not in SELECTIONS:
      raise ValueError(f'CohortSpec: unknown selection {self.selection!r}; known: '
                       f'{", ".join(SELECTIONS)}')
    if self.selection == 'poisson' and not (0 < self.rate <= 1 and not self.replace):
      raise ValueError(f'CohortSpec: Poisson sampling needs a rate in (0, 1] and replace=False '
                       f'(got rate {self.rate!r}, replace {self.replace})')
    for name, known in (('budget_unit', BUDGET_UNITS), ('budget_draw', BUDGET_DRAWS)):
      if getattr(self, name) not in known:
        raise ValueError(f'CohortSpec: unknown {name} {getattr(self, name)!r}; known: '
                         f'{", ".join(known)}')
    if reads_sizes(self.budget_unit, self.budget_draw) and not int(self.max_examples) >= 1:
      raise ValueError(f'CohortSpec: budget_unit={self.budget_unit!r} with budget_draw='
                       f'{self.budget_draw!r} needs max_examples, the largest client\'s number '
                       f'of examples (got {self.max_examples})')
    # the round counts, draws and indexes its examples in int32: an OverflowError deep in JAX,
    # or a crash of the runtime (a cohort of 2**40)
    examples = self.cohort_size * self.max_budget * self.batch_size
    if examples > INT32_MAX:
      raise ValueError(f'CohortSpec: a round of cohort_size x max_budget x batch_size = '
                       f'{self.cohort_size} x {self.max_budget} x {self.batch_size} = {examples} '
                       f'examples exceeds the int32 limit {INT32_MAX}')

  @property
  def steps_per_epoch(self) -> int:
    """``ceil(n_max / B)``: the longest epoch's steps (1 when budgets are in steps)."""
    if self.budget_unit != 'epochs':
      return 1
    return -(-int(self.max_examples) // self.batch_size)

  @property
  def max_budget(self) -> int:
    """The largest number of local steps: ``b``, or ``b ceil(n_max / B)`` in epochs."""
    return self.budget_range[1] * self.steps_per_epoch

  @property
  def equal_budgets(self) -> bool:
    """Whether every client takes the same number of steps (``a = b`` steps). The round then
    runs every client with examples ``b`` steps, unmasked, and reads no budget from the cohort
    (``core.round``); a hand-made cohort with other budgets needs a spec with ``a < b``."""
    return self.budget_unit == 'steps' and self.budget_range[0] == self.budget_range[1]


@functools.partial(jax.tree_util.register_dataclass,
                   data_fields=['client_ids', 'budgets', 'weights', 'present'],
                   meta_fields=['spec', 'population'])
@dataclasses.dataclass(frozen=True)
class Cohort:
  """The clients of one round; the arrays have leading axis ``C`` (cohort size).

  Attributes:
    client_ids: ``[C]`` int32 ids into the population.
    budgets: ``[C]`` int32 local gradient steps ``tau_i``.
    weights: ``[C]`` float32 unnormalised aggregation weights (``p_i`` after normalising).
    spec: the ``CohortSpec`` it was drawn with (static: the round reads ``B`` and ``b`` from it).
    population: the clients it was drawn from (``sample_cohort`` sets it; static): the round
      refuses a pool of another size, whose rows the ids would not name (they were clamped to
      its last client). None for a hand-made cohort.
    present: ``[C]`` bool, the slots a drawn client fills (Poisson sampling draws a varying
      number of clients into fixed slots); an absent slot takes no step, carries no weight
      and writes no row, like a client without examples. None: every slot is present.
  """
  client_ids: jax.Array
  budgets: jax.Array
  weights: jax.Array
  spec: CohortSpec
  population: int | None = None
  present: jax.Array | None = None

  @property
  def taking_part(self) -> jax.Array:
    """``[C]`` bool: ``present``, all True without it."""
    if self.present is None:
      return jnp.ones(self.client_ids.shape, bool)
    return self.present


def check_ids(where: str, ids, num_clients: int):
  """Client ids held on the host (NumPy, or a list) lie in ``[0, num_clients)``, else a
  ValueError from ``where``: the round and the sampler would clamp them to the last client.
  Arrays on the device or traced are not checked (that would wait on the device)."""
  if isinstance(ids, (np.ndarray, list, tuple)) and len(ids) and not (
      0 <= np.min(ids) and np.max(ids) < num_clients):
    raise ValueError(f'{where}: client_ids must lie in [0, {num_clients}) for a population of '
                     f'{num_clients} clients (got {np.min(ids)} to {np.max(ids)})')


def check_cohort(cohort: Cohort, num_clients: int):
  """A hand-made cohort as the round receives it (``core.round``), against its spec and a
  population of ``num_clients``; else a ValueError (a TypeError for arrays of the wrong kind).

  Any arrays: ``client_ids``, ``budgets`` and ``weights`` are arrays (NumPy or JAX) of one axis
  and one length (at least one client), ids and budgets of integers, weights of floats. On the
  host (NumPy) also their values: ids in ``[0, num_clients)`` (the round would take another
  client's rows), budgets in ``[0, max_budget]`` and all ``b`` where the spec's budgets are
  equal (the round then reads none of them; absent slots' not at all), weights finite and
  non-negative; ``present``, if given, a bool array of the same shape. Values on the device or
  traced are not checked (that would wait on the device; the sampler's are right by
  construction)."""
  arrays = {'client_ids': cohort.client_ids, 'budgets': cohort.budgets,
            'weights': cohort.weights}
  for name, x in arrays.items():
    if not hasattr(x, 'shape') or not hasattr(x, 'dtype'):
      raise TypeError(f'Cohort: {name} must be an array (NumPy or JAX), got '
                      f'{type(x).__name__}')
    kind = jnp.floating if name == 'weights' else jnp.integer
    if not jnp.issubdtype(x.dtype, kind):
      raise TypeError(f'Cohort: {name} must hold {"floats" if name == "weights" else "integers"}'
                      f', got {x.dtype}')
  shapes = {name: tuple(x.shape) for name, x in arrays.items()}
  if len(set(shapes.values())) > 1 or len(shapes['client_ids']) != 1:
    raise ValueError(f'Cohort: client_ids, budgets and weights must be of one axis and one '
                     f'length (got shapes {", ".join(f"{k} {v}" for k, v in shapes.items())})')
  if not shapes['client_ids'][0]:
    raise ValueError('Cohort: no clients (client_ids, budgets and weights are empty)')
  ids, budgets, weights, spec = (*arrays.values(), cohort.spec)
  if cohort.population is not None and cohort.population != num_clients:
    raise ValueError(f'Cohort: drawn from a population of {cohort.population} clients, but the '
                     f'pool holds {num_clients}: sample it from this pool\'s counts')
  check_ids('Cohort', ids, num_clients)
  if isinstance(weights, np.ndarray) and weights.size and not (
      np.isfinite(weights).all() and (weights >= 0).all()):
    raise ValueError(f'Cohort: weights must be finite and non-negative (got {weights.min()} to '
                     f'{weights.max()})')
  present = cohort.present
  if present is not None and (not hasattr(present, 'shape') or tuple(present.shape) !=
                              shapes['client_ids'] or present.dtype != bool):
    raise ValueError(f'Cohort: present must be a bool array of the cohort\'s shape '
                     f'{shapes["client_ids"]} (got {getattr(present, "dtype", type(present))} '
                     f'{np.shape(present)})')
  if isinstance(budgets, np.ndarray) and isinstance(present, np.ndarray):
    budgets = budgets[present]   # an absent slot's budget is never read
  if not isinstance(budgets, np.ndarray) or not budgets.size:
    return
  a, b = spec.budget_range
  if budgets.min() < 0 or budgets.max() > spec.max_budget:
    raise ValueError(f'Cohort: budgets must lie in [0, {spec.max_budget}] for its spec\'s '
                     f'budget_range {(a, b)} (got {budgets.min()} to {budgets.max()})')
  if spec.equal_budgets and (budgets != b).any():
    raise ValueError(f'Cohort: budgets other than {b}, but its spec\'s budget_range {(a, b)} '
                     f'runs every client {b} steps; give a spec with a < b, e.g. (1, {max(b, 2)})')


def sample_clients(key, num_clients: int, cohort_size: int, replace: bool) -> jax.Array:
  """Draws uniform client ids, with or without replacement.

  Args:
    key: the PRNG key.
    num_clients: ``N``, the population.
    cohort_size: ``C``, the ids drawn.
    replace: draw with replacement.

  Returns:
    ``[cohort_size]`` int32 ids in ``[0, num_clients)``.

  Raises:
    ValueError: a cohort larger than the population without replacement.
  """
  if replace:
    return jax.random.randint(key, (cohort_size,), 0, num_clients, dtype=jnp.int32)
  if cohort_size > num_clients:
    raise ValueError(f'cohort of {cohort_size} exceeds the population of {num_clients} '
                     'clients without replacement')
  return jax.random.choice(key, num_clients, (cohort_size,), replace=False).astype(jnp.int32)


def sample_clients_cyclic(key, num_clients: int, cohort_size: int, replace: bool, groups: int,
                          round_idx) -> jax.Array:
  """Cyclic participation (Cho et al., ICML 2023): the clients form ``groups`` groups
  (client ``i`` in group ``i mod K``) and round ``t`` samples uniformly from group ``t mod K``."""
  per_group = num_clients // groups   # the smallest group's size
  if per_group == 0:
    raise ValueError(f'{groups} cyclic groups exceed the population of {num_clients} clients')
  if not replace and cohort_size > per_group:
    raise ValueError(f'cohort of {cohort_size} exceeds the smallest cyclic group ({per_group} '
                     'clients) without replacement')
  g = jnp.asarray(round_idx, jnp.int32) % groups
  size = (num_clients - g + groups - 1) // groups          # members g, g + K, g + 2K, ...
  if replace:
    j = jax.random.randint(key, (cohort_size,), 0, size, dtype=jnp.int32)
  else:
    longest = -(-num_clients // groups)
    u = jax.random.uniform(key, (longest,))
    j = jnp.argsort(jnp.where(jnp.arange(longest) < size, u, jnp.inf))[:cohort_size]
  return (g + groups * j).astype(jnp.int32)


def poisson_slots(num_clients: int, rate: float, tail: float = POISSON_TAIL) -> int:
  """Counts the slots a round of Poisson sampling needs.

  The smallest ``K`` with ``P(Binomial(N, q) > K) <= tail``. A round that draws more keeps ``K`` of
  them at random, so a run of ``T`` rounds follows the sampling it is accounted for except with
  probability at most ``T tail`` (added to its delta, this is below print precision for any delta
  used in practice).

  Args:
    num_clients: ``N``, the population.
    rate: ``q``, each client's probability of being drawn.
    tail: the chance a round may draw more clients than its slots hold.

  Returns:
    ``K``, at least 1 and at most ``N``: ``CohortSpec.cohort_size`` for
    ``selection='poisson'``.

  Examples:
    >>> from fedjax_gel import core
    >>> core.poisson_slots(1000, 0.01) > 10
    True
  """
  from scipy import special   # pylint: disable=g-import-not-at-top
  low, high = 0, num_clients   # P(X > high) = 0 <= tail
  while low < high:
    mid = (low + high) // 2
    low, high = (low, mid) if special.bdtrc(mid, num_clients, rate) <= tail else (mid + 1, high)
  return max(low, 1)


def sample_clients_poisson(key, num_clients: int, slots: int, rate: float):
  """Draws each client independently with probability ``rate`` (Poisson sampling).

  Args:
    key: the PRNG key.
    num_clients: ``N``, the population.
    slots: the round's slots (``poisson_slots``); drawn clients beyond them are left out.
    rate: ``q``, each client's probability of being drawn.

  Returns:
    ``(ids, present)``, ``[slots]`` each: the drawn clients in random order (``u_i < q``,
    ordered by ``u_i``, which is uniform given the draw), then clients not drawn, absent.
  """
  u = jax.random.uniform(key, (num_clients,))
  drawn = u < rate
  _, ids = jax.lax.top_k(-jnp.where(drawn, u, 2.), slots)   # the drawn first, in random order
  return ids.astype(jnp.int32), jnp.arange(slots) < jnp.sum(drawn)


def sample_budgets(key, cohort_size: int, low: int, high: int) -> jax.Array:
  """Draws local budgets ``tau_i ~ U{low..high}`` (both ends included).

  Args:
    key: the PRNG key.
    cohort_size: ``C``, the budgets drawn.
    low: the smallest budget ``a``.
    high: the largest budget ``b``.

  Returns:
    ``[cohort_size]`` int32 budgets.
  """
  return jax.random.randint(key, (cohort_size,), low, high + 1, dtype=jnp.int32)


def budget_units(key, spec: CohortSpec, n, client_budgets=None) -> jax.Array:
  """Each cohort client's ``u_i`` (steps or epochs) under ``spec.budget_draw``; ``n``: the
  clients' example counts; ``client_budgets``: ``[num_clients]`` for ``'per_client'``, already
  gathered for the cohort."""
  a, b = spec.budget_range
  if spec.budget_draw == 'uniform':
    return sample_budgets(key, spec.cohort_size, a, b)
  if spec.budget_draw == 'proportional':
    u = jnp.round(b * n.astype(jnp.float32) / spec.max_examples)
    return jnp.clip(u, a, b).astype(jnp.int32)
  if client_budgets is None:
    raise ValueError("sample_cohort: budget_draw='per_client' needs client_budgets")
  return jnp.clip(jnp.asarray(client_budgets, jnp.int32), a, b)


def steps_of(units, n, spec: CohortSpec) -> jax.Array:
  """``tau_i``: the units themselves, or ``E_i ceil(n_i / B)`` in epochs."""
  if spec.budget_unit == 'steps':
    return units
  return units * epoch_steps(n, spec.batch_size)


def aggregation_weights(weighting: str, budgets, num_examples, batch_size: int) -> jax.Array:
  """Computes the clients' unnormalised aggregation weights.

  Args:
    weighting: one of ``WEIGHTINGS``: ``'samples_seen'``, ``min(tau_i * B, n_i)``, the
      examples a client touched (the GeL code's); ``'num_examples'``, ``n_i`` (FedAvg's and
      the GeL paper's ``p_i = n_i / n``); ``'uniform'``, 1.
    budgets: ``[C]`` local steps ``tau_i``.
    num_examples: ``[C]`` the clients' ``n_i``.
    batch_size: ``B``.

  Returns:
    ``[C]`` float32 weights.

  Raises:
    ValueError: an unknown weighting.
  """
  if weighting == 'samples_seen':
    w = jnp.minimum(budgets * batch_size, num_examples)
  elif weighting == 'num_examples':
    w = num_examples
  elif weighting == 'uniform':
    w = jnp.ones_like(budgets)
  else:
    raise ValueError(f'unknown aggregation weighting {weighting!r}; known: {", ".join(WEIGHTINGS)}')
  return jnp.asarray(w, jnp.float32)


_LARGEST: list = []   # (the last counts array on a device, its largest value)


def largest_count(counts) -> int | None:
  """The largest of ``counts``: NumPy's at once, a device array's read once per array (the
  last one is remembered: a loop passes the same ``train.counts`` every round, and a read
  waits for the device), None for traced or not fully addressable ones."""
  if isinstance(counts, np.ndarray):
    return int(counts.max())
  if isinstance(counts, jax.core.Tracer) or not getattr(counts, 'is_fully_addressable', True):
    return None
  if not (_LARGEST and _LARGEST[0][0] is counts):
    _LARGEST[:] = [(counts, int(np.max(np.asarray(counts))))]   # no jnp: maybe under a trace
  return _LARGEST[0][1]


def sample_cohort(root, round_idx, counts, spec: CohortSpec, client_ids=None,
                  client_budgets=None) -> Cohort:
  """Draws the cohort of round ``round_idx`` under ``spec``.

  Clients and budgets depend on (seed, round) only, never on the algorithm (guess counts and
  other per-client extras are the algorithm's, computed in the round), so algorithms compared
  with one seed see the same cohorts.

  Args:
    root: the run's root key (``core.keys.root_key(seed)``).
    round_idx: the round.
    counts: ``[N]`` the population's examples per client (``data.counts``).
    spec: the ``CohortSpec``.
    client_ids: ``[cohort_size]`` ids that replace the sampled clients (e.g. from
      ``selection.power_of_d``); None: sampled under ``spec.selection``.
    client_budgets: ``[N]`` int, every client's units within ``budget_range``, under
      ``budget_draw='per_client'``.

  Returns:
    The ``Cohort`` (its ``population`` set to ``N``).

  Raises:
    TypeError: ``spec`` is no ``CohortSpec``.
    ValueError: counts that are not one non-negative integer per client; given on the host
      (NumPy or lists), ids outside the population or budgets outside the range;
      ``client_ids`` or ``client_budgets`` of another length; counts above
      ``spec.max_examples`` with budgets that read it, on the host or on a device
      (``largest_count``: the budgets would be cut short); more Poisson slots than clients.

  Examples:
    >>> import numpy as np
    >>> import fedjax_gel as fg
    >>> from fedjax_gel.core import keys
    >>> spec = fg.CohortSpec(cohort_size=4, budget_range=(1, 5), batch_size=10)
    >>> cohort = fg.sample_cohort(keys.root_key(0), 0, np.full(100, 50, np.int32), spec)
    >>> cohort.client_ids.shape, cohort.budgets.shape
    ((4,), (4,))
  """
  if not isinstance(spec, CohortSpec):
    raise TypeError(f'sample_cohort: spec must be a CohortSpec, got {type(spec).__name__}')
  if isinstance(counts, (list, tuple)):
    counts = np.asarray(counts)
  if not hasattr(counts, 'shape') or len(counts.shape) != 1 or not counts.shape[0] or (
      not jnp.issubdtype(counts.dtype, jnp.integer)):
    raise ValueError(f'sample_cohort: counts must be the population\'s examples per client, '
                     f'integers of one axis (got {getattr(counts, "dtype", type(counts).__name__)}'
                     f' {np.shape(counts)})')
  if isinstance(counts, np.ndarray) and counts.min() < 0:
    raise ValueError(f'sample_cohort: counts must be >= 0 (got {counts.min()})')
  largest = (largest_count(counts) if reads_sizes(spec.budget_unit, spec.budget_draw) else
             None)
  if largest is not None and largest > spec.max_examples:
    raise ValueError(f'sample_cohort: CohortSpec.max_examples={spec.max_examples} is below the '
                     f'largest client\'s {largest} examples, so the budgets '
                     f'(budget_unit={spec.budget_unit!r}, budget_draw={spec.budget_draw!r}) would '
                     'be cut short; give max_examples=int(counts.max())')
  population = counts.shape[0]
  if spec.selection == 'poisson' and spec.cohort_size > population:
    raise ValueError(f'sample_cohort: Poisson sampling\'s {spec.cohort_size} slots exceed the '
                     f'population of {population} clients (poisson_slots gives at most N)')
  check_ids('sample_cohort', client_ids, population)
  if client_ids is not None and np.shape(client_ids) != (spec.cohort_size,):
    raise ValueError(f'sample_cohort: client_ids must hold the cohort\'s {spec.cohort_size} '
                     f'clients, [cohort_size] (got shape {np.shape(client_ids)})')
  if client_budgets is not None:
    if np.shape(client_budgets) != (population,):
      raise ValueError(f'sample_cohort: client_budgets must hold one budget per client, '
                       f'[{population}] (got shape {np.shape(client_budgets)})')
    a, b = spec.budget_range
    if isinstance(client_budgets, (np.ndarray, list, tuple)) and not (
        a <= np.min(client_budgets) and np.max(client_budgets) <= b):
      raise ValueError(f'sample_cohort: client_budgets must lie within budget_range {(a, b)} '
                       f'(got {np.min(client_budgets)} to {np.max(client_budgets)})')
  return _drawn_cohort(root, round_idx, counts, spec, client_ids, client_budgets)


@functools.partial(jax.jit, static_argnames=('spec',))
def _drawn_cohort(root, round_idx, counts, spec: CohortSpec, client_ids, client_budgets
                  ) -> Cohort:
  """``sample_cohort``'s draw, compiled."""
  cohort_key = keys.round_key(root, round_idx, keys.COHORT)
  present = None
  if client_ids is not None:
    ids = jnp.asarray(client_ids, jnp.int32)
  elif spec.selection == 'poisson':
    ids, present = sample_clients_poisson(cohort_key, counts.shape[0], spec.cohort_size,
                                          spec.rate)
  elif spec.selection == 'cyclic':
    ids = sample_clients_cyclic(cohort_key, counts.shape[0], spec.cohort_size, spec.replace,
                                spec.groups, round_idx)
  else:
    ids = sample_clients(cohort_key, counts.shape[0], spec.cohort_size, spec.replace)
  n = counts[ids]
  fixed = None if client_budgets is None else jnp.asarray(client_budgets)[ids]
  units = budget_units(keys.round_key(root, round_idx, keys.BUDGET), spec, n, fixed)
  budgets = steps_of(units, n, spec)
  weights = aggregation_weights(spec.weighting, budgets, n, spec.batch_size)
  if present is not None:   # absent slots: no steps (the cheapest chunk), no weight
    budgets, weights = jnp.where(present, budgets, 0), jnp.where(present, weights, 0.)
  return Cohort(ids, budgets, weights, spec, int(counts.shape[0]), present)
