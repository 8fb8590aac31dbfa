"""Read and compare the values lab tests recorded (:mod:`.outside`), in the grader process.

Pure standard library: the grader never imports torch or the submission. The stream is
hostile input and is bounded before it is read: at most :data:`MAX_BYTES` in all,
:data:`MAX_RECORDS` records, JSON lines only (no pickle), every tensor's byte count equal to
its shape times its dtype's size, nesting at most ``outside.MAX_DEPTH`` deep. Anything else
makes the whole stream unreadable (:class:`ValuesError`, one sentence).

Tolerances (rubric ``[outside]``, one per test):

* ``"exact"`` (alias ``"bitwise"``): tensors bit for bit (same dtype and shape), everything
  else equal;
* ``"close"``: floating tensors and floats within twice the labs' per-dtype tolerance
  against PyTorch (:data:`CLOSE`, rtol / atol: float64 2e-12, float32 2e-5, 16-bit 4e-2 /
  1e-1; both the reference and a submission are within once of PyTorch), integers exact;
* ``"close:RTOL,ATOL"``: ``|got - ref| <= ATOL + RTOL * |ref|`` for floating values;
* ``"ulps:N"``: floating values at most N units in the last place apart.

NaN equals NaN in every mode; integers, strings, booleans, shapes and dtypes always compare
exactly.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import struct

from .outside import MAX_DEPTH, MAX_NAME, MAX_STR

MAX_BYTES = 32 * 2**20
MAX_RECORDS = 100_000
# dtype -> (struct code, item size); bfloat16 is decoded by hand
DTYPES = {
    "float64": ("d", 8),
    "float32": ("f", 4),
    "float16": ("e", 2),
    "bfloat16": ("H", 2),
    "int64": ("q", 8),
    "int32": ("i", 4),
    "int16": ("h", 2),
    "int8": ("b", 1),
    "uint8": ("B", 1),
    "bool": ("?", 1),
}
FLOATS = {"float64", "float32", "float16", "bfloat16"}
CLOSE = {"float64": (2e-12, 2e-12), "float32": (2e-5, 2e-5)}  # 16-bit: (4e-2, 1e-1)
TOLERANCE_RE = re.compile(r"^(exact|bitwise|close|close:[0-9.eE+-]+,[0-9.eE+-]+|ulps:[0-9]{1,9})$")


class ValuesError(ValueError):
    """The recorded values cannot be read (too large, malformed)."""


class Tensor:
    """A decoded tensor record: dtype, shape and raw bytes."""

    __slots__ = ("dtype", "shape", "raw")

    def __init__(self, dtype: str, shape: tuple[int, ...], raw: bytes):
        self.dtype, self.shape, self.raw = dtype, shape, raw

    def numbers(self) -> tuple:
        code, size = DTYPES[self.dtype]
        vals = struct.unpack(f"<{len(self.raw) // size}{code}", self.raw)
        if self.dtype == "bfloat16":
            return tuple(struct.unpack("<f", struct.pack("<I", v << 16))[0] for v in vals)
        return vals


def tolerance_problem(text) -> str:
    """'' when ``text`` is a tolerance this module knows, else why not."""
    if not isinstance(text, str) or not TOLERANCE_RE.match(text):
        return f"{text!r} is not a tolerance (exact, bitwise, close, close:RTOL,ATOL, ulps:N)"
    if text.startswith("close:"):
        try:
            rtol, atol = (float(x) for x in text[6:].split(","))
        except ValueError:
            return f"{text!r}: RTOL and ATOL must be numbers"
        if not (0 <= rtol < 1 and 0 <= atol and math.isfinite(atol)):
            return f"{text!r}: need 0 <= RTOL < 1 and a finite ATOL >= 0"
    return ""


def _decode(value, depth: int = 0):
    if depth > MAX_DEPTH:
        raise ValuesError(f"a value nests deeper than {MAX_DEPTH} levels")
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, str):
        if len(value) > MAX_STR:
            raise ValuesError(f"a string value is longer than {MAX_STR} characters")
        return value
    if isinstance(value, list):
        return [_decode(v, depth + 1) for v in value]
    if not isinstance(value, dict) or len(value) not in (1, 3):
        raise ValuesError("a value is neither a number, a string, a list nor a tagged object")
    if set(value) == {"f"} and isinstance(value["f"], str) and len(value["f"]) < 40:
        try:
            return float.fromhex(value["f"])
        except (ValueError, OverflowError):
            raise ValuesError("a float value is not a hexadecimal float") from None
    if set(value) == {"dict"} and isinstance(value["dict"], dict):
        return {str(k)[:MAX_NAME]: _decode(v, depth + 1) for k, v in value["dict"].items()}
    if set(value) == {"tensor", "shape", "data"}:
        return _tensor(value)
    raise ValuesError("a value is a tagged object of an unknown kind")


def _tensor(value) -> Tensor:
    dtype, shape, data = value["tensor"], value["shape"], value["data"]
    if dtype not in DTYPES:
        raise ValuesError(f"a tensor has an unsupported dtype ({str(dtype)[:20]!r})")
    if not isinstance(shape, list) or len(shape) > 8:
        raise ValuesError("a tensor's shape is not a list of at most 8 sizes")
    if not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 2**31 for n in shape):
        raise ValuesError("a tensor's shape holds something other than sizes")
    if not isinstance(data, str):
        raise ValuesError("a tensor's data is not base64 text")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ValuesError("a tensor's data is not valid base64") from None
    if len(raw) != math.prod(shape) * DTYPES[dtype][1]:
        raise ValuesError("a tensor's data does not have the size its shape and dtype say")
    return Tensor(dtype, tuple(shape), raw)


def read_values(path) -> bytes | None:
    """A recorded stream read back, at most one byte over :data:`MAX_BYTES` (so that an
    oversized one is refused by :func:`parse_values` with a sentence)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(MAX_BYTES + 1) or None
    except OSError:
        return None


def parse_values(data: bytes | None) -> dict[str, dict[str, object]]:
    """{test node id: {name: value}} from the recorded stream; ValuesError if unusable."""
    if data is None:
        return {}
    if len(data) > MAX_BYTES:
        raise ValuesError(f"the recorded values exceed {MAX_BYTES // 2**20} MB")
    out: dict[str, dict[str, object]] = {}
    lines = data.split(b"\n")
    if len(lines) > MAX_RECORDS + 1:
        raise ValuesError(f"more than {MAX_RECORDS} values were recorded")
    for line in lines:
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            raise ValuesError("a record of the recorded values is not JSON") from None
        if not isinstance(rec, dict) or set(rec) != {"test", "name", "value"}:
            raise ValuesError("a record of the recorded values is not {test, name, value}")
        test, name = rec["test"], rec["name"]
        if not (isinstance(test, str) and isinstance(name, str) and 0 < len(name) <= MAX_NAME):
            raise ValuesError("a record's test or name is not a short string")
        per_test = out.setdefault(test[:2000], {})
        if name in per_test:
            raise ValuesError("a value was recorded twice under the same name in one test")
        per_test[name] = _decode(rec["value"])
    return out


def _ordered(t: Tensor) -> tuple[int, ...]:
    """Float bits as integers that are consecutive for neighbouring floats (for ulps)."""
    bits = {"float64": ("Q", 64), "float32": ("I", 32), "float16": ("H", 16), "bfloat16": ("H", 16)}
    code, width = bits[t.dtype]
    n = len(t.raw) // (width // 8)
    sign = 1 << (width - 1)
    return tuple(-(u & (sign - 1)) if u & sign else u for u in struct.unpack(f"<{n}{code}", t.raw))


def _floats_close(got: float, ref: float, rtol: float, atol: float) -> bool:
    if math.isnan(got) or math.isnan(ref):
        return math.isnan(got) and math.isnan(ref)
    if math.isinf(got) or math.isinf(ref):
        return got == ref
    return abs(got - ref) <= atol + rtol * abs(ref)


def _tensor_diff(got: Tensor, ref: Tensor, tol: str) -> str:
    if got.dtype != ref.dtype:
        return "has another dtype than the reference's"
    if got.shape != ref.shape:
        return "has another shape than the reference's"
    if got.raw == ref.raw:
        return ""
    if tol in ("exact", "bitwise") or ref.dtype not in FLOATS:
        return "differs from the reference's" + (" bit for bit" if ref.dtype in FLOATS else "")
    if tol.startswith("ulps:"):
        most = int(tol[5:])
        rows = zip(_ordered(got), _ordered(ref), got.numbers(), ref.numbers(), strict=True)
        fine = all(
            (math.isnan(a) and math.isnan(b))
            or (not math.isnan(a) and not math.isnan(b) and abs(oa - ob) <= most)
            for oa, ob, a, b in rows
        )
        return "" if fine else "differs from the reference's beyond the tolerance"
    rtol, atol = CLOSE.get(ref.dtype, (4e-2, 1e-1))
    if tol.startswith("close:"):
        rtol, atol = (float(x) for x in tol[6:].split(","))
    pairs = zip(got.numbers(), ref.numbers(), strict=True)
    if all(_floats_close(a, b, rtol, atol) for a, b in pairs):
        return ""
    return "differs from the reference's beyond the tolerance"


def difference(got, ref, tol: str) -> str:
    """'' when ``got`` equals the reference value ``ref`` under ``tol``, else what differs."""
    if isinstance(ref, Tensor):
        if not isinstance(got, Tensor):
            return "is not a tensor"
        return _tensor_diff(got, ref, tol)
    if isinstance(ref, float) and not isinstance(got, bool) and isinstance(got, float | int):
        if tol in ("exact", "bitwise"):
            return "" if got == ref or (math.isnan(got) and math.isnan(ref)) else "differs"
        box = Tensor("float64", (1,), struct.pack("<d", float(got)))
        return _tensor_diff(box, Tensor("float64", (1,), struct.pack("<d", ref)), tol)
    if isinstance(ref, list):
        if not isinstance(got, list) or len(got) != len(ref):
            return "is not a list of the reference's length"
        return next((d for g, r in zip(got, ref) if (d := difference(g, r, tol))), "")
    if isinstance(ref, dict):
        if not isinstance(got, dict) or set(got) != set(ref):
            return "does not have the reference's keys"
        return next((d for k in ref if (d := difference(got[k], ref[k], tol))), "")
    same = type(got) is type(ref) and got == ref
    return "" if same else "differs from the reference's"
