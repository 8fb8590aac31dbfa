"""What ``shardlab train`` runs: the model shapes, the layouts and the modules that implement them.

:data:`LAYOUTS` is read from the labs' ``train.toml`` files (:func:`read_layouts`): each lab
that ``shardlab train`` runs declares there, in a ``[train.<layout>]`` table, the module and
class of its runner and the files it loads, so no lab is named here.

:class:`TrainSpec` holds every choice of one run and checks it in ``__post_init__``, before any
rank starts: an unknown layout or model, a batch that does not divide over the data-parallel
ranks, a tensor-parallel degree that does not divide the heads, more pipeline stages than
layers each get one ``ValueError`` sentence naming the values.

:func:`resolve_modules` finds the module files of a layout: the reference in the lab folder
(``labs/02_ddp/ddp.py`` ...) or a student's file of the same name (``--from-cwd``, ``--module
PATH``, or automatically when the current directory holds it). It reads each file with
``ast`` (nothing is executed in the caller) and refuses one that lacks a class or function the
layout calls, naming the file, the missing names and the layout.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from shardlab.accounting.compute import ModelShape

# Model shapes (fp32 everywhere, GPT-style: GeLU MLP, full multi-head attention, LayerNorm, no
# dropout). The same shape builds shardlab.models.GPT (ddp, zero1, zero2, fsdp, pp:
# GPTConfig.from_shape) and lab 06's SerialGPT (tp, fsdp+tp: ModelConfig.from_shape), and is
# what the report's FLOPs come from.
_GPT = dict(gated=False, norm="layernorm")
MODELS: dict[str, ModelShape] = {
    "tiny": ModelShape(layers=2, hidden=32, heads=4, kv_heads=4, ffn=128, vocab=64, seq_len=16,
                       **_GPT),
    "small": ModelShape(layers=4, hidden=256, heads=8, kv_heads=8, ffn=1024, vocab=512,
                        seq_len=128, **_GPT),
}


@dataclass(frozen=True)
class Layout:
    """A layout, as its lab's ``train.toml`` declares it in ``[train.<name>]``.

    ``lab``: the lab folder. ``runner``: ``(file, class)`` of the lab's
    :class:`~shardlab.train.runner.Runner`. ``files``: the modules a student may replace
    (file -> names the layout calls; the first is the one ``--module FILE`` replaces).
    ``load``: every module the runner imports, as paths relative to the lab folder, in the
    order the rank loads them (each after those it imports; ``../NN_topic/x.py`` for an
    earlier lab's). ``axes``: the mesh axes its communication runs on."""

    lab: str
    runner: tuple[str, str]
    files: dict[str, tuple[str, ...]]
    load: tuple[str, ...]
    axes: tuple[str, ...]
    default_ranks: int = 2


def _layout(toml: Path, name: str, t: dict) -> Layout:
    """One ``[train.<name>]`` table, checked: a malformed one is a sentence naming the file."""
    try:
        file, cls = t["runner"].split(":")
        files = {f: tuple(names) for f, names in t["files"].items()}
        lay = Layout(toml.parent.name, (file, cls), files, tuple(t["load"]),
                     tuple(t["axes"]), int(t.get("default_ranks", 2)))
    except (KeyError, AttributeError, TypeError, ValueError) as exc:
        raise ValueError(
            f"{toml}: [train.{name}] needs runner = \"file.py:Class\", load = [files], "
            f"axes = [axes] and a [train.{name}.files] table ({exc!r})."
        ) from None
    return lay


def read_layouts(labs: Path) -> dict[str, Layout]:
    """The registry: every ``[train.<layout>]`` table of ``labs/*/train.toml``, in lab order."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]

    out: dict[str, Layout] = {}
    for toml in sorted(labs.glob("[0-9][0-9]_*/train.toml")):
        table = tomllib.loads(toml.read_text()).get("train", {})
        for name, t in table.items():
            out[name] = _layout(toml, name, t)
    return out


def _default_labs() -> Path:
    """The labs folder next to the package (a checkout or a student kit), else above the
    current directory."""
    pkg = Path(__file__).resolve().parents[3] / "labs"
    if pkg.is_dir():
        return pkg
    here = Path.cwd().resolve()
    return next((f / "labs" for f in (here, *here.parents) if (f / "labs").is_dir()), pkg)


LAYOUTS: dict[str, Layout] = read_layouts(_default_labs())
SCHEDULES = ("gpipe", "1f1b")
# Refused before any rank starts (past them a rank fails allocating, or torch refuses):
MAX_SEQ = 65_536  # tokens: the models hold a position-embedding row per token
MAX_TOKENS = 2**24  # batch x seq per step: 16,777,216 tokens, far past these small models
CPU_PEAK_TFLOPS = 0.1  # one core, fp32: 8-wide FMA (16 FLOP/cycle) x 2 units x ~3 GHz
CUDA_PEAK_TFLOPS = 60.0  # fp32 without tensor cores, H100/H200 class (SXM: 67)


def _pos(name: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer.")
    return value


@dataclass(frozen=True)
class TrainSpec:
    """One ``shardlab train`` run. ``ranks``/``tp`` default from the layout; ``batch`` is the
    global batch in sequences per step; ``microbatches`` is for pp only."""

    layout: str
    model: str = "tiny"
    ranks: int | None = None
    steps: int = 10
    batch: int = 8
    seq: int | None = None
    tp: int | None = None
    microbatches: int | None = None
    schedule: str | None = None  # pp only (default 1f1b)
    bucket_mb: float = 25.0
    threads: int | None = None
    peak_tflops: float | None = None
    efficiency: float = 0.5
    beta_gbps: float = 1.0
    modules: dict[str, str] = field(default_factory=dict)  # file name -> path on disk
    module_source: str = "reference"
    labs_dir: str = ""  # the labs/ folder: the layout's lab (and lab 09's earlier labs)
    profile: str | None = None  # folder for torch.profiler traces (shardlab.runtime.profile)

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout={self.layout!r} is not one of {', '.join(LAYOUTS)}.")
        if self.model not in MODELS:
            raise ValueError(f"model={self.model!r} is not one of {', '.join(MODELS)}.")
        lay = LAYOUTS[self.layout]
        if self.ranks is None:
            object.__setattr__(self, "ranks", lay.default_ranks)
        g = _pos("ranks", self.ranks)
        if _pos("steps", self.steps) < 2:
            raise ValueError(
                f"steps={self.steps}: step 0 is traced for bytes and step 1 for memory, so "
                "train needs at least 2 steps."
            )
        self._check_sizes()
        if self.profile is not None:  # steps 0 and 1 stay unprofiled: they trace bytes, memory
            from shardlab.runtime.profile import check_profile_dir

            object.__setattr__(self, "profile", check_profile_dir(self.profile, self.steps, 2))
        for name in ("bucket_mb", "efficiency", "beta_gbps"):
            x = getattr(self, name)
            if not isinstance(x, int | float) or isinstance(x, bool) or not x > 0:
                raise ValueError(f"{name}={x!r} must be a positive number.")
        if self.efficiency > 1:
            raise ValueError(f"efficiency={self.efficiency!r} must be a fraction in (0, 1].")
        if self.peak_tflops is not None and not self.peak_tflops > 0:
            raise ValueError(f"peak_tflops={self.peak_tflops!r} must be a positive number.")
        m = self.shape
        if self.layout == "fsdp+tp":
            t = _pos("tp", 2 if self.tp is None else self.tp)
            object.__setattr__(self, "tp", t)
            if g % t:
                raise ValueError(
                    f"the tensor-parallel degree tp={t} does not divide ranks={g} "
                    "(fsdp+tp needs ranks = dp x tp)."
                )
        elif self.tp not in (None, 1 if self.layout != "tp" else g):
            raise ValueError(
                f"tp={self.tp} applies to fsdp+tp only (layout {self.layout} uses "
                f"tp={g if self.layout == 'tp' else 1})."
            )
        else:
            object.__setattr__(self, "tp", g if self.layout == "tp" else 1)
        t = self.tp
        for what, n in (("heads", m.heads), ("hidden width h", m.hidden),
                        ("MLP width ffn", m.ffn), ("vocabulary", m.vocab)):
            if n % t:
                raise ValueError(
                    f"{what}={n} of model {self.model!r} is not divisible by the "
                    f"tensor-parallel degree t={t} (layout {self.layout}, ranks={g})."
                )
        d = self.dp
        if self.batch % d:
            raise ValueError(
                f"batch={self.batch} sequences do not divide over the {d} data-parallel ranks "
                f"of layout {self.layout} (ranks={g}); use a multiple of {d}."
            )
        if self.layout == "pp":
            self._check_pipeline(g, m.layers)
        elif self.microbatches not in (None, 1):
            raise ValueError(f"microbatches={self.microbatches} applies to layout pp only.")

    def _check_sizes(self) -> None:
        _pos("batch", self.batch)
        if self.seq is not None and _pos("seq", self.seq) > MAX_SEQ:
            raise ValueError(f"seq={self.seq:,} tokens is more than the {MAX_SEQ:,} train allows.")
        tokens = self.batch * self.shape.seq_len
        if tokens > MAX_TOKENS:
            raise ValueError(
                f"batch={self.batch:,} x seq={self.shape.seq_len:,} = {tokens:,} tokens per step "
                f"is more than the {MAX_TOKENS:,} train allows."
            )
        cores = os.cpu_count() or 1
        if self.threads is not None and _pos("threads", self.threads) > cores:
            raise ValueError(f"threads={self.threads:,} is more than the {cores} cores here.")
        if self.layout != "pp" and self.schedule is not None:
            raise ValueError(f"schedule={self.schedule!r} applies to layout pp only.")

    def _check_pipeline(self, p: int, layers: int) -> None:
        from shardlab.accounting import pipeline as pacc

        if self.schedule is None:
            object.__setattr__(self, "schedule", "1f1b")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule={self.schedule!r} is not one of {', '.join(SCHEDULES)}.")
        mb = _pos("microbatches", p if self.microbatches is None else self.microbatches)
        object.__setattr__(self, "microbatches", mb)
        if layers < p or layers % p:
            raise ValueError(
                f"model {self.model!r} has layers={layers}, which do not split into p={p} "
                "equal pipeline stages (ranks must divide the layers)."
            )
        if self.batch % mb:
            raise ValueError(f"batch={self.batch} sequences do not divide into microbatches={mb}.")
        pacc.check_pipeline(self.schedule, p, mb, 1, layers)

    @property
    def shape(self) -> ModelShape:
        """The model's shape, with ``seq_len`` overridden by ``--seq``."""
        m = MODELS[self.model]
        return m if self.seq is None else replace(m, seq_len=self.seq)

    @property
    def dp(self) -> int:
        """Data-parallel degree: every rank for ddp/zero/fsdp, ``ranks/tp`` for fsdp+tp."""
        if self.layout in ("tp", "pp"):
            return 1
        return self.ranks // (self.tp or 1) if self.layout == "fsdp+tp" else self.ranks


# ----------------------------------------------------------------- modules


def find_labs_dir(lab: str, start: str | os.PathLike | None = None) -> Path:
    """The ``labs/`` folder holding ``lab``: searched upwards from ``start`` (the current
    directory), then next to the installed package (a repository checkout or a student kit)."""
    here = Path(start or os.getcwd()).resolve()
    for folder in (here, *here.parents):
        for cand in (folder, folder / "labs"):
            if (cand / lab).is_dir():
                return cand
    pkg = Path(__file__).resolve().parents[3] / "labs"
    if (pkg / lab).is_dir():
        return pkg
    raise ValueError(
        f"no labs/{lab} folder above {here} or next to the shardlab package; run from the "
        "repository (or the student kit) or pass --labs PATH."
    )


def top_level_names(path: Path) -> set[str]:
    """Names a module file defines at top level (functions, classes, assignments, imports),
    read with ``ast``: the file is not executed."""
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except SyntaxError as exc:
        raise ValueError(f"{path} does not parse: {exc.msg} at line {exc.lineno}.") from None
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            for tgt in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(tgt) if isinstance(n, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def resolve_modules(
    layout: str, module: str | None = None, from_cwd: bool = False, labs: str | None = None
) -> tuple[dict[str, str], str, Path]:
    """``({file name: path}, source, labs_dir)`` of the modules ``layout`` runs.

    ``module``: a file (it replaces the layout's main module, whatever its name) or a folder
    (each of the layout's files found there replaces its reference). ``from_cwd``: the current
    directory as that folder. Neither: the current directory's files when it holds the main
    one, else the references. Every chosen file is checked for the names the layout calls.
    """
    lay = LAYOUTS[layout]
    labs_dir = Path(labs).resolve() if labs else find_labs_dir(lay.lab)
    if not (labs_dir / lay.lab).is_dir():
        raise ValueError(f"labs={str(labs_dir)!r} has no {lay.lab} folder for layout {layout}.")
    ref = {f: labs_dir / lay.lab / f for f in lay.files}
    main = next(iter(lay.files))
    chosen, source = dict(ref), "reference"
    if module is not None and from_cwd:
        raise ValueError("give --module PATH or --from-cwd, not both.")
    folder = Path.cwd() if from_cwd else None
    if module is not None:
        p = Path(module).resolve()
        if p.is_file():
            chosen[main], source = p, "student"
        elif p.is_dir():
            folder = p
        else:
            raise ValueError(f"--module {module!r} is neither a file nor a folder.")
    elif not from_cwd and (Path.cwd() / main).is_file():
        folder = Path.cwd()
    if folder is not None:
        found = {f: folder / f for f in lay.files if (folder / f).is_file()}
        if main not in found:
            raise ValueError(
                f"{folder} has no {main}, the module of layout {layout} (its reference is "
                f"{ref[main]})."
            )
        chosen.update(found)
        source = (
            "student"
            if any(found[f].resolve() != ref[f].resolve() for f in found)
            else ("reference")
        )
    for f, path in chosen.items():
        missing = [n for n in lay.files[f] if n not in top_level_names(path)]
        if missing:
            raise ValueError(
                f"{path} has no {', '.join(missing)}, which layout {layout} calls "
                f"({f} must define {', '.join(lay.files[f])})."
            )
    return {f: str(p) for f, p in chosen.items()}, source, labs_dir
