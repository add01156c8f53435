"""What the user asked for, validated, with no TensorFlow involved.

``StrategySpec`` is the kernel's strategy choice (``%distribute mirrored --devices 4``);
``RunSpec`` is one ``%%distribute`` cell. Both round-trip through JSON (the lab extension and
the picker exchange them) and render back to the magic line that produces them.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError
from .families import (
    STRATEGY_NAMES,
    Family,
    either,
    families,
    family,
    suggest_strategy,
    taking,
)
from .words import count

__all__ = ["PARTITIONERS", "PLACEMENT_FLAGS", "STRATEGY_NAMES", "RunSpec", "StrategySpec",
           "partitioner_parts", "suggest_strategy"]

#: The flags that place a strategy (StrategySpec's fields after its name), in line order.
PLACEMENT_FLAGS = ("devices", "workers", "ps", "cluster", "tpu", "partitioner")

#: ``--partitioner KIND:NUMBER``: TensorFlow's partitioner each kind makes (its argument), for
#: ParameterServerStrategy(variable_partitioner=...).
PARTITIONERS: dict[str, str] = {
    "min_size": "MinSizePartitioner(min_shard_bytes=NUMBER, max_shards=PS)",
    "max_size": "MaxSizePartitioner(max_shard_bytes=NUMBER)",
    "fixed": "FixedShardsPartitioner(num_shards=NUMBER)",
}
#: What each placement flag taking text names, and an example, for messages.
_NAMED = {"cluster": "it names an ipyparallel profile whose engines run the workers "
                     "(without --cluster they run on this machine)",
          "tpu": "it names a TPU or its grpc:// address",
          "partitioner": "it shards variables as KIND:NUMBER"}
_EXAMPLES = {"cluster": "ssh", "tpu": "grpc://10.0.0.2:8470", "partitioner": "min_size:256k"}
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def partitioner_parts(text: str) -> tuple[str, int]:
    """``--partitioner`` as (kind, number): ``min_size:256k`` -> ("min_size", 262144).
    Sizes take a k, m or g suffix (powers of 1024); raise a ConfigError for anything else."""
    kind, _, number = text.partition(":")
    digits = number.strip().lower()
    unit = digits[-1:] if digits[-1:] in ("k", "m", "g") and kind != "fixed" else ""
    digits = digits[:len(digits) - len(unit)]
    if kind not in PARTITIONERS or not digits.isdigit() or int(digits) < 1:
        raise ConfigError(
            f"--partitioner {text!r} is not a partitioner: give KIND:NUMBER, one of "
            "`min_size:BYTES` (shards of at least BYTES, at most one per parameter server, as "
            "TensorFlow's parameter-server tutorial does), `max_size:BYTES` (shards of at most "
            "BYTES) or `fixed:N` (N shards), with BYTES like 262144 or 256k, e.g. "
            "`%distribute parameter_server --ps 2 --partitioner min_size:256k`.")
    return kind, int(digits) * _UNITS[unit]


@dataclass(frozen=True)
class StrategySpec:
    """A validated strategy choice. ``devices=None`` means "all local GPUs, else 1 CPU"."""

    name: str
    devices: int | None = None
    workers: int | None = None
    ps: int | None = None
    cluster: str | None = None
    tpu: str | None = None
    partitioner: str | None = None   # parameter_server: KIND:NUMBER (see PARTITIONERS)

    def __post_init__(self) -> None:
        fam = family(self.name)   # an unknown name: the closest known one
        for flag in ("cluster", "tpu", "partitioner"):
            value = getattr(self, flag)
            if value is not None and not value.strip():
                raise ConfigError(
                    f"--{flag} was given an empty value: {_NAMED[flag]}, e.g. `%distribute "
                    f"{self.name if flag in fam.flags else taking(flag)[0]} --{flag} "
                    f"{_EXAMPLES[flag]}`, or drop --{flag}. "
                    "The notebook's strategy is unchanged.")
        for flag in ("devices", "workers", "ps"):
            value = getattr(self, flag)
            if value is not None and value < 1:
                raise ConfigError(
                    f"--{flag} {value} is not allowed: it counts {flag} and must be at least 1 "
                    f"(for example `%distribute {self.name} --{flag} 2`)."
                )
        if fam.max_devices is not None and self.devices is not None \
                and self.devices > fam.max_devices:
            raise ConfigError(self._refusal(fam, "devices") or (
                f"`{self.name}` runs on at most {count(fam.max_devices, 'device')}, but --devices "
                f"{self.devices} was given."))
        if fam.in_kernel and (self.workers or self.ps or self.cluster):
            workers = tuple(f.name for f in families() if not f.in_kernel)
            raise ConfigError(
                f"--workers/--ps/--cluster start separate worker processes, which `{self.name}` "
                f"does not use (it runs inside this kernel). Use {either(workers)}, or drop "
                "those flags."
            )
        if self.ps and "ps" not in fam.flags:
            raise ConfigError(self._refusal(fam, "ps")
                              or f"--ps only applies to {either(taking('ps'))}.")
        if self.tpu and "tpu" not in fam.flags:
            raise ConfigError(self._refusal(fam, "tpu") or (
                f"--tpu names a TPU, which `{self.name}` does not use. "
                f"Use `%distribute {taking('tpu')[0]} --tpu ADDRESS`."
            ))
        if self.devices is not None and "devices" not in fam.flags:
            raise ConfigError(self._refusal(fam, "devices")
                              or f"`{self.name}` does not take --devices; drop it.")
        if self.partitioner is not None:
            if "partitioner" not in fam.flags:
                raise ConfigError(self._refusal(fam, "partitioner") or (
                    f"--partitioner shards variables over parameter servers, which "
                    f"`{self.name}` does not have. Use `%distribute {taking('partitioner')[0]} "
                    f"--partitioner {self.partitioner}`, or drop --partitioner."))
            partitioner_parts(self.partitioner)
        for flag in PLACEMENT_FLAGS:   # what no rule above names
            if getattr(self, flag) is not None and flag not in fam.flags:
                raise ConfigError(self._refusal(fam, flag)
                                  or f"`{self.name}` does not take --{flag}; drop it.")

    def _refusal(self, fam: Family, flag: str) -> str | None:
        message = fam.flag_error(flag)
        return None if message is None else message.format(**self.to_dict())

    @property
    def family(self) -> Family:
        """Everything nbdist knows about this strategy (``nbdist.families``)."""
        return family(self.name)

    @property
    def tf_class(self) -> str:
        return self.family.tf_class

    def magic_line(self) -> str:
        """The ``%distribute`` line that produces this spec."""
        parts = ["%distribute", self.name]
        for flag in PLACEMENT_FLAGS:
            value = getattr(self, flag)
            if value is not None:
                parts += [f"--{flag}", str(value)]
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able fields (how a spec crosses to worker processes and the front end)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StrategySpec:
        _check_fields(cls, data, "strategy")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> StrategySpec:
        return cls.from_dict(json.loads(text))


def _check_fields(cls: type, data: Any, what: str) -> None:
    if not isinstance(data, dict):
        raise ConfigError(f"A {what} spec must be a dict of its fields, got {data!r}.")
    unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise ConfigError(f"Unknown {what} fields {sorted(unknown)} in {data!r}.")


@dataclass(frozen=True)
class RunSpec:
    """One ``%%distribute`` cell: scope mode (``step=False``) or step mode."""

    step: bool = False
    data: str | None = None
    epochs: int = 1
    steps: int | None = None
    loss: str = "loss"
    grads: str | None = None
    show_code: bool = False
    timing_every: int | None = None   # None: automatic (see runner.TimingPacer)
    strategy: StrategySpec | None = None
    checkpoint: str | None = None     # --checkpoint DIR (see nbdist.checkpoint)
    checkpoint_every: int | None = None   # --checkpoint-every K: also every K steps
    steps_per_call: int | str = 1     # K, or "auto" (see nbdist.step.groups)
    elastic: int | None = None        # --elastic N: restarts a worker's death may cost
    name: str | None = None           # --name NAME: the run's label (``Run.label``)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.step and not self.data:
            raise ConfigError(
                "--step needs --data NAME: the tf.data.Dataset whose elements are split across "
                "replicas (for example `%%distribute --step --data train_ds`)."
            )
        if not self.step:
            used = [f"--{n.replace('_', '-')}" for n in ("data", "steps", "grads")
                    if getattr(self, n) is not None]
            if used:
                raise ConfigError(
                    f"{' '.join(used)} only apply to step mode; add --step "
                    "(or drop them to run the cell under the strategy's scope)."
                )
        if self.epochs < 1:
            raise ConfigError(f"--epochs {self.epochs}: give at least 1 epoch.")
        if self.steps is not None and self.steps < 1:
            raise ConfigError(f"--steps {self.steps}: give at least 1 step, or drop --steps.")
        if self.timing_every is not None and self.timing_every < 0:
            raise ConfigError(
                f"--timing-every {self.timing_every}: give 0 (never time the allreduce), "
                "1 (every step) or k (every k-th step)."
            )
        object.__setattr__(self, "steps_per_call", _steps_per_call(self.steps_per_call))
        if self.steps_per_call != 1 and not self.step:
            raise ConfigError("--steps-per-call groups the steps of step mode; add --step "
                              "--data NAME, or drop it.")
        if self.checkpoint is not None and not self.checkpoint.strip():
            raise ConfigError("--checkpoint needs a directory, e.g. `--checkpoint ckpt/run1`.")
        if self.checkpoint_every is not None:
            _check_checkpoint_every(self)
        if self.elastic is not None:
            _check_elastic(self)
        for flag in ("data", "loss", "grads"):
            value = getattr(self, flag)
            if value is not None and not value.isidentifier():
                raise ConfigError(f"--{flag} {value!r} is not a Python variable name.")
        if self.name is not None:
            object.__setattr__(self, "name", _run_name(self.name))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able fields; the inline strategy as its own dict."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["strategy"] = None if self.strategy is None else self.strategy.to_dict()
        data["extra"] = dict(self.extra)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSpec:
        _check_fields(cls, data, "cell")
        strategy = data.get("strategy")
        return cls(**{**data, "strategy": None if strategy is None
                      else StrategySpec.from_dict(strategy)})


#: The restarts ``--elastic`` allows a cell when given without a number.
ELASTIC_RESTARTS = 3


def _check_elastic(spec: RunSpec) -> None:
    """``--elastic N``: a step cell with ``--checkpoint DIR``, N a whole number >= 1."""
    if isinstance(spec.elastic, bool) or not isinstance(spec.elastic, int) or spec.elastic < 1:
        raise ConfigError(
            f"--elastic {spec.elastic!r}: give how many times a cell may restart its workers "
            f"after one dies, a whole number of at least 1 (`--elastic` alone allows "
            f"{ELASTIC_RESTARTS}), e.g. `--elastic 2`. The cell did not run.")
    if not spec.step:
        raise ConfigError(
            "--elastic restarts a step cell's workers when one dies and resumes it from its "
            "--checkpoint; it applies to step cells (`%%distribute --step --data NAME "
            "--checkpoint DIR --elastic`), not to scope cells yet. The cell did not run.")
    if not spec.checkpoint:
        raise ConfigError(
            "--elastic needs --checkpoint DIR: after a worker dies, nbdist starts fresh "
            "workers, which know nothing of the training so far; they resume from the last "
            "checkpoint the cell saved in DIR. Add a directory, e.g. `--checkpoint ckpt/run1 "
            "--elastic`. The cell did not run.")


def _check_checkpoint_every(spec: RunSpec) -> None:
    """``--checkpoint-every K``: a step cell's --checkpoint saved every K steps too."""
    every = spec.checkpoint_every
    if not spec.step or not spec.checkpoint:
        missing = " ".join(flag for flag, given in (("--step --data NAME", spec.step),
                                                   ("--checkpoint DIR", spec.checkpoint))
                           if not given)
        raise ConfigError(
            f"--checkpoint-every {every} saves a step cell's training every {every} steps "
            f"into its --checkpoint directory (besides after each epoch), so it needs "
            f"{missing}: add it, e.g. `%%distribute --step --data train_ds --checkpoint "
            "ckpt/run1 --checkpoint-every 100`, or drop --checkpoint-every.")
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ConfigError(
            f"--checkpoint-every {every!r}: give how many steps apart to save, a whole number "
            "of at least 1, e.g. `--checkpoint-every 100` (each epoch's end is saved anyway).")


NAME_MAX = 40   # characters: a legend entry, not a paragraph


def _run_name(value: Any) -> str:
    """``--name``: a short label of one line (spaces inside kept, at either end dropped)."""
    text = str(value).strip()
    if not text or len(text) > NAME_MAX or not text.isprintable():
        why = ("is empty" if not text else f"has {len(text)} characters (at most {NAME_MAX})"
               if len(text) > NAME_MAX else "has a character that cannot be printed")
        raise ConfigError(
            f"--name {value!r} {why}: the name labels the run in its dashboard, "
            "nbdist.compare's legend and Run.label, so give a short one on one line, e.g. "
            "`--name lr-0.01` or `--name 'big batch'`.")
    return text


def _steps_per_call(value: Any) -> int | str:
    """``--steps-per-call``: a whole number of steps of at least 1, or ``auto``."""
    text = str(value).strip().lower()
    if text == "auto":
        return "auto"
    if text.isascii() and text.isdigit() and int(text) >= 1:
        return int(text)
    raise ConfigError(
        f"--steps-per-call {value!r}: give how many steps one compiled call runs, a whole "
        "number of at least 1 (1: one step per call, the default), or `auto` to choose it from "
        "the measured time per call and per step, e.g. `--steps-per-call 8`.")
