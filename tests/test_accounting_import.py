"""shardlab.accounting is pure Python: importing it must not import torch."""

import subprocess
import sys


def test_accounting_does_not_import_torch():
    code = (
        "import sys, shardlab.accounting as a; "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "assert all(hasattr(a, n) for n in a.__all__)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
