"""Makes ``tests/helpers.py`` importable from every test directory, and shares its fixtures."""
import os
import shutil
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# One persistent compilation cache for the test session, in a fresh folder: the test processes
# (pytest's workers inherit the variable from the first process) and the commands they start
# compile each program once, and no test sees a program compiled before the session. A cached
# program is the program XLA would compile, so no result depends on it (test_compilation_cache
# checks that, in a folder of its own).
SESSION_CACHE = 'FEDJAX_GEL_TEST_SESSION_CACHE'
if SESSION_CACHE not in os.environ:
  os.environ[SESSION_CACHE] = tempfile.mkdtemp(prefix='fedjax_gel_test_cache_')
os.environ['FEDJAX_GEL_COMPILATION_CACHE'] = os.environ[SESSION_CACHE]
# Generated datasets are cached in the same session folder (``fedjax_gel.data.cache``).
os.environ['FEDJAX_GEL_DATA_CACHE'] = os.path.join(os.environ[SESSION_CACHE], 'data')
# The tests' programs are small, so every one is compiled for compile time, as the experiment
# layer compiles small programs (``core.backend.xla.QUICK_COMPILE``, as XLA flags; jaxlib < 0.11,
# whose XLA has the legacy emitters): the suite takes a quarter less time. Tests that name XLA's
# default emitters (``DEFAULT_EMITTERS`` in ``helpers``) override it per program:
# tests/core/test_compile_options.py and the vmapped-seeds test.
# Small loops are compiled as one kernel, as ``launch/run.py`` has XLA do
# (``core.backend.xla.configure_cpu``, which also presents every core as a device: not here, the
# tests choose their devices).
# LLVM's optimisations are off (XLA's backend optimisation level 0; the suite's choice, not a
# run's): its programs are small and run few steps, so optimising their machine code costs more
# than it saves (the suite takes about a sixth less time; docs/speed.md). XLA's own passes
# (fusion, buffer assignment) are unchanged, but a float result can differ from a run's in its
# last bits, so a test of a bit-identity between two different programs compiles them as runs
# do (``helpers.as_runs_compile``).
# XLA's CPU backend compiles a program's kernels as one LLVM module instead of several in parallel
# (``xla_cpu_parallel_codegen_split_count``): the suite's workers already keep both cores busy,
# and the split costs more processor time than it saves (the same machine code; a run alone on
# idle cores compiles faster split, so runs keep XLA's default).
# XLA's HLO verifier (an invariant check run after its passes: it changes no program) is off,
# about a tenth of a small program's compile time; and, with the jaxlib this was measured on
# (< 0.11, ``xla.LEGACY_EMITTERS``), XLA's CPU preset for compile time, which skips passes
# that spend compile time to buy run time (a run's programs keep XLA's default preset;
# ``helpers.as_runs_compile`` restores it).
from fedjax_gel.core.backend import xla  # pylint: disable=g-import-not-at-top,wrong-import-position

_quick = [f'--{name}={str(value).lower()}' for name, value in xla.QUICK_COMPILE.items()]
_preset = ['--xla_cpu_opt_preset=CPU_OPT_PRESET_FAST_COMPILE'] if xla.LEGACY_EMITTERS else []
for _flag in _quick + _preset + [xla.SMALL_LOOP_FLAG, '--xla_backend_optimization_level=0',
                                 '--xla_cpu_parallel_codegen_split_count=1',
                                 '--xla_disable_hlo_passes=hlo-verifier']:
  if _flag.split('=')[0] not in os.environ.get('XLA_FLAGS', ''):
    os.environ['XLA_FLAGS'] = f"{os.environ.get('XLA_FLAGS', '')} {_flag}".strip()

from fedjax_gel.core.backend import compilation_cache  # pylint: disable=g-import-not-at-top,wrong-import-position

compilation_cache.enable(os.environ[SESSION_CACHE])   # for this process' own compilations too

import helpers  # pylint: disable=g-import-not-at-top,wrong-import-position


def pytest_sessionfinish(session):
  """The first process (not a pytest-xdist worker) removes the session's cache."""
  if not hasattr(session.config, 'workerinput'):
    shutil.rmtree(os.environ[SESSION_CACHE], ignore_errors=True)


@pytest.fixture(scope='session')
def data():
  """``helpers.small_pool()``: 12 small clients and one without data."""
  return helpers.small_pool()


@pytest.fixture(scope='session')
def model():
  """Logistic regression, 4 features, 3 classes."""
  return helpers.small_model()


@pytest.fixture(scope='session')
def loss(model):
  from fedjax_gel import models  # pylint: disable=g-import-not-at-top
  return models.cross_entropy_loss(model)
