"""nbdist.graphview on real traced functions: ops, edges, devices, collectives, collapsing."""

from __future__ import annotations

import os
import sys
from collections import Counter

import pytest
from helpers import run_err, run_ok

from nbdist.errors import ConfigError
from nbdist.graphview import UNPINNED, device_label, graph_view

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("device, label", [
    ("/job:localhost/replica:0/task:0/device:CPU:1", "CPU:1"),
    ("/device:GPU:3", "GPU:3"),
    ("/cpu:0", "CPU:0"),
    ("/job:worker/replica:0/task:1/device:CPU:0", "worker:1/CPU:0"),
    ("/job:ps/task:0", "ps:0"),
    ("", UNPINNED),
])
def test_device_label(device, label):
    assert device_label(device) == label


@pytest.fixture(scope="module")
def tf(ip):   # the shared shell made the 4 logical CPU devices first
    import tensorflow

    return tensorflow


@pytest.fixture(scope="module")
def nested(tf):
    """A tf.function calling another one, inside and outside a loop, plus an if."""

    @tf.function
    def inner(x):
        return tf.nn.relu(x) * 2.0

    @tf.function
    def outer(x, n):
        for _ in tf.range(n):
            x = inner(x) + 1.0
        if tf.reduce_sum(x) > 0:
            x = x - 1.0
        return inner(x)

    args = (tf.ones((3,)), tf.constant(2))
    return outer, args, outer.get_concrete_function(*args).graph


def test_top_graph_counts_match_tensorflow(nested):
    outer, args, graph = nested
    view = graph_view(outer, *args, expand_functions=False)
    ops = graph.get_operations()
    assert sorted(op.id for op in view.ops) == sorted(op.name for op in ops)
    assert Counter(op.type for op in view.ops) == Counter(op.type for op in ops)
    tensors = sum(len(op.inputs) for op in ops)
    controls = sum(len(op.control_inputs) for op in ops)
    assert sum(not c for *_, c in view.edges) == tensors
    assert sum(c for *_, c in view.edges) == controls
    # Small enough: one drawn node per op, one drawn edge per (producer, consumer) pair.
    assert not view.collapsed and len(view.nodes) == len(ops)
    pairs = {(s, d) for s, d, _ in view.edges if s != d}
    assert set(view.node_edges) == pairs


def test_nested_function_bodies_are_inlined(nested):
    outer, args, graph = nested
    view = graph_view(outer, *args)
    types = Counter(op.type for op in view.ops)
    top = Counter(op.type for op in graph.get_operations())
    assert top["PartitionedCall"] == 1 and types["PartitionedCall"] == 0   # the call vanished
    assert types["Relu"] == 2                    # inner's body: after the loop and inside it
    assert types["Less"] == 1 and types["Sub"] >= 2          # while cond, if branch
    ids = {op.id for op in view.ops}
    assert all(s in ids and d in ids for s, d, _ in view.edges)
    relu_after = next(op.id for op in view.ops if op.type == "Relu"
                      and op.id.startswith("PartitionedCall/"))
    # The call's argument is wired through: cond/Identity feeds inner's Relu directly.
    assert ("cond/Identity", relu_after, False) in view.edges
    assert {op.function for op in view.ops} >= {"", *[f for f in graph._functions]}


@pytest.fixture(scope="module")
def mirrored_step(tf):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3),
                                     tf.keras.layers.Dense(1)])
        optimizer = tf.keras.optimizers.SGD(0.1)
        optimizer.build(model.trainable_variables)
    data = tf.data.Dataset.from_tensor_slices((tf.ones((8, 4)), tf.ones((8, 1)))).batch(8)
    batch = next(iter(strategy.experimental_distribute_dataset(data)))

    def replica_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return loss

    @tf.function
    def step(b):
        return strategy.run(replica_step, args=b)

    return step, batch


def test_mirrored_step_devices_and_collectives(mirrored_step):
    step, batch = mirrored_step
    view = graph_view(step, batch, max_nodes=10_000)
    assert set(view.devices) - {UNPINNED} == {"CPU:0", "CPU:1"}
    collectives = view.collectives
    assert {op.type for op in collectives} <= {"CollectiveReduceV2", "CollectiveReduceV3"}
    assert Counter(op.label for op in collectives) == {"CPU:0": 1, "CPU:1": 1}
    assert [set(p) for p in view.peers()] == [{op.id for op in collectives}]
    summary = view.summary
    assert summary["ops"].sum() == len(view.ops)
    assert summary.loc["CPU:0", "collective ops"] == summary.loc["CPU:1", "collective ops"] == 1
    # Both replicas run the same ops: their devices hold (almost) as many.
    assert abs(summary.loc["CPU:0", "ops"] - summary.loc["CPU:1", "ops"]) <= 5


def test_collapsed_graph_keeps_every_op_once_and_collectives_alone(mirrored_step):
    step, batch = mirrored_step
    view = graph_view(step, batch, max_nodes=40)
    assert view.collapsed and len(view.nodes) <= 45   # depth 0 is the floor
    members = [op.id for node in view.nodes for op in node.ops]
    assert sorted(members) == sorted(op.id for op in view.ops)
    assert all(len(n.ops) == 1 for n in view.nodes if n.collective)
    assert all(len({op.label for op in n.ops}) == 1 for n in view.nodes)   # never across devices
    owner = {op.id: n.id for n in view.nodes for op in n.ops}
    crossing = Counter((owner[s], owner[d]) for s, d, _ in view.edges if owner[s] != owner[d])
    assert sum(map(sum, view.node_edges.values())) == sum(crossing.values())
    # The peers of the all-reduce are drawn in one layer, one lane per device.
    pos = view.positions()
    a, b = view.peers()[0]
    assert pos[a][0] == pos[b][0] and pos[a][1] != pos[b][1]


def test_figure_draws_every_node_and_highlights_collectives(mirrored_step):
    step, batch = mirrored_step
    view = graph_view(step, batch)
    fig = view.figure
    markers = [t for t in fig.data if t.type == "scatter" and t.mode != "lines+markers"
               and t.mode != "lines"]
    assert sum(len(t.x) for t in markers) == len(view.nodes)
    diamonds = [s for t in markers for s in t.marker.symbol if s == "diamond"]
    assert len(diamonds) == 2
    assert any(t.name == "talk to each other" for t in fig.data)
    table = next(t for t in fig.data if t.type == "table")
    assert list(table.cells.values[0]) == view.devices


def test_partition_graphs_pair_each_send_with_its_receive(tf):
    g = tf.Graph()
    with g.as_default():
        inp = tf.compat.v1.placeholder(tf.float32, [None, 2], name="inp")
        with tf.device("/cpu:0"):
            h = tf.multiply(inp, tf.constant(2.0) * tf.constant(3.0), name="h")
        with tf.device("/cpu:1"):
            total = tf.reduce_sum(h, name="total")
    with tf.compat.v1.Session(graph=g) as sess:
        meta = tf.compat.v1.RunMetadata()
        sess.run(total, {inp: [[1.0, 2.0]]}, run_metadata=meta,
                 options=tf.compat.v1.RunOptions(output_partition_graphs=True))
    view = graph_view(list(meta.partition_graphs))
    assert set(view.devices) == {"CPU:0", "CPU:1"}
    assert len(view.ops) == sum(len(p.node) for p in meta.partition_graphs)
    sends = {op.id: op for op in view.ops if op.type == "_Send"}
    recvs = {op.id: op for op in view.ops if op.type == "_Recv"}
    pairs = view.peers()
    assert len(pairs) == len(sends) == len(recvs) >= 2      # the value there, the result back
    for send, recv in pairs:
        assert sends[send].tensor == recvs[recv].tensor
        assert sends[send].label != recvs[recv].label
    assert "send/recv" in view.figure.layout.title.text
    assert {op.id: op.type for op in view.ops}["mul"] == "Const"      # 2 * 3, folded


def test_plain_function_and_bad_input(tf):
    view = graph_view(lambda x: tf.matmul(x, x) + 1.0, tf.ones((2, 2)))
    assert {"MatMul", "AddV2"} <= {op.type for op in view.ops}
    with pytest.raises(TypeError, match="tf.function"):
        graph_view(42)
    with pytest.raises(ValueError, match="max_nodes"):
        graph_view(lambda x: x, tf.ones(()), max_nodes=0)


def test_step_cell_graph_flag(ip):
    from IPython.utils.capture import capture_output

    run_ok(ip, """
        import numpy as np, tensorflow as tf
        gv_ds = tf.data.Dataset.from_tensor_slices(
            (np.ones((32, 3), "float32"), np.ones((32, 1), "float32"))).batch(8)
    """)
    run_ok(ip, """
        %%distribute
        gv_model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
        gv_opt = tf.keras.optimizers.SGD(0.1)
    """)
    with capture_output() as cap:
        run_ok(ip, """
            %%distribute --step --data gv_ds --steps 3 --graph
            x, y = batch
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss((gv_model(x) - y) ** 2, global_batch_size=8)
            grads = tape.gradient(loss, gv_model.trainable_variables)
            gv_opt.apply_gradients(zip(grads, gv_model.trainable_variables))
        """)
    figures = [o.data["application/vnd.plotly.v1+json"] for o in cap.outputs
               if "application/vnd.plotly.v1+json" in o.data]
    figures = [f for f in figures if "compiled step" in f["layout"]["title"]["text"]]
    assert figures, f"no graph was displayed: {cap.stdout} {[o.data.keys() for o in cap.outputs]}"
    import nbdist

    run = nbdist.runs[-1]
    assert run.status == "done" and run.steps_done == 3
    assert figures[-1]["layout"]["title"]["text"].startswith("<b>compiled step</b>")
    replicas = run.replicas
    names = [t.get("name", "") for t in figures[-1]["data"]]
    assert sum(n.endswith("communication") for n in names) == replicas
    err = run_err(ip, "%%distribute --graph\nx = 1")
    assert isinstance(err, ConfigError) and "--step" in str(err)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
