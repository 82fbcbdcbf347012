"""The watchdog's rules, on hand-made cases: the stall limit, and the other processes' beats
(a fake key-value store). Whole runs: test_long_runs.py and tests/reliability."""
from __future__ import annotations

import json
import types

import pytest

from fedjax_gel.experiment import watchdog


@pytest.mark.parametrize('timeout, gaps, longest, limit', [
    (5., [1.], 100., 5.),                 # given: as it is
    (0., [], 0., watchdog.MIN_STALL_S),   # nothing measured yet
    (0., [0.01] * 9, 0.02, 60.),          # fast rounds: the floor
    (0., [4., 5., 6.], 6., 100.),         # slow rounds: 20 median rounds
    (0., [0.01] * 9, 50., 150.),          # an evaluation of 50 s: 3 times the longest gap
])
def test_stall_limit(timeout, gaps, longest, limit):
  assert watchdog.stall_limit(timeout, gaps, longest) == pytest.approx(limit)


def test_peer_timeout_is_half_the_heartbeat_at_most():
  assert watchdog.peer_timeout(100) == watchdog.PEER_TIMEOUT_S
  assert watchdog.peer_timeout(20) == 10
  assert watchdog.peer_timeout(1) == 2 * watchdog.BEAT_S


class FakeStore:
  """The coordination service's key-value store, as ``Peers`` uses it."""

  def __init__(self):
    self.values = {}

  def key_value_set(self, key, value, allow_overwrite=False):
    assert allow_overwrite
    self.values[key] = value

  def key_value_try_get(self, key):
    if key not in self.values:
      raise RuntimeError(f'NOT_FOUND: {key}')
    return self.values[key]


def test_a_silent_process_is_gone_after_the_timeout_and_a_finished_one_is_not():
  store = FakeStore()
  me, other, third = (watchdog.Peers(store, i, 3, timeout=10.) for i in range(3))
  assert me.check(0., 5) is None   # the others have not published yet
  other.publish(4)
  third.publish(5, 'done')
  assert me.check(0., 5) is None
  assert me.check(9., 5) is None
  other.publish(5)   # a beat: the silence starts again
  assert me.check(15., 5) is None
  line = me.check(26., 6)
  assert line.startswith('process 1 of the run sent no news for 11 s (its last round 5, this '
                         "process's 6): it is gone or frozen"), line


def test_a_process_that_stopped_stops_the_others_with_its_reason():
  store = FakeStore()
  me, other = watchdog.Peers(store, 0, 2, timeout=10.), watchdog.Peers(store, 1, 2, timeout=10.)
  other.publish(7, 'stopped', 'round 8 made no progress for 61 s')
  assert me.check(0., 7) == 'process 1 of the run stopped: round 8 made no progress for 61 s'
  assert json.loads(store.values[f'{watchdog.KEY}/1'])['round'] == 7


def test_a_stall_is_one_line_naming_the_round_the_devices_and_where_to_resume(tmp_path,
                                                                              monkeypatch):
  (tmp_path / 'checkpoint-40').mkdir()
  watch = watchdog.Watchdog(timeout=0.)
  loop = types.SimpleNamespace(runs=[types.SimpleNamespace(workdir=str(tmp_path))],
                               exp=types.SimpleNamespace(mesh=None), start=40,
                               seconds=lambda phase: 2.0)
  monkeypatch.setattr(watchdog, 'devices_of', lambda mesh: 'cpu devices 0-1')
  monkeypatch.setattr(watchdog.Watchdog, 'start', lambda self: None)
  monkeypatch.setattr(watchdog.time, 'monotonic', lambda: 1000.)
  watch.on_compiled(loop)
  for done in range(41, 46):
    watch.on_round(loop, done)
  assert watch.stalled(1000. + 59) is None
  line = watch.stalled(1000. + 61)
  assert line == ('round 46 made no progress for 61 s (a round took 0.0 ms, the longest gap '
                  '2.0 s; limit 60 s, --stall_timeout) on cpu devices 0-1; stopped: run the same '
                  'command to resume from the checkpoint of round 40')
  watch.on_end(loop)
  assert watch.stalled(1000. + 1000) is None
