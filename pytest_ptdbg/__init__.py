"""pytest-ptdbg: find the first PyTorch API that loses precision, and keep it from coming back.

Data flows one way::

    capture (hooks)  ->  dump (records on disk)  ->  compare (pairing, metrics)
        ->  advise (verdicts, suspects)  ->  report (CSV, text, HTML, pytest output)

Public names are imported lazily so that ``import pytest_ptdbg`` (done by pytest for every
session through the plugin entry point) and the compare path never import torch.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

#: public name -> module that defines it
_EXPORTS = {
    "PrecisionDebugger": "pytest_ptdbg.debugger",
    "seed_all": "pytest_ptdbg.runtime.seed",
    "compare": "pytest_ptdbg.api",
    "compare_distributed": "pytest_ptdbg.api",
    "CompareResult": "pytest_ptdbg.api",
    "check_ranks": "pytest_ptdbg.api",
    "Rule": "pytest_ptdbg.comparison.rule",
    "parse": "pytest_ptdbg.parsing",
    "assert_precision": "pytest_ptdbg.plugin.assertions",
    "PrecisionError": "pytest_ptdbg.errors",
    "PtdbgError": "pytest_ptdbg.errors",
    "ConfigError": "pytest_ptdbg.errors",
    "DeviceUnavailable": "pytest_ptdbg.errors",
    "DumpPathInUseError": "pytest_ptdbg.errors",
    "replay": "pytest_ptdbg.repro.runner",
    "ReplayRefused": "pytest_ptdbg.errors",
}

__all__ = list(_EXPORTS)   # the names of the lazy exports, sorted, then __version__
__all__.sort()
__all__.append("__version__")


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pytest_ptdbg' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return __all__
