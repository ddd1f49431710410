"""Every exception this package raises on purpose, under one base class :class:`PtdbgError`.

Each also derives from the built-in exception its callers already catch (``ValueError`` for bad
input, ``RuntimeError`` for an environment that cannot do the work, ``OSError`` for files,
``AssertionError`` for a failed precision check), so ``except ValueError`` keeps working.
No imports from the rest of the package: every layer may raise these.
"""
from __future__ import annotations

from typing import Any, List, Optional

__all__ = [
    "PtdbgError",
    "ConfigError",
    "DeviceUnavailable",
    "DumpPathInUseError",
    "OutputError",
    "NotReplayable",
    "ReplayRefused",
    "AllocationRefused",
    "ReplayError",
    "SinkStop",
    "SinkUsageError",
    "OverflowDetected",
    "GoldenError",
    "PrecisionError",
]


class PtdbgError(Exception):
    """Base class of every error raised on purpose by pytest-ptdbg."""


class ConfigError(PtdbgError, ValueError):
    """A bad configuration (a usage error, raised at ``configure_hook``/``start()``); names the parameter."""


class DeviceUnavailable(PtdbgError, RuntimeError):
    """The requested device cannot be used here; the message says what is missing."""


class DumpPathInUseError(PtdbgError, RuntimeError):
    """Another writer holds the dump of this path, step and rank (a usage error, raised at ``start()``)."""


class OutputError(PtdbgError, OSError):
    """The output folder cannot be created or written to (the message names it)."""


class NotReplayable(PtdbgError, ValueError):
    """The call spec holds a value that cannot be rebuilt (a ``{"repr": ...}``) or a missing tensor."""


class ReplayRefused(PtdbgError, ValueError):
    """A replay refused for safety, before any call: an API outside the allowlist or an argument
    that is not plain data. ``api`` names the record, ``argument`` the position (``#1``) or keyword
    (``'reduction'``) when an argument is to blame."""

    def __init__(self, api: str, reason: str, argument: Optional[str] = None) -> None:
        self.api = api
        self.argument = argument
        self.reason = reason
        where = f"{api}: argument {argument}: " if argument else f"{api}: "
        super().__init__(f"{where}{reason}; not replayed (see pytest_ptdbg/replayer/allowlist.py)")


class AllocationRefused(ReplayRefused):
    """A replay refused before any call: its arguments would make more than its record's outputs
    (``pytest_ptdbg/replayer/allocation.py``); the record is unusable data, never a pass."""


class ReplayError(PtdbgError, RuntimeError):
    """A reproduction package could not be run (unknown API, unavailable device, unreplayable argument)."""


class SinkStop(PtdbgError):
    """Base of the exceptions a sink raises on purpose into the user's code (capture lets them
    through): stopping the run (``overflow_check``), or a configuration that turns out impossible
    at the call it applies to (:class:`SinkUsageError`)."""


class SinkUsageError(SinkStop, ValueError):
    """A usage error found at the call it concerns (e.g. an acl ``backward_input`` of the wrong shape)."""


class OverflowDetected(SinkStop, RuntimeError):
    """Raised to stop the run at the ``overflow_nums``-th overflow; ``.events`` lists them."""

    def __init__(self, message: str, events: List[dict]) -> None:
        super().__init__(message)
        self.events = events


class GoldenError(PtdbgError, ValueError):
    """A golden file that cannot be used (names the file and line)."""


class PrecisionError(PtdbgError, AssertionError):
    """A comparison is out of tolerance; the message is the advisor's explanation."""

    def __init__(self, message: str, evaluation: Optional[Any] = None) -> None:
        super().__init__(message)
        self.evaluation = evaluation
