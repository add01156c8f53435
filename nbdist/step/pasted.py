"""Strategy code pasted into a cell: found before anything runs.

TensorFlow's and Keras' tutorials build their own strategy (``strategy =
tf.distribute.MirroredStrategy()``, then ``with strategy.scope():``) and the multi-worker ones
set ``os.environ["TF_CONFIG"]``. In a ``%%distribute`` cell the session has built the strategy
already (and, for workers, set TF_CONFIG): a second strategy makes TensorFlow refuse to mix
them, and a second TF_CONFIG points the workers at hosts that do not exist.

``pasted_code`` finds both in a cell's ``ast`` (no TensorFlow). ``use_session_strategy``
decides, against the session's strategy: a constructor of the session's own family whose
arguments the session honours is replaced by the session's strategy object (the cell's
``strategy`` is then the session's, never a second one); anything else is a ``ConfigError``
naming the cell line and the ``%distribute`` line that does what the paste wanted. Cells
without ``%%distribute`` get the same while a strategy is set (``Session.pasted_in_plain_cell``,
an IPython input transformer), and nothing at all while none is.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import ConfigError
from ..families import Family, family_of_tf_class, tf_class_names
from ..spec import StrategySpec
from ..words import count

#: What a pasted constructor call becomes: the session's strategy in the process running the
#: cell (the kernel, or a worker), looked up when the call would have run.
SESSION_STRATEGY = '__import__("nbdist").strategy()'

#: The argument that lists a constructor's devices, by position and keyword.
_DEVICE_ARGS = {"MirroredStrategy": "devices", "CentralStorageStrategy": "compute_devices",
                "OneDeviceStrategy": "device"}
_DEVICE = re.compile(r"(cpu|gpu|tpu):(\d+)", re.IGNORECASE)
_LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "[::1]")


@dataclass(frozen=True)
class StrategyCall:
    """A call that builds a tf.distribute strategy, as the cell writes it."""

    line: int                           # cell line of the call's start
    span: tuple[int, int, int, int]     # (line, col, end_line, end_col): characters, 1-based lines
    text: str                           # the call as written
    class_name: str                     # "MirroredStrategy"
    devices: tuple[str, ...] | None     # its literal devices argument, None if none is given
    unchecked: tuple[str, ...]          # other arguments (and non-literal devices), as written


@dataclass(frozen=True)
class TfConfigSet:
    """A statement that sets TF_CONFIG, and the cluster it lists (when written literally)."""

    line: int
    text: str
    workers: int | None     # chief + workers in its "cluster" (None: not a literal)
    ps: int
    hosts: tuple[str, ...]


@dataclass(frozen=True)
class PastedCode:
    strategies: tuple[StrategyCall, ...]
    tf_config: tuple[TfConfigSet, ...]


def pasted_code(cell: str, class_names: frozenset[str] | None = None,
                first_line: int = 1) -> PastedCode:
    """The strategy constructors (of ``class_names``: the registered families' classes) and
    TF_CONFIG assignments in ``cell``, in any of its scopes, their ``line`` counted from
    ``first_line``. A cell that does not parse has none (its own error comes when it runs)."""
    names = tf_class_names() if class_names is None else class_names
    if "TF_CONFIG" not in cell and not any(name in cell for name in names):
        return PastedCode((), ())   # most cells: a few substring scans, no parse
    try:
        tree = ast.parse(cell)
    except (SyntaxError, ValueError):
        return PastedCode((), ())
    lines = cell.splitlines()
    aliases = _imported_aliases(tree)
    assigned = _assigned_values(tree)
    calls, configs = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            found = _strategy_call(node, names, aliases, lines)
            if found is not None:
                calls.append(dataclasses.replace(found, line=found.line + first_line - 1))
        config = _tf_config_set(node, lines, assigned)
        if config is not None:
            configs.append(dataclasses.replace(config, line=config.line + first_line - 1))
    return PastedCode(tuple(sorted(calls, key=lambda c: c.span)),
                      tuple(sorted(configs, key=lambda c: c.line)))


def _imported_aliases(tree: ast.AST) -> dict[str, str]:
    """``from tensorflow.distribute import MirroredStrategy as MS``: ``{"MS": ...}``."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and "tensorflow" in (node.module or ""):
            for alias in node.names:
                found[alias.asname or alias.name] = alias.name
    return found


def _dotted(node: ast.expr) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return parts[::-1]


def _strategy_call(node: ast.Call, names: frozenset[str], aliases: dict[str, str],
                   lines: list[str]) -> StrategyCall | None:
    parts = _dotted(node.func)
    if not parts:
        return None
    parts = [aliases.get(parts[0], parts[0]), *parts[1:]]   # `from tensorflow import distribute`
    if len(parts) == 1:
        class_name = parts[0]
    elif "distribute" in parts[:-1]:   # tf.distribute[.experimental].X, tensorflow.distribute.X
        class_name = parts[-1]
    else:
        return None
    if class_name not in names:
        return None
    device_arg = _DEVICE_ARGS.get(class_name)
    devices: tuple[str, ...] | None = None
    unchecked = []
    for i, arg in enumerate(node.args):
        if i == 0 and device_arg and _literal_devices(arg) is not None:
            devices = _literal_devices(arg)
        else:
            unchecked.append(_segment(lines, arg))
    for kw in node.keywords:
        if kw.arg == device_arg and _literal_devices(kw.value) is not None:
            devices = _literal_devices(kw.value)
        else:
            unchecked.append(_segment(lines, kw))
    text = re.sub(r"\s*\n\s*", " ", _segment(lines, node))   # one line in messages
    return StrategyCall(node.lineno, _span(node, lines), text, class_name, devices,
                        tuple(unchecked))


def _literal_devices(node: ast.expr) -> tuple[str, ...] | None:
    """``"/gpu:0"`` or ``["/gpu:0", "/gpu:1"]`` as a tuple of strings; None if not literal."""
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    return None


def _assigned_values(tree: ast.AST) -> dict[str, ast.expr]:
    """The value last assigned to each plain name in the cell (``config = {...}``), for a
    TF_CONFIG built from a variable."""
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            found.update({t.id: node.value for t in node.targets if isinstance(t, ast.Name)})
    return found


def _tf_config_set(node: ast.AST, lines: list[str],
                   assigned: dict[str, ast.expr] | None = None) -> TfConfigSet | None:
    """``os.environ["TF_CONFIG"] = ...``, ``os.environ.update(TF_CONFIG=...)``,
    ``os.environ.setdefault("TF_CONFIG", ...)``, ``os.putenv("TF_CONFIG", ...)``."""
    value: ast.expr | None = None
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if not any(isinstance(t, ast.Subscript) and _is_tf_config(t.slice) for t in targets):
            return None
        value = node.value
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr in ("setdefault", "putenv", "__setitem__") and node.args \
                and _is_tf_config(node.args[0]):
            value = node.args[1] if len(node.args) > 1 else None
        elif node.func.attr == "update" and any(k.arg == "TF_CONFIG" for k in node.keywords):
            value = next(k.value for k in node.keywords if k.arg == "TF_CONFIG")
        else:
            return None
    else:
        return None
    workers, ps, hosts = _listed_cluster(value, assigned or {})
    line = node.lineno
    return TfConfigSet(line, lines[line - 1].strip() if line <= len(lines) else "",
                       workers, ps, hosts)


def _is_tf_config(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value == "TF_CONFIG"


def _listed_cluster(value: ast.expr | None, assigned: dict[str, ast.expr]
                    ) -> tuple[int | None, int, tuple[str, ...]]:
    """The workers (chief included), parameter servers and hosts of a literal TF_CONFIG
    (a dict, ``json.dumps`` of one, or its JSON text; also through a variable of the cell
    assigned one). One it cannot read that names ``"ps"`` tasks counts one."""
    import json

    if isinstance(value, ast.Call) and value.args:   # json.dumps({...})
        value = value.args[0]
    for _ in range(3):   # json.dumps(config), config = {"cluster": cluster, ...}
        if isinstance(value, ast.Name) and value.id in assigned:
            value = assigned[value.id]
        if isinstance(value, ast.Dict):
            value = ast.Dict(keys=value.keys, values=[
                assigned.get(v.id, v) if isinstance(v, ast.Name) else v for v in value.values])
    try:
        config = ast.literal_eval(value) if value is not None else None
        if isinstance(config, str):
            config = json.loads(config)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None, int(_names_ps(value, assigned)), ()
    cluster = config.get("cluster") if isinstance(config, dict) else None
    if not isinstance(cluster, dict):
        return None, 0, ()
    listed = {k: v for k, v in cluster.items() if isinstance(v, (list, tuple))}
    workers = len(listed.get("worker", ())) + len(listed.get("chief", ()))
    hosts = tuple(str(a).rsplit(":", 1)[0] for v in listed.values() for a in v)
    return workers or None, len(listed.get("ps", ())), hosts


def _names_ps(value: ast.expr | None, assigned: dict[str, ast.expr]) -> bool:
    """Whether a TF_CONFIG value, or a variable of the cell it is built from, names a
    ``"ps"`` task."""
    todo, seen = [value], set()
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        for child in ast.walk(node):
            if isinstance(child, ast.Constant) and child.value == "ps":
                return True
            if isinstance(child, ast.Name) and child.id in assigned:
                todo.append(assigned[child.id])
    return False


def _span(node: ast.AST, lines: list[str]) -> tuple[int, int, int, int]:
    """``node``'s position in characters (``ast`` counts columns in UTF-8 bytes)."""
    def chars(line: int, col: int) -> int:
        return len(lines[line - 1].encode()[:col].decode(errors="ignore"))

    return (node.lineno, chars(node.lineno, node.col_offset),
            node.end_lineno, chars(node.end_lineno, node.end_col_offset))


def _segment(lines: list[str], node: ast.AST) -> str:
    line, col, end_line, end_col = _span(node, lines)
    if line == end_line:
        return lines[line - 1][col:end_col]
    return "\n".join([lines[line - 1][col:], *lines[line:end_line - 1],
                      lines[end_line - 1][:end_col]])


def replaced(cell: str, calls: Sequence[StrategyCall], text: str = SESSION_STRATEGY) -> str:
    """``cell`` with each call replaced by ``text``, every other line where it was (a call
    over several lines keeps its line breaks inside parentheses)."""
    lines = cell.splitlines(keepends=True)
    for call in sorted(calls, key=lambda c: c.span, reverse=True):
        line, col, end_line, end_col = call.span
        first, last = lines[line - 1], lines[end_line - 1]
        middle = text if line == end_line else f"({text}" + "\n" * (end_line - line) + ")"
        lines[line - 1:end_line] = [first[:col] + middle + last[end_col:]]
    return "".join(lines)


# -- against the session ----------------------------------------------------------------------

def use_session_strategy(cell: str, spec: StrategySpec,
                         placement: Callable[[], tuple[int, Sequence[str]]],
                         first_line: int = 2, *, plain: bool = False,
                         kernel_has_it: bool = True) -> tuple[str, str | None]:
    """``cell`` to run under the session ``spec`` (``placement()``: its replicas in sync and
    its devices, asked only of a cell with strategy code), and the one line to print about
    it (None: no strategy code in it). Messages number the
    cell's lines from ``first_line``: 2 below the ``%%distribute`` line, as the notebook and
    step-mode errors number them.

    ``plain``: a cell without ``%%distribute`` (numbered from 1), run in the kernel, where the
    session's strategy object exists only if ``kernel_has_it`` (not under ``multiworker``, whose
    strategy lives in each worker): a constructor of its family is then refused too, and every
    fix that needs the workers says to make the cell a ``%%distribute`` cell. Another family
    that runs in a kernel (a ``OneDeviceStrategy`` built as a baseline) is left as written there,
    with a line saying its models stay out of ``%%distribute`` cells.

    Raises ConfigError, before anything runs, for a cell that sets TF_CONFIG, builds another
    family's strategy, or asks for devices the session does not have.
    """
    found = pasted_code(cell, first_line=first_line)
    if not found.strategies and not found.tf_config:
        return cell, None
    session = spec.family
    replicas, devices = placement()
    if found.tf_config:
        raise ConfigError(_tf_config_message(found.tf_config[0], found, spec, session, plain))
    beside = []   # plain cells: another strategy this kernel can hold beside the session's
    for call in found.strategies:
        wanted = family_of_tf_class(call.class_name)
        assert wanted is not None   # pasted_code found only the families' classes
        if wanted is not session and plain and wanted.in_kernel:
            # built on purpose outside %%distribute (a one-device baseline, a comparison):
            # TensorFlow holds both; only using its objects in %%distribute cells would mix
            beside.append(call)
            continue
        if wanted is not session:
            then = ("this cell with `%%distribute` as its first line" if plain
                    and not wanted.in_kernel else "this cell")
            raise ConfigError(
                f"cell line {call.line} `{call.text}` builds a {call.class_name} (nbdist's "
                f"`{wanted.name}`), but this notebook's strategy is `{spec.magic_line()}`, and "
                f"TensorFlow cannot mix two strategies. Run `{_line_for(wanted, call)}` first "
                f"(nbdist then {_builds(wanted)}), then {then}: the line then uses the notebook's "
                "strategy.")
        if plain and not kernel_has_it:
            raise ConfigError(
                f"cell line {call.line} `{call.text}` would build a {call.class_name} in this "
                f"kernel alone, but the strategy of this notebook's `{spec.magic_line()}` lives "
                "in each worker process. Make `%%distribute` the cell's first line: the cell "
                "then runs on every worker, where this line uses the notebook's strategy.")
        _check_devices(call, spec, devices)
    said = [f"nbdist: cell line {c.line} `{c.text}` builds a {c.class_name} in this kernel "
            f"beside the notebook's {spec.name} strategy: models built in its scope train on "
            "its devices, and `%%distribute` cells cannot use them." for c in beside]
    own = [c for c in found.strategies if c not in beside]
    if not own:
        return cell, "\n".join(said)
    where = ", ".join(str(c.line) for c in own)
    texts = ", ".join(f"`{c.text}`" for c in own)
    ignored = [a for c in own for a in c.unchecked]
    note = (f" (its {', '.join(f'`{a}`' for a in ignored)} not applied: the notebook's "
            "strategy is used as it was built)") if ignored else ""
    lines = "cell line" if len(own) == 1 else "cell lines"
    message = (f"nbdist: {texts} on {lines} {where} uses the notebook's {spec.name} strategy "
               f"({count(replicas, 'replica')}){note}; nothing else was "
               "built.")
    return replaced(cell, own), "\n".join([message, *said])


def _builds(fam: Family) -> str:
    if fam.in_kernel:
        return "builds that strategy"
    return "starts the workers, sets their TF_CONFIG and builds the strategy on each"


def _check_devices(call: StrategyCall, spec: StrategySpec, devices: Sequence[str]) -> None:
    """Refuse a literal devices argument other than the session's devices."""
    if call.devices is None:
        return
    wanted = {_device_key(d) for d in call.devices}
    have = {_device_key(d) for d in devices}
    if wanted == have:
        return
    n = len(call.devices)
    have_text = ", ".join(f"{k}:{i}" for k, i in sorted(k for k in have if k)) or "none"
    fix = (f"name those devices, or drop the argument: the notebook's `{spec.magic_line()}` "
           f"already gives {count(n, 'replica')}" if n == len(devices)
           else
           f"run `%distribute {spec.name} --devices {n}` (GPUs when the machine has "
           f"them, else the CPU split into {n} devices), then this cell without the "
           "devices argument")
    raise ConfigError(
        f"cell line {call.line} `{call.text}` asks for {', '.join(call.devices)}, but this "
        f"notebook's strategy runs on {have_text}: {fix}.")


def _device_key(name: str) -> tuple[str, int] | None:
    match = _DEVICE.search(name)
    return (match.group(1).upper(), int(match.group(2))) if match else None


def _line_for(fam: Family, call: StrategyCall | None = None, workers: int | None = None,
              ps: int = 0, cluster: bool = False) -> str:
    """The ``%distribute`` line that builds ``fam``'s strategy as the paste asked."""
    parts = ["%distribute", fam.name]
    if cluster and "cluster" in fam.flags:
        parts += ["--cluster", "PROFILE"]
    elif workers and "workers" in fam.flags:
        parts += ["--workers", str(workers)] + (["--ps", str(ps)] if ps and "ps" in fam.flags
                                                 else [])
    elif call is not None and call.devices and "devices" in fam.flags and fam.max_devices != 1:
        parts += ["--devices", str(len(call.devices))]
    elif fam.script is not None and fam.script.launch:
        parts += fam.script.launch.split()
    elif "devices" in fam.flags and fam.max_devices != 1:
        parts += ["--devices", "2"]
    return " ".join(parts)


def _tf_config_message(config: TfConfigSet, found: PastedCode, spec: StrategySpec,
                       session: Family, plain: bool) -> str:
    wants = next((family_of_tf_class(c.class_name) for c in found.strategies), None)
    if wants is None or wants.in_kernel:   # TF_CONFIG alone: a cluster of workers
        wants = family_of_tf_class("ParameterServerStrategy" if config.ps else
                                   "MultiWorkerMirroredStrategy") or session
    remote = any(h not in _LOCAL_HOSTS for h in config.hosts)
    local = _line_for(wants, workers=config.workers or 2, ps=config.ps)
    listed = (f" (the {config.workers} workers{f' and {config.ps} ps' if config.ps else ''} "
              "its TF_CONFIG lists)") if config.workers else ""
    other_count = bool(config.workers and spec.workers and config.workers != spec.workers) \
        or bool(config.ps and spec.ps and config.ps != spec.ps)
    if wants is session and not other_count:
        what = (f"This notebook's `{spec.magic_line()}` already runs those workers with "
                "TF_CONFIG set: remove the TF_CONFIG lines and run the cell again"
                + (" with `%%distribute` as its first line" if plain else ""))
    else:
        what = (f"`{local}` starts the workers on this machine{listed}, "
                f"`{_line_for(wants, cluster=True)}` on the engines of an ipyparallel "
                "cluster (SSH, MPI, Slurm...)" + (" such as the hosts it names" if remote
                                                  else "")
                + "; then run the cell without the TF_CONFIG lines"
                + (", `%%distribute` as its first line" if plain else ""))
    return (f"cell line {config.line} `{config.text}`: nbdist sets TF_CONFIG for its workers "
            "itself (each worker gets its own, with free ports) and builds the strategy on "
            f"each, so a cell must not set it. {what}: its strategy line then uses the "
            "notebook's strategy.")
