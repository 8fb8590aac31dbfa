"""Benchmark: this lab's sharded checkpoint vs ``torch.distributed.checkpoint`` (DCP) + FSDP2.

    python benchmark_checkpoint.py [--save-ranks 4] [--load-ranks 4 2 1] [--d-model 256]
                                   [--launches 1] [--save] [--results-dir DIR]

One run: ``--save-ranks`` ranks train one AdamW step and save (ours: our FSDP's flat shards,
``checkpoint.save_checkpoint``; DCP: ``dcp.save`` of FSDP2's ``get_state_dict`` model and
optimizer state plus the RNG state), then each world size of ``--load-ranks`` loads both
(DCP reshards DTensors by itself; ours reads the old slices each new rank needs). Printed:
bytes on disk (ours also against ``accounting.checkpoint.checkpoint_bytes``), median
save/load seconds of ``--repeats`` (slowest rank, between barriers) and ratios ours / DCP
(below 1.0: ours is smaller or faster). The disk is whatever ``--dir`` (default: a temporary
directory) sits on; times include fsync on our side, DCP's default writer fsyncs too.

``--repeats`` counts saves and loads inside one launch; ``--launches N`` repeats the whole run
(save, then every load) N times, prints the first run's table, then each run's ratios and their
median [min-max]. ``--save`` writes ``checkpoint_d<d_model>_<save-ranks>ranks.json`` into
``--results-dir`` (default ``benchmarks/results``; :func:`shardlab.benchresults.write_results`:
machine, load, per run the ratios ours / DCP, bytes and seconds).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import checkpoint as ckpt
import torch
import torch.distributed as dist
from _workers_checkpoint import TOTAL, fresh, train_step
from _workers_fsdp import make_batches, make_model
from shardlab.benchresults import add_arguments, load_average, write_results
from shardlab.models import lm_loss, make_optimizer, rank_slice
from shardlab.testing import median_range

# run as a script, Python puts this folder on sys.path; the ranks it launches find these
# modules the same way (the launcher passes its sys.path on)


# ------------------------------------------------------------------ rank code
def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        dist.barrier()  # every rank starts together; the slowest rank sets the time
        t0 = time.perf_counter()
        fn()
        dist.barrier()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def _fsdp2(**cfg):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = make_model("plain", **cfg)
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, make_optimizer("adamw", model.parameters())


def bench(ours_dir: str, dcp_dir: str, load: bool, repeats: int = 3, **cfg) -> dict:
    """Median seconds of ``repeats`` saves (``load=False``, step-1 state) or loads of this
    lab's checkpoint and of ``torch.distributed.checkpoint`` with FSDP2 (``fully_shard`` per
    block and root) on the same model; loads work at any world size (resharding)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    out = {"world": dist.get_world_size()}
    model, opt = fresh(**cfg)
    train_step(model, opt, 1)
    if load:
        reports = []
        out["ours_s"] = _median_seconds(
            lambda: reports.append(ckpt.load_checkpoint(ours_dir, model, opt)), repeats
        )
        out["ours_read"] = reports[-1].bytes_read
    else:
        out["ours_s"] = _median_seconds(
            lambda: ckpt.save_checkpoint(ours_dir, 1, model, opt), repeats
        )
    model2, opt2 = _fsdp2(**cfg)
    x, y = make_batches(TOTAL)[0]
    lm_loss(model2, rank_slice(x), rank_slice(y)).backward()
    opt2.step()
    opt2.zero_grad()

    def dcp_save():
        msd, osd = get_state_dict(model2, opt2)
        dcp.save({"model": msd, "optim": osd, "rng": torch.get_rng_state()}, checkpoint_id=dcp_dir)

    def dcp_load():
        msd, osd = get_state_dict(model2, opt2)
        state = {"model": msd, "optim": osd, "rng": torch.get_rng_state()}
        dcp.load(state, checkpoint_id=dcp_dir)
        set_state_dict(
            model2, opt2, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        torch.set_rng_state(state["rng"])

    out["dcp_s"] = _median_seconds(dcp_load if load else dcp_save, repeats)
    out["n_params"] = sum(p.numel() for p in make_model("plain", **cfg).parameters())
    return out


# ------------------------------------------------------------------ launch, files, print


def dir_bytes(path: Path) -> tuple[int, int]:
    """(total bytes, number of files) under ``path``."""
    files = [p for p in Path(path).rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files), len(files)


def dcp_layout(path: Path) -> dict:
    """DCP's tensor payload, its ``.metadata`` and the number of records it wrote: each
    (tensor, rank) piece is one record of its own in a ``.distcp`` file."""
    import math

    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    md = FileSystemReader(str(path)).read_metadata()
    payload = 0
    for m in md.state_dict_metadata.values():
        if isinstance(m, TensorStorageMetadata):
            item = m.properties.dtype.itemsize
            payload += sum(math.prod(c.sizes) * item for c in m.chunks)
    return {
        "dcp_payload": payload,
        "dcp_records": len(md.storage_data),
        "dcp_metadata": (Path(path) / ".metadata").stat().st_size,
    }


def measure(a: argparse.Namespace, cfg: dict) -> dict:
    """One run: ``a.save_ranks`` ranks save, every world size of ``a.load_ranks`` loads."""
    from shardlab.accounting import checkpoint as acc
    from shardlab.runtime import launch

    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        ours_root, dcp_dir = Path(tmp) / "ours", Path(tmp) / "dcp"
        fn = "benchmark_checkpoint:bench"
        save = launch(fn, a.save_ranks, str(ours_root), str(dcp_dir), False, a.repeats, **cfg,
                      quiet=True, timeout=600)
        path = ckpt.latest_checkpoint(ours_root)
        meta = ckpt.read_meta(path)
        rng = torch.get_rng_state().numel()
        numels = [f["numel"] for f in meta["flats"]]
        res = {"n_params": save[0]["n_params"], "save": save[0], "load": {}}
        res["ours_bytes"], res["ours_files"] = dir_bytes(path)
        res["dcp_bytes"], res["dcp_files"] = dir_bytes(dcp_dir)
        res.update(dcp_layout(dcp_dir))
        res["ours_predicted"] = acc.checkpoint_bytes(numels, a.save_ranks, 2, 4, rng)
        res["meta_bytes"] = (path / "meta.json").stat().st_size
        for d in a.load_ranks:
            runs = launch(fn, d, str(path), str(dcp_dir), True, a.repeats, **cfg, quiet=True,
                          timeout=600)
            pred = [acc.reshard_read_bytes(numels, a.save_ranks, d, r, 2, 4, rng) for r in range(d)]
            res["load"][d] = {**runs[0], "read": [r["ours_read"] for r in runs], "predicted": pred}
    return res


def ratios(res: dict) -> dict:
    """One run's ratios ours / DCP: bytes on disk, save and each load (slowest rank)."""
    out = {"bytes": res["ours_bytes"] / res["dcp_bytes"],
           "save": res["save"]["ours_s"] / res["save"]["dcp_s"]}
    out.update({f"load_{d}": r["ours_s"] / r["dcp_s"] for d, r in res["load"].items()})
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--save-ranks", type=int, default=4)
    ap.add_argument("--load-ranks", type=int, nargs="+", default=[4, 2, 1])
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    add_arguments(ap, "--launches")  # --save: checkpoint_d<d>_<ranks>ranks.json
    a = ap.parse_args(argv)
    cfg = dict(d_model=a.d_model, n_layer=a.layers, vocab_size=a.vocab)
    load_before = load_average()
    every = [measure(a, cfg) for _ in range(a.launches)]
    res = every[0]
    print(f"model: {res['n_params']:,} parameters ({cfg}), AdamW state, saved by "
          f"{a.save_ranks} ranks; median of {a.repeats}")
    print(f"{'':26}{'ours':>14}{'DCP':>14}{'ours/DCP':>10}")
    print(f"{'bytes on disk':26}{res['ours_bytes']:14,d}{res['dcp_bytes']:14,d}"
          f"{res['ours_bytes'] / res['dcp_bytes']:10.3f}")
    print(f"{'files':26}{res['ours_files']:14d}{res['dcp_files']:14d}")
    s = res["save"]
    print(f"{f'save at D={a.save_ranks} (ms)':26}{s['ours_s'] * 1e3:14.1f}{s['dcp_s'] * 1e3:14.1f}"
          f"{s['ours_s'] / s['dcp_s']:10.2f}")
    for d, r in res["load"].items():
        print(f"{f'load at D={d} (ms)':26}{r['ours_s'] * 1e3:14.1f}{r['dcp_s'] * 1e3:14.1f}"
              f"{r['ours_s'] / r['dcp_s']:10.2f}")
    print(f"ours: shard files {res['ours_bytes'] - res['meta_bytes']:,} B = "
          f"accounting.checkpoint.checkpoint_bytes {res['ours_predicted']:,} B; "
          f"meta.json {res['meta_bytes']:,} B")
    over = res["dcp_bytes"] - res["dcp_payload"] - res["dcp_metadata"]
    print(f"DCP: tensor payload {res['dcp_payload']:,} B, .metadata {res['dcp_metadata']:,} B, "
          f"{res['dcp_records']} records in .distcp files carrying {over:,} B of framing "
          f"({over / res['dcp_records']:,.0f} B per record)")
    for d, r in res["load"].items():
        ok = "=" if r["read"] == r["predicted"] else "!="
        print(f"ours, bytes read per rank at D={d}: {r['read']} {ok} reshard_read_bytes")
    per_run = [ratios(r) for r in every]
    if a.launches > 1:
        print(f"ratio ours / DCP, median [min-max] of {a.launches} runs")
        for k in per_run[0]:
            each = " ".join(f"{p[k]:.3f}" for p in per_run)
            print(f"  {k:8s} {median_range(p[k] for p in per_run)} (per run: {each})")
    if a.save:
        rows = [
            {"ratio": p,
             "bytes": {"ours": r["ours_bytes"], "dcp": r["dcp_bytes"]},
             "seconds": {"save": {"ours": r["save"]["ours_s"], "dcp": r["save"]["dcp_s"]},
                         **{f"load_{d}": {"ours": x["ours_s"], "dcp": x["dcp_s"]}
                            for d, x in r["load"].items()}}}
            for p, r in zip(per_run, every)
        ]
        path = write_results(
            f"checkpoint_d{a.d_model}_{a.save_ranks}ranks", rows,
            benchmark="lab 04 sharded checkpoint vs torch.distributed.checkpoint + FSDP2 "
                      "(gloo, CPU)",
            config={**cfg, "n_params": res["n_params"], "save_ranks": a.save_ranks,
                    "load_ranks": a.load_ranks, "repeats": a.repeats, "launches": a.launches,
                    "dir": a.dir},
            load_before=load_before, directory=a.results_dir,
        )
        print(f"results written to {path.name}")
    return {**res, "launches": every} if a.launches > 1 else res


if __name__ == "__main__":
    main()
