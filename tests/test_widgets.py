"""Calculators: default output without a kernel, updates, error sentences, update time."""

from __future__ import annotations

import json
import re
import statistics
import time
import xml.etree.ElementTree as ET

import pytest

pytest.importorskip("ipywidgets")

from shardlab import widgets as W  # noqa: E402
from shardlab.accounting import activations as act  # noqa: E402
from shardlab.accounting import comm, memory, mesh, pipeline  # noqa: E402
from shardlab.widgets._common import fmt_int  # noqa: E402

CALCULATORS = {
    "memory": W.memory_calculator,
    "activations": W.activations_calculator,
    "comm": W.comm_calculator,
    "pipeline": W.pipeline_calculator,
    "mesh": W.mesh_calculator,
    "roofline": W.roofline_calculator,
    "overlap": W.overlap_calculator,
    "batch": W.batch_calculator,
}


def svgs(html: str) -> list[ET.Element]:
    """Every inline SVG in ``html``, parsed (so it is well-formed XML)."""
    return [ET.fromstring(m) for m in re.findall(r"<svg.*?</svg>", html, flags=re.S)]


def is_error(html: str) -> bool:
    return "shardlab-error" in html


@pytest.mark.parametrize("name", sorted(CALCULATORS))
def test_default_output_is_static_html(name):
    import ipywidgets

    box = CALCULATORS[name]()
    assert isinstance(box, ipywidgets.VBox)
    html = box.output.value
    # rendered at construction: the value is part of the widget state a static page embeds
    assert box.output.get_state()["value"] == html
    assert "<table" in html and not is_error(html) and "Traceback" not in html
    for svg in svgs(html):
        assert svg.tag.endswith("svg")
    if name != "mesh":
        assert svgs(html), f"{name} has no chart"


def test_memory_defaults_and_changes():
    box = W.memory_calculator()
    html = box.output.value
    for s in memory.state_table(7_000_000_000, 8):
        assert fmt_int(s.total) in html
    for gb in ("112.00", "38.50", "26.25", "14.00"):
        assert f"{gb} GB" in html  # bar labels
    box.controls["dp"].value = 16
    z3 = memory.model_state(7_000_000_000, 16, "zero3")
    assert fmt_int(z3.total) in box.output.value
    box.controls["layout"].value = "zero1"
    html = box.output.value
    assert fmt_int(memory.model_state(7_000_000_000, 16, "zero1").total) in html
    assert ">zero3<" not in html and ">zero1<" in html
    # custom recipe: the bytes fields take effect
    box.controls["layout"].value = "all"
    box.controls["recipe"].value = "custom"
    box.controls["moment1"].value = 2.0
    box.controls["moment2"].value = 2.0
    rec = memory.Recipe("custom", 2, 2, 4, 2, 2)
    assert fmt_int(memory.model_state(7_000_000_000, 16, "ddp", rec).total) in box.output.value
    box.controls["recipe"].value = "fp32"
    fp32 = memory.model_state(7_000_000_000, 16, "ddp", "fp32")
    assert fmt_int(fp32.total) in box.output.value


def test_activations_defaults_and_changes():
    box = W.activations_calculator()
    html = box.output.value
    for mode in act.MODES:
        b = act.activation_bytes_per_layer(2048, 1, 4096, 32, 8, mode)
        assert fmt_int(b) in html
    for mib in ("912 MiB", "184 MiB", "114 MiB", "34 MiB"):
        assert mib in html
    box.controls["t"].value = 4
    b = act.activation_bytes_per_layer(2048, 1, 4096, 32, 4, "tp_sp")
    assert fmt_int(b) in box.output.value


def test_comm_defaults_changes_and_presets(tmp_path):
    box = W.comm_calculator()
    html = box.output.value
    assert fmt_int(comm.ring_sent_bytes("all_reduce", 1e9, 8)) in html
    box.controls["ranks"].value = 4
    box.controls["op"].value = "all_gather"
    data = W.comm_report("all_gather", 1e9, 4, 5.0, 100.0).data
    assert data["selected"]["seconds"] == comm.alpha_beta_time("all_gather", 1e9, 4, 5e-6, 1e11)
    assert fmt_int(comm.ring_sent_bytes("all_gather", 1e9, 4)) in box.output.value
    # "this machine": from a function call and from the JSON file a lab writes
    W.set_machine_preset(alpha=2e-5, beta=3e9)
    box = W.comm_calculator(preset="this machine")
    assert box.controls["alpha_us"].value == pytest.approx(20.0)
    assert box.controls["beta_gbps"].value == pytest.approx(3.0)
    path = tmp_path / "alpha_beta.json"
    path.write_text(json.dumps({"alpha": 1e-5, "beta": 5e9}))
    box = W.comm_calculator(machine_json=path)
    assert box.controls["preset"].value == "this machine"
    assert box.controls["alpha_us"].value == pytest.approx(10.0)
    t = comm.alpha_beta_time("all_reduce", 1e9, 8, 1e-5, 5e9)
    assert W.comm_report("all_reduce", 1e9, 8, 10.0, 5.0).data["selected"]["seconds"] == t
    # choosing another preset copies its α and β into the fields
    other = next(k for k in box.controls["preset"].options if k.startswith("illustrative"))
    box.controls["preset"].value = other
    assert (box.controls["alpha_us"].value, box.controls["beta_gbps"].value) == W.comm.PRESETS[
        other
    ]


def test_pipeline_defaults_and_changes():
    box = W.pipeline_calculator()
    html = box.output.value
    for pct in ("37.5 %", "27.3 %", "72.7 %"):
        assert pct in html
    (svg,) = svgs(html)
    rects = [r for r in svg.iter() if r.tag.endswith("rect")]
    # one box per action of the generated schedule (plus lane backgrounds and legend)
    n_actions = sum(len(a) for a in pipeline.schedule("1f1b", 4, 8))
    assert len(rects) >= n_actions
    box.controls["kind"].value = "zb-h1"
    sim = pipeline.simulate(pipeline.schedule("zb-h1", 4, 8), 4)
    assert f"{100 * sim.bubble_fraction:.1f} %" in box.output.value
    box.controls["kind"].value = "interleaved"
    box.controls["v"].value = 2
    assert f"{100 * pipeline.bubble_ratio(4, 8, 2):.1f} %" in box.output.value


def test_pipeline_1f1b_with_chunks_is_the_accounting_sentence_not_interleaved():
    """1f1b with v > 1 is refused with the sentence of ``accounting.pipeline.check_kind``
    (the lab's PipeConfig gives the same one), not silently run as interleaved."""
    box = W.pipeline_calculator()
    box.controls["v"].value = 2
    html = box.output.value
    with pytest.raises(ValueError, match="chunks need kind='interleaved', not kind='1f1b'"):
        pipeline.check_kind("1f1b", 4, 8, 2)
    # the calculator shows that sentence (its fields named as the calculator labels them)
    assert is_error(html) and "chunks need" in html and "interleaved" in html
    assert "<table" not in html


def test_mesh_defaults_and_changes():
    box = W.mesh_calculator()
    html = box.output.value
    m = mesh.Mesh(16384, 128, 8, 16, 1)
    c = m.rank_to_coords(12345)
    assert ", ".join(map(str, m.group_of(12345, "tp"))) in html
    assert (
        f'<td style="padding:2px 10px;border-bottom:1px solid #ddd;text-align:right">{c.dp}' in html
    )
    # the 128K-context Llama 3 mesh
    box.controls["cp"].value = 16
    box.controls["dp"].value = 8
    assert not is_error(box.output.value)
    assert "8·8·16·16 = 16384" in box.output.value
    # small mesh with MoE folding lists every group
    for k, val in dict(G=16, dp=2, tp=2, pp=2, cp=2, rank=5, ep=4, etp=2).items():
        box.controls[k].value = val
    box.controls["moe"].value = True
    html = box.output.value
    fold = mesh.moe_fold(mesh.Mesh(16, 2, 2, 2, 2), 4, 2)
    for grp in fold.groups("ep"):
        assert ", ".join(map(str, grp)) in html


# A widget's sentence names the field as the reader sees it (issue 30, defect 6), not the
# argument name (dp=0, group_size=-2) the CLI and accounting use.
BAD = {
    "memory": ("dp", 0, "D (data-parallel ranks) = 0"),
    "activations": ("a", 30, "a (attention heads) = 30"),
    "comm": ("ranks", -2, "D (ranks) = -2"),
    "pipeline": ("m", 0, "m (microbatches) = 0"),
    "mesh": ("dp", 100, "D (data) = 100"),
    "roofline": ("m", 0, "0 must be"),
    "overlap": ("p", 100, "p (stages) = 100 exceeds L (layers) = 80"),
    "batch": ("model_ranks", 3, "t·c·p (ranks per replica) = 3 does not divide G (GPUs) = 16384"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_input_shows_a_sentence(name):
    box = CALCULATORS[name]()
    key, value, needle = BAD[name]
    box.controls[key].value = value
    html = box.output.value
    assert is_error(html) and needle in html
    assert "Traceback" not in html and "<table" not in html
    # a text field with garbage is a sentence too
    if name == "memory":
        box.controls["dp"].value = 8
        box.controls["n_params"].value = "seven billion"
        assert is_error(box.output.value) and "seven billion" in box.output.value


@pytest.mark.parametrize("name", sorted(CALCULATORS))
def test_number_fields_accept_scientific_notation_and_refuse_garbage(name):
    """Every number field is a text box: 1e9 reaches Python as 1,000,000,000 (ipywidgets'
    IntText drops the e keystroke: 1e9 became 19), a fraction in a whole-number field and text
    that is not a number are refused naming the field (issue 30, defects 2 and 6)."""
    from shardlab.widgets._fields import NumberField, _from_text

    box = CALCULATORS[name]()
    fields = {k: c for k, c in box.controls.items() if isinstance(c, NumberField)}
    assert fields and not any(
        type(c).__name__ in ("IntText", "FloatText") for c in box.controls.values()
    )
    assert _from_text("1e9") == 10**9 and _from_text("2,048") == 2048
    key, field = next((k, c) for k, c in fields.items() if c.integer)
    field.value = _from_text("2.5")
    assert is_error(box.output.value) and f"{field.description}: 2.5 is not a whole number" in (
        box.output.value
    )
    field.value = _from_text("lots")
    assert f"{field.description}: &#x27;lots&#x27; is not a number" in box.output.value
    assert all(
        not c.continuous_update for c in box.controls.values() if hasattr(c, "continuous_update")
    )


def test_render_functions_without_widgets():
    assert "112.00" in W.render_memory(n_params=7e9, dp=8)
    assert "912" in W.render_activations()
    assert "all_reduce" in W.render_comm()
    assert "36,750,000,000" in W.render_step_volume(layout="zero3")
    assert "27.3 %" in W.render_pipeline(p=4, m=8)
    assert "12345" in W.render_mesh(rank=12345)
    assert "1,365.33" in W.render_roofline(m=4096, k=4096, n=4096, q=2)  # N / 3 FLOP/byte
    with pytest.raises(ValueError, match="dp=3"):
        W.render_mesh(G=16, dp=3, tp=1, pp=1)


@pytest.mark.parametrize("name", sorted(CALCULATORS))
def test_one_update_is_well_under_50_ms(name):
    box = CALCULATORS[name]()
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        box.update()
        times.append(time.perf_counter() - t0)
    assert statistics.median(times) < 0.050, f"{name}: {statistics.median(times) * 1e3:.1f} ms"


def test_pipeline_widget_shows_na_when_zb_closed_form_does_not_apply():
    from shardlab.widgets import render_pipeline

    html = render_pipeline(kind="zb-h1", p=4, m=8, costs={"F": 1, "BI": 1, "BW": 3})
    assert "n/a" in html and "shardlab-error" not in html


def test_overlap_calculator_matches_the_hand_worked_case():
    """Chapter 10's example: 70e9 parameters over t = 8 (8.75e9 per rank), D = 32 at 50 GB/s,
    65,536 tokens per rank at 400 TFLOP/s. DDP sends 2 q N (D-1)/D = 33.90625e9 B: 0.678125 s
    against 4 N T / R = 5.7344 s; T* = (D-1)/D R / beta = 7,750 tokens; TP's h* = q (t-1) R /
    (9 beta) = 2,074 at 300 GB/s."""
    rows = W.overlap_report().data["rows"]
    assert rows["ddp"]["comm_s"] == pytest.approx(0.678125, rel=1e-12)
    assert rows["ddp"]["compute_s"] == pytest.approx(5.7344, rel=1e-12)
    assert rows["ddp"]["break_even"] == pytest.approx(7750, rel=1e-12)
    assert rows["zero3"]["comm_s"] == pytest.approx(1.5 * 0.678125, rel=1e-12)
    assert rows["tp"]["break_even"] == pytest.approx(2 * 7 * 4e14 / (9 * 3e11), rel=1e-12)
    assert rows["pp"]["comm_s"] == 0 and rows["pp"]["bound"] == "compute"  # p = 1: no boundary
    # below T* every data-parallel layout is communication-bound, with the difference exposed
    low = W.overlap_report(tokens=2048).data["rows"]
    assert all(low[k]["bound"] == "communication" for k in ("ddp", "zero1", "zero2", "zero3"))
    assert low["ddp"]["exposed_s"] == pytest.approx(
        low["ddp"]["comm_s"] - low["ddp"]["compute_s"], rel=1e-12
    )
    html = W.render_overlap(tokens=2048)
    assert "Communication-bound at these sizes: DDP" in html and svgs(html)
    box = W.overlap_calculator()  # accounting's sentence, written with the field's label
    box.controls["dp"].value = 0
    assert is_error(box.output.value) and "D (data-parallel ranks) = 0 must be" in box.output.value


def test_batch_calculator_matches_the_hand_worked_case():
    """Llama 3's 8K phase: 2,048 sequences of 8,192 tokens = 16,777,216 tokens per step; 16,384
    GPUs in replicas of t p = 128 give D = 128 and m = 16. At a loss of 2 nats Kaplan's
    B_crit = 2e8 / 2^(1/0.21); S / S_min = 1 + B_crit / B, E / E_min = 1 + B / B_crit."""
    d = W.batch_report().data
    assert (d["tokens_per_step"], d["dp"], d["dp_max"], d["microbatches"]) == (
        16_777_216, 128, 2048, 16)
    crit = 2e8 / 2 ** (1 / 0.21)
    assert d["b_crit"] == pytest.approx(crit, rel=1e-12)
    assert d["steps_rel"] == pytest.approx(1 + crit / 16_777_216, rel=1e-12)
    assert d["tokens_rel"] == pytest.approx(1 + 16_777_216 / crit, rel=1e-12)
    html = W.render_batch()
    assert "above the critical batch" in html and svgs(html)
    # the batch bounds D: 64 sequences cannot feed 128 replicas; a batch that does not split
    box = W.batch_calculator()
    box.controls["global_batch"].value = 64
    assert is_error(box.output.value) and "D = 128 replicas" in box.output.value
    assert "B (sequences per step) = 64" in box.output.value
    box.controls["global_batch"].value = 3000
    assert "not a multiple of D = 128 times the microbatch of 1" in box.output.value
    with pytest.raises(TypeError, match="no field nope"):
        W.batch_calculator(nope=1)
