"""The command's ``Runtime``: a writer that does nothing off process 0, stop tokens of its own,
and its handlers gone when the command ends (several processes: test_processes)."""
import os
import signal
import sys
import threading
import time

import pytest

from fedjax_gel.experiment import runtime as runtime_lib


class Process(runtime_lib.Runtime):
  """A runtime that takes itself for process ``index`` of two."""

  def __init__(self, index: int):
    super().__init__()
    self._index = index

  index = property(lambda self: self._index)


def test_only_process_0_writes():
  written = []
  assert Process(0).write(written.append, 'a') is None and written == ['a']
  assert Process(1).write(written.append, 'b') is None and written == ['a']
  assert Process(0).writes and not Process(1).writes
  assert runtime_lib.Runtime().writes   # one process: it writes


def test_a_stop_token_counts_requests_until_cleared():
  token = runtime_lib.StopToken()
  assert not token
  token.defer(signal.SIGTERM, None)   # the rounds' first stop: only recorded
  assert token and token.requests == 1
  with pytest.raises(KeyboardInterrupt):
    token.defer(signal.SIGTERM, None)   # a second one: at once
  assert token.requests == 2
  token.clear()
  assert not token
  with pytest.raises(KeyboardInterrupt):
    token.interrupt(signal.SIGINT, None)   # outside the rounds: recorded and raised
  assert token.requests == 1


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                    reason='signal handlers live in the main thread')
def test_guarding_installs_the_commands_handlers_and_restores_the_previous_ones():
  before = {s: signal.getsignal(s) for s in runtime_lib.STOP_SIGNALS}
  hook = sys.unraisablehook
  runtime = runtime_lib.Runtime()
  with runtime.guarding():
    assert all(signal.getsignal(s) == runtime.stop.interrupt for s in runtime_lib.STOP_SIGNALS)
    with pytest.raises(KeyboardInterrupt):
      os.kill(os.getpid(), signal.SIGTERM)
      time.sleep(1)
    assert runtime.stop.requests == 1
  assert {s: signal.getsignal(s) for s in runtime_lib.STOP_SIGNALS} == before
  assert sys.unraisablehook is hook
  assert not runtime_lib.Runtime().stop   # a new command starts with no stop pending


def test_one_process_agrees_alone_and_leaves_nothing():
  runtime = runtime_lib.Runtime()
  runtime.agree({'--seed': 0})
  runtime.stop_others('gone')   # nobody to tell
  assert runtime.gather({'a': 1}) == [{'a': 1}] and runtime.from_writer(3) == 3
  assert runtime.refused == [] and not runtime.agrees_on_stops()
  runtime.leave()   # nothing refused together: stays in JAX's runtime (there is none)
