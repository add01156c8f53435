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


def same_input_groups(digests: dict[int, str]) -> list[list[int]]:
    """Groups of two or more workers whose first batches had the same digest."""
    groups: dict[str, list[int]] = {}
    for worker, digest in sorted(digests.items()):
        groups.setdefault(digest, []).append(worker)
    return [workers for workers in groups.values() if len(workers) > 1]


def same_input_note(groups: list[list[int]]) -> str:
    """What the Run's note says for ``same_input_groups``'s groups."""
    largest = max(groups, key=len)
    return SAME_INPUT.format(workers=" and ".join(map(str, largest)) if len(largest) == 2
                             else ", ".join(map(str, largest)), n=len(largest))
