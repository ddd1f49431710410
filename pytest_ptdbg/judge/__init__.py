"""The judge: every call of a dump by its own error, by replay, against a budget; the step's verdict.

Modules: ``own_error`` (:func:`judge_dump`: every call of one dump by its own error against a
budget), ``budget`` (the numerical kernels), ``not_judged`` (the one table of calls not judged by
value), ``downcast`` (casts the bench does not make), ``step`` (:func:`judge_step`: compare's
default verdict). Replays go through :mod:`pytest_ptdbg.replayer`. The reproduction tool
(``replay``, packages, scripts) lives in :mod:`pytest_ptdbg.repro`; its public names are also
exported here, as before.

Importing this package does not import torch; public names load lazily.
"""
from __future__ import annotations

import importlib
from typing import Any

from pytest_ptdbg.errors import NotReplayable, ReplayRefused

_EXPORTS = {
    "replay": "pytest_ptdbg.repro.runner",
    "replay_package": "pytest_ptdbg.repro.runner",
    "ReplayResult": "pytest_ptdbg.repro.runner",
    "ReplayError": "pytest_ptdbg.repro.runner",
    "load_package": "pytest_ptdbg.repro.package",
    "package_call": "pytest_ptdbg.repro.package",
    "write_script": "pytest_ptdbg.repro.script",
    "judge_dump": "pytest_ptdbg.judge.own_error",
    "DumpJudgement": "pytest_ptdbg.judge.own_error",
    "CallVerdict": "pytest_ptdbg.judge.own_error",
    "judge_step": "pytest_ptdbg.judge.step",
    "StepJudgement": "pytest_ptdbg.judge.step",
}

__all__ = ["NotReplayable", "ReplayRefused", *sorted(_EXPORTS)]  # noqa: PLE0604 - the lazy names, all strings


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_ptdbg.judge' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
