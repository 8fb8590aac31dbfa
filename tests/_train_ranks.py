"""Rank function of tests/test_train_cli.py (importable by the spawned ranks): several
``shardlab train`` specs in one launch, so the fast tests pay the ranks' start-up once."""

from __future__ import annotations


def run_specs(specs: list) -> list[dict]:
    """:func:`shardlab.train.rank.run_rank` of every spec in turn; this rank's rows."""
    from shardlab.train.rank import run_rank

    return [run_rank(spec) for spec in specs]
