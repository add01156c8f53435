"""``MultiWorkerCluster``: the ``multiworker`` backend.

Starting it: engines (``engines.base.make``: N local ones with ``TF_USE_LEGACY_KERAS`` set
before any TensorFlow import, or a user's cluster for ``--cluster PROFILE``), a telemetry
channel where they can reach it (fresh HMAC key), ``compat.check_engines`` on each (TensorFlow
importable, same TensorFlow and nbdist versions as the kernel), then ``worker.setup`` on every
engine at once with its TF_CONFIG (ports free on each engine's host): each connects back to the
channel and creates MultiWorkerMirroredStrategy. Its collectives have no timeout of their own
(``COLLECTIVE_TIMEOUT_S``): the kernel ends a cell whose workers fail, die, hang or stall
(``dispatch``). Cells run on every worker through ``Dispatcher`` (``reach`` watches
workers on other hosts); ``stop`` kills local engines and restarts a user's."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from ...backends.base import Backend, BackendStatus
from ...backends.cells import ScopeCell, StepCell
from ...errors import ConfigError
from ...families import check_served
from ...fitrecord import BATCH_LOSS_LABEL
from ...spec import StrategySpec
from ...telemetry.channel import ChannelServer, new_key
from ...telemetry.lossform import remember_reduction
from ...telemetry.run import Restart, Run, RunList, RunObserver, RunWriter
from ...tflogs import worker_environment
from .. import injection, tfconfig
from ..compat import check_engines
from ..engines import make as make_engines
from ..engines.base import ClusterStartError, EngineSet
from ..failures import ClusterError, WorkerDied, WorkerError, build_error, died_starting
from ..inengine import cells, transfer, worker
from ..lifecycle import ClusterLifecycle, live
from ..protocol import FAULT_KINDS, Outcome
from .dispatch import Dispatcher
from .elastic import (
    ElasticGaveUp,
    Restarts,
    died_what,
    restart_note,
    restarting_line,
    restored_line,
)
from .journal import Journal, foreign_code, hub_task_ids
from .keras_choice import MIXED_KERAS, kernel_runs_keras3, resolve_keras
from .models import WorkerModel, into_kernel
from .monitor import ClusterMonitor
from .namespaces import pull_value, push_values
from .outcomes import FIT_NOTE, STEP_NOTE, WorkerValues, finish_runs
from .reach import ReachWatch, refuse_restart_while_lost, watch_remote

#: Default bound on each collective (seconds), None for none. TensorFlow times a bounded
#: collective on a thread of its own that sleeps for the whole timeout, whether the collective
#: ended or not: at tens of steps per second and two collectives a step, a bound of minutes
#: keeps thousands of threads alive on every worker until the process cannot start one more.
#: The kernel's dispatcher bounds every fault instead: a dead, hung, stuck or failed worker.
COLLECTIVE_TIMEOUT_S: float | None = None
#: After one worker's setup failed, seconds the others get before they are given up on.
SETUP_FAIL_FAST_S = 2.0


class MultiWorkerCluster(ClusterLifecycle, Backend):
    """N worker processes running MultiWorkerMirroredStrategy, driven from the kernel: the
    ``multiworker`` backend (``nbdist.backends.base.Backend``)."""

    exclusive = True

    def __init__(self, spec: StrategySpec, runs: RunList, keras: str = "auto",
                 collective_timeout: float | None = COLLECTIVE_TIMEOUT_S):
        check_served(spec.name, MultiWorkerCluster)
        if spec.devices is not None and spec.devices > 1:
            from ...strategies import MULTIWORKER_CPU_DEVICES, physical_gpus

            if not physical_gpus():   # imports TensorFlow here, but creates no device
                raise ConfigError(MULTIWORKER_CPU_DEVICES.format(devices=spec.devices))
        self.spec = spec
        # --cluster: the profile's engines (or the first --workers of them), known at start
        self.n = spec.workers or (0 if spec.cluster else 2)
        self.runs = runs
        self.keras_choice = keras
        self.keras, self.keras_note = resolve_keras(keras)
        self.collective_timeout = collective_timeout
        self.broken: str | None = None
        self.info: list[dict[str, Any]] = []
        self.engines: EngineSet | None = None
        self.channel: ChannelServer | None = None
        self.monitor = ClusterMonitor(self.n, self._send, self._new_fit_run)
        self.dispatcher: Dispatcher | None = None
        self.reach: ReachWatch | None = None   # the workers on other hosts, once started
        self._engine_pids: dict[int, int] = {}   # worker -> engine pid (from the preflight)
        self.journal = Journal()   # what built the workers' state (--elastic replays it)
        self._replaying = False    # fits the journal's cells run again make no Run
        self._rerun_at = 0.0       # when a step cell was called again after a restart

    @classmethod
    def create(cls, spec: StrategySpec, runs: RunList, shell: Any = None,
               keras: str | None = None) -> MultiWorkerCluster:
        return cls(spec, runs, keras=keras or "auto")

    def serves(self, spec: StrategySpec, keras: str | None) -> bool:
        return spec == self.spec and keras in (None, "auto", self.keras_choice)

    def starting_message(self) -> str:
        keras = "tf_keras" if self.keras == "legacy" else "Keras 3"
        what = (f"workers on the engines of ipyparallel profile {self.spec.cluster!r}"
                if self.spec.cluster else f"{self.n} worker processes")
        mixed = self.keras == "legacy" and kernel_runs_keras3()
        return (f"nbdist: starting {what}; they run {keras} as tf.keras ({self.keras_note}), "
                + ("this kernel Keras 3. " + MIXED_KERAS if mixed
                   else "this kernel keeps its own Keras."))

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        key = new_key()
        env = {"TF_USE_LEGACY_KERAS": "1" if self.keras == "legacy" else "0",
               **worker_environment()}
        # --cluster without --workers: n is 0 until the profile's engines are counted
        self.engines = engines = make_engines(self.spec.cluster, self.n or None, env)
        self._starting()
        try:
            engines.start()
            self._engines_started()
            if len(engines.ids) != self.n:   # --cluster: all of the profile's engines
                self.n = len(engines.ids)
                self.monitor = ClusterMonitor(self.n, self._send, self._new_fit_run)
            self.channel = ChannelServer(key, self.monitor.handle, host=engines.channel_host,
                                         workers=self.n)
            known = engines.pids   # watched from now: one dying as it imports TensorFlow
            self.dispatcher = Dispatcher(   # fails the start at once
                engines.client, engines.ids, self.monitor, self._signal,
                {w: known[e] for w, e in enumerate(engines.ids) if e in known},
                engines.controller_gone)
            engines.mark_used()
            self._engine_pids = check_engines(self.dispatcher, engines.ids, env,
                                              engines.restart_advice(self.spec.name))
            addresses = engines.task_addresses()
            # A user's engines outlive this kernel: they must not exit when it does.
            options = {"spec": self.spec.to_dict(), "channel": list(self.channel.address),
                       "key": key.hex(), "kernel_pid": os.getpid() if engines.owned else None,
                       "keras": self.keras, "collective_timeout": self.collective_timeout}
            outcomes, _ = self.dispatcher.call(
                worker.setup, [(i, self.n, tfconfig.tf_config(addresses, i), options)
                               for i in range(self.n)],
                quiet=True,   # TensorFlow's start-up lines are noise unless setup fails
                fail_fast=SETUP_FAIL_FAST_S)   # the others wait for a failed one forever
            failures = {w: o.error for w, o in outcomes.items() if o.error is not None}
            if failures:
                waiting = sorted(w for w, o in outcomes.items() if o.abandoned)
                engines.kill_blocked([self._engine_pids[w] for w in waiting
                                      if w in self._engine_pids])
                cause = build_error(failures, self.n, waiting)
                if isinstance(cause, WorkerError):   # e.g. TensorFlow missing on a worker
                    raise ClusterStartError(f"The worker processes could not set up "
                                            f"MultiWorkerMirroredStrategy: {cause}") from cause
                raise cause
            self.info = [outcomes[i].value for i in range(self.n)]
            self.dispatcher.reach = self.reach = watch_remote(engines, self.info)
            self.dispatcher.pids = {i: info["pid"] for i, info in enumerate(self.info)
                                    if engines.local[i]}
            engines.remember_processes()
            self.journal.hub_seen = hub_task_ids(engines.client)
        except WorkerDied as died:   # before the strategy existed: nothing to restart
            self.stop()
            raise died_starting(died, engines.restart_advice(self.spec.name)) from None
        except BaseException:
            self.stop()
            raise

    def stop(self) -> list[int]:
        """Stop every process and the channel; return pids that had to be killed.

        With --cluster nbdist kills nothing: the user's engines are restarted (see
        ``profile.ProfileEngines.stop``) and the controller keeps running.
        """
        killed: list[int] = []
        if self.engines is not None:
            killed = self.engines.stop(quit_fn=worker.exit_soon)
            self.engines = None
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        self.dispatcher = None
        self._stopped()
        return killed

    def restarted(self) -> MultiWorkerCluster:
        """A fresh cluster with the same settings (this one is stopped first)."""
        self.stop()
        refuse_restart_while_lost(self.reach)
        fresh = MultiWorkerCluster(self.spec, self.runs, self.keras_choice,
                                   self.collective_timeout)
        fresh.start()
        return fresh

    def _restart_in_place(self) -> None:
        """Fresh workers (same count and settings) in place of these, for ``--elastic``:
        the journal is kept, and so are the injected faults not applied yet."""
        pending = [e for e in self.monitor.injections if e.get("applied_step") is None
                   and FAULT_KINDS[e["fault"]].link is None]
        self.stop()
        refuse_restart_while_lost(self.reach)
        self.broken, self.info, self.reach = None, [], None
        self.monitor = ClusterMonitor(self.n, self._send, self._new_fit_run)
        self.start()
        for e in pending:
            injection.send(self._send, self.monitor.injections, e["fault"], e["worker"],
                           e["at_step"], e["delay"])

    def _replay(self) -> int:
        """The journal, run again on fresh workers, quietly; returns its entries."""
        def scope(args: tuple[Any, ...]) -> None:
            outcomes, interrupted = self._call(cells.run_scope, [args] * self.n, [],
                                               quiet=True)
            finish_runs(outcomes, interrupted, [], self.n)

        self._replaying = True
        try:
            return len(self.journal.replay(scope, lambda values: push_values(
                self._usable().client, self.engines.ids, values)))
        finally:
            self._replaying = False

    def processes(self) -> list[Any]:
        """psutil Processes of the controller, engines and their children still running."""
        return self.engines.processes() if self.engines is not None else []

    def _send(self, worker_index: int, message: dict[str, Any]) -> bool:
        return self.channel.send(worker_index, message) if self.channel else False

    def _signal(self, sig: int, workers: list[int] | None = None) -> None:
        """Signal every worker, or ``workers``, through ipyparallel (remote engines too)."""
        if self.engines is not None:
            ids = self.engines.ids
            self.engines.send_signal(sig, ids if workers is None else [ids[w] for w in workers])

    def inject(self, fault: str | None, worker_index: str | None, at_step: int | None,
               delay: float | None) -> str:
        """``%distribute inject``: a real fault, applied by the worker (``inengine.faults``)."""
        fault, index, delay = injection.check(fault, worker_index, self.n, at_step, delay)
        link = FAULT_KINDS[fault].link
        if link != "up":   # a link is healed even after its partition broke the cluster
            self._usable()
        if link is not None:   # the kernel changes the link (engines.links)
            return injection.links_fault(self.engines, self._send, self.monitor, fault, index,
                                         at_step)
        return injection.send(self._send, self.monitor.injections, fault, index, at_step, delay)

    def _usable(self) -> Dispatcher:
        if self.broken:
            raise ClusterError(f"The workers are unusable: {self.broken} Run `%distribute "
                               "restart` to start fresh workers.")
        if self.dispatcher is None:
            raise ClusterError("The workers are stopped. Run `%distribute restart`.")
        return self.dispatcher

    def _call(self, fn: Any, args: list[tuple[Any, ...]], observers: list[RunObserver],
              quiet: bool = False, elastic: bool = False
              ) -> tuple[dict[int, Outcome], bool]:
        """``elastic``: a worker's death leaves the Runs running (the cell restarts)."""
        dispatcher = self._usable()
        self.monitor.stopper.reset()
        try:
            outcomes, interrupted = dispatcher.call(fn, args, observers, quiet=quiet)
        except ClusterError as err:
            self.broken = str(err).split(": ")[0] + "."
            if elastic and isinstance(err, WorkerDied):
                raise
            for run in self.monitor.runs():
                if run.status == "running":
                    RunWriter(run).finish("failed", str(err))
            raise
        ended = sorted(w for w, o in outcomes.items() if o.abandoned)
        if ended:
            self.broken = (f"worker{'s' * (len(ended) > 1)} {', '.join(map(str, ended))} "
                           "waited in a collective for a worker whose cell failed, and "
                           f"{'were' if len(ended) > 1 else 'was'} ended.")
        return outcomes, interrupted

    # -- runs ------------------------------------------------------------------------------
    @property
    def worker_keras(self) -> str | None:
        return self.keras

    @property
    def replicas_local(self) -> int:
        return self.info[0].get("replicas_local", 1) if self.info else 1

    @property
    def replicas(self) -> int:
        return self.replicas_local * self.n

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(d for info in self.info for d in info.get("devices", []))

    def _new_run(self, mode: str) -> Run:
        run = self.runs.new(mode=mode, strategy=self.spec.name, replicas=self.replicas_local,
                            workers=self.n, devices=self.devices,
                            machines=tuple(str(info.get("machine")) for info in self.info))
        run.note(FIT_NOTE if mode == "fit" else STEP_NOTE)
        if mode == "fit":
            RunWriter(run).update(loss_label=BATCH_LOSS_LABEL)
        return run

    def _new_fit_run(self) -> Run:
        if self._replaying:   # a fit of a cell replayed on fresh workers: not a new Run
            return Run(id=0, mode="fit", strategy=self.spec.name, replicas=self.replicas_local,
                       workers=self.n)
        return self._new_run("fit")

    def run_step_cell(self, cell: StepCell, observers: list[RunObserver]) -> Run:
        """Step mode on every worker: each runs StepRunner; rows stream into one Run.

        Two calls: every worker first reads and checks its ``--data`` (``prepare_step``); the
        Run is created, and the workers train, only if all of them could. ``--elastic N``: a
        worker's death restarts the workers, replays the journal and calls the cell again
        (``elastic``), at most N times; the one Run goes on."""
        self._usable()
        key = f"step{cell.number}"
        spec = dataclasses.replace(cell.spec, show_code=False, strategy=None).to_dict()
        if cell.spec.elastic:
            self._refuse_unreplayable()
        restarts = Restarts(cell.spec.elastic or 0)
        held: list[Run] = []   # the cell's Run, once made
        while True:
            try:
                outcomes = self._step_call(cell, key, spec, observers, held, restarts)
                break
            except WorkerDied as died:
                # before the Run exists (a worker died since the last cell), or during it
                if not (cell.spec.elastic and (not held or held[0].status == "running")):
                    raise
                self._recover(held[0] if held else None, died, restarts, key)
            except BaseException as err:   # e.g. --data refused by fresh workers
                if held and held[0].status == "running":
                    RunWriter(held[0]).finish("failed", str(err))
                raise
        run = held[0]
        self._restored(run, key)
        first = outcomes[0].value or {}
        for note in first.get("notes", []):
            run.note(note)
        if first.get("bytes"):
            RunWriter(run).update(allreduce_bytes=first["bytes"])
        if run.steps_done:   # the workers traced the step: how its losses add up is known
            remember_reduction(cell.text, run.loss_scale)
        same = self.monitor.same_input(key)
        if same is not None:   # on the Run already; said here too, where the cell ends
            print(f"nbdist: {same}")
        return run

    def _step_call(self, cell: StepCell, key: str, spec: dict[str, Any],
                   observers: list[RunObserver], held: list[Run], restarts: Restarts
                   ) -> dict[int, Outcome]:
        """Prepare then run the step cell on the workers; ``held``: the cell's Run, made
        here on the first call (a call after a restart goes on with it)."""
        elastic = bool(cell.spec.elastic)
        self._rerun_at = time.monotonic()   # after a restart: where its restore_s starts
        outcomes, interrupted = self._call(
            cells.prepare_step, [(cell.text, cell.header, cell.filename, key, spec)] * self.n,
            observers, elastic=elastic)
        finish_runs(outcomes, interrupted, [], self.n)   # a refusal: raised, no Run made
        if not held:
            held.append(self._new_run("step"))
            # the restarts: any made before it existed, and later
            RunWriter(held[0]).update(epochs=cell.spec.epochs, restarts=restarts.records)
        run = held[0]
        self.monitor.expect_run(key, run, skip_below=run.steps_done)
        outcomes, interrupted = self._call(cells.run_step, [(key, cell.filename)] * self.n,
                                           observers, elastic=elastic)
        finish_runs(outcomes, interrupted, [run], self.n, self.monitor.stopper.requested)
        return outcomes

    def _refuse_unreplayable(self) -> None:
        """``--elastic``: refused before the cell runs when the workers' state could not be
        built again on fresh workers."""
        why = self.journal.refusal(foreign_code(self._usable().client, self.journal.hub_seen))
        if why is not None:
            raise ConfigError(
                f"--elastic: {why}. After a worker's death the fresh workers would miss that "
                "state, so the cell did not run. Run `%distribute restart`, build the state "
                "with `%%distribute` cells and `%distribute push` (nbdist replays those), "
                "then run this cell again; or drop --elastic.")

    def _recover(self, run: Run | None, died: WorkerDied, restarts: Restarts, key: str
                 ) -> None:
        """After ``died``: fresh workers, the journal replayed on them, the restart recorded
        (``restarts.records``: the Run's); ``ElasticGaveUp`` (the Run, if made, failed) when
        the cell may not go on."""
        if run is not None:
            self._restored(run, key)   # the restart before this one, if any
        what, host = died_what(died, self.info)
        try:
            restarts.check(died, what)
            print(restarting_line(what, died.step, restarts.used, restarts.limit))
            began = time.monotonic()
            self._restart_in_place()
            started = time.monotonic()
            replayed = self._replay()
        except ElasticGaveUp as err:
            if run is not None:
                RunWriter(run).finish("failed", str(err))
            raise
        except Exception as err:
            gave_up = restarts.failed_recovery(what, err)
            if run is not None:
                RunWriter(run).finish("failed", str(gave_up))
            raise gave_up from err
        except BaseException:   # a kernel interrupt while the workers restart
            if run is not None:
                RunWriter(run).finish("interrupted")
            raise
        restarts.records.append(Restart(what, tuple(sorted(died.workers)), host, died.step,
                                    started - began, time.monotonic() - started, replayed))

    def _restored(self, run: Run, key: str) -> None:
        """The latest restart, once the fresh workers' first rows arrived: the step they
        resumed at and the seconds it took; said in the cell and on the Run."""
        if not run.restarts or run.restarts[-1].restore_s is not None:
            return
        first = self.monitor.first_rows(key)
        if first is None:
            return
        restart = run.restarts[-1]
        restart.restore_s = max(0.0, first[0] - self._rerun_at)
        restart.resumed_at = first[1]
        number = len(run.restarts)
        run.note(restart_note(number, restart))
        print(restored_line(number, restart))

    def run_scope_cell(self, cell: ScopeCell, observers: list[RunObserver]) -> Any:
        """Run the cell on every worker under the strategy's scope; show worker values.

        ``--checkpoint DIR`` (absolute): Keras BackupAndRestore in each fit.
        """
        self._usable()
        before = set(map(id, self.monitor.runs()))
        checkpoint = cell.spec.checkpoint
        args = (cell.text, cell.header, cell.filename, f"cell{cell.number}", checkpoint)
        outcomes, interrupted = self._call(cells.run_scope, [args] * self.n, observers)
        new = [r for r in self.monitor.runs() if id(r) not in before]
        finish_runs(outcomes, interrupted, new, self.n, self.monitor.stopper.requested)
        self.journal.add_scope(cell.text, args)
        if checkpoint and not new:
            from ...checkpoint import NOTHING_TRAINED

            print(NOTHING_TRAINED.format(dir=checkpoint))
        values = {w: o.value for w, o in outcomes.items()}
        return WorkerValues(values) if any(v is not None for v in values.values()) else None

    def status(self) -> BackendStatus:
        from .status import backend_status

        return backend_status(self)

    # -- data ------------------------------------------------------------------------------
    def push(self, values: dict[str, Any]) -> None:
        """Copy ``values`` into every worker's namespace (pickled by ipyparallel)."""
        push_values(self._usable().client, self.engines.ids, values)
        self.journal.add_push(values)

    def pull(self, name: str, worker_index: int = 0, into: Any = None) -> Any:
        """The value of ``name`` on worker ``worker_index``; a Keras model comes as a model of
        the kernel's Keras (``models.into_kernel``: ``into``, if it fits)."""
        return pull_value(self._usable().client, self.engines.ids, name, worker_index,
                          lambda n, w: into_kernel(self._pull_model(n, w), into))

    def _pull_model(self, name: str, worker_index: int) -> WorkerModel:
        """Every worker reads the model's weights (a read can be a collective); worker
        ``worker_index`` sends them, with the model's config."""
        outcomes, interrupted = self._call(
            transfer.model_state, [(name, w == worker_index) for w in range(self.n)], [])
        finish_runs(outcomes, interrupted, [], self.n)
        state = outcomes[worker_index].value
        return WorkerModel(name, worker_index, state["weights"], state["config"], state["why"],
                           state["keras"], state["class"], state["type"])


def live_clusters() -> list[MultiWorkerCluster]:
    """Clusters of this process that are not stopped (tests check none is left)."""
    return live(MultiWorkerCluster)
