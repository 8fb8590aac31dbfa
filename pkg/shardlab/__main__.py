"""`python -m shardlab` runs the command line (see shardlab.cli)."""

import sys

from shardlab.cli import main

sys.exit(main())
