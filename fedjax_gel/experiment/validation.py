"""The checks of an experiment's ``Config`` across its fields: ``validate`` (every field's own
check, then the rules that tie fields together), ``privacy_problem`` (differential privacy that
could not be clipped, noised and accounted for as ``fedjax_gel.privacy`` does it) and
``unread_flags`` (the settings a run does not read, so that a sweep refuses them and a
comparison ignores them).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from fedjax_gel.data import registry as data_registry
from fedjax_gel.experiment.config import (SECTIONS, SERVER_READS, Config, ConfigError,
                                          PrivacyConfig, ServerConfig)
from fedjax_gel.spec import INT32_MAX, flag_name, problems
from fedjax_gel.spec.dataset import COMMON, PATHS


OWN_SERVER = '{} sets its own server step and applies no server optimiser'


def unread_flags(c: Config) -> dict[str, str]:
  """``{flag: why}`` of the settings ``c``'s run does not read, so that their value changes
  nothing: the data settings its dataset does not read (``DatasetSpec.reads`` and
  ``DatasetSpec.unread``; another dataset's own settings are no flags of ``c``; none of a
  dataset this process does not know), the selection rules' of other rules, the client
  momentum of algorithms whose clients take plain steps, server settings of other server
  optimisers (all of them with an algorithm whose server step is its own). ``sweep.expand``
  refuses one set away from its default that no run of the command reads (``read_variants``);
  a work directory's runs and a report's are compared without them."""
  d, k, spec = c.data, c.cohort, c.spec
  out = {}
  if d.dataset in data_registry.names():   # else a run read back (``compare``)
    data = d.spec
    out.update({flag: data_registry.not_read(flag, d.dataset) for flag in COMMON
                if flag not in data.read()})
    if data.unread is not None:
      out.update(data.unread(d.hparams))
  if k.client_selection != 'cyclic':
    out['cyclic_groups'] = (f'read only with --client_selection=cyclic (got '
                            f'{k.client_selection})')
  if k.client_selection != 'power_of_d':
    out['power_d'] = out['power_loss'] = (f'read only with --client_selection=power_of_d (got '
                                          f'{k.client_selection})')
  if k.client_selection == 'poisson':
    out['sample_with_replacement'] = ('--client_selection=poisson draws each client '
                                      'independently, at most once a round')
  builtin = (getattr(spec.build, '__module__', None) or '').startswith('fedjax_gel.')
  # a user's algorithm may read it without saying so; 0 is what clients without momentum do,
  # so one flag file can run FedGBO's plain-SGD FedProx beside FedAvg
  if builtin and not spec.momentum and c.algorithm.client_momentum != 0:
    out['client_momentum'] = (f'--algorithm={spec.name} does not read it (its clients take '
                              'steps without momentum)')
  dp = [flag_name(f) for f in dataclasses.fields(PrivacyConfig)][1:]
  if not c.privacy.on:
    out.update(dict.fromkeys(dp, 'read only with differential privacy (--dp_clip_norm > 0)'))
  elif not c.privacy.target_quantile:
    out.update(dict.fromkeys(('dp_clip_lr', 'dp_clip_count_noise'),
                             'read only with adaptive clipping (--dp_target_quantile > 0)'))
  server = [flag_name(f) for f in dataclasses.fields(ServerConfig)]
  if spec.own_server:
    out.update(dict.fromkeys(server, OWN_SERVER.format(f'--algorithm={spec.name}')))
  else:
    opt = spec.server_optimizer or c.server.optimizer
    for flag in dict.fromkeys(f for reads in SERVER_READS.values() for f in reads):
      if flag not in SERVER_READS[opt]:
        out[flag] = f'--server_optimizer={opt} does not read it'
  return out


def privacy_problem(c: Config) -> Optional[str]:
  """What keeps ``c``'s differential privacy from being clipped, noised and accounted for as
  ``fedjax_gel.privacy`` does it, one line; None when nothing (or DP is off)."""
  p, k, spec = c.privacy, c.cohort, c.spec
  if spec.private and not p.on:
    return (f'--algorithm={spec.name} needs --dp_clip_norm > 0: the L2 norm its clients\' '
            'updates are clipped to')
  if not p.on:
    return None
  if not spec.upload_delta:
    from fedjax_gel.algorithms import registry   # pylint: disable=g-import-not-at-top
    able = ', '.join(s.name for s in registry.specs() if s.upload_delta)
    return (f'--dp_clip_norm={p.clip_norm:g}: --algorithm={spec.name} uploads more than its '
            'model delta or keeps state per client, which differential privacy here does not '
            f'protect; one of {able}')
  if k.aggregation_weights != 'uniform':
    return (f'--aggregation_weights={k.aggregation_weights}: differential privacy weighs clients '
            'uniformly (a client moves the mean by at most the clip over the cohort); pass '
            '--aggregation_weights=uniform or leave it at its default')
  if k.client_selection not in ('uniform', 'poisson'):
    return (f'--client_selection={k.client_selection}: differential privacy is accounted for '
            'cohorts drawn uniformly or by Poisson sampling (dp-accounting has no event for '
            'this one)')
  poisson = k.client_selection == 'poisson'
  if k.sample_with_replacement and not poisson:
    return ('--sample_with_replacement: differential privacy is accounted for cohorts drawn '
            'without replacement or by Poisson sampling (dp-accounting has no event for this '
            'one); pass --nosample_with_replacement')
  if p.accountant == 'pld' and not poisson:
    return ('--dp_accountant=pld: dp-accounting\'s PLD accountant does not account for a '
            'fixed-size cohort drawn without replacement; use --dp_accountant=rdp or '
            '--client_selection=poisson')
  if p.accountant == 'pld' and p.target_quantile:
    return ('--dp_accountant=pld: dp-accounting\'s PLD accountant does not account for adaptive '
            'clipping\'s two queries under sampling; use --dp_accountant=rdp')
  if c.model.model_state in ('average', 'local'):
    return (f'--model_state={c.model.model_state}: the model statistics the server averages '
            'would reach the released model unprotected by differential privacy; choose frozen')
  if k.budget_draw == 'proportional':
    return ('--budget_draw=proportional: every client\'s budget reads the largest client of the '
            'population, so one client would move all the others\' updates, beyond what '
            'differential privacy bounds; draw budgets uniformly or per client')
  if k.budget_unit == 'epochs' and getattr(c.algorithm.hparams, 'guess_policy', '') == (
      'cohort_max'):
    return ('--guess_policy=cohort_max with --budget_unit=epochs: each client\'s guesses would '
            'read the other clients\' data sizes, beyond what differential privacy bounds; '
            'count budgets in steps or use another guess policy')
  if p.target_quantile and p.noise_multiplier:
    sigma = p.count_noise(k.clients_per_round)
    if 2 * sigma <= p.noise_multiplier:
      return (f'--dp_clip_count_noise={sigma:g} leaves nothing of --dp_noise_multiplier='
              f'{p.noise_multiplier:g} for the updates (Andrew et al. 2021: the count takes '
              f'(2 sigma_b)^-2 of z^-2); raise it above {p.noise_multiplier / 2:g}')
  return None


def validate(c: Config) -> Config:
  """Checks a ``Config``: every field's own check (from its metadata), then the rules across them.

  Args:
    c: the ``Config``.

  Returns:
    ``c`` itself.

  Raises:
    ConfigError: one line naming the flag and the problem.

  Examples:
    >>> from fedjax_gel import experiment
    >>> experiment.validate(experiment.make(clients_per_round=0))
    Traceback (most recent call last):
    ...
    fedjax_gel.experiment.config.ConfigError: --clients_per_round must be an integer in [1, ...
  """
  def need(ok, msg):
    if not ok:
      raise ConfigError(msg)

  for name in SECTIONS:
    found = problems(getattr(c, name))
    need(not found, found[0] if found else '')
    if name == 'data':   # then the dataset's own settings
      data = c.data.spec
      need(isinstance(c.data.hparams, data.hparams),
           f'--dataset={data.name}: its settings must be a {data.hparams.__name__} (got a '
           f'{type(c.data.hparams).__name__}; Config.replace(dataset=...) builds them)')
      found = problems(c.data.hparams)
      need(not found, found[0] if found else '')
  spec, d, cohort = c.spec, c.data, c.cohort
  need(isinstance(c.algorithm.hparams, spec.hparams),
       f'--algorithm={spec.name}: its hyper-parameters must be a {spec.hparams.__name__} (got a '
       f'{type(c.algorithm.hparams).__name__}; Config.replace(algorithm=...) builds them)')
  found = spec.problems(c)
  need(not found, found[0] if found else '')
  fixed = spec.server_optimizer
  need(fixed is None or c.server.optimizer in ('sgd', fixed),
       f'--server_optimizer={c.server.optimizer}: --algorithm={spec.name} fixes its server '
       f'optimiser ({fixed}); use --algorithm=fedavg to combine SGD clients with another server '
       'optimiser')
  from fedjax_gel.algorithms import registry   # pylint: disable=g-import-not-at-top
  named = [s.name for s in registry.specs()
           if s.base == spec.name and s.server_optimizer == c.server.optimizer]
  need(not named, f'--server_optimizer={c.server.optimizer} with --algorithm={spec.name} is '
       f'--algorithm={named[0] if named else ""}; use that name (one name per run)')
  for flag in data.needs:
    need(getattr(d, flag), f'--{flag} is required with --dataset={d.dataset}')
  for flag in PATHS:   # a path no run reads: refused, not recorded as if it had been read
    need(flag in data.read() or not getattr(d, flag),
         f'--{flag} is only read with --dataset={",".join(data_registry.readers(flag))} (got '
         f'--dataset={d.dataset})')
  problem = data.check(d) if data.check is not None else None
  need(not problem, problem)
  need((cohort.budget_draw == 'per_client') == bool(cohort.client_budgets),
       '--client_budgets is required with --budget_draw=per_client and read only with it (got '
       f'--budget_draw={cohort.budget_draw})')
  need(cohort.power_d == 0 or cohort.power_d >= cohort.clients_per_round,
       f'--power_d={cohort.power_d} must be at least --clients_per_round='
       f'{cohort.clients_per_round}')
  need(cohort.client_selection != 'power_of_d' or cohort.candidates <= INT32_MAX,
       f'--power_d=0 means 2 x --clients_per_round = {cohort.candidates} candidates, more than '
       f'{INT32_MAX}; give --power_d')
  (a, b), size = cohort.budget_range, cohort.clients_per_round
  examples = size * b * cohort.batch_size   # a round's examples, counted (and indexed) in int32
  need(examples <= INT32_MAX,
       f'--budget_range={a},{b} with --clients_per_round={size} and --batch_size='
       f'{cohort.batch_size}: a round of C b B = {examples} examples exceeds the int32 limit '
       f'{INT32_MAX}; lower one of them')
  problem = privacy_problem(c)
  need(problem is None, problem)
  from fedjax_gel.models import BUILTIN_MODELS   # pylint: disable=g-import-not-at-top
  need(c.model.name not in BUILTIN_MODELS or 0 < c.run.target <= 1,
       f'--target must lie in (0, 1] (got {c.run.target:g}): --model={c.model.name} is scored '
       'by accuracy')
  for name in ('eval_every_round_from', 'eval_every_round_until'):
    value = getattr(c.run, name)
    need(c.model.name not in BUILTIN_MODELS or value is None or 0 < value <= 1,
         f'--{name} must lie in (0, 1] (got {value}): --model={c.model.name} is scored by '
         'accuracy')
  start, end = c.run.eval_every_round_from, c.run.eval_every_round_until
  need(end is None or start is not None,
       '--eval_every_round_until needs --eval_every_round_from (the round evaluations to end)')
  need(c.model.name not in BUILTIN_MODELS or None in (start, end) or start < end,
       f'--eval_every_round_until={end} must lie above --eval_every_round_from={start} (an '
       'accuracy: the window would never open)')
  return c
