'''The text of an exported script, with ``$placeholders`` that ``script.render`` fills in.

It is what TensorFlow's distributed-training tutorials write by hand: the strategy from
TF_CONFIG, the step under ``strategy.run`` in a ``tf.function``, a loop over the distributed
dataset (or steps scheduled by a ``ClusterCoordinator``), ``tf.train.CheckpointManager``.
Each strategy family's part (``$make_strategy``, and whether a coordinator schedules its
steps) comes from its descriptor (``nbdist.families.ScriptPieces``). The arguments are parsed
before TensorFlow is imported, because the Keras it loads can depend on ``--strategy``
(``LEGACY_FOR_FIT``), and the Keras 3 optimizers the step updates are built under the
strategy's scope before the first step is traced (``BUILD_OPTIMIZERS``).
'''

HEAD = '''\
"""$title

Exported by nbdist (`%distribute export`) from a notebook that ran it under
`$magic_line`. The notebook's cells are below as they were typed
(In[n] is the cell's number); the training step is In[$step_number].

One process:                   python $file
Several, with TF_CONFIG:       python -m nbdist.launch --workers 2 $file --strategy multiworker
A Slurm or Kubernetes job runs `python $file --strategy multiworker` in each process with its
own TF_CONFIG (nbdist's guide, "From notebook to job", has Slurm and Kubernetes recipes).
--metrics PATH (with nbdist installed) writes the rows of nbdist's dashboard:
nbdist.Run.load(PATH).plot().

Cells not exported:
$left_out
"""

import argparse
import importlib.util
import itertools
import json
import os
import tempfile
import time

try:  # optional: --metrics writes nbdist's per-replica rows as JSON lines
    from nbdist.metrics import StepWriter
except ImportError:
    StepWriter = None

STRATEGIES = $strategies
# a ClusterCoordinator schedules their steps on the workers:
COORDINATED = $coordinated
# one job of several processes, each with its TF_CONFIG:
MULTI_PROCESS = $multi_process
DEFAULT_STRATEGY = $strategy   # the notebook's (python -m nbdist.launch reads it too)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", choices=STRATEGIES, default=DEFAULT_STRATEGY,
                        help="tf.distribute strategy (default: %(default)s, the notebook's)")
    parser.add_argument("--devices", type=int, default=$devices, metavar="N",
                        help="mirrored, central_storage: N GPUs, else the CPU split into N "
                             "devices (default: %(default)s)")
    parser.add_argument("--epochs", type=int, default=$epochs, metavar="N",
                        help="(default: %(default)s)")
    parser.add_argument("--steps", type=int, default=$steps, metavar="N",
                        help="steps per epoch at most (default: %(default)s = all)")
$checkpoint_every    parser.add_argument("--checkpoint", default=$checkpoint, metavar="DIR",
                        help="save every epoch, resume from the last one (default: %(default)s)")
    parser.add_argument("--metrics", metavar="PATH",
                        help="with nbdist: per-replica rows as JSON lines. Measured: loss, "
                             "grad_norm, step_ms, data_ms (wait for the batch), worker (under "
                             "parameter_server the one that ran the step). Null: allreduce_ms, "
                             "wait_ms, compute_ms (nbdist times them by wrapping TensorFlow's "
                             "all-reduce inside the step; this script keeps to TensorFlow's "
                             "public API) (default: none)")
    args = parser.parse_args()
    if args.metrics and StepWriter is None:
        parser.error("--metrics writes nbdist's rows: pip install nbdist, or drop --metrics")
    return args


args = parse_args()   # before TensorFlow loads: which Keras it loads may depend on --strategy
$keras
tf = importlib.import_module("tensorflow")   # it reads TF_USE_LEGACY_KERAS as it loads


def local_devices(n):
    """n GPUs if there are any, else the CPU split into n logical devices."""
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        return [f"/gpu:{i}" for i in range(min(n or len(gpus), len(gpus)))]
    if n and n > 1:   # only before TensorFlow initialises its devices
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * n)
    return [d.name for d in tf.config.list_logical_devices("CPU")][: n or 1]


def make_strategy(name, devices):
    """The strategy, made before any other TensorFlow op (collectives need that)."""
$make_strategy
    raise ValueError(f"--strategy {name}: not one of {STRATEGIES}")


def worker_index_and_count():
    """This process's index among the job's workers (0: the chief), and their number."""
    config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    cluster, task = config.get("cluster", {}), config.get("task", {})
    chiefs = len(cluster.get("chief", []))
    count = chiefs + len(cluster.get("worker", [])) or 1
    if task.get("type") == "worker":
        return chiefs + int(task.get("index", 0)), count
    return 0, count


strategy = make_strategy(args.strategy, args.devices)
$worker_line
'''

STEP = '''

def step_fn($batch):
    """One replica's step: In[$step_number] (`$header`)."""
$body
    return $returns


@tf.function
def train_step($batch):
    per_replica_loss, per_replica_norm = strategy.run(step_fn, args=($batch,))
    loss = strategy.reduce(tf.distribute.ReduceOp.$reduce, per_replica_loss, axis=None)
    return loss, per_replica_loss, per_replica_norm


@tf.function
def train_step_from(iterator):   # parameter_server: a step the coordinator schedules
    worker = tf.distribute.coordinator.experimental_get_current_worker_index()
    return (*train_step(next(iterator)), worker)   # the worker that ran it, for --metrics


class EpochCheckpoint:
    """--checkpoint DIR: the step's objects after each epoch; a new run resumes after the
    last. Every worker saves (it may need collectives); only the chief writes to DIR."""

    def __init__(self, directory, **objects):
        saveable = {}
        for name, value in objects.items():   # what tf.train.Checkpoint can save
            try:
                tf.train.Checkpoint(**{name: value})
                saveable[name] = value
            except (TypeError, ValueError):
                pass
        self.directory = directory
        self.epochs_done = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.steps_done = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.checkpoint = tf.train.Checkpoint(epochs_done=self.epochs_done,
                                              steps_done=self.steps_done, **saveable)
        writes_to = directory if strategy.extended.should_checkpoint else tempfile.mkdtemp()
        self.manager = tf.train.CheckpointManager(self.checkpoint, writes_to, max_to_keep=1)

    def restore(self):
        latest = tf.train.latest_checkpoint(self.directory)
        if latest is not None:
            self.checkpoint.restore(latest)
        return int(self.epochs_done), int(self.steps_done)

    def save(self, epochs_done, steps_done):
        self.epochs_done.assign(epochs_done)
        self.steps_done.assign(steps_done)
        self.manager.save()


def synchronous_steps(dist_dataset, max_steps):
    """One epoch: every replica takes its slice of each global batch (strategy.run)."""
    started = time.perf_counter()
    for batch in itertools.islice(dist_dataset, max_steps):
        fetched = time.perf_counter()
        loss, per_replica_loss, per_replica_norm = train_step(batch)
        loss = float(loss)   # waits for the step to finish
        done = time.perf_counter()
        yield loss, per_replica_loss, per_replica_norm, None, fetched - started, done - fetched
        started = time.perf_counter()


def coordinated_steps(coordinator, iterator, per_epoch):
    """One epoch of steps scheduled on the workers by the coordinator (parameter_server)."""
    started = time.perf_counter()
    scheduled = [coordinator.schedule(train_step_from, args=(iterator,))
                 for _ in range(per_epoch)]
    coordinator.join()
    seconds = (time.perf_counter() - started) / per_epoch
    for result in scheduled:
        loss, per_replica_loss, per_replica_norm, worker = result.fetch()
        yield (float(loss), per_replica_loss, per_replica_norm, int(worker), float("nan"),
               seconds)


def local_values(per_replica):
    return [float(v) for v in strategy.experimental_local_results(per_replica)]


def train(args, data):
    """The notebook's step-mode loop on `data` (its --data): --epochs epochs of at most
    --steps steps, a checkpoint after each with --checkpoint."""
    worker, workers = worker_index_and_count()
    if args.strategy in COORDINATED:
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        iterator = iter(coordinator.create_per_worker_dataset($per_worker))
        per_epoch = args.steps or int($per_worker_batches.cardinality())

        def epoch_steps():
            return coordinated_steps(coordinator, iterator, per_epoch)
    else:
        dist_dataset = $distribute

        def epoch_steps():
            return synchronous_steps(dist_dataset, args.steps)
    checkpoint = None
    if args.checkpoint:
        checkpoint = EpochCheckpoint(args.checkpoint, $checkpointed)
    first_epoch, step = checkpoint.restore() if checkpoint else (0, 0)
    if first_epoch and worker == 0:
        print(f"resumed from epoch {first_epoch} of {args.epochs} in {args.checkpoint}")
    metrics = None
    if args.metrics:   # under parameter_server the coordinator writes every worker's rows
        if args.strategy in COORDINATED:
            resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
            worker, workers = 0, resolver.cluster_spec().num_tasks("worker")
        metrics = StepWriter(args.metrics, worker=worker, workers=workers,
                             replicas=max(1, strategy.num_replicas_in_sync // workers),
                             strategy=args.strategy, loss_scale=$loss_scale)
    status = "failed"
    try:
        for epoch in range(first_epoch, args.epochs):
            last_loss = float("nan")
            steps = epoch_steps()
            for loss, per_replica_loss, per_replica_norm, ran_on, data_s, step_s in steps:
                last_loss = loss
                if metrics:
                    metrics.write(step, epoch, local_values(per_replica_loss),
                                  grad_norms=local_values(per_replica_norm),
                                  step_ms=step_s * 1e3, data_ms=data_s * 1e3, worker=ran_on)
                step += 1
            if checkpoint:
                checkpoint.save(epoch + 1, step)
            if worker == 0:
                print(f"epoch {epoch + 1}/{args.epochs}: loss {last_loss:.6g} ({step} steps)")
        status = "done"
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        if metrics:
            metrics.close(status)

$build_optimizers

train(args, $data)
'''

#: ``$keras`` when an exported cell calls Keras 3 ``fit``: under the strategies of several
#: processes the script runs tf_keras, or says what to install.
LEGACY_FOR_FIT = '''\
if args.strategy in MULTI_PROCESS and "TF_USE_LEGACY_KERAS" not in os.environ:
    # $cells $verb `fit`, which Keras 3 cannot run under MultiWorkerMirroredStrategy
    # (keras-team/keras#20585): run tf_keras as tf.keras, as nbdist's workers do
    if importlib.util.find_spec("tf_keras") is None:
        raise SystemExit(
            f"{__file__}: $cells $verb `fit`, which Keras 3 cannot run under "
            f"--strategy {args.strategy} (keras-team/keras#20585), and tf_keras, which "
            "nbdist's workers run instead, is not installed: install it where the job runs "
            "(pip install '$requirement', with --no-deps beside tensorflow-cpu), or "
            "train on one machine: --strategy mirrored.")
    os.environ["TF_USE_LEGACY_KERAS"] = "1"'''

#: Before ``$build_optimizers``' lines (``script._build_optimizers``).
BUILD_OPTIMIZERS = '''
# Keras 3 makes an optimizer's variables on its first step, which fails inside a tf.function
# under a strategy ("You must feed a value for placeholder tensor"): make them first.
with strategy.scope():
'''

#: What the template binds at module level besides modules: a cell must not rebind these.
TEMPLATE_NAMES = frozenset({
    "STRATEGIES", "COORDINATED", "MULTI_PROCESS", "DEFAULT_STRATEGY", "StepWriter",
    "parse_args", "local_devices", "make_strategy", "worker_index_and_count", "args",
    "step_fn", "train_step", "train_step_from", "EpochCheckpoint", "synchronous_steps",
    "coordinated_steps", "local_values", "train",
})
