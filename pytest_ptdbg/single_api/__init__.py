"""Single-API reproduction: packages, replay, standalone scripts, ``mode="acl"`` and overflow check.

The public ``pytest_ptdbg.replay(package_dir, device="cpu", dtype=None)`` is
:func:`pytest_ptdbg.single_api.runner.replay`.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "replay": "pytest_ptdbg.single_api.runner",
    "replay_package": "pytest_ptdbg.single_api.runner",
    "ReplayResult": "pytest_ptdbg.single_api.runner",
    "ReplayError": "pytest_ptdbg.single_api.runner",
    "ReplayRefused": "pytest_ptdbg.judge.errors",
    "load_package": "pytest_ptdbg.single_api.package",
    "package_call": "pytest_ptdbg.single_api.package",
    "write_script": "pytest_ptdbg.single_api.script",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_ptdbg.single_api' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

