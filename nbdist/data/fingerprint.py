"""Whether several workers train on the same data: a fingerprint of each worker's first batch.

Under multiworker every worker reads its own input pipeline. TensorFlow shards a
``tf.data.Dataset`` across the workers by itself (``AutoShardPolicy.AUTO``), but a dataset
function that never calls ``dataset.shard(input_context.num_input_pipelines,
input_context.input_pipeline_id)``, or a dataset whose auto-sharding was turned off, gives
every worker the same batches: N workers then do the work of one, with N times the
all-reduce. Nothing fails, and the loss curve looks fine.

Each worker hashes the values of its first batch (``batch_digest``, a copy of one batch to
the host, once per run) and sends the digest to the kernel, which compares them
(``same_input_groups``) and says which workers read the same data and how to shard it.

Under parameter_server the workers run no Python: the scheduled step computes the digest
in its graph (``graph_digest``), on each worker's first batch of the run only, and returns it
in its row (``cluster.paramserver.stepfn``). There TensorFlow passes every worker the same
``input_context`` (pipeline 0 of 1), so sharding by it changes nothing: the fix
(``SAME_INPUT_PS``) shards or seeds by the worker's index instead.
"""

from __future__ import annotations

import hashlib
from typing import Any

#: Bytes of each tensor that go into the digest: enough to tell batches apart, bounded cost.
_BYTES_PER_TENSOR = 1 << 20

SAME_INPUT = (
    "workers {workers} trained on the same data: their first batches are identical, so "
    "{n} workers did the work of one. Shard the input per worker: in the dataset function, "
    "`dataset = dataset.shard(input_context.num_input_pipelines, "
    "input_context.input_pipeline_id)` (TensorFlow's distribute_datasets_from_function), or "
    "pass a tf.data.Dataset and keep its auto-sharding on "
    "(options.experimental_distribute.auto_shard_policy = tf.data.experimental."
    "AutoShardPolicy.DATA)."
)


SAME_INPUT_PS = (
    "workers {workers} trained on the same data: their first batches are identical, so "
    "they read the same examples in the same order and the run sees each example {n} times "
    "as often as it should. Under parameter_server TensorFlow passes every worker the same "
    "input_context (pipeline 0 of 1), so sharding by it changes nothing: in the dataset "
    "function, shard by the worker, `dataset = dataset.shard(NUM_WORKERS, "
    "tf.distribute.coordinator.experimental_get_current_worker_index())`, or shuffle with a "
    "seed that differs per worker (`seed=` that index, cast to tf.int64). A tf.data.Dataset "
    "given as --data is copied to every worker: shuffle it without a fixed seed, or pass a "
    "dataset function."
)
#: ``graph_digest``'s values are below this, so a float64 row holds them exactly.
GRAPH_DIGEST_BUCKETS = 1 << 52


def batch_digest(batch: Any) -> str:
    """A hex digest of a batch's values: every tensor of its structure (per-replica values
    included, in their order), its dtype, shape and first bytes."""
    import tensorflow as tf

    digest = hashlib.blake2b(digest_size=16)
    for part in tf.nest.flatten(batch, expand_composites=True):
        value = part.numpy() if hasattr(part, "numpy") else part
        try:
            import numpy as np

            array = np.asarray(value)
        except Exception:   # a value numpy cannot hold: its text stands for it
            digest.update(repr(value).encode())
            continue
        digest.update(f"{array.dtype}{array.shape}".encode())
        digest.update(array.tobytes()[:_BYTES_PER_TENSOR])
    return digest.hexdigest()


def graph_digest(batch: Any) -> Any:
    """In a traced function: an int64 scalar digest of a batch's values (each tensor's
    dtype, shape and first bytes, per-replica values included), below
    ``GRAPH_DIGEST_BUCKETS``."""
    import tensorflow as tf

    parts = []
    for part in tf.nest.flatten(batch, expand_composites=True):
        if not isinstance(part, tf.Tensor) or part.dtype in (tf.resource, tf.variant):
            continue
        flat = tf.reshape(part, [-1])
        head = flat[:max(1, _BYTES_PER_TENSOR // max(1, part.dtype.size))]
        parts += [tf.io.serialize_tensor(tf.shape(part, out_type=tf.int64)),
                  tf.io.serialize_tensor(head)]
    if not parts:
        return tf.constant(0, tf.int64)
    return tf.strings.to_hash_bucket_fast(tf.strings.join(parts), GRAPH_DIGEST_BUCKETS)


def same_input_groups(digests: dict[int, str]) -> list[list[int]]:
    """Groups of two or more workers whose first batches had the same digest."""
    groups: dict[str, list[int]] = {}
    for worker, digest in sorted(digests.items()):
        groups.setdefault(digest, []).append(worker)
    return [workers for workers in groups.values() if len(workers) > 1]


def same_input_note(groups: list[list[int]], message: str = SAME_INPUT) -> str:
    """What the Run's note says for ``same_input_groups``'s groups (``message``:
    ``SAME_INPUT_PS`` under parameter_server)."""
    largest = max(groups, key=len)
    return message.format(workers=" and ".join(map(str, largest)) if len(largest) == 2
                             else ", ".join(map(str, largest)), n=len(largest))
