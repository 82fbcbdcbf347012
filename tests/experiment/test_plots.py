"""The plots' data by hand, and the files written."""
import importlib.util
import pathlib

import numpy as np
import pytest

from fedjax_gel.experiment import plots


def run(alg, seed, lr, accs, up_mib):
  records = [{'round': 5 * i, 'test_accuracy': a, 'grad_computations': 10 * i,
              'bytes_up': int(u * 2 ** 20), 'train_loss': 2 * (1 - a)}
             for i, (a, u) in enumerate(zip(accs, up_mib))]
  return {'algorithm': alg, 'seed': seed, 'client_lr': lr, 'best_accuracy': max(accs)}, records


def test_curves_average_accuracy_gradients_and_upload_over_seeds():
  c = plots.curves([run('a', 0, 0.1, [0.1, 0.5], [0, 2]), run('a', 1, 0.1, [0.3, 0.7], [0, 4])])
  rounds, mean, _, grads, mib, loss, _, epsilon = c['a']
  assert np.isnan(epsilon).all()   # no differential privacy
  np.testing.assert_allclose(rounds, [0, 5])
  np.testing.assert_allclose(mean, [0.2, 0.6])
  np.testing.assert_allclose(grads, [0, 10])
  np.testing.assert_allclose(mib, [0, 3])
  np.testing.assert_allclose(loss, [1.6, 0.8])   # 2 (1 - mean accuracy), by hand


@pytest.mark.skipif(importlib.util.find_spec('matplotlib') is None, reason='needs matplotlib')
def test_lr_heatmap_and_metric_plots_are_written(tmp_path):
  results = [run('fedavg', 0, 0.1, [0.1, 0.5], [0, 2]), run('fedavg', 0, 0.3, [0.1, 0.6], [0, 2]),
             run('fedgbo_sgdm', 0, 0.1, [0.1, 0.7], [0, 4])]   # no 0.3 cell: left grey
  assert plots.lr_heatmap(results, str(tmp_path / 'lr.png')) == str(tmp_path / 'lr.png')
  paths = plots.metric_plots(results[:1] + results[2:], str(tmp_path / 'plots'), 0.5)
  names = ['accuracy_gradients.png', 'accuracy_rounds.png', 'accuracy_upload.png',
           'train_loss_rounds.png']
  assert sorted(p.rsplit('/', 1)[1] for p in paths) == names
  assert all((tmp_path / 'plots' / name).stat().st_size > 0 for name in names)


@pytest.mark.skipif(importlib.util.find_spec('matplotlib') is None, reason='needs matplotlib')
@pytest.mark.slow
def test_a_private_run_gets_accuracy_against_epsilon(tmp_path):
  results = [run('dp_fedavg', s, 0.1, [0.1, 0.5, 0.6], [0, 2, 4]) for s in (0, 1)]
  for _, records in results:
    for r, eps in zip(records, [0., 1.5, 2.5]):
      r['dp_epsilon'] = eps
  np.testing.assert_allclose(plots.curves(results)['dp_fedavg'][7], [0., 1.5, 2.5])
  paths = plots.metric_plots(results, str(tmp_path / 'plots'))
  assert str(tmp_path / 'plots' / 'accuracy_epsilon.png') in paths and len(paths) == 5
  for _, records in results:   # no noise: the epsilon is infinite, null in the records
    for r in records[1:]:
      r['dp_epsilon'] = None
  assert np.isnan(plots.curves(results)['dp_fedavg'][7][1:]).all()
  paths = plots.metric_plots(results, str(tmp_path / 'clip_only'))
  assert len(paths) == 4 and not (tmp_path / 'clip_only' / 'accuracy_epsilon.png').exists()


@pytest.mark.skipif(importlib.util.find_spec('matplotlib') is None, reason='needs matplotlib')
@pytest.mark.slow
def test_each_plot_is_drawn_once_and_laid_out_as_tight_layout_lays_it_out(tmp_path, monkeypatch):
  """``savefig`` drew a figure twice after ``tight_layout`` (its placeholder layout engine):
  now once, to the same bytes as a figure laid out by ``tight_layout`` and saved as it was."""
  import matplotlib.figure  # pylint: disable=g-import-not-at-top
  draws, draw = [], matplotlib.figure.Figure.draw
  monkeypatch.setattr(matplotlib.figure.Figure, 'draw',
                      lambda fig, renderer: draws.append(1) or draw(fig, renderer))
  results = [run('fedavg', 0, 0.1, [0.1, 0.5], [0, 2]), run('gel', 0, 0.1, [0.2, 0.7], [0, 2])]
  paths = plots.metric_plots(results, str(tmp_path / 'plots'), 0.5)
  assert len(paths) == 4 and len(draws) == 4
  monkeypatch.setattr(plots, 'save', lambda fig, path: (fig.tight_layout(),
                                                         fig.savefig(path, format='png',
                                                                     dpi=110)))
  twice = plots.metric_plots(results, str(tmp_path / 'twice'), 0.5)
  for once, before in zip(paths, twice):
    assert pathlib.Path(once).read_bytes() == pathlib.Path(before).read_bytes()


@pytest.mark.skipif(importlib.util.find_spec('matplotlib') is None, reason='needs matplotlib')
def test_a_loss_written_as_null_is_a_gap_not_an_error(tmp_path):
  """A record whose loss was not finite (JSON null) leaves a gap in the curves and plots."""
  summary, records = run('fedavg', 0, 0.1, [0.1, 0.5, 0.6], [0, 2, 4])
  records[1]['train_loss'] = None
  loss = plots.curves([(summary, records)])['fedavg'][5]
  np.testing.assert_allclose(loss, [1.8, np.nan, 0.8])
  assert len(plots.metric_plots([(summary, records)], str(tmp_path))) == 4


def test_the_lr_heat_map_leaves_diverged_runs_out_as_the_selection_does(tmp_path):
  """Diverged runs were shown as ordinary values (their last finite evaluation)."""
  diverged = lambda r: ({**r[0], 'status': 'diverged'}, r[1])
  results = [run('a', 0, 0.1, [0.1, 0.5], [0, 2]), diverged(run('a', 1, 0.1, [0.1, 0.9], [0, 2])),
             diverged(run('a', 0, 0.3, [0.2, 0.2], [0, 2]))]
  names, lrs, acc, every = plots.lr_grid_values(results)
  assert names == ['a'] and lrs == [0.1, 0.3]
  np.testing.assert_allclose(acc[0, 0], 0.5)   # seed 1's 0.9 was its diverged run's
  assert np.isnan(acc[0, 1])
  assert every == [[False, True]]
  if importlib.util.find_spec('matplotlib') is not None:
    assert plots.lr_heatmap(results, str(tmp_path / 'lr.png')) == str(tmp_path / 'lr.png')


@pytest.mark.skipif(importlib.util.find_spec('matplotlib') is None, reason='needs matplotlib')
def test_accuracy_bands_stay_within_zero_and_one(tmp_path, monkeypatch):
  """Two seeds' 95% t interval (12.7 standard errors) reached below 0 and above 1 accuracy."""
  import matplotlib.axes  # pylint: disable=g-import-not-at-top
  drawn = []
  real = matplotlib.axes.Axes.fill_between
  monkeypatch.setattr(matplotlib.axes.Axes, 'fill_between',
                      lambda self, x, low, high, **kw: drawn.append((low, high))
                      or real(self, x, low, high, **kw))
  plots.metric_plots([run('a', 0, 0.1, [0.02, 0.98], [0, 2]), run('a', 1, 0.1, [0.1, 0.9], [0, 2])],
                     str(tmp_path))
  accuracy = drawn[:3]   # against rounds, gradients, upload; then the training loss
  assert len(drawn) == 4 and all(l.min() >= 0 and h.max() <= 1 for l, h in accuracy)
  assert any(l.min() == 0 and h.max() == 1 for l, h in accuracy)   # clipped, not shrunk


def test_a_grids_plots_name_each_algorithms_chosen_rate_not_every_rate_as_its_setting():
  """The title of a learning-rate grid's curves listed every rate tried, where each curve is
  one algorithm's chosen rate, which no label said."""
  from fedjax_gel.experiment import config, outputs  # pylint: disable=g-import-not-at-top
  results = [run('fedavg', 0, 0.1, [0.1, 0.5], [0, 2]), run('fedavg', 0, 0.3, [0.1, 0.6], [0, 2]),
             run('fedgbo', 0, 0.1, [0.1, 0.7], [0, 4]), run('fedgbo', 0, 0.3, [0.1, 0.2], [0, 4])]
  assert outputs.chosen_labels(results, 'client_lr') == {'fedavg': 'fedavg (lr 0.3)',
                                                         'fedgbo': 'fedgbo (lr 0.1)'}
  assert outputs.chosen_labels(results, None) == {}
  configs = [config.make(client_lr=lr) for lr in (0.1, 0.3)]
  assert 'client lr the best of 0.1/0.3 (legend)' in outputs.plot_setting(configs, 'client_lr')
  assert 'client lr 0.1/0.3, server lr 1' in outputs.plot_setting(configs)
