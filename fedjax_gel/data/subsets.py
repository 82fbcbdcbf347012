"""Two small real LEAF subsets shipped with fedjax_gel, for runs and tests without a download.

* ``femnist_niid_05``: LEAF FEMNIST as LEAF's ``preprocess.sh -s niid --sf 0.05 -k 0 -t
  sample`` wrote it (its ``train/`` and ``test/`` shard folders; 20 of the 35 shard pairs, those
  whose train file was published): 105 writers, 14,708 train and 1,685 test images (28 x 28,
  ``k / 255``), 62 classes. 3.7 MB compressed.
* ``shakespeare_niid_keep100``: LEAF Shakespeare, niid sampling keeping speakers with at least
  100 samples, the test split of that sample: 109 speakers, 16,507 samples (80 characters, the
  next one as the label); split it with ``--leaf_split=position``. 0.1 MB compressed.

Name one as ``--data_path=subset:<name>`` (``resolve``): the archive is unpacked once into the
data cache (``data.cache``; a temporary directory when the cache is off) and the path of the
unpacked folder or file is read like any LEAF data.

Provenance and licence: the files are LEAF's output (Caldas et al. 2019, "LEAF: A Benchmark for
Federated Settings", https://github.com/TalwalkarLab/leaf, BSD 2-Clause licence, copyright (c)
2018 TalwalkarLab), unchanged but for compression. FEMNIST derives from NIST Special Database
19; Shakespeare from The Complete Works of William Shakespeare (Project Gutenberg, public
domain). See ``subsets/README.md``.
"""
from __future__ import annotations

import atexit
import gzip
import os
import shutil
import tarfile
import tempfile

from fedjax_gel.data import cache
from fedjax_gel.data.errors import DataError

PREFIX = 'subset:'
HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'subsets')
# name -> (archive in HERE, what it unpacks to)
SUBSETS = {
    'femnist_niid_05': ('femnist_niid_05.tar.gz', 'femnist_niid_05'),
    'shakespeare_niid_keep100': ('shakespeare_niid_keep100.json.gz',
                                 'shakespeare_niid_keep100.json'),
}


def resolve(data_path: str) -> str:
  """``data_path`` itself, or for ``subset:<name>`` the path of that shipped subset, unpacked
  on first use. An unknown name is a DataError naming the known ones."""
  if not data_path.startswith(PREFIX):
    return data_path
  name = data_path[len(PREFIX):]
  if name not in SUBSETS:
    raise DataError(f'--data_path={data_path}: no such subset; shipped: '
                    f'{", ".join(PREFIX + n for n in SUBSETS)}')
  archive, unpacked = SUBSETS[name]
  root = os.path.join(_root(), 'subsets')
  target = os.path.join(root, unpacked)
  if not os.path.exists(target):
    _unpack(os.path.join(HERE, archive), root, unpacked)
  return target


def _root() -> str:
  """The data cache, or (cache off) a temporary directory removed at exit."""
  root = cache.default_dir()
  if root:
    return root
  global _TEMP  # pylint: disable=global-statement
  if _TEMP is None:
    _TEMP = tempfile.mkdtemp(prefix='fedjax_gel_subsets_')
    atexit.register(shutil.rmtree, _TEMP, ignore_errors=True)
  return _TEMP


_TEMP = None


def _unpack(archive: str, root: str, unpacked: str):
  """Unpacks ``archive`` (``.tar.gz`` of one folder, or ``.json.gz``) into ``root/unpacked``
  whole or not at all: into a temporary name first, then renamed (a concurrent process that
  got there first wins)."""
  os.makedirs(root, exist_ok=True)
  tmp = tempfile.mkdtemp(dir=root, prefix='.unpacking-')
  try:
    if archive.endswith('.tar.gz'):
      with tarfile.open(archive) as tar:
        for member in tar.getmembers():
          parts = member.name.split('/')
          if (os.path.isabs(member.name) or '..' in parts or parts[0] != unpacked or
              not (member.isfile() or member.isdir())):
            raise DataError(f'{archive}: unexpected member {member.name!r}')
          if member.isfile():
            out = os.path.join(tmp, *parts)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with tar.extractfile(member) as src, open(out, 'wb') as dst:
              shutil.copyfileobj(src, dst)
    else:
      with gzip.open(archive) as src, open(os.path.join(tmp, unpacked), 'wb') as dst:
        shutil.copyfileobj(src, dst)
    try:
      os.rename(os.path.join(tmp, unpacked), os.path.join(root, unpacked))
    except OSError:
      if not os.path.exists(os.path.join(root, unpacked)):
        raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
