"""``core.checks``: one whole number of at least 1, whatever holds it; nothing truncated."""
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_gel.core.checks import is_whole, positive_int


@pytest.mark.parametrize('value', [3, np.int64(3), jnp.int32(3), 3.0, np.float32(3.),
                                   jnp.float32(3.), np.array(3), jnp.asarray(3)])
def test_whole_numbers_of_any_kind_are_taken_as_ints(value):
  assert is_whole(value) and positive_int('f', 'n', value) == 3
  assert type(positive_int('f', 'n', value)) is int


@pytest.mark.parametrize('value', [2.5, np.array(2.5), jnp.float32(2.5), True, np.bool_(True),
                                   jnp.asarray(True), '4', None, [3], np.array([3, 4]),
                                   float('nan'), float('inf'), 0, -1, np.int32(0)])
def test_anything_else_is_one_line_naming_the_argument(value):
  with pytest.raises(ValueError, match=r'^f: n must be a positive integer, got '):
    positive_int('f', 'n', value)
