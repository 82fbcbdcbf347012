"""The real LEAF subsets shipped with fedjax_gel (``--data_path=subset:<name>``)."""
from __future__ import annotations

import io
import json
import os
import pathlib
import tarfile

import pytest

from fedjax_gel.data import errors, leaf, leaf_files, subsets

SHARED = pathlib.Path(__file__).resolve().parents[2].parent / 'shared' / 'data' / 'leaf'


@pytest.fixture
def cache(tmp_path, monkeypatch):
  monkeypatch.setenv('FEDJAX_GEL_DATA_CACHE', str(tmp_path / 'cache'))
  return tmp_path / 'cache'


@pytest.mark.slow
def test_femnist_subset_is_leafs_split_output(cache):
  path = subsets.resolve('subset:femnist_niid_05')
  assert path == str(cache / 'subsets' / 'femnist_niid_05')
  train, test = (leaf_files.read_leaf_json(os.path.join(path, side)) for side in ('train', 'test'))
  assert (len(train['users']), sum(train['num_samples']), sum(test['num_samples'])) == (
      105, 14_708, 1_685)
  split = leaf.load(path)   # LEAF's train/ and test/, joined by user
  assert split.train.num_clients == 105 and split.train.num_examples == 14_708
  if SHARED.is_dir():   # byte for byte the files LEAF wrote
    for side in ('train', 'test'):
      for f in (SHARED / 'femnist_niid_05' / side).iterdir():
        assert (pathlib.Path(path) / side / f.name).read_bytes() == f.read_bytes()
  before = os.stat(os.path.join(path, 'train')).st_mtime_ns
  assert subsets.resolve('subset:femnist_niid_05') == path   # unpacked once
  assert os.stat(os.path.join(path, 'train')).st_mtime_ns == before


def test_shakespeare_subset_without_a_cache(monkeypatch):
  monkeypatch.setenv('FEDJAX_GEL_DATA_CACHE', '')   # the cache off: a temporary directory
  monkeypatch.setattr(subsets, '_TEMP', None)
  path = subsets.resolve('subset:shakespeare_niid_keep100')
  data = json.loads(pathlib.Path(path).read_text())
  assert (len(data['users']), sum(data['num_samples'])) == (109, 16_507)
  if SHARED.is_dir():
    assert pathlib.Path(path).read_bytes() == (
        SHARED / 'shakespeare_niid_keep100_subset.json').read_bytes()


def test_paths_and_unknown_names(cache):
  assert subsets.resolve('data/femnist/all_data') == 'data/femnist/all_data'
  with pytest.raises(errors.DataError, match='subset:femnist_niid_05, '
                                           'subset:shakespeare_niid_keep100'):
    subsets.resolve('subset:femnist')


def test_an_archive_member_outside_its_folder_is_refused(tmp_path):
  archive = tmp_path / 'bad.tar.gz'
  with tarfile.open(archive, 'w:gz') as tar:
    info = tarfile.TarInfo('good/../../escaped.json')
    info.size = 2
    tar.addfile(info, io.BytesIO(b'{}'))
  with pytest.raises(errors.DataError, match='unexpected member'):
    subsets._unpack(str(archive), str(tmp_path / 'out'), 'good')   # pylint: disable=protected-access
  assert not (tmp_path / 'escaped.json').exists() and not (tmp_path / 'out' / 'good').exists()
