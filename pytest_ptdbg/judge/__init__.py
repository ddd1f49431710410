"""The judge: what a replay may run, and with which arguments.

Dumps and reproduction packages travel between people; they are data and never choose what code
runs. Every replay path (compare's replay check, ``ptdbg replay PACKAGE``, ``ptdbg replay
--script``) resolves the API through the hand-written table of :mod:`pytest_ptdbg.judge.allowlist`
and rebuilds its arguments with :mod:`pytest_ptdbg.judge.arguments`, which accepts only data
(tensors from the dump, numbers, sizes, slices, dtypes from a fixed table, strings that a rule per
API and parameter allows). Anything else raises :class:`ReplayRefused` before any call.

Importing this package does not import torch (``allowlist`` and ``arguments`` do).
"""
from pytest_ptdbg.judge.errors import NotReplayable, ReplayRefused

__all__ = ["ReplayRefused", "NotReplayable"]
