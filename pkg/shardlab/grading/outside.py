"""Values a lab test hands to the grader, to be compared outside the student's process.

A test whose check is a comparison of produced values calls :func:`record` with the values
its ranks produced (tensors, byte counts, op lists), then asserts as before::

    from shardlab.grading.outside import record

    def test_ring_all_reduce(results):
        record("ar D2 rank0 n1000", results[0][7]["values"]["ar"])
        assert ...

Run by ``shardlab grade`` (the rubric's ``[outside]`` table names the test), every record
goes as one JSON line to a file descriptor the grader opened (``SHARDLAB_OUTSIDE`` =
``"<pid>:<fd>"``, set by the grading runner for the pytest process only; the ranks it starts
do not inherit the descriptor, and :func:`record` refuses to run in them). The grader ran
the same tests on the reference solution and gives a case its points only if the test passed
*and* every value it recorded equals the reference's within the rubric's tolerance
(:mod:`._values`, in the grader process, which never imports the submission). Outside the
grader :func:`record` only checks that the value can be encoded, so a lab test behaves the
same on a student's machine.

Encoding (no pickle anywhere): ``int`` / ``bool`` / ``str`` / ``None`` as JSON, a ``float`` as
``{"f": float.hex()}``, a tensor as ``{"tensor": dtype, "shape": [...], "data": base64 of its
raw little-endian bytes}``, lists and tuples as JSON lists, dicts (string keys) as
``{"dict": {...}}``; nesting at most :data:`MAX_DEPTH` deep.
"""

from __future__ import annotations

import base64
import json
import os
import sys

ENV = "SHARDLAB_OUTSIDE"
MAX_DEPTH = 6
MAX_NAME = 200
MAX_STR = 200

_seen: set[tuple[str, str]] = set()


class RecordError(ValueError):
    """A value that :func:`record` cannot hand to the grader."""


def _current_test() -> str:
    now = os.environ.get("PYTEST_CURRENT_TEST", "")
    return now.rsplit(" (", 1)[0] if now.endswith(")") else now


def _tensor(value) -> dict:
    import torch

    t = value.detach().cpu().contiguous()
    flat = t.reshape(-1)
    raw = flat.view(torch.uint8) if flat.numel() else torch.empty(0, dtype=torch.uint8)
    if sys.byteorder != "little":  # pragma: no cover - every machine here is little-endian
        raise RecordError("record() needs a little-endian machine")
    return {
        "tensor": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "data": base64.b64encode(raw.numpy().tobytes()).decode("ascii"),
    }


def encode(value, depth: int = 0):
    """The JSON form of ``value`` (see the module docstring); RecordError for anything else."""
    if depth > MAX_DEPTH:
        raise RecordError(f"record(): values nest deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return {"f": value.hex()}
    if isinstance(value, str):
        if len(value) > MAX_STR:
            raise RecordError(f"record(): a string of {len(value)} characters (limit {MAX_STR})")
        return value
    if isinstance(value, list | tuple):
        return [encode(v, depth + 1) for v in value]
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise RecordError("record(): dict keys must be strings")
        return {"dict": {k: encode(v, depth + 1) for k, v in value.items()}}
    if type(value).__module__.startswith("torch") and hasattr(value, "detach"):
        return _tensor(value)
    raise RecordError(f"record(): cannot hand a {type(value).__name__} to the grader")


def record(name: str, value) -> None:
    """Hand ``value``, produced by the current test, to the grader under ``name``.

    ``name`` is unique within one test case (a second record under the same name is an
    error). Outside ``shardlab grade`` this only encodes the value (errors show up early).
    """
    if not isinstance(name, str) or not name or len(name) > MAX_NAME:
        raise RecordError(f"record(): the name must be a string of 1 to {MAX_NAME} characters")
    test = _current_test()
    if (test, name) in _seen:
        raise RecordError(f"record(): {name!r} recorded twice in {test}")
    line = json.dumps({"test": test, "name": name, "value": encode(value)}) + "\n"
    _seen.add((test, name))
    target = os.environ.get(ENV, "")
    if not target:
        return
    pid, _, fd = target.partition(":")
    if str(os.getpid()) != pid:
        raise RecordError("record() runs in the test process only, not in a rank")
    data = line.encode()
    while data:
        data = data[os.write(int(fd), data) :]
