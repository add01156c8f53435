"""The strategy picker: ``%distribute`` with no arguments, or ``nbdist.picker()``.

It shows the strategy table (each family's row, ``nbdist.families``), disables what this
machine cannot run (and says why), offers the placement controls the family's ``picker``
lists, and shows the exact ``%distribute`` line and the equivalent hand-written TensorFlow.
Apply goes through ``Session.configure``, the same code path as the magic.
"""

from __future__ import annotations

import html
from typing import Any

from ..errors import NbdistError
from ..families import DEFAULT_FAMILY, families, family
from ..hardware import Hardware
from ..spec import StrategySpec
from ..strategies import equivalent_code
from ..words import count


def spec_from_choices(name: str, devices: int, workers: int, ps: int, cluster: str,
                      tpu: str, gpus: int = 0) -> StrategySpec:
    """The StrategySpec for the picker's current controls (only the flags the family's
    ``picker`` lists).

    Without GPUs a multiworker worker has one CPU device (TensorFlow's rule), so --devices is
    left out there (``Family.gpu_devices_only``).
    """
    offered = family(name).picker_flags(gpus)
    return StrategySpec(
        name,
        devices=devices if "devices" in offered else None,
        workers=workers if "workers" in offered else None,
        ps=ps if "ps" in offered else None,
        cluster=cluster or None if "cluster" in offered else None,
        tpu=tpu or None if "tpu" in offered else None,
    )


def preview_code(spec: StrategySpec, hardware: Hardware) -> str:
    """Equivalent TensorFlow for ``spec`` on this machine, without building anything."""
    n = spec.devices or 1
    if hardware.gpus:
        devices, kind = tuple(f"/device:GPU:{i}" for i in range(n)), "GPU"
    else:
        devices, kind = tuple(f"/device:CPU:{i}" for i in range(n)), "CPU"
    return equivalent_code(spec, devices, kind)


def table_html(hardware: Hardware) -> str:
    """The strategy table, with a column saying whether this machine can run each one."""
    missing = hardware.unavailable()
    rows = []
    for fam in families():
        name = fam.name
        here = (f'<span style="color:#b00">✗ {html.escape(missing[name])}</span>'
                if name in missing else '<span style="color:#070">✓</span>')
        rows.append(f"<tr><td><code>{name}</code><br><small>{fam.tf_class}</small></td>"
                    f"<td>{fam.scope}</td><td>{fam.gradient_sync}</td><td>{fam.use_case}</td>"
                    f"<td>{here}</td></tr>")
    gpus = ", ".join(f"{g.name} ({g.memory_mib} MiB)" if g.memory_mib else g.name
                     for g in hardware.gpus) or "none (the CPU is split into logical devices)"
    head = ("<tr><th>strategy</th><th>scope</th><th>gradient sync</th><th>use case</th>"
            "<th>here</th></tr>")
    return (f"<div><b>This machine</b>: {hardware.cpu_cores} CPU cores; GPUs: "
            f"{html.escape(gpus)}; TPU: {html.escape(hardware.tpu or 'none')}</div>"
            f'<table class="nbdist-strategy-table">{head}{"".join(rows)}</table>')


class Picker:
    """The widget. ``Picker(session, hardware).widget`` is what gets displayed."""

    def _ipython_display_(self) -> None:
        """Nothing: ``picker()`` has displayed the widget already, and ``nbdist.picker()`` as a
        cell's last line would otherwise add a ``<Picker at 0x...>`` line under it."""

    def __init__(self, session: Any, hardware: Hardware):
        import ipywidgets as w

        self.session, self.hardware = session, hardware
        missing = hardware.unavailable()
        names = [f.name for f in families()]
        available = [n for n in names if n not in missing]
        # the kernel's strategy, or after `%distribute stop` the last one it had
        current = session.backend.spec if session.backend is not None else session.last_spec
        if current is not None and current.name in missing:
            current = None
        first = current.name if current else (DEFAULT_FAMILY if DEFAULT_FAMILY in available
                                              else available[0])
        self.buttons = {}
        for name in names:
            button = w.ToggleButton(description=name, value=name == first,
                                    disabled=name in missing, tooltip=missing.get(name, ""))
            button.observe(self._on_pick(name), names="value")
            self.buttons[name] = button
        default_devices = len(hardware.gpus) or min(4, max(2, hardware.cpu_cores))
        self.devices = w.BoundedIntText(value=(current.devices if current and current.devices
                                               else default_devices),
                                        min=1, max=max(64, default_devices), description="devices")
        self.workers = w.BoundedIntText(value=current.workers if current and current.workers
                                        else 2, min=1, max=64, description="workers")
        self.ps = w.BoundedIntText(value=current.ps if current and current.ps else 1, min=1,
                                   max=16, description="ps")
        self.cluster = w.Dropdown(options=[("local processes", "")] + [
            (p, p) for p in hardware.profiles], description="cluster")
        self.tpu = w.Text(value="", placeholder="grpc://host:8470 or TPU name",
                          description="tpu")
        self.line = w.HTML()
        self.code = w.HTML()
        self.message = w.HTML()
        self.apply = w.Button(description="Apply", button_style="primary")
        self.apply.on_click(lambda _: self.apply_choice())
        for control in (self.devices, self.workers, self.ps, self.cluster, self.tpu):
            control.observe(lambda _: self.refresh(), names="value")
        self.widget = w.VBox([
            w.HTML(table_html(hardware)),
            w.HBox(list(self.buttons.values())),
            w.HBox([self.devices, self.workers, self.ps]),
            w.HBox([self.cluster, self.tpu]),
            self.line, self.code, w.HBox([self.apply, self.message]),
        ])
        self.widget.add_class("nbdist-picker")
        self.refresh()

    @property
    def choice(self) -> str:
        return next(n for n, b in self.buttons.items() if b.value)

    def spec(self) -> StrategySpec:
        return spec_from_choices(self.choice, self.devices.value, self.workers.value,
                                 self.ps.value, self.cluster.value, self.tpu.value,
                                 gpus=len(self.hardware.gpus))

    def refresh(self) -> None:
        offered = family(self.choice).picker_flags(len(self.hardware.gpus))
        for flag in ("devices", "workers", "ps", "cluster", "tpu"):
            getattr(self, flag).disabled = flag not in offered
        try:
            spec = self.spec()
        except NbdistError as err:
            self.line.value = f'<span style="color:#b00">{html.escape(str(err))}</span>'
            self.apply.disabled = True
            return
        self.apply.disabled = False
        line = html.escape(spec.magic_line())
        self.line.value = f"<code class='nbdist-magic-line'>{line}</code>"
        code = html.escape(preview_code(spec, self.hardware), quote=False)
        self.code.value = f"<pre>{code}</pre>"

    def apply_choice(self) -> None:
        """Set the kernel's strategy; errors are shown in the widget, not raised."""
        try:
            handle = self.session.configure(self.spec())
        except NbdistError as err:
            self.message.value = f'<span style="color:#b00">{html.escape(str(err))}</span>'
            return
        self.message.value = (f"✓ {handle.spec.name} with {count(handle.replicas, 'replica')} on "
                              f"{html.escape(', '.join(handle.devices))}")

    def _on_pick(self, name: str) -> Any:
        def handler(change: dict[str, Any]) -> None:
            if change["new"]:       # behave like radio buttons
                for other, button in self.buttons.items():
                    if other != name and button.value:
                        button.value = False
                self.refresh()
            elif not any(b.value for b in self.buttons.values()):
                self.buttons[name].value = True
        return handler


def table_text(hardware: Hardware, last_line: str | None = None) -> str:
    """The picker as text: where no widget runs (a terminal, a saved notebook on GitHub).
    ``last_line``: the kernel's last strategy line, the example it gives."""
    missing = hardware.unavailable()
    lines = ["nbdist strategies (the picker widget needs JupyterLab, Notebook 7 or VS Code):"]
    for fam in families():
        here = f"no: {missing[fam.name]}" if fam.name in missing else "yes"
        lines.append(f"  {fam.name:<17} {fam.use_case[:60]:<60}  here: {here}")
    example = (f"`{last_line}` (the last one in this kernel)" if last_line else
               "`%distribute mirrored --devices 2`")
    lines.append(f"Choose one with a line, e.g. {example}.")
    return "\n".join(lines)


def picker(session: Any = None, hardware: Hardware | None = None) -> Any:
    """Show the strategy picker (also ``%distribute`` with no arguments); without a widget
    front end (terminal IPython), print its text view and return None."""
    from IPython import get_ipython
    from IPython.display import display

    from ..hardware import detect
    from ..session import current_session
    from .progress import has_frontend

    hardware = hardware or detect()
    shell = get_ipython()
    if session is None and shell is not None:
        session = current_session(shell)
    last_line = session.last_line if session is not None else None
    if not has_frontend(shell):
        print(table_text(hardware, last_line))
        return None
    view = Picker(session or current_session(), hardware)
    bundle = view.widget._repr_mimebundle_()
    bundle["text/plain"] = table_text(hardware, last_line)
    display(bundle, raw=True)
    return view
