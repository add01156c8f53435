"""One descriptor per strategy family: everything nbdist knows about a strategy by its name.

``%distribute mirrored --devices 4`` names a family. Its ``Family`` says which flags it takes
and how they are checked, whether it runs in this kernel or on worker processes, its row of
the strategy table, what the picker offers for it, the TensorFlow it prints, how it builds its
tf.distribute strategy, its part of an exported script, its backend class and what the
dashboard shows of its runs. The spec, the picker, the hardware check, the factory, the
backends, the export and the dashboard read the descriptor; none of them compares names.

Code is referenced as ``"module:attribute"`` text and imported when first used, so this module
(like ``import nbdist``) loads no TensorFlow. A new family is one ``register_family(Family(...))``
and, if no existing backend runs it, one backend module (``nbdist.backends.base.Backend``).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

#: Where a family's training runs.
KERNEL, WORKERS = "kernel", "workers"

#: What a family can need of the machine; ``hardware.Hardware.unavailable`` says which is
#: missing.
NEEDS_TPU, NEEDS_IPYPARALLEL = "tpu", "ipyparallel"


@dataclass(frozen=True)
class ScriptPieces:
    """A family's part of the script ``%distribute export`` writes (``export.template``).

    ``make``: the body of the script's ``make_strategy(name, devices)`` for this family,
    indented from column 0, ending in a ``return`` of the strategy (``local_devices(devices)``
    gives the local devices). ``coordinated``: a ``ClusterCoordinator`` schedules the steps
    (else every replica takes its slice of each batch). ``launch``: the flags of
    ``python -m nbdist.launch`` for a local job of this family, or None when it runs as one
    process (the export then suggests the first family that has them).
    """

    make: str
    coordinated: bool = False
    launch: str | None = None


@dataclass(frozen=True)
class Family:
    """A strategy family, as users name it and as nbdist runs it.

    ``flags``: the placement flags ``StrategySpec`` accepts (``spec.PLACEMENT_FLAGS``);
    ``max_devices``: the most ``--devices`` allows; ``flag_errors``: (flag, message) for a flag
    this family refuses (or allows too many of), formatted with the spec's fields; a flag
    without one gets ``StrategySpec``'s general message. ``picker``: the controls the picker
    fills for it; ``gpu_devices_only``: ``--devices`` counts GPUs per worker, so without GPUs
    the picker leaves it out (TensorFlow gives each CPU worker one device).

    ``kernel_devices``: its replicas are this kernel's devices (GPUs, or the CPU split into
    logical devices, which TensorFlow allows only before its first op).
    ``fit_loss_unreliable``: Keras 3 ``model.fit`` reports a wrong per-batch loss under it
    (variables held centrally on the host), so recorded fits keep Keras' number aside.
    ``needs``: what the machine must have (``NEEDS_TPU``, ``NEEDS_IPYPARALLEL``).
    ``no_allreduce``: why its runs have no all-reduce panel on the dashboard (None: its
    replicas all-reduce their gradients).

    ``backend`` ("module:Class"), ``build`` ("module:function", called as
    ``build(spec, collective_timeout=...)`` -> ``strategies.StrategyHandle`` in the process
    that trains) and ``code`` ("module:function", called as ``code(spec, devices, preamble)``
    -> the lines of the equivalent TensorFlow, ``preamble`` being the import and CPU split
    every program starts with) are imported when used. ``script``: its part of an exported
    script, or None with ``no_script`` saying why it cannot be exported. ``no_elastic``: why
    its step cells take no ``--elastic`` (empty: they do, the backend restarts its workers).
    """

    name: str
    tf_class: str
    scope: str
    gradient_sync: str
    use_case: str
    runs_in: str
    backend: str
    build: str
    code: str
    flags: tuple[str, ...]
    max_devices: int | None = None
    flag_errors: tuple[tuple[str, str], ...] = ()
    picker: tuple[str, ...] = ()
    gpu_devices_only: bool = False
    kernel_devices: bool = False
    fit_loss_unreliable: bool = False
    needs: tuple[str, ...] = ()
    no_allreduce: str | None = None
    script: ScriptPieces | None = None
    no_script: str = ""
    no_elastic: str = ("it trains inside this kernel, so there is no worker process whose "
                       "death a restart could recover from")

    def __post_init__(self) -> None:
        if self.runs_in not in (KERNEL, WORKERS):
            raise ValueError(f"Family {self.name!r}: runs_in must be {KERNEL!r} or "
                             f"{WORKERS!r}, not {self.runs_in!r}.")

    @property
    def in_kernel(self) -> bool:
        return self.runs_in == KERNEL

    def flag_error(self, flag: str) -> str | None:
        """This family's own message for ``--flag`` refused (None: the general one)."""
        return dict(self.flag_errors).get(flag)

    def picker_flags(self, gpus: int) -> tuple[str, ...]:
        """The controls the picker fills for this family on a machine with ``gpus`` GPUs."""
        if self.gpu_devices_only and not gpus:
            return tuple(f for f in self.picker if f != "devices")
        return self.picker

    def backend_class(self) -> Any:
        return _load(self.backend)

    def builder(self) -> Any:
        return _load(self.build)

    def code_writer(self) -> Any:
        return _load(self.code)


def _load(reference: str) -> Any:
    module, _, attribute = reference.partition(":")
    return getattr(importlib.import_module(module), attribute)


# -- the registry -------------------------------------------------------------------------

_S = "nbdist.strategies"
_LOCAL = "nbdist.backends.local:LocalBackend"

#: name -> family, in the order the picker, the docs and the help show them.
FAMILIES: dict[str, Family] = {}

#: The family the picker selects when the kernel has none (and the machine can run it).
DEFAULT_FAMILY = "mirrored"


def register_family(family: Family, *, replace: bool = False) -> Family:
    """Add ``family`` after the others (the picker and the table show it last)."""
    if family.name in FAMILIES and not replace:
        raise ValueError(f"A strategy family {family.name!r} is registered already.")
    if not family.name.isidentifier():
        raise ValueError(f"{family.name!r}: a family's name is the word users type after "
                         "%distribute, a Python identifier.")
    FAMILIES[family.name] = family
    return family


def unregister_family(name: str) -> None:
    FAMILIES.pop(name, None)


def families() -> tuple[Family, ...]:
    return tuple(FAMILIES.values())


def find_family(name: str | None) -> Family | None:
    """The family called ``name``, or None (a Run loaded from a file may name any)."""
    return FAMILIES.get(name) if name is not None else None


def family(name: str) -> Family:
    """The family called ``name``; a ConfigError with the closest name for anything else."""
    found = FAMILIES.get(name)
    if found is None:
        raise ConfigError(suggest_strategy(name))
    return found


def suggest_strategy(name: str) -> str:
    """Return the error text for an unknown strategy name, with the closest known name."""
    names = tuple(FAMILIES)
    close = difflib.get_close_matches(name.lower().replace("-", "_"), names, n=1)
    hint = f" Did you mean `{close[0]}`?" if close else ""
    return (
        f"Unknown strategy {name!r}.{hint} Choose one of: {', '.join(names)} "
        f"(for example `%distribute {DEFAULT_FAMILY} --devices 2`)."
    )


def tf_class_names() -> frozenset[str]:
    """The class names of the registered families' TensorFlow strategies
    (``MirroredStrategy``...), as code that builds one spells its last part."""
    return frozenset(f.tf_class.rsplit(".", 1)[-1] for f in FAMILIES.values())


def family_of_tf_class(class_name: str) -> Family | None:
    """The family whose TensorFlow strategy class is called ``class_name`` (however it was
    imported: ``tf.distribute.X``, ``tf.distribute.experimental.X``, ``from ... import X``),
    or None."""
    return next((f for f in FAMILIES.values()
                 if f.tf_class.rsplit(".", 1)[-1] == class_name), None)


def taking(flag: str) -> tuple[str, ...]:
    """The names of the families that take ``--flag``."""
    return tuple(f.name for f in FAMILIES.values() if flag in f.flags)


def served_by(backend: type) -> tuple[str, ...]:
    """The names of the families whose backend is ``backend``."""
    reference = f"{backend.__module__}:{backend.__qualname__}"
    return tuple(f.name for f in FAMILIES.values() if f.backend == reference)


def check_served(name: str, backend: type) -> None:
    """Refuse to make ``backend`` for a family it does not run."""
    served = served_by(backend)
    if name not in served:
        raise ConfigError(f"{backend.__name__} runs {either(served)}, not `{name}`.")


def either(names: Sequence[str]) -> str:
    """Names as a sentence offers them: `a`; `a` or `b`; `a`, `b` or `c`."""
    quoted = [f"`{n}`" for n in names]
    return " or ".join([", ".join(quoted[:-1]), quoted[-1]] if len(quoted) > 1 else quoted)


class _Names(Sequence[str]):
    """The registered names, read when used (a family registered later is in it)."""

    def __getitem__(self, index: Any) -> Any:
        return tuple(FAMILIES)[index]

    def __len__(self) -> int:
        return len(FAMILIES)

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(FAMILIES))

    def __contains__(self, name: object) -> bool:
        return name in FAMILIES

    def __eq__(self, other: object) -> bool:
        return tuple(self) == (tuple(other) if isinstance(other, Sequence) else other)

    __hash__ = None   # type: ignore[assignment]   # it changes with the registry

    def __repr__(self) -> str:
        return repr(tuple(FAMILIES))


#: One name per strategy, used by the flag, the picker, the registry and the docs.
STRATEGY_NAMES: Sequence[str] = _Names()

_PS_SERVE = '''\
resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
if resolver.task_type in ("worker", "ps"):   # serve the coordinator until it is done
    tf.distribute.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                         task_index=resolver.task_id,
                         protocol=resolver.rpc_layer or "grpc", start=True).join()
return tf.distribute.ParameterServerStrategy(resolver)'''

for _family in (
    Family(
        "one_device", "tf.distribute.OneDeviceStrategy",
        "One device", "None (a single replica)", "Debugging; the same code without distribution",
        KERNEL, _LOCAL, f"{_S}:build_one_device", f"{_S}:one_device_code",
        flags=("devices",), max_devices=1,
        flag_errors=(("devices", "one_device runs on exactly one device, but --devices "
                                 "{devices} was given. Drop --devices, or use `mirrored` to "
                                 "train on several devices."),),
        kernel_devices=True,
        script=ScriptPieces("return tf.distribute.OneDeviceStrategy(local_devices(devices)[0])"),
    ),
    Family(
        "mirrored", "tf.distribute.MirroredStrategy",
        "Single machine, multiple GPUs", "NCCL AllReduce (GPU-to-GPU)",
        "Most common GPU training setup",
        KERNEL, _LOCAL, f"{_S}:build_mirrored", f"{_S}:mirrored_code",
        flags=("devices",), picker=("devices",), kernel_devices=True,
        script=ScriptPieces("return tf.distribute.MirroredStrategy(local_devices(devices))"),
    ),
    Family(
        "central_storage", "tf.distribute.experimental.CentralStorageStrategy",
        "Single machine", "Central CPU storage", "When GPU memory is limited",
        KERNEL, _LOCAL, f"{_S}:build_central_storage", f"{_S}:central_storage_code",
        flags=("devices",), picker=("devices",), kernel_devices=True, fit_loss_unreliable=True,
        script=ScriptPieces("return tf.distribute.experimental.CentralStorageStrategy("
                            "local_devices(devices))"),
    ),
    Family(
        "multiworker", "tf.distribute.MultiWorkerMirroredStrategy",
        "Multiple machines", "gRPC + CollectiveOps", "Scale beyond single machine",
        WORKERS, "nbdist.cluster.multiworker.backend:MultiWorkerCluster",
        f"{_S}:build_multiworker", f"{_S}:multiworker_code",
        flags=("devices", "workers", "cluster"), picker=("devices", "workers", "cluster"),
        gpu_devices_only=True, needs=(NEEDS_IPYPARALLEL,), no_elastic="",
        script=ScriptPieces("# the cluster and this process's task come from TF_CONFIG\n"
                            "return tf.distribute.MultiWorkerMirroredStrategy()",
                            launch="--workers 2"),
    ),
    Family(
        "parameter_server", "tf.distribute.ParameterServerStrategy",
        "Multiple machines", "Push/pull to PS", "Large embedding layers (recommender systems)",
        WORKERS, "nbdist.cluster.paramserver.backend:ParameterServerCluster",
        f"{_S}:build_parameter_server", f"{_S}:parameter_server_code",
        flags=("devices", "workers", "ps", "cluster", "partitioner"),
        picker=("workers", "ps", "cluster"), needs=(NEEDS_IPYPARALLEL,),
        no_allreduce="parameter servers apply each worker's gradients",
        no_elastic=("nbdist does not yet restart its workers and parameter servers after "
                    "one dies"),
        script=ScriptPieces(_PS_SERVE, coordinated=True, launch="--workers 2 --ps 1"),
    ),
    Family(
        "tpu", "tf.distribute.TPUStrategy",
        "Single TPU pod", "Mesh AllReduce via XLA", "Google TPU training",
        KERNEL, _LOCAL, f"{_S}:build_tpu", f"{_S}:tpu_code",
        flags=("tpu",), picker=("tpu",), needs=(NEEDS_TPU,),
        flag_errors=(("devices", "`tpu` uses every core of the TPU it connects to; drop "
                                 "--devices."),),
        no_script="a TPU job needs its own TPUClusterResolver address",
    ),
):
    register_family(_family)
