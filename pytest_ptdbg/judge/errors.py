"""The exception of the judge (no torch here)."""
from __future__ import annotations

from typing import Optional


class ReplayRefused(ValueError):
    """A replay refused for safety, before any call: an API outside the allowlist or an argument
    that is not plain data. ``api`` names the record, ``argument`` the position (``#1``) or keyword
    (``'reduction'``) when an argument is to blame."""

    def __init__(self, api: str, reason: str, argument: Optional[str] = None) -> None:
        self.api = api
        self.argument = argument
        self.reason = reason
        where = f"{api}: argument {argument}: " if argument else f"{api}: "
        super().__init__(f"{where}{reason}; not replayed (see pytest_ptdbg/judge/allowlist.py)")


class NotReplayable(ValueError):
    """The spec holds a value that cannot be rebuilt (a ``{"repr": ...}``) or a missing tensor."""
