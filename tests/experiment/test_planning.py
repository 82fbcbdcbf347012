"""The planner's chunk rule (``planning.default_chunk_size``) by hand: the memory it budgets and
the budget-sorted chunks of cohorts whose budgets differ."""
import jax

from fedjax_gel.experiment.planning import default_chunk_size

from helpers import init_params


def test_default_chunk_size_respects_memory(model):
  params = init_params(model)   # 15 float32 = 60 bytes
  assert default_chunk_size(10_000, params, 16, 5, memory_bytes=1 << 30) == 10_000
  per_client = 8 * 60 + 2 * 5 * 16
  assert default_chunk_size(10_000, params, 16, 5, memory_bytes=4 * 100 * per_client) == 100
  assert default_chunk_size(10, params, 16, 5, memory_bytes=1) == 1


def test_default_chunk_size_cuts_heterogeneous_cohorts_into_budget_sorted_chunks(model):
  params = model.init(jax.random.key(0))
  big = 1 << 30
  # Equal budgets: one chunk. Budgets that differ: about 16 chunks, never below 32 clients
  # per device, never above what memory allows.
  assert default_chunk_size(2000, params, 16, 5, memory_bytes=big, equal_budgets=True) == 2000
  assert default_chunk_size(2000, params, 16, 5, memory_bytes=big, equal_budgets=False) == 125
  assert default_chunk_size(2000, params, 16, 5, 2, memory_bytes=big,
                            equal_budgets=False) == 125
  assert default_chunk_size(20, params, 16, 5, memory_bytes=big, equal_budgets=False) == 20
  assert default_chunk_size(300, params, 16, 5, 4, memory_bytes=big, equal_budgets=False) == 128
  assert default_chunk_size(2000, params, 16, 5, memory_bytes=1, equal_budgets=False) == 1
