"""The benchmarks' FLOP counter against closed forms (its figures go into RESULTS.md)."""
import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), 'benchmarks'))

import common  # pylint: disable=g-import-not-at-top,wrong-import-position


def test_product_flops_counts_products_scans_and_convolutions():
  a, w = jnp.ones((10, 256)), jnp.ones((256, 1024))
  assert common.product_flops(jnp.dot, a, w) == 2 * 10 * 256 * 1024

  def recurrence(h, w):   # 80 steps of [10, 256] x [256, 256], plus elementwise work
    return jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), h, None, length=80)[0]
  h, w2 = jnp.ones((10, 256)), jnp.ones((256, 256))
  assert common.product_flops(recurrence, h, w2) == 80 * 2 * 10 * 256 * 256
  # Reverse mode: each step's product, its input gradient and its kernel gradient.
  grad = jax.grad(lambda w: jnp.sum(recurrence(h, w)))
  assert common.product_flops(grad, w2) == 3 * 80 * 2 * 10 * 256 * 256

  x, k = jnp.ones((4, 12, 12, 3)), jnp.ones((5, 5, 3, 8))   # NHWC, HWIO, VALID: 8 x 8 out
  conv = lambda x, k: jax.lax.conv_general_dilated(x, k, (1, 1), 'VALID',
                                                   dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
  assert common.product_flops(conv, x, k) == 2 * (4 * 8 * 8 * 8) * (5 * 5 * 3)


def test_vs_torch_loop_takes_the_median_over_processes_and_recomputes_its_rates():
  import vs_torch_loop  # pylint: disable=g-import-not-at-top   # imports neither torch nor jax
  base = dict(model='cnn', layers='fedjax_gel', devices=1, chunk=1, lr=0.01, momentum=0.9,
              torch='2.13', cohort=20, tau=8, batch=20, step_product_gflop=0.5,
              max_abs_diff=1e-6, vmap_max_abs_diff=1e-6, fedjax_gel_compile_s=3.0,
              matmul_gflops=200.)
  times = [(0.8, 1.0, 1.4), (1.2, 0.9, 1.5), (0.7, 1.1, 1.3)]   # ours, loop, vmap per process
  rows = [vs_torch_loop.rates(dict(base, fedjax_gel_round_s=o, torch_round_s=t,
                                   torch_vmap_round_s=v)) for o, t, v in times]
  row = vs_torch_loop.across_processes(rows)
  assert (row['fedjax_gel_round_s'], row['torch_round_s'], row['torch_vmap_round_s']) == (
      0.8, 1.0, 1.4)
  assert row['ratio'] == 1.0 / 0.8 and row['vmap_ratio'] == 1.4 / 0.8
  assert row['fedjax_gel_examples_per_s'] == 20 * 8 * 20 / 0.8
  assert row['fedjax_gel_gflops'] == 20 * 8 * 0.5 / 0.8
  assert row['process_ratios'] == [1.0 / 0.8, 0.9 / 1.2, 1.1 / 0.7] and row['processes'] == 3
  table = vs_torch_loop.table([row])
  assert 'medians over 3 fresh processes' in table and '| 1.25, 0.75, 1.57 |' in table


def test_profile_round_reads_gpu_stream_kernels_and_cpu_thunks():
  import types  # pylint: disable=g-import-not-at-top
  import profile_round  # pylint: disable=g-import-not-at-top
  ev = lambda name: types.SimpleNamespace(name=name, duration_ns=1)
  line = lambda name, *events: types.SimpleNamespace(name=name, events=[ev(e) for e in events])
  plane = lambda name, *lines: types.SimpleNamespace(name=name, lines=list(lines))
  host = plane('/host:CPU', line('python', 'train_step'),
               line('tf_XLATfrtCpuClient', 'fusion.1', 'while.3', 'ThunkExecutor::Execute'))
  names = lambda trace: [e.name for e in profile_round.kernel_events(trace)]
  assert names(types.SimpleNamespace(planes=[host])) == ['fusion.1']
  gpu = plane('/device:GPU:0', line('XLA Modules', 'jit_round_fn'), line('XLA Ops', 'fusion.2'),
              line('Stream #13(Compute)', 'loop_add_fusion', 'gemm_fusion_dot'))
  assert names(types.SimpleNamespace(planes=[host, gpu])) == ['loop_add_fusion', 'gemm_fusion_dot']
