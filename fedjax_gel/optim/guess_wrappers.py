"""How ``guess`` follows GeL's guessed updates through optax's wrappers, reading only their states.

A guessed step is the update the optimiser applies when its GeL transformation (``gel_sgdm``,
``guessing``) is handed its proxy (zero, or the last gradient it was given) in place of a
gradient. Only GeL transformations guess: parameters none acts on get zero updates (e.g. the
other groups of ``optax.partition``, even an SGD with momentum that would coast). ``guess`` has
the optimiser's state, not the optimiser, so a wrapper is followed only where its state says what
it does to a guessed update, and refused (``GuessRefusedError``) where it does not:

* ``optax.chain`` (a tuple), ``named_chain`` (an ``OrderedDict``): the GeL member's guesses
  ``u_1..u_c`` pass through the later members acting on its parameters. Members on other
  parameters are skipped; the state shows which they are only through ``optax.masked``'s
  ``MaskedNode`` placeholders in a parameter-shaped tree inside it (a trace, moments, a GeL
  state). ``masked(optax.sgd(.1, momentum=.9), mask)`` shows its mask; ``masked(optax.sgd(.1),
  mask)`` (state ``(EmptyState(), EmptyState())``) does not, and after a GeL member it is refused:
  its state is the same whether ``mask`` covers the GeL parameters (the chain then scales their
  updates by ``-0.1``) or not. Write such a chain as ``optax.partition``.
  Later members acting on the GeL parameters that are followed: ``contrib.reduce_on_plateau``,
  ``sum_k s u_k = s sum_k u_k`` with the ``scale`` ``s`` in its state (a guess computes no loss,
  so the plateau detector sees nothing and ``s`` holds); ``snapshot``, ``monitor`` (no change);
  a chain, ``masked`` or ``inject_hyperparams`` of those. Others are refused (a stateless
  ``optax.scale(a)`` keeps ``a`` out of its state).
  Members *before* the GeL one must hand it the proxy when replayed. A stateless one
  (``optax.EmptyState``: clipping, scaling) is taken as a function of the gradient alone, mapping
  zero to zero and the last gradient to what the GeL transformation stored; one whose state
  changes from step to step (Adam's moments, a schedule's count, noise) is refused. Stateless
  ones that read the parameters (``add_decayed_weights``, ``keep_params_nonnegative``) cannot be
  told from clipping by their state; their share of a replayed step is left out: put them inside
  ``guessing``.
* ``optax.masked``, ``partition``: the GeL state's own placeholders say which parameters it acts
  on; the others get zero.
* ``inject_hyperparams``: its updates are the wrapped transformation's.
* ``apply_if_finite``: a zero proxy is finite, so applied. The last gradient was applied if it was
  finite (``last_finite``); if not, the replayed steps would be rejected (zero) up to
  ``max_consecutive_errors``, which is not in the state, and applied after: NaN.
* refused, what they need being outside their states: ``optax.MultiSteps`` (``every_k_schedule``:
  which guessed steps complete an accumulation, the others applying zeros and the first mixing in
  the gradients accumulated so far), ``optax.lookahead`` (``sync_period``, ``slow_step_size``),
  ``contrib.schedule_free`` (Defazio et al. 2024, "The Road Less Scheduled": each step applies
  ``(b1 c + 1 - b1) u - c (y - z)`` with ``c = w / (W + w)``, ``w = max_lr^weight_lr_power``, ``W``
  the running sum; ``weight_lr_power`` and the learning-rate schedule are not in the state), and
  every other wrapper (``conditionally_transform``, ``apply_every``, ``flatten``,
  ``contrib.mechanize``, ...). ``guessing(wrapper(...))`` replays any of them step by step but
  ``lookahead`` (whose params are ``LookaheadParams``).

Refusals are one line naming the wrapper and what to use instead. Every decision is made on the
state's types and tree structure, so it holds under ``jit`` and ``vmap``.

Given the optimiser as well (``guess(..., optimizer=tx)``), ``guess`` replays it where its state
would be refused: ``tx.update`` called ``count`` times with the proxy, the params advanced by
each update (exact with the zero proxy: the whole optimiser is handed zeros). The last-gradient
proxy needs the optimiser's own input, which no state stores: it is the gradient a GeL
transformation stored only where the input reaches it unchanged (``replay_gradient``: the
optimiser itself, the first member of a chain, inside ``masked``, ``partition``,
``inject_hyperparams``, ``lookahead``, ``contrib.schedule_free``, ``contrib.mechanize``; zero on
the parameters no GeL transformation acts on); after clipping, a scale, ``MultiSteps``'
accumulation, ... it is refused with ``optimizer=`` too. An update needing the loss ``value``
(``reduce_on_plateau`` anywhere in the replayed optimiser) is refused. Without ``optimizer``, a
refusal that it would resolve ends "or pass optimizer= to guess".
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax


class GuessRefusedError(ValueError):
  """Raised by ``guess`` where it cannot tell the updates a wrapper would apply for guesses.

  Its message is one line naming the wrapper and what to use instead (e.g. ``guess(...,
  optimizer=tx)``, or the wrapper after ``guessing`` in the chain); a ``ValueError``.
  """


@dataclasses.dataclass(frozen=True)
class GeLKind:
  """How to guess with one kind of GeL state.

  Attributes:
    guess: ``(state, params, count) -> (updates, state)``, ``params`` and ``updates`` shaped like
      ``mirror(state)`` (``MaskedNode`` where it does not act).
    mirror: the state's parameter-shaped tree.
    scalar_leaves: whether the mirror may hold a shape-``()`` leaf per parameter.
    last_gradient: whether its proxy is the last gradient.
    stored_gradient: the last gradient it was given, shaped like ``mirror`` (last-gradient
      proxy; ``None`` for the zero proxy).
  """
  guess: Callable[..., tuple[Any, Any]]
  mirror: Callable[[Any], Any]
  scalar_leaves: Callable[[Any], bool]
  last_gradient: Callable[[Any], bool]
  stored_gradient: Callable[[Any], Any]


def _optional(module, *names):
  return tuple(t for t in (getattr(module, n, None) for n in names) if isinstance(t, type))


_MASKED = optax.MaskedState
_PARTITION = optax.PartitionState
_INJECTED = _optional(optax, 'InjectHyperparamsState', 'InjectStatefulHyperparamsState')
_PLATEAU = _optional(optax.contrib, 'ReduceLROnPlateauState')
_OBSERVERS = _optional(optax, 'SnapshotState', 'MonitorState')   # record, never change, updates
_GRADIENT_ONLY = _optional(optax, 'ZeroNansState')               # zero stays zero, g stays f(g)
# Wrappers handing their inner transformation the gradient they are given, unchanged, at every
# step, and the field holding its state (``masked`` and ``partition`` on its parameters).
_PASS_GRADIENT = tuple((t, field) for t, field in (
    (optax.MaskedState, 'inner_state'),
    *((t, 'inner_state') for t in _INJECTED),
    (getattr(optax, 'LookaheadState', None), 'fast_state'),
    (getattr(optax.contrib, 'ScheduleFreeState', None), 'base_optimizer_state'),
    (getattr(optax.contrib, 'MechanicState', None), 'base_optimizer_state'),
) if isinstance(t, type))
_NAMES = {
    'MaskedState': 'optax.masked', 'MultiStepsState': 'optax.MultiSteps',
    'LookaheadState': 'optax.lookahead', 'ScheduleFreeState': 'optax.contrib.schedule_free',
    'ApplyIfFiniteState': 'optax.apply_if_finite', 'ApplyEvery': 'optax.apply_every',
    'ConditionallyTransformState': 'optax.conditionally_transform',
    'ConditionallyMaskState': 'optax.conditionally_mask',
    'MechanicState': 'optax.contrib.mechanize', 'SAMState': 'optax.contrib.sam',
    'SplitRealAndImaginaryState': 'optax.contrib.split_real_and_imaginary',
    'EmptyState': 'a stateless transformation (optax.scale, clip, add_decayed_weights, ...)',
    'ScaleByScheduleState': 'optax.scale_by_schedule',
}
_WHY = {   # what a wrapper around a GeL transformation keeps out of its state, and instead
    'MultiStepsState': (
        'its every_k_schedule is not in its state, so which guessed steps would complete an '
        'accumulation (the others apply zeros; the first mixes in the gradients accumulated so '
        'far) cannot be told',
        'use guessing(optax.MultiSteps(inner, k).gradient_transformation()), which replays it'),
    'LookaheadState': (
        'its sync_period and slow_step_size are not in its state, so whether a guessed step '
        'syncs the fast and slow weights cannot be told', 'guess the fast weights alone: '
        'guess(opt_state.fast_state, params.fast, count), as if no sync fell among the guesses'),
    'ScheduleFreeState': (
        'its averaging weights (max_lr ** weight_lr_power over their running sum) depend on its '
        'weight_lr_power and learning-rate schedule, which are not in its state',
        'use guessing(optax.contrib.schedule_free(base, learning_rate)), which replays it'),
}
_ALL = None   # acts on every parameter, or on parameters that its state does not show


def _is_masked(x) -> bool:
  return isinstance(x, optax.MaskedNode)


def _chain_members(state):
  """The members of an ``optax.chain`` (a tuple) or ``named_chain`` (an ``OrderedDict``) state,
  else None."""
  if type(state) is tuple:   # pylint: disable=unidiomatic-typecheck
    return list(state)
  if type(state) is collections.OrderedDict:   # pylint: disable=unidiomatic-typecheck
    return list(state.values())
  return None


def _rebuild_chain(state, members):
  if type(state) is tuple:   # pylint: disable=unidiomatic-typecheck
    return tuple(members)
  return collections.OrderedDict(zip(state.keys(), members))


def describe(state) -> str:
  """A wrapper's name from its state's type (``optax.MultiSteps`` for ``MultiStepsState``)."""
  name = type(state).__name__
  return (f'{_NAMES[name]} (state {name})' if name in _NAMES else
          f'the transformation of state {name}')


def _meets(acts, paths) -> bool:
  return bool(paths) if acts is _ALL else bool(acts & paths)


class _Walk:
  """One ``guess``: the params, the count and the GeL kinds, walked through a state."""

  def __init__(self, kinds: dict, params, count):
    self.kinds, self.params, self.count = kinds, params, count
    flat, _ = jax.tree_util.tree_flatten_with_path(params)
    self.shapes = {tuple(path): jnp.shape(leaf) for path, leaf in flat}

  # -- which parameters a state acts on -----------------------------------------------------

  def mirror_paths(self, tree, scalar_leaves=False):
    """The parameters ``tree`` holds (not ``MaskedNode``) if it is shaped like params (masked
    subtrees as ``MaskedNode``, leaves of the parameters' shapes), else None."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_masked)
    if not flat:
      return set() if not self.shapes else None
    held, masked = set(), []
    for path, leaf in flat:
      path = tuple(path)
      if _is_masked(leaf):
        masked.append(path)
      elif path in self.shapes and (jnp.shape(leaf) == self.shapes[path] or
                                    scalar_leaves and jnp.shape(leaf) == ()):
        held.add(path)
      else:
        return None
    under = {p for p in self.shapes for m in masked if p[:len(m)] == m}
    if held & under or held | under != set(self.shapes):
      return None
    return held

  def gel_paths(self, state) -> set:
    """The parameters the GeL states inside ``state`` guess on."""
    kind = self.kinds.get(type(state))
    if kind is not None:
      held = self.mirror_paths(kind.mirror(state), kind.scalar_leaves(state))
      if held is None:
        raise GuessRefusedError(
            'guess: a GeL state (gel_sgdm or guessing) holds other parameters than params: pass '
            'the params the optimiser was given, and build it without optax.flatten or '
            'optax.contrib.split_real_and_imaginary around the GeL transformation')
      return held
    paths = set()
    for leaf in jax.tree.leaves(state, is_leaf=lambda x: type(x) in self.kinds):
      if type(leaf) in self.kinds:
        paths |= self.gel_paths(leaf)
    return paths

  def find_mirror(self, tree):
    """The parameters of the first parameter-shaped tree inside ``tree`` (not looking inside a
    nested ``masked`` or ``partition``, whose masks may be narrower), else None."""
    if type(tree) in self.kinds:
      return self.gel_paths(tree)
    if isinstance(tree, (_MASKED, _PARTITION)):
      return None
    held = self.mirror_paths(tree)
    if held is not None:
      return held
    children = jax.tree_util.tree_flatten(tree, is_leaf=lambda x: x is not tree)[0]
    if len(children) == 1 and children[0] is tree:   # a leaf
      return None
    for child in children:
      held = self.find_mirror(child)
      if held is not None:
        return held
    return None

  def acts(self, state):
    """The parameters whose updates ``state``'s transformation may change (``_ALL``: any)."""
    if type(state) in self.kinds:
      return self.gel_paths(state)
    if isinstance(state, _OBSERVERS):
      return set()
    if isinstance(state, _MASKED):
      return self.find_mirror(state.inner_state)
    if isinstance(state, _INJECTED):
      return self.acts(state.inner_state)
    members = _chain_members(state)
    if members is not None:
      union = set()
      for member in members:
        acts = self.acts(member)
        if acts is _ALL:
          return _ALL
        union |= acts
      return union
    return _ALL

  # -- the guessed updates --------------------------------------------------------------------

  def zeros(self):
    return optax.tree_utils.tree_zeros_like(self.params)

  def embed(self, updates):
    """Updates shaped like a GeL state's mirror, as params (zero where ``MaskedNode``)."""
    return jax.tree.map(lambda u, p: optax.tree_utils.tree_zeros_like(p) if _is_masked(u) else u,
                        updates, self.params, is_leaf=_is_masked)

  def node(self, state):
    """``(updates, state)`` of the guessed steps of a state holding a GeL state."""
    kind = self.kinds.get(type(state))
    if kind is not None:
      self.gel_paths(state)   # checks its parameters are params'
      mirror = kind.mirror(state)
      part = jax.tree.map(lambda m, p: m if _is_masked(m) else p, mirror, self.params,
                          is_leaf=_is_masked)
      updates, state = kind.guess(state, part, self.count)
      return self.embed(updates), state
    members = _chain_members(state)
    if members is not None:
      updates, members = self.chain(members)
      return updates, _rebuild_chain(state, members)
    if isinstance(state, _MASKED):
      updates, inner = self.node(state.inner_state)
      return updates, state._replace(inner_state=inner)
    if isinstance(state, _PARTITION):
      total, groups = self.zeros(), dict(state.inner_states)
      for label, group in groups.items():
        if self.holds(group):
          updates, groups[label] = self.node(group)
          total = _add(total, updates)
      return total, state._replace(inner_states=groups)
    if isinstance(state, _INJECTED):
      updates, inner = self.node(state.inner_state)
      return updates, state._replace(inner_state=inner)
    if isinstance(state, optax.ApplyIfFiniteState):
      return self.if_finite(state)
    why, instead = _WHY.get(type(state).__name__, (
        'its state does not say what update it applies for a guessed step',
        'use guessing(wrapper(...)), which replays any optimiser'))
    raise GuessRefusedError(f'guess: cannot follow a GeL transformation through '
                            f'{describe(state)}: {why}; instead, {instead}')

  def holds(self, state) -> bool:
    return any(type(x) in self.kinds
               for x in jax.tree.leaves(state, is_leaf=lambda x: type(x) in self.kinds))

  def chain(self, members):
    """A chain's guessed updates: each GeL member's, through the members after it."""
    acts = [self.acts(member) for member in members]
    total, members = self.zeros(), list(members)
    original = list(members)
    for i, member in enumerate(original):
      if not self.holds(member):
        continue
      gel = self.gel_paths(member)
      for before, acted in zip(original[:i], acts[:i]):
        if _meets(acted, gel):
          self.check_before(before, gel)
      updates, members[i] = self.node(member)
      for after, acted in zip(original[i + 1:], acts[i + 1:]):
        if _meets(acted, gel):
          updates = self.after(after, updates, gel)
      total = _add(total, updates)
    return total, members

  def two_gel(self):
    return GuessRefusedError(
        'guess: an optax.chain holds 2 GeL transformations (gel_sgdm or guessing) on the same '
        'parameters one after the other; the later one would change the earlier one\'s updates '
        'but not its guessed steps: keep one, the whole optimiser inside it (e.g. '
        'guessing(optax.chain(...)))')

  def check_before(self, state, gel) -> None:
    """Raises unless ``state``'s transformation, before a GeL one acting on ``gel``, would hand
    it the proxy unchanged (see the module docstring)."""
    acts = self.acts(state)
    if not _meets(acts, gel):
      return
    if type(state) in self.kinds:
      raise self.two_gel()
    if isinstance(state, _OBSERVERS + _GRADIENT_ONLY + _PLATEAU) or not jax.tree.leaves(state):
      return   # stateless (taken as a function of the gradient), or one known to pass the proxy
    members = _chain_members(state)
    if members is not None:
      for member in members:
        self.check_before(member, gel)
      return
    if isinstance(state, _MASKED) and not self.holds(state.inner_state):
      self.check_before(state.inner_state, gel if acts is _ALL else gel & acts)
      return
    if isinstance(state, _PARTITION):
      for group in state.inner_states.values():
        self.check_before(group, gel)
      return
    if self.holds(state):
      raise self.two_gel()
    raise GuessRefusedError(
        f'guess: {describe(state)} comes before a GeL transformation (gel_sgdm or guessing) in '
        'its optax.chain and keeps state that changes from step to step, so replayed with the '
        'proxy gradient it would not hand the GeL transformation the proxy (zero or the last '
        'gradient); put it inside: guessing(optax.chain(it, ...))')

  def after(self, state, updates, gel):
    """``updates`` (guessed, on ``gel``) as ``state``'s transformation, after the GeL one in a
    chain, would change them over the guessed steps; raises where its state does not tell."""
    acts = self.acts(state)
    if not _meets(acts, gel):
      return updates
    if type(state) in self.kinds:
      raise self.two_gel()
    if isinstance(state, _PLATEAU):   # no loss is computed for a guess: the scale holds
      return jax.tree.map(lambda u: (u * state.scale).astype(u.dtype), updates)
    if isinstance(state, _INJECTED):
      return self.after(state.inner_state, updates, gel)
    members = _chain_members(state)
    if members is not None:
      for member in members:
        updates = self.after(member, updates, gel)
      return updates
    if isinstance(state, _MASKED) and acts is not _ALL:
      changed = self.after(state.inner_state, updates, gel & acts)
      return jax.tree_util.tree_map_with_path(
          lambda path, new, old: new if tuple(path) in acts else old, changed, updates)
    if isinstance(state, _PARTITION):
      for group in state.inner_states.values():
        updates = self.after(group, updates, gel)
      return updates
    if self.holds(state):
      raise self.two_gel()
    if isinstance(state, _MASKED):
      raise GuessRefusedError(
          'guess: optax.masked(...) follows a GeL transformation (gel_sgdm or guessing) in its '
          'optax.chain, and its state holds nothing shaped like the parameters, so whether its '
          'mask covers the GeL transformation\'s parameters cannot be told; if it does not, '
          'write the two as optax.partition({"gel": ..., "other": ...}, labels), else put it '
          'inside: guessing(optax.chain(..., it))')
    raise GuessRefusedError(
        f'guess: {describe(state)} follows a GeL transformation (gel_sgdm or guessing) in its '
        'optax.chain and would change its guessed updates in a way its state does not tell; '
        'put it inside: guessing(optax.chain(..., it)) (e.g. guessing(optax.adam(lr)) for '
        'guessing(optax.scale_by_adam()) then optax.scale)')

  def if_finite(self, state):
    """``apply_if_finite``: zeros are finite; a last gradient that was not gives NaN."""
    updates, inner = self.node(state.inner_state)
    count = jnp.asarray(self.count, jnp.float32)
    last = any(self.kinds[type(x)].last_gradient(x) for x in jax.tree.leaves(
        state.inner_state, is_leaf=lambda x: type(x) in self.kinds) if type(x) in self.kinds)
    guessed = count > 0
    if last:
      unknown = guessed & ~state.last_finite
      updates = jax.tree.map(lambda u: jnp.where(unknown, jnp.nan, u).astype(u.dtype), updates)
      guessed = guessed & state.last_finite
    return updates, state._replace(
        inner_state=inner,
        notfinite_count=jnp.where(guessed, 0, state.notfinite_count).astype(
            state.notfinite_count.dtype),
        last_finite=jnp.where(guessed, True, state.last_finite))


def _handed(state, kinds, first: bool):
  """``(gel_state, handed)`` for every GeL state in ``state``: ``handed`` when the optimiser's own
  input gradient reaches it unchanged (on its parameters): ``state`` itself, the first member of
  a chain, inside the wrappers of ``_PASS_GRADIENT`` and ``partition``'s groups."""
  if type(state) in kinds:
    yield state, first
    return
  members = _chain_members(state)
  if members is not None:
    for i, member in enumerate(members):
      yield from _handed(member, kinds, first and i == 0)
    return
  if isinstance(state, _PARTITION):
    for group in state.inner_states.values():
      yield from _handed(group, kinds, first)
    return
  for kind, field in _PASS_GRADIENT:
    if isinstance(state, kind):
      yield from _handed(getattr(state, field), kinds, first)
      return
  for leaf in jax.tree.leaves(state, is_leaf=lambda x: type(x) in kinds):
    if type(leaf) in kinds:
      yield leaf, False


def holds_plateau(opt_state) -> bool:
  """Whether ``opt_state`` holds a ``contrib.reduce_on_plateau`` state (its ``update`` needs the
  loss ``value``, which a replayed guess cannot give)."""
  is_plateau = lambda x: isinstance(x, _PLATEAU)
  return any(map(is_plateau, jax.tree.leaves(opt_state, is_leaf=is_plateau)))


def gradient_like(params):
  """The tree the optimiser's gradients are shaped like: ``params``, or the fast parameters of
  ``optax.LookaheadParams``."""
  return params.fast if isinstance(params, optax.LookaheadParams) else params


def replay_gradient(opt_state, params, kinds: dict[type, GeLKind]):
  """The proxy gradient that replaying the whole optimiser (``guess(..., optimizer=tx)``) hands
  it, shaped like ``gradient_like(params)``: zero, but for the last gradient stored by each
  last-gradient GeL state on its parameters. That is the optimiser's own input only where the
  input reached the GeL transformation unchanged (``_handed``); raises ``GuessRefusedError``
  (the reason, without ``guess:``) where a member before it (clipping, a scale, another
  optimiser) changed it or a wrapper kept it back (``MultiSteps``' accumulation)."""
  like = gradient_like(params)
  walk = _Walk(kinds, like, None)
  proxy = walk.zeros()
  for state, handed in _handed(opt_state, kinds, True):
    kind = kinds[type(state)]
    if not kind.last_gradient(state):
      continue
    if not handed:
      raise GuessRefusedError(
          'with the last-gradient proxy a replay needs the optimiser\'s own last input '
          'gradient, but its GeL transformation (gel_sgdm or guessing) stored that gradient as '
          'the members or wrappers before it changed it; make the GeL transformation the '
          'chain\'s first member, or put the whole optimiser inside: guessing(optax.chain(...), '
          '"last_gradient")')
    walk.gel_paths(state)   # its stored gradient is shaped like the parameters
    proxy = jax.tree.map(lambda s, z: z if _is_masked(s) else jnp.asarray(s, z.dtype),
                         kind.stored_gradient(state), proxy, is_leaf=_is_masked)
  return proxy


def _add(total, updates):
  return jax.tree.map(lambda t, u: (t + u).astype(t.dtype), total, updates)


def follow(opt_state, params, count, kinds: dict[type, GeLKind]):
  """``(updates, opt_state)``: the summed updates of ``count`` guessed steps of every GeL state
  in ``opt_state`` (its type a key of ``kinds``), as the wrappers around it apply them (zero on
  parameters none acts on), and the state after them. Raises ``GuessRefusedError`` (see the
  module docstring)."""
  return _Walk(kinds, params, count).node(opt_state)
