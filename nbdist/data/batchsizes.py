"""How many examples each replica's batch held, step by step: what explains a NaN loss that
comes from an empty batch, and a note when the replicas' batches are uneven.

TensorFlow splits each global batch along its first dimension across the replicas. When it
cannot split it evenly (a global batch that is not a multiple of the replicas, or a dataset's
partial last batch, made by ``batch`` without ``drop_remainder=True``), some replicas get fewer
examples, and a replica left without any gets an empty batch of shape ``(0, ...)``: its
mean, and so a loss like ``tf.reduce_mean(...)``, is NaN. A dataset function's per-replica
pipelines do the same at their ends. The compiled step returns each replica's batch size
(``telemetry.probe.BATCH_SIZE``, computed in the step from the batch it really got), so
what nbdist says rests on the sizes the step saw, not on a guess from the dataset.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


def replica_shapes(strategy: Any, batch: Any) -> list[str]:
    """Each local replica's part of a distributed batch, as its components' shapes."""
    import tensorflow as tf

    return [", ".join(str(tuple(t.shape)) for t in tf.nest.flatten(part)
                      if getattr(t, "shape", None) is not None)
            for part in strategy.experimental_local_results(batch)]


@dataclass
class ReplicaBatches:
    """A run's batch sizes per replica: the first step's, against which later steps are
    uneven or short, and whether the run was told so already."""

    data: str                  # the --data name
    per_replica: bool          # a dataset function: its batches are per-replica batches
    nested: bool = False       # its elements look like batches of batches: (None, None, ...)
    replicas: int = 1          # replicas in sync (a multiworker worker sees fewer: its own)
    first: list[int] | None = None
    noted: bool = False

    @classmethod
    def for_data(cls, name: str | None, value: Any, replicas: int) -> ReplicaBatches:
        """For ``--data name`` (``value``: what the name holds in the cell's namespace)."""
        import tensorflow as tf

        from ..hooks.tensorflow import distributed_from_function

        per_replica = (callable(value) and not isinstance(value, tf.data.Dataset)) or (
            distributed_from_function(value))
        nested = False
        if isinstance(value, tf.data.Dataset):
            firsts = [s for s in tf.nest.flatten(value.element_spec)
                      if getattr(s, "shape", None) is not None and s.shape.rank]
            nested = bool(firsts) and firsts[0].shape.rank >= 2 and (
                firsts[0].shape[0] is None and firsts[0].shape[1] is None)
        return cls(name or "data", per_replica, nested, replicas)

    # -- every step --------------------------------------------------------------------------
    def observe(self, sizes: Sequence[float] | None, step: int,
                names: list[str]) -> str | None:
        """This step's sizes seen; a note for the Run the first time they are uneven or
        short (None otherwise). ``names``: the replicas' names in messages."""
        got = _counts(sizes)
        if got is None:
            return None
        if self.first is None:
            self.first = got
        if self.noted or not self._short(got):
            return None
        self.noted = True
        return (f"step {step}: {self._why(got, names)} A replica's loss there averages fewer "
                f"examples (an empty batch's mean is NaN). {self._fix(got)}")

    # -- a non-finite loss ---------------------------------------------------------------------
    def nonfinite_cause(self, sizes: Sequence[float] | None, step: int, bad: list[int],
                        names: list[str],
                        shapes: Callable[[], list[str]] | None) -> tuple[str, bool] | None:
        """Why the loss of ``step`` is not finite on replicas ``bad`` when a batch was empty
        or short, and whether that is certainly the cause (a NaN replica's batch was empty);
        None when every replica's batch was whole."""
        got = _counts(sizes)
        if got is None or self.first is None or not self._short(got):
            return None
        seen = _shapes(shapes, len(got))
        empty = [i for i in bad if got[i] == 0]
        why = _capital(self._why(got, names))
        if empty:
            i = empty[0]
            return (f"{_capital(names[i])}'s batch at step {step} was empty"
                    f"{_shape_words(seen, names, i)}, and the mean of an empty batch is NaN: "
                    f"that is the cause. {why} {self._fix(got)} (A loss divided by the global "
                    "batch, `tf.nn.compute_average_loss(..., global_batch_size=...)`, is 0 on "
                    "an empty batch.)"), True
        return (f"At step {step} a batch was short{_shape_words(seen, names, None)}. {why} "
                f"{self._fix(got)} A statistic over so few examples (a variance, a "
                "normalisation) can be NaN; if that is not it:"), False

    # -- the words -----------------------------------------------------------------------------
    def _short(self, got: list[int]) -> bool:
        usual = max(self.first or got)
        return len(got) == len(self.first or got) and (min(got) < max(got) or max(got) < usual)

    def _why(self, got: list[int], names: list[str]) -> str:
        """What made this step's batches uneven or short, from the sizes seen: a sentence."""
        assert self.first is not None
        whole, total, usual = sum(self.first), sum(got), max(self.first)
        short = " and ".join(
            f"{names[i]}'s batch {'was empty' if n == 0 else 'held ' + _examples(n)}"
            for i, n in enumerate(got) if n < max(got) or n < usual)
        split = " + ".join(map(str, got))
        if self.per_replica:
            return (f"--data {self.data} is a dataset function, whose batches are per-replica: "
                    f"{short}, where the first step's held {usual} (the partial last batch of "
                    "its pipeline, or no data left for that replica: TensorFlow then passes an "
                    "empty batch).")
        if total < whole and len(got) < self.replicas:   # a worker sees its own replicas
            return (f"this worker's share of the partial last batch of --data {self.data} "
                    f"held {_examples(total)}, where its first step's held {whole} (the "
                    "dataset's length is not a multiple of its global batch size), so "
                    f"{short}.{self._nested_words()}")
        if total < whole:
            split = (f" was split {split} across the {len(got)} replicas, so" if len(got) > 1
                     else ":")
            return (f"the partial last batch of --data {self.data} ({_examples(total)}, where "
                    f"the first step's held {whole}: the dataset's length is not a multiple of "
                    f"its batch size){split} {short}.{self._nested_words()}")
        return (f"the batch of {_examples(whole)} is not a multiple of the {len(got)} "
                f"replicas, so TensorFlow split it {split} across them: {short}."
                f"{self._nested_words()}")

    def _nested_words(self) -> str:
        if not self.nested:
            return ""
        return (f" The elements of --data {self.data} look like batches of batches (their "
                "first two dimensions vary, as after `.batch(4).batch(2)`): the outer batch is "
                "the one split across the replicas, so its size is what counts.")

    def _fix(self, got: list[int]) -> str:
        assert self.first is not None
        if self.per_replica:
            return ("Fix: batch with `drop_remainder=True` in the function (`dataset.batch("
                    "input_context.get_per_replica_batch_size(GLOBAL_BATCH), "
                    "drop_remainder=True)`), or repeat it before batching and give --steps N.")
        whole, local, n = sum(self.first), len(self.first), self.replicas
        known = local == n   # this process sees every replica: `whole` is the global batch
        batch = str(whole) if known else "GLOBAL_BATCH"
        outer = " as its outer batch" if self.nested else ""
        drop = (f"make --data {self.data} with `.batch({batch}, drop_remainder=True)`{outer}, "
                "so that every step's batch is whole")
        if min(self.first) == max(self.first):
            return f"Fix: {drop}."
        instead = f" (e.g. {n * math.ceil(whole / n)} instead of {whole})" if known else ""
        multiple = f"a global batch that is a multiple of the {n} replicas{instead}"
        if sum(got) < whole:
            return f"Fix: use {multiple}, and {drop}."
        return f"Fix: use {multiple}."


def _counts(sizes: Sequence[float] | None) -> list[int] | None:
    if sizes is None or not len(sizes) or any(not math.isfinite(s) for s in sizes):
        return None
    return [int(s) for s in sizes]


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _examples(n: int) -> str:
    return f"{n} example{'' if n == 1 else 's'}"


def _shapes(shapes: Callable[[], list[str]] | None, count: int) -> list[str]:
    """Each replica's batch shapes (``(0, 3), (0, 1)``), when the step's batch is at hand."""
    found: list[str] = []
    if shapes is not None:
        try:
            found = shapes()
        except Exception:   # words for an error message: never a second error instead
            found = []
    return found if len(found) == count and all(found) else []


def _shape_words(seen: list[str], names: list[str], first: int | None) -> str:
    """`` (shapes (0, 3), (0, 1); replica 0's: (1, 3), (1, 1))``: replica ``first``'s
    shapes, then the others'; empty without shapes."""
    if not seen:
        return ""
    order = list(range(len(seen)))
    if first is not None:
        order = [first] + [i for i in order if i != first]
    said = [f"{names[i]}'s: {seen[i]}" for i in order]
    if first is not None:
        said[0] = f"shape{'s' if ', (' in seen[first] else ''} {seen[first]}"
    return f" ({'; '.join(said)})"
