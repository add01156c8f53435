from helpers import run_python


def test_import_nbdist_loads_neither_tensorflow_nor_plotly():
    done = run_python("""
        import sys, nbdist
        heavy = [m for m in ("tensorflow", "plotly", "keras") if m in sys.modules]
        print("HEAVY", heavy)
    """)
    assert done.returncode == 0, done.stderr
    assert "HEAVY []" in done.stdout
