"""Runs one federated experiment: ``python launch/run.py --flagfile=launch/configs/X.flags``.

Bad input (flag values, data files, an occupied workdir) prints one line on stderr and exits
with status 2 before anything is written.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time

from absl import app, flags, logging

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fedjax_gel.experiment import compilation_cache  # pylint: disable=g-import-not-at-top
from fedjax_gel.experiment import config as config_lib  # pylint: disable=g-import-not-at-top

D = config_lib.Config()
F = flags.FLAGS
flags.DEFINE_string('workdir', None, 'Output directory (default: runs/<algorithm>_<dataset>_<time>).')
flags.DEFINE_bool('overwrite', False, 'Replace the outputs of an earlier run in --workdir.')
flags.DEFINE_string('compilation_cache', compilation_cache.default_dir(),
                    'Folder of JAX\'s persistent compilation cache (compiled programs reused by '
                    f'later processes); empty: off. Default ${compilation_cache.ENV} if set, else '
                    'the user cache folder.')
flags.DEFINE_string('dataset', D.dataset, f'One of {", ".join(config_lib.DATASETS)}.')
flags.DEFINE_string('data_path', None, 'LEAF datasets: a LEAF JSON file, a directory of them '
                    '(merged: FEMNIST), or a directory with train/ and test/.')
flags.DEFINE_string('leaf_split', D.leaf_split, "LEAF's split of --data_path: sample (each "
                    "user's samples at random), position (first samples train; Shakespeare), "
                    'user (held-out users); default: position for shakespeare, else sample.')
flags.DEFINE_integer('split_gap', D.split_gap, 'position split: samples skipped between train '
                     "and test (LEAF's Shakespeare: 79, so no test window overlaps training).")
flags.DEFINE_string('char_vocabulary', D.char_vocabulary,
                    "shakespeare: leaf (LEAF's 80 characters) or tff (TFF's 86).")
flags.DEFINE_string('sent140_features', D.sent140_features,
                    'sent140: bow (word counts, linear model) or tokens (word ids, LSTM).')
flags.DEFINE_integer('vocab_size', D.vocab_size, 'sent140: most frequent training words kept.')
flags.DEFINE_integer('seq_len', D.seq_len, 'sent140 tokens: words kept per tweet (LEAF: 25).')
flags.DEFINE_string('image_dir', None, "celeba: the images (LEAF's data/raw/img_align_celeba).")
flags.DEFINE_float('fedprox_alpha', D.fedprox_alpha, 'fedprox_synthetic: alpha of Synthetic(a, b).')
flags.DEFINE_float('fedprox_beta', D.fedprox_beta, 'fedprox_synthetic: beta of Synthetic(a, b).')
flags.DEFINE_bool('fedprox_iid', D.fedprox_iid, 'fedprox_synthetic: the IID variant.')
flags.DEFINE_string('data_dir', None, 'TFDS datasets (mnist, emnist, cifar10, cifar100): the '
                    'TFDS data directory they were prepared in (ArrayRecord); nothing is '
                    'downloaded.')
flags.DEFINE_integer('num_clients', D.num_clients, 'TFDS datasets: clients the data is dealt to.')
flags.DEFINE_string('partition', D.partition, 'TFDS datasets: dirichlet (label proportions '
                    'Dir(alpha)) or pachinko (cifar100: superclasses Dir(alpha), labels Dir(beta)).')
flags.DEFINE_float('dirichlet_alpha', D.dirichlet_alpha, 'TFDS datasets: Dirichlet alpha.')
flags.DEFINE_float('pachinko_beta', D.pachinko_beta, 'TFDS cifar100 pachinko: beta.')
flags.DEFINE_float('train_fraction', D.train_fraction, "Per-client train share (LEAF's 0.9).")
flags.DEFINE_integer('split_seed', D.split_seed, 'Seed of the per-client train/test split.')
flags.DEFINE_string('model', D.model, 'Model name (see fedjax_gel.models.MODELS).')
flags.DEFINE_list('algorithm', [D.algorithm],
                  f'One or more (comma-separated, run one after another with the same seed, '
                  f'into WORKDIR/<algorithm>/) of {", ".join(config_lib.ALGORITHMS)}.')
flags.DEFINE_alias('algorithms', 'algorithm')
flags.DEFINE_integer('num_rounds', D.num_rounds, 'Communication rounds.')
flags.DEFINE_integer('clients_per_round', D.clients_per_round, 'Cohort size C.')
flags.DEFINE_bool('sample_with_replacement', D.sample_with_replacement,
                  'Sample the cohort with replacement (the GeL code does).')
flags.DEFINE_integer('batch_size', D.batch_size, 'Client minibatch size B.')
flags.DEFINE_string('budget_range', '%d,%d' % D.budget_range,
                    'a,b: local steps tau_i ~ U{a..b} per client and round.')
flags.DEFINE_float('client_lr', D.client_lr, 'Client learning rate.')
flags.DEFINE_list('client_lr_grid', [], 'Several client learning rates: every algorithm runs with '
                  'each, and the report keeps, per algorithm, the one with the best accuracy.')
flags.DEFINE_list('server_lr_grid', [], 'Several server learning rates: every algorithm (and seed) '
                  'trains the grid --client_lr_grid (else --client_lr) x --server_lr_grid as one '
                  'vmapped program, each cell its own model, into WORKDIR/.../grid.json with a '
                  'heat map in plots/grid.png; diverged cells are marked.')
flags.DEFINE_float('client_momentum', D.client_momentum,
                   'Client momentum of the SGDM clients (fedavgcm, GeL, FedProx, FedNova).')
flags.DEFINE_float('prox_mu', D.prox_mu, 'FedProx proximal weight mu (fedprox, fedprox_gel).')
flags.DEFINE_list('gbo_optimizer', [D.gbo_optimizer],
                  'Global optimiser(s) of fedgbo, mfl, mimelite, mimexlite: sgdm, rmsprop, adam '
                  '(several: each of those algorithms runs once per optimiser).')
flags.DEFINE_float('gbo_beta', D.gbo_beta, 'FedGBO family: SGDm/RMSProp decay, Adam beta1.')
flags.DEFINE_float('gbo_beta2', D.gbo_beta2, 'FedGBO family: Adam beta2.')
flags.DEFINE_float('gbo_eps', D.gbo_eps, 'FedGBO family: RMSProp/Adam eps (adaptivity).')
flags.DEFINE_float('fedmax_beta', D.fedmax_beta, 'FedMAX entropy weight beta.')
flags.DEFINE_float('fedexp_eps', D.fedexp_eps, 'FedExP eps in its server step size eta_g.')
flags.DEFINE_float('feddyn_mu', D.feddyn_mu, "FedDyn's regulariser weight (its paper's alpha).")
flags.DEFINE_float('adabest_mu', D.adabest_mu, "AdaBest's local estimate weight mu.")
flags.DEFINE_float('adabest_beta', D.adabest_beta, "AdaBest's server decay beta (0 and "
                   '--adabest_mu=0: FedAvg).')
flags.DEFINE_integer('fedvarp_clusters', D.fedvarp_clusters,
                     'cluster_fedvarp: server memories K; client i belongs to cluster i mod K.')
flags.DEFINE_string('client_selection', D.client_selection,
                    'uniform; cyclic (clients in --cyclic_groups groups by id mod K; round t '
                    'samples group t mod K); power_of_d (the C highest-loss of --power_d '
                    'data-weighted candidates).')
flags.DEFINE_integer('cyclic_groups', D.cyclic_groups, 'cyclic: the number of client groups K.')
flags.DEFINE_integer('power_d', D.power_d,
                     'power_of_d: candidates d (drawn in proportion to data size); 0 = 2 x C.')
flags.DEFINE_string('power_loss', D.power_loss,
                    "power_of_d: the candidates' local loss over all their examples (full) or one "
                    'minibatch (minibatch).')
flags.DEFINE_string('guess_policy', D.guess_policy,
                    'GeL guessed steps tau\'_i: remaining (tau - tau_i), cohort_max '
                    '(max_j tau_j + k - tau_i), inf, fixed, percent (of tau_i), none.')
flags.DEFINE_integer('guess_tau', D.guess_tau, 'remaining: the requested steps tau; 0 = b + 5.')
flags.DEFINE_integer('guess_k', D.guess_k, 'cohort_max: the k in max_j tau_j + k.')
flags.DEFINE_integer('guess_count', D.guess_count, 'fixed: guessed steps per client.')
flags.DEFINE_float('guess_percent', D.guess_percent, 'percent: guesses as a percentage of tau_i.')
flags.DEFINE_string('guess_proxy', D.guess_proxy,
                    'default, zero (momentum nudge, eq. 5) or last_gradient (re-apply the '
                    'client optimiser with the last gradient); default: zero, last_gradient '
                    'for fedavg_gel.')
flags.DEFINE_string('server_optimizer', D.server_optimizer,
                    f'One of {", ".join(config_lib.SERVER_OPTIMIZERS)}, applied to Delta: '
                    'fed* are Reddi et al. 2021\'s forms, adam/yogi/adagrad optax\'s.')
flags.DEFINE_float('server_lr', D.server_lr, 'Server learning rate.')
flags.DEFINE_float('server_momentum', D.server_momentum, 'Server momentum (--server_optimizer=momentum).')
flags.DEFINE_float('server_beta1', D.server_beta1, 'FedOpt / Adam-type server beta1.')
flags.DEFINE_float('server_beta2', D.server_beta2, 'FedOpt / Adam-type server beta2.')
flags.DEFINE_float('server_tau', D.server_tau, 'FedOpt adaptivity tau (eps of optax forms).')
flags.DEFINE_string('aggregation_weights', D.aggregation_weights,
                    'samples_seen (min(tau_i B, n_i)), num_examples (n_i) or uniform.')
flags.DEFINE_integer('seed', D.seed, 'Seed of cohorts, budgets, initial model and shuffles.')
flags.DEFINE_list('seeds', [], 'Several seeds (overrides --seed): every algorithm runs with each, '
                  'paired, into WORKDIR/seed<S>/; a table of rounds to target ends the output.')
flags.DEFINE_bool('vmap_seeds', True, 'Run the --seeds of each algorithm as one program vmapped '
                  'over the seeds where they fit (one device, no per-client state or power-of-d; '
                  'the same numbers as one run per seed).')
flags.DEFINE_integer('eval_every', D.eval_every, 'Evaluate every this many rounds.')
flags.DEFINE_integer('checkpoint_every', D.checkpoint_every,
                     'Rounds between checkpoints (0: none). Running the same command again in '
                     'the same --workdir resumes from the last one; finished runs are kept.')
flags.DEFINE_float('target_accuracy', D.target_accuracy, 'Accuracy for rounds_to_target.')
flags.DEFINE_integer('chunk_size', D.chunk_size, 'Clients vmapped together; 0 = automatic.')
flags.DEFINE_integer('num_devices', D.num_devices,
                     'Devices the cohort is split over (mesh axis "clients"); 0 = automatic: '
                     'all when each gets at least 200 clients or the per-client store would '
                     "take more than half of one device's memory, else one. On CPU every core "
                     'is a device.')


def distinct(flag, items, kind=str):
  """``items`` as ``kind``s, or a ConfigError naming ``--flag`` (bad values or repeats)."""
  try:
    items = [kind(x) for x in items]
  except ValueError:
    raise config_lib.ConfigError(f'--{flag} must hold {kind.__name__}s (got {",".join(items)})'
                                 ) from None
  if not items or len(set(items)) != len(items):
    raise config_lib.ConfigError(f'--{flag} needs distinct values (got {items})')
  return items


def lr_grid(flag: str, items) -> list[float]:
  values = distinct(flag, items, float)
  if not all(0 < v < 3e38 for v in values):   # float32 cells: 3e38 is about their largest value
    raise config_lib.ConfigError(f'--{flag} needs positive, finite learning rates below 3e38 '
                                 f'(got {",".join(items)})')
  return values


def configs_from_flags() -> list[config_lib.Config]:
  """One Config per run: ``--seeds`` (else ``--seed``) x ``--algorithm`` (the FedGBO family once
  per ``--gbo_optimizer``) x ``--client_lr_grid`` (else ``--client_lr``; with
  ``--server_lr_grid`` the client lrs are the grid's rows, not separate runs)."""
  skip = ('budget_range', 'algorithm', 'seed', 'gbo_optimizer', 'client_lr')
  values = {f.name: getattr(F, f.name) for f in dataclasses.fields(config_lib.Config)
            if f.name not in skip}
  values['budget_range'] = config_lib.parse_budget_range(F.budget_range)
  algorithms = distinct('algorithm', F.algorithm)
  seeds = distinct('seeds', F.seeds, int) if F.seeds else [F.seed]
  lrs = lr_grid('client_lr_grid', F.client_lr_grid) if F.client_lr_grid else [F.client_lr]
  if F.server_lr_grid:
    lrs = lrs[:1]   # the grid's rows: one program per algorithm and seed
  gbo_kinds = distinct('gbo_optimizer', F.gbo_optimizer)
  return [config_lib.Config(algorithm=a, seed=s, gbo_optimizer=k, client_lr=lr, **values)
          for s in seeds for a in algorithms
          for k in (gbo_kinds if a in config_lib.GBO_ALGORITHMS else gbo_kinds[:1])
          for lr in lrs]


def run_dir(workdir: str, c: config_lib.Config, levels: tuple[bool, bool, bool]) -> str:
  """``WORKDIR[/seed<S>][/<run name>][/lr<lr>]``, each level only where runs differ in it."""
  seeds, names, lrs = levels
  parts = [workdir] + ([f'seed{c.seed}'] if seeds else []) + ([c.run_name] if names else []) + (
      [f'lr{c.client_lr:g}'] if lrs else [])
  return os.path.join(*parts)


def fail(message: str):
  print(f'error: {message}', file=sys.stderr)
  sys.exit(2)


def main(argv):
  """``run(argv)``; Ctrl-C ends it with one line saying how to go on (exit status 130)."""
  try:
    run(argv)
  except KeyboardInterrupt as e:
    done = getattr(e, 'round', None)   # runner.Interrupted: stopped between rounds
    where = (f'after round {done}, with a checkpoint of it' if done is not None else
             'before the round under way finished')
    print(f'interrupted {where}: run the same command to continue (finished runs are kept, '
          'the others resume from their last checkpoint)', file=sys.stderr)
    sys.exit(130)


def run(argv):
  logging.set_verbosity(logging.ERROR)   # keep JAX's and TFDS's notices off stderr
  if len(argv) > 1:
    fail(f'unexpected arguments: {" ".join(argv[1:])}')
  from fedjax_gel.core.devices import use_all_cpu_cores
  use_all_cpu_cores()   # before JAX starts: on CPU, each core becomes a device of the mesh
  try:
    compilation_cache.enable(F.compilation_cache)
  except OSError as e:
    if F['compilation_cache'].present:
      fail(f'--compilation_cache={F.compilation_cache}: cannot use it as the compilation cache '
           f'({e.strerror or e})')
    print(f'note: no compilation cache ({e.strerror or e}); every program is compiled afresh')
  from fedjax_gel.data.leaf import DataError
  from fedjax_gel.experiment import grid, runner
  try:
    configs = [config_lib.validate(c) for c in configs_from_flags()]
    grids = None
    if F.server_lr_grid:
      grids = (lr_grid('client_lr_grid', F.client_lr_grid) if F.client_lr_grid else
               [F.client_lr], lr_grid('server_lr_grid', F.server_lr_grid))
      for x in configs:
        grid.check_grid(x)
    c = configs[0]
    names = list(dict.fromkeys(x.run_name for x in configs))
    levels = (len({x.seed for x in configs}) > 1, len(names) > 1,
              len({x.client_lr for x in configs}) > 1)
    workdir = F.workdir or os.path.join(
        'runs', f'{"_".join(dict.fromkeys(x.algorithm for x in configs))}_{c.dataset}_'
        f'{time.strftime("%Y%m%d-%H%M%S")}')
    workdirs = [run_dir(workdir, x, levels) for x in configs]
    # the same command again keeps finished runs and resumes the others (--checkpoint_every)
    extra = None if grids is None else grid.grid_fields(*grids)
    status = [runner.run_status(w, x, F.overwrite, extra) for x, w in zip(configs, workdirs)]
    base = runner.prepare(c)   # data, model, chunks: shared by every run
    notes = list(base.notes)
    for i, x in enumerate(configs):   # every run's algorithm, memory and checkpoints first
      exp = runner.with_config(base, x)
      notes += exp.notes
      if grids is not None:
        grid.grid_chunk_size(exp, len(grids[0]) * len(grids[1]))
      if status[i] in ('resume', 'extend') and grids is None:
        runner.check_resume(exp, workdirs[i])
      elif status[i] == 'resume':
        grid.check_resume(exp, *grids, workdirs[i])
    for w in workdirs:
      runner.make_workdir(w)
  except (config_lib.ConfigError, DataError) as e:
    fail(str(e))
  for i, (x, w) in enumerate(zip(configs, workdirs)):   # --num_rounds raised: go on from there
    if status[i] == 'extend':
      runner.extend(w, x)
      status[i] = 'resume'

  for note in dict.fromkeys(notes if grids is None else ()):   # a grid sizes its own chunks
    print(f'note: {note}')
  try:
    if grids is not None:
      run_grids(configs, workdirs, workdir, base, grids, status)
    else:
      train_all(configs, workdirs, workdir, base, status, levels)
  except (config_lib.ConfigError, DataError) as e:   # checked above; a last line of defence
    fail(str(e))


def train_all(configs, workdirs, workdir, base, status, levels):
  """Trains the runs ``run_status`` did not find finished (a run's seeds as one vmapped program
  where they fit) and writes report.md and plots/."""
  from fedjax_gel.experiment import plots, report, runner  # pylint: disable=g-import-not-at-top
  c = configs[0]
  by_index = {}
  for i, st in enumerate(status):
    if st == 'done':   # finished earlier: kept (checkpoints a kill left behind removed)
      by_index[i] = runner.read_json(os.path.join(workdirs[i], 'summary.json'))
      runner.remove_checkpoints(workdirs[i], keep=configs[i].num_rounds)
  compiled = {}
  for group in seed_groups(configs):   # the seeds of one run: one vmapped program where they fit
    group = [i for i in group if i not in by_index]
    if not group:
      continue
    exp = runner.with_config(base, configs[group[0]])
    resume = any(status[i] == 'resume' for i in group)
    if F.vmap_seeds and runner.seeds_fit(exp, len(group)):
      summaries = runner.train_seeds(exp, [configs[i] for i in group],
                                     [workdirs[i] for i in group], compiled=compiled,
                                     resume=resume)
    else:
      summaries = [runner.train(runner.with_config(base, configs[i]), workdirs[i],
                                compiled=compiled, resume=status[i] == 'resume') for i in group]
    by_index.update(zip(group, summaries))
  results = []
  for i, (x, w) in enumerate(zip(configs, workdirs)):
    summary = by_index[i]
    results.append((summary, runner.read_metrics(w)))
    target = summary['rounds_to_target']
    print(f'{x.run_name} on {x.dataset}, seed {x.seed}, client lr {x.client_lr:g}: final test '
          f'accuracy {summary["final_accuracy"]:.4f}, best {summary["best_accuracy"]:.4f}, '
          f'rounds to {x.target_accuracy:.0%}: {target if target is not None else "not reached"}')
  text = report.report_text(results, levels[2])
  if len(results) > 1:
    print(text)
  runner.write_text(os.path.join(workdir, 'report.md'), text + '\n')
  plotted = plots.accuracy_plots(report.kept_runs(results, levels[2]),
                                 os.path.join(workdir, 'plots'), c.target_accuracy)
  if not plotted:
    print("note: plots/ not written: matplotlib is not installed (pip install -e '.[plot]')")
  print(f'outputs: {os.path.abspath(workdir)} (config.json, metrics.jsonl, summary.json, model.msgpack'
        f'{"" if len(configs) == 1 else " per run"}; report.md{"; plots/" if plotted else ""})')


def seed_groups(configs) -> list[list[int]]:
  """Indices of ``configs`` grouped by everything but the seed (first-seen order)."""
  groups: dict = {}
  for i, x in enumerate(configs):
    groups.setdefault(dataclasses.replace(x, seed=0), []).append(i)
  return list(groups.values())


def run_grids(configs, workdirs, workdir, base, grids, status):
  """``--server_lr_grid``: each config's learning-rate grid as one program (a finished grid
  kept, an unfinished one resumed); report.md holds the grids' tables."""
  from fedjax_gel.experiment import grid, runner  # pylint: disable=g-import-not-at-top
  tables = []
  for x, w, st in zip(configs, workdirs, status):
    if st == 'done':
      result = runner.read_json(os.path.join(w, 'grid.json'))
      runner.remove_checkpoints(w)
    else:
      result = grid.train_grid(runner.with_config(base, x), *grids, w, resume=st == 'resume')
    diverged = sum(cell['diverged'] for cell in result['cells'])
    finals = [(cell['final_accuracy'], cell) for cell in result['cells']
              if cell['final_accuracy'] is not None]
    best = max(finals, key=lambda t: t[0])[1] if finals else None
    print(f'{x.run_name} on {x.dataset}, seed {x.seed}: {len(result["cells"])} cells, '
          f'{diverged} diverged' + (f', best final test accuracy {best["final_accuracy"]:.4f} '
                                    f'at client lr {best["client_lr"]:g}, server lr '
                                    f'{best["server_lr"]:g}' if best else ''))
    tables.append(grid.grid_table(result) + f'\n\nHeat map: `{os.path.relpath(w, workdir)}/'
                  'plots/grid.png`')
  runner.write_text(os.path.join(workdir, 'report.md'), '\n\n'.join(tables) + '\n')
  print(f'outputs: {os.path.abspath(workdir)} (config.json, metrics.jsonl, grid.json, '
        'summary.json, plots/grid.png per grid; report.md)')


def flagfiles(argv) -> list[str]:
  """The ``--flagfile`` paths named on the command line, in order (as absl reads them: stripped,
  ``~`` expanded; empty ones are ignored)."""
  found = []
  for i, arg in enumerate(argv):
    if arg == '--':
      break
    name, eq, value = arg.removeprefix('-').removeprefix('-').partition('=')
    if arg.startswith('-') and name == 'flagfile':
      found.append(value if eq else (argv[i + 1] if i + 1 < len(argv) else ''))
  return [os.path.expanduser(p.strip()) for p in found if p.strip()]


def check_flagfile(path: str, including: tuple = ()):
  """A flag file's syntax, before absl reads it: UTF-8 text whose lines are blank, comments
  (``#`` or ``//`` in the first column) or ``--name=value`` (``--name`` for booleans), its nested
  ``--flagfile``s too. The first problem is one line naming the file and the line, and exit
  status 2."""
  real = os.path.realpath(path)
  if real in (os.path.realpath(p) for p in including):
    fail(f'--flagfile={path} includes itself (through {" -> ".join(including)})')
  try:
    with open(path, encoding='utf-8') as f:
      lines = f.read().splitlines()
  except OSError as e:
    fail(f'--flagfile={path}: cannot be read ({e.strerror})')
  except UnicodeDecodeError:
    fail(f'--flagfile={path}: not a text file (not UTF-8)')
  for number, line in enumerate(lines, 1):
    if not line.strip() or line.startswith(('#', '//')):
      continue
    text = line.strip()
    name, _, value = text.removeprefix('-').removeprefix('-').partition('=')
    if not text.startswith('-') or not name or any(ch.isspace() for ch in name):
      fail(f'--flagfile={path} line {number}: {text!r} is not a flag; write --name=value')
    if name == 'flagfile' and value.strip():
      check_flagfile(os.path.expanduser(value.strip()), including + (path,))


def parse_flags(argv):
  """absl parsing, but a bad flag is one line and exit status 2 like every other input error."""
  for path in flagfiles(argv[1:]):
    check_flagfile(path)
  try:
    return F(argv)
  except flags.Error as e:
    text = (str(e).splitlines() or ['bad flags'])[0]
    fail(text.removeprefix('ERROR:: ').removeprefix('ERROR: '))


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
