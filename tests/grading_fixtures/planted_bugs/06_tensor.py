"""Planted bug for labs/06_tensor: ``g`` also all-reduces in backward.

``AllReduceFwdIdentityBwd`` (the operator after each row-parallel layer without sequence
parallelism) sums the output gradient over the tp group in backward, although every rank
already holds the full gradient: every gradient upstream of a ``g`` comes out ``t`` times too
large, and each layer sends two more all-reduces in backward. Under sequence parallelism ``g``
is not used in the blocks, but the vocabulary-parallel embedding uses it without SP.

Lost (16 of 22 points; measured with ``pytest -m slow tests/test_grading_reallabs.py -k
06_tensor``): every test that compares gradients or trained weights with one process or with
DTensor, and the bytes test (TP sends 6 all-reduces per layer instead of 4). Kept: saved
activations (forward only) and the loss's collectives (the loss alone uses no ``g``).
"""

FILE = "tensor.py"
OLD = "        return grad, None\n"
NEW = "        return all_reduce(grad, ctx.groups), None  # planted bug: grad is already whole\n"
LOST = {
    "test_tensor.py::test_equal_to_one_process_t2",
    "test_tensor.py::test_equal_to_one_process_t4",
    "test_tensor.py::test_sent_bytes_equal_tp_volume",
    "test_tensor_hidden.py::test_same_as_dtensor_parallelize_module",
    "test_tensor_hidden.py::test_training_steps_match_one_process",
    "test_tensor_hidden.py::test_other_model_equal_bytes_and_activations",
}
# The released stubs score 0: TPConfig, TPGroups and ModelConfig ship complete (the notebook
# uses them before any student code runs), so their tests are left out of rubric.toml.
STUB_PASSES: set[str] = set()
