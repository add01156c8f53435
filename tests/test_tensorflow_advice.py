"""TensorFlow's messages from its issue tracker get the change to make (nbdist.errormap)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("text, advice", [
    ("{{function_node __inference_train_function}} slice index 0 of dimension 0 out of bounds. "
     "[Op:StridedSlice] name: replica_7/strided_slice",
     "A batch had fewer examples than the 8 replicas, so a replica got an empty slice"),
    ("`add_update` was called in a cross-replica context. This is not expected.",
     "The cell calls the model in training mode outside `strategy.run`, where a layer that "
     "updates its state (BatchNormalization's moving statistics) cannot"),
    ("Inputs to operation AddN of type AddN must have the same size and shape.  "
     "Input 0: [1,8] != input 2: [2,8]", None),   # not an empty replica: nothing to add
])
def test_tensorflows_messages_from_its_issue_tracker_get_the_change(text, advice):
    from nbdist.step.errormap import tensorflow_advice

    said = tensorflow_advice(ValueError(text), replicas=8)
    assert (said if advice is None else said[:len(advice)]) == advice
