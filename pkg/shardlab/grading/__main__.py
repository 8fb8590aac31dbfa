"""``python -m shardlab.grading release|grade ...`` (same as ``shardlab release|grade``)."""

import sys

from .cli import main

sys.exit(main())
