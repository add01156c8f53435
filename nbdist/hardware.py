"""What this machine can run, found without initialising TensorFlow's devices.

``tf.config.list_physical_devices`` does not initialise devices (so the CPU can still be split
afterwards); GPU memory comes from ``nvidia-smi``; a TPU is recognised by the environment a
TPU VM or Colab sets up; cluster profiles are IPython profile directories.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import subprocess
from dataclasses import dataclass

from .errors import ConfigError
from .families import NEEDS_IPYPARALLEL, NEEDS_TPU, families
from .words import count


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_mib: int | None = None


@dataclass(frozen=True)
class Hardware:
    gpus: tuple[Gpu, ...] = ()
    tpu: str | None = None                # where a TPU was found, or None
    cpu_cores: int = 1
    profiles: tuple[str, ...] = ()        # IPython/ipyparallel profiles
    ipyparallel: bool = False             # can worker processes be started?

    def lacking(self) -> dict[str, str]:
        """What a family can need (``Family.needs``) that this machine lacks -> why."""
        why: dict[str, str] = {}
        if self.tpu is None:
            why[NEEDS_TPU] = ("no TPU found (no TPU_NAME or COLAB_TPU_ADDR, no /dev/accel* "
                              "device); TPUs are on Cloud TPU VMs and Colab")
        if not self.ipyparallel:
            why[NEEDS_IPYPARALLEL] = "needs worker processes: install ipyparallel"
        return why

    def unavailable(self) -> dict[str, str]:
        """Strategy name -> why it cannot run here (absent when it can)."""
        lacking = self.lacking()
        why: dict[str, str] = {}
        for fam in families():
            missing = [lacking[n] for n in fam.needs if n in lacking]
            if missing:
                why[fam.name] = missing[0]
        return why


#: What one worker process holds: TensorFlow alone is ~0.5 GB of resident memory.
WORKER_BYTES = 512 * 2**20
#: Local worker processes a core can sensibly share (they mostly wait on each other).
WORKERS_PER_CORE = 4


def local_process_limit() -> tuple[int, int, int]:
    """(the most local worker processes this machine can hold, its cores, its memory in
    bytes): ``WORKERS_PER_CORE`` per core, and no more than its memory holds."""
    import psutil

    cores = os.cpu_count() or 1
    memory = psutil.virtual_memory().total
    return max(2, min(WORKERS_PER_CORE * cores, memory // WORKER_BYTES)), cores, memory


def check_local_processes(workers: int, ps: int = 0) -> None:
    """Refuse, before anything starts, more local worker (and parameter-server) processes
    than this machine can hold, with the numbers."""
    asked = workers + ps
    limit, cores, memory = local_process_limit()
    if asked <= limit:
        return
    flags = f"--workers {workers}" + (f" --ps {ps}" if ps else "")
    raise ConfigError(
        f"`{flags}` would start {asked} worker processes on this machine, which has "
        f"{count(cores, 'CPU core')} and {memory / 2**30:.1f} GB of memory: each "
        f"runs its own TensorFlow (about {WORKER_BYTES / 2**30:.1f} GB), so it holds at most "
        f"{limit} ({WORKERS_PER_CORE} per core, as its memory allows). Ask for {limit} or "
        "fewer, or add `--cluster PROFILE` to run the workers on the engines of an "
        "ipyparallel cluster (SSH, MPI, Slurm...).")


def detect() -> Hardware:
    """Look at the machine; cheap enough to call whenever the picker opens."""
    return Hardware(
        gpus=_gpus(), tpu=_tpu(), cpu_cores=os.cpu_count() or 1, profiles=_profiles(),
        ipyparallel=importlib.util.find_spec("ipyparallel") is not None,
    )


def _gpus() -> tuple[Gpu, ...]:
    import tensorflow as tf

    physical = tf.config.list_physical_devices("GPU")
    memory = _nvidia_smi_memory()
    return tuple(Gpu(d.name, memory[i] if i < len(memory) else None)
                 for i, d in enumerate(physical))


def _nvidia_smi_memory() -> list[int]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [int(v) for v in out.split() if v.strip().isdigit()]


def _tpu() -> str | None:
    for var in ("TPU_NAME", "COLAB_TPU_ADDR", "TPU_ACCELERATOR_TYPE"):
        if os.environ.get(var):
            return f"${var}={os.environ[var]}"
    accel = sorted(glob.glob("/dev/accel*"))
    return accel[0] if accel else None


def _profiles() -> tuple[str, ...]:
    from IPython.core.profileapp import list_profiles_in
    from IPython.paths import get_ipython_dir

    try:
        return tuple(sorted(list_profiles_in(get_ipython_dir())))
    except OSError:
        return ()
