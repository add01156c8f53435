"""The arithmetic of benchmarks/allreduce_ring.py: the ring all-reduce model it prints
measured/model against, the sizes and link rates it reads (as ``tc`` reads rates), and that
the model agrees with the bus bandwidth the dashboard shows (``series.bus_bandwidth``)."""

import importlib.util
import os

import pytest
from hostbed import rate_bytes

from nbdist.widgets.series import bus_bandwidth

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "allreduce_ring", os.path.join(HERE, "..", "benchmarks", "allreduce_ring.py"))
ring = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ring)

GBIT = 125e6   # bytes/s
MIB16 = 16 * 1024 * 1024


def test_the_model_is_2_n_minus_1_over_n_bytes_over_bandwidth_plus_2_n_minus_1_latencies():
    # 2 hosts: 1 reduce-scatter and 1 all-gather step, each half the tensor
    assert ring.ring_model_ms(MIB16, 2, GBIT, 0.5) == pytest.approx(134.217728 + 1.0)
    # 3 hosts: 4 steps of a third: 4/3 of the tensor crosses each link
    assert ring.ring_model_ms(MIB16, 3, GBIT, 0.5) == pytest.approx(178.956971 + 2.0)
    assert ring.ring_model_ms(1024, 3, GBIT, 0.5) == pytest.approx(0.010923 + 2.0, abs=1e-6)
    assert ring.ring_model_ms(MIB16, 1, GBIT, 0.5) == 0.0   # nothing to exchange


@pytest.mark.parametrize("hosts", [2, 3, 8])
def test_at_the_model_time_the_dashboards_bus_bandwidth_is_the_link_rate(hosts):
    seconds = ring.ring_model_ms(MIB16, hosts, GBIT, 0.0) / 1e3
    assert bus_bandwidth(MIB16, hosts, seconds) == pytest.approx(GBIT)
    # latency only lowers it, the more the smaller the message
    slow = ring.ring_model_ms(1024, hosts, GBIT, 0.5) / 1e3
    assert bus_bandwidth(1024, hosts, slow) < GBIT / 100


def test_rates_read_as_tc_reads_them():
    assert rate_bytes("1gbit") == 125e6
    assert rate_bytes("100mbit") == 12.5e6
    assert rate_bytes("125mbps") == 125e6   # bps: bytes per second
    assert rate_bytes("1.5Mbit") == 187500
    for bad in ("1 gigabit", "fast", "10"):
        with pytest.raises(ValueError, match="write it as tc does"):
            rate_bytes(bad)


def test_sizes_and_step_counts():
    assert [ring.parse_size(s) for s in ring.SIZES.split(",")] == [4 ** k * 1024
                                                                   for k in range(8)]
    assert ring.parse_size("4096") == 4096
    with pytest.raises(ValueError, match="16M"):
        ring.parse_size("16 megs")
    # about --seconds of model time per size, 8 to 40 timed steps, plus the dropped warm-up
    assert ring.steps_for(0.01, 3.0) == ring.WARMUP + 40
    assert ring.steps_for(300.0, 3.0) == ring.WARMUP + 10
    assert ring.steps_for(10_000.0, 3.0) == ring.WARMUP + 8
