"""Command line of the instructor tools.

``shardlab release [--labs DIR] --out DIR [--zip] [--force]``
``shardlab grade SUBMISSIONS [--labs DIR] --out DIR [--lab NAME ...] [--workers N]
[--timeout S] [--max-procs N] [--max-rss-gb G] [--as-gb G] [--file-mb M] [--tmp-mb M]
[--cuda|--no-cuda] [--unsafe-no-sandbox] [--resume]``

:func:`add_parsers` adds both sub-commands to another program's sub-parsers (``shardlab``'s
own CLI calls it); :func:`main` runs them standalone (``python -m shardlab.grading``).
Errors in the input (unbalanced markers, bad rubric, missing folders) are printed as one
sentence with exit status 2, never as a traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _default_labs() -> Path:
    here = Path.cwd()
    for folder in (here, *here.parents):
        if (folder / "labs").is_dir():
            return folder / "labs"
    return here / "labs"


def _release(args: argparse.Namespace) -> int:
    from .kit import release_kit
    from .release import ReleaseError, release

    try:
        if args.labs_only:
            manifest = release(Path(args.labs), Path(args.out), zip_labs=args.zip,
                               force=args.force, book_url=args.book_url)
        else:
            manifest = release_kit(Path(args.labs), Path(args.out), zip_kit=args.zip,
                                   force=args.force, book_url=args.book_url)
    except ReleaseError as exc:
        print(f"release failed: {exc}", file=sys.stderr)
        return 2
    lab_files = (
        manifest
        if args.labs_only
        else {k.removeprefix("labs/"): v for k, v in manifest.items() if k.startswith("labs/")}
    )
    labs = sorted({rel.split("/")[0] for rel in lab_files if "/" in rel})
    print(
        f"released {len(labs)} lab(s), {len(manifest)} file(s) into {args.out}: {', '.join(labs)}"
    )
    if not args.labs_only:
        print(f"a student sets it up with the two commands of {Path(args.out) / 'README.md'}")
    return 0


def _grade_problem(args: argparse.Namespace) -> str:
    """'' if every option of ``shardlab grade`` is usable, else one sentence (checked before
    anything runs: a typo must not grade the whole class 0)."""
    from ._options import as_gb_problem, limits_problem, out_dir_problem, out_problem
    from .sandbox import Limits

    problem = as_gb_problem(args.as_gb)
    if problem:
        return problem
    try:
        limits = Limits(
            timeout=args.timeout,
            max_procs=args.max_procs,
            max_rss_gb=args.max_rss_gb,
            address_space_gb=None,
            file_size_mb=args.file_mb,
            tmp_mb=args.tmp_mb,
        )
    except (TypeError, ValueError) as exc:
        return f"invalid limit: {exc}."
    out, subs = Path(args.out), Path(args.submissions)
    return (
        limits_problem(limits, args.workers)
        or out_problem(out, subs)
        or out_dir_problem(out, resume=args.resume)
    )


def _grade(args: argparse.Namespace) -> int:
    from ._bwrap import UNSAFE_WARNING, SandboxUnavailable
    from ._driver import grade
    from ._submissions import SubmissionError
    from .report import fmt, printable
    from .rubric import RubricError
    from .sandbox import Limits

    problem = _grade_problem(args)
    if problem:
        print(f"grade failed: {problem}", file=sys.stderr)
        return 2
    limits = Limits(
        timeout=args.timeout,
        max_procs=args.max_procs,
        max_rss_gb=args.max_rss_gb,
        address_space_gb=args.as_gb if args.as_gb > 0 else None,
        file_size_mb=args.file_mb,
        tmp_mb=args.tmp_mb,
    )

    def start() -> None:  # after every check: a refused run prints one sentence, not this
        if args.unsafe_no_sandbox:
            print(f"WARNING {UNSAFE_WARNING}", file=sys.stderr, flush=True)

    def progress(res) -> None:
        status = f"{fmt(res.points)}/{fmt(res.max_points)}"
        note = f"  ({printable(res.note)})" if res.note else ""
        line = f"{printable(res.student):>20} {printable(res.lab):<18} {status:>9}"
        print(f"{line}  {res.wall:5.1f}s{note}", flush=True)

    try:
        results = grade(
            Path(args.labs),
            Path(args.submissions),
            Path(args.out),
            labs=args.lab or None,
            workers=args.workers,
            limits=limits,
            cuda=args.cuda,
            progress=progress,
            sandbox=not args.unsafe_no_sandbox,
            resume=args.resume,
            on_start=start,
        )
    except (RubricError, SubmissionError, ValueError, SandboxUnavailable) as exc:
        print(f"grade failed: {exc}", file=sys.stderr)
        return 2
    if not results:  # no submission: grade() checked the labs and stopped (in a second)
        print(
            f"warning: {args.submissions} holds no submission (one sub-folder or .zip per "
            f"student, names not starting with '.' or '_'); nothing was graded and "
            f"{args.out} was not written.",
            file=sys.stderr,
        )
        return 0
    totals: dict[str, list[float]] = {}
    for res in results:
        got = totals.setdefault(res.student, [0.0, 0.0])
        got[0] += res.points
        got[1] += res.max_points
    print("totals (student, points, max_points):")
    for student, (points, most) in sorted(totals.items()):
        print(f"  {printable(student)}  {fmt(points)}/{fmt(most)}")
    total = sum(r.points for r in results)
    print(
        f"graded {len(results)} lab submission(s), {fmt(total)} points in all; reports in {args.out}"
    )
    return 0


def add_parsers(subparsers) -> None:
    """Add the ``release`` and ``grade`` sub-commands to an ``argparse`` sub-parser set."""
    rel = subparsers.add_parser("release", help="write the student copy of every lab")
    rel.add_argument("--labs", default=str(_default_labs()), help="labs folder (default: ./labs)")
    rel.add_argument("--out", required=True, help="output folder (must be empty unless --force)")
    rel.add_argument(
        "--zip",
        action="store_true",
        help="also write a deterministic zip: <out>.zip of the whole kit (with --labs-only, "
        "one <lab>.zip per lab)",
    )
    rel.add_argument("--force", action="store_true", help="clear a non-empty output folder first")
    rel.add_argument(
        "--book-url", default=None, metavar="URL",
        help="published book the labs link to (default: html.baseurl of _config.yml; without "
        "one, links to chapters become the chapters' titles)",
    )
    rel.add_argument(
        "--labs-only",
        action="store_true",
        help="write only the lab folders (default: a kit that stands alone, with the shardlab "
        "package, requirements.txt and a README under <out>/)",
    )
    rel.set_defaults(func=_release)

    gr = subparsers.add_parser(
        "grade", help="grade a folder of submissions (one folder or zip per student)"
    )
    gr.add_argument("submissions", help="folder with one sub-folder or .zip per student")
    gr.add_argument(
        "--labs", default=str(_default_labs()), help="instructor labs folder (default: ./labs)"
    )
    gr.add_argument(
        "--out",
        required=True,
        help="folder for grades.csv, summary.csv, junit.xml, <student>/results.json",
    )
    gr.add_argument("--lab", action="append", help="grade only this lab (repeatable)")
    gr.add_argument(
        "--workers", type=int, default=None, help="parallel submissions (default: half the cores of this CPU set)"
    )
    gr.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="wall-clock seconds per student and lab (default 300)",
    )
    gr.add_argument(
        "--max-procs",
        type=int,
        default=256,
        help="processes and threads at once per sandbox (default 256)",
    )
    gr.add_argument(
        "--max-rss-gb",
        type=float,
        default=6.0,
        help="memory of a sandbox in GB: with a cgroup all it charges (processes, shared "
        "memory, tmpfs files); without, the summed RSS of its processes (default 6)",
    )
    gr.add_argument(
        "--as-gb",
        type=float,
        default=16.0,
        help="RLIMIT_AS per process in GB, 0 = none (default 16; never set with CUDA)",
    )
    gr.add_argument(
        "--file-mb",
        type=float,
        default=64.0,
        help="RLIMIT_FSIZE in MB: largest file/output (default 64)",
    )
    gr.add_argument(
        "--tmp-mb",
        type=float,
        default=512.0,
        help="size of the sandbox's /tmp, /dev/shm and work folder (tmpfs, MB each; default 512)",
    )
    gr.add_argument(
        "--unsafe-no-sandbox",
        action="store_true",
        help="grade without bubblewrap (only for trusted code: a submission then sees and can "
        "change everything your user can)",
    )
    gr.add_argument(
        "--resume",
        action="store_true",
        help="finish an interrupted run: keep the jobs already graded in --out/_journal and "
        "grade only the others",
    )
    cuda = gr.add_mutually_exclusive_group()
    cuda.add_argument(
        "--cuda", dest="cuda", action="store_true", default=None, help="grade GPU tests"
    )
    cuda.add_argument(
        "--no-cuda", dest="cuda", action="store_false", help='report GPU tests as "needs GPU"'
    )
    gr.set_defaults(func=_grade)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m shardlab.grading", description="shardlab instructor tools"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_parsers(sub)
    args = parser.parse_args(argv)
    return args.func(args)
