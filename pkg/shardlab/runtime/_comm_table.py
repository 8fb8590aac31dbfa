"""Plain-text tables of :class:`~shardlab.runtime.trace_comm.CommTrace` (internal).

:func:`format_table` is the trace's original table (ring-model bytes per phase and op);
:func:`wire_rows` / :func:`format_wire_table` put the measured wire bytes beside the ring
model and the backend's own algorithm, one row per operation plus one total per phase.
"""

from __future__ import annotations


def _fmt_bytes(v) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _ratio(a, b) -> str:
    return "-" if a is None or not b else f"{a / b:.3f}"


def _render(head: list[str], body: list[list[str]], left: int) -> str:
    widths = [
        max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths))]
    lines.append("  ".join("-" * w for w in widths))
    for b in body:
        lines.append(
            "  ".join(
                x.rjust(w) if i >= left else x.ljust(w) for i, (x, w) in enumerate(zip(b, widths))
            )
        )
    return "\n".join(lines)


def format_table(rows: list[dict], seconds: bool = False) -> str:
    cols = ["phase", "op", "group_size", "dtype", "calls", "numel", "sent_bytes"]
    if seconds:
        cols.append("seconds")
    head = ["phase", "op", "D", "dtype", "calls", "elements", "sent bytes"] + (
        ["seconds"] if seconds else []
    )

    def fmt(c, v):
        if c == "sent_bytes":
            return f"{v:,.0f}"
        if c == "seconds":
            return f"{v:.4f}"
        if c == "numel":
            return f"{v:,}"
        return str(v)

    body = [[fmt(c, row[c]) for c in cols] for row in rows]
    return _render(head, body, left=4)


def wire_rows(records, by_phase: dict[str, int], reason: str | None) -> list[dict]:
    """Rows for :func:`format_wire_table`: every record, then a total per phase."""
    rows, phases = [], {}
    for r in records:
        ph = r.phase or ""
        if r.wire_bytes is not None:
            wire = r.wire_bytes
        elif reason is not None:
            wire = reason.split(":")[0]
        else:
            wire = "async" if r.wire_note.startswith("async") else "overlapped"
        rows.append(
            {
                "phase": ph,
                "op": r.op,
                "D": r.group_size,
                "bytes": r.nbytes,
                "ring": r.sent_bytes,
                "backend": r.backend_bytes,
                "wire": wire,
            }
        )
        t = phases.setdefault(ph, {"ring": 0.0, "backend": 0.0, "calls": 0})
        t["ring"] += r.sent_bytes or 0.0
        t["backend"] += r.backend_bytes or 0.0
        t["calls"] += 1
    for ph in list(phases) + [p for p in by_phase if p not in phases]:
        t = phases.get(ph, {"ring": 0.0, "backend": 0.0, "calls": 0})
        wire = by_phase.get(ph) if reason is None else reason.split(":")[0]
        rows.append(
            {
                "phase": ph,
                "op": f"phase total ({t['calls']} ops)",
                "D": "",
                "bytes": None,
                "ring": t["ring"],
                "backend": t["backend"],
                "wire": wire,
            }
        )
    return rows


def format_wire_table(rows: list[dict], backend: str = "backend") -> str:
    head = ["phase", "op", "D", "tensor B", "ring model B", f"{backend} algo B", "wire B"]
    head += ["wire/ring", f"wire/{backend}"]
    body = []
    for r in rows:
        w = r["wire"]
        num = w if isinstance(w, (int, float)) else None
        body.append(
            [
                r["phase"],
                r["op"],
                str(r["D"]),
                _fmt_bytes(r["bytes"]),
                _fmt_bytes(r["ring"]),
                _fmt_bytes(r["backend"]),
                _fmt_bytes(num) if num is not None else str(w),
                _ratio(num, r["ring"]),
                _ratio(num, r["backend"]),
            ]
        )
    return _render(head, body, left=2)


def sent_table(rows: list[dict], backend: str = "gloo", label: str = "run") -> str:
    """Bytes sent per rank: formula, ring model, backend algorithm and wire, with ratios.

    ``rows``: dicts with ``label``, ``formula`` (``accounting`` prediction), ``ring``
    (``CommTrace.sent_bytes``), ``backend`` (``CommTrace.backend_bytes``) and ``wire``
    (``CommTrace.wire_bytes``; None prints "not measurable").
    """
    head = [label, "formula B", "ring model B", f"{backend} algo B", "wire B"]
    head += ["ring/formula", "wire/formula", f"wire/{backend}"]
    body = []
    for r in rows:
        w = r.get("wire")
        body.append(
            [
                str(r["label"]),
                _fmt_bytes(r.get("formula")),
                _fmt_bytes(r.get("ring")),
                _fmt_bytes(r.get("backend")),
                "not measurable" if w is None else _fmt_bytes(w),
                _ratio(r.get("ring"), r.get("formula")),
                _ratio(w, r.get("formula")),
                _ratio(w, r.get("backend")),
            ]
        )
    return _render(head, body, left=1)
