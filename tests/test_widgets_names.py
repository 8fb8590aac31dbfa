"""A calculator's sentence names the field as the reader sees it and the value as typed, in
the field's unit (issue 30): α = 1e300 µs is refused as ``α (µs/round) = 1e+300``, not as
``alpha=1e+294`` seconds nor ``beta=inf``; and its tables print no digit a float does not
hold (the same :func:`~shardlab.widgets._format.fmt_fixed` as the command line)."""

from __future__ import annotations

import html
import re

import pytest

pytest.importorskip("ipywidgets")

from shardlab import widgets as W  # noqa: E402


def significant_digits(cell: str) -> int:
    """Digits a number claims: ``90,000,000,126,000,016.00`` claims 19, ``9.000000e+19`` 7."""
    mantissa = re.split(r"[eE]", cell.split()[0].replace(",", ""))[0]  # "7.0e+23 s": 2
    return len(mantissa.replace(".", "").replace("-", "").lstrip("0"))


# calculator, {field: value}, what the sentence must say, internal names it must not
CASES = [
    (W.comm_calculator, {"alpha_us": 1e300}, "α (µs/round) = 1e+300 is larger", ["alpha="]),
    (W.comm_calculator, {"beta_gbps": 1e300}, "β (GB/s) = 1e+300 is larger", ["beta=", "inf"]),
    (W.comm_calculator, {"alpha_us": -1}, "α (µs/round) = -1 must be >= 0", ["alpha"]),
    (W.comm_calculator, {"beta_gbps": 0}, "β (GB/s) = 0 must be > 0", ["beta"]),
    (W.roofline_calculator, {"peak_tflops": 1e300}, "peak (TFLOP/s) = 1e+300 is larger",
     ["peak_flops", "inf"]),
    (W.roofline_calculator, {"bandwidth_gbps": 1e300}, "bandwidth (GB/s) = 1e+300 is larger",
     ["bandwidth=", "inf"]),
    (W.roofline_calculator, {"bandwidth_gbps": 0}, "bandwidth (GB/s) = 0 must be > 0",
     ["bandwidth="]),
    (W.roofline_calculator, {"bandwidth_gbps": 1e-300}, "bandwidth (GB/s) = 1e-300", ["ridge="]),
    (W.memory_calculator, {"recipe": "custom", "weights": -1}, "weights (B/param) = -1 must be",
     ["recipe 'custom'", "weights="]),
    (W.memory_calculator, {"recipe": "custom", "grad_accum": 1e300},
     "grad_accum (B/param) = 1e+300 is larger", ["recipe 'custom'"]),
    (W.overlap_calculator, {"rate_tflops": 1e25}, "achieved rate (TFLOP/s) = 1e+25 is larger",
     ["rate="]),
    # a quantity derived from two fields, each within its bound, that leaves a float's range
    # or accounting's: refused naming those fields, never "unexpected ZeroDivisionError",
    # "inf" or an intermediate's name (flops=, critical batch=, tokens per step=)
    (W.batch_calculator, {"loss": 1e-300}, "loss (nats) = 1e-300 gives a critical batch",
     ["unexpected", "ZeroDivisionError"]),
    (W.batch_calculator, {"loss": 1e-30}, "loss (nats) = 1e-30 gives a critical batch",
     ["critical batch="]),
    (W.batch_calculator, {"seq_len": 2**53},
     "B (sequences per step) = 2,048 and s (sequence length) = 9,007,199,254,740,992 would be",
     ["tokens per step=", "73,786"]),
    (W.comm_calculator, {"nbytes": "1e30", "beta_gbps": 1e-300},
     "size V (bytes) = 1e+30 and β (GB/s) = 1e-300 would be more than 1e+30 s", ["inf"]),
    (W.comm_calculator, {"ranks": 2**53, "alpha_us": 1e30},
     "D (ranks) = 9,007,199,254,740,992 and α (µs/round) = 1e+30 would be", ["inf"]),
    (W.overlap_calculator, {"tokens": 10**19}, "T (tokens per rank per step) = 1e+19",
     ["flops=", "10,000,000,000,000,000,000"]),
    (W.overlap_calculator, {"n_params": "1e15", "t": 1, "p": 1, "tokens": 10**15},
     "N (parameters) = 1,000,000,000,000,000 and T (tokens per rank per step) = "
     "1,000,000,000,000,000 would be 6e+30", ["flops="]),
    (W.overlap_calculator, {"n_params": "1e24"},
     "N (parameters) = 1e+24, t (tensor ranks) = 8 and p (stages) = 1 would be 1.25e+23, more "
     "than 2^53", ["n_params=", "999,999"]),
    (W.overlap_calculator, {"beta_dp_gbps": 1e-300}, "β of D and p (GB/s) = 1e-300 would be",
     ["inf"]),
    (W.overlap_calculator, {"rate_tflops": 1e-300}, "achieved rate (TFLOP/s) = 1e-300 would be",
     ["inf"]),
    (W.overlap_calculator, {"n_params": "0.5"}, "N (parameters) = 0.5 must be at least 1", []),
    (W.pipeline_calculator, {"F": 0, "B": 0},
     "F cost = 0, B cost = 0: the 1f1b schedule's actions take no time", ["unexpected"]),
    (W.pipeline_calculator, {"F": 1e-300, "comm": 1e30},
     "F cost = 1e-300, B cost = 2 and p2p delay = 1e+30 would be", ["inf"]),
    (W.roofline_calculator, {"m": 1e30, "peak_tflops": 1e-300},
     "m (rows) = 1e+30, k = 4,096, n = 4,096, peak (TFLOP/s) = 1e-300", ["inf"]),
    (W.roofline_calculator, {"peak_tflops": 1e-300, "cap": 1e-300}, "cap = 1e-300 would be",
     ["unexpected", "ZeroDivisionError"]),
    # a count typed past 2^53 is refused with the digits typed, not a float's (...680)
    (W.memory_calculator, {"n_params": "123456789012345678"},
     "N (parameters) = 123,456,789,012,345,678 is larger than 2^53", ["680"]),
    (W.memory_calculator, {"n_params": "1.23456789012345678e17"},
     "N (parameters) = 123,456,789,012,345,678 is larger than 2^53", ["680", "e+17"]),
    (W.memory_calculator, {"n_params": "1e400"}, "N (parameters) = 1e400 is too large", ["inf"]),
    # a product of degrees is written with the labels, in the mesh calculator as on its page
    (W.mesh_calculator, {"G": 16, "dp": 4, "tp": 2, "pp": 2, "cp": 2},
     "D (data) × t (tensor) × p (pipeline) × c (context) = 4 × 2 × 2 × 2 = 32", ["dp*", "*cp"]),
    (W.mesh_calculator, {"G": 16, "dp": 4, "tp": 2, "pp": 2, "rank": 1, "moe": True, "ep": 3},
     "ep (expert) × etp (expert tensor) = 3 × 1 = 3 does not divide D (data) × c (context) × "
     "t (tensor) = 4 × 1 × 2 = 8", ["ep*etp", "dp*cp*tp"]),
]


def _sentence(box) -> str:
    m = re.search(r'class="shardlab-error"[^>]*>(.*?)</div>', box.output.value, re.S)
    assert m, box.output.value[:300]
    return html.unescape(m.group(1))


@pytest.mark.parametrize("make, values, said, unsaid", CASES,
                         ids=[f"{m.__name__} {v}" for m, v, _, _ in CASES])
def test_a_sentence_names_the_label_and_the_value_typed(make, values, said, unsaid):
    box = make()
    for key, value in values.items():
        box.controls[key].value = value
    sentence = _sentence(box)
    assert said in sentence, sentence
    for name in unsaid:
        assert name not in sentence, (name, sentence)


@pytest.mark.parametrize("make, values", [
    (W.overlap_calculator, {"tokens": 10**18}),  # the chart's 64 T: not flops=1.18e+30
    (W.roofline_calculator, {"peak_tflops": 1e18, "bandwidth_gbps": 1e-9}),  # ridge 1e30
], ids=["overlap T=1e18", "roofline ridge 1e30"])
def test_a_chart_past_the_typed_values_stays_within_the_bound(make, values):
    """A chart spans beyond the values typed (64 T, 30 × the ridge): its end is held within
    accounting's bounds, so a value the reader may type is answered, not refused under a
    quantity only the chart forms."""
    box = make()
    for key, value in values.items():
        box.controls[key].value = value
    assert "shardlab-error" not in box.output.value and "<svg" in box.output.value


def test_a_size_typed_at_the_bound_draws_its_chart():
    """1e30 bytes is accepted: the chart's end (10 V) is held at the bound, not refused as a
    size the reader never typed (``size V (bytes) = 1e+31``)."""
    box = W.comm_calculator()
    box.controls["nbytes"].value = "1e30"
    assert "shardlab-error" not in box.output.value and "<svg" in box.output.value


CELLS = re.compile(r"<td[^>]*>([^<]*)</td>")


@pytest.mark.parametrize(
    "html_text",
    [
        W.render_memory(n_params=9e15, recipe="custom", custom={"weights": 1e10}),
        W.render_activations(s=10**6, b=10**6, t=1, layers=10**15),
        W.render_step_volume(n_params=9e15, q=1e10),
        W.render_pipeline(kind="1f1b", p=2**53, m=1),  # a bubble of 9e17 %
        W.render_batch(loss=1e-4),  # a critical batch of 2e27 tokens, rounded
        W.render_overlap(n_params=1, t=1, p=1, h=1, layers=1, tokens=1e25, rate_tflops=1e18,
                         beta_dp_gbps=1e-3),  # T* and T past 2^53
    ],
    ids=["memory", "activations", "step volume", "pipeline", "batch", "overlap"],
)
def test_tables_print_no_invented_digits(html_text):
    numbers = [c for c in CELLS.findall(html_text) if re.fullmatch(r"[-\d.,e+]+( %)?", c)]
    assert numbers
    for cell in numbers:
        assert significant_digits(cell) <= 17, cell
