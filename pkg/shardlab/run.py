"""``python -m shardlab.run module:function [ARGS...] [--nproc N] [--backend B] [--timeout S]``

Runs a worker function on N ranks, the same function a lab notebook passes to
:func:`shardlab.runtime.launch`.

* On a laptop or a single node: ``python -m shardlab.run benchmark_ddp:run --nproc 4 steps=10``
  starts the ranks through :func:`shardlab.runtime.launch` and prints every rank's return value.
* Under ``torchrun`` (the environment already holds ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
  ``MASTER_ADDR``, ``MASTER_PORT``)::

      torchrun --nproc-per-node 8 -m shardlab.run benchmark_ddp:run steps=10

  each process initialises the default group from the environment (nccl with
  ``cuda:LOCAL_RANK`` when CUDA is available, else gloo), calls the function once and prints
  its return value prefixed ``[rank r]``. ``--nproc`` is ignored there. For several nodes
  see ``shardlab/slurm/train.sbatch``.

Arguments after the function: ``VALUE`` (positional) or ``NAME=VALUE`` (keyword); values are
read with ``ast.literal_eval`` when possible (numbers, lists, True/None ...) and kept as strings
otherwise. Run it from the lab folder: ``python -m`` (and ``torchrun -m``) put the working
directory first on ``sys.path``, so the lab's modules are found.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys

__all__ = ["main", "parse_values"]


def _value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_values(items: list[str]) -> tuple[list, dict]:
    """Split ``["1", "steps=10", "name='x'"]`` into positional and keyword arguments."""
    args, kwargs = [], {}
    for it in items:
        name, sep, val = it.partition("=")
        if sep and name.isidentifier():
            kwargs[name] = _value(val)
        else:
            if kwargs:
                raise ValueError(f"positional argument {it!r} follows keyword arguments.")
            args.append(_value(it))
    return args, kwargs


def _under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")) and (
        "TORCHELASTIC_RUN_ID" in os.environ
        or "SLURM_PROCID" in os.environ
        or "SHARDLAB_ASSUME_TORCHRUN" in os.environ
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m shardlab.run", description=__doc__.split("\n")[0])
    p.add_argument("fn", help="module:function")
    p.add_argument("--nproc", type=int, default=2, help="ranks to start (ignored under torchrun)")
    p.add_argument("--backend", default=None, help="gloo or nccl (default: auto)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds (launch mode)")
    ns, rest = p.parse_known_args(argv)
    args, kwargs = parse_values(rest)
    from shardlab.runtime._importable import _locate, _resolve
    from shardlab.runtime._rank_env import init_from_env
    from shardlab.runtime.launch import launch

    if _under_torchrun():
        import torch.distributed as dist

        init_from_env(backend=ns.backend)
        module, qualname, _ = _locate(ns.fn)
        result = _resolve(module, qualname)(*args, **kwargs)
        print(f"[rank {dist.get_rank()}] result: {result!r}", flush=True)
        dist.destroy_process_group()
        return 0
    results = launch(ns.fn, ns.nproc, *args, backend=ns.backend, timeout=ns.timeout, **kwargs)
    for r, res in enumerate(results):
        print(f"[rank {r}] result: {res!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
