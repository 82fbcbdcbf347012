"""Checkpoints (orbax arrays + msgpack meta in one directory): whole or absent, the last two
kept, read into other row paddings (another device count), damage is one line."""
from __future__ import annotations

import os
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_gel.experiment import checkpoint
from fedjax_gel.experiment.runtime import Runtime

ALONE = Runtime()   # one process: it writes


class State(NamedTuple):
  params: Any
  count: Any
  clients: Any


def state(rows: int, seed: int = 0) -> State:
  rng = np.random.default_rng(seed)
  store = np.zeros((rows, 3), np.float32)
  store[:10] = rng.normal(size=(10, 3))   # 10 clients; more rows are a split store's padding
  return State({'w': jnp.asarray(rng.normal(size=(4, 2)), jnp.float32)}, jnp.int32(seed),
               jnp.asarray(store))


def test_round_trip_keeps_the_last_two_and_removes_what_a_kill_left(tmp_path):
  w = str(tmp_path)
  (tmp_path / 'checkpoint-3.tmp' / 'state').mkdir(parents=True)   # a save killed midway
  for r in (1, 2, 3):
    checkpoint.save(w, r, state(10, seed=r), {'metrics_bytes': r}, ALONE)
  assert checkpoint.rounds(w) == [2, 3]
  assert sorted(os.listdir(w)) == ['checkpoint-2', 'checkpoint-3']
  got, meta = checkpoint.load(w, 3, state(10))
  assert meta == {'metrics_bytes': 3}
  assert type(got) is State
  jax.tree.map(np.testing.assert_array_equal, got, state(10, seed=3))
  before = os.stat(os.path.join(w, 'checkpoint-3', 'meta.msgpack')).st_mtime_ns
  checkpoint.save(w, 3, state(10, seed=9), {'metrics_bytes': 9}, ALONE)   # that round's is kept
  assert os.stat(os.path.join(w, 'checkpoint-3', 'meta.msgpack')).st_mtime_ns == before


@pytest.mark.parametrize('saved,now', [((12, 4), (10, 1)), ((10, 1), (12, 4)),
                                       ((12, 4), (16, 8))])
def test_a_split_store_is_read_with_another_padding(tmp_path, monkeypatch, saved, now):
  """A store padded for one device count (12 rows: 4 devices) read for another (10: one
  device; 16: 8 devices): the 10 clients' rows equal, padding rows zero. (The device counts
  are those the arrays' shardings would span; tests/experiment/test_processes.py reads a
  checkpoint of 4 devices over 2 processes in one process.)"""
  w = str(tmp_path)
  monkeypatch.setattr(checkpoint, '_devices', lambda leaves: saved[1])
  checkpoint.save(w, 5, state(saved[0], seed=1), {}, ALONE)
  monkeypatch.setattr(checkpoint, '_devices', lambda leaves: now[1])
  got, _ = checkpoint.load(w, 5, state(now[0]))
  assert got.clients.shape == (now[0], 3)
  np.testing.assert_array_equal(got.clients[:10], state(saved[0], seed=1).clients[:10])
  np.testing.assert_array_equal(got.clients[10:], 0)
  np.testing.assert_array_equal(got.params['w'], state(saved[0], seed=1).params['w'])
  with pytest.raises(checkpoint.CheckpointError, match="holds another configuration's state"):
    checkpoint.load(w, 5, state(saved[0] + 8))   # more rows than any padding


def test_other_shapes_and_damage_are_one_line(tmp_path):
  w = str(tmp_path)
  checkpoint.save(w, 5, state(10), {}, ALONE)
  other = state(10)._replace(params={'w': jnp.zeros((4, 3))})
  with pytest.raises(checkpoint.CheckpointError, match="holds another configuration's state"):
    checkpoint.load(w, 5, other)
  with pytest.raises(checkpoint.CheckpointError, match="holds another configuration's state"):
    checkpoint.load(w, 5, state(10)._replace(clients=jnp.zeros((40, 3))))   # not padding
  os.remove(os.path.join(w, 'checkpoint-5', 'state', 'manifest.ocdbt'))
  with pytest.raises(checkpoint.CheckpointError) as e:
    checkpoint.load(w, 5, state(10))
  assert str(e.value).startswith(os.path.join(w, 'checkpoint-5') + ': damaged checkpoint')
  assert '\n' not in str(e.value) and '--overwrite' in str(e.value)


def test_a_checkpoint_of_the_earlier_format_is_refused(tmp_path):
  (tmp_path / 'checkpoint-5.msgpack').write_bytes(b'\x81\xa1a\x01')
  with pytest.raises(checkpoint.CheckpointError, match='earlier fedjax_gel'):
    checkpoint.check(str(tmp_path), state(10), ())


def test_a_resume_hashes_a_state_once_and_again_after_a_write(tmp_path, monkeypatch):
  """A resume reads each checkpoint three times (``check``, ``intact_rounds``, ``load``): its
  state is hashed once; a byte changed in place afterwards (same size) is hashed and refused."""
  w = str(tmp_path)
  checkpoint.save(w, 5, state(10), {'metrics_bytes': 0}, ALONE)
  (tmp_path / 'metrics.jsonl').touch()
  hashed = []
  digest = checkpoint.files.digest
  monkeypatch.setattr(checkpoint.files, 'digest', lambda p: hashed.append(p) or digest(p))
  assert checkpoint.check(w, state(10), ()) == []
  assert checkpoint.intact_rounds(w) == [5]
  checkpoint.load(w, 5, state(10))
  assert len(hashed) == 1
  data = max((p for p in (tmp_path / 'checkpoint-5' / 'state').rglob('*') if p.is_file()),
             key=lambda p: p.stat().st_size)
  raw = bytearray(data.read_bytes())
  raw[len(raw) // 2] ^= 1
  with open(data, 'r+b') as f:   # in place: the same size and inode
    f.write(raw)
  with pytest.raises(checkpoint.CheckpointError, match='damaged checkpoint'):
    checkpoint.load(w, 5, state(10))
  assert len(hashed) == 2


def test_with_every_checkpoint_damaged_the_error_names_them_all(tmp_path):
  w = str(tmp_path)
  (tmp_path / 'metrics.jsonl').touch()
  for r in (2, 4, 6):
    checkpoint.save(w, r, state(10), {'metrics_bytes': 0}, ALONE)
    os.remove(os.path.join(w, f'checkpoint-{r}', 'state', 'manifest.ocdbt'))
  kept = checkpoint.rounds(w)
  assert len(kept) >= 2 and kept[-1] == 6
  with pytest.raises(checkpoint.CheckpointError) as e:
    checkpoint.check(w, state(10), ())
  text = str(e.value)
  assert text.startswith(os.path.join(w, 'checkpoint-6') + ': damaged checkpoint'), text
  earlier = ', '.join(f'checkpoint-{r}' for r in kept[:-1])
  assert text.endswith(f'every checkpoint is damaged (the earlier {earlier} too): remove them '
                       'or pass --overwrite') and '\n' not in text
