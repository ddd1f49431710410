"""``python -m pytest_ptdbg.cli``: the ``ptdbg`` command (what torchrun's ``-m`` runs)."""
import sys

from pytest_ptdbg.cli import main

sys.exit(main())
