"""Planted bug for labs/08_expert: the combine drops the router weights.

Every kept copy's expert output is added to its token unweighted (``y += out`` instead of
``y += gate * out``), so outputs and all gradients that flow through the output are wrong,
while the routing, the drops and the bytes of both all-to-alls are untouched.

Lost (13 of 33 points): every test that compares values with the single-process reference
(outputs and gradients on 2 ranks, the folded 4-rank run, the hidden heavy-drop and k = E
cases). Kept: route, capacity, load-balancing loss, the all-to-all alone, drops, bytes, the
sweep, and the hidden capacity-1 case: it routes top-1, where the only gate is softmax of one
logit = 1, so forgetting it changes nothing.
"""

FILE = "moe.py"
OLD = "    y = torch.zeros_like(x).index_add(0, tok, back * gate.unsqueeze(1))  # (T, h)\n"
NEW = "    y = torch.zeros_like(x).index_add(0, tok, back)  # planted bug: gates forgotten\n"
LOST = {
    "test_expert.py::test_outputs_equal_single_process",
    "test_expert.py::test_gradients_equal_single_process",
    "test_expert.py::test_folding_groups_match_prediction",
    "test_expert_hidden.py::test_four_ranks_heavy_drops",
    "test_expert_hidden.py::test_top_k_equals_experts_drops_nothing",
}
STUB_PASSES: set[str] = set()
