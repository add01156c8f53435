from helpers import run_python


def test_import_nbdist_loads_neither_tensorflow_nor_plotly():
    done = run_python("""
        import sys, nbdist
        heavy = [m for m in ("tensorflow", "plotly", "keras") if m in sys.modules]
        print("HEAVY", heavy)
    """)
    assert done.returncode == 0, done.stderr
    assert "HEAVY []" in done.stdout


def test_the_data_layer_imports_no_view():
    """``telemetry`` (the Run store, its rows and exporters) never imports ``widgets``,
    ``lab`` or ``graphview``, not even inside a function: the views register themselves."""
    import ast
    from pathlib import Path

    import nbdist

    views = ("widgets", "lab", "graphview")
    found = []
    for path in (Path(nbdist.__file__).parent / "telemetry").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            if any(part in views for name in names for part in name.split(".")):
                found.append(f"{path.name}:{node.lineno}")
    assert found == []


def test_run_plot_works_wherever_the_run_store_is_imported():
    done = run_python("""
        from nbdist.telemetry.run import Run, RunWriter
        run = Run(id=1, mode="step", strategy="mirrored", replicas=1)
        RunWriter(run).record_step(0, 0, loss=[1.0], step_ms=1.0)
        print("FIGURE", type(run.plot()).__name__)
    """)
    assert done.returncode == 0, done.stderr
    assert "FIGURE Figure" in done.stdout



def test_the_public_names_are_what_the_api_reference_documents():
    """``nbdist.__all__`` is exactly the names docs/reference/api.md documents, and the
    reference hides none of ``Run``'s public members."""
    import re
    from pathlib import Path

    import nbdist

    page = (Path(__file__).resolve().parent.parent / "docs" / "reference" / "api.md").read_text()
    documented = re.findall(r"^\.\. (?:auto\w+|py:\w+):: nbdist\.(\w+)\s*$", page, re.M)
    exported = set(nbdist.__all__)
    assert set(documented) == exported, (
        f"exported, not documented: {sorted(exported - set(documented))}; "
        f"documented, not exported: {sorted(set(documented) - exported)}")
    assert all(hasattr(nbdist, name) for name in nbdist.__all__)
    run = page.split(".. autoclass:: nbdist.Run", 1)[1].split("\n\n", 1)[0]
    hidden = re.findall(r":exclude-members:(.*)", run)
    assert [n.strip() for h in hidden for n in h.split(",")] in ([], ["__init__"])
