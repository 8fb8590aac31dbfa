"""One case of a rank-side check: a missing function is reported, any other error ends the run.

The labs' rank harnesses (``labs/*/_workers_*.py``) run several cases in one launch and
report each one, so that one unfinished function does not hide the results of the others.
That is safe only for a *stub*: ``raise NotImplementedError("<hint>")`` is raised the same way
on every rank, before any message, so every rank moves on to the next case together. Any
other exception may come from one rank only, in the middle of a ring or a schedule: its peers
are then waiting for its messages, and a harness that recorded the error and went on into the
next collective would hang the run with the student's message nowhere. :func:`stub_or_raise`
therefore re-raises it (with the case named), and the launcher ends the run with that rank's
message and traceback first (:class:`shardlab.runtime.RankError`).
"""

from __future__ import annotations

import traceback


def stub_or_raise(fn, *args, case: str = "", **kwargs):
    """``fn(*args, **kwargs)``; a ``NotImplementedError`` comes back as its traceback text (a
    ``str``, which the lab's tests report), any other exception is re-raised, with ``case``
    added as a note under its traceback (Python 3.11+)."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        return traceback.format_exc()
    except Exception as exc:
        if case and hasattr(exc, "add_note"):
            exc.add_note(f"(while running case {case})")
        raise
