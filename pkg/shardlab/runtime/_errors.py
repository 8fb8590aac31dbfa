"""The exceptions :func:`shardlab.runtime.launch` raises when a run fails (re-exported there)."""

from __future__ import annotations


class LaunchError(RuntimeError):
    """Base class of launch failures."""


class RankError(LaunchError):
    """One or more ranks failed. ``rank`` is the rank reported first, ``failures`` maps every
    failed rank to a one-line reason, ``remote_traceback`` is the first rank's traceback text
    (empty when it died from a signal), ``outputs`` is every rank's captured output."""

    def __init__(self, message, rank, failures, remote_traceback="", outputs=None):
        super().__init__(message)
        self.rank = rank
        self.failures = failures
        self.remote_traceback = remote_traceback
        self.outputs = outputs or []


class LaunchTimeout(LaunchError, TimeoutError):
    """The run exceeded its timeout. ``stacks`` maps rank to the dumped Python stack text."""

    def __init__(self, message, stacks, outputs=None):
        super().__init__(message)
        self.stacks = stacks
        self.outputs = outputs or []


class LaunchDeadlock(LaunchTimeout):
    """Every rank was blocked in communication with nothing moving for ``hang_timeout``
    seconds. The message starts with what each rank waited for and the likely mistake
    (``summary``); ``stacks`` and ``outputs`` are as for :class:`LaunchTimeout`."""

    def __init__(self, message, stacks, outputs=None, summary=""):
        super().__init__(message, stacks, outputs)
        self.summary = summary
