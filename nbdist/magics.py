"""The ``%distribute`` / ``%%distribute`` magics: parse, validate, hand over to the Session."""

from __future__ import annotations

from typing import Any

from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .errors import ConfigError
from .spec import STRATEGY_NAMES, RunSpec, StrategySpec, suggest_strategy

_ACTIONS = ("status", "stop", "restart", "push", "pull")


@magics_class
class DistributeMagics(Magics):
    """Distributed TensorFlow from a notebook."""

    @magic_arguments()
    @argument(
        "what", nargs="?", default=None,
        help=f"A strategy ({', '.join(STRATEGY_NAMES)}) or an action: `status` (show the "
             "strategy, replicas, devices and the equivalent TensorFlow), `stop` (forget it "
             "and stop worker processes), `restart` (fresh worker processes), `push NAME...` "
             "(copy kernel variables to every worker), `pull NAME` (a worker's variable into "
             "the kernel).",
    )
    @argument("names", nargs="*", default=[],
              help="push/pull: the variable names (default: none).")
    @argument("--worker", type=int, default=None,
              help="pull: the worker to pull from (default: 0).")
    @argument("--keras", default=None, choices=("auto", "legacy", "keras3"),
              help="multiworker: the Keras the workers run as tf.keras: `legacy` (tf_keras, "
                   "whose model.fit works under MultiWorkerMirroredStrategy), `keras3`, or "
                   "`auto` (legacy when tf_keras is installed; the default).")
    @argument("--devices", type=int, default=None,
              help="Local devices: N GPUs if present, else the CPU split into N logical "
                   "devices (default: all GPUs, else 1 CPU).")
    @argument("--workers", type=int, default=None,
              help="Worker processes for multiworker/parameter_server (default: 2 local "
                   "processes; with --cluster, every engine of the cluster).")
    @argument("--ps", type=int, default=None,
              help="Parameter servers for parameter_server (default: none).")
    @argument("--cluster", default=None, metavar="PROFILE",
              help="multiworker: run the workers on the engines of an existing ipyparallel "
                   "cluster: a profile name or directory, NAME@CLUSTER_ID to pick one of "
                   "several; `stop` restarts its engines, never kills the cluster (default: "
                   "none, local worker processes).")
    @argument("--tpu", default=None,
              help="TPU name or grpc:// address for `tpu` (default: the local TPU VM).")
    @argument("--step", action="store_true",
              help="Step mode: the cell is the per-replica training step (default: scope "
                   "mode, the cell runs under strategy.scope()).")
    @argument("--data", default=None,
              help="Step mode: what to train on (required with --step): a tf.data.Dataset "
                   "of global batches, a dataset function fn(input_context) as "
                   "distribute_datasets_from_function takes, or a DistributedDataset of the "
                   "session's strategy; `batch` is this replica's batch of each step.")
    @argument("--epochs", type=int, default=1, help="Step mode: epochs (default: 1).")
    @argument("--steps", type=int, default=None,
              help="Step mode: at most N steps per epoch (default: the whole dataset).")
    @argument("--loss", default="loss",
              help="Step mode: the variable holding the step's loss (default: loss).")
    @argument("--grads", default=None,
              help="Step mode: the variable holding the gradient list, for gradient norms "
                   "(default: `grads` if the cell assigns it).")
    @argument("--show-code", action="store_true",
              help="Step mode: print the generated step function before running it.")
    @argument("--tensorboard", default=None, metavar="DIR",
              help="Also write the run's scalars for TensorBoard under DIR/run<id>-<time>/, "
                   "one subdirectory per replica/worker (default: not written).")
    @argument("--graph", action="store_true",
              help="Step mode: after the run, draw the compiled step's dataflow graph with "
                   "its devices and collective ops, as nbdist.show_graph does (default: off).")
    @argument("--checkpoint", default=None, metavar="DIR",
              help="Save the training state into DIR after every epoch; re-running the cell "
                   "after a crash, an interrupt or `%%distribute restart` resumes from the "
                   "last completed epoch. Step mode saves the objects the cell names (model, "
                   "optimizer...) in DIR/step; scope mode adds Keras BackupAndRestore to each "
                   "model.fit (DIR/fit1, DIR/fit2...). Deleted once the training finishes "
                   "(default: no checkpoint).")
    @argument("--timing-every", type=int, default=None,
              help="Step mode: time the allreduce on every K-th step; 0 turns it off "
                   "(default: automatic, as often as keeps the timing's cost under 1%% of the "
                   "run, between every 5th and every 100th step).")
    @line_cell_magic
    def distribute(self, line: str, cell: str | None = None) -> Any:
        """Run TensorFlow under a tf.distribute strategy.

        Choose the kernel's strategy (line magic)::

            %distribute mirrored --devices 4    # 4 GPUs, or the CPU split into 4 devices
            %distribute one_device
            %distribute central_storage --devices 2
            %distribute tpu --tpu grpc://10.0.0.2:8470
            %distribute status                  # strategy, replicas, equivalent TensorFlow
            %distribute stop                    # forget the strategy, stop worker processes
            %distribute                         # the strategy picker widget

        Multi-worker (N worker processes on this machine, through ipyparallel; every
        ``%%distribute`` cell then runs on all of them, like ``%%px``)::

            %distribute multiworker --workers 2 # MultiWorkerMirroredStrategy, tf_keras fit
            %distribute push lr data_path       # kernel variables -> every worker
            %distribute pull history --worker 1 # a worker's variable -> the kernel
            %distribute restart                 # fresh workers (after one died)

        Parameter servers (asynchronous training; the kernel is the coordinator, the
        workers and parameter servers are tf.distribute.Server processes on this machine;
        defaults --workers 2 --ps 1)::

            %distribute parameter_server --workers 2 --ps 1

        Under ``parameter_server`` a ``%%distribute`` cell runs in the kernel under the
        strategy's scope (variables go to the parameter servers) and a step cell is
        scheduled with ``ClusterCoordinator.schedule`` on whichever worker is free; each
        row records the ``worker`` that ran the step and ``update_ms`` (push, apply and
        acknowledgement of the parameter update) instead of ``allreduce_ms``. Keras 3
        ``model.fit`` does not work under it (TensorFlow 2.21): use step mode. A killed
        worker's steps are re-run on the others; a killed parameter server ends the run.

        An existing ipyparallel cluster (``ipcluster start --profile NAME``: local, SSH, MPI,
        Slurm...) instead of local processes: its engines are the workers (``--workers N``:
        the first N). TF_CONFIG uses each engine's reachable address and a port free on its
        host. TensorFlow allows one MultiWorkerMirroredStrategy per process, so ``stop`` and
        ``restart`` restart the cluster's engines through ipyparallel (fresh processes and
        namespaces) and leave its controller running::

            %distribute multiworker --cluster NAME              # or a profile directory
            %distribute multiworker --cluster NAME --workers 2

        Before the workers start, each is checked: TensorFlow importable, the same
        TensorFlow and nbdist versions as this kernel; a failure names the worker and the fix.

        Scope mode: the cell runs under ``strategy.scope()``; ``model.fit`` calls are
        recorded into ``nbdist.runs``::

            %%distribute
            model = make_model()
            model.compile(optimizer="adam", loss="mse")
            model.fit(train_ds, epochs=3)

        Step mode: the cell is the per-replica step; ``batch`` is this replica's part of
        each dataset element and the cell must assign ``loss`` (and may assign ``grads``)::

            %%distribute --step --data train_ds --epochs 3
            x, y = batch
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_fn(y, model(x, training=True)),
                                                  global_batch_size=GLOBAL_BATCH)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))

        Fault tolerance: ``--checkpoint DIR`` saves the training state after every epoch
        (step mode: the model, optimizer and other objects the cell names; scope mode: Keras
        ``BackupAndRestore`` in each ``model.fit``). If the run dies (a worker killed, the
        kernel interrupted), run ``%distribute restart`` if workers died, re-create the model
        and re-run the same cell: it resumes from the last completed epoch and says so::

            %%distribute --step --data train_ds --epochs 5 --checkpoint ckpt/run1
            ...

        A strategy may also be given on the cell line (``%%distribute mirrored --devices 2
        --step --data ds``); it must match the kernel's strategy if one is set. Each run is
        kept in ``nbdist.runs``; ``nbdist.runs[-1].metrics`` is a DataFrame with one row per
        step and replica.
        """
        from .session import current_session

        args = parse_argstring(self.distribute, line)
        session = current_session(self.shell)
        strategy = _strategy_spec(args)
        if cell is None:
            return self._line(args, strategy, session)
        if args.names or args.worker is not None or args.keras is not None:
            raise ConfigError("Names, --worker and --keras belong on a `%distribute` line "
                              "(one %): push/pull, or starting multiworker.")
        run_spec = RunSpec(
            step=args.step, data=args.data, epochs=args.epochs, steps=args.steps,
            loss=args.loss, grads=args.grads, show_code=args.show_code,
            timing_every=args.timing_every, strategy=strategy, checkpoint=args.checkpoint,
        )
        header = f"%%distribute {line}".strip()
        from .widgets.dashboard import observer_for

        progress = observer_for(self.shell)   # live dashboard, or a static figure + summary
        graph = _graph_observer(args)
        try:
            if run_spec.step:
                session.run_step_cell(cell, run_spec, [progress, *graph], header=header)
                for g in graph:   # --graph: the compiled step, below the dashboard
                    g.show()
                return None  # the summary is shown by `progress`; the Run is nbdist.runs[-1]
            return session.run_scope_cell(cell, run_spec, [progress], header=header)
        finally:
            progress.close()
            if args.tensorboard:
                from .telemetry.tensorboard import write_runs

                write_runs(progress.runs, args.tensorboard)

    def _line(self, args: Any, strategy: StrategySpec | None, session: Any) -> None:
        cell_only = [f for f in ("step", "data", "steps", "grads", "show_code",
                                     "tensorboard", "graph", "checkpoint") if getattr(args, f)]
        if args.worker is not None and args.what != "pull":
            raise ConfigError("--worker applies to `%distribute pull NAME --worker i`.")
        if args.names and args.what not in ("push", "pull"):
            raise ConfigError(f"Unexpected {' '.join(args.names)!r}: only `push` and `pull` "
                              "take names.")
        if cell_only:
            raise ConfigError(
                f"--{cell_only[0].replace('_', '-')} belongs on a `%%distribute` cell (two %), "
                "not on the `%distribute` line."
            )
        if args.what == "status":
            print(session.status_text())
        elif args.what == "stop":
            killed = session.stop()
            print("nbdist: strategy cleared (logical CPU devices stay until the kernel restarts)"
                  + (f"; killed {len(killed)} worker process(es) that did not exit." if killed
                     else "."))
        elif args.what == "restart":
            backend = session.restart()
            print(f"nbdist: {backend.status().workers_total} fresh worker processes.")
        elif args.what in ("push", "pull"):
            self._move(args, session)
        elif strategy is None:
            from .widgets.picker import picker

            picker(session)
        else:
            backend = session.configure(strategy, keras=args.keras)
            print(f"nbdist: {backend.spec.name} with {backend.replicas} replica(s) on "
                  f"{', '.join(backend.devices)}")

    def _move(self, args: Any, session: Any) -> None:
        if not args.names:
            raise ConfigError(f"`%distribute {args.what}` needs variable names, e.g. "
                              f"`%distribute {args.what} model_config`.")
        if args.what == "push":
            session.push(*args.names)
            print(f"nbdist: pushed {', '.join(args.names)} to every worker.")
            return
        if len(args.names) != 1:
            raise ConfigError("`%distribute pull` takes one name (and --worker i).")
        name = args.names[0]
        self.shell.user_ns[name] = session.pull(name, args.worker or 0)
        print(f"nbdist: pulled {name} from worker {args.worker or 0}.")


def _graph_observer(args: Any) -> list[Any]:
    """``--graph``: an observer that keeps the compiled step to draw it after the run."""
    if not args.graph:
        return []
    if not args.step:
        raise ConfigError("--graph draws the compiled step of step mode: add --step --data "
                          "NAME, or call nbdist.show_graph(fn, *args) on your own tf.function.")
    from .graphview import StepGraph

    return [StepGraph()]


def _strategy_spec(args: Any) -> StrategySpec | None:
    """The StrategySpec named on the line, or None when it names none (or an action)."""
    placement = {f: getattr(args, f) for f in ("devices", "workers", "ps", "cluster", "tpu")}
    if args.what in _ACTIONS:
        if any(v is not None for v in placement.values()):
            raise ConfigError(f"`%distribute {args.what}` takes no placement flags.")
        return None
    if args.what is None:
        if any(v is not None for v in placement.values()):
            raise ConfigError(
                "Placement flags need a strategy name, e.g. `mirrored --devices 2`."
            )
        return None
    if args.what not in STRATEGY_NAMES:
        raise ConfigError(suggest_strategy(args.what))
    return StrategySpec(args.what, **placement)
