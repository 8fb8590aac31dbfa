"""Rank-side checks of Lab 01, launched by the tests and the notebook via ``shardlab.runtime.launch``.

Each worker runs on every rank, calls the student's ring collectives on many sizes in one
launch (starting ranks is the slow part), compares them with ``torch.distributed``'s own
collectives and returns small plain-Python summaries; the caller asserts on them.

Inputs are deterministic: rank ``r`` draws its tensor from a generator seeded by
``(seed, numel, r)``, so every rank can also rebuild every other rank's input.
"""

from __future__ import annotations

import collectives as C
import torch
import torch.distributed as dist

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "int32": torch.int32,
    "int64": torch.int64,
    "int64_large": torch.int64,  # values near 2**60: a detour through float64 loses digits
}


def rank_input(numel: int, dtype: str, rank: int, seed: int = 0) -> torch.Tensor:
    """The 1-D input of ``rank`` for a case (the same on every process that asks)."""
    g = torch.Generator().manual_seed(1_000_003 * seed + 7919 * numel + rank)
    dt = DTYPES[dtype]
    if dt.is_floating_point:
        return torch.randn(numel, generator=g, dtype=torch.float64).to(dt)
    bound = 2**60 if dtype == "int64_large" else 1000
    return torch.randint(-bound, bound, (numel,), generator=g, dtype=dt)


def _tol(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for comparing sums done in a different order; integers must be exact."""
    if not dtype.is_floating_point:
        return 0.0, 0.0
    return {torch.float64: (1e-12, 1e-12), torch.float32: (1e-5, 1e-5)}.get(dtype, (2e-2, 5e-2))


def _compare(got: torch.Tensor, want: torch.Tensor) -> str:
    """'' when equal within tolerance, else a one-line reason."""
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)} != expected {tuple(want.shape)}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} != expected {want.dtype}"
    rtol, atol = _tol(want.dtype)
    if torch.allclose(got.double(), want.double(), rtol=rtol, atol=atol):
        return ""
    diff = (got.double() - want.double()).abs()
    i = int(diff.argmax())
    return f"max |error| {float(diff[i]):.3g} at index {i}: got {float(got[i])}, expected {float(want[i])}"


def _run(fn, *args, **kwargs) -> tuple[str, object]:
    """Run one check. A function still missing (``NotImplementedError``, raised the same way
    on every rank before any message) becomes its message, so the other checks still run.
    Any other exception is re-raised with the case named: a rank that failed mid-ring leaves
    its peers waiting for its messages, so going on would only hang the run; the launcher
    ends it with this rank's message and traceback instead."""
    try:
        return "", fn(*args, **kwargs)
    except NotImplementedError as exc:
        return f"NotImplementedError: {exc}", None
    except Exception as exc:
        x = args[0] if args and isinstance(args[0], torch.Tensor) else None
        case = f" on a {x.dtype} tensor of shape {tuple(x.shape)}" if x is not None else ""
        if hasattr(exc, "add_note"):  # Python 3.11+: shown under the traceback
            exc.add_note(
                f"(lab 01 check: {getattr(fn, '__name__', fn)}{case}, rank {dist.get_rank()} "
                f"of {dist.get_world_size()})"
            )
        raise


def _p2p_only(records) -> list[str]:
    """Names of traced operations that are not point-to-point sends/receives."""
    return sorted({r.op for r in records if "send" not in r.op and "recv" not in r.op})


def check_collectives(
    sizes, dtype: str = "float32", seed: int = 0, trace: bool = True, keep: bool = False
) -> list[dict]:
    """Check ring reduce-scatter, all-gather and all-reduce on every size; one dict per size.

    ``keep``: also return the results themselves (``case["values"]``: ``rs``, ``ag``, ``ar``),
    which the tests hand to the grader to compare with the reference solution's
    (``shardlab.grading.outside``)."""
    torch.manual_seed(seed)
    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for numel in sizes:
        case = {"numel": numel, "dtype": dtype, "world": world, "rank": rank}
        x = rank_input(numel, dtype, rank, seed)
        x_before = x.clone()
        lo, hi = C.chunk_bounds(numel, world)[rank]
        full = rank_input(numel, dtype, world + 1, seed)  # all-gather input, same on every rank
        mine = full[lo:hi].clone()
        # Production references first, on every rank unconditionally: a collective skipped
        # by one rank (because its own check failed) would hang the others.
        want = x.clone()
        dist.all_reduce(want)
        if not x.dtype.is_floating_point:  # integer sums are exact: check dist itself too
            exact = torch.zeros_like(x)
            for r in range(world):
                exact += rank_input(numel, dtype, r, seed)
            assert torch.equal(want, exact), "dist.all_reduce is not exact on integers?"
        prod_rs = prod_ag = None
        if numel % world == 0 and numel > 0:
            prod_rs = x.new_empty(numel // world)
            dist.reduce_scatter_tensor(prod_rs, x.clone())
            prod_ag = x.new_empty(numel)
            dist.all_gather_into_tensor(prod_ag, mine)

        # reduce-scatter: chunk `rank` of the sum
        err, shard = _run(C.ring_reduce_scatter, x)
        if not err:
            err = _compare(shard, want[lo:hi])
        if not err and prod_rs is not None:
            err = _compare(shard, prod_rs)
        if not err and not torch.equal(x, x_before):
            err = "ring_reduce_scatter modified its input"
        case["rs"] = err

        # all-gather: every rank contributes chunk `rank` of one global tensor; pure copies,
        # so the result must be bitwise equal
        err, gathered = _run(C.ring_all_gather, mine, numel)
        if not err and not torch.equal(gathered, full):
            err = _compare(gathered, full) or "not bitwise equal to the expected tensor"
        if not err and prod_ag is not None and not torch.equal(gathered, prod_ag):
            err = "differs from dist.all_gather_into_tensor"
        case["ag"] = err

        # all-reduce, traced: values, identical bits on every rank, bytes, only p2p ops
        tr = None
        if trace:
            from shardlab.runtime import CommTrace

            tr = CommTrace()
        if tr is not None:
            with tr:
                err, total = _run(C.ring_all_reduce, x)
        else:
            err, total = _run(C.ring_all_reduce, x)
        if not err:
            err = _compare(total, want)
        # every rank takes part in the bitwise check if every rank has a well-shaped result
        shaped = torch.tensor(
            [
                int(
                    isinstance(total, torch.Tensor)
                    and total.shape == x.shape
                    and total.dtype == x.dtype
                )
            ],
            device=x.device,
        )
        dist.all_reduce(shaped, op=dist.ReduceOp.MIN)
        if int(shaped):
            copies = [torch.empty_like(x) for _ in range(world)]
            dist.all_gather(copies, total.contiguous())
            if not err and not all(torch.equal(c, total) for c in copies):
                err = "ranks hold different all-reduce results (they must be bitwise identical)"
        if not err and not torch.equal(x, x_before):
            err = "ring_all_reduce modified its input"
        case["ar"] = err
        if keep:
            case["values"] = {"rs": shard, "ag": gathered, "ar": total}
        if tr is not None:
            case["sent_bytes"] = int(tr.sent_bytes())
            case["ops"] = _p2p_only(tr.records)
            case["n_records"] = len(tr.records)
            case["wire_bytes"] = tr.wire_bytes()  # measured on the sockets (shardlab.runtime.wire)
            case["sends"], case["recvs"] = tr.count(op="send"), tr.count(op="recv")
        out.append(case)
    return out


def check_subgroup(members: list[int], sizes, dtype: str = "float64", seed: int = 3) -> list[str]:
    """Ring all-reduce inside a subgroup (``group=`` argument); returns failure messages."""
    group = dist.new_group(members)  # every rank must call new_group, members or not
    rank = dist.get_rank()
    if rank not in members:
        return []
    errors = []
    for numel in sizes:
        x = rank_input(numel, dtype, rank, seed)
        want = x.clone()
        dist.all_reduce(want, group=group)
        err, total = _run(C.ring_all_reduce, x, group=group)
        err = err or _compare(total, want)
        if err:
            errors.append(f"group {members} rank {rank} numel={numel}: {err}")
    return errors


def check_dtypes(dtypes: list[str], sizes, seed: int = 5, keep: bool = False) -> list[list[dict]]:
    """:func:`check_collectives` for every dtype in one launch (one list per dtype)."""
    return [check_collectives(sizes, dt, seed, trace=False, keep=keep) for dt in dtypes]


def a2a_splits(world: int, seed: int = 0, max_rows: int = 5) -> list[list[int]]:
    """``splits[s][d]``: rows rank ``s`` sends to rank ``d`` (uneven, some zero), same on every rank."""
    g = torch.Generator().manual_seed(1_000_003 * (seed + 1) + 7919 * world)
    splits = torch.randint(0, max_rows + 1, (world, world), generator=g)
    splits[0, world - 1] = 0  # at least one empty message
    if world > 1:
        splits[world - 1, 0] += 1  # and at least one that crosses ranks
    return splits.tolist()


def check_all_to_all(seeds=(0, 1, 2), width: int = 3, keep: bool = False) -> list[dict]:
    """Student ``all_to_all`` against ``dist.all_to_all_single`` with uneven splits, traced
    (``keep``: with the result itself as ``"got"``)."""
    from shardlab.runtime import CommTrace

    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for seed in seeds:
        splits = a2a_splits(world, seed)
        ins = splits[rank]
        outs = [splits[s][rank] for s in range(world)]
        g = torch.Generator().manual_seed(100 * seed + rank)
        x = torch.randn(sum(ins), width, generator=g)
        want = x.new_empty(sum(outs), width)
        # production reference first, on every rank unconditionally (see check_collectives)
        dist.all_to_all_single(want, x, outs, ins)
        tr = CommTrace()
        with tr:
            err, got = _run(C.all_to_all, x, ins, outs)
        if not err and not (isinstance(got, torch.Tensor) and got.shape == want.shape):
            err = f"shape {getattr(got, 'shape', None)} != expected {tuple(want.shape)}"
        if not err and not torch.equal(got, want):
            err = "not bitwise equal to dist.all_to_all_single"
        row = width * x.element_size()
        out.append(
            {
                "seed": seed,
                "world": world,
                "rank": rank,
                "err": err,
                "splits": splits,
                "sent_bytes": int(tr.sent_bytes()),
                "expected_bytes": sum(n for d, n in enumerate(ins) if d != rank) * row,
                "ops": _p2p_only(tr.records),
                "n_records": len(tr.records),
                **({"got": got} if keep else {}),
            }
        )
    return out


def check_collectives_and_all_to_all(
    sizes, dtype: str = "float32", seed: int = 0, keep: bool = False
) -> dict:
    """:func:`check_collectives` and :func:`check_all_to_all` in one launch."""
    return {
        "rings": check_collectives(sizes, dtype, seed, True, keep),
        "a2a": check_all_to_all(keep=keep),
    }


# ---------------------------------------------------------------------------- caller side


def verdict(per_rank, key: str) -> str:
    """One line on check ``key`` (``"rs"``, ``"ag"``, ``"ar"``) over every rank and size of a
    :func:`check_collectives` launch: ``✓ 27 cases``, the first failure, or ``not run yet``
    when there is no case at all (a verdict over nothing is not a pass)."""
    cases = [c for ranks in per_rank for c in ranks if key in c]
    if not cases:
        return "not run yet"
    bad = [
        f"rank {c['rank']} numel={c['numel']}: {c[key].splitlines()[0]}" for c in cases if c[key]
    ]
    if not bad:
        return f"✓ {len(cases)} cases"
    return f"✗ {len(bad)} of {len(cases)} cases failed, first: {bad[0]}"
