"""The ``%distribute`` / ``%%distribute`` magics: parse, validate, hand over to the Session."""

from __future__ import annotations

import difflib
import logging
import re
import shlex
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import (
    MagicHelpFormatter,
    argument,
    kwds,
    magic_arguments,
)
from IPython.utils.process import arg_split

from .cluster.protocol import FAULT_KINDS
from .displayguard import DisplayGuard
from .errors import ConfigError, NbdistError
from .families import family
from .spec import (
    ELASTIC_RESTARTS,
    PLACEMENT_FLAGS,
    STRATEGY_NAMES,
    RunSpec,
    StrategySpec,
    suggest_strategy,
)
from .step.errormap import with_tensorflow_advice, without_nbdist_frames
from .telemetry.run import RunObserver
from .tflogs import quiet_tensorflow
from .words import count
from .writable import unwritable_reason

_ACTIONS = ("status", "stop", "restart", "push", "pull", "inject", "explain")
_WIDTH = 96   # the help is rendered once, at this width, whatever the terminal
_FAULTS = "|".join(FAULT_KINDS)
_DELAYED = [k for k in FAULT_KINDS.values() if k.delay is not None]
#: What a display (a message, not the action) raised: reported once, then logged.
_DISPLAY = DisplayGuard(logging.getLogger(__name__))


def _formatter(prog: str) -> MagicHelpFormatter:
    return MagicHelpFormatter(prog, width=_WIDTH, max_help_position=26)


def placement_args(f: Callable) -> Callable:
    """The flags that place a strategy, shared by the line and the cell magic (as
    ipyparallel's ``exec_args`` shares its flags between ``%px`` and ``%%px``)."""
    for a in reversed([
        argument("--devices", type=int, metavar="N",
                 help="N GPUs, else the CPU split into N devices (default: all GPUs, else 1)"),
        argument("--workers", type=int, metavar="N",
                 help="worker processes (default: 2; with --cluster, every engine)"),
        argument("--ps", type=int, metavar="N",
                 help="parameter servers, parameter_server only (default: 1)"),
        argument("--cluster", metavar="PROFILE",
                 help="workers on an ipyparallel cluster's engines (default: local ones)"),
        argument("--tpu", metavar="ADDRESS",
                 help="TPU name or grpc:// address (default: this TPU VM's)"),
        argument("--partitioner", metavar="SPEC",
                 help="shard variables: min_size:BYTES|max_size:BYTES|fixed:N (default: none)"),
    ]):
        f = a(f)
    return f


@magic_arguments(name="distribute")
@kwds(formatter_class=_formatter, description=None)
@argument("what", nargs="?", metavar="STRATEGY|ACTION",
          help=f"{', '.join(STRATEGY_NAMES)}; or status, stop, restart, push, "
               "pull, inject, export, explain (default: the picker)")
@argument("names", nargs="*", metavar="NAME",
          help=f"push/pull: variables (Keras models too); inject: {_FAULTS} "
               "WORKER; explain: [RUN]")
@placement_args
@argument("--worker", type=int, metavar="I", help="pull: the worker (default: 0)")
@argument("--at-step", type=int, metavar="N",
          help="inject: after the worker's N-th step of its run (default: at once)")
@argument("--delay", type=float, metavar="S",
          help=f"inject {'|'.join(k.name for k in _DELAYED)}: seconds added to every step "
               f"(default: {_DELAYED[0].delay:g})")
@argument("--keras", choices=("auto", "legacy", "keras3"), metavar="KERAS",
          help="multiworker: auto, legacy (tf_keras) or keras3 (default: auto)")
@argument("--baseline", action="store_true",
          help="explain: also time the step on one replica, a few seconds (default: off)")
def _line_args(line: str) -> None:
    """The ``%distribute`` line's parser (its ``.parser``)."""


@magic_arguments(name="%distribute")
@kwds(formatter_class=_formatter, description=None)
@argument("strategy", nargs="?", metavar="STRATEGY",
          help="must match the kernel's strategy (default: the kernel's)")
@placement_args
@argument("--step", action="store_true",
          help="the cell is the per-replica step (default: scope mode)")
@argument("--data", metavar="NAME",
          help="step mode (required): a tf.data.Dataset, a dataset function "
               "fn(input_context) or a DistributedDataset of the notebook's strategy")
@argument("--epochs", type=int, default=1, metavar="N", help="step mode (default: 1)")
@argument("--steps", type=int, metavar="N",
          help="step mode: steps per epoch at most (default: all)")
@argument("--loss", default="loss", metavar="NAME", help="step mode: the loss (default: loss)")
@argument("--grads", metavar="NAME",
          help="step mode: the gradients (default: grads, if assigned)")
@argument("--show-code", action="store_true", help="print the generated step (default: off)")
@argument("--timing-every", type=int, metavar="K",
          help="time the allreduce every K steps, 0: never (default: auto, <1%% cost)")
@argument("--steps-per-call", default="1", metavar="K",
          help="step mode: K steps a call; auto: K for dispatch <5%% of a call (default: 1)")
@argument("--graph", action="store_true",
          help="draw the compiled step's dataflow graph after the run (default: off)")
@argument("--checkpoint", metavar="DIR",
          help="save every epoch, resume when run again (default: none)")
@argument("--checkpoint-every", type=int, metavar="K",
          help="step mode, with --checkpoint: also save every K steps (default: each epoch)")
@argument("--tensorboard", metavar="DIR",
          help="also write the run's scalars for TensorBoard (default: none)")
@argument("--elastic", type=int, nargs="?", const=ELASTIC_RESTARTS, metavar="N",
          help=f"step mode: restart dead workers, resume --checkpoint (default: off; N: "
               f"{ELASTIC_RESTARTS})")
@argument("--name", metavar="NAME",
          help="the run's label in its dashboard and nbdist.compare (default: what sets it "
               "apart from the other runs)")
def _cell_args(line: str) -> None:
    """The ``%%distribute`` cell's parser (its ``.parser``)."""


for _f in (_line_args, _cell_args):
    _f.parser.allow_abbrev = False   # on a cell, --worker must not pass for --workers

_EXAMPLES = """\
Examples::

  %distribute mirrored --devices 4       # docs/guide/strategies.md: 4 GPUs, or 4 CPU devices
  %distribute multiworker --workers 2    # docs/guide/multiworker.md (also push, pull, restart)
  %distribute parameter_server --ps 1    # docs/guide/parameter-servers.md
  %distribute multiworker --cluster ssh  # docs/guide/clusters.md, docs/guide/security.md
  %distribute status                     # docs/guide/strategies.md (stop: clear the strategy)
  %distribute export train.py            # docs/guide/export-and-launch.md (its flags: --help)
  %distribute inject kill 1 --at-step 20 # docs/guide/faults.md: {faults}

  %%distribute                           # docs/guide/scope-mode.md: every model.fit recorded
  model.fit(train_ds, epochs=3)

  %%distribute --step --data train_ds --epochs 3 --checkpoint ckpt/run1
  x, y = batch                           # docs/guide/step-mode.md, docs/guide/checkpoints.md
  with tf.GradientTape() as tape:
      loss = tf.nn.compute_average_loss(loss_fn(y, model(x)), global_batch_size=64)
  grads = tape.gradient(loss, model.trainable_variables)
  optimizer.apply_gradients(zip(grads, model.trainable_variables))

Runs: nbdist.runs[-1].metrics, drawn live by the dashboard: docs/guide/dashboard.md.
"""


def _help() -> str:
    """``%distribute?`` and ``%distribute --help``: both usages with one line per flag, then
    examples that name the docs page of each action and mode."""
    line, cell = (f.parser.format_help().rstrip() for f in (_line_args, _cell_args))
    return ("Run cells under a tf.distribute strategy. Every flag, explained: "
            "docs/reference/magics.md.\n\n"
            f"{line}\n\n{cell}\n\n{_EXAMPLES.replace('{faults}', _FAULTS)}")


def _flags(magic: Callable) -> set[str]:
    """The --flags a magic's parser takes (read from its public usage text)."""
    return set(re.findall(r"--[a-z][a-z-]*", magic.parser.format_usage()))


def _parse(parsed_by: Callable, other: Callable, line: str, here: str, there: str) -> Any:
    """Parse ``line`` with ``parsed_by``; argparse's bare "unrecognized" and "expected one
    argument" become a ConfigError with the change: where a flag of ``other`` goes, the close
    match of a misspelt flag, an example of a flag's value, the quotes a path with spaces
    needs."""
    words = split_args(line)
    try:
        args = parsed_by.parser.parse_args(words)
    except UsageError as err:
        theirs, mine = _flags(other), _flags(parsed_by)
        for word in words:
            flag = word.split("=")[0]
            if flag in theirs - mine:
                raise ConfigError(f"{flag} belongs on {there}, not on {here}.") from None
        raise ConfigError(_usage_advice(str(err), words, parsed_by, here)) from None
    flag, value, rest = _path_continued(words, parsed_by)
    positional = getattr(args, "what", None) or getattr(args, "strategy", None)
    if positional in rest and positional not in (*STRATEGY_NAMES, *_ACTIONS):
        raise ConfigError(_quote_advice(flag, value, rest))
    return args


#: An example value of the flags that take one (others: 2), for messages.
_EXAMPLE_VALUES = {"--data": "train_ds", "--steps": "100", "--epochs": "3",
                   "--loss": "loss", "--grads": "grads",
                   "--checkpoint": "ckpt/run1", "--checkpoint-every": "100",
                   "--tensorboard": "logs/run1",
                   "--cluster": "ssh", "--tpu": "grpc://10.0.0.2:8470",
                   "--partitioner": "min_size:256k", "--steps-per-call": "8",
                   "--delay": "0.5", "--keras": "legacy", "--worker": "1",
                   "--elastic": "3", "--name": "lr-0.01"}


def _options(parsed_by: Callable) -> dict[str, Any]:
    """The parser's own options, by flag (argparse's actions)."""
    from .hooks.argparse_parser import parser_options

    return parser_options(parsed_by.parser)


def _usage_advice(message: str, words: list[str], parsed_by: Callable, here: str) -> str:
    """argparse's ``message`` about ``words`` as one paragraph with the one change."""
    options = _options(parsed_by)
    missing = re.match(r"argument (--[a-z-]+)(?:/[^:]*)?: expected one argument", message)
    if missing:
        flag = missing.group(1)
        return (f"{flag} needs a value ({options[flag].metavar}) right after it, e.g. "
                f"{_example(flag, options)}. {_flag_help(options[flag])}")
    invalid = re.match(r"argument (--[a-z-]+)(?:/[^:]*)?: invalid (\w+) value: '(.*)'",
                       message)
    if invalid:
        flag, kind, value = invalid.groups()
        what = {"int": "a whole number", "float": "a number"}.get(kind, kind)
        return (f"{flag} {value!r}: {flag} takes {what}, e.g. {_example(flag, options)}. "
                f"{_flag_help(options[flag])}")
    unknown = re.match(r"unrecognized arguments: (.*)", message)
    if unknown:
        extra = split_args(unknown.group(1))
        flag = next((w.split("=")[0] for w in extra if w.startswith("-")), None)
        if flag is not None:
            close = difflib.get_close_matches(flag, list(options), n=1, cutoff=0.6)
            hint = f" Did you mean {_example(close[0], options)}?" if close else ""
            return (f"{flag} is not a flag of {here}.{hint} `%distribute --help` lists "
                    "every flag.")
        flag, value, rest = _path_continued(words, parsed_by)
        if set(extra) & set(rest):
            return _quote_advice(flag, value, rest)
        return (f"Unexpected {' '.join(extra)!r} on {here}: it takes at most one strategy "
                "name, then --flags (`%distribute --help` lists them).")
    choice = re.match(r"argument (--[a-z-]+)(?:/[^:]*)?: invalid choice: '(.*?)'", message)
    if choice:
        flag, value = choice.groups()
        return (f"{flag} {value!r} is not one of its choices: "
                f"{', '.join(options[flag].choices)}, e.g. "
                f"`{flag} {_EXAMPLE_VALUES.get(flag, options[flag].choices[0])}`.")
    return f"{message}. `%distribute --help` lists every flag with an example."


def _example(flag: str, options: dict[str, Any]) -> str:
    """``flag`` as it is written, with an example value if it takes one."""
    if options[flag].nargs == 0:   # store_true
        return f"`{flag}`"
    return f"`{flag} {_EXAMPLE_VALUES.get(flag, '2')}`"


def _flag_help(action: Any) -> str:
    """A flag's own help line, as a sentence."""
    return f"{action.option_strings[0]}: {action.help.replace('%%', '%')}."


def _path_continued(words: list[str], parsed_by: Callable) -> tuple[str, str, list[str]]:
    """(flag, its value, the words after it) when a path flag's value is followed by words
    that are no flags: the rest of a path with spaces, unquoted (no words: none)."""
    paths = {flag for flag, action in _options(parsed_by).items() if action.metavar == "DIR"}
    for i, word in enumerate(words[:-2]):
        if word in paths:
            rest = []
            for after in words[i + 2:]:
                if after.startswith("-"):
                    break
                rest.append(after)
            if rest:
                return word, words[i + 1], rest
    return "", "", []


def _quote_advice(flag: str, value: str, rest: list[str]) -> str:
    path = " ".join([value, *rest])
    return (f"`{' '.join(rest)}` after `{flag} {value}` reads as another argument: a path "
            f"with spaces must be quoted, `{flag} '{path}'` (or give a path without spaces).")


def split_args(line: str) -> list[str]:
    """The words of a magic line as a shell reads them: ``--checkpoint '/tmp/a b ü'`` is the
    path ``/tmp/a b ü`` (IPython's ``parse_argstring`` keeps the quotes). Backslashes are
    kept as typed (Windows paths); a line with an unclosed quote is split as IPython does."""
    lexer = shlex.shlex(line, posix=True)
    lexer.whitespace_split = True
    lexer.escape = ""
    lexer.commenters = ""
    try:
        return list(lexer)
    except ValueError:
        return arg_split(line, strict=False)


def without_comment(line: str) -> str:
    """``line`` without a trailing ``# comment`` (a ``#`` outside quotes, at the start or after
    a space), as Python would read it: ``%distribute mirrored --devices 4  # four replicas``
    is ``%distribute mirrored --devices 4``."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line


@magics_class
class DistributeMagics(Magics):
    """Distributed TensorFlow from a notebook."""

    @line_cell_magic
    def distribute(self, line: str, cell: str | None = None) -> Any:
        __tracebackhide__ = True   # noqa: F841 - IPython hides this frame in tracebacks
        try:
            with quiet_tensorflow():   # TensorFlow's INFO logs hidden (nbdist.set_verbose())
                return self._distribute(line, cell)
        except Exception as err:   # the user's frames, not nbdist's (errors of ours: as is)
            if isinstance(err, NbdistError):
                raise
            advised = with_tensorflow_advice(err, _replicas(self.shell))
            if advised is not err:   # TensorFlow's error for a known mistake: the change first
                raise advised from err
            raise err.with_traceback(without_nbdist_frames(err.__traceback__)) from None

    def _distribute(self, line: str, cell: str | None) -> Any:
        from .session import current_session

        session = current_session(self.shell)
        line = without_comment(line)
        if {"--help", "-h"} & set(line.split()):   # argparse's own -h is off in magics
            if cell is None and line.split()[:1] == ["export"]:
                from .export import export_help

                print(export_help())
            else:
                print(_help())
            return None
        if cell is None and line.split()[:1] == ["export"]:   # its own flags: nbdist.export
            from .export import export_magic

            return export_magic(self.shell, session, line)   # prints; returns None
        if cell is None:
            args = _parse(_line_args, _cell_args, line, _LINE, _CELL)
            return self._line(args, _strategy_spec(args.what, args), session, line)
        args = _parse(_cell_args, _line_args, line, _CELL, _LINE)
        if args.strategy in _ACTIONS:
            raise ConfigError(f"`{args.strategy}` is a line command: `%distribute "
                              f"{args.strategy}` (one %), on a line of its own.")
        strategy = _strategy_spec(args.strategy, args)
        if args.tensorboard is not None:
            _check_logdir(args.tensorboard)
        run_spec = RunSpec(
            step=args.step, data=args.data, epochs=args.epochs, steps=args.steps,
            loss=args.loss, grads=args.grads, show_code=args.show_code,
            timing_every=args.timing_every, strategy=strategy, checkpoint=args.checkpoint,
            checkpoint_every=args.checkpoint_every,
            steps_per_call=args.steps_per_call, elastic=args.elastic, name=args.name,
        )
        header = f"%%distribute {line}".strip()
        from .widgets.dashboard import Dashboard, observer_for

        progress = observer_for(self.shell)   # live dashboard, or a static figure + summary
        graph = _graph_observer(args)
        channel = session.lab_channel          # a reloaded page asks it for the dashboard
        if channel is not None and isinstance(progress, Dashboard):
            channel.serve_views(progress.request_view)
        try:
            if run_spec.step:
                session.run_step_cell(cell, run_spec, [progress, *graph], header=header)
                for g in graph:   # --graph: the compiled step, below the dashboard
                    g.show()
                return None  # the summary is shown by `progress`; the Run is nbdist.runs[-1]
            return session.run_scope_cell(cell, run_spec, [progress], header=header)
        finally:
            progress.close()
            if channel is not None:
                channel.serve_views(None)
            if args.tensorboard:
                from .telemetry.tensorboard import write_runs

                write_runs(progress.runs, args.tensorboard)

    def _line(self, args: Any, strategy: StrategySpec | None, session: Any, line: str) -> None:
        if args.worker is not None and args.what != "pull":
            more = (f" To start {args.worker} worker processes: `%distribute {args.what} "
                    f"--workers {args.worker}`." if args.what in STRATEGY_NAMES else "")
            raise ConfigError("--worker (no s) picks the worker `%distribute pull NAME "
                              f"--worker i` reads from.{more}")
        if args.names and args.what not in ("push", "pull", "inject", "explain"):
            raise ConfigError(f"Unexpected {' '.join(args.names)!r}: only `push`, `pull`, "
                              "`inject` and `explain` take names.")
        if (args.at_step is not None or args.delay is not None) and args.what != "inject":
            raise ConfigError("--at-step and --delay apply to `%distribute inject FAULT WORKER`.")
        if args.baseline and args.what != "explain":
            raise ConfigError("--baseline applies to `%distribute explain [RUN] --baseline`.")
        if args.what == "status":
            print(session.status_text())
        elif args.what == "stop":
            backend = session.backend
            workers = 0
            if backend is not None and not family(backend.spec.name).in_kernel:
                # said after the stop, which must happen whatever the status does
                with _DISPLAY.guard("stop", "nbdist: counting the workers to stop failed "
                                    "({error}), a bug in nbdist; they are stopped all the same."):
                    workers = backend.status().workers_total
            killed = session.stop()
            said = "nbdist: strategy cleared"
            if workers:
                said += f"; its {count(workers, 'worker process')} stopped"
            elif backend is not None:
                said += " (logical CPU devices stay until the kernel restarts)"
            if killed:
                said += f"; {count(len(killed), 'process')} that did not exit had to be killed"
            print(said + ".")
        elif args.what == "restart":
            backend = session.restart()
            print(f"nbdist: {count(backend.status().workers_total, 'fresh worker process')}.")
        elif args.what in ("push", "pull"):
            self._move(args, session)
        elif args.what == "inject":
            fault, worker, *extra = [*args.names, None, None]
            if [e for e in extra if e is not None]:
                raise ConfigError(f"inject takes one fault and one worker, not "
                                  f"{' '.join(args.names)!r}: e.g. `%distribute inject kill 1`.")
            print(session.inject(fault, worker, args.at_step, args.delay))
        elif args.what == "explain":
            from IPython.display import display

            display(_explained_run(args.names).explain(baseline=args.baseline))
        elif strategy is None:
            from .widgets.picker import picker

            picker(session)
        else:
            from .widgets.warm import warm_in_background

            backend = session.configure(strategy, keras=args.keras,
                                        line=f"%distribute {' '.join(line.split())}")
            warm_in_background(self.shell)   # while the first cells wait for the workers
            print(f"nbdist: {backend.spec.name} with {count(backend.replicas, 'replica')} on "
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
        name, worker = args.names[0], args.worker or 0
        # `history.history` or `results["loss"]` lands in a variable of its own
        target = name if name.isidentifier() else re.sub(r"\W+", "_", name).strip("_")
        into = self.shell.user_ns.get(target)
        value = session.pull(name, worker, into)
        self.shell.user_ns[target] = value
        print(_pulled(name, worker, target, value, into, session))


def _replicas(shell: Any) -> int | None:
    """The session's replicas, if it has a strategy."""
    from .session import current_session

    backend = current_session(shell).backend
    return None if backend is None else backend.replicas


def _pulled(name: str, worker: int, target: str, value: Any, into: Any, session: Any) -> str:
    """What ``%distribute pull`` did, in one line."""
    from .kerasmodel import is_keras_model

    into_target = f" into `{target}`" if target != name else ""
    if not is_keras_model(value):
        return f"nbdist: pulled {name} from worker {worker}{into_target}."
    if session.backend.worker_keras is None:
        return (f"nbdist: `{target}` is already in this kernel: under "
                f"{session.backend.spec.name} every cell runs here, so there is nothing to "
                "pull.")
    if value is into:
        return (f"nbdist: pulled {name} from worker {worker}: its weights are set into this "
                f"kernel's `{target}` (the same object).")
    return (f"nbdist: pulled {name} from worker {worker}{into_target}: a {type(value).__name__} "
            f"model of this kernel's Keras, built from its config, with its weights.")


def _explained_run(names: list[str]) -> Any:
    """The Run ``%distribute explain [N]`` means: the last one, or Run N as the dashboard
    numbers it (a negative N counts from the last, as an index of ``nbdist.runs``)."""
    from .telemetry.run import runs

    if len(names) > 1 or (names and not re.fullmatch(r"-?\d+", names[0])):
        raise ConfigError(f"`%distribute explain` takes at most one run number, not "
                          f"{' '.join(names)!r}: `%distribute explain` (the last run) or "
                          "`%distribute explain 3` (Run 3, as its dashboard names it).")
    if not runs:
        raise ConfigError("No run to explain yet: run a step cell (`%%distribute --step "
                          "--data ds`) first, then `%distribute explain`.")
    number = int(names[0]) if names else -1
    if number < 0 and -number <= len(runs):
        return runs[number]
    found = [run for run in runs if run.id == number]
    if not found:
        raise ConfigError(f"There is no Run {number}: this kernel has Runs 1-{len(runs)} "
                          "(`%distribute explain` explains the last; a negative number counts "
                          "back from it).")
    return found[0]


def _check_logdir(logdir: str) -> None:
    """``--tensorboard DIR``, refused before the cell runs when the scalars cannot be written
    there (they are written after the run)."""
    why = "no directory given" if not logdir.strip() else unwritable_reason(logdir)
    if why is not None:
        raise ConfigError(
            f"--tensorboard {logdir!r}: nbdist could not write the run's scalars there ({why}), "
            "so the cell did not run. Give a directory you can write to (it is created if "
            "missing), e.g. `--tensorboard logs/run1`.")


def _graph_observer(args: Any) -> list[RunObserver]:
    """``--graph``: an observer that keeps the compiled step to draw it after the run."""
    if not args.graph:
        return []
    if not args.step:
        raise ConfigError("--graph draws the compiled step of step mode: add --step --data "
                          "NAME, or call nbdist.show_graph(fn, *args) on your own tf.function.")
    from .graphview import StepGraph

    return [StepGraph()]


def _strategy_spec(what: str | None, args: Any) -> StrategySpec | None:
    """The StrategySpec named on the line, or None when it names none (or an action)."""
    placement = {f: getattr(args, f) for f in PLACEMENT_FLAGS}
    if what in _ACTIONS:
        if any(v is not None for v in placement.values()):
            raise ConfigError(f"`%distribute {what}` takes no placement flags.")
        return None
    if what is None:
        if any(v is not None for v in placement.values()):
            raise ConfigError(
                "Placement flags need a strategy name, e.g. `mirrored --devices 2`."
            )
        return None
    if what not in STRATEGY_NAMES:
        raise ConfigError(suggest_strategy(what))
    return StrategySpec(what, **placement)


_LINE = "the `%distribute` line (one %)"
_CELL = "a `%%distribute` cell (two %)"
DistributeMagics.distribute.__doc__ = _help()
