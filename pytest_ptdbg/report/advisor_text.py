"""``advisor_{stem}.txt``: the advisor's findings as text (see ``Advice.text``)."""
from __future__ import annotations

from pytest_ptdbg.report.outputs import write_new


def write_advisor(advice, path: str) -> str:
    """Write ``advice.text()`` to a new file ``path`` (creating its folder; never over an existing
    file or link); returns ``path``."""
    return write_new(path, advice.text())
