"""Metric events and the Run store.

``run`` is the store and ``rows`` its row schema; the exporters that read a Run register
themselves with it (``tensorboard``, imported here so that ``Run.to_tensorboard`` works
wherever the store is imported).
"""

from . import tensorboard as tensorboard
