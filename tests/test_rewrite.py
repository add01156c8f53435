"""Tests for nbdist.step.rewrite: the generated step really runs, and errors name the cell line."""

from __future__ import annotations

import ast
import inspect
import io
import linecache
import subprocess
import sys
import textwrap
import tokenize
import traceback
from itertools import count
from pathlib import Path

import pytest

from nbdist.errors import ConfigError, StepCodeError
from nbdist.step.rewrite import StepSource, register_source, rewrite_step

ROOT = Path(__file__).resolve().parents[1]
_names = count()


class FakeRuntime:
    """Records begin()/end() calls the way the real runner's runtime object receives them."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def begin(self, batch):
        self.calls.append(("begin",))
        return batch

    def end(self, loss, grads):
        self.calls.append(("end", loss, grads))
        return {"loss": loss, "grads": grads}


def rewrite(cell: str, **kwargs) -> StepSource:
    kwargs.setdefault("filename", f"<nbdist-step-test-{next(_names)}>")
    return rewrite_step(textwrap.dedent(cell), **kwargs)


def build(step: StepSource, namespace: dict | None = None):
    """Compile and exec the generated module; return (step function, runtime)."""
    namespace = {} if namespace is None else namespace
    exec(compile(step.source, step.filename, "exec"), namespace)
    runtime = FakeRuntime()
    return namespace[step.factory_name](runtime), runtime


def step_error(cell: str, **kwargs) -> StepCodeError:
    with pytest.raises(StepCodeError) as info:
        rewrite(cell, **kwargs)
    return info.value


BASIC = """\
x, y = batch
# the prediction
pred = x * 2
loss = (pred - y) ** 2
grads = [2 * (pred - y) * x]
"""


def test_step_runs_and_returns_what_end_received():
    step = rewrite(BASIC)
    fn, runtime = build(step)
    assert fn((3, 1)) == {"loss": 25, "grads": [30]}
    assert runtime.calls == [("begin",), ("end", 25, [30])]
    assert (step.loss, step.grads, step.line_offset) == ("loss", "grads", 3)
    assert step.source.endswith("\n")
    assert step.cell == BASIC


def test_template_shape_and_comments_kept_line_for_line():
    step = rewrite(BASIC)
    lines = step.source.splitlines()
    assert lines[:3] == [
        "def _nbdist_make_step(_nbdist_rt):",
        "    def _nbdist_step(batch):",
        "        batch = _nbdist_rt.begin(batch)",
    ]
    assert lines[-2:] == ["        return _nbdist_rt.end(loss, grads)", "    return _nbdist_step"]
    for number, text in enumerate(BASIC.splitlines(), start=1):
        assert lines[number + step.line_offset - 1] == " " * 8 + text
    assert "        # the prediction" in lines


def test_cell_globals_resolve_in_the_exec_namespace():
    step = rewrite("loss = scale * batch\n")
    fn, _ = build(step, {"scale": 10})
    assert fn(4)["loss"] == 40


def test_traceback_line_maps_back_to_the_cell_line():
    step = rewrite("a = batch\nb = a + 1\nraise ValueError(b)\nloss = b\n")
    step.register()
    fn, _ = build(step)
    with pytest.raises(ValueError) as info:
        fn(1)
    frame = traceback.extract_tb(info.value.__traceback__)[-1]
    assert frame.filename == step.filename
    assert step.cell_line(frame.lineno) == 3
    assert frame.line == "raise ValueError(b)"  # read through linecache after register()
    assert step.cell_line(1) is None and step.cell_line(3) is None  # template lines
    assert step.cell_line(3 + 4) == 4 and step.cell_line(3 + 5) is None


def test_triple_quoted_strings_keep_their_exact_value():
    cell = 'text = """first\n  second\n\tthird\n"""\nraw = f"""{batch}\nx"""\nloss = text + raw\n'
    step = rewrite(cell)
    fn, _ = build(step)
    assert fn("B")["loss"] == "first\n  second\n\tthird\nB\nx"
    assert step.cell_line(step.source.splitlines().index("  second") + 1) == 2


def test_backslash_continuations_blank_lines_and_no_trailing_newline():
    cell = "total = 1 + \\\n    batch\n\n\nloss = 'a\\\nb' + str(total)"
    step = rewrite(cell)
    fn, _ = build(step)
    assert fn(2)["loss"] == "ab3"
    generated = step.source.splitlines()
    assert generated[-3] == "b' + str(total)"  # inside the string: not indented
    assert step.cell_line(len(generated) - 2) == 6


def test_tab_indented_cell_compiles():
    cell = "loss = 0\nfor v in batch:\n\tif v > 1:\n\t\tloss += v\n\telse:\n\t\tloss -= 1\n"
    step = rewrite(cell)
    fn, _ = build(step)
    assert fn([1, 2, 3])["loss"] == 4
    # AutoGraph refuses source whose indentation mixes tabs and spaces: tabs are expanded.
    tokens = tokenize.generate_tokens(io.StringIO(step.source).readline)
    assert not [tok for tok in tokens if tok.type == tokenize.INDENT and "\t" in tok.string]
    assert " " * (8 + 16) + "loss += v" in step.source.splitlines()


def test_tabs_inside_strings_and_form_feeds():
    cell = "loss = '''a\n\tb'''\n\fif batch:\n  \f\tloss += '!'\n"
    step = rewrite(cell)
    assert build(step)[0](1)["loss"] == "a\n\tb!"
    assert "\tb'''" in step.source.splitlines()


def test_crlf_line_endings():
    step = rewrite("a = batch\r\n# note\r\nloss = a + 1\r\n")
    fn, _ = build(step)
    assert fn(1)["loss"] == 2
    assert step.cell_line(6) == 3


def test_inspect_getsource_after_register():
    step = rewrite(BASIC)
    step.register()
    fn, _ = build(step)
    source = inspect.getsource(fn)
    assert source.startswith("    def _nbdist_step(batch):\n")
    assert "        # the prediction\n" in source
    ast.parse(textwrap.dedent(source))
    linecache.checkcache()  # entries with mtime None survive a cache check
    assert inspect.getsource(fn) == source


def test_register_source_for_the_cell_text():
    register_source("<nbdist-cell-text>", "a = 1\r\nb = 2")
    assert linecache.getline("<nbdist-cell-text>", 2) == "b = 2\n"
    linecache.checkcache("<nbdist-cell-text>")
    assert linecache.getlines("<nbdist-cell-text>") == ["a = 1\n", "b = 2\n"]


def test_helpers_renamed_when_the_cell_uses_their_names():
    cell = "_nbdist_rt = batch\n_nbdist_step = _nbdist_rt_1 = 2\nloss = _nbdist_rt * 3\n"
    step = rewrite(cell)
    assert (step.runtime_name, step.step_name) == ("_nbdist_rt_2", "_nbdist_step_1")
    assert step.factory_name == "_nbdist_make_step"
    fn, runtime = build(step)
    assert fn(5)["loss"] == 15 and runtime.calls[0] == ("begin",)


@pytest.mark.parametrize(
    "cell",
    [
        "def _nbdist_rt(): pass\nloss = 1\n",
        "import os as _nbdist_rt\nloss = 1\n",
        "loss = _nbdist_rt.value\n",
        "loss = [_nbdist_rt for _nbdist_rt in batch]\n",
        "loss = (lambda _nbdist_rt: 1)(0)\n",
    ],
)
def test_helper_clash_detected_in_every_kind_of_identifier(cell):
    assert rewrite(cell).runtime_name == "_nbdist_rt_1"


def test_batch_parameter_name_and_assigning_batch():
    step = rewrite("batch = batch_of_data * 2\nloss = batch\n", batch="batch_of_data")
    fn, _ = build(step)
    assert fn(3)["loss"] == 6


def test_grads_auto_detected_or_none():
    assert rewrite("loss = 1\ngrads = 2\n").grads == "grads"
    step = rewrite("loss = 1\ng = 2\n")
    assert step.grads is None
    assert build(step)[0](0) == {"loss": 1, "grads": None}
    assert "end(loss, None)" in step.source
    # grads assigned only in a nested scope does not count
    assert rewrite("loss = 1\ndef f():\n    grads = 2\n").grads is None


def test_explicit_grads_and_loss_names():
    step = rewrite("l = batch\ng = [batch]\n", loss="l", grads="g")
    assert (step.loss, step.grads) == ("l", "g")
    assert build(step)[0](7) == {"loss": 7, "grads": [7]}


def test_explicit_grads_never_assigned():
    error = step_error("loss = 1\ngrads = 2\n", grads="g")
    assert "`--grads g`" in str(error) and "never assigns `g`" in str(error)


@pytest.mark.parametrize(
    "cell",
    [
        "loss: float = 1.0",
        "loss += 1",
        "if batch:\n    (loss := 1)\nelse:\n    loss = 2",
        "for loss in batch:\n    pass",
        "with open(batch) as loss:\n    pass",
        "try:\n    a, (b, *loss) = batch\nexcept Exception:\n    raise",
        "while True:\n    [loss] = batch\n    break",
        "import numpy as loss",
        "from os import path as loss",
        "any((loss := v) for v in batch)",
    ],
)
def test_what_counts_as_assigning_loss(cell):
    assert rewrite(cell).loss == "loss"


@pytest.mark.parametrize(
    "cell",
    [
        "x = batch",
        "loss: float",
        "def f():\n    loss = 1",
        "f = lambda loss=1: loss",
        "class C:\n    loss = 1",
        "values = [loss for loss in batch]",
        "del loss",
        "self.loss = 1",
    ],
)
def test_loss_missing(cell):
    error = step_error(cell)
    assert error.cell_line is None
    assert "never assigns `loss`" in str(error)
    assert "`loss = ...`" in str(error) and "--loss NAME" in str(error)


def test_loss_missing_with_custom_name():
    assert "never assigns `total`" in str(step_error("loss = 1", loss="total"))


def test_syntax_error_names_the_cell_line_not_the_generated_line():
    error = step_error("a = batch\nloss = (a +\n# comment\n")
    assert error.cell_line == 2 and "was never closed" in str(error)
    error = step_error("a = batch\nb = a +\nloss = b\n")
    assert error.cell_line == 2 and "cell line 2 `b = a +`" in str(error)
    assert "invalid syntax" in str(error)
    error = step_error("a = 1\n  loss = a\n")
    assert error.cell_line == 2 and "IndentationError" in str(error)


def test_error_only_a_function_body_raises_maps_to_the_cell_line():
    error = step_error("loss = 1\nx = 2\nbreak\n")
    assert error.cell_line == 3 and "'break' outside loop" in str(error)
    error = step_error("loss = 1\nfrom os import *\n")
    assert error.cell_line == 2 and "module level" in str(error)


@pytest.mark.parametrize(
    ("cell", "line", "keyword"),
    [
        ("a = batch\nloss = a\nreturn loss\n", 3, "`return`"),
        ("loss = 1\nif loss:\n    return\n", 3, "`return`"),
        ("loss = 1\nyield loss\n", 2, "`yield`"),
        ("loss = 1\nx = yield from batch\n", 2, "`yield from`"),
        ("loss = await batch\n", 1, "`await`"),
        ("loss = [await v for v in batch]\n", 1, "`await`"),
        ("loss = 0\nasync for v in batch:\n    pass\n", 2, "`async for`"),
        ("loss = 0\nasync with batch:\n    pass\n", 2, "`async with`"),
        ("loss = 0\n@(yield)\ndef f():\n    pass\n", 2, "`yield`"),
    ],
)
def test_return_yield_await_at_top_level_rejected(cell, line, keyword):
    error = step_error(cell)
    assert error.cell_line == line
    assert str(error).startswith(f"cell line {line} `")
    assert keyword in str(error)
    assert "body of the step" in str(error) and "returns `loss` for you" in str(error)


def test_return_yield_await_in_nested_scopes_are_fine():
    cell = """\
    def helper(v):
        if v:
            return v
        yield v
    async def later():
        await later()
    f = lambda: (yield)
    class C:
        def m(self):
            return 1
    loss = list(helper(batch))
    """
    assert rewrite(cell).loss == "loss"


def test_nonlocal_and_global_rejected():
    error = step_error("loss = 1\nnonlocal loss\n")
    assert error.cell_line == 2 and "`nonlocal`" in str(error)
    assert "tf.Variables" in str(error)
    error = step_error("global counter\ncounter = 1\nloss = 1\n")
    assert error.cell_line == 1 and "cell line 1 `global counter`" in str(error)
    assert "compiled function" in str(error) and "tf.Variables" in str(error)
    assert "scope-mode cell" in str(error)


def test_first_problem_in_line_order_is_reported():
    assert step_error("loss = 1\nglobal g\nreturn loss\n").cell_line == 2


@pytest.mark.parametrize("cell", ["", "\n\n", "# only a comment\n   \n# another"])
def test_empty_cell_rejected(cell):
    error = step_error(cell)
    assert "empty" in str(error) and "without `--step`" in str(error)


@pytest.mark.parametrize(
    "kwargs", [{"loss": "my loss"}, {"grads": "class"}, {"batch": "1x"}, {"loss": ""}]
)
def test_bad_variable_names_rejected(kwargs):
    with pytest.raises(ConfigError, match="not a Python variable name"):
        rewrite("loss = 1\n", **kwargs)


def test_step_code_error_renders_as_one_line_message():
    error = step_error("loss = 1\nreturn loss\n")
    assert error._render_traceback_() == [f"StepCodeError: {error}"]
    assert "\n" not in str(error)


def test_module_imports_neither_tensorflow_nor_ipython():
    tree = ast.parse((ROOT / "nbdist" / "step" / "rewrite.py").read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            imported.add(node.module.split(".")[0])
    stdlib = "__future__ ast dataclasses io keyword linecache tokenize warnings".split()
    assert imported <= set(stdlib), imported
    code = (
        "import sys, nbdist.step.rewrite\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'IPython')]\n"
        "print(bad)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("body, adds_up", [
    ("loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)", True),
    ("loss = tf.nn.compute_average_loss(per_example)", True),
    ("loss = tf.reduce_sum(per_example) * (1. / GLOBAL_BATCH_SIZE)", True),
    ("loss = tf.reduce_mean(per_example)", False),
])
def test_the_step_knows_whether_replica_losses_add_up(body, adds_up):
    # the headline loss is their sum when each is divided by the global batch
    step = rewrite_step(f"x, y = batch\n{body}", filename="<nbdist-step-t>")
    assert step.global_batch_loss is adds_up
