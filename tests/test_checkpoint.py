"""``--checkpoint DIR``: a run that dies in a later epoch resumes from the last completed one.

Local strategies first (the kernel's 4 logical CPUs from conftest): the run fails in epoch 3
(its input pipeline raises), a fresh model is built as after a restart, and the same cell
resumes (a 2-worker cluster whose worker is killed: tests/test_checkpoint_multiworker.py).

"Weights continue" is checked exactly: training is deterministic here (no shuffling, CPU), so
the resumed run's steps have the losses the dead run had recorded for the same steps: the
first one shows the weights are those after epoch 2 (a fresh model is far off), the next ones
that the optimizer's state (Adam's moments and step count) came back too.
"""

import os
import signal

import numpy as np
import pytest
from helpers import run_err, run_ok

import nbdist
from nbdist.errors import CheckpointError
from nbdist.widgets.figure import run_figure

EPOCHS, PER_EPOCH = 3, 8

DATA = """
import numpy as np
import tensorflow as tf

GLOBAL_BATCH = 32
rng = np.random.default_rng(7)
xs = rng.normal(size=(GLOBAL_BATCH * 8, 4)).astype("float32")
ys = (xs @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32") + 0.1).astype("float32")
clean_ds = tf.data.Dataset.from_tensor_slices((xs, ys)).batch(GLOBAL_BATCH, drop_remainder=True)

def dying(ds, at, action):
    '''`ds` whose `at`-th batch (counted over all epochs) runs `action` first.'''
    seen = [0]

    def check(x):
        seen[0] += 1
        if seen[0] == at:
            action()
        return x

    def checked(x, y):
        return tf.ensure_shape(tf.numpy_function(check, [x], tf.float32), x.shape), y

    return ds.map(checked)

def at_batch(epoch, batch, action):
    '''A callback running `action` as model.fit starts batch `batch` of epoch `epoch`.'''
    class At(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, e, logs=None):
            self.e = e

        def on_train_batch_begin(self, b, logs=None):
            if (self.e, b) == (epoch, batch):
                action()

    return [At()]

hooks = []
"""

MODEL = """%%distribute
tf.keras.utils.set_random_seed(SEED)
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(8, activation="tanh"),
                             tf.keras.layers.Dense(1)])
optimizer = tf.keras.optimizers.Adam(0.01)
"""

STEP = """%%distribute --step --data train_ds --epochs 3 {flags}
x, y = batch
with tf.GradientTape() as tape:
    loss = tf.nn.compute_average_loss(tf.square(model(x) - y)[:, 0], global_batch_size=GLOBAL_BATCH)
grads = tape.gradient(loss, model.trainable_variables)
optimizer.apply_gradients(zip(grads, model.trainable_variables))
"""

FIT = """%%distribute {flags}
model.compile(optimizer=optimizer, loss="mse")
model.fit(train_ds, epochs=3, verbose=0, callbacks=hooks)
"""


def losses(run):
    return run.metrics.groupby("step")["loss"].sum()


def assert_same_steps(resumed, died, first=16):
    """The steps both runs did have the same losses (the resumed one continued the other)."""
    both = sorted(set(losses(died).index) & set(losses(resumed).index))
    assert both[0] == first and len(both) >= 3, both
    np.testing.assert_allclose(losses(resumed)[both], losses(died)[both], rtol=1e-5)


# -- local strategies (the kernel's `mirrored --devices 4`) ------------------------------------

@pytest.fixture
def local(ip, tmp_path):
    """The kernel on 2 replicas (the cheapest that still all-reduces), 4 again afterwards."""
    ip.run_line_magic("distribute", "mirrored --devices 2")
    yield _local(ip, tmp_path)
    ip.run_line_magic("distribute", "mirrored --devices 4")


def _local(ip, tmp_path):
    run_ok(ip, DATA)
    ip.user_ns["SEED"] = 1

    def fail():
        raise RuntimeError("the input pipeline broke")

    ip.user_ns["fail"] = fail
    ip.user_ns["interrupt"] = lambda: os.kill(os.getpid(), signal.SIGINT)   # Kernel > Interrupt
    return ip, str(tmp_path / "ckpt")


DIE_IN_EPOCH_3 = {   # (how, the run's status, steps it finished)
    # tf.data delivers the error in order, at the last batch of epoch 3
    STEP: ("train_ds = dying(clean_ds, 3 * 8, fail)", "failed", 23),
    # Kernel > Interrupt (a real SIGINT), from a callback: Keras prefetches a whole epoch, so
    # a signal sent from the input pipeline would land at an unpredictable step
    FIT: ("train_ds = clean_ds\nhooks = at_batch(2, 3, interrupt)", "interrupted", 19),
}


def assert_curves_continue(resumed, died, at=16):
    """The resumed Run goes on from the one that died: linked to it, and every line of its
    figure's loss panel runs from step 0, the earlier run's steps first."""
    assert resumed.resumed_from is died and resumed.resumed_at == at
    fig = run_figure(resumed)
    assert f"resumed from run {died.id} at step {at}" in fig["layout"]["title"]["text"]
    steps = [list(t["x"]) for t in fig["data"] if t.get("yaxis") == "y"
             and t.get("mode") == "lines" and not t["name"].startswith("resumed from")]
    assert steps and all(s == list(range(EPOCHS * PER_EPOCH)) for s in steps), steps


def _die_then_resume(ip, cell, ckpt, capsys, extra="", recorded=None):
    """Train with --checkpoint, interrupt the kernel in epoch 3, rebuild the model (other
    seed, as after a restart), resume. ``recorded``: the steps the dying run records, if not
    all it finished."""
    how, status, steps = DIE_IN_EPOCH_3[cell]
    run_ok(ip, MODEL)
    run_ok(ip, how)
    flags = f"--checkpoint {ckpt} {extra}"
    run_err(ip, cell.format(flags=flags))
    died = nbdist.runs[-1]
    assert (died.status, died.steps_done) == (status, steps if recorded is None else recorded)
    ip.user_ns["SEED"] = 2                       # as after a restart: a fresh model
    run_ok(ip, MODEL)
    ip.user_ns["SEED"] = 1
    ip.user_ns["train_ds"], ip.user_ns["hooks"] = ip.user_ns["clean_ds"], []
    capsys.readouterr()
    run_ok(ip, cell.format(flags=flags))
    return died, nbdist.runs[-1], capsys.readouterr().out


def test_local_step_mode_resumes_from_the_last_completed_epoch(local, capsys):
    ip, ckpt = local
    died, resumed, out = _die_then_resume(ip, STEP, ckpt, capsys)
    step_dir = os.path.join(ckpt, "step")
    assert f"nbdist: resumed from epoch 2 of 3 in {step_dir}" in out
    frame = resumed.metrics
    assert resumed.status == "done" and sorted(frame["step"].unique()) == list(range(16, 24))
    assert set(frame["epoch"]) == {2} and resumed.total_steps == 24
    assert any("resumed from epoch 2 of 3" in n for n in resumed.notes)
    [saved] = [n for n in resumed.notes if "Checkpointed objects:" in n]
    assert "model" in saved and "optimizer" in saved
    assert_same_steps(resumed, died)
    assert_curves_continue(resumed, died)
    assert not os.path.exists(step_dir)              # finished: the backup is gone


def test_local_steps_per_call_resume_to_the_weights_of_one_step_per_call(local, capsys):
    """Calls of 3 steps: the checkpoint after each epoch of 8 steps falls inside a group of 3
    (the epoch's last call is shorter), and the run dies in a call ([22, 24): the call's rows
    go with it, step 22 included). Resumed, it ends on the weights one step per call reaches
    without dying."""
    ip, ckpt = local
    died, resumed, out = _die_then_resume(ip, STEP, ckpt, capsys, "--steps-per-call 3", 22)
    assert "nbdist: resumed from epoch 2 of 3" in out
    assert sorted(resumed.metrics["step"].unique()) == list(range(16, 24))
    assert any("rows of the steps it finished are lost" in n for n in died.notes), died.notes
    assert_same_steps(resumed, died)
    grouped = [w.copy() for w in ip.user_ns["model"].get_weights()]
    run_ok(ip, MODEL)
    run_ok(ip, STEP.format(flags="--timing-every 0"))
    for a, b in zip(grouped, ip.user_ns["model"].get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("extra", ["", "--steps-per-call 3"])
def test_local_checkpoint_every_resumes_mid_epoch_to_the_uninterrupted_weights(local, capsys,
                                                                             extra):
    """--checkpoint-every 4: saved before steps 4 and 12 besides each epoch's end; the run
    fails fetching step 15's batch (epoch 2) and resumes at step 12, 4 batches into epoch 2,
    skipping them: no batch is skipped or repeated, so the weights at the end are those of a
    run that never stopped. Calls of 3 steps end where a checkpoint is due."""
    ip, ckpt = local
    run_ok(ip, MODEL)
    run_ok(ip, "train_ds = dying(clean_ds, 8 + 8, fail)")
    flags = f"--checkpoint {ckpt} --checkpoint-every 4 {extra}"
    run_err(ip, STEP.format(flags=flags))
    died = nbdist.runs[-1]
    assert (died.status, died.steps_done) == ("failed", 15)
    step_dir = os.path.join(ckpt, "step")
    assert os.path.exists(os.path.join(step_dir, "ckpt-12.index")), os.listdir(step_dir)
    assert (f"checkpointed each epoch and every 4 steps into {step_dir} (model, optimizer)"
            in died.notes), died.notes
    ip.user_ns["SEED"] = 2                       # as after a restart: a fresh model
    run_ok(ip, MODEL)
    ip.user_ns["SEED"], ip.user_ns["train_ds"] = 1, ip.user_ns["clean_ds"]
    capsys.readouterr()
    run_ok(ip, STEP.format(flags=flags))
    resumed, out = nbdist.runs[-1], capsys.readouterr().out
    assert (f"nbdist: resumed at epoch 2 of 3, step 5 of the epoch, in {step_dir} (12 steps "
            "restored; the first 4 batches of epoch 2 are skipped: they were trained on)."
            ) in out, out
    frame = resumed.metrics
    assert resumed.status == "done" and sorted(frame["step"].unique()) == list(range(12, 24))
    assert set(frame["epoch"]) == {1, 2}
    assert_same_steps(resumed, died, first=12)   # step 12 had the batch it had the first time
    assert_curves_continue(resumed, died, at=12)
    assert not os.path.exists(step_dir)
    finished = [w.copy() for w in ip.user_ns["model"].get_weights()]
    run_ok(ip, MODEL)                            # the same training, never stopped
    run_ok(ip, STEP.format(flags=extra))
    for a, b in zip(finished, ip.user_ns["model"].get_weights(), strict=True):
        assert np.abs(a - b).max() < 1e-5


def test_local_keras3_fit_resumes_and_forgets_the_restored_epoch(local, capsys):
    ip, ckpt = local
    ip.run_line_magic("distribute", "one_device")     # Keras 3 fit: the quickest strategy
    died, resumed, out = _die_then_resume(ip, FIT, ckpt, capsys)
    assert f"nbdist: resumed from epoch 2 of 3 in {os.path.join(ckpt, 'fit1')}" in out
    frame = resumed.metrics
    assert resumed.mode == "fit" and sorted(frame["step"]) == list(range(16, 24))
    assert set(frame["epoch"]) == {2}
    assert_same_steps(resumed, died)
    assert_curves_continue(resumed, died)
    assert ip.user_ns["model"]._initial_epoch is None   # a later plain fit starts at epoch 0
    run_ok(ip, FIT.format(flags=""))
    assert nbdist.runs[-1].metrics["epoch"].min() == 0
    assert not os.path.exists(os.path.join(ckpt, "fit1"))


TWO_FITS = """%%distribute --checkpoint {ckpt}
model.compile(optimizer=optimizer, loss="mse")
model.fit(train_ds, epochs=3, verbose=0)
model2.compile(optimizer=optimizer2, loss="mse")
model2.fit(train_ds, epochs=3, verbose=0, callbacks=hooks)
"""


def test_local_second_fit_of_a_cell_backs_up_in_fit2_and_resumes_from_it(local, capsys):
    """Each model.fit of a --checkpoint cell has its own backup, DIR/fit1, DIR/fit2...: the
    cell run again after an interrupt in its second fit resumes that fit where it was."""
    ip, ckpt = local
    ip.run_line_magic("distribute", "one_device")     # Keras 3 fit: the quickest strategy
    model2 = MODEL.replace("model =", "model2 =").replace("optimizer =", "optimizer2 =")

    def build(seed):
        ip.user_ns["SEED"] = seed
        run_ok(ip, MODEL)
        run_ok(ip, model2)

    build(1)
    run_ok(ip, "train_ds = clean_ds\nhooks = at_batch(2, 3, interrupt)")
    run_err(ip, TWO_FITS.format(ckpt=ckpt))
    first, died = nbdist.runs[-2:]
    assert (first.mode, first.status, first.steps_done) == ("fit", "done", 24)
    assert (died.status, died.steps_done) == ("interrupted", 19)
    assert sorted(os.listdir(ckpt)) == ["fit2"]       # the first fit finished: its backup went
    build(2)                                          # as after a restart: fresh models
    ip.user_ns["hooks"] = []
    capsys.readouterr()
    run_ok(ip, TWO_FITS.format(ckpt=ckpt))
    out = capsys.readouterr().out
    again, resumed = nbdist.runs[-2:]
    assert f"nbdist: resumed from epoch 2 of 3 in {os.path.join(ckpt, 'fit2')}" in out
    assert out.count("nbdist: resumed") == 1          # nothing to resume for the first fit
    assert sorted(again.metrics["step"]) == list(range(24))
    assert resumed.status == "done" and sorted(resumed.metrics["step"]) == list(range(16, 24))
    assert_same_steps(resumed, died)
    assert not os.path.exists(os.path.join(ckpt, "fit2"))


def test_a_checkpoint_of_another_model_is_refused_with_the_way_out(local):
    ip, ckpt = local
    run_ok(ip, MODEL)
    run_ok(ip, "train_ds = dying(clean_ds, 8 + 2, fail)")
    run_err(ip, STEP.format(flags=f"--checkpoint {ckpt}"))            # leaves ckpt-1
    run_ok(ip, "%%distribute\nmodel = tf.keras.Sequential([tf.keras.Input((4,)), "
               "tf.keras.layers.Dense(3), tf.keras.layers.Dense(1)])\n"
               "optimizer = tf.keras.optimizers.Adam(0.01)")
    ip.user_ns["train_ds"] = ip.user_ns["clean_ds"]
    err = run_err(ip, STEP.format(flags=f"--checkpoint {ckpt}"))
    assert isinstance(err, CheckpointError), repr(err)
    assert "does not fit this training" in str(err) and "delete" in str(err)
    assert "another --checkpoint directory" in str(err)
    assert nbdist.runs[-1].status == "failed"


def test_an_unwritable_directory_fails_before_training(local, tmp_path):
    ip, _ = local
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    before = len(nbdist.runs)
    err = run_err(ip, STEP.format(flags=f"--checkpoint {blocker}/ckpt"))
    assert isinstance(err, CheckpointError) and "cannot write there" in str(err)
    assert "give a directory you can write to" in str(err) and len(nbdist.runs) == before


def test_a_cell_that_trains_nothing_says_so(local, capsys):
    ip, ckpt = local
    ip.user_ns["train_ds"] = ip.user_ns["clean_ds"]
    err = run_err(ip, f"%%distribute --step --data train_ds --checkpoint {ckpt}\n"
                      "loss = tf.reduce_mean(batch[1])\n")
    assert isinstance(err, CheckpointError) and "names nothing to save" in str(err)
    run_ok(ip, f"%%distribute --checkpoint {ckpt}\nunused = 1\n")
    assert "this cell called no model.fit, so nothing was saved" in capsys.readouterr().out
