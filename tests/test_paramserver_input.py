"""Step mode's `--data` under `%distribute parameter_server`, as TensorFlow's parameter-server
tutorial builds its input; run in a fresh interpreter (tests/ps_input_scenario.py, through
ps_scenario.py) like the other parameter-server scenarios."""

import pytest
from test_paramserver import scenario


@pytest.fixture(scope="module")
def inputs():
    return scenario("input")


def test_the_tutorials_own_loop_runs_in_the_session(inputs):
    assert inputs["setup_error"] is None and inputs["tf_loop_error"] is None
    # TensorFlow gives every worker the same input context: pipeline 0 of 1
    assert inputs["tf_losses"] == [10.0]


@pytest.mark.parametrize("name", ["dataset_fn", "per_worker_dataset", "dist_dataset",
                                  "per_worker_dataset_fn"])
def test_each_kind_of_input_is_read_as_the_tutorial_reads_it(inputs, name):
    assert inputs[f"{name}_error"] is None
    run = inputs[name]
    assert run["status"] == "done" and run["steps"] == run["total"] == 40
    assert run["losses"] == inputs["tf_losses"] and run["workers"] == [0, 1]


def test_a_dataset_function_is_noted_and_trains(inputs):
    note = "num_input_pipelines=1, input_pipeline_id=0 here"
    assert any(note in n for n in inputs["dataset_fn"]["notes"]), inputs["dataset_fn"]["notes"]
    assert inputs["train_error"] is None
    train = inputs["train"]
    assert train["status"] == "done" and train["steps"] == train["total"] == 40
    assert train["first_last"][1] < train["first_last"][0]


def test_workers_reading_the_same_data_are_named_with_the_fix(inputs):
    """Under parameter_server TensorFlow gives every worker the same input context, so a
    dataset function sharded by it (as under multiworker) gives both workers the same batches:
    the Run and the cell say so once, with the fix for parameter servers; the same examples
    sharded, or shuffled, by the worker's index say nothing."""
    assert inputs["shard_check_error"] is None
    same = inputs["context_sharded_fn"]
    assert same["status"] == "done" and same["workers"] == [0, 1], same
    said = [n for n in same["notes"] if "same data" in n]
    assert len(said) == 1 and said[0].startswith("workers 0 and 1 trained on the same data")
    assert "experimental_get_current_worker_index()" in said[0]
    assert same["printed"].count("nbdist: workers") == 1 and f"nbdist: {said[0]}" in \
        same["printed"]
    for name in ("worker_sharded_fn", "worker_seeded_fn"):
        run = inputs[name]
        assert inputs[f"{name}_error"] is None and run["status"] == "done", (name, run)
        assert run["workers"] == [0, 1] and not any("same data" in n for n in run["notes"]), run
        assert "same data" not in run["printed"], run["printed"]


def test_an_input_of_unknown_length_needs_steps_and_changes_nothing(inputs):
    error = inputs["no_steps_error"]
    assert error.startswith("DataError: --data dataset_fn is a function") and \
        "Give --steps N (steps per epoch)" in error
    assert inputs["runs_added"] == 0 and not inputs["ckpt_created"]
    assert "running" not in inputs["status_after_refusal"]


def test_a_worker_dataset_that_runs_out_says_to_repeat_it(inputs):
    assert inputs["ran_out_error"].startswith("DataError: --data short_fn: a worker's dataset "
                                              "ran out after step ")
    assert "repeat it (`.repeat()`" in inputs["ran_out_error"]
    assert inputs["ran_out"]["status"] == "failed"
    # The rows of the steps that ran are kept, and the error counts them: each worker has 3
    # batches; the first to run out has run its 3, and TensorFlow's coordinator cancels the
    # steps still queued for the other (under load it may have run fewer than its 3).
    steps = inputs["ran_out"]["steps"]
    assert 3 <= steps <= 6 and set(inputs["ran_out"]["workers"]) <= {0, 1}, inputs["ran_out"]
    assert f"ran out after step {steps}." in inputs["ran_out_error"]
    assert inputs["after_ran_out_error"] is None        # the cluster is still usable


def test_a_step_that_fails_on_a_worker_keeps_the_rows_of_the_steps_before_it(inputs):
    """The rows sit in the workers' rings until the kernel reads them: a run that fails on an
    error raised by the step (here the cell's own assertion, on each worker's 6th batch) reads
    them first. At least the failing worker's 5 good steps are kept, and all of them passed the
    check."""
    assert "assert_less" in inputs["assert_error"] or "x < 5.0" in inputs["assert_error"], \
        inputs["assert_error"]
    run = inputs["assert_run"]
    assert run["status"] == "failed"
    assert 5 <= run["steps"] <= 10, run
    assert max(run["losses"]) < 5.0 and 0.0 in run["losses"], run
