"""GeL, guess and learn (Boukhari et al. 2023, "Boosting Federated Learning in Resource-Constrained
Networks", Algorithm 1, Table 3), and its guess policies.

Clients run SGD with momentum for their ``tau_i`` gradient steps, then take ``tau'_i`` guessed
steps. The algorithm owns its guess policy (``GuessPolicy``; default the paper's ``tau' = tau -
tau_i`` with ``tau = b + 5`` for budgets ``U{a..b}``): the round asks it for every client's
count. With the zero proxy the guesses are eq. 5's nudge ``alpha (1 - alpha^tau') / (1 - alpha)
v`` in closed form; with the last-gradient proxy (Dhasade et al. 2021, "GeL: guess and learn")
the client optimiser is re-applied with the last gradient.

* ``gel``: FedAvgCM + GeL (client SGDM with guesses, server SGD or any optax server optimiser;
  FedYogi + GeL is ``gel`` with ``fedjax_gel.optim.fedyogi`` on the server).
* ``fedavg_gel``: FedAvg's plain client SGD with guesses. Table 3 of GeL lists FedAvg's GeL
  version as SGDM with guesses, which is ``gel`` itself; with SGD the zero proxy guesses nothing,
  so ``fedavg_gel`` uses the last-gradient proxy.
* ``fedprox_gel`` and ``fednova_gel`` are in ``fedprox.py`` and ``fednova.py``.
"""
from __future__ import annotations

import dataclasses
import numbers

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_gel.core import checks
from fedjax_gel.core.algorithm import FederatedAlgorithm
from fedjax_gel.spec import AlgorithmSpec, hparam, one_of, within
from fedjax_gel.algorithms.fedavg import local_sgd, static_zero
from fedjax_gel.optim.guessed import PROXIES, check_proxy, gel_sgdm

GUESS_POLICIES = ('none', 'remaining', 'cohort_max', 'inf', 'fixed', 'percent')
"""The kinds of ``GuessPolicy``."""
POLICY_READS = {'remaining': 'tau', 'cohort_max': 'k', 'fixed': 'count', 'percent': 'percent'}
MAX_GUESSES = 100_000   # a guess count above this is surely a typo (guesses may run in a loop)
MAX_PERCENT = 100 * MAX_GUESSES   # the percent policy: at most MAX_GUESSES guesses a step


class GuessPolicy(NamedTuple):
  """How many guessed steps ``tau'_i`` each client takes (Boukhari et al. 2023, GeL §3.1, App. F).

  The kinds (``kind``), each reading only its own field:

  * ``'remaining'`` (default): ``max(tau - tau_i, 0)``, ``tau`` the steps the server asks for;
    ``tau=None`` means ``b + 5`` for budgets ``U{a..b}`` (GeL's experiments).
  * ``'cohort_max'``: ``max_j tau_j + k - tau_i`` over the round's cohort (the authors' code).
  * ``'inf'``: infinitely many (the ``alpha / (1 - alpha)`` nudge; zero proxy only).
  * ``'fixed'``: ``count`` for every client.
  * ``'percent'``: ``floor(percent / 100 * tau_i)`` (the earlier report's "x% guesses").
  * ``'none'``: no guesses (GeL's client optimiser then trains as FedAvgCM; asked for
    explicitly).

  An algorithm takes the policy's ``counts`` as its ``FederatedAlgorithm.client_guesses``.

  Attributes:
    kind: one of ``GUESS_POLICIES``.
    tau: ``'remaining'``: the steps ``tau`` the server asks for; None: ``b + 5``.
    k: ``'cohort_max'``: the ``k`` in ``max_j tau_j + k``.
    count: ``'fixed'``: guessed steps per client.
    percent: ``'percent'``: guesses as a percentage of ``tau_i`` (over 100: more guesses than
      steps).

  Examples:
    >>> import jax.numpy as jnp
    >>> import fedjax_gel as fg
    >>> fg.GuessPolicy().counts(jnp.array([4, 13]), max_budget=13)   # tau = b + 5 = 18
    Array([14.,  5.], dtype=float32)
    >>> fg.GuessPolicy('cohort_max', k=2).counts(jnp.array([4, 13]), max_budget=13)
    Array([11.,  2.], dtype=float32)
  """
  kind: str = 'remaining'
  tau: int | None = None
  k: int = 0
  count: int = 0
  percent: float = 0.0

  def check(self) -> 'GuessPolicy':
    """Raises ``ValueError`` naming the field that is out of range, or set away from its default
    where the kind does not read it (``GuessPolicy('fixed', 5)`` set ``tau``, and took no
    guess), ``TypeError`` for a field that is no number; returns the policy."""
    if self.kind not in GUESS_POLICIES:
      raise ValueError(f'unknown guess policy {self.kind!r}; known: {", ".join(GUESS_POLICIES)}')
    reads = POLICY_READS.get(self.kind)
    for field in ('tau', 'k', 'count', 'percent'):
      value, default = getattr(self, field), GuessPolicy._field_defaults[field]
      whole = field != 'percent'
      if value is not None and not (checks.is_whole(value) if whole else
                                    isinstance(value, numbers.Real) and not isinstance(value, bool)):
        raise TypeError(f'GuessPolicy.{field} must be {"a whole" if whole else "a"} number, '
                        f'got {value!r}')
      if field != reads and value != default:
        raise ValueError(f'GuessPolicy({self.kind!r}) does not read {field} (got {value}); ' + (
            'it reads no field' if reads is None else
            f'it reads {reads}, given by name: GuessPolicy({self.kind!r}, {reads}=...)'))
      if whole and value is not None and not 0 <= value <= MAX_GUESSES:
        raise ValueError(f'GuessPolicy.{field} must lie in [0, {MAX_GUESSES}], got {value}')
    if not 0 <= self.percent <= MAX_PERCENT:
      raise ValueError(f'GuessPolicy.percent must lie in [0, {MAX_PERCENT}], got {self.percent}')
    return self

  def counts(self, budgets: jax.Array, max_budget: int) -> jax.Array:
    """``tau'_i`` for every client of a cohort (float32 ``[C]``); ``max_budget`` is ``b``."""
    b = budgets.astype(jnp.float32)
    if self.kind == 'none':
      return jnp.zeros_like(b)
    if self.kind == 'remaining':
      tau = max_budget + 5 if self.tau is None else self.tau
      return jnp.maximum(tau - b, 0.)
    if self.kind == 'cohort_max':
      return jnp.max(b) + self.k - b
    if self.kind == 'inf':
      return jnp.full_like(b, jnp.inf)
    if self.kind == 'fixed':
      return jnp.full_like(b, self.count)
    return jnp.floor(self.percent / 100. * b)


def guess_conflict(kind: str, proxy: str, momentum_free: bool) -> str | None:
  """Why guesses of policy ``kind`` with ``proxy`` are meaningless, or None: infinitely many
  last-gradient guesses diverge, and zero-proxy guesses without momentum do nothing."""
  if kind == 'inf' and proxy != 'zero':
    return ('infinitely many guesses need the zero proxy (the closed-form alpha/(1-alpha) '
            f'nudge); with the {proxy} proxy they diverge')
  if proxy == 'zero' and momentum_free and kind != 'none':
    return ('zero-proxy guesses without momentum do nothing; use the last_gradient proxy or a '
            'momentum in (0, 1)')
  return None


def checked_policy(name: str, policy: GuessPolicy, proxy: str, momentum: float) -> GuessPolicy:
  """The policy, checked (``GuessPolicy.check``) and checked against the proxy
  (``guess_conflict``)."""
  policy = policy.check()
  check_proxy(proxy, f'{name}: ')
  conflict = guess_conflict(policy.kind, proxy, static_zero(momentum))
  if conflict:
    raise ValueError(f'{name}: {conflict}')
  return policy


def gel(loss_fn: Callable, client_lr: optax.ScalarOrSchedule, momentum: float = 0.9,
        server_optimizer: optax.GradientTransformation | None = None, proxy: str = 'zero',
        guess_policy: GuessPolicy = GuessPolicy(), name: str = 'gel') -> FederatedAlgorithm:
  """Builds GeL: FedAvgCM whose clients take guessed steps (Boukhari et al. 2023, GeL).

  Each client runs SGD with momentum (``gel_sgdm``: ``v <- alpha v - lr g; y <- y + v``) for
  its ``tau_i`` gradient steps, then takes ``tau'_i`` guessed steps (``guess_policy``; default
  the paper's ``tau' = b + 5 - tau_i``): with the zero proxy eq. 5's nudge ``alpha (1 -
  alpha^tau') / (1 - alpha) v`` in closed form; with the last-gradient proxy (Dhasade et al.
  2021, GeL: guess and learn) the optimiser re-applied with its last gradient. FedYogi + GeL
  is ``gel`` with ``fedjax_gel.optim.fedyogi`` on the server.

  Args:
    loss_fn: ``(params, batch) -> scalar`` mean minibatch loss.
    client_lr: the clients' learning rate (or an optax schedule).
    momentum: ``alpha``, in ``[0, 1)``.
    server_optimizer: applied to the mean update; default ``optax.sgd(1.0)``.
    proxy: the guessed gradient, one of ``optim.PROXIES``: ``'zero'`` or ``'last_gradient'``.
    guess_policy: how many guesses each client takes.
    name: display name.

  Returns:
    The ``FederatedAlgorithm``, with ``guess_policy.counts`` as its ``client_guesses``.

  Raises:
    ValueError: a policy out of range (``GuessPolicy.check``), an unknown proxy, infinitely
      many last-gradient guesses, or zero-proxy guesses without momentum.

  Examples:
    >>> import fedjax_gel as fg
    >>> model = fg.get_model('logistic', (60,), 5)
    >>> alg = fg.gel(fg.cross_entropy_loss(model), client_lr=0.01, momentum=0.9,
    ...              guess_policy=fg.GuessPolicy('fixed', count=5))
  """
  policy = checked_policy(name, guess_policy, proxy, momentum)
  return local_sgd(loss_fn, gel_sgdm(client_lr, momentum, proxy), server_optimizer,
                   client_guesses=policy.counts, name=name)


def fedavg_gel(loss_fn: Callable, client_lr: optax.ScalarOrSchedule,
               server_optimizer: optax.GradientTransformation | None = None,
               proxy: str = 'last_gradient', guess_policy: GuessPolicy = GuessPolicy()
               ) -> FederatedAlgorithm:
  """Builds FedAvg + GeL: client SGD with guessed steps (Boukhari et al. 2023, GeL).

  GeL's Table 3 lists FedAvg's GeL version as SGDM with guesses, which is ``gel`` itself; with
  plain SGD the zero proxy guesses nothing, so this one uses the last-gradient proxy.

  Args:
    loss_fn: ``(params, batch) -> scalar`` mean minibatch loss.
    client_lr: the clients' learning rate (or an optax schedule).
    server_optimizer: applied to the mean update; default ``optax.sgd(1.0)``.
    proxy: the guessed gradient (default ``'last_gradient'``; ``'zero'`` is refused unless the
      policy is ``'none'``: it would guess nothing without momentum).
    guess_policy: how many guesses each client takes.

  Returns:
    The ``FederatedAlgorithm``, named ``'fedavg_gel'``.

  Raises:
    ValueError: a policy out of range, an unknown or zero proxy, or infinitely many guesses.
  """
  policy = checked_policy('fedavg_gel', guess_policy, proxy, 0.)
  return local_sgd(loss_fn, gel_sgdm(client_lr, 0., proxy), server_optimizer,
                   client_guesses=policy.counts, name='fedavg_gel')


@dataclasses.dataclass(frozen=True)
class GelHparams:
  """The guessed steps of the GeL algorithms (``GuessPolicy``) and their proxy."""
  guess_policy: str = hparam(
      'remaining', "GeL guessed steps tau'_i: remaining (tau - tau_i), cohort_max (max_j tau_j "
      '+ k - tau_i), inf, fixed, percent (of tau_i), none.', one_of(*GUESS_POLICIES))
  guess_tau: int = hparam(0, 'remaining: the requested steps tau; 0 = b + 5.',
                          within(0, MAX_GUESSES))
  guess_k: int = hparam(0, 'cohort_max: the k in max_j tau_j + k.', within(0, MAX_GUESSES))
  guess_count: int = hparam(5, 'fixed: guessed steps per client.', within(0, MAX_GUESSES))
  guess_percent: float = hparam(
      25.0, 'percent: guesses as a percentage of tau_i (over 100: more guesses than steps).',
      within(0, MAX_PERCENT), static=True)   # GuessPolicy.check reads it
  guess_proxy: str = hparam(
      'default', 'default, zero (momentum nudge, eq. 5) or last_gradient (re-apply the client '
      'optimiser with the last gradient); default: zero, last_gradient for fedavg_gel.',
      one_of('default', *PROXIES))

  @property
  def policy(self) -> GuessPolicy:
    """The ``GuessPolicy`` (``guess_tau=0``: ``b + 5``, from the budgets)."""
    values = {'tau': self.guess_tau or None, 'k': self.guess_k, 'count': self.guess_count,
              'percent': self.guess_percent}
    reads = POLICY_READS.get(self.guess_policy)
    return GuessPolicy(self.guess_policy, **({reads: values[reads]} if reads else {}))

  def proxy(self, sgd_clients: bool = False) -> str:
    """The proxy: the field, or by default zero (last gradient for plain SGD clients)."""
    if self.guess_proxy != 'default':
      return self.guess_proxy
    return 'last_gradient' if sgd_clients else 'zero'


def check_guesses(name: str, sgd_clients: bool = False, zero_proxy_only: str = ''):
  """The cross-field check of a GeL spec, on the whole config: the builder's rule
  (``guess_conflict``; SGD clients have no momentum) in flag terms, ``zero_proxy_only`` (why) for
  FedNova's and FedProx's GeL, and a ``remaining`` policy's ``guess_tau`` above the smallest
  step budget (else no client would guess)."""
  def check(c):
    hp = c.algorithm.hparams
    proxy = hp.proxy(sgd_clients)
    conflict = guess_conflict(hp.guess_policy, proxy, sgd_clients)
    if conflict:   # named by the flag at fault: the policy for inf, else the proxy
      first, second = ((f'--guess_policy={hp.guess_policy}', f'--guess_proxy={proxy}')
                       if hp.guess_policy == 'inf' else
                       (f'--guess_proxy={proxy}', f'--guess_policy={hp.guess_policy}'))
      return f'{first} with {second} and --algorithm={name}: {conflict}'
    if zero_proxy_only and proxy != 'zero':
      return (f'--guess_proxy={proxy}: {name} guesses with the zero proxy only '
              f'({zero_proxy_only})')
    return check_guess_tau(c)
  return check


def check_guess_tau(c) -> str | None:
  """GeL's remaining policy guesses ``max(tau - tau_i, 0)`` steps: a ``--guess_tau`` at most the
  smallest step budget guesses none, and the algorithm would run as its base one."""
  hp, cohort = c.algorithm.hparams, c.cohort
  (a, b) = cohort.budget_range
  if (hp.guess_policy != 'remaining' or not hp.guess_tau or cohort.budget_unit != 'steps' or
      hp.guess_tau > a):
    return None
  return (f'--guess_tau={hp.guess_tau} is at most the smallest budget (--budget_range={a},{b}): '
          f'no client would guess a step and --algorithm={c.algorithm.name} would run as its '
          f'base algorithm; use more than {a} steps, 0 for b + 5 = {b + 5}, or '
          '--guess_policy=none')


GEL = AlgorithmSpec(
    'gel', lambda hp, s: gel(s.loss, s.client_lr, s.client_momentum, s.server, hp.proxy(),
                             hp.policy),
    GelHparams, client='SGDM + guessed steps (FedAvgCM + GeL)', guesses=True, momentum=True,
    check=check_guesses('gel'), paired_with='fedavgcm', upload_delta=True,
    paper='Boukhari et al. 2023, "Boosting Federated Learning in Resource-Constrained Networks" '
    '(GeL), Alg. 1, eq. 5')
FEDAVG_GEL = AlgorithmSpec(
    'fedavg_gel', lambda hp, s: fedavg_gel(s.loss, s.client_lr, s.server, hp.proxy(True),
                                           hp.policy),
    GelHparams, client='SGD + guessed steps with the last-gradient proxy', guesses=True,
    check=check_guesses('fedavg_gel', True), paired_with='fedavg', upload_delta=True,
    paper="Dhasade et al. 2021's proxy on FedAvg's clients")
FEDYOGI_GEL = AlgorithmSpec(
    'fedyogi_gel', lambda hp, s: gel(s.loss, s.client_lr, s.client_momentum, s.server,
                                     hp.proxy(), hp.policy, 'fedyogi_gel'),
    GelHparams, client='SGDM + guessed steps', guesses=True, server_optimizer='fedyogi',
    base='gel', momentum=True,
    server='fedyogi', check=check_guesses('fedyogi_gel'), paired_with='fedyogi',
    upload_delta=True, paper='GeL §4.5')
