"""Calling a compiled step without ``tf.function``'s per-call argument binding.

Every call of a ``tf.function`` binds its arguments to the function's signature, derives a
trace type for each (for a distributed batch: a ``PerReplica`` of tensors), casts them and looks
the concrete function up. For a small step that costs more than the step itself computes
(``benchmarks/overhead.py`` measures it). A training loop calls the same concrete function
with batches of the same structure thousands of times, so ``FastCall`` flattens the batch
and calls that concrete function directly, after checking that each tensor has the dtype and
a shape compatible with what was traced. Anything else (a smaller last batch, a new
structure) goes through the ``tf.function`` as usual, which retraces if it must.

The direct call is TensorFlow's private ``ConcreteFunction._call_flat``, used through
``nbdist.hooks.tensorflow.call_flat`` (checked with TensorFlow 2.21; tests/test_fastcall.py
fails if the fast path is not taken, tests/test_private_apis.py if the API is gone); if it is
missing, or the concrete function's flat inputs do not line up with the flattened example
batch, there is no fast path and every call goes through the ``tf.function``
(``FastCall.fast`` says which).
"""

from __future__ import annotations

from typing import Any

from ..hooks.tensorflow import call_flat, can_call_flat


class FastCall:
    """``fast_call(batch)`` == ``fallback(batch)``, without the binding where it is safe."""

    def __init__(self, tf_function: Any, example: Any, fallback: Any = None):
        """``tf_function`` was already called with ``example`` (so it is traced for it);
        ``fallback`` is what to call otherwise (default: ``tf_function`` itself)."""
        import tensorflow as tf

        self._flatten = tf.nest.flatten
        self.fallback = tf_function if fallback is None else fallback
        self.fast_calls = 0
        self.slow_calls = 0
        self._concrete = None
        concrete = tf_function.get_concrete_function(example)
        flat = tf.nest.flatten(example, expand_composites=True)
        n_inputs = len(concrete.inputs) - len(concrete.captured_inputs)
        if not can_call_flat(concrete) or len(flat) != n_inputs:
            return
        self._specs = []
        for tensor, placeholder in zip(flat, concrete.inputs[:n_inputs], strict=True):
            if (not isinstance(tensor, tf.Tensor) or tensor.dtype != placeholder.dtype
                    or not placeholder.shape.is_compatible_with(tensor.shape)):
                return
            self._specs.append((placeholder.dtype, placeholder.shape))
        self._concrete = concrete

    @property
    def fast(self) -> bool:
        """Whether batches like the example skip ``tf.function``'s argument binding."""
        return self._concrete is not None

    def __call__(self, batch: Any) -> Any:
        concrete = self._concrete
        if concrete is not None:
            flat = self._flatten(batch, expand_composites=True)
            if self._fits(flat):
                self.fast_calls += 1
                return call_flat(concrete, flat)
        self.slow_calls += 1
        return self.fallback(batch)

    def _fits(self, flat: list[Any]) -> bool:
        if len(flat) != len(self._specs):
            return False
        try:
            for tensor, (dtype, shape) in zip(flat, self._specs, strict=False):  # length checked
                # `is` first: DTypes are interned, and both checks run on every step.
                if tensor.dtype is not dtype and tensor.dtype != dtype:
                    return False
                given = tensor.shape
                if given != shape and not shape.is_compatible_with(given):
                    return False
        except AttributeError:   # not a tensor
            return False
        return True
