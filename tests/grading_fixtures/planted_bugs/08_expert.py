"""Planted bug for labs/08_expert: the combine drops the router weights.

Every kept copy's expert output is added to its token unweighted (``y += out`` instead of
``y += gate * out``), so outputs and all gradients that flow through the output are wrong,
while the routing, the drops and the bytes of both all-to-alls are untouched.

Lost: every test that compares values with the single-process reference (outputs and
gradients on 2 ranks, the folded 4-rank run, the three hidden 4-rank cases).
Kept: route, capacity, load-balancing loss, the all-to-all alone, drops, bytes, the sweep.
"""

FILE = "moe.py"
OLD = "    y = torch.zeros_like(x).index_add(0, tok, back * gate.unsqueeze(1))  # (T, h)\n"
NEW = "    y = torch.zeros_like(x).index_add(0, tok, back)  # planted bug: gates forgotten\n"
LOST = None  # measured below
STUB_PASSES: set[str] = set()
