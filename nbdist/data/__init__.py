"""What a step-mode cell trains on (``--data``): what it is, checked, and read the way
TensorFlow reads it under the session's strategy, before anything is traced or any Run exists.

``--data NAME`` names one of (``classify``):

* a ``tf.data.Dataset`` of *global* batches. nbdist distributes it:
  ``strategy.experimental_distribute_dataset`` (each step's batch is split across the
  replicas; under multiworker TensorFlow auto-shards it across the workers); under
  parameter_server each worker reads its own repeated copy
  (``coordinator.create_per_worker_dataset(dataset.repeat())``).
* a dataset function ``fn(input_context)`` returning *per-replica* batches, as
  ``strategy.distribute_datasets_from_function`` takes (TensorFlow's input, multi-worker and
  parameter-server tutorials). nbdist hands it to the session's strategy, which calls it once
  per input pipeline with a ``tf.distribute.InputContext``: one pipeline in the kernel's
  local strategies; under multiworker one per worker (``input_pipeline_id`` is the worker's
  index, ``num_input_pipelines`` the number of workers); under parameter_server TensorFlow
  gives every worker the same context (pipeline 0 of 1), and nbdist builds the per-worker
  dataset as the tutorial does: ``coordinator.create_per_worker_dataset(lambda:
  strategy.distribute_datasets_from_function(fn))``, each worker's dataset repeated.
* a ``tf.distribute.DistributedDataset`` (``experimental_distribute_dataset`` or
  ``distribute_datasets_from_function``) made with the session's strategy: used as it is.
  One made with another strategy is refused.
* under parameter_server, also what ``coordinator.create_per_worker_dataset`` returns (or the
  no-argument function it takes), used as it is.

Checks (a ``DataError`` or ``ConfigError`` naming the fix): the value is one of those; its
elements are batches (not single examples), and a global batch holds at least one example per
replica; an epoch ends (a dataset repeated forever needs ``--steps``; one of unknown length
gets a warning saying the same).

``kinds`` says what a ``--data`` value is (``classify``), ``checks`` what is wrong with it,
``read`` hands it to the strategy (``distributed_input``; ``per_worker_input`` under
parameter_server), ``iterate`` reads it (``timed_batches``) and deletes the iterators it made on
a background thread (``release``: TensorFlow can block for a long time deleting one);
``batchsizes`` says why a replica's batch at a step was empty or short (a NaN loss's cause, or
a note on the Run), from the batch sizes the step really had. ``read`` and ``iterate``
build TensorFlow's input graphs on a thread of their own (``freshstack``: built under the
cell's code, TensorFlow would keep part of each run's input for the rest of the session).
"""

from .checks import check_dataset, steps_per_epoch
from .kinds import StepData, classify, lookup_dataset
from .read import ReadData, distributed_input, per_worker_input

__all__ = ["ReadData", "StepData", "check_dataset", "classify", "distributed_input",
           "lookup_dataset", "per_worker_input", "steps_per_epoch"]
