"""The watchdog's rules, on hand-made cases: the stall limit, and the other processes' beats
(a fake key-value store). Whole runs: test_long_runs.py and tests/reliability."""
from __future__ import annotations

import json
import types

import pytest

from fedjax_gel.experiment import watchdog


@pytest.mark.parametrize('timeout, typical, factor, limit', [
    (5., 1., 20, 5.),                          # given: as it is
    (0., None, 20, watchdog.FIRST_S),          # nothing measured yet (a first round may wait
                                               # for another process's compilation)
    (0., 0.01, 20, watchdog.MIN_STALL_S),      # fast rounds: the floor
    (0., 5., 20, 100.),                        # slow rounds: 20 mean rounds
    (0., 50., 3, 150.),                        # an evaluation of 50 s: 3 times it
])
def test_stall_limit(timeout, typical, factor, limit):
  assert watchdog.stall_limit(timeout, typical, factor) == pytest.approx(limit)


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
  assert me.check(0., 5) is None   # the others have not published yet: silent from now on
  other.publish(4)
  third.publish(5, 'done')
  assert me.check(9., 5) is None
  other.publish(5)   # a beat: the silence starts again
  assert me.check(15., 5) is None
  line = me.check(26., 6)
  assert line.startswith('process 1 of the run sent no news for 11 s (its last round 5, this '
                         "process's 6): it is gone or frozen"), line
  assert me.settled(26.)   # process 1 is silent: it will not leave
  other.publish(6)
  assert me.check(27., 6) is None and not me.settled(27.)
  other.publish(6, 'done')
  assert me.settled(28.) and me.check(40., 6) is None


def test_a_process_that_never_published_is_gone_after_the_timeout():
  store = FakeStore()
  me = watchdog.Peers(store, 0, 2, timeout=10.)
  assert me.check(0., 0) is None and me.check(10., 0) is None
  assert me.check(11., 0).startswith('process 1 of the run sent no news for 11 s (its last '
                                     "round ?, this process's 0)")


def test_a_process_that_stopped_stops_the_others_with_its_reason():
  store = FakeStore()
  me, other = watchdog.Peers(store, 0, 2, timeout=10.), watchdog.Peers(store, 1, 2, timeout=10.)
  other.publish(7, 'stopped', 'round 8 made no progress for 61 s')
  assert me.check(0., 7) == 'process 1 of the run stopped: round 8 made no progress for 61 s'
  assert json.loads(store.values[f'{watchdog.KEY}/1'])['round'] == 7


def fake_loop(workdir, start=40, in_flight=2):
  return types.SimpleNamespace(
      runs=[types.SimpleNamespace(workdir=str(workdir))], exp=types.SimpleNamespace(mesh=None),
      start=start, in_flight=in_flight, phases=types.SimpleNamespace(active=None),
      train=0., eval=2., seconds=lambda phase, self=None: 0.)


def test_a_stalled_round_is_one_line_naming_the_rounds_the_devices_and_where_to_resume(
    tmp_path, monkeypatch):
  (tmp_path / 'checkpoint-40').mkdir()
  monkeypatch.setattr(watchdog, 'devices_of', lambda mesh: 'cpu devices 0-1')
  monkeypatch.setattr(watchdog.Watchdog, 'start', lambda self: None)
  watch = watchdog.Watchdog(timeout=0.)
  loop = fake_loop(tmp_path)
  seconds = {'train': 0., 'eval': 0.}
  loop.seconds = seconds.get
  watch.on_start(loop)
  watch.on_compiled(loop)
  loop.phases.active = ('train', 1000.)   # round 41's step, nothing timed yet: FIRST_S
  assert watch.stalled(1000. + watchdog.FIRST_S - 1) is None
  assert watch.stalled(1000. + watchdog.FIRST_S + 1).startswith('round 41 made no progress')
  for done in range(41, 46):
    watch.on_round(loop, done)
  seconds['train'] = 0.05   # 10 ms a round
  loop.phases.active = ('train', 2000.)   # round 46 dispatched, 44 waited for
  assert watch.stalled(2000. + 59) is None
  assert watch.stalled(2000. + 61) == (
      'rounds 44-46 made no progress for 61 s (a round took 10.0 ms; limit 60 s, '
      '--stall_timeout) on cpu devices 0-1; stopped: run the same command to resume from the '
      'checkpoint of round 40')
  loop.phases.active = None   # a checkpoint, a report: not watched
  assert watch.stalled(5000.) is None
  watch.on_end(loop)
  loop.phases.active = ('train', 2000.)
  assert watch.stalled(9000.) is None


def test_an_evaluation_may_take_three_times_the_longest_one_seen(tmp_path, monkeypatch):
  monkeypatch.setattr(watchdog, 'devices_of', lambda mesh: 'cpu device 0')
  monkeypatch.setattr(watchdog.Watchdog, 'start', lambda self: None)
  watch = watchdog.Watchdog(timeout=0.)
  loop = fake_loop(tmp_path, start=0)
  seconds = {'train': 0., 'eval': 30.}   # round 0's evaluation took 30 s
  loop.seconds = seconds.get
  watch.on_start(loop)
  watch.on_compiled(loop)
  watch.on_round(loop, 5)
  loop.phases.active = ('eval', 100.)
  assert watch.stalled(100. + 89) is None
  assert watch.stalled(100. + 91) == (
      'the evaluation after round 5 made no progress for 91 s (limit 90 s, --stall_timeout) on '
      'cpu device 0; stopped: run the same command to resume from the start (no checkpoint '
      'yet)')
