"""The judge: replay API calls on their recorded inputs, and what a replay may run.

Dumps and reproduction packages travel between people; they are data and never choose what code
runs. Every replay path (compare's replay check, ``ptdbg replay PACKAGE``, ``ptdbg replay
--script``) resolves the API through the hand-written table of :mod:`pytest_ptdbg.judge.allowlist`
and rebuilds its arguments with :mod:`pytest_ptdbg.judge.arguments`, which accepts only data
(tensors from the dump, numbers, sizes, slices, dtypes from a fixed table, strings that a rule per
API and parameter allows). Anything else raises :class:`ReplayRefused` before any call.

Modules: ``allowlist`` (the table), ``arguments`` (data-only decoding), ``package`` (single-API
reproduction packages), ``runner`` (replay one call, ``replay``), ``script`` (a standalone
reproduction script), ``replay_check`` (compare's re-run of its suspects) and ``replay_verdict``
(what the re-run shows, in words; ``advise/replay_merge.py`` folds it into the advice).

Importing this package does not import torch; public names load lazily.
"""
from __future__ import annotations

import importlib
from typing import Any

from pytest_ptdbg.errors import NotReplayable, ReplayRefused

_EXPORTS = {
    "replay": "pytest_ptdbg.judge.runner",
    "replay_package": "pytest_ptdbg.judge.runner",
    "ReplayResult": "pytest_ptdbg.judge.runner",
    "ReplayError": "pytest_ptdbg.judge.runner",
    "load_package": "pytest_ptdbg.judge.package",
    "package_call": "pytest_ptdbg.judge.package",
    "write_script": "pytest_ptdbg.judge.script",
}

__all__ = ["NotReplayable", "ReplayRefused", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_ptdbg.judge' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
