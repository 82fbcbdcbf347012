"""Each of ``core.backend.jax_private``'s hooks into JAX's private modules works on the JAX this
runs (``setup.cfg``: from 0.10), and no other module of fedjax_gel reaches into ``jax._src``;
``core`` imports nothing of fedjax_gel outside it."""
import ast
import pathlib
import types

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.random import threefry2x32_p

from fedjax_gel.core.backend import jax_private

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / 'fedjax_gel'


def test_the_installed_jax_is_a_supported_one():
  assert tuple(int(v) for v in jax.__version__.split('.')[:2]) >= (0, 10)


def test_backends_initialized():
  jax.devices()
  assert jax_private.backends_initialized() is True


def test_the_coordination_client_is_none_in_a_process_of_its_own():
  # several processes: tests/experiment/test_processes.py runs them through these hooks
  assert jax_private.distributed_client() is None
  assert jax_private.preemption_sync_manager() is None


def test_the_cache_key_module_keys_devices():
  module = jax_private.cache_key_module()
  assert callable(module._hash_accelerator_config)   # pylint: disable=protected-access


def test_a_swapped_lowering_applies_and_the_old_one_comes_back():
  def zeros(ctx, *args):   # a rule that is visibly not Threefry
    del args
    aval = ctx.avals_out[0]
    zero = jax.interpreters.mlir.ir_constant(np.zeros(aval.shape, np.uint32))
    return [zero, zero]

  hashed = lambda: jax.jit(lambda k, x: threefry2x32_p.bind(k[0], k[1], x[0], x[1]))(
      jnp.ones(2, jnp.uint32), jnp.ones((2, 3), jnp.uint32))
  want = np.asarray(hashed()[0])
  old = jax_private.swap_lowering(threefry2x32_p, jax_private.lowering_entry(zeros), 'cpu')
  try:
    if jax.default_backend() == 'cpu':
      np.testing.assert_array_equal(hashed()[0], 0)
  finally:
    assert jax_private.swap_lowering(threefry2x32_p, old, 'cpu').rule is zeros
  np.testing.assert_array_equal(hashed()[0], want)
  assert not np.all(want == 0)


def imported_modules(path: pathlib.Path):
  """The modules ``path`` imports (``import a.b``, ``from a.b import c``: ``a.b`` and
  ``a.b.c``; relative imports resolved against the file's package), and the ``jax._src`` it
  reaches otherwise (an attribute ``jax._src``, a string naming it for ``importlib``)."""
  package = ['fedjax_gel', *path.parent.relative_to(PACKAGE).parts]
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.Import):
      yield from (a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = package[:len(package) - node.level + 1] if node.level else []
      module = '.'.join(base + ([node.module] if node.module else []))
      yield module
      yield from (f'{module}.{a.name}' for a in node.names)
    elif (isinstance(node, ast.Attribute) and node.attr == '_src' and
          isinstance(node.value, ast.Name) and node.value.id == 'jax'):
      yield 'jax._src'
    elif isinstance(node, ast.Constant) and str(node.value).startswith('jax._src'):
      yield str(node.value)


def test_only_jax_private_reaches_into_jax_src():
  reaching = sorted({str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob('*.py')
                     for m in imported_modules(p) if m.split('.')[:2] == ['jax', '_src']})
  assert reaching == ['core/backend/jax_private.py']


def test_core_imports_nothing_of_fedjax_gel_outside_it():
  outside = {f'{p.relative_to(PACKAGE)}: {m}' for p in (PACKAGE / 'core').rglob('*.py')
             for m in imported_modules(p)
             if m.startswith('fedjax_gel') and not m.startswith('fedjax_gel.core')}
  assert not outside


def test_the_import_checks_see_relative_imports_and_jax_src_by_attribute(tmp_path):
  core = PACKAGE / 'core'
  probe = core / '_probe_imports.py'   # removed below; named so no test collects it
  probe.write_text('from ..experiment import config\nimport jax\nx = jax._src\n'
                   "m = 'jax._src.core'\nfrom . import keys\n")
  try:
    found = set(imported_modules(probe))
  finally:
    probe.unlink()
  assert {'fedjax_gel.experiment', 'fedjax_gel.experiment.config', 'jax._src', 'jax._src.core',
          'fedjax_gel.core.keys'} <= found


def test_the_hooks_degrade_where_jax_has_none_of_them(monkeypatch):
  """A JAX without the private names: the hooks say "not available" and a program compiles
  with JAX's own lowering (nothing swapped)."""
  import jax._src.interpreters  # pylint: disable=g-import-not-at-top
  for package, name in ((jax._src, 'xla_bridge'), (jax._src, 'core'), (jax._src, 'distributed'),
                        (jax._src.interpreters, 'mlir')):
    # what ``from jax._src import name`` finds from now on (JAX's modules keep their own)
    monkeypatch.setattr(package, name, types.SimpleNamespace())
  assert jax_private.backends_initialized() is False and jax_private.under_trace() is None
  assert jax_private.distributed_client() is None
  assert jax_private.preemption_sync_manager() is None
  from fedjax_gel.core.backend import Backend  # pylint: disable=g-import-not-at-top
  double = Backend(compiler_options={}).jit(lambda x: 2 * x)
  np.testing.assert_array_equal(double(jnp.ones(3)), 2.)
  np.testing.assert_array_equal(jax.jit(lambda y: double(y) + 1)(jnp.ones(3)), 3.)
