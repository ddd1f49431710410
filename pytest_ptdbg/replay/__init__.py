"""Single-API reproduction: packages, replay, standalone scripts, ``mode="acl"`` and overflow check.

``pytest_ptdbg.replay`` is both this package and the public function ``replay(package_dir,
device="cpu", dtype=None)``: importing a submodule binds the package onto ``pytest_ptdbg``, so the
package itself is made callable and forwards to :func:`pytest_ptdbg.replay.runner.replay`.
"""
from __future__ import annotations

import importlib
import sys
import types
from typing import Any

_EXPORTS = {
    "replay": "pytest_ptdbg.replay.runner",
    "replay_package": "pytest_ptdbg.replay.runner",
    "ReplayResult": "pytest_ptdbg.replay.runner",
    "ReplayError": "pytest_ptdbg.replay.runner",
    "load_package": "pytest_ptdbg.replay.package",
    "package_call": "pytest_ptdbg.replay.package",
    "write_script": "pytest_ptdbg.replay.script",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_ptdbg.replay' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from pytest_ptdbg.replay.runner import replay

        return replay(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
