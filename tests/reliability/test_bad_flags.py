"""Flags with a physical meaning are range-checked: a bad value is one line naming the flag, exit
status 2, nothing written; path flags in a flag file have ``~`` and ``$VARIABLES`` expanded."""
from __future__ import annotations

import contextlib
import io
import pathlib

import pytest
from absl import flags

from fedjax_gel.experiment import cli, parsing

REPO = pathlib.Path(__file__).resolve().parents[2]
BIG = 10**20   # beyond int64, let alone int32

# (flags, what the error line names)
BAD = [
    ([f'--seed={2**64}'], '--seed'),
    (['--seed=-1'], '--seed'),
    ([f'--seed={2**32}'], '4294967295'),              # would alias seed 0
    ([f'--seeds=1,{2**64}'], '--seeds'),
    (['--seeds=3,-5'], '--seeds'),
    (['--split_seed=-1'], '--split_seed'),
    ([f'--num_rounds={BIG}'], '--num_rounds'),
    ([f'--num_rounds={2**31}'], '2147483647'),
    (['--num_rounds=1e20'], '--num_rounds'),
    ([f'--eval_every={BIG}'], '--eval_every'),
    ([f'--checkpoint_every={BIG}'], '--checkpoint_every'),
    ([f'--budget_range=1,{BIG}'], '--budget_range'),
    (['--budget_range=4,100000', '--batch_size=100000'], '--budget_range'),   # C b B > int32
    ([f'--clients_per_round={BIG}'], '--clients_per_round'),
    ([f'--batch_size={2**31}'], '--batch_size'),
    ([f'--chunk_size={BIG}'], '--chunk_size'),
    ([f'--train_eval_examples={BIG}'], '--train_eval_examples'),
    ([f'--power_d={BIG}'], '--power_d'),
    ([f'--heartbeat_timeout={BIG}'], '--heartbeat_timeout'),
    (['--guess_policy=percent', '--guess_percent=1e30'], '--guess_percent'),
    (['--guess_percent=-1'], '--guess_percent'),
    ([f'--guess_tau={BIG}'], '--guess_tau'),
    (['--guess_tau=4'], 'no client would guess'),   # at most every budget (4,13): no GeL
    ([f'--guess_count={2**31}'], '--guess_count'),
    (['--algorithm=cluster_fedvarp', f'--fedvarp_clusters={BIG}'], '--fedvarp_clusters'),
    # another algorithm's flag, which no run of the command reads, is checked as its own runs do
    (['--prox_mu=inf'], '--prox_mu must be a finite number'),
    (['--feddyn_mu=1e39'], "float32's range"),
    (['--fedexp_eps=1e-45'], '--fedexp_eps is 0 in float32'),
]


def run(*args):
  """``launch/run.py args`` in this process: (exit status, stderr)."""
  err = io.StringIO()
  with contextlib.chdir(REPO), contextlib.redirect_stdout(io.StringIO()), \
      contextlib.redirect_stderr(err):
    code = cli.main(['run.py', *args])
  return code, err.getvalue()


@pytest.mark.parametrize('bad, name', BAD, ids=[' '.join(b) for b, _ in BAD])
def test_a_value_out_of_range_is_one_line_naming_the_flag(tmp_path, bad, name):
  workdir = tmp_path / 'w'
  code, err = run('--flagfile=launch/configs/quickstart.flags', *bad, f'--workdir={workdir}')
  lines = err.splitlines()
  assert code == 2 and len(lines) == 1, err
  assert lines[0].startswith('error: ') and name in lines[0] and 'Traceback' not in err
  assert not workdir.exists() and not list(tmp_path.iterdir())


def parsed(*args) -> flags.FlagValues:
  values = flags.FlagValues()
  cli.define_flags(values)
  parsing.parse(['run.py', *args], values)
  return values


def test_path_flags_of_a_flag_file_are_expanded(tmp_path, monkeypatch):
  """absl reads a flag file verbatim: ``~`` and ``$VAR`` are expanded by ``parsing.parse``."""
  home, data = tmp_path / 'home', tmp_path / 'data'
  monkeypatch.setenv('HOME', str(home))
  monkeypatch.setenv('FEDJAX_GEL_TEST_DATA', str(data))
  flagfile = tmp_path / 'paths.flags'
  flagfile.write_text('--dataset=leaf\n--workdir=~/somewhere\n'
                      '--data_path=$FEDJAX_GEL_TEST_DATA/train.json\n'
                      '--client_budgets=${FEDJAX_GEL_TEST_DATA}/budgets.json\n'
                      '--compilation_cache=~/cache\n')
  values = parsed(f'--flagfile={flagfile}')
  assert values.workdir == str(home / 'somewhere')
  assert values.data_path == str(data / 'train.json')
  assert values.client_budgets == str(data / 'budgets.json')
  assert values.compilation_cache == str(home / 'cache')
  assert values['data_path'].present
  config, _ = cli.from_flags(values)
  assert config.data.data_path == str(data / 'train.json')
  # the shipped subsets and unset optional paths are left alone
  values = parsed('--data_path=subset:femnist_niid_05')
  assert values.data_path == 'subset:femnist_niid_05' and values.image_dir is None


@pytest.mark.parametrize('text, words', [
    ('--data_path=$FEDJAX_GEL_TEST_UNSET/d', ['--data_path', 'FEDJAX_GEL_TEST_UNSET', 'not set']),
    ('--workdir=~no_such_user_xyz/w', ['--workdir', 'no_such_user_xyz']),
    ('--data_path=/tmp/${FEDJAX_GEL_TEST_UNSET', ['--data_path', 'without its closing']),
])
def test_an_unexpandable_path_is_one_line(tmp_path, monkeypatch, text, words):
  monkeypatch.delenv('FEDJAX_GEL_TEST_UNSET', raising=False)
  flagfile = tmp_path / 'paths.flags'
  workdir = '' if text.startswith('--workdir') else f'--workdir={tmp_path / "w"}\n'
  flagfile.write_text(f'--flagfile={REPO}/launch/configs/quickstart.flags\n{workdir}{text}\n')
  code, err = run(f'--flagfile={flagfile}')
  lines = err.splitlines()
  assert code == 2 and len(lines) == 1 and lines[0].startswith('error: '), err
  assert all(w in lines[0] for w in words)
  assert sorted(p.name for p in tmp_path.iterdir()) == ['paths.flags']


def test_a_path_flag_given_no_value_is_one_line():
  """absl gives a flag without a value the next argument: ``--workdir --only_check_args`` ran
  a whole command into a folder named ``--only_check_args``."""
  code, err = run('--flagfile=launch/configs/quickstart.flags', '--workdir', '--only_check_args')
  assert code == 2 and err.splitlines() == [
      'error: --workdir=--only_check_args: a path cannot start with "-" (was --workdir given no '
      'value?); write ./--only_check_args for such a name'], err
  assert not (REPO / '--only_check_args').exists()


@pytest.mark.parametrize('extra, code, line', [
    (['--client_lr=-1'], 2, 'error: --client_lr must be positive (got -1.0)'),
    (['--workdir='], 2, 'error: --workdir is empty: name a folder, or leave the flag out for the '
     'default runs/<algorithms>_<dataset>_<digest>/'),
    (['--num_processes=2'], 2, 'error: --num_processes=2 needs --workdir: every process must '
     'name the same work directory'),
    (['stray'], 2, 'error: unexpected arguments: stray'),
    (['--algorithm=fedavg,scaffold', '--seeds=0,1'], 0,
     'the flags are valid: 4 runs (fedavg, scaffold); the data and the work directory were not '
     'checked'),
], ids=['bad', 'empty_workdir', 'processes_without_workdir', 'stray_argument', 'good'])
@pytest.mark.slow
def test_only_check_args_runs_every_check_of_the_flags_and_nothing_else(tmp_path, extra, code,
                                                                        line):
  """absl's ``--only_check_args`` ("validate args and exit") exited 0 before any of the
  command's own checks; it now runs them, and still writes nothing."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  done = subprocess.run(
      [sys.executable, str(REPO / 'launch' / 'run.py'),
       f'--flagfile={REPO / "launch" / "configs" / "quickstart.flags"}', '--only_check_args',
       *extra], cwd=tmp_path, capture_output=True, text=True,
      timeout=120, check=False)
  out = [l for l in (done.stderr + done.stdout).splitlines() if 'Warning' not in l and
         not l.startswith('  warnings.warn')]
  assert done.returncode == code and out == [line], done.stderr
  assert not list(tmp_path.iterdir())
