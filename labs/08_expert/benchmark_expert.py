"""Benchmark: this lab's expert-parallel MoE layer against PyTorch-native references.

    python benchmark_expert.py [--ranks 2] [--steps 20] [--tokens 1024] [--hidden 256]
    python benchmark_expert.py --size 25m [--ranks 2 4] [--repeats 3] [--save] [--results-dir D]

``--size 25m``: hidden 1024, ffn 2048, 8 experts (33.6 M expert parameters; each all-to-all
moves 8.4 MB per rank at 1,024 tokens, top-2), 6 steps; ``bench`` is the defaults above.
``--repeats N`` repeats the launch (median [min-max] of the ratios); ``--save`` writes
``expert_<size>_<ranks>ranks.json`` (:func:`shardlab.benchresults.write_results`: per launch
the slowest rank's ours / torch a2a, each side over the compute floor, the seconds).

Three ways to run the same MoE layer (same weights, routing, capacity and drops) on the
same tokens, timed as the median forward + backward over ``--steps`` steps
(``_workers_expert.benchmark``; ours and PyTorch's all-to-all alternate step by step so that
load from other processes hits both alike):

* ``ours``: ``moe.moe_forward`` with ``AllToAllRows`` (``dist.all_to_all_single`` forward and
  backward), ``ep = --ranks`` ranks, ``T = --tokens`` tokens each;
* ``torch a2a``: the same layer with PyTorch's autograd-aware
  ``torch.distributed._functional_collectives.all_to_all_single_autograd`` in its place;
* ``1 process``: the single-process MoE of ``_workers_expert.reference_moe`` on all
  ``ep * T`` tokens (every expert in one process, no communication).

Ratios: ours / torch a2a (about 1.0 expected: both call gloo's all-to-all), and ours /
1 process (below 1.0 when splitting the experts over ranks pays for the all-to-alls).
Bytes of ours are measured in the tests and the notebook, not here; the script prints the
three times and both ratios.

**Against the limit.** Each launch also times a *compute floor*, interleaved step by step with
ours and PyTorch's: the same layer on the same tokens with :class:`NoCommAllToAll` as the
rows' all-to-all, a local copy cut or zero-padded to the rows this rank would receive
(``sum(out_splits)``), so every local expert multiplies as many tokens as it would with real
communication, and no bytes move (the routing's small all-gather of ``ep x E`` counts stays,
so that the splits are the real ones). ``step time / compute floor`` (slowest rank) is above
1.0 by what the all-to-alls leave exposed.
"""

from __future__ import annotations

import argparse

import moe as M
import torch
import torch.distributed as dist
from _workers_expert import _err, global_batch, reference_moe

# run as a script, Python puts this folder on sys.path; the ranks it launches find these
# modules the same way (the launcher passes its sys.path on)


# ------------------------------------------------------------------ rank code
class TorchAllToAll:
    """PyTorch's own autograd-aware all-to-all, in place of the student's ``AllToAllRows``."""

    @staticmethod
    def apply(x, in_splits, out_splits, group=None):
        from torch.distributed import _functional_collectives as funcol

        out = funcol.all_to_all_single_autograd(
            x, list(out_splits), list(in_splits), group or dist.group.WORLD
        )
        return funcol.wait_tensor(out) if hasattr(out, "wait") else out


def _fit_rows(x: torch.Tensor, n: int) -> torch.Tensor:
    """``x`` cut or zero-padded to ``n`` rows (a new tensor)."""
    if n <= x.shape[0]:
        return x[:n].clone()
    return torch.cat([x, x.new_zeros((n - x.shape[0], *x.shape[1:]))])


class NoCommAllToAll(torch.autograd.Function):
    """The compute floor's all-to-all: no bytes move, but the result has the rows a real one
    would deliver (``sum(out_splits)``; this rank's own rows, cut or zero-padded), so every
    local expert multiplies exactly the tokens it would receive; backward likewise."""

    @staticmethod
    def forward(ctx, x, in_splits, out_splits, group=None):
        ctx.rows = x.shape[0]
        return _fit_rows(x, sum(out_splits))

    @staticmethod
    def backward(ctx, grad):
        return _fit_rows(grad, ctx.rows), None, None, None


def benchmark(cfg: M.MoEConfig, tokens_per_rank: int, steps: int = 20, warmup: int = 3) -> dict:
    """Median forward+backward time of three MoE layers on the same tokens, alternating.

    ``mine``: ``moe_forward`` with ``AllToAllRows`` (``dist.all_to_all_single``); ``torch``:
    the same layer with PyTorch's ``all_to_all_single_autograd`` swapped in; ``floor``: the
    same layer with :class:`NoCommAllToAll` (the compute floor: the rows' all-to-alls move
    nothing; the routing's all-gather of ``ep x E`` counts stays); ``single``: the
    single-process reference on all ``ep * T`` tokens, timed on rank 0 while the others wait.
    ``over_floor``: ours and PyTorch's time over the floor's.
    """
    import statistics
    import time

    torch.set_num_threads(1)
    rank, t = dist.get_rank(), tokens_per_rank
    params = M.init_params(cfg, 0)
    x_full = global_batch(cfg, t, 0, torch.float32)
    x = x_full[rank * t : (rank + 1) * t]
    mine = M.local_experts(params, cfg, rank)
    own = M.AllToAllRows
    times = {"mine": [], "torch": [], "floor": []}
    swap = {"mine": own, "torch": TorchAllToAll, "floor": NoCommAllToAll}
    outs = {}
    for i in range(warmup + steps):
        for impl in ("mine", "torch", "floor"):
            M.AllToAllRows = swap[impl]
            try:
                dist.barrier()
                t0 = time.perf_counter()
                xi = x.clone().requires_grad_()
                y, aux, _ = M.moe_forward(xi, mine, cfg)
                (y.sum() + aux).backward()
                dt = time.perf_counter() - t0
            finally:
                M.AllToAllRows = own
            outs[impl] = (y.detach(), xi.grad)
            if i >= warmup:
                times[impl].append(dt)
    res = {k: statistics.median(v) for k, v in times.items()}
    res["max_abs_diff"] = max(_err(a, b) for a, b in zip(outs["mine"], outs["torch"]))
    res["over_floor"] = {k: res[k] / res["floor"] for k in ("mine", "torch")}
    dist.barrier()
    if rank == 0:
        single = []
        for i in range(warmup + steps):
            t0 = time.perf_counter()
            ref_p = {n: p.clone().requires_grad_() for n, p in params.items()}
            xr = x_full.clone().requires_grad_()
            y, aux, _, _ = reference_moe(xr, ref_p, cfg)
            (y.sum() + aux).backward()
            if i >= warmup:
                single.append(time.perf_counter() - t0)
        res["single"] = statistics.median(single)
    dist.barrier()
    return res


# ------------------------------------------------------------------ launch, print
SIZE_25M = {"hidden": 1024, "steps": 6}  # 8 experts x 2 x 1024 x 2048 = 33.6 M parameters


def _row(res: list[dict]) -> dict:
    """One launch for the results file: the slowest rank's times (every step ends in an
    all-to-all, so the slowest rank sets the pace)."""
    sec = {k: max(m[k] for m in res) for k in ("mine", "torch", "floor")}
    return {"ratio": {"step": sec["mine"] / sec["torch"]},
            "floor": {"ours": sec["mine"] / sec["floor"], "torch": sec["torch"] / sec["floor"]},
            "seconds": {**sec, "single": res[0]["single"]}}


def main(argv: list[str] | None = None) -> list[dict]:
    from shardlab.benchresults import add_arguments, load_average, write_results
    from shardlab.runtime import launch
    from shardlab.testing import median_range

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=("bench", "25m"), default="bench")
    ap.add_argument("--ranks", type=int, nargs="+", default=[2])
    ap.add_argument("--steps", type=int, default=None, help="default 20 (bench), 6 (25m)")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=None, help="default 256 (bench), 1024 (25m)")
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--capacity-factor", type=float, default=1.25)
    add_arguments(ap)
    a = ap.parse_args(argv)
    big = a.size == "25m"
    hidden = a.hidden or (SIZE_25M["hidden"] if big else 256)
    steps = a.steps or (SIZE_25M["steps"] if big else 20)
    # bad sizes fail here, naming the values, before any rank starts
    cfgs = {d: M.MoEConfig(hidden=hidden, ffn=2 * hidden, num_experts=a.experts, top_k=a.top_k,
                           capacity_factor=a.capacity_factor, ep=d) for d in a.ranks}
    out = []
    for ranks, cfg in cfgs.items():
        load_before, launches = load_average(), []
        for rep in range(a.repeats):
            res = launch("benchmark_expert:benchmark", ranks, cfg, a.tokens, steps, quiet=True,
                         timeout=600)
            launches.append(_row(res))
            out = res if not out else out
            if rep == 0:
                _print(cfg, a.tokens, steps, res)
        more = f", median [min-max] of {a.repeats} launches" if a.repeats > 1 else ""
        if a.repeats > 1:
            each = [x["ratio"]["step"] for x in launches]
            print(f"ours / torch a2a (slowest rank) per launch: "
                  f"{' '.join(f'{v:.3f}' for v in each)}; median {median_range(each)}")
        print(f"step time / compute floor (slowest rank){more}: ours "
              f"{median_range(x['floor']['ours'] for x in launches)}, PyTorch "
              f"{median_range(x['floor']['torch'] for x in launches)}")
        if a.save:
            path = write_results(
                f"expert_{a.size}_{ranks}ranks", launches,
                benchmark="lab 08 expert-parallel MoE all-to-all vs all_to_all_single_autograd "
                          "(gloo, CPU)",
                config={"size": a.size, "ranks": ranks, "hidden": hidden, "ffn": 2 * hidden,
                        "experts": a.experts, "top_k": a.top_k, "tokens": a.tokens,
                        "capacity_factor": a.capacity_factor, "steps": steps,
                        "n_params": a.experts * 2 * hidden * 2 * hidden},
                load_before=load_before, directory=a.results_dir,
            )
            print(f"results written to {path.name}")
    return out


def _print(cfg, tokens: int, steps: int, res: list[dict]) -> None:
    print(f"MoE h={cfg.hidden} f={cfg.ffn} E={cfg.num_experts} k={cfg.top_k} "
          f"cf={cfg.capacity_factor}, ep={cfg.ep} ranks x T={tokens} tokens, fp32, gloo, "
          f"median of {steps} fwd+bwd")
    print(f"{'rank':>4}{'ours ms':>10}{'torch a2a ms':>14}{'ours/torch':>12}"
          f"{'max |diff|':>12}")
    for r, m in enumerate(res):
        print(f"{r:>4}{m['mine'] * 1e3:10.1f}{m['torch'] * 1e3:14.1f}"
              f"{m['mine'] / m['torch']:12.2f}{m['max_abs_diff']:12.1e}")
    for r, m in enumerate(res):
        print(f"rank {r}: compute floor (the rows' all-to-alls as no-ops) {m['floor'] * 1e3:.1f} ms;"
              f" step / floor: ours {m['over_floor']['mine']:.2f}, "
              f"PyTorch {m['over_floor']['torch']:.2f}")
    slowest = max(m["mine"] for m in res)
    single = res[0]["single"]
    print(
        f"1 process, all {cfg.ep * tokens} tokens: {single * 1e3:.1f} ms; "
        f"ours (slowest rank) / 1 process = {slowest / single:.2f}"
    )


if __name__ == "__main__":
    main()
