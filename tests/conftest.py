"""Makes ``tests/helpers.py`` importable from every test directory, and shares its fixtures."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The launcher's persistent compilation cache stays off in the tests (inherited by the commands
# they start), so that no test depends on what an earlier one compiled; test_compilation_cache
# turns it on in a folder of its own.
os.environ['FEDJAX_GEL_COMPILATION_CACHE'] = ''

import helpers  # pylint: disable=g-import-not-at-top,wrong-import-position


@pytest.fixture(scope='session')
def data():
  """``helpers.small_pool()``: 12 small clients and one without data."""
  return helpers.small_pool()


@pytest.fixture(scope='session')
def model():
  """Logistic regression, 4 features, 3 classes."""
  return helpers.small_model()


@pytest.fixture(scope='session')
def loss(model):
  from fedjax_gel import models  # pylint: disable=g-import-not-at-top
  return models.cross_entropy_loss(model)
