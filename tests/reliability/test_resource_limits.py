"""The memory a process may use, less than the host's: an address-space limit (``ulimit -v``)
and a cgroup's limit (v1 and v2, from faked ``/proc/self/cgroup`` and cgroup files), which the
planner's guard reads (``core.memory.usable_bytes``); a run whose per-client store does not fit
under a real ``ulimit -v`` is refused with one line before anything is written, and XLA's own
RESOURCE_EXHAUSTED, wherever it is raised, is one line too."""
from __future__ import annotations

import os
import resource
import subprocess
import sys

import jax
import pytest

import helpers
from fedjax_gel.core import memory
from fedjax_gel.experiment import api, cli, planning

GIB = 1 << 30


def cgroup(tmp_path, line: str, limits: dict):
  """A faked ``/proc/self/cgroup`` holding ``line`` and a cgroup mount with ``limits``
  (``{file under the mount: its text}``); returns ``cgroup_bytes``' arguments."""
  (tmp_path / 'cgroup').write_text(line + '\n')
  for name, text in limits.items():
    (tmp_path / 'fs' / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / 'fs' / name).write_text(text + '\n')
  return str(tmp_path / 'cgroup'), str(tmp_path / 'fs')


def test_cgroup_v2_is_the_least_memory_max_of_the_group_and_those_above(tmp_path):
  files = cgroup(tmp_path, '0::/user.slice/job', {'user.slice/job/memory.max': str(4 * GIB),
                                                 'user.slice/memory.max': str(3 * GIB)})
  assert memory.cgroup_bytes(*files) == 3 * GIB


def test_cgroup_v2_without_a_limit_is_none(tmp_path):
  files = cgroup(tmp_path, '0::/job', {'job/memory.max': 'max', 'memory.max': 'max'})
  assert memory.cgroup_bytes(*files) is None
  assert memory.cgroup_bytes(str(tmp_path / 'none'), str(tmp_path / 'fs')) is None


def test_cgroup_v1_reads_the_memory_controllers_limit(tmp_path):
  unlimited = '9223372036854771712'   # what v1 reads without a limit
  files = cgroup(tmp_path, '4:memory:/process_api/x\n3:cpu,cpuacct:/elsewhere',
                 {'memory/process_api/x/memory.limit_in_bytes': unlimited,
                  'memory/process_api/memory.limit_in_bytes': str(2 * GIB),
                  'cpu/elsewhere/memory.limit_in_bytes': '1'})
  assert memory.cgroup_bytes(*files) == 2 * GIB


def test_a_container_that_mounts_its_own_group_as_the_root_reads_the_root(tmp_path):
  files = cgroup(tmp_path, '0::/docker/abc', {'memory.max': str(GIB)})   # /docker/abc not there
  assert memory.cgroup_bytes(*files) == GIB


def test_the_address_space_left_is_the_limit_less_the_peak_and_the_margin(tmp_path, monkeypatch):
  status = tmp_path / 'status'
  status.write_text(f'Name:\tpython\nVmPeak:\t{3 * GIB // 2 // 1024} kB\nVmSize:\t1 kB\n')
  monkeypatch.setattr(memory.resource, 'getrlimit',
                      lambda kind: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
  assert memory.address_space_bytes(str(status)) is None
  monkeypatch.setattr(memory.resource, 'getrlimit',
                      lambda kind: (8 * GIB, resource.RLIM_INFINITY))
  left = 8 * GIB - 3 * GIB // 2 - memory.ADDRESS_SPACE_MARGIN
  assert memory.address_space_bytes(str(status)) == left
  monkeypatch.setattr(memory.resource, 'getrlimit', lambda kind: (GIB, GIB))
  assert memory.address_space_bytes(str(status)) == 0


def test_the_planner_plans_with_the_least_of_the_limits(monkeypatch):
  monkeypatch.setattr(memory, 'host_bytes', lambda: 16 * GIB)
  monkeypatch.setattr(memory, 'address_space_bytes', lambda: None)
  monkeypatch.setattr(memory, 'cgroup_bytes', lambda: 6 * GIB)
  assert memory.usable_bytes() == 6 * GIB
  monkeypatch.setattr(memory, 'address_space_bytes', lambda: 5 * GIB)
  assert memory.usable_bytes() == 5 * GIB
  if jax.default_backend() == 'cpu':
    assert planning.memory_limit() == 5 * GIB
  assert planning.memory_limit(2.) == 2 * GIB   # --device_memory_gb as given


def bare_peak() -> int:
  """The peak address space of a bare process that started JAX as ``launch/run.py`` does."""
  script = ('from fedjax_gel.core.backend import xla; xla.configure_cpu(); import jax; '
            'jax.devices(); print(open("/proc/self/status").read())')
  out = subprocess.run([sys.executable, '-c', script], cwd=helpers.REPO, capture_output=True,
                       text=True, check=True).stdout
  return next(int(x.split()[1]) * 1024 for x in out.splitlines() if x.startswith('VmPeak:'))


def run_limited(limit: int, *args):
  """``launch/run.py args`` in a process whose address space is limited to ``limit`` bytes."""
  script = ('import os, resource, sys; resource.setrlimit(resource.RLIMIT_AS, ({0}, '
            'resource.getrlimit(resource.RLIMIT_AS)[1])); os.execv(sys.executable, '
            '[sys.executable, "launch/run.py", *sys.argv[1:]])').format(limit)
  return subprocess.run([sys.executable, '-c', script, *args], cwd=helpers.REPO,
                        capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(not os.path.exists('/proc/self/status'), reason='reads VmPeak')
@pytest.mark.slow
def test_a_store_larger_than_ulimit_v_allows_is_refused_and_a_small_run_runs(tmp_path):
  """SCAFFOLD keeps a FEMNIST CNN (6.6 M parameters) for each of the subset's 105 clients:
  2.8 GiB, which passed the guard (the host's memory) and ended in XLA's RESOURCE_EXHAUSTED
  traceback under a limit of 3.5 GiB above what a bare process takes, after writing the run's
  first files. The planner sees about 2 GiB left and refuses it; a small run runs."""
  limit = bare_peak() + 7 * GIB // 2
  workdir = tmp_path / 'store'
  helpers.assert_one_line_error(
      run_limited(limit, '--dataset=leaf', '--data_path=subset:femnist_niid_05',
                  '--model=femnist_cnn', '--algorithm=scaffold', '--num_rounds=1',
                  '--clients_per_round=2', '--batch_size=5', '--budget_range=1,1', '--noplots',
                  f'--workdir={workdir}'),
      '--algorithm=scaffold keeps 26414840 bytes of state for each of 105 clients')
  assert not workdir.exists()
  proc = run_limited(limit, '--flagfile=launch/configs/quickstart.flags', '--algorithm=fedavgcm',
                     '--num_rounds=2', '--noplots', f'--workdir={tmp_path / "small"}')
  assert proc.returncode == 0, proc.stderr


def exhausted(*args, **kwargs):
  raise jax.errors.JaxRuntimeError('RESOURCE_EXHAUSTED: Out of memory allocating 2697461760 '
                                   'bytes.\nmore of XLA')


def test_xlas_resource_exhausted_is_one_line_saying_what_to_lower(tmp_path, monkeypatch):
  monkeypatch.setattr(api, 'train_all', exhausted)   # wherever in the run
  helpers.assert_one_line_error(
      helpers.cli_run('--flagfile=launch/configs/quickstart.flags', '--num_rounds=1',
                      f'--workdir={tmp_path / "run"}'),
      'XLA ran out of memory (RESOURCE_EXHAUSTED: Out of memory allocating 2697461760 bytes.)',
      '--chunk_size', '--device_memory_gb', '--clients_per_round')


def test_other_errors_are_not_taken_for_xlas_out_of_memory(tmp_path, monkeypatch):
  assert cli.out_of_memory(ValueError('RESOURCE_EXHAUSTED: a file')) is None
  assert cli.out_of_memory(jax.errors.JaxRuntimeError('INTERNAL: RESOURCE_EXHAUSTED')) is None

  def internal(*args, **kwargs):
    raise jax.errors.JaxRuntimeError('INTERNAL: something else')
  monkeypatch.setattr(api, 'train_all', internal)   # goes on to the clauses after it
  with pytest.raises(jax.errors.JaxRuntimeError, match='INTERNAL'):
    helpers.cli_run('--flagfile=launch/configs/quickstart.flags', '--num_rounds=1',
                    f'--workdir={tmp_path / "run"}')
