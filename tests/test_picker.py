"""The strategy picker: availability, the magic line and code it shows, Apply."""

import pytest

import nbdist
from nbdist.hardware import Gpu, Hardware
from nbdist.session import current_session
from nbdist.widgets.picker import Picker, table_html, table_text

CPU_ONLY = Hardware(cpu_cores=2, ipyparallel=True)


@pytest.fixture
def session(ip):
    yield current_session(ip)
    ip.run_line_magic("distribute", "stop")
    ip.run_line_magic("distribute", "mirrored --devices 4")


def test_tpu_is_disabled_with_the_reason_when_there_is_none(session):
    view = Picker(session, CPU_ONLY)
    assert view.buttons["tpu"].disabled and "no TPU found" in view.buttons["tpu"].tooltip
    assert not view.buttons["mirrored"].disabled
    assert "no TPU found" in table_html(CPU_ONLY) and "Push/pull to PS" in table_html(CPU_ONLY)
    no_workers = Hardware(cpu_cores=2, ipyparallel=False)
    assert Picker(session, no_workers).buttons["multiworker"].disabled


def test_choice_shows_the_exact_magic_line_and_the_equivalent_tensorflow(session):
    view = Picker(session, CPU_ONLY)
    view.buttons["central_storage"].value = True
    view.devices.value = 2
    assert not view.buttons["mirrored"].value   # radio behaviour
    assert "%distribute central_storage --devices 2" in view.line.value
    assert "CentralStorageStrategy" in view.code.value
    assert "set_logical_device_configuration" in view.code.value
    view.buttons["multiworker"].value = True
    # CPU only: one device per worker (TensorFlow's rule), so no --devices
    assert "%distribute multiworker --workers 2<" in view.line.value and view.devices.disabled
    assert "TF_CONFIG" in view.code.value and view.ps.disabled


def test_gpus_change_the_preview_to_gpu_devices(session):
    view = Picker(session, Hardware(gpus=(Gpu("/physical_device:GPU:0", 16000),), cpu_cores=8))
    view.buttons["mirrored"].value = True
    view.devices.value = 1
    assert '"/device:GPU:0"' in view.code.value


def test_apply_sets_the_session_strategy_through_the_magic_code_path(session):
    view = Picker(session, CPU_ONLY)
    view.buttons["mirrored"].value = True
    view.devices.value = 2
    view.apply.click()
    assert session.backend.spec.magic_line() == "%distribute mirrored --devices 2"
    assert session.backend.replicas == 2 and "✓ mirrored" in view.message.value
    view.devices.value = 8                      # more than TensorFlow can still make here
    view.apply.click()
    assert "Restart the kernel" in view.message.value
    assert session.backend.replicas == 2        # unchanged, no exception escaped


def test_distribute_without_arguments_shows_the_picker(ip, capsys):
    ip.run_line_magic("distribute", "")
    out = capsys.readouterr().out                 # a terminal shell: the picker's text view
    assert "VBox" not in out and "Box(" not in out
    # its example is the strategy line this kernel last ran (test_magics: the generic one in
    # a kernel that never ran one)
    last = current_session(ip).last_line
    assert last is not None and last.startswith("%distribute ")
    assert "mirrored" in out and f"e.g. `{last}` (the last one in this kernel)." in out, out
    assert table_text(CPU_ONLY).endswith("e.g. `%distribute mirrored --devices 2`.")
    assert callable(nbdist.picker)


def test_the_picker_as_a_cells_last_value_adds_no_repr_line(session, ip, capsys):
    """``nbdist.picker()`` as the last line of a cell: the widget, and no ``<Picker at 0x..>``
    under it (the displayhook shows nothing more)."""
    ip.displayhook(Picker(session, CPU_ONLY))
    out = capsys.readouterr().out
    assert "Picker" not in out and " at 0x" not in out, out


def test_after_stop_the_picker_starts_from_the_last_strategy(session, ip):
    from nbdist.session import Session
    from nbdist.spec import StrategySpec

    ip.run_line_magic("distribute", "stop")
    ip.run_line_magic("distribute", "one_device")
    ip.run_line_magic("distribute", "stop")
    view = Picker(session, CPU_ONLY)
    assert view.buttons["one_device"].value and not view.buttons["mirrored"].value
    assert "%distribute one_device<" in view.line.value, view.line.value
    fresh = Session(ip)   # a worker family's spec, its flags kept; never set: mirrored
    assert Picker(fresh, CPU_ONLY).buttons["mirrored"].value
    fresh._remember(StrategySpec("parameter_server", workers=3, ps=2), None, None)
    view = Picker(fresh, CPU_ONLY)
    assert "%distribute parameter_server --workers 3 --ps 2<" in view.line.value, view.line.value
