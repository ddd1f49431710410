"""``advisor_{timestamp}.txt``: the advisor's findings as text (see ``Advice.text``)."""
from __future__ import annotations

import os


def write_advisor(advice, path: str) -> str:
    """Write ``advice.text()`` to ``path`` (creating its folder); returns ``path``."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(advice.text())
    return path
