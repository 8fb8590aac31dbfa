"""Put the earlier labs' folders on ``sys.path`` (imported first by this lab's modules).

Lab 09 composes the reference modules of labs 04 (``fsdp``), 05 (``pipeline``) and 06
(``tensor``, ``tensor_block``, ``tensor_reference``). Under pytest ``labs/conftest.py``
already does this; ranks started by ``shardlab.dist.launch`` only get this folder, so the
modules here import this one before the others. Module names are unique across labs, so
nothing is shadowed.
"""

from __future__ import annotations

import sys
from pathlib import Path

LABS_DIR = Path(__file__).resolve().parent.parent
for _name in ("04_fsdp", "05_pipeline", "06_tensor"):
    _folder = str(LABS_DIR / _name)
    if _folder not in sys.path:
        sys.path.append(_folder)
