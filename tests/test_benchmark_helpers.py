"""The benchmarks' FLOP counter against closed forms (its figures go into RESULTS.md)."""
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

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


def test_profile_round_timeline_splits_a_round_around_its_kernels():
  """Two hand-made rounds (times in ns): the medians of each part, and the kernels' threads."""
  import types  # pylint: disable=g-import-not-at-top
  import profile_round  # pylint: disable=g-import-not-at-top
  ev = lambda name, start, end: types.SimpleNamespace(name=name, start_ns=start,
                                                      duration_ns=end - start)
  line = lambda name, *events: types.SimpleNamespace(name=name, events=list(events))
  whole, call = profile_round.ROUND, 'PjitFunction(jit(round_fn))'
  host = line('python3', ev(whole, 0, 10_000), ev(call, 0, 2_000), ev(call, 100, 1_900),
              ev(whole, 20_000, 26_000), ev(call, 20_000, 21_000))
  client = line('tf_XLAPjRtCpuClient', ev('iota.1', 3_000, 4_000),
                ev('ThunkExecutor::Execute', 2_500, 9_000), ev('fusion.2', 23_000, 24_000))
  pool = line('tf_XLAEigen', ev('call.6', 5_000, 8_000), ev('end: call.6', 8_000, 8_100),
              ev('fusion.3', 24_000, 25_000))
  trace = types.SimpleNamespace(planes=[types.SimpleNamespace(name='/host:CPU',
                                                              lines=[host, client, pool])])
  # round 1: dispatch 2, first kernel at 3, kernels 3-8 (4 us of them), its wait ends at 10;
  # round 2: dispatch 1, first kernel at +3, kernels +3..+5 (2 us), its wait ends at +6
  assert profile_round.timeline(trace) == {
      'dispatch': 1.5, 'to first kernel': 3.0, 'kernels span': 3.5, 'kernels': 3.0,
      'after last kernel': 1.5, 'thread changes': 1.0}


@pytest.mark.slow
def test_a_population_above_leafs_holds_a_copy_of_each_clients_rows():
  """Client ``j`` of a larger population reads LEAF client ``j mod 1000``'s rows from a copy
  of its own: the tiled ranges overlapped, which pools no longer take (``check_pool``), and
  ``--population`` above 1,000 failed."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  split, data, *_ = common.synthetic_workload(population=2_500)
  base = split.train
  counts, offsets = np.asarray(data.counts), np.asarray(data.offsets)
  assert len(counts) == 2_500 and (counts == np.tile(np.asarray(base.counts), 3)[:2_500]).all()
  assert (offsets[1:] >= offsets[:-1] + counts[:-1]).all()   # no client reads another's rows
  x, x0 = np.asarray(data.examples['x']), np.asarray(base.examples['x'])
  for j in (0, 999, 1_000, 2_499):
    o, n, o0 = offsets[j], counts[j], int(base.offsets[j % 1_000])
    np.testing.assert_array_equal(x[o:o + n], x0[o0:o0 + n])


def test_json_flag_makes_its_folder_before_the_measurements_or_exits_in_one_line(tmp_path):
  import argparse  # pylint: disable=g-import-not-at-top
  path = tmp_path / 'new' / 'rows.json'
  assert common.json_flag(argparse.ArgumentParser(), str(path)) == str(path)
  assert path.parent.is_dir() and not path.exists()
  (tmp_path / 'file').write_text('')
  with pytest.raises(SystemExit) as e:
    common.json_flag(argparse.ArgumentParser(), str(tmp_path / 'file' / 'rows.json'))
  assert e.value.code == 2


def test_profile_round_names_the_shape_of_a_kernel_that_writes_a_tuple():
  import profile_round  # pylint: disable=g-import-not-at-top
  hlo = '\n  %call.6 = (s32[], f32[20,60]{1,0}) call(%p), to_apply=%body\n  %sort.8 = s32[20,65]{1,0} sort('
  assert profile_round.output_shape(hlo, 'call.6') == '(s32[], f32[20,60])'
  assert profile_round.output_shape(hlo, 'sort.8') == 's32[20,65]'


def test_flag_checks_name_the_first_bad_flag_and_its_value(capsys):
  import argparse  # pylint: disable=g-import-not-at-top
  p = argparse.ArgumentParser()
  common.at_least(p, 1, cohorts=[20, 200], repeats=3)   # nothing to say
  assert common.budget_range(p, '4,13') == (4, 13)
  for call, line in [
      (lambda: common.at_least(p, 1, cohorts=[20, 0], repeats=0), '--cohorts must be positive (got 0)'),
      (lambda: common.at_least(p, 0, chunk_size=-2), '--chunk_size must be >= 0 (got -2)'),
      (lambda: common.budget_range(p, '13,4'), "--budget_range must be a,b with 1 <= a <= b (got '13,4')"),
      (lambda: common.budget_range(p, '0,4'), "--budget_range must be a,b with 1 <= a <= b (got '0,4')"),
      (lambda: common.budget_range(p, '4'), "--budget_range must be a,b with 1 <= a <= b (got '4')"),
      (lambda: common.budget_range(p, '4,x'), "--budget_range must be comma-separated integers (got '4,x')")]:
    with pytest.raises(SystemExit) as e:
      call()
    assert e.value.code == 2 and capsys.readouterr().err == f'error: {line}\n'


@pytest.mark.parametrize('wait_each', [True, False])
def test_chained_rounds_feeds_each_rounds_output_to_the_next(wait_each):
  calls = []

  def step(carry, r):
    calls.append(r)
    return carry * 2 + r

  carry, seconds = common.chained_rounds(step, jnp.float32(1), 4, wait_each)
  assert calls == [1, 2, 3, 4]
  assert float(carry) == ((((1 * 2 + 1) * 2 + 2) * 2 + 3) * 2 + 4)
  assert len(seconds) == (4 if wait_each else 1) and all(s > 0 for s in seconds)


def test_end_to_end_differences_two_round_counts_and_compares_only_what_was_measured():
  import end_to_end  # pylint: disable=g-import-not-at-top   # imports no jax at import time
  # Medians 10.0 s at 50 rounds and 13.0 s at 200: 3 s over 150 rounds, 20 ms a round.
  assert end_to_end.per_round(50, [10.0, 9.0, 11.5], 200, [13.0, 14.0, 12.0]) == pytest.approx(
      0.02)
  assert end_to_end.ratios(0.021, 0.020, 1.05) == {'loop_overhead': pytest.approx(0.05),
                                                   'speedup': pytest.approx(50.)}
  assert end_to_end.ratios(0.021, None, None) == {'loop_overhead': None, 'speedup': None}
  ours = dict(cohort=1000, rounds=[50, 200], repeats=3, devices=2, chunk=32,
              process_s={'50': 10.0, '200': 13.0}, loop_round_s=0.02, train_phase_round_s=0.019,
              compiled_round_s=0.019, fedjax_round_s=1.0, **end_to_end.ratios(0.02, 0.019, 1.0))
  theirs = dict(cohort=20, fedjax_round_s=0.016, **end_to_end.ratios(None, None, 0.016))
  table = end_to_end.table([theirs, ours])
  assert '| 20 | - | - | - | - | - | - | - | 16.0 | - |' in table
  assert '| 1,000 | 2 | 32 | 10.00 / 13.00 | 20.00 | 19.00 | 19.00 | +5.3% | 1000.0 | 50x |' in table


def test_timed_processes_times_the_commands_and_exits_with_a_failures_output():
  assert common.timed_processes([[sys.executable, '-c', 'pass']] * 2, 'nothing') > 0
  with pytest.raises(SystemExit) as e:
    common.timed_processes([[sys.executable, '-c', 'import sys; sys.exit("broken")']], 'this')
  assert e.value.code == 'this failed:\nbroken\n'


@pytest.mark.parametrize('paper, low, high, said', [
    (0.188, 0.207, 0.575, 'not reproduced'),   # FEMNIST FedAvgCM -> GeL: the paper's below
    (0.226, 0.009, 0.702, 'inconclusive'),     # Shakespeare: inside, but 0.35 wide a side
    (0.145, -0.040, 0.561, 'inconclusive'),    # FEMNIST FedNova: inside, and 0 inside too
    (0.289, 0.254, 0.501, 'reproduced'),       # inside, above 0, half-width 0.12 <= 0.145
    (0.289, 0.200, 0.500, 'inconclusive'),     # half-width 0.15 > 0.1445
    (-0.095, -0.111, -0.060, 'reproduced'),    # a slowdown: the sign is the paper's too
    (148, 141.6, 153.2, 'reproduced'),         # rounds: the effect is the paper's rounds
    (0.188, float('nan'), float('nan'), 'inconclusive'),   # one seed: no interval
    (0.188, float('-inf'), float('inf'), 'inconclusive'),  # Fieller's unbounded interval
])
def test_a_verdict_is_three_valued_by_the_rule_stated_before_the_runs(paper, low, high, said):
  import reproduction  # pylint: disable=g-import-not-at-top
  assert reproduction.verdict(paper, low, high) == said


def test_verdict_lines_list_every_verdict_and_the_rows_not_attempted():
  import reproduction  # pylint: disable=g-import-not-at-top
  verdicts = reproduction.no_verdicts()
  verdicts[reproduction.INCONCLUSIVE].append('row a')
  text = '\n'.join(reproduction.verdict_lines(verdicts, ['Table 2 on Shakespeare']))
  assert text.startswith(reproduction.RULE)
  for v in ('Reproduced:\n\n- none', 'Not reproduced:\n\n- none', 'Inconclusive:\n\n- row a',
            'Not attempted (the paper has them; no command here ran them yet):\n\n'
            '- Table 2 on Shakespeare'):
    assert v in text


def test_a_run_of_seeds_is_one_command_per_seed_shown_as_one_line():
  import reproduction  # pylint: disable=g-import-not-at-top
  run = reproduction.Run('table1', ['--flagfile=f.flags'], (0, 1, 2))
  assert run.commands() == [(f'table1/seed{s}', ['--flagfile=f.flags', f'--seeds={s}',
                                                  '--noplots']) for s in (0, 1, 2)]
  assert run.shown('out', False) == ('python launch/run.py --flagfile=f.flags --seeds=S '
                                     '--noplots --workdir=out/table1/seedS   # for S in 0-2')
  assert reproduction.Run('pilot', ['--a']).commands() == [('pilot', ['--a'])]
  assert reproduction.seed_text([3, 5]) == '3,5' and reproduction.seed_text([0, 1]) == '0,1'


def records_of(accuracies: dict) -> list[dict]:
  return [{'round': r, 'test_accuracy': a} for r, a in accuracies.items()]


def write_run(root, alg: str, seed: int, summary: dict, records: list[dict]) -> None:
  """A finished seed of one algorithm as a reproduction commits it: ``root/row/seed<S>/<alg>``
  with its summary and records, beside the seed's report."""
  import json  # pylint: disable=g-import-not-at-top
  run = root / 'row' / f'seed{seed}' / alg
  run.mkdir(parents=True)
  (run / 'summary.json').write_text(json.dumps({'seed': seed, 'algorithm': alg, **summary}))
  (run / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))
  (run.parent / 'report.md').write_text('finished')


def test_rounds_at_a_target_are_exact_only_where_the_round_before_was_evaluated():
  import reproduction  # pylint: disable=g-import-not-at-top
  records = records_of({0: 0.1, 5: 0.6, 6: 0.7, 7: 0.8, 10: 0.9})
  assert reproduction.rounds_at(records, 0.65) == (6, True)
  assert reproduction.rounds_at(records, 0.5) == (5, False)    # round 4 was not evaluated
  assert reproduction.rounds_at(records, 0.85) == (10, False)
  assert reproduction.rounds_at(records, 0.05) == (0, True)
  assert reproduction.rounds_at(records, 0.95) == (None, True)


def test_speedups_across_targets_pair_seeds_and_flag_inexact_rounds(tmp_path, monkeypatch):
  import json  # pylint: disable=g-import-not-at-top
  import reproduction  # pylint: disable=g-import-not-at-top
  curves = {  # (algorithm, seed) -> every round's test accuracy
      ('a', 0): [0.1, 0.5, 0.6, 0.7, 0.8], ('b', 0): [0.1, 0.6, 0.7, 0.8, 0.9],
      ('a', 1): [0.1, 0.4, 0.6, 0.6, 0.7], ('b', 1): [0.1, 0.6, 0.6, 0.7, 0.8],
      ('a', 2): [0.1, 0.5, 0.5, 0.7, 0.7], ('b', 2): [0.1, 0.6, 0.65, 0.7, 0.9]}
  for (alg, seed), accs in curves.items():
    rows = records_of(dict(enumerate(accs)))
    if (alg, seed) == ('b', 2):
      rows = [r for r in rows if r['round'] != 2]   # round 3's 0.7 is then not exact
    write_run(tmp_path, alg, seed, {}, rows)
  unfinished = tmp_path / 'row' / 'seed3' / 'a'   # a seed still running: left out
  unfinished.mkdir(parents=True)
  (unfinished / 'summary.json').write_text(json.dumps({'seed': 3, 'algorithm': 'a'}))
  monkeypatch.setattr(reproduction, 'REPO', str(tmp_path))
  reproduction._read.cache_clear()
  pair = (('row', 'a'), ('row', 'b'))
  found = reproduction.across_targets('.', [pair], [0.6, 0.7, 0.85])
  # 60%: a at 2, 2, 3 and b at 1, 1, 1 (all exact): mean 7/3 over 1
  s, low, high, both, seeds, exact = found[pair, 0.6]
  assert (both, seeds, exact) == (3, 3, True) and s == pytest.approx(7 / 3 - 1)
  assert low < s < high
  # 70%: b's seed 2 reaches it at round 3, round 2 not evaluated
  assert found[pair, 0.7][3:] == (3, 3, False)
  # 85%: only b reaches it (seeds 0 and 2): no pair, no interval
  s, low, high, both, seeds, exact = found[pair, 0.85]
  assert both == 0 and np.isnan(low)
  reproduction._read.cache_clear()


def test_accuracy_beyond_target_counts_the_seeds_evaluated_at_the_baselines_round(
    tmp_path, monkeypatch):
  """The speedup table's last column averages the compared run's accuracy past the target at
  the round the baseline reaches it, over the seeds evaluated at that round, and says how many
  of the paired seeds those are."""
  import reproduction  # pylint: disable=g-import-not-at-top
  curves = {  # (algorithm, seed) -> {round: test accuracy}; 'a' reaches 0.6 at round 2 or 3
      ('a', 0): {0: 0.1, 1: 0.5, 2: 0.6}, ('b', 0): {0: 0.1, 1: 0.6, 2: 0.64},
      ('a', 1): {0: 0.1, 2: 0.5, 3: 0.6}, ('b', 1): {0: 0.1, 1: 0.6, 3: 0.7},
      ('a', 2): {0: 0.1, 2: 0.5, 3: 0.6}, ('b', 2): {0: 0.1, 1: 0.6, 5: 0.9}}  # no round 3
  for (alg, seed), accs in curves.items():
    reached = min(r for r, a in accs.items() if a >= 0.6)
    write_run(tmp_path, alg, seed, {'rounds_to_target': reached}, records_of(accs))
  monkeypatch.setattr(reproduction, 'REPO', str(tmp_path))
  reproduction._read.cache_clear()
  lines = reproduction.speedup_table('.', [(('row', 'a'), ('row', 'b'))], {}, 0.6,
                                     reproduction.no_verdicts())
  reproduction._read.cache_clear()
  cells = [c.strip() for c in lines[-1].strip('|').split('|')]
  # seeds 0 and 1: +4 and +10 points; seed 2 has no evaluation at round 3
  assert cells[-1].startswith('7.00 +- ') and cells[-1].endswith('(2/3 seeds)'), cells
  assert cells[2].endswith('3/3 seeds)'), cells


def test_commit_finished_commits_its_paths_and_nothing_else(tmp_path, monkeypatch):
  import subprocess  # pylint: disable=g-import-not-at-top
  import reproduction  # pylint: disable=g-import-not-at-top
  git = lambda *a: subprocess.run(['git', '-c', 'user.name=t', '-c', 'user.email=t@t', *a],
                                  cwd=tmp_path, capture_output=True, text=True, check=True).stdout
  git('init', '-q')
  (tmp_path / 'other.txt').write_text('a')
  git('add', 'other.txt')
  git('commit', '-qm', 'first')
  (tmp_path / 'other.txt').write_text('b')   # the user's own change, staged: not committed
  git('add', 'other.txt')
  (tmp_path / 'out' / 'seed0').mkdir(parents=True)
  (tmp_path / 'out' / 'seed0' / 'summary.json').write_text('{}')
  monkeypatch.setenv('GIT_AUTHOR_NAME', 't')
  monkeypatch.setenv('GIT_AUTHOR_EMAIL', 't@t')
  monkeypatch.setenv('GIT_COMMITTER_NAME', 't')
  monkeypatch.setenv('GIT_COMMITTER_EMAIL', 't@t')
  monkeypatch.setattr(reproduction, 'REPO', str(tmp_path))
  reproduction.commit_finished(['out/seed0', 'out/plots'], 'Add out seed0')
  assert git('log', '--format=%s') == 'Add out seed0\nfirst\n'
  assert git('show', '--name-only', '--format=', 'HEAD') == 'out/seed0/summary.json\n'
  assert git('diff', '--cached', '--name-only') == 'other.txt\n'
  reproduction.commit_finished(['out/seed0'], 'Add it again')   # nothing new: no commit
  assert git('log', '--format=%s').count('\n') == 2


def test_a_table_is_written_into_every_page_that_holds_its_block(tmp_path, monkeypatch):
  """README.md holds the headline table, docs/results.md every table: a reproduction writes its
  block wherever its marker is, and leaves the other pages and blocks as they were."""
  import reproduction  # pylint: disable=g-import-not-at-top
  block = lambda name, *lines: [f'<!-- {name} -->', *lines, f'<!-- /{name} -->']
  readme = '\n'.join(['# title', *block('a', 'old a'), 'after', ''])
  results = '\n'.join(['# results', *block('b', 'old b'), 'text', *block('a', 'old a'), ''])
  (tmp_path / 'docs').mkdir()
  (tmp_path / 'out').mkdir()
  (tmp_path / 'README.md').write_text(readme)
  (tmp_path / 'docs' / 'results.md').write_text(results)
  (tmp_path / 'docs' / 'speed.md').write_text('# speed\n<!-- a --> in a line is no marker\n')
  monkeypatch.setattr(reproduction, 'REPO', str(tmp_path))
  assert reproduction.block_pages('a') == ['README.md', 'docs/results.md']
  assert reproduction.block_pages('b') == ['docs/results.md']
  with pytest.raises(ValueError, match='<!-- c -->'):
    reproduction.block_pages('c')
  summary = lambda out, commands, minutes: 'its README\n'
  reproduction.reproduce('out', [], summary, False, report_only=True,
                         table=('b', lambda out: ['| new b |']))
  assert (tmp_path / 'README.md').read_text() == readme
  assert (tmp_path / 'docs' / 'results.md').read_text() == results.replace('old b', '| new b |')
  assert (tmp_path / 'out' / 'README.md').read_text() == 'its README\n'
  reproduction.reproduce('out', [], summary, False, report_only=True,
                         table=('a', lambda out: ['new a', 'in two lines']))
  assert (tmp_path / 'README.md').read_text() == readme.replace('old a', 'new a\nin two lines')
  assert (tmp_path / 'docs' / 'results.md').read_text() == results.replace(
      'old b', '| new b |').replace('old a', 'new a\nin two lines')


def test_commands_run_run_after_run_or_seed_after_seed():
  import reproduction  # pylint: disable=g-import-not-at-top
  runs = [reproduction.Run('a', ['--x'], (0, 1, 2)), reproduction.Run('b', ['--y'], (0, 1)),
          reproduction.Run('c', ['--z'])]
  names = lambda by_seed: [n for n, _ in reproduction.in_order(runs, by_seed)]
  assert names(False) == ['a/seed0', 'a/seed1', 'a/seed2', 'b/seed0', 'b/seed1', 'c']
  assert names(True) == ['a/seed0', 'b/seed0', 'c', 'a/seed1', 'b/seed1', 'a/seed2']
  assert dict(reproduction.in_order(runs, True))['b/seed1'] == ['--y', '--seeds=1', '--noplots']
