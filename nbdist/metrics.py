"""Metrics of a job run outside the notebook (an exported script's ``--metrics PATH``):
``StepWriter`` writes them, ``nbdist.Run.load(PATH)`` reads them back (``run.plot()``)."""

from .telemetry.jsonl import StepWriter

__all__ = ["StepWriter"]
