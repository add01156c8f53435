"""Run.explain() on runs built by hand, one per rule: input, dispatch, communication, a straggler
and its cause and gain on a shared machine, a congested link's stalls that are no straggler, a
model too small for its replicas, nothing to fix; the parts add up to the measured step."""

from __future__ import annotations

import dataclasses

import pytest

from nbdist.errors import ConfigError
from nbdist.hooks.tf_data import Stage
from nbdist.telemetry.explain import PARTS, Baseline, InputRate, explain
from nbdist.telemetry.ring import ring_model_ms
from nbdist.telemetry.run import Run, RunWriter


def synthetic(*, steps=60, replicas=1, workers=1, compute=10.0, data=0.5, ready=None,
              allreduce=1.0, outside=0.5, between=0.2, nbytes=4000, late=None,
              slow_input=None, stalls=None, timed_every=5, collectives=0.0) -> Run:
    """A finished step run of ``steps`` steps: per step ``data`` ms fetching (``ready`` after
    the two compile steps), the replicas' ``compute`` (a list: one per replica, taking turns
    never), the gradient all-reduce, ``outside`` ms of dispatch, ``between`` ms between steps.
    ``late=(worker, ms)``: that worker reaches every step ``ms`` later (time between its
    steps); ``slow_input=(worker, ms)``: its fetch takes ``ms`` more. The others wait for it as
    the kernel records it: inside the all-reduce, or at the iterator (in wait_ms).
    ``stalls=(ms, {step: worker})``: at those steps that worker's all-reduce ends ``ms`` later
    (a congested link). ``collectives``: ms of other collectives in each replica's step."""
    run = Run(id=7, mode="step", strategy="mirrored" if workers == 1 else "multiworker",
              replicas=replicas, workers=workers, allreduce_bytes=nbytes)
    writer = RunWriter(run)
    computes = compute if isinstance(compute, list) else [compute] * replicas
    clock = dict.fromkeys(range(workers), 1000.0)
    for step in range(steps):
        timed = step % timed_every == 0
        for w in range(workers):
            delay = late[1] if late and late[0] != w else 0.0       # waiting in the all-reduce
            if stalls and stalls[1].get(step) == w:
                delay += stalls[0]
            moved = slow_input[1] if slow_input and slow_input[0] != w else 0.0
            fetch = data + (slow_input[1] if slow_input and slow_input[0] == w else 0.0)
            if step in (1, 2) and ready is not None:
                fetch = ready
            span = max(computes) + allreduce + delay + collectives
            step_ms = 400.0 if step < 2 else span + outside + (0.3 if timed else 0.0)
            gap = between + (late[1] if late and late[0] == w else 0.0)
            clock[w] += (fetch + moved + step_ms + gap) / 1e3
            writer.record_step(
                step, 0, loss=[1.0] * replicas, step_ms=step_ms, data_ms=fetch, worker=w,
                # the timed step's timestamps serialise it: its replicas compute longer
                compute_ms=[c + 0.3 for c in computes] if timed else None,
                wait_ms=[max(computes) - c + moved for c in computes] if timed
                else ([moved] * replicas if moved else None),
                allreduce_ms=[allreduce + delay] * replicas if timed else None,
                other_collective_ms=[collectives] * replicas if timed else None,
                wall_time=clock[w])
    writer.finish("done")
    return run


def _parts_add_up(explained, run):
    frame = explained.breakdown
    assert (frame[list(PARTS)].sum(axis=1) - frame.step_ms).abs().max() < 1e-6
    assert set(zip(frame.worker, frame.replica, strict=True)) == {
        (w, r) for w in range(run.workers) for r in range(run.replicas)}


def test_a_pipeline_slower_than_the_step_is_input_bound():
    run = synthetic(compute=2.0, data=15.0, ready=1.0)
    explained = run.explain()
    _parts_add_up(explained, run)
    assert explained.bottleneck == "input"
    first = explained.advice[0]
    assert "prefetch" in first.text and "num_parallel_calls" in first.text
    # 15 ms fetching (1 of it a ready batch's), 3.5 ms step, 0.06 ms of timing, 0.2 between
    assert first.evidence.startswith("data wait 14.00 ms of each 18.76 ms step")
    assert first.gain == pytest.approx(18.76 / 4.76 - 1, rel=0.01)
    assert "bottleneck: input" in explained.text and "waiting for input" in explained.text


def test_a_step_smaller_than_its_call_is_dispatch_bound():
    # fetching takes 1.3 ms, 0.3 of it when the batch is ready: a wait shorter than the
    # host's own fetching and dispatching is that work slowed, not a slow pipeline
    run = synthetic(replicas=4, compute=0.1, allreduce=0.3, outside=2.0, data=1.3, ready=0.3)
    explained = run.explain()
    _parts_add_up(explained, run)
    assert explained.bottleneck == "dispatch"
    assert [a.kind for a in explained.advice] == ["dispatch"]
    first = explained.advice[0]
    assert "--steps-per-call auto" in first.text
    assert first.evidence.startswith("dispatching each call 2.00 ms of each")
    # several steps a call save the dispatch and that wait: 2 + 1 ms
    step = explained.breakdown.step_ms.mean()
    assert first.gain == pytest.approx(step / (step - 3.0) - 1, rel=0.01)


def test_an_all_reduce_longer_than_the_compute_is_communication_bound():
    rate, latency = 12.5e6, 0.5
    nbytes = 4_000_000
    model = ring_model_ms(nbytes, 2, rate, latency)          # 321 ms on 2 ranks
    run = synthetic(workers=2, compute=40.0, allreduce=model * 1.2, nbytes=nbytes, outside=1.0)
    explained = run.explain(link=(rate, latency))
    _parts_add_up(explained, run)
    assert explained.bottleneck == "communication"
    # the all-reduce, split into the α-β model's prediction and what it took beyond it
    assert explained.breakdown.allreduce.mean() == pytest.approx(model, rel=0.01)
    assert explained.breakdown.allreduce_extra.mean() == pytest.approx(model * 0.2, rel=0.02)
    first = explained.advice[0]
    assert "larger batch" in first.text and first.unit == "examples/s"
    assert first.evidence.startswith("4 MB of gradients per replica take")
    assert "α-β model 321.00 ms" in first.evidence
    assert "12.5 MB/s, 0.5 ms link predicts 321.00 ms" in explained.text


def test_a_worker_late_between_its_steps_is_the_straggler():
    run = synthetic(workers=2, compute=3.0, late=(1, 40.0))
    explained = run.explain()
    _parts_add_up(explained, run)
    assert explained.bottleneck == "straggler"
    first = explained.advice[0]
    assert first.text.startswith("worker 1 is the straggler")
    assert "time outside its steps" in first.text
    waited = float(first.evidence.split("the others waited ")[1].split(" ms")[0])
    assert waited == pytest.approx(40.0, abs=0.5), first.evidence
    assert first.gain > 5


def test_workers_sharing_a_machine_add_up_their_own_work_once_the_straggler_is_gone():
    apart = synthetic(workers=2, compute=3.0, late=(1, 40.0))
    shared = synthetic(workers=2, compute=3.0, late=(1, 40.0))
    shared.machines = ("box", "box")
    gains = []
    for run in (apart, shared):
        explained = run.explain()
        first = explained.advice[0]
        assert explained.bottleneck == "straggler", explained.text
        after = float(first.evidence.split("a step takes about ")[1].split(" ms")[0])
        gains.append(first.gain)
        # each worker's own work: its fetch, compute, dispatch and time between steps (and
        # ~0.1 ms of timing, ~0.2 ms of the timed steps' longer compute)
        own = 0.5 + 3.0 + 0.5 + 0.2
        step = explained.breakdown.step_ms.mean()
        expected = (2 if run is shared else 1) * own + 1.0   # ... and the all-reduce, once
        assert after == pytest.approx(expected, abs=0.7), first.evidence
        assert first.gain == pytest.approx(step / after - 1, rel=0.03)
    assert "workers 0, 1 share one machine's cores" in explained.advice[0].evidence
    assert gains[1] < gains[0] / 1.5


def test_a_congested_link_stalling_now_and_then_is_no_straggler():
    # an all-reduce ending 900 ms later on one side at four of eleven timed steps (three on
    # worker 1): the others waited long at a few steps, not for one worker at most steps
    rate, latency = 12.5e6, 0.5
    nbytes = 4_000_000
    model = ring_model_ms(nbytes, 2, rate, latency)
    run = synthetic(workers=2, compute=40.0, allreduce=model, nbytes=nbytes, outside=1.0,
                    stalls=(900.0, {10: 1, 25: 1, 40: 1, 55: 0}))
    explained = run.explain(link=(rate, latency))
    _parts_add_up(explained, run)
    assert [a.kind for a in explained.advice] == ["communication"], explained.text


def test_a_worker_with_a_slow_input_is_the_straggler_because_of_its_input():
    run = synthetic(workers=3, compute=3.0, slow_input=(2, 30.0))
    explained = run.explain()
    assert explained.bottleneck == "straggler"
    assert explained.advice[0].text.startswith("worker 2 is the straggler")
    assert "its input pipeline" in explained.advice[0].text


def test_a_model_too_small_for_its_replicas_is_told_to_use_fewer():
    run = synthetic(replicas=4, compute=0.05, allreduce=2.0, outside=0.1, data=0.1,
                    between=0.05)
    explained = run.explain()
    assert explained.bottleneck == "tiny model"
    assert "use fewer replicas" in explained.advice[0].text
    # 4 KB of gradients: the all-reduce's latency, not its bandwidth; no "communication"
    assert [a.kind for a in explained.advice] == ["tiny model"]


def test_synchronized_batch_norm_collectives_are_named_with_their_fix():
    run = synthetic(replicas=4, compute=1.0, allreduce=0.4, outside=1.0, data=0.5,
                    collectives=8.0)
    explained = run.explain()
    _parts_add_up(explained, run)
    assert explained.bottleneck == "communication", explained.text
    first = explained.advice[0]
    assert "`BatchNormalization()` (each replica's own statistics)" in first.text
    assert first.evidence.startswith("other collectives 7.7")   # scaled to untimed steps
    step = explained.breakdown.step_ms.mean()
    others = explained.breakdown.other_collectives.mean()
    assert first.gain == pytest.approx(step / (step - others) - 1, rel=0.01)
    assert "tiny model" not in [a.kind for a in explained.advice]


def test_a_compute_bound_run_has_nothing_to_fix():
    run = synthetic(replicas=2, compute=[50.0, 48.0], allreduce=1.0, data=1.0, outside=1.0)
    explained = run.explain()
    _parts_add_up(explained, run)
    assert explained.bottleneck == "balanced" and explained.advice == []
    assert "Nothing to fix: the replicas' own compute is 9" in explained.text
    assert "Nothing to fix" in explained._repr_html_()


def python_map_rate(ms: float, cpu: float = 0.5, parallel: bool = False) -> InputRate:
    """A pipeline timed alone at ``ms`` a batch whose third stage maps with tf.py_function."""
    stages = (Stage("TensorSliceDataset", 0), Stage("BatchDatasetV2", 1),
              Stage("ParallelMapDatasetV2" if parallel else "MapDataset", 2,
                    ("tf.py_function",)), Stage("RepeatDataset", 3))
    return InputRate(ms, cpu, batches=200, seconds=1.1, stages=stages, cores=2)


def test_a_python_map_that_sets_the_pace_is_input_with_its_fix_and_prediction():
    # the rows alone read as dispatch: a short wait, a long dispatch (the interpreter busy
    # with the map's Python work while it dispatches)
    run = synthetic(replicas=4, compute=0.1, allreduce=0.3, outside=2.0, data=1.3, ready=0.3)
    assert run.explain(measure=False).bottleneck == "dispatch"
    explained = explain(run, input_rate=python_map_rate(6.0))
    _parts_add_up(explained, run)
    assert explained.bottleneck == "input", explained.text
    first = explained.advice[0]
    assert "Python work in its `map` (stage 3 of 4, MapDataset) runs one element" in first.text
    assert "`.map(..., num_parallel_calls=tf.data.AUTOTUNE)`" in first.text
    assert "`.prefetch(tf.data.AUTOTUNE)` last" in first.text
    step = explained.breakdown.step_ms.mean()
    ready = step - explained.breakdown.input.mean()
    # in parallel on 2 cores the pipeline takes 3 ms a batch: the step with a ready batch
    # (about 3.3 ms) is then the pace
    assert first.gain == pytest.approx(step / max(ready, 3.0) - 1, rel=0.01), first.evidence
    assert "timed alone, the pipeline gives a batch every 6.00 ms" in first.evidence
    # several steps a call still read one batch a step from the pipeline: no faster than it
    assert all(a.gain <= step / 6.0 - 1 + 1e-9 for a in explained.advice[1:]), explained.text
    assert "input pipeline timed alone: 6.00 ms a batch" in explained.text
    assert "the pipeline sets the pace" in explained.text


def test_python_work_that_keeps_a_core_busy_is_cached_not_run_in_parallel():
    # 5.5 of the pipeline's 6 ms a batch are CPU: Python holding the interpreter, which
    # threads cannot run in parallel
    run = synthetic(replicas=4, compute=0.1, allreduce=0.3, outside=2.0, data=7.0, ready=0.3)
    explained = explain(run, input_rate=python_map_rate(6.0, cpu=5.5))
    assert explained.bottleneck == "input", explained.text
    first = explained.advice[0]
    assert "threads cannot run it in parallel" in first.text and "`.cache()`" in first.text
    step = explained.breakdown.step_ms.mean()
    ready = step - explained.breakdown.input.mean()
    # done once (cached), the work is gone: the step with a ready batch is the step
    assert first.gain == pytest.approx(step / ready - 1, rel=0.01), first.evidence
    assert "(5.50 ms of it CPU)" in first.evidence and "done once" in first.evidence


def test_a_pipeline_timed_slower_than_the_run_it_fed_predicts_no_loss():
    # timed alone while the machine was busier: 60 ms a batch for a run of ~19 ms a step
    run = synthetic(compute=2.0, data=15.0, ready=1.0)
    explained = explain(run, input_rate=python_map_rate(60.0))
    first = explained.advice[0]
    assert explained.bottleneck == "input" and first.gain > 0, explained.text
    # 12 ms of CPU a batch: little of 60 ms, most of the run's step: Python keeping a core busy
    explained = explain(run, input_rate=python_map_rate(60.0, cpu=12.0))
    first = explained.advice[0]
    assert "threads cannot run it in parallel" in first.text and first.gain > 0, explained.text


def test_a_serial_stage_the_run_waited_for_is_input_near_the_pace_too():
    # timed alone at 0.6 of the step's own time (a quieter machine than during the run), but
    # the run waited 14 ms a step and the map runs one element at a time, unprefetched
    run = synthetic(compute=2.0, data=15.0, ready=1.0)
    ready = run.explain(measure=False).breakdown.step_ms.mean() - 14.0
    assert explain(run, input_rate=python_map_rate(0.6 * ready)).bottleneck == "input"
    parallel = python_map_rate(0.6 * ready, parallel=True)
    assert explain(run, input_rate=parallel).bottleneck != "input"
    # cached after the map: it runs in the first epoch only
    serial = python_map_rate(0.6 * ready)
    cached = dataclasses.replace(serial, stages=(*serial.stages[:3], Stage("CacheDatasetV2", 3),
                                                 Stage("RepeatDataset", 4)))
    assert explain(run, input_rate=cached).bottleneck != "input"


def test_a_pipeline_that_keeps_up_is_no_input_bottleneck_whatever_the_waits():
    # 14 ms of waiting in the rows, but the pipeline alone gives a batch every 0.2 ms
    run = synthetic(compute=2.0, data=15.0, ready=1.0)
    explained = explain(run, input_rate=python_map_rate(0.2))
    assert "input" not in [a.kind for a in explained.advice], explained.text
    assert "the pipeline keeps up" in explained.text


def test_a_tiny_batch_is_told_to_carry_twice_the_examples():
    run = synthetic(replicas=4, compute=0.1, allreduce=0.3, outside=2.0, data=1.3, ready=0.3)
    rate = InputRate(0.1, 0.1, batches=2000, seconds=0.3, cores=2, batch=8)
    explained = explain(run, input_rate=rate)
    first = explained.advice[0]
    assert first.kind == "dispatch" and first.unit == "examples/s", explained.text
    assert first.text.startswith("Each replica gets 2 examples a step")
    assert "`.batch(16)`" in first.text
    step = explained.breakdown.step_ms.mean()
    compute = explained.breakdown.compute.mean()
    assert first.gain == pytest.approx(2 * step / (step + compute) - 1, rel=0.01)
    # 16 examples a replica: no tiny batch
    wide = InputRate(0.1, 0.1, batches=2000, seconds=0.3, cores=2, batch=64)
    assert "Each replica gets" not in explain(run, input_rate=wide).text


def test_an_unmeasured_pipeline_is_said_to_be_inferred():
    explained = synthetic(compute=2.0, data=15.0, ready=1.0).explain()
    assert explained.bottleneck == "input"
    assert ("input: inferred from the step's timings; the pipeline was not timed alone (it "
            "keeps no step cell") in explained.text


def test_replicas_on_shared_cores_are_not_told_to_add_replicas():
    run = synthetic(replicas=2, compute=[50.0, 48.0], allreduce=1.0, data=1.0, outside=1.0)
    run.devices = ("/device:CPU:0", "/device:CPU:1")
    explained = run.explain()
    assert explained.bottleneck == "balanced"
    assert "logical devices sharing this machine's" in explained.text
    assert "more replicas cannot make it faster" in explained.text
    assert "More replicas or devices" not in explained.text


def test_runs_that_cannot_be_explained_say_why():
    with pytest.raises(ConfigError, match="it has 4 step"):
        synthetic(steps=4).explain()
    with pytest.raises(ConfigError, match="no timed steps"):
        synthetic(timed_every=1000).explain()
    fit = Run(id=3, mode="fit", strategy="mirrored", replicas=2)
    with pytest.raises(ConfigError, match="Run 3 cannot be explained: it has no step rows"):
        fit.explain()


def test_replicas_slower_than_one_are_told_to_train_on_one():
    run = synthetic(replicas=4, compute=0.05, allreduce=2.0, outside=0.1, data=0.1,
                    between=0.05)
    rate = run.explain().steps_per_s
    same = run.explain(baseline=None)
    assert same.baseline is None and "scaling" not in same.text
    explained = explain(run, baseline=Baseline(rate, 16, 40, 2.0, "CPU:0"))   # as fast
    assert explained.efficiency == pytest.approx(1.0)
    assert "scaling: 4 replicas give 4.0x one replica's examples/s (efficiency 100%)" in (
        explained.text)
    # the replicas scale: the estimate that fewer would be faster is refuted
    assert [a.kind for a in run.explain().advice] == ["tiny model"]
    assert explained.advice == [] and explained.bottleneck == "balanced"
    slow = explain(run, baseline=Baseline(10 * rate, 16, 40, 2.0, "CPU:0"))
    assert slow.speedup == pytest.approx(0.4) and slow.bottleneck == "tiny model"
    first = slow.advice[0]
    assert first.text.startswith("4 replicas are slower than one on this model")
    assert first.evidence.startswith("measured: one replica ") and first.unit == "examples/s"
    assert first.gain == pytest.approx(1.5)
    assert [a.kind for a in slow.advice].count("tiny model") == 1
