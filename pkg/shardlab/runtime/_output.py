"""What the ranks show the caller: captured output, printed per rank, and the progress bar.

Each rank's stdout/stderr goes to ``RUN_DIR/rank<R>.out``; :func:`_print_outputs` prints it
after the run with a ``[rank r] `` prefix. A rank reports progress with
:func:`report_progress` into ``rank<R>.progress``; :class:`_Progress` draws the caller's bar
from those files.
"""

from __future__ import annotations

import os
import sys
import time

_PREFIX_RANK = "[rank {r}] "
_NOISE = ("[Gloo] Rank",)  # gloo's connection chatter at init; not part of the user's output


def report_progress(done: float, total: float = 1.0) -> None:
    """Tell the caller's progress bar how far this rank is (call from a rank; cheap no-op
    outside a ``launch(..., progress=True)``)."""
    path = os.environ.get("SHARDLAB_PROGRESS_FILE")
    if not path:
        return
    frac = 0.0 if total <= 0 else max(0.0, min(1.0, float(done) / float(total)))
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{frac:.6f}")
    os.replace(tmp, path)


def _read_output(run_dir: str, rank: int) -> str:
    try:
        with open(os.path.join(run_dir, f"rank{rank}.out"), errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _print_outputs(outputs: list[str]) -> None:
    for r, text in enumerate(outputs):
        for line in text.splitlines():
            if line.startswith(_NOISE):
                continue
            print(_PREFIX_RANK.format(r=r) + line)
    sys.stdout.flush()


class _Progress:
    def __init__(self, nprocs: int, timeout: float, files: list[str]):
        self.nprocs, self.timeout, self.files = nprocs, timeout, files
        self.last = 0.0
        self.width = 30

    def draw(self, elapsed: float, finished: int, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self.last < 0.5:
            return
        self.last = now
        fracs = []
        for f in self.files:
            try:
                with open(f) as fh:
                    fracs.append(float(fh.read() or 0.0))
            except (OSError, ValueError):
                fracs.append(0.0)
        frac = 1.0 if final else sum(fracs) / len(fracs)
        fill = int(round(frac * self.width))
        bar = "#" * fill + "-" * (self.width - fill)
        msg = f"\r[{bar}] {frac * 100:5.1f}%  ranks done {finished}/{self.nprocs}  {elapsed:6.1f}s"
        sys.stderr.write(msg + ("\n" if final else ""))
        sys.stderr.flush()
