"""Metric events and the Run store.

``run`` is the store and ``rows`` its row schema; the exporters and readers of a Run register
themselves with it (``tensorboard`` and ``explain``, imported here so that
``Run.to_tensorboard`` and ``Run.explain`` work wherever the store is imported).
"""

from . import explain as explain
from . import tensorboard as tensorboard
