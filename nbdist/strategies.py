"""Build a tf.distribute strategy from a StrategySpec, on devices that really exist.

MirroredStrategy does not check its devices: asked for 4 replicas when only CPU:0 exists it
reports 4 replicas and hangs forever at the first collective. So every builder here first makes
the devices exist (GPUs, or the CPU split into logical devices) and then checks them.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError, DeviceError
from .families import DEFAULT_FAMILY
from .hooks.tensorflow import set_collective_key_base
from .spec import StrategySpec
from .words import count as counted

TPU_PROBE_TIMEOUT_S = 60.0

# Every MirroredStrategy numbers its collective groups and instances from the same start, and
# TensorFlow's runtime remembers the collectives a process has run: a second strategy in the
# same kernel (after `%distribute stop`, or with another device count) then fails with "Shape
# mismatch in the collective instance" or "joining a group with size 3, but that group has size
# 2". TensorFlow offers an offset for this (private, used by its own tests: see
# hooks.tensorflow.set_collective_key_base); each strategy nbdist builds gets a fresh range.
_KEY_STRIDE = 100_000
_strategies_built = 0


def _fresh_collective_keys(strategy_class: Any) -> None:
    global _strategies_built
    _strategies_built += 1
    set_collective_key_base(strategy_class, _strategies_built * _KEY_STRIDE)

MULTIWORKER_CPU_DEVICES = (
    "--devices {devices}: on CPUs MultiWorkerMirroredStrategy uses one device per worker "
    "(it ignores logical CPU devices). Use `--workers N` for N replicas, or `mirrored "
    "--devices N` for N logical devices in the kernel."
)

TOO_LATE = (
    "TensorFlow has already initialised its devices in this kernel with {have}, "
    "so it cannot split the CPU into {want} logical devices any more (TensorFlow allows that "
    "only before the first tensor, model or device query). Restart the kernel and run "
    "`%distribute {name} --devices {want}` before any other TensorFlow code, or use "
    "--devices {have} or fewer."
)


@dataclass(frozen=True)
class StrategyHandle:
    """A built strategy and what it runs on."""

    spec: StrategySpec
    strategy: Any                   # tf.distribute.Strategy
    devices: tuple[str, ...]
    device_kind: str                # "GPU", "CPU" (possibly logical) or "TPU"

    @property
    def replicas(self) -> int:
        return int(self.strategy.num_replicas_in_sync)

    def equivalent_code(self) -> str:
        """The hand-written TensorFlow that builds the same strategy."""
        return equivalent_code(self.spec, self.devices, self.device_kind)


def equivalent_code(spec: StrategySpec, devices: tuple[str, ...], device_kind: str) -> str:
    """The hand-written TensorFlow that builds the strategy ``spec`` describes (its family's
    ``code`` writes the part after the import and the CPU split)."""
    lines = ["import tensorflow as tf"]
    if device_kind == "CPU" and len(devices) > 1:
        lines += [
            'cpu = tf.config.list_physical_devices("CPU")[0]',
            "tf.config.set_logical_device_configuration(",
            f"    cpu, [tf.config.LogicalDeviceConfiguration()] * {len(devices)})",
        ]
    return "\n".join(spec.family.code_writer()(spec, devices, lines))


# -- each family's equivalent TensorFlow (``Family.code``) ---------------------------------

def one_device_code(spec: StrategySpec, devices: tuple[str, ...], preamble: list[str]
                    ) -> list[str]:
    return [*preamble, f'strategy = tf.distribute.OneDeviceStrategy("{devices[0]}")']


def _device_list(devices: tuple[str, ...]) -> str:
    return ", ".join(f'"{d}"' for d in devices)


def mirrored_code(spec: StrategySpec, devices: tuple[str, ...], preamble: list[str]
                  ) -> list[str]:
    return [*preamble, f"strategy = tf.distribute.MirroredStrategy([{_device_list(devices)}])"]


def central_storage_code(spec: StrategySpec, devices: tuple[str, ...], preamble: list[str]
                         ) -> list[str]:
    return [*preamble, "strategy = tf.distribute.experimental.CentralStorageStrategy("
                       f"[{_device_list(devices)}])"]


def tpu_code(spec: StrategySpec, devices: tuple[str, ...], preamble: list[str]) -> list[str]:
    return [
        *preamble,
        f"resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu={spec.tpu!r})",
        "tf.config.experimental_connect_to_cluster(resolver)",
        "tf.tpu.experimental.initialize_tpu_system(resolver)",
        "strategy = tf.distribute.TPUStrategy(resolver)",
    ]


def _tf_config_code(cluster: dict[str, list[str]], preamble: list[str]) -> list[str]:
    """A local cluster's TF_CONFIG, as each worker process gets it."""
    return [
        "import json, os", *preamble,
        f"cluster = {cluster!r}",
        "# in worker i's process (nbdist starts one process per worker and sets this):",
        'os.environ["TF_CONFIG"] = json.dumps('
        '{"cluster": cluster, "task": {"type": "worker", "index": i}})',
    ]


def _local_workers(spec: StrategySpec) -> list[str]:
    return [f"127.0.0.1:{20000 + i}" for i in range(spec.workers or 2)]


def multiworker_code(spec: StrategySpec, devices: tuple[str, ...], preamble: list[str]
                     ) -> list[str]:
    return [*_tf_config_code({"worker": _local_workers(spec)}, preamble),
            "strategy = tf.distribute.MultiWorkerMirroredStrategy()"]


def parameter_server_code(spec: StrategySpec, devices: tuple[str, ...], preamble: list[str]
                          ) -> list[str]:
    cluster = {"worker": _local_workers(spec),
               "ps": [f"127.0.0.1:{21000 + i}" for i in range(spec.ps or 1)]}
    return [
        *_tf_config_code(cluster, preamble),
        "# in the coordinator (the notebook's kernel):",
        "resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()",
        "strategy = tf.distribute.ParameterServerStrategy(resolver)",
        "coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)",
    ]


# -- each family's strategy (``Family.build``) ---------------------------------------------

def build_strategy(spec: StrategySpec, *, collective_timeout: float | None = None
                   ) -> StrategyHandle:
    """Create the strategy ``spec`` asks for, or raise a ConfigError/DeviceError.

    ``multiworker`` is built only inside a worker process (``nbdist.cluster`` sets its
    TF_CONFIG); ``collective_timeout`` bounds each of its collectives (seconds; None: no bound).
    """
    return spec.family.builder()(spec, collective_timeout=collective_timeout)


def build_one_device(spec: StrategySpec, collective_timeout: float | None = None
                     ) -> StrategyHandle:
    import tensorflow as tf

    devices, kind = ensure_local_devices(spec.devices, spec.name)
    return StrategyHandle(spec, tf.distribute.OneDeviceStrategy(devices[0]), devices, kind)


def build_mirrored(spec: StrategySpec, collective_timeout: float | None = None
                   ) -> StrategyHandle:
    import tensorflow as tf

    devices, kind = ensure_local_devices(spec.devices, spec.name)
    _fresh_collective_keys(tf.distribute.MirroredStrategy)
    return StrategyHandle(spec, tf.distribute.MirroredStrategy(list(devices)), devices, kind)


def build_central_storage(spec: StrategySpec, collective_timeout: float | None = None
                          ) -> StrategyHandle:
    import tensorflow as tf

    devices, kind = ensure_local_devices(spec.devices, spec.name)
    strategy = tf.distribute.experimental.CentralStorageStrategy(list(devices))
    return StrategyHandle(spec, strategy, devices, kind)


def build_parameter_server(spec: StrategySpec, collective_timeout: float | None = None
                           ) -> StrategyHandle:
    """Refuse: the strategy is made by the kernel as coordinator of the processes its
    backend starts (``nbdist.cluster.paramserver``), never on its own."""
    raise ConfigError(
        "ParameterServerStrategy needs its worker and parameter-server processes: use "
        "`%distribute parameter_server --workers N --ps P`, which starts them and makes "
        "this kernel their coordinator (nbdist.cluster.paramserver.backend)."
    )


def build_multiworker(spec: StrategySpec, collective_timeout: float | None = None
                      ) -> StrategyHandle:
    """MultiWorkerMirroredStrategy for this worker process, from its TF_CONFIG.

    TensorFlow allows it only before any other op of the process ("Collective ops must be
    configured at program startup"), so it is built in fresh worker processes, never in the
    kernel. On CPUs it uses one device per worker (TensorFlow ignores logical CPU devices
    here); with GPUs, worker i of a local cluster takes GPUs i*D..i*D+D-1.
    """
    import json
    import os

    import tensorflow as tf

    config = os.environ.get("TF_CONFIG")
    if not config:
        raise ConfigError(
            "MultiWorkerMirroredStrategy runs in worker processes, and this process has no "
            "TF_CONFIG. Use `%distribute multiworker --workers N`: nbdist starts the workers "
            "and gives each its TF_CONFIG."
        )
    gpus = physical_gpus()
    if gpus and spec.devices:
        index = json.loads(config)["task"]["index"]
        mine = gpus[index * spec.devices:(index + 1) * spec.devices]
        if len(mine) < spec.devices:
            raise DeviceError(
                f"--devices {spec.devices} per worker needs {spec.devices} GPUs for worker "
                f"{index}, but this machine has {len(gpus)} in all. Use fewer --devices or "
                "--workers."
            )
        tf.config.set_visible_devices(mine, "GPU")
    elif not gpus and spec.devices not in (None, 1):
        raise ConfigError(MULTIWORKER_CPU_DEVICES.format(devices=spec.devices))
    options = tf.distribute.experimental.CommunicationOptions(
        timeout_seconds=collective_timeout or None)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    devices = tuple(strategy.extended.worker_devices)
    return StrategyHandle(spec, strategy, devices, "GPU" if gpus else "CPU")


def physical_gpus() -> list[Any]:
    """The machine's GPUs (does not initialise TensorFlow's devices)."""
    import tensorflow as tf

    return list(tf.config.list_physical_devices("GPU"))


def ensure_local_devices(count: int | None, name: str = DEFAULT_FAMILY
                         ) -> tuple[tuple[str, ...], str]:
    """Return ``count`` local device names: GPUs if any, else logical CPU devices.

    ``count=None`` means every GPU, or one CPU. Splitting the CPU must happen before
    TensorFlow initialises its devices; an existing split with enough devices is reused.
    """
    import tensorflow as tf

    gpus = physical_gpus()
    if gpus:
        want = len(gpus) if count is None else count
        if want > len(gpus):
            raise DeviceError(
                f"--devices {want} asks for {want} GPUs but this machine has {len(gpus)}. "
                f"Use --devices {len(gpus)} or fewer (or omit --devices to use all of them)."
            )
        devices, kind = tuple(f"/device:GPU:{i}" for i in range(want)), "GPU"
    else:
        want = 1 if count is None else count
        cpu = tf.config.list_physical_devices("CPU")[0]
        current = tf.config.get_logical_device_configuration(cpu)
        if want > 1 and (current is None or len(current) < want):
            try:
                tf.config.set_logical_device_configuration(
                    cpu, [tf.config.LogicalDeviceConfiguration()] * want
                )
            except RuntimeError as err:
                have = len(tf.config.list_logical_devices("CPU"))
                raise DeviceError(TOO_LATE.format(have=counted(have, "CPU device"), want=want,
                                                   name=name)) from err
        devices, kind = tuple(f"/device:CPU:{i}" for i in range(want)), "CPU"
    # After parameter_server the kernel's own devices are named /job:chief/.../device:CPU:i.
    existing = {"/device:" + d.name.split("/device:")[-1]
                for d in tf.config.list_logical_devices(kind)}
    missing = [d for d in devices if d not in existing]
    if missing:
        raise DeviceError(
            f"TensorFlow does not see {', '.join(missing)} (it has {sorted(existing)}); a "
            "strategy over missing devices would hang at its first step. Use fewer --devices."
        )
    return devices, kind


# -- TPU -----------------------------------------------------------------------------------

_TPU_PROBE = """
import sys
import tensorflow as tf
address = sys.argv[1] or None
resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=address)
tf.config.experimental_connect_to_cluster(resolver)
tf.tpu.experimental.initialize_tpu_system(resolver)
print("NBDIST_TPU_OK", len(tf.config.list_logical_devices("TPU")))
"""


def probe_tpu(address: str | None, timeout: float | None = None) -> str | None:
    """Try to reach a TPU in a child process; return None if it worked, else the reason.

    TensorFlow hangs forever connecting to a ``grpc://`` address with no TPU behind it, so the
    attempt runs in a subprocess that is killed after ``timeout`` seconds.
    """
    timeout = TPU_PROBE_TIMEOUT_S if timeout is None else timeout
    try:
        done = subprocess.run(
            [sys.executable, "-c", _TPU_PROBE, address or ""],
            capture_output=True, text=True, timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return f"no answer from {address or 'the default TPU'} within {timeout:.0f} s"
    if done.returncode == 0 and "NBDIST_TPU_OK" in done.stdout:
        return None
    errors = [ln for ln in done.stderr.strip().splitlines() if "Error" in ln]
    return errors[-1].strip() if errors else f"the probe exited with code {done.returncode}"


def build_tpu(spec: StrategySpec, collective_timeout: float | None = None
              ) -> StrategyHandle:
    import tensorflow as tf

    reason = probe_tpu(spec.tpu)
    if reason is not None:
        raise DeviceError(
            f"No TPU could be reached ({reason}). TPUs exist on Cloud TPU VMs and Colab; give "
            "their address with `%distribute tpu --tpu ADDRESS` (or no --tpu on a TPU VM). To "
            "run the same code here, use `%distribute mirrored --devices N`."
        )
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=spec.tpu)
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    strategy = tf.distribute.TPUStrategy(resolver)
    devices = tuple(d.name for d in tf.config.list_logical_devices("TPU"))
    return StrategyHandle(spec, strategy, devices, "TPU")
