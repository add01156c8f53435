"""The α-β model of a ring all-reduce: what moving a gradient over a link should cost.

A ring all-reduce of ``nbytes`` over ``N`` ranks (reduce-scatter then all-gather, what
TensorFlow's ``RingReduce`` does on CPUs) takes ``2(N-1)`` steps, each moving ``nbytes / N``
over every link at once and paying one link latency: ``2(N-1)/N x bytes / bandwidth +
2(N-1) x latency``. ``benchmarks/allreduce_ring.py`` measures how close nbdist's ``allreduce_ms``
comes to it on simulated hosts; ``telemetry.explain`` splits a run's all-reduce into this
prediction and the rest.
"""

from __future__ import annotations


def ring_model_ms(nbytes: float, ranks: int, bytes_per_s: float, latency_ms: float) -> float:
    """Ring all-reduce time in ms of ``nbytes`` per rank over ``ranks`` ranks on links of
    ``bytes_per_s`` and ``latency_ms`` one way (0 for a single rank: nothing to exchange)."""
    if ranks < 2:
        return 0.0
    steps = 2 * (ranks - 1)
    return steps / ranks * nbytes / bytes_per_s * 1e3 + steps * latency_ms


def ring_bandwidth(nbytes: float, ranks: int, ms: float) -> float:
    """The link bandwidth (bytes/s) at which the model, without latency, takes ``ms``: the bus
    bandwidth of nccl-tests (``bytes x 2(N-1)/N / time``)."""
    if ranks < 2 or ms <= 0:
        return float("nan")
    return 2 * (ranks - 1) / ranks * nbytes / (ms / 1e3)
