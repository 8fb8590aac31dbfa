"""``shardlab train``: the labs' implementation of a layout trained on real ranks, measured
against ``shardlab.accounting``.

``shardlab train --layout {ddp,zero1,zero2,fsdp,tp,pp,fsdp+tp} --model tiny|small`` builds one
model (:data:`~shardlab.train.spec.MODELS`), wraps it with the lab's module for the layout
(lab 02 ``ddp.py``, 03 ``zero1.py``/``zero2.py``, 04 ``fsdp.py``, 06 ``tensor*.py``,
05 ``pipeline.py``, 09 ``combined.py``; or the student's file of the same name from the
current directory / ``--module PATH``) and trains it on N ranks, through
:func:`shardlab.runtime.launch` on a laptop or inside ``torchrun`` on GPU nodes and in the
Slurm template. It prints per rank the measured peak memory, bytes sent per mesh axis, step
time, tokens/s and MFU next to what ``shardlab.accounting`` predicts.

Modules: :mod:`~shardlab.train.spec` (the run's choices, validated; module resolution),
:mod:`~shardlab.train.rank` (what a rank runs), :mod:`~shardlab.train.layouts_dp` and
:mod:`~shardlab.train.layouts_mp` (one runner per layout over the lab modules),
:mod:`~shardlab.train.report` (measured vs predicted), :mod:`~shardlab.train.progress`,
:mod:`~shardlab.train.main` (launcher / torchrun). Importing this package imports no torch.
"""

from shardlab.train.spec import LAYOUTS, MODELS, TrainSpec, resolve_modules

__all__ = ["LAYOUTS", "MODELS", "TrainSpec", "resolve_modules"]
