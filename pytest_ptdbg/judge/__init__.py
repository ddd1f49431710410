"""The judge: replay API calls on their recorded inputs, and what a replay may run.

Dumps and reproduction packages travel between people; they are data and never choose what code
runs. Every replay path (compare's judgement, ``ptdbg replay PACKAGE``, ``ptdbg replay
--script``) resolves the API through the hand-written table of :mod:`pytest_ptdbg.judge.allowlist`
and rebuilds its arguments with :mod:`pytest_ptdbg.judge.arguments`, which accepts only data
(tensors from the dump, numbers, sizes, slices, dtypes from a fixed table, strings that a rule per
API and parameter allows). Anything else raises :class:`ReplayRefused` before any call.

Modules: ``allowlist`` (the table), ``arguments`` (data-only decoding), ``package`` (single-API
reproduction packages), ``runner`` (replay one call, ``replay``), ``script`` (a standalone
reproduction script), ``own_error`` (:func:`judge_dump`: every call of one dump by its own error
against a budget), ``budget`` (the numerical kernels), ``not_judged`` (the one table of calls not
judged by value), ``step`` (:func:`judge_step`: compare's default verdict).

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
    "judge_dump": "pytest_ptdbg.judge.own_error",
    "DumpJudgement": "pytest_ptdbg.judge.own_error",
    "CallVerdict": "pytest_ptdbg.judge.own_error",
    "judge_step": "pytest_ptdbg.judge.step",
    "StepJudgement": "pytest_ptdbg.judge.step",
}

__all__ = ["NotReplayable", "ReplayRefused", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_ptdbg.judge' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
