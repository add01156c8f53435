import pytest

from nbdist.errors import ConfigError
from nbdist.spec import STRATEGY_NAMES, RunSpec, StrategySpec, suggest_strategy


def test_unknown_strategy_suggests_closest_name():
    with pytest.raises(ConfigError, match="Did you mean `mirrored`"):
        StrategySpec("mirored")
    assert "multiworker" in suggest_strategy("multi-worker")


@pytest.mark.parametrize("flag", ["devices", "workers", "ps"])
@pytest.mark.parametrize("value", [0, -2])
def test_counts_must_be_positive(flag, value):
    name = "parameter_server" if flag in ("workers", "ps") else "mirrored"
    with pytest.raises(ConfigError, match=f"--{flag} {value}"):
        StrategySpec(name, **{flag: value})


def test_flags_that_do_not_fit_the_strategy():
    with pytest.raises(ConfigError, match="exactly one device"):
        StrategySpec("one_device", devices=2)
    with pytest.raises(ConfigError, match="worker processes"):
        StrategySpec("mirrored", workers=2)
    with pytest.raises(ConfigError, match="--tpu"):
        StrategySpec("mirrored", tpu="grpc://x:1")


def test_magic_line_and_json_round_trip():
    spec = StrategySpec("mirrored", devices=4)
    assert spec.magic_line() == "%distribute mirrored --devices 4"
    assert StrategySpec.from_json(spec.to_json()) == spec
    assert all(StrategySpec(n).name == n for n in STRATEGY_NAMES if n != "tpu")
    with pytest.raises(ConfigError, match="Unknown strategy fields"):
        StrategySpec.from_json('{"name": "mirrored", "gpus": 2}')


def test_run_spec_validation():
    with pytest.raises(ConfigError, match="--step needs --data"):
        RunSpec(step=True)
    with pytest.raises(ConfigError, match="only apply to step mode"):
        RunSpec(data="ds")
    with pytest.raises(ConfigError, match="--epochs 0"):
        RunSpec(step=True, data="ds", epochs=0)
    with pytest.raises(ConfigError, match="not a Python variable name"):
        RunSpec(step=True, data="my-ds")
    assert RunSpec(step=True, data="ds", steps=5).steps == 5
