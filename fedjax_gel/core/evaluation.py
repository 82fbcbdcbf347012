"""Vectorised evaluation of the global model over a whole example pool."""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_gel.core import federated_data
from fedjax_gel.core.checks import positive_int, whole_at_least
from fedjax_gel.core.federated_data import FederatedData
from fedjax_gel.core.tasks import CLASSIFICATION, Task


class EvalPool(NamedTuple):
  """A pool's examples padded to ``[num_batches, batch, ...]`` for ``build_evaluate``.

  ``make_eval_pool`` builds it, host side, once.

  Attributes:
    examples: the features, each ``[num_batches, batch, ...]``.
    mask: ``[num_batches, batch]`` bool, the real (not padding) examples.
    clients: for a whole pool, each example's client (``[num_batches, batch]`` int32); None for
      a sample of the pool.
    client_counts: for a whole pool, every client's number of examples (``[num_clients]``);
      None for a sample of the pool.
  """
  examples: dict
  mask: jax.Array
  clients: jax.Array | None = None
  client_counts: jax.Array | None = None


def make_eval_pool(data: FederatedData, batch_size: int = 4096, max_examples: int = 0,
                   seed: int = 0) -> EvalPool:
  """Pads the pool (host side, once) so evaluation is ``lax.map`` over fixed-size batches.

  The pool's clients' rows, in client order (rows no client owns, a split pool's padding, are
  left out).

  Args:
    data: the pool, e.g. ``split.test`` (host or device).
    batch_size: examples per evaluation batch (at most the examples evaluated).
    max_examples: above 0 and below the pool's examples, a fixed sample of that many of them,
      drawn uniformly without replacement with ``seed`` (kept in order), without per-client
      metrics; 0: every example.
    seed: the sample's seed.

  Returns:
    The ``EvalPool``, on the default device.

  Raises:
    ValueError: a malformed pool (``federated_data.check_pool``), a batch size below 1, a
      negative ``max_examples`` or ``seed``.

  Examples:
    >>> import numpy as np
    >>> import fedjax_gel as fg
    >>> test = fg.from_client_arrays([{'x': np.ones((3, 2)), 'y': np.zeros(3, int)}] * 2)
    >>> pool = fg.make_eval_pool(test, batch_size=4)
    >>> pool.mask.shape
    (2, 4)
  """
  federated_data.check_pool(data, 'make_eval_pool')
  batch_size = positive_int('make_eval_pool', 'batch_size', batch_size)
  max_examples = whole_at_least('make_eval_pool', 'max_examples', max_examples, 0)
  seed = whole_at_least('make_eval_pool', 'seed', seed, 0)
  offsets, counts = np.asarray(data.offsets, np.int64), np.asarray(data.counts, np.int64)
  total = int(counts.sum())   # the clients' rows, in client order (a split pool has padding)
  owned = (np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts) +
           np.repeat(offsets, counts))
  examples = data.examples
  if total != data.num_examples or np.any(owned != np.arange(total)):
    examples = {k: np.asarray(v)[owned] for k, v in examples.items()}
  sampled = 0 < max_examples < total
  if sampled:
    keep = np.sort(np.random.default_rng(seed).choice(total, max_examples, replace=False))
    examples, total = {k: np.asarray(v)[keep] for k, v in examples.items()}, max_examples
  batch = max(1, min(batch_size, total))
  num_batches = -(-total // batch)
  pad = num_batches * batch - total

  def shape(a):
    a = np.asarray(a)
    a = np.concatenate([a, np.zeros((pad,) + a.shape[1:], a.dtype)])
    return jax.device_put(a.reshape((num_batches, batch) + a.shape[1:]))

  mask = np.arange(num_batches * batch) < total
  clients = client_counts = None
  if not sampled:   # every client's rows: per-client metrics
    clients = shape(np.repeat(np.arange(len(counts), dtype=np.int32), counts))
    client_counts = jax.device_put(counts.astype(np.int32))
  return EvalPool({k: shape(v) for k, v in examples.items()},
                  jax.device_put(mask.reshape(num_batches, batch)), clients, client_counts)


def build_evaluate(apply_fn: Callable, task=None) -> Callable:
  """Builds the jitted evaluation of a model over an ``EvalPool``.

  Each value is the task's ``sum / weight`` of its term over all the pool's examples
  (``models.tasks``; default classification: ``loss`` and ``accuracy``).

  Args:
    apply_fn: ``(params, x) -> outputs``, e.g. ``model.apply``.
    task: the model's ``models.Task`` (None: ``models.CLASSIFICATION``).

  Returns:
    ``evaluate(params, pool) -> {'loss', <each metric of task>, 'count'}``, jitted. For a pool
    that names its examples' clients (a whole pool), also ``client_sum`` and
    ``client_weight`` (``[num_clients]``: each client's sum of the task's main metric, e.g.
    its correct predictions, and the weight it is out of: examples, or tokens).

  Raises:
    TypeError: ``apply_fn`` is not callable (e.g. a ``Model`` itself), or ``task`` is no
      ``models.Task``.

  Examples:
    >>> import jax, numpy as np
    >>> import fedjax_gel as fg
    >>> test = fg.from_client_arrays([{'x': np.ones((3, 60)), 'y': np.zeros(3, int)}] * 2)
    >>> model = fg.get_model('logistic', (60,), 5)
    >>> evaluate = fg.build_evaluate(model.apply, model.task)
    >>> metrics = evaluate(model.init(jax.random.key(0)), fg.make_eval_pool(test))
    >>> sorted(metrics)
    ['accuracy', 'client_sum', 'client_weight', 'count', 'loss']
  """
  if task is None:
    task = CLASSIFICATION
  if not callable(apply_fn):   # e.g. a Model itself, whose apply is the function
    raise TypeError(f'build_evaluate: apply_fn must be a function (params, x) -> outputs, e.g. '
                    f'model.apply, got {type(apply_fn).__name__}')
  if not isinstance(task, Task):
    raise TypeError(f'build_evaluate: task must be a models.Task (e.g. models.REGRESSION), got '
                    f'{task!r}')
  terms = {'loss': task.loss, **task.metrics}

  @jax.jit
  def evaluate(params, pool: EvalPool):
    def one(args):
      batch, mask = args
      outputs = apply_fn(params, batch['x'])
      out = {}
      for name, term in terms.items():
        total, weight = term(outputs, batch['y'])
        out[name] = (jnp.where(mask, total, 0.), jnp.where(mask, weight, 0.))
      return {k: (jnp.sum(t), jnp.sum(w)) for k, (t, w) in out.items()}, out[task.main]

    sums, each = jax.lax.map(one, (pool.examples, pool.mask))
    out = {k: jnp.sum(t) / jnp.maximum(jnp.sum(w), 1.) for k, (t, w) in sums.items()}
    out['count'] = jnp.sum(pool.mask)
    if pool.clients is not None:
      ids, n = pool.clients.reshape(-1), pool.client_counts.shape[0]
      out['client_sum'] = jax.ops.segment_sum(each[0].reshape(-1), ids, n)
      out['client_weight'] = jax.ops.segment_sum(each[1].reshape(-1), ids, n)
    return out

  return evaluate


def client_spread(sums, weights) -> dict:
  """The spread of a metric over the clients with test examples (host side; each client's
  ``sum / weight``, e.g. its accuracy): the unweighted mean, 10th and 90th percentiles (linear
  interpolation) and standard deviation, as FL papers report for fairness; ``None`` values
  without clients."""
  sums, weights = np.asarray(sums, np.float64), np.asarray(weights, np.float64)
  has = weights > 0
  acc = sums[has] / weights[has]
  if not acc.size:
    return {'mean': None, 'p10': None, 'p90': None, 'std': None}
  return {'mean': float(acc.mean()), 'p10': float(np.percentile(acc, 10)),
          'p90': float(np.percentile(acc, 90)), 'std': float(acc.std())}
