"""Lab 01's α–β fit says when it is poor and why (issue 27: a 45-73 % fit was printed as is)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from shardlab.accounting import comm as acc

_spec = importlib.util.spec_from_file_location(
    "lab01_alpha_beta", Path(__file__).parents[1] / "labs" / "01_collectives" / "alpha_beta.py"
)
ab = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ab)

SIZES = ab.DEFAULT_SIZES
ALPHA, BETA = 200e-6, 1e9


def _times(scale_small=1.0):
    return [
        acc.alpha_beta_time("all_reduce", v, 2, ALPHA, BETA) * (scale_small if v <= 16384 else 1)
        for v in SIZES
    ]


def test_a_good_fit_has_no_warning():
    fit = ab.fit_alpha_beta(SIZES, _times(), 2)
    assert abs(fit["alpha"] / ALPHA - 1) < 1e-9 and abs(fit["beta"] / BETA - 1) < 1e-9
    assert ab.fit_warning(fit, ranks=2, cores=2, load=8.0) == ""


def test_a_poor_fit_says_why():
    fit = ab.fit_alpha_beta(SIZES, _times(scale_small=4.0), 2)
    assert fit["rel_rms_error"] > ab.POOR_FIT
    busy = ab.fit_warning(fit, ranks=2, cores=2, load=8.2)
    assert busy.startswith(f"poor fit: rms relative error {fit['rel_rms_error']:.0%}")
    assert "load average 8.2 on 2 cores" in busy and "messages up to 16 KiB take up to" in busy
    shared = ab.fit_warning(fit, ranks=2, cores=2)
    assert "2 ranks and this notebook's process share 2 cores" in shared
    few = {"rel_rms_error": 0.5, "sizes": [2**20, 2**21, 2**22], "seconds": [1, 2, 4]}
    few["predicted"] = few["seconds"]
    assert ab.fit_warning(few, ranks=2, cores=16, load=0.3).endswith(
        "— only 3 sizes for two parameters. Rerun on an idle machine (more repetitions help) "
        "before comparing."
    )
