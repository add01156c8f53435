"""The JupyterLab extension and the picker in a real JupyterLab and a real browser."""

from labhelpers import run_all_and_wait, shot, write_notebook


def test_extension_is_activated(lab_server, lab_page):
    name = write_notebook(lab_server["dir"], "empty.ipynb", ["1 + 1"])
    page = lab_page.open_notebook(name)
    assert page.evaluate("() => window.jupyterapp.hasPlugin('nbdist:plugin')")
    assert page.evaluate("() => window.jupyterapp.isPluginActivated('nbdist:plugin')")
    commands = page.evaluate("() => window.jupyterapp.commands.listCommands()")
    assert "nbdist:distribute-cell" in commands


def test_status_bar_shows_the_strategy_and_distribute_cell_rewrites_a_cell(lab_server, lab_page):
    name = write_notebook(lab_server["dir"], "status.ipynb", [
        "%load_ext nbdist", "%distribute mirrored --devices 2"])
    page = lab_page.open_notebook(name)
    run_all_and_wait(page)
    item = page.locator(".nbdist-status-item")
    item.wait_for(state="visible", timeout=60_000)
    page.wait_for_function(
        "() => document.querySelector('.nbdist-status-item').textContent.includes('mirrored')",
        timeout=60_000)
    assert "nbdist: mirrored ×2" in item.text_content()
    shot(page, "lab-status-bar")

    # A step cell that has no strategy on its line yet (written, not run).
    page.evaluate("""async () => {
        const app = window.jupyterapp, nb = app.shell.currentWidget.content;
        nb.activeCellIndex = 1;
        await app.commands.execute('notebook:insert-cell-below');
        nb.activeCell.model.sharedModel.source =
            '%%distribute --step --data ds --epochs 3\\nloss = 0.0';
    }""")
    action = page.evaluate("() => window.jupyterapp.commands.execute('nbdist:distribute-cell')")
    assert action == "updated"
    source = page.evaluate(
        "() => window.jupyterapp.shell.currentWidget.content.activeCell.model.sharedModel.source")
    assert source.splitlines()[0] == (
        "%%distribute mirrored --devices 2 --step --data ds --epochs 3")
    shot(page, "lab-distribute-cell")

    item.click()
    dialog = page.locator(".nbdist-status-text")
    dialog.wait_for(state="visible", timeout=60_000)
    page.wait_for_function(
        "() => document.querySelector('.nbdist-status-text').textContent.includes('replicas')",
        timeout=60_000)
    assert "tf.distribute.MirroredStrategy" in dialog.text_content()
    shot(page, "lab-status-dialog")


def test_picker_renders_and_apply_sets_the_strategy(lab_server, lab_page):
    name = write_notebook(lab_server["dir"], "picker.ipynb", ["%load_ext nbdist", "%distribute"])
    page = lab_page.open_notebook(name)
    run_all_and_wait(page)
    picker = page.locator(".nbdist-picker")
    picker.wait_for(state="visible", timeout=60_000)
    assert "no TPU found" in picker.text_content()
    assert picker.get_by_role("button", name="tpu").is_disabled()
    picker.get_by_role("button", name="central_storage").click()
    devices = picker.locator("input[type=number]").first
    devices.fill("3")
    devices.press("Enter")
    page.wait_for_function(
        "() => document.querySelector('.nbdist-magic-line').textContent"
        " === '%distribute central_storage --devices 3'", timeout=30_000)
    assert "CentralStorageStrategy" in picker.text_content()
    shot(page, "lab-picker")
    picker.get_by_role("button", name="Apply").click()
    page.wait_for_function(
        "() => document.querySelector('.nbdist-picker').textContent"
        ".includes('✓ central_storage with 3 replicas')", timeout=120_000)
    page.wait_for_function(
        "() => { const e = document.querySelector('.nbdist-status-item');"
        " return e && e.textContent.includes('central_storage ×3'); }", timeout=60_000)
    shot(page, "lab-picker-applied")
