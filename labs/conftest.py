"""Put every lab folder (``labs/NN_topic``) on ``sys.path`` for tests run from anywhere.

Each lab's student module (``collectives``, ``ddp``, ``zero``, ``fsdp``) and its worker
helpers (``_workers_<topic>``) are imported by plain module name, by the public tests next
to them and by the hidden tests in ``labs/NN_topic/hidden/``, whatever folder pytest was
started from. (Ranks started by ``shardlab.runtime.launch`` get the worker module's own folder
on their path from the launcher.) Module names are unique across labs, so putting every
lab folder on the path cannot shadow anything.
"""

from __future__ import annotations

import sys
from pathlib import Path

LABS_DIR = Path(__file__).resolve().parent

for _folder in sorted(LABS_DIR.glob("[0-9][0-9]_*")):
    if _folder.is_dir() and str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))
