"""``ParameterServerCluster``: what the Session holds for ``%distribute parameter_server``.

The kernel is the coordinator. Starting: N + P local ipyparallel engines (``LocalEngines``),
or with ``--cluster PROFILE`` the first N + P engines of a user's cluster (``ProfileEngines``:
reachable addresses, ports chosen on each engine's host; stop restarts those engines), each of
which starts one ``tf.distribute.Server`` (``ps_server.serve``) as ``worker i`` or
``ps i`` of a cluster on free ports of 127.0.0.1; then the kernel connects to them with
ParameterServerStrategy and a ClusterCoordinator (``ps_context.connect``). Scope-mode cells
run in the kernel under ``strategy.scope()`` (variables are created on the parameter
servers); step-mode cells are scheduled on the workers by ``ps_steps.PSStepLoop``. The
metrics are fetched by the coordinator itself, so no telemetry channel is needed. Defaults:
``--workers 2`` and ``--ps 1``.
"""

from __future__ import annotations

import gc
import signal
import time
from typing import Any

from ...backends.base import Backend, BackendStatus, refuse_keras_choice
from ...backends.cells import ScopeCell, StepCell, run_cell_code, step_inputs
from ...checkpoint import refuse_checkpoint_every
from ...errors import ConfigError
from ...families import check_served
from ...hooks.keras import atomic_variable_updates
from ...spec import StrategySpec
from ...step.cache import StepCache
from ...step.groups import refuse_grouped_steps
from ...telemetry.run import Run, RunList, RunObserver
from ...tflogs import native_stderr, worker_environment
from ...words import count
from ..engines import make as make_engines
from ..engines.base import START_TIMEOUT_S, ClusterStartError, EngineSet
from ..engines.enginelogs import keep as keep_log
from ..failures import ClusterError, WorkerError, build_error, controller_died_message
from ..inengine import ps_server
from ..lifecycle import ClusterLifecycle, live
from ..protocol import Outcome
from . import context as ps_context
from . import fit as ps_fit
from .faults import PSFaults
from .health import CLUSTER_STATE, TaskDied, TaskProcesses, job_name
from .rowbuffer import WorkerRows
from .stepfn import worker_positions
from .steps import COORDINATOR_LOGS, PSStepLoop, require_known_length, ring_capacity

DEFAULT_WORKERS = 2
DEFAULT_PS = 1
#: Seconds a stop waits for TensorFlow to log the removals it could not make (see ``stop``).
NOISE_DRAIN_S = 0.3
#: Said when a cluster starts with --partitioner.
KERAS3_PARTITIONER_NOTE = (
    "nbdist: note: Keras 3 layers and optimizers cannot train the ShardedVariables "
    "--partitioner makes (a step cell using one is refused); build the models to shard with "
    "tf_keras (`import tf_keras`; `python3 -m nbdist.install_tf_keras` installs it).")


class ParameterServerCluster(ClusterLifecycle, TaskProcesses, Backend):
    """Worker and parameter-server processes, with this kernel as their coordinator.

    The ``parameter_server`` backend (``nbdist.backends.base.Backend``).
    """

    exclusive = True

    def __init__(self, spec: StrategySpec, runs: RunList, shell: Any = None):
        check_served(spec.name, ParameterServerCluster)
        if spec.devices not in (None, 1):
            raise ConfigError(
                f"--devices {spec.devices}: under parameter_server each worker trains on one "
                "device of its own process (asynchronously, no replicas in sync). Use "
                "--workers N for N workers, or `mirrored --devices N` for N local devices."
            )
        ps_context.check_kernel_usable()
        self.spec = spec
        self.n = spec.workers or DEFAULT_WORKERS
        self.n_ps = spec.ps or DEFAULT_PS
        self.runs = runs
        self.cluster_spec: dict[str, list[str]] = {}
        self.info: dict[tuple[str, int], dict[str, Any]] = {}
        self.engines: EngineSet | None = None
        self.strategy: Any = None
        self.coordinator: Any = None
        self.broken: str | None = None
        self.dead_workers: set[int] = set()
        self.steps_by_worker: dict[int, int] = {}
        self.shell = shell
        self.traced_steps = StepCache()   # a re-run of a step cell reuses its trace
        self.rows: WorkerRows | None = None   # step rows wait on the workers (rowbuffer)
        self.positions: Any = None   # each worker's count of its steps (stepfn)
        self._atomic: Any = None   # hooks.keras.atomic_variable_updates while started
        self._logs: Any = None     # steps.COORDINATOR_LOGS.diverted() while started
        self.faults = PSFaults(lambda sig, w: self.signal_task(sig, "worker", w), self.n)

    @classmethod
    def create(cls, spec: StrategySpec, runs: RunList, shell: Any = None,
               keras: str | None = None) -> ParameterServerCluster:
        refuse_keras_choice(keras)
        return cls(spec, runs, shell)

    def serves(self, spec: StrategySpec, keras: str | None) -> bool:
        return spec == self.spec and keras is None

    def starting_message(self) -> str:
        return (f"nbdist: starting {count(self.n, 'worker')} and "
                f"{count(self.n_ps, 'parameter server')} as tf.distribute.Server processes; "
                "this kernel is their coordinator."
                + (f"\n{KERAS3_PARTITIONER_NOTE}" if self.spec.partitioner else ""))

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def tasks(self) -> list[tuple[str, int]]:
        return [("worker", i) for i in range(self.n)] + [("ps", i) for i in range(self.n_ps)]

    def start(self) -> None:
        env = worker_environment()
        n = len(self.tasks)   # with --cluster: worker i on engine i, then the ps tasks
        self.engines = engines = make_engines(
            self.spec.cluster, n, env, asked=f"--workers {self.n} --ps {self.n_ps} ({n} engines)",
            kernel_connects=True)   # the coordinator
        self._starting()
        try:
            engines.start()
            self._engines_started()
            engines.mark_used()
            addresses = engines.task_addresses()
            self.cluster_spec = {"worker": addresses[:self.n], "ps": addresses[self.n:]}
            self._serve()
            self._logs = COORDINATOR_LOGS.diverted()   # until stop: its threads log late
            self._logs.__enter__()
            with engines.kernel_server_network():   # the tasks reach it, no other host
                self.strategy, self.coordinator = ps_context.connect(self.cluster_spec,
                                                                     self.spec.partitioner)
            self._atomic = atomic_variable_updates()   # workers update metrics concurrently
            self._atomic.__enter__()
            self.engines.remember_processes()
        except BaseException:
            self.stop()
            raise

    def _serve(self) -> None:
        """Start one TensorFlow server per engine and wait for all of them."""
        assert self.engines is not None
        client = self.engines.client
        pending = {task: client[eid].apply_async(ps_server.serve, self.cluster_spec, *task)
                   for task, eid in zip(self.tasks, self.engines.ids, strict=True)}
        deadline = time.monotonic() + START_TIMEOUT_S
        outcomes: dict[tuple[str, int], Outcome] = {}
        for task, ar in pending.items():
            try:
                outcomes[task] = Outcome.of(ar.get(max(1.0, deadline - time.monotonic())))
            except Exception as err:
                outcomes[task] = Outcome(ok=False, error={
                    "type": getattr(err, "ename", type(err).__name__),
                    "message": str(getattr(err, "evalue", err)), "traceback": "",
                    "nbdist": False})
        failed = {i: o.error for i, (task, o) in enumerate(outcomes.items()) if not o.ok}
        if failed:
            first = min(failed)
            job, index = self.tasks[first]
            cause = build_error({first: failed[first]}, len(self.tasks))
            raise ClusterStartError(
                f"The {job_name(job)} {index} process could not start its TensorFlow server: "
                f"{cause}"
            ) from (cause if isinstance(cause, WorkerError) else None)
        self.info = {task: outcome.value for task, outcome in outcomes.items()}

    def stop(self) -> list[int]:
        """Detach the kernel, stop every process; return pids that had to be killed."""
        with native_stderr() as noise:
            killed = self._stop()
        if noise:   # e.g. "Failed to remove function remotely" for each dead task
            keep_log(f"TensorFlow, while the cluster stopped ({count(len(noise), 'line')}):\n"
                     + "\n".join(noise))
        return killed

    def _stop(self) -> list[int]:
        for job, index in self.tasks if self.engines is not None else ():
            if self.state(job, index) == "stopped":   # TensorFlow must let go of it first
                self.signal_task(signal.SIGCONT, job, index)
        # The traced steps are released and collected at once, while the processes still
        # run (and none is stopped: a removal from a stopped task would wait for it): their
        # functions are removed from the tasks now, where TensorFlow's errors for a dead task
        # land in the worker logs, not in a later cell.
        self.traced_steps.clear()
        gc.collect()
        self.rows = self.positions = None
        self.faults.forget()
        if self._atomic is not None:
            self._atomic.__exit__(None, None, None)
            self._atomic = None
        if self.coordinator is not None:
            ps_context.disconnect(self.coordinator, worker_died=bool(self.dead_workers))
            self.coordinator = self.strategy = None
        killed = self.engines.stop(quit_fn=ps_server.exit_soon) if self.engines is not None else []
        self.engines = None
        if self._logs is not None:
            self._logs.__exit__(None, None, None)
            self._logs = None
        self._stopped()
        time.sleep(NOISE_DRAIN_S)   # the failed removals' replies, logged from gRPC threads
        return killed

    def restarted(self) -> ParameterServerCluster:
        """Fresh processes and a fresh coordinator (after this one is stopped)."""
        self.stop()
        ps_context.check_kernel_usable()
        fresh = ParameterServerCluster(self.spec, self.runs, self.shell)
        fresh.start()
        return fresh

    def processes(self) -> list[Any]:
        """psutil Processes of the controller, engines and their children still running."""
        return self.engines.processes() if self.engines is not None else []

    # -- what the magics and the status show -----------------------------------------------
    @property
    def replicas(self) -> int:
        return self.n

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(f"/job:worker/replica:0/task:{i}/device:CPU:0" for i in range(self.n))

    def _usable(self) -> None:
        gone = self.controller_gone()
        if gone is not None and not self.broken:
            self.broken = "its ipyparallel controller died."
            raise TaskDied(controller_died_message(
                gone, " since the last cell, so this cell was not run", CLUSTER_STATE))
        if self.broken:
            raise ClusterError(f"The parameter-server cluster is unusable: {self.broken} Run "
                               "`%distribute restart` to start fresh processes.")
        if self.coordinator is None:
            raise ClusterError("The parameter-server cluster is stopped. Run `%distribute "
                               "restart`.")

    def inject(self, fault: str | None, worker: str | None, at_step: int | None,
               delay: float | None) -> str:
        """``%distribute inject``: the kernel signals the worker (``faults``)."""
        self._usable()
        return self.faults.inject(fault, worker, at_step, delay)

    def kernel_strategy(self) -> Any:
        return self.strategy

    def push(self, values: dict[str, Any]) -> None:
        raise ConfigError(_NO_PUSH)

    def pull(self, name: str, worker_index: int = 0, into: Any = None) -> Any:
        raise ConfigError(_NO_PUSH)

    def status(self) -> BackendStatus:
        from .status import backend_status

        return backend_status(self)

    # -- cells -----------------------------------------------------------------------------
    def _user_ns(self) -> dict[str, Any]:
        if self.shell is None:
            from IPython import get_ipython

            self.shell = get_ipython()
        return self.shell.user_ns

    def run_step_cell(self, cell: StepCell, observers: list[RunObserver]) -> Run:
        """Schedule the step on the workers (async) until --epochs/--steps are done."""
        refuse_grouped_steps(cell.spec, self.spec.name)
        refuse_checkpoint_every(cell.spec, self.spec.name)
        self._usable()
        user_ns = self._user_ns()
        # the checkpoint is saved from here, the coordinator: it reads the PS variables
        inputs = step_inputs(cell, self.strategy, user_ns, 1, coordinator=self.coordinator)
        require_known_length(cell.spec.data, inputs.per_epoch)   # before any Run exists
        if self.rows is None:
            self.rows = WorkerRows(self.strategy, self.n, ring_capacity(self.n))
        if self.positions is None:
            self.positions = worker_positions(self.strategy, self.coordinator)
        run = self.runs.new(mode="step", strategy=self.spec.name, replicas=1,
                            workers=self.n, devices=self.devices, epochs=cell.spec.epochs)
        loop = PSStepLoop(cell.source, user_ns, cell.spec, run,
                          observers=[*observers, self.faults.observer()],
                          checkpoint=inputs.checkpoint, dataset=inputs.dataset,
                          strategy=self.strategy, coordinator=self.coordinator,
                          workers=self.n, watch=self, per_epoch=inputs.per_epoch,
                          epoch_note=inputs.note, on_worker_death=self.dead_workers.add,
                          cache=self.traced_steps, rows=self.rows, positions=self.positions,
                          precise=lambda: bool(self.faults.pending))
        try:
            loop.execute()
            if loop.same_input is not None:   # on the Run already; said here too, at the end
                print(f"nbdist: {loop.same_input}")
            return run
        except ClusterError as err:
            self.broken = str(err).split(": ")[0] + "."
            raise
        finally:
            for worker, count in run.metrics.groupby("worker").size().items():
                self.steps_by_worker[int(worker)] = (self.steps_by_worker.get(int(worker), 0)
                                                     + int(count))

    def run_scope_cell(self, cell: ScopeCell, observers: list[RunObserver]) -> Any:
        """Run the cell in the kernel under ``strategy.scope()``: variables it creates live
        on the parameter servers. A tf_keras ``model.fit`` in it trains on the workers and
        records into a Run; Keras 3 ``model.fit`` is refused with the way out (ps_fit)."""
        self._usable()
        self._user_ns()
        fits = None
        checkpoint = cell.spec.checkpoint
        if checkpoint:   # tf_keras' BackupAndRestore, saved from here (the coordinator)
            from ...checkpoint import FitCheckpoint

            fits = FitCheckpoint(checkpoint, say=print)

        def new_run() -> Run:
            return self.runs.new(mode="fit", strategy=self.spec.name, replicas=1,
                                 workers=self.n, devices=self.devices)

        started = len(self.runs)
        with self.strategy.scope(), ps_fit.recording_fits(
                new_run, [*observers, self.faults.observer()], self,
                extra_callbacks=fits.callbacks if fits else None):
            result = run_cell_code(self.shell, f"# {cell.header}\n{cell.text}")
        if fits is not None and len(self.runs) == started:
            from ...checkpoint import NOTHING_TRAINED

            print(NOTHING_TRAINED.format(dir=checkpoint))
        return result


_NO_PUSH = ("push/pull move values to worker processes that run Python cells (multiworker). "
            "Under parameter_server the workers only run TensorFlow functions the kernel "
            "sends them, and every cell runs in the kernel: use your variables directly.")


def live_ps_clusters() -> list[ParameterServerCluster]:
    """Clusters of this process that are not stopped (tests check none is left)."""
    return live(ParameterServerCluster)
