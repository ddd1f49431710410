"""Regenerate ``runtime/torch_signatures.py`` from the installed torch:
``python -m pytest_ptdbg.capture.signature_table > pytest_ptdbg/runtime/torch_signatures.py``.

The table holds the signatures (``runtime.operations.signatures``) of every API capture's name table
can record, so that binding the calls of a dump made with that torch version imports no torch.
"""
from __future__ import annotations

import sys
from typing import List, Tuple

from pytest_ptdbg.capture import names
from pytest_ptdbg.runtime.operations import signature_table_text

__all__ = ["recordable_apis"]


def recordable_apis() -> List[Tuple[str, str]]:
    """``(Type, name)`` of every API in capture's name table."""
    return sorted(set(names.build_table().values()))


if __name__ == "__main__":
    sys.stdout.write(signature_table_text(recordable_apis()))
