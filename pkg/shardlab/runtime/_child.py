"""Entry point of one rank started by :func:`shardlab.runtime.launch` (internal).

Run as ``python -m shardlab.runtime._child RUN_DIR RANK``.  The parent wrote the function's
location and the pickled arguments into ``RUN_DIR/payload.pkl`` and put the torchrun
environment variables into our environment.  This process:

1. registers ``faulthandler`` on SIGUSR1 so the parent can ask for every thread's stack
   (written to ``RUN_DIR/rank<R>.stack``) when the run times out;
2. starts a watchdog thread that exits if the parent disappears (no orphan ranks);
3. joins the process group through the TCPStore the parent hosts, and starts the
   communication watcher (``_commwatch``: what the rank waits for, in ``rank<R>.comm``);
4. imports and calls the function, and writes ``rank<R>.result`` (pickled return value) or
   ``rank<R>.error`` (pickled dict with the traceback text).
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import sys
import threading
import time
import traceback

from shardlab.runtime._importable import _resolve
from shardlab.runtime._rank_env import init_from_env


def _atomic_dump(obj, path: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        pickle.dump(obj, f)
    os.replace(tmp, path)


def _watch_parent(parent_pid: int) -> None:
    while True:
        time.sleep(0.5)
        if os.getppid() != parent_pid:
            os._exit(70)


def _is_comm_error(exc: BaseException) -> bool:
    """True for errors that are a consequence of another rank dying (secondary failures)."""
    try:
        import torch.distributed as dist

        if isinstance(exc, getattr(dist, "DistError", ())):
            return True
    except Exception:  # pragma: no cover - torch always present here
        pass
    text = f"{type(exc).__name__}: {exc}".lower()
    return any(
        k in text
        for k in ("connection closed", "connection reset", "gloo", "broken pipe", "nccl", "socket")
    )


def main(run_dir: str, rank: int) -> int:
    stack_file = open(os.path.join(run_dir, f"rank{rank}.stack"), "w")  # noqa: SIM115
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    # a rank that aborts in native code (gloo's size check) leaves its Python stack there too
    faulthandler.enable(file=stack_file, all_threads=True)
    parent = int(os.environ.get("SHARDLAB_PARENT_PID", os.getppid()))
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()

    import warnings

    # torch 2.x deprecation chatter for reduce_scatter_tensor / all_gather_into_tensor would
    # otherwise appear in every notebook cell that launches ranks
    warnings.filterwarnings(
        "ignore", message=r"`torch\.distributed\.\w+` is deprecated", category=FutureWarning
    )
    with open(os.path.join(run_dir, "payload.pkl"), "rb") as f:
        payload = pickle.load(f)
    try:
        init_from_env(backend=payload["backend"], timeout=payload["pg_timeout"])
        from shardlab.runtime import _commwatch

        _commwatch.start(run_dir, rank)  # what this rank waits for, for the hang detector
        fn = _resolve(payload["module"], payload["qualname"])
        args, kwargs = pickle.loads(payload["args"])
        result = fn(*args, **kwargs)
        try:
            _atomic_dump(result, os.path.join(run_dir, f"rank{rank}.result"))
        except Exception as exc:
            raise TypeError(
                f"rank {rank} returned a value of type {type(result).__name__} that cannot be "
                f"pickled back to the caller ({exc}); return plain Python data or CPU tensors."
            ) from None
    except BaseException as exc:  # noqa: BLE001 - report everything, including SystemExit
        err = {
            "type": type(exc).__name__,
            "message": str(exc),
            "traceback": "".join(
                traceback.format_exception(type(exc), exc, exc.__traceback__.tb_next)
            ),
            "time": time.time(),
            "comm": _is_comm_error(exc),
        }
        _atomic_dump(err, os.path.join(run_dir, f"rank{rank}.error"))
        sys.stdout.flush()
        sys.stderr.flush()
        # Do not run atexit / destroy the process group: peers may be gone and it could hang.
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            # Leave only when every rank has returned: a rank that exits closes its sockets,
            # and gloo then closes the peers' ends too, taking away the byte counters of a
            # peer still measuring its wire bytes (shardlab.runtime.wire). Its result is
            # written already; a peer that failed ends the run through the supervisor.
            try:
                dist.barrier()
            except Exception:
                pass
            dist.destroy_process_group()
    except Exception:
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2])))
