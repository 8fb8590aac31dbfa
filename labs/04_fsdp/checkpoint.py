"""Sharded checkpoints of the lab's FSDP: saved by D ranks, loaded by any number of ranks.

What is on disk. ``root/step-00000012/`` holds one file per rank, ``shard-<r>-of-<D>.bin``,
and ``meta.json``. Rank ``r``'s file is a sequence of *records*, the same on every rank:
for each flat parameter (in unit order) its ``padded/D`` slice of the weights, then the
slice of each per-element optimizer state (AdamW: ``exp_avg``, ``exp_avg_sq``), and last the
rank's CPU RNG state. ``meta.json`` records the world size, every flat's parameters (names,
shapes, offsets), ``numel``/``padded``/dtype, the optimizer's scalars (``step``), each
record's offset, size and dtype, and each file's size and per-record crc32. With fp32
weights and states a file has ``accounting.checkpoint.shard_file_bytes(numels, D, n_states,
4, rng_bytes)`` bytes.

Atomic. Ranks write into ``.step-00000012.tmp``, ``fsync`` their file, rank 0 writes
``meta.json``, ``fsync``s the directory and renames it to ``step-00000012``: the rename is the
commit. A rank killed before it leaves only the ``.tmp`` directory, which loading ignores and
the next save replaces, so the previous checkpoint stays complete.

Resharding. A rank of a new world size D' needs elements ``[r s', (r+1) s')`` of each flat
(padding dropped); it reads only the old slices that overlap that range, each whole so that
its checksum can be checked (``accounting.checkpoint.reshard_read_bytes``), and old rank
``r mod D``'s RNG state. Structure (missing/extra files, sizes, shapes, dtypes, optimizer)
is validated by every rank before any byte is read; a bad checksum seen by one rank is
shared with ``all_gather_object``, so every rank raises the same ``ValueError`` before any
weight changes. Collectives: two barriers and a ``gather_object`` of each file's size and
checksums on save, one ``all_gather_object`` of error messages on load; no tensor travels.

In production: ``torch.distributed.checkpoint`` (DCP) saves each rank's DTensor shards with
a global plan, writes ``.metadata`` last, and reshards on load by planning reads of the
chunks each new rank needs (see ``benchmark_checkpoint.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from fsdp import FSDP

FORMAT = "shardlab-flat-fsdp/1"


@dataclass
class LoadReport:
    """What one rank did while loading: the step, bytes read from shard files, files opened."""

    step: int
    bytes_read: int
    files_read: list[str]


def _dir(root: Path, step: int, tmp: bool = False) -> Path:
    return Path(root) / (f".step-{step:08d}.tmp" if tmp else f"step-{step:08d}")


def shard_name(rank: int, world: int) -> str:
    return f"shard-{rank}-of-{world}.bin"


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The committed checkpoint with the highest step (``.tmp`` directories are ignored)."""
    done = sorted(p for p in Path(root).glob("step-*") if (p / "meta.json").is_file())
    return done[-1] if done else None


def _flats(model: FSDP) -> list[tuple[str, object]]:
    return [(f"{u.name}/{i}", f) for u in model.units for i, f in enumerate(u.flats)]


def _layout(model: FSDP, opt: torch.optim.Optimizer) -> list[dict]:
    """Per flat: names/shapes/offsets, sizes, dtype and the optimizer state it carries."""
    out = []
    for key, f in _flats(model):
        st = opt.state.get(f.shard, {})
        out.append({
            "key": key, "numel": f.numel, "padded": f.padded, "dtype": str(f.shard.dtype),
            "requires_grad": f.requires_grad,
            "params": [[[a[2] for a in s.aliases], list(s.shape), s.offset] for s in f.slots],
            "states": sorted(k for k, v in st.items() if torch.is_tensor(v) and v.dim() == 1),
            "scalars": {k: float(v) for k, v in st.items() if not torch.is_tensor(v) or v.dim() == 0},
        })
    return out


def _write_record(fh, t: torch.Tensor) -> int:
    """Append ``t``'s raw bytes to ``fh``; return their crc32."""
    data = t.detach().contiguous().view(torch.uint8).numpy().tobytes()
    fh.write(data)
    return zlib.crc32(data)


def save_checkpoint(root: str | os.PathLike, step: int, model: FSDP, opt) -> Path:
    """Collective: every rank writes its shard file; rank 0 commits. Returns the directory."""
    rank, world = dist.get_rank(model.group), model.world
    tmp, final = _dir(root, step, tmp=True), _dir(root, step)
    layout = _layout(model, opt)
    records, crcs, offset = [], [], 0
    # BEGIN SOLUTION hint: rank 0 makes a fresh tmp dir (barrier); each rank writes (_write_record) per flat its shard then opt.state[shard][k] for k in layout's "states", then torch.get_rng_state(), appending records/crcs, then flush + os.fsync; gather_object {"bytes", "crc32"} to rank 0, which writes _meta(...) as meta.json, fsyncs it and the dir, then os.replace(tmp, final)
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # a crashed earlier attempt
        tmp.mkdir(parents=True)
    dist.barrier(group=model.group)  # nobody writes before the directory exists
    with open(tmp / shard_name(rank, world), "wb") as fh:
        for (key, f), lay in zip(_flats(model), layout):
            tensors = [("weights", f.shard)] + [(k, opt.state[f.shard][k]) for k in lay["states"]]
            for kind, t in tensors:
                crcs.append(_write_record(fh, t))
                records.append({"flat": key, "kind": kind, "offset": offset, "nbytes": t.nbytes,
                                "dtype": str(t.dtype).removeprefix("torch.")})
                offset += t.nbytes
        rng = torch.get_rng_state()
        crcs.append(_write_record(fh, rng))
        records.append({"flat": None, "kind": "rng", "offset": offset, "nbytes": rng.nbytes,
                        "dtype": "uint8"})
        fh.flush()
        os.fsync(fh.fileno())  # the data is on disk before the rename can commit it
    files = [None] * world if rank == 0 else None
    dist.gather_object({"bytes": offset + rng.nbytes, "crc32": crcs}, files, group_dst=0,
                       group=model.group)
    if rank == 0:
        meta = _meta(world, step, opt, layout, records, files)
        with open(tmp / "meta.json", "w") as fh:
            json.dump(meta, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        _fsync_dir(tmp)
        shutil.rmtree(final, ignore_errors=True)  # saving the same step again replaces it
        os.replace(tmp, final)  # the commit: atomic on POSIX
        _fsync_dir(final.parent)
    # END SOLUTION
    dist.barrier(group=model.group)  # nobody returns before the commit
    return final


def _meta(world: int, step: int, opt, layout: list, records: list, files: list) -> dict:
    """``meta.json``: ``records`` as ``{"flat", "kind", "offset", "nbytes", "dtype"}`` (the same
    on every rank), ``files[r]`` as ``{"bytes", "crc32": [one per record]}``."""
    return {
        "format": FORMAT, "world_size": world, "step": step, "optimizer": type(opt).__name__,
        "flats": layout, "records": records,
        "files": [{"name": shard_name(r, world), **x} for r, x in enumerate(files)],
    }


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_meta(path: str | os.PathLike) -> dict:
    """``meta.json`` of a committed checkpoint, with its files' presence and sizes checked."""
    path = Path(path)
    if not (path / "meta.json").is_file():
        raise ValueError(f"{path} has no meta.json: it is not a committed checkpoint "
                         "(an interrupted save leaves only a .tmp directory)")
    meta = json.loads((path / "meta.json").read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path / 'meta.json'}: format {meta.get('format')!r} is not {FORMAT!r}")
    world, expected = meta["world_size"], {f["name"]: f["bytes"] for f in meta["files"]}
    on_disk = {p.name for p in path.glob("shard-*.bin")}
    for name in sorted(on_disk - set(expected)):
        raise ValueError(f"{path / name} does not belong to this checkpoint: meta.json records "
                         f"world size {world} (files shard-0-of-{world}.bin ...)")
    for name, nbytes in expected.items():
        if name not in on_disk:
            raise ValueError(f"{path / name} is missing: meta.json records world size {world}")
        size = (path / name).stat().st_size
        if size != nbytes:
            what = "truncated" if size < nbytes else "longer than what was saved"
            raise ValueError(f"{path / name} has {size} bytes but meta.json records {nbytes}: "
                             f"the file is {what}")
    return meta


def _check_layout(path: Path, meta: dict, want: list[dict], opt) -> None:
    """Refuse a checkpoint saved from another model or optimizer, naming the difference."""
    if meta["optimizer"] != type(opt).__name__:
        raise ValueError(f"{path / 'meta.json'} was saved with optimizer {meta['optimizer']}, "
                         f"the run uses {type(opt).__name__}")
    saved = {f["key"]: f for f in meta["flats"]}
    if list(saved) != [f["key"] for f in want]:
        raise ValueError(f"{path / 'meta.json'} records flat parameters {list(saved)}, the model "
                         f"has {[f['key'] for f in want]}")
    for w in want:
        s = saved[w["key"]]
        for field in ("numel", "dtype", "params", "requires_grad"):
            if s[field] != w[field]:
                raise ValueError(f"{path / 'meta.json'}: flat {w['key']!r} has {field} "
                                 f"{s[field]} in the checkpoint but {w[field]} in the model: "
                                 "the checkpoint is from a different model")


def _needed(numel: int, old_world: int, new_world: int, rank: int) -> list[tuple[int, int, int]]:
    """``(old rank, lo, hi)``: the global elements ``[lo, hi)`` of a flat that the new rank
    ``rank`` copies from old rank's slice (padding excluded)."""
    out = []
    # BEGIN SOLUTION hint: new slice [rank*s_new, (rank+1)*s_new) clipped to numel; for each old rank k, intersect with [k*s_old, (k+1)*s_old)
    s_old, s_new = -(-numel // old_world), -(-numel // new_world)
    lo, hi = rank * s_new, min((rank + 1) * s_new, numel)
    for k in range(old_world):
        a, b = max(lo, k * s_old), min(hi, (k + 1) * s_old)
        if a < b:
            out.append((k, a, b))
    # END SOLUTION
    return out


def load_checkpoint(path: str | os.PathLike, model: FSDP, opt) -> LoadReport:
    """Collective: fill this rank's shards, optimizer state and RNG from ``path`` (any saved
    world size). Raises ``ValueError`` on every rank, before changing anything, if the
    checkpoint is incomplete, corrupt or from another model."""
    path, rank, world = Path(path), dist.get_rank(model.group), model.world
    meta = read_meta(path)
    old, want = meta["world_size"], _layout(model, opt)
    for w in want:  # a fresh optimizer has no state yet: take the names from the checkpoint
        w["states"], w["scalars"] = [], {}
    _check_layout(path, meta, want, opt)
    rec = {(r["flat"], r["kind"]): (i, r) for i, r in enumerate(meta["records"])}
    fds, nread, error, new = {}, 0, None, {}

    def read(k: int, i: int, r: dict) -> torch.Tensor | None:
        nonlocal nread, error
        name = meta["files"][k]["name"]
        fd = fds.setdefault(name, os.open(path / name, os.O_RDONLY))
        data = os.pread(fd, r["nbytes"], r["offset"])
        nread += len(data)
        # BEGIN SOLUTION hint: compare zlib.crc32(data) with meta["files"][k]["crc32"][i]; on mismatch set error = _crc_error(...) and return None
        crc, saved = zlib.crc32(data), meta["files"][k]["crc32"][i]
        if crc != saved:
            error = _crc_error(path / name, r, crc, saved)
            return None
        # END SOLUTION
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)

    try:
        for (key, f), lay in zip(_flats(model), meta["flats"]):
            s_old = -(-f.numel // old)
            for kind in ["weights", *lay["states"]]:
                dtype = getattr(torch, rec[(key, kind)][1]["dtype"])
                out = f.shard.new_zeros(f.shard_numel, dtype=dtype)  # (padded'/D',) zero padding
                for k, lo, hi in _needed(f.numel, old, world, rank):
                    raw = read(k, *rec[(key, kind)])
                    if raw is None:
                        break
                    src = raw.view(dtype)  # (s_old,) old rank k's slice
                    out[lo - rank * f.shard_numel : hi - rank * f.shard_numel] = src[
                        lo - k * s_old : hi - k * s_old
                    ]
                new[(key, kind)] = out
        rng = read(rank % old, *rec[(None, "rng")])
    finally:
        for fd in fds.values():
            os.close(fd)
    errors = [None] * world
    dist.all_gather_object(errors, error, group=model.group)  # one rank's bad shard stops all
    first = next((e for e in errors if e), None)
    if first:
        raise ValueError(first)
    with torch.no_grad():
        for (key, f), lay in zip(_flats(model), meta["flats"]):
            f.shard.copy_(new[(key, "weights")])
            if lay["states"] or lay["scalars"]:
                st = opt.state[f.shard]
                st.update({k: new[(key, k)] for k in lay["states"]})
                for k, v in lay["scalars"].items():  # AdamW's step: a float32 0-dim tensor
                    st[k] = torch.tensor(v, dtype=torch.float32)
    torch.set_rng_state(rng)
    return LoadReport(meta["step"], nread, sorted(fds))


def verify_checkpoint(path: str | os.PathLike) -> dict:
    """Without ranks: check files, sizes and every record's crc32; return ``meta.json``."""
    meta = read_meta(path)
    for f in meta["files"]:
        data = (Path(path) / f["name"]).read_bytes()
        for i, r in enumerate(meta["records"]):
            crc = zlib.crc32(data[r["offset"] : r["offset"] + r["nbytes"]])
            if crc != f["crc32"][i]:
                raise ValueError(_crc_error(Path(path) / f["name"], r, crc, f["crc32"][i]))
    return meta


def _crc_error(file: Path, r: dict, crc: int, saved: int) -> str:
    return (f"{file}: bytes [{r['offset']}, {r['offset'] + r['nbytes']}) ({r['flat']} "
            f"{r['kind']}) have crc32 {crc:#010x} but meta.json records {saved:#010x}: the "
            "shard is corrupt")
