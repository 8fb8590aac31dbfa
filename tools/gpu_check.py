"""One command for the first maintainer with a GPU: measured against predicted on CUDA/nccl.

    make gpu-check                     # or: .venv/bin/python tools/gpu_check.py [--out DIR]

No part of CI needs this: the labs are tested on CPU/gloo everywhere. On a machine with at
least one CUDA device it prints, and writes as JSON to ``--out`` (default
``_build/gpu-check/``):

1. **Peak memory.** ``shardlab train`` of every layout that fits one device with one rank on
   nccl (ddp, zero1, zero2, fsdp; tp and pp at degree 1), the ``small`` model:
   ``torch.cuda.max_memory_allocated`` of the measured steps against ``accounting.peak``'s
   prediction, with the ratio. (Several ranks cannot share one GPU over nccl — NCCL refuses
   two ranks on one device — so multi-rank layouts need as many GPUs as ranks: with 2 or more
   devices, ddp/fsdp/tp/pp also run on 2 ranks.)
2. **GEMM throughput.** The lab model's matrix products at their per-rank shapes (QKV, output
   projection, MLP up/down, LM head; fp32 and bf16), timed with CUDA events: achieved TFLOP/s
   next to the device's peak, i.e. the efficiency that ``accounting.compute`` assumes.
3. **Lab checks on the device.** Each lab's public tests are CPU/gloo tests (they build their
   expected values on the CPU); they are run once with the GPU visible to show they still pass
   there, and ``tests/test_lab_device_follow.py`` checks statically that lab code follows the
   data's device.

Aims to finish within 8 minutes on one GPU; each part has its own timeout and a failing part
is reported and does not stop the others. Exit status 0 when every part ran, 1 otherwise,
2 when there is no CUDA device.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYOUTS_ONE_RANK = ["ddp", "zero1", "zero2", "fsdp", "tp", "pp"]
LAYOUTS_TWO_RANKS = ["ddp", "fsdp", "tp", "pp"]


def _train(layout: str, ranks: int, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "shardlab", "train", "--layout", layout, "--ranks", str(ranks),
           "--model", "small", "--steps", "4", "--json"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    took = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"layout": layout, "ranks": ranks, "error": (proc.stderr or proc.stdout)[-800:]}
    text = proc.stdout[proc.stdout.index("{"):]
    data = json.loads(text)
    rows = [
        {"rank": r["rank"], "measured": r["peak"]["measured"], "predicted": r["peak"]["predicted"],
         "ratio": r["peak"]["ratio"], "source": r["peak"]["source"], "device": r["device"]}
        for r in data["rows"]
    ]
    return {"layout": layout, "ranks": ranks, "backend": data["backend"], "rows": rows,
            "seconds": round(took, 1)}


def peaks(devices: int, timeout: float) -> list[dict]:
    runs = [(lay, 1) for lay in LAYOUTS_ONE_RANK]
    if devices >= 2:
        runs += [(lay, 2) for lay in LAYOUTS_TWO_RANKS]
    out = []
    for layout, ranks in runs:
        try:
            res = _train(layout, ranks, timeout)
        except subprocess.TimeoutExpired:
            res = {"layout": layout, "ranks": ranks, "error": f"timed out after {timeout:g} s"}
        out.append(res)
        if "error" in res:
            print(f"  {layout:>6} x{ranks}: FAILED: {res['error'].strip().splitlines()[-1]}")
        for r in res.get("rows", []):
            print(f"  {layout:>6} x{ranks} rank {r['rank']}: measured {r['measured'] / 2**20:9.2f} MiB"
                  f"  predicted {r['predicted'] / 2**20:9.2f} MiB  ratio {r['ratio']:.4f}"
                  f"  ({r['source']}, {res['backend']})")
    return out


def gemms() -> list[dict]:
    import torch
    from shardlab.train.spec import MODELS  # the lab model shapes shardlab train uses

    shape = MODELS["small"]  # an accounting.compute.ModelShape
    h, ffn, vocab = shape.hidden, shape.ffn, shape.vocab
    tokens = 8 * shape.seq_len * 16  # a large enough token count to load the device
    named = {"qkv": (tokens, h, 3 * h), "proj": (tokens, h, h), "mlp_up": (tokens, h, ffn),
             "mlp_down": (tokens, ffn, h), "head": (tokens, h, vocab),
             "square_8192": (8192, 8192, 8192)}
    dev = torch.device("cuda")
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        for name, (m, k, n) in named.items():
            a = torch.randn(m, k, device=dev, dtype=dtype)
            b = torch.randn(k, n, device=dev, dtype=dtype)
            for _ in range(3):
                a @ b
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            reps = 20
            start.record()
            for _ in range(reps):
                a @ b
            end.record()
            torch.cuda.synchronize()
            sec = start.elapsed_time(end) / 1e3 / reps
            flops = 2 * m * k * n
            bytes_moved = (m * k + k * n + m * n) * a.element_size()
            row = {"gemm": name, "dtype": str(dtype).split(".")[-1], "m": m, "k": k, "n": n,
                   "tflops": flops / sec / 1e12, "intensity": flops / bytes_moved}
            out.append(row)
            print(f"  {row['dtype']:>8} {name:>12} ({m}x{k}x{n}): {row['tflops']:8.1f} TFLOP/s"
                  f"  intensity {row['intensity']:7.1f} FLOP/B")
    return out


def lab_tests(timeout: float) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-m", "not slow", "labs",
           "--ignore-glob=labs/*/hidden/*", "tests/test_lab_device_follow.py"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"ok": False, "summary": f"timed out after {timeout:g} s"}
    summary = (proc.stdout.strip().splitlines() or [""])[-1]
    print(f"  {summary}")
    return {"ok": proc.returncode == 0, "summary": summary}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "_build" / "gpu-check"), help="folder for results.json")
    ap.add_argument("--skip-tests", action="store_true", help="leave out part 3 (the lab tests)")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("gpu-check: torch is not installed; run `make venv` first.", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device is visible (torch.cuda.is_available() is False); "
              "this check needs one GPU. Nothing else in the project needs a GPU.", file=sys.stderr)
        return 2
    devices = torch.cuda.device_count()
    info = {"device": torch.cuda.get_device_name(0), "devices": devices,
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    print(f"gpu-check on {devices} x {info['device']} (torch {info['torch']}, CUDA {info['cuda']})")
    ok = True
    print("1. peak memory, shardlab train (small model, 4 steps): measured vs accounting.peak")
    info["peaks"] = peaks(devices, timeout=120)
    ok &= all("error" not in r for r in info["peaks"])
    print("2. GEMM throughput at the lab model's shapes (CUDA events, 20 repeats)")
    info["gemms"] = gemms()
    if not args.skip_tests:
        print("3. lab public tests with the GPU visible (CPU/gloo tests) + device-follow check")
        info["lab_tests"] = lab_tests(timeout=240)
        ok &= info["lab_tests"]["ok"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(info, indent=2))
    print(f"results written to {out / 'results.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
