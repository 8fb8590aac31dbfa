"""V-shaped pipeline schedules: ZB-V and DualPipe-V, two model chunks per rank in a V.

Placement (``placement="v"`` in :mod:`.pipeline`): the ``2p`` virtual stages go down the ranks
and back up, so rank ``r`` holds chunk 0 = stage ``r`` and chunk 1 = stage ``2p-1-r``. Rank
``p-1`` holds stages ``p-1`` and ``p``: that boundary stays on the rank (nothing is sent), and
rank 0 holds both the first stage (embeddings) and the last (head and loss).

``zbv``        ZB-V (Qi et al., *Zero Bubble Pipeline Parallelism*, ICLR 2024, Sec. 6): the
               order of PyTorch's ``ScheduleZBVZeroBubble`` (torch 2.13), action for action:
               warm-up ``2(p-r)-1`` forwards of chunk 0, ``r`` pairs F1 F0, ``p-r`` triples
               F1 BI1 BW1; steady state F0 BI0 BW0 F1 BI1 BW1; cool-down BI0 BI1 pairs then
               deferred BW. Generated for ``max(m, 2p-1)`` microbatches and cut to ``m``, as
               PyTorch does, so any ``m >= 1`` runs. Every backward is split (``BI`` + ``BW``).
``dualpipev``  DualPipe-V (DeepSeek-V3, arXiv 2412.19437, in the V form of
               ``deepseek-ai/DualPipe`` and PyTorch's ``ScheduleDualPipeV``): steps 1-8 of
               PyTorch's generator. Its overlapped forward-backward pairs (``OVERLAP_F_B``)
               become the two actions ``F`` then ``B`` in that order, which is also how
               PyTorch's runtime executes them when no overlap callback is registered. Full
               backwards ``B`` except the zero-bubble ``BI``/``BW`` of step 3 and of the
               second half of the drain; needs ``m >= 2p``.

Both keep every stage's weight-gradient accumulations (``B`` or ``BW``) in increasing
microbatch order (tested), so a pipeline run sums each ``.grad`` in one process's order.
"""

from __future__ import annotations

from .pipeline_actions import Action


def zbv_rank(r: int, p: int, m: int) -> list[Action]:
    """ZB-V's action list on rank ``r`` (chunk 0 = stage r, chunk 1 = stage 2p-1-r)."""
    n = max(2 * p - 1, m)
    out: list[Action] = []
    f0 = f1 = b0 = b1 = 0
    for _ in range(2 * (p - r) - 1):  # warm-up: fill the way down
        out.append(Action("F", f0, 0))
        f0 += 1
    for _ in range(r):
        out += [Action("F", f1, 1), Action("F", f0, 0)]
        f1, f0 = f1 + 1, f0 + 1
    for _ in range(p - r):  # the way back up starts: backward right after forward
        out += [Action("F", f1, 1), Action("BI", b1, 1), Action("BW", b1, 1)]
        f1, b1 = f1 + 1, b1 + 1
    while f1 < f0 or f0 < n:  # steady state
        if f0 < n:
            out.append(Action("F", f0, 0))
            f0 += 1
        out += [Action("BI", b0, 0), Action("BW", b0, 0)]
        out += [Action("F", f1, 1), Action("BI", b1, 1), Action("BW", b1, 1)]
        b0, f1, b1 = b0 + 1, f1 + 1, b1 + 1
    w0, w1 = b0, b1
    for _ in range(r):  # cool-down: input gradients first, weight gradients fill the drain
        out += [Action("BI", b0, 0), Action("BI", b1, 1)]
        b0, b1 = b0 + 1, b1 + 1
    for _ in range(p - r):
        out += [Action("BI", b0, 0), Action("BW", w0, 0)]
        b0, w0 = b0 + 1, w0 + 1
    out += [Action("BW", i, 1) for i in range(w1, b1)]
    out += [Action("BW", i, 0) for i in range(w0, b0)]
    return [a for a in out if a.microbatch < m]  # PyTorch pads to 2p-1 microbatches, then cuts


def dualpipev_rank(r: int, p: int, m: int) -> list[Action]:
    """DualPipe-V's action list on rank ``r``; ``m >= 2p`` (checked by ``check_kind``)."""
    out: list[Action] = []
    nxt = {("F", 0): 0, ("F", 1): 0, ("B", 0): 0, ("B", 1): 0}  # next microbatch per kind, chunk
    weights: list[tuple[int, int]] = []  # (microbatch, chunk) whose BW is still to run

    def f(c: int) -> None:
        out.append(Action("F", nxt["F", c], c))
        nxt["F", c] += 1

    def b(c: int, split: bool = False) -> None:
        i = nxt["B", c]
        nxt["B", c] += 1
        out.append(Action("BI" if split else "B", i, c))
        if split:
            weights.append((i, c))

    def w() -> None:
        if weights:
            i, c = weights.pop(0)
            out.append(Action("BW", i, c))

    for _ in range(2 * (p - r - 1)):  # 1: F0
        f(0)
    for _ in range(r + 1):  # 2: F0 F1
        f(0)
        f(1)
    for _ in range(p - r - 1):  # 3: BI1 BW1 F1 (zero bubble)
        b(1, split=True)
        w()
        f(1)
    for _ in range(m - 2 * p + r + 1):  # 4: (F0 B1) (F1 B0), PyTorch's overlapped pairs
        f(0)
        b(1)
        f(1)
        b(0)
    for _ in range(p - r - 1):  # 5: B1 (F1 B0)
        b(1)
        f(1)
        b(0)
    zb = False
    for i in range(r + 1):  # 6: B1 B0, the second half split
        zb = zb or (i == (r + 1) // 2 and r % 2 == 1)
        b(1, zb)
        zb = zb or (i == (r + 1) // 2 and r % 2 == 0)
        b(0, zb)
    for _ in range(p - r - 1):  # 7: BW B0
        w()
        b(0, zb)
    for _ in range(r + 1):  # 8: the remaining BW
        w()
    return out


def dualpipev_splits(r: int, p: int) -> int:
    """How many backwards rank ``r`` splits into BI + BW in DualPipe-V (steps 3, 6 and 7)."""
    half = (r + 1) // 2
    step6 = 2 * (r + 1 - half) - (r % 2 == 0)  # odd r: both chunks from i = half on
    return 2 * (p - r - 1) + step6
