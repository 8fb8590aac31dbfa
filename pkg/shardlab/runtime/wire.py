"""Bytes this process really wrote to its TCP sockets: the wire column of :class:`CommTrace`.

``CommTrace`` computes a collective's bytes from the ring model; this module *measures* them,
so a backend whose algorithm sends more or less than the ring shows up.

What it counts
    :func:`socket_bytes_written` sums, over every TCP socket the process has open, the bytes
    the process has handed to the kernel: ``tcpi_bytes_acked`` from ``getsockopt(TCP_INFO)``
    plus the bytes still in the send queue (``ioctl(SIOCOUTQ)``). A difference of two
    snapshots is the payload written in between, including the backend's own control bytes
    (gloo's 48-byte message preambles and ready notifications, see
    ``shardlab.accounting.wire``) but not TCP/IP headers or retransmissions. Sockets are keyed
    by inode, so one opened in between counts from zero.

Why not ``/proc/self/io`` ``wchar``
    ``wchar`` counts every ``write`` of the process: stdout, stderr, log and checkpoint files,
    pipes. Around a gloo collective both counters agree to the byte (tests/test_wire_*.py
    checks it); a ``print`` of 1,000 characters adds 1,001 bytes to ``wchar`` and nothing
    here. Stdout and file writes are therefore excluded by construction, not assumed small.

Where it is blind
    * Linux only (``/proc/self/fd``, ``TCP_INFO``, ``SIOCOUTQ``); elsewhere
      :func:`available` is false and the trace's wire column says "not measurable".
    * GPUs with nccl: NVLink, PCIe peer-to-peer, shared memory and InfiniBand (RDMA) traffic
      never passes through the process's sockets, so a number would be wrong (near zero), not
      approximate. :func:`not_measurable_reason` returns the reason the trace prints instead.
    * Everything else the process writes to TCP sockets in the same window is included:
      TCPStore traffic (rendezvous, ``new_group``, store-based barriers; on rank 0 under
      torchrun also the store server's replies), a data loader's downloads, another thread's
      communication. For a *blocking* collective the trace counts only while no asynchronous
      operation of its own is in flight, so the window holds that collective alone.
    * Asynchronous operations (``async_op=True``, DDP's bucket all-reduces, FSDP2's
      prefetched all-gathers, functional collectives) overlap each other and the computation,
      so a single one cannot be isolated; the trace attributes wire bytes to the phase that is
      open when they are written (per step or per phase, not per op).
    * A socket closed between two snapshots takes its bytes with it. gloo closes a rank's
      end of a connection when the peer hangs up, so a rank must not exit while a peer is
      still measuring: the launcher's ranks wait for each other (a barrier) before they
      leave (``shardlab.runtime._child``).
    * A backend may still be writing after its work reports completion; the trace closes a
      blocking collective's window only once the counters have been still for 2 ms (at most
      50 ms), so late bytes would land in the next window only after a longer stall.
"""

from __future__ import annotations

import fcntl
import os
import socket
import stat
import struct
import sys
import termios
import time

__all__ = [
    "available",
    "socket_bytes_written",
    "snapshot",
    "delta",
    "not_measurable_reason",
    "WireMeter",
]

_TCP_INFO_LEN = 232
_BYTES_ACKED_OFFSET = 120  # struct tcp_info: __u64 tcpi_bytes_acked (Linux >= 4.1)
_SIOCOUTQ = termios.TIOCOUTQ  # same ioctl number; bytes not yet acknowledged by the peer
NOT_MEASURABLE = "not measurable"


def _socket_inodes() -> dict[int, int]:
    """fd -> inode of every socket this process has open."""
    out = {}
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for name in fds:
        try:
            st = os.fstat(int(name))  # cheaper than readlink on /proc
        except OSError:  # closed since listdir (or the listing's own descriptor)
            continue
        if stat.S_ISSOCK(st.st_mode):
            out[int(name)] = st.st_ino
    return out


def _libc_getsockopt():
    """libc's ``getsockopt`` on a raw descriptor (Python's needs a socket object), or None."""
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.getsockopt
        fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
        buf = ctypes.create_string_buffer(_TCP_INFO_LEN)
        size = ctypes.c_uint32()

        def tcp_info(fd: int) -> bytes | None:
            size.value = _TCP_INFO_LEN
            if fn(fd, socket.IPPROTO_TCP, socket.TCP_INFO, buf, ctypes.byref(size)) != 0:
                return None  # not a TCP socket (or closed meanwhile)
            return buf.raw[: size.value]

        return tcp_info
    except (OSError, AttributeError):
        return None


_TCP_INFO = _libc_getsockopt() if sys.platform.startswith("linux") else None


def _tcp_info_via_socket(fd: int) -> bytes | None:
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        return None
    try:
        if s.type != socket.SOCK_STREAM or s.family not in (socket.AF_INET, socket.AF_INET6):
            return None
        return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
    except OSError:
        return None
    finally:
        s.close()  # closes our duplicate only; the backend's descriptor stays open


def _acked(fd: int) -> int | None:
    info = _TCP_INFO(fd) if _TCP_INFO is not None else _tcp_info_via_socket(fd)
    if info is None or len(info) < _BYTES_ACKED_OFFSET + 8:
        return None
    return int(struct.unpack_from("Q", info, _BYTES_ACKED_OFFSET)[0])


def _written(fd: int) -> int | None:
    """Bytes written to TCP socket ``fd`` so far (None if it is not a TCP socket).

    Acknowledged plus still queued, read by two system calls. An ACK arriving between them
    moves bytes from the queue to the acknowledged count, which the two reads would miss
    (or count twice, in the other order). So the acknowledged count is read before and
    after the queue, and the pair is kept only when no ACK came in between (acknowledged
    bytes only grow)."""
    acked = _acked(fd)
    if acked is None:
        return None
    for _ in range(100):
        try:
            (queued,) = struct.unpack("i", fcntl.ioctl(fd, _SIOCOUTQ, b"\0" * 4))
        except OSError:  # listening socket
            return acked
        again = _acked(fd)
        if again is None:  # closed meanwhile
            return None
        if again == acked:
            return acked + int(queued)
        acked = again
    return acked + int(queued)  # ACKs kept arriving: at most one ACK's bytes off


def snapshot() -> dict[int, int] | None:
    """inode -> bytes written, for every TCP socket of this process (None: not Linux)."""
    if not available():
        return None
    out = {}
    for fd, inode in _socket_inodes().items():
        n = _written(fd)
        if n is not None:
            out[inode] = n
    return out


def delta(before: dict[int, int] | None, after: dict[int, int] | None) -> int | None:
    """Bytes written between two snapshots (sockets new in ``after`` count from zero)."""
    if before is None or after is None:
        return None
    return sum(n - before.get(inode, 0) for inode, n in after.items())


def socket_bytes_written() -> int | None:
    """Total bytes written so far to the TCP sockets this process has open now."""
    snap = snapshot()
    return None if snap is None else sum(snap.values())


def available() -> bool:
    """True where :func:`snapshot` works (Linux with ``TCP_INFO``).

    ``SHARDLAB_WIRE=0`` answers as off Linux (macOS, Windows), so the tests exercise the
    "not measurable" path a student there gets, on a Linux machine."""
    if os.environ.get("SHARDLAB_WIRE") == "0":
        return False
    return sys.platform.startswith("linux") and hasattr(socket, "TCP_INFO")


def not_measurable_reason(backend: str | None = None, device_type: str = "cpu") -> str | None:
    """Why the wire column cannot be measured here, or None if it can.

    ``backend``: the process group's backend string (``"gloo"``, ``"nccl"``,
    ``"cpu:gloo,cuda:nccl"``); ``device_type``: where the communicated tensors live.
    """
    if not available():
        where = "turned off by SHARDLAB_WIRE=0" if os.environ.get("SHARDLAB_WIRE") == "0" else (
            f"this is {sys.platform}"
        )
        return f"{NOT_MEASURABLE}: needs Linux /proc and TCP_INFO ({where})"
    if device_type != "cpu" or (backend is not None and "gloo" not in str(backend)):
        return (
            f"{NOT_MEASURABLE}: {backend or device_type} moves {device_type} tensors over "
            "NVLink/PCIe/InfiniBand, which bypass this process's sockets"
        )
    return None


class WireMeter:
    """Socket bytes of one trace, attributed to the phase open when they were written.

    :meth:`mark` takes a snapshot and books everything written since the previous one under
    ``label``; the trace marks at every phase change, around every blocking collective and at
    exit, so ``by_phase`` adds up to the bytes written during the whole trace. ``reason`` is
    None when the wire can be measured, else the "not measurable: ..." sentence.
    """

    def __init__(self, reason: str | None = None):
        self.reason = reason
        self.by_phase: dict[str, int] = {}
        self._last: dict[int, int] | None = None

    def start(self) -> None:
        if self.reason is None:
            self._last = snapshot()
            if self._last is None:
                self.reason = not_measurable_reason()

    def mark(self, label: str | None) -> int | None:
        """Book the bytes written since the last mark under ``label``; return them."""
        if self.reason is not None or self._last is None:
            return None
        now = snapshot()
        n = delta(self._last, now) or 0
        self._last = now
        key = label or ""
        self.by_phase[key] = self.by_phase.get(key, 0) + n
        return n

    def settle(self, label: str | None, quiet_s: float = 0.002, limit_s: float = 0.05):
        """Like :meth:`mark`, after the counters stopped moving for ``quiet_s`` (at most
        ``limit_s``): a backend may still be writing when its work reports completion (gloo's
        TCP loop thread finishes some sends on its own), and those bytes belong here."""
        if self.reason is not None or self._last is None:
            return None
        t0, prev = time.perf_counter(), snapshot()
        while True:
            time.sleep(quiet_s)
            now = snapshot()
            if now == prev or time.perf_counter() - t0 > limit_s:
                break
            prev = now
        n = delta(self._last, now) or 0
        self._last = now
        key = label or ""
        self.by_phase[key] = self.by_phase.get(key, 0) + n
        return n

    def stop(self, label: str | None) -> None:
        self.mark(label)
        self._last = None

    def total(self, phase: str | None = None) -> int | None:
        """Bytes written in ``phase`` (None: the whole trace); None if not measurable."""
        if self.reason is not None:
            return None
        if phase is None:
            return sum(self.by_phase.values())
        return self.by_phase.get(phase, 0)

    def __getstate__(self):
        return {"reason": self.reason, "by_phase": dict(self.by_phase), "_last": None}
