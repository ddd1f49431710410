"""Compare two dumps: pairing, metrics, verdict, the compare table, ``compare``/``compare_distributed``.

``pytest_ptdbg.compare`` is both this package and the public function ``pytest_ptdbg.compare(...)``:
once any ``pytest_ptdbg.compare.*`` module is imported, Python binds the package to that name, so
the package itself is made callable and forwards to :func:`pytest_ptdbg.compare.api.compare`.
Nothing heavy is imported here (no torch, no pandas until called).
"""
from __future__ import annotations

import sys
import types
from typing import Any


class _CallablePackage(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from pytest_ptdbg.compare.api import compare

        return compare(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage


def __getattr__(name: str) -> Any:
    if name in ("compare", "compare_distributed", "CompareResult", "DistributedResult"):
        from pytest_ptdbg.compare import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
