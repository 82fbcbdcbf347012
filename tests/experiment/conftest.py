"""Shared fixtures: a small learnable LEAF file."""
import json

import numpy as np
import pytest


def write_leaf(path, num_users=8, n=12, dim=3, classes=3, seed=0):
  """A small learnable LEAF file: y = argmax(x W)."""
  rng = np.random.default_rng(seed)
  w = rng.normal(size=(dim, classes))
  users = [f'u{i}' for i in range(num_users)]
  data = {}
  for u in users:
    x = rng.normal(size=(n, dim))
    data[u] = {'x': x.tolist(), 'y': np.argmax(x @ w, axis=1).tolist()}
  path.write_text(json.dumps({'users': users, 'num_samples': [n] * num_users, 'user_data': data}))
  return path


@pytest.fixture(scope='session')
def tiny_leaf_file(tmp_path_factory):
  """8 users x 12 samples, 3 features, 3 classes."""
  return write_leaf(tmp_path_factory.mktemp('data') / 'tiny.json')


@pytest.fixture(scope='session')
def leaf_writer():
  """``write_leaf``, for a test that writes LEAF files of its own."""
  return write_leaf
