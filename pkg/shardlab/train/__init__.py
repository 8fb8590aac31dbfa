"""``shardlab train``: the labs' implementation of a layout trained on real ranks, measured
against ``shardlab.accounting``.

``shardlab train --layout {ddp,zero1,zero2,fsdp,tp,pp,fsdp+tp} --model tiny|small`` builds one
model (:data:`~shardlab.train.spec.MODELS`), wraps it with the lab's implementation of the
layout (the lab's ``layout_<topic>.py`` runner over its modules, declared in its
``train.toml`` and loaded by path; or the student's file of the same name from the current
directory / ``--module PATH``) and trains it on N ranks, through
:func:`shardlab.runtime.launch` on a laptop or inside ``torchrun`` on GPU nodes and in the
Slurm template. It prints per rank the measured peak memory, bytes sent per mesh axis, step
time, tokens/s and MFU next to what ``shardlab.accounting`` predicts.

Modules: :mod:`~shardlab.train.spec` (the run's choices, validated; the layouts read from
the labs' ``train.toml``; module resolution), :mod:`~shardlab.train.runner` (the ``Runner``
protocol the labs implement), :mod:`~shardlab.train.rank` (what a rank runs: the lab's
modules loaded by path, the steps),
:mod:`~shardlab.train.report` (measured vs predicted), :mod:`~shardlab.train.progress`,
:mod:`~shardlab.train.main` (launcher / torchrun). Importing this package imports no torch.
"""

from shardlab.train.spec import LAYOUTS, MODELS, TrainSpec, resolve_modules

__all__ = ["LAYOUTS", "MODELS", "TrainSpec", "resolve_modules"]
