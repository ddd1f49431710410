"""Device resolution for the plugin: ``auto``/``cpu``/``cuda[:i]``/``npu[:i]`` -> a usable device.

Uses ``pytest_ptdbg.device`` when the dump engine provides a ``resolve_device``; otherwise the
rules here: ``auto`` is npu when ``torch_npu`` imports and has a device, else cuda when
available, else cpu. A requested device that is not available raises
:class:`DeviceUnavailable` whose message says what is missing; the plugin skips the test with it.
"""
from __future__ import annotations

from typing import Any


class DeviceUnavailable(RuntimeError):
    """The requested device cannot be used here; the message says what is missing."""


def _npu_problem() -> str:
    """'' when an NPU is usable, else what is missing."""
    try:
        import torch  # noqa: F401
        import torch_npu  # noqa: F401
    except Exception as exc:  # ImportError, or torch_npu failing to load its libraries
        return f"torch_npu is not importable ({type(exc).__name__}: {exc})"
    import torch
    npu = getattr(torch, "npu", None)
    try:
        if npu is None or not npu.is_available() or npu.device_count() < 1:
            return "torch_npu imports but reports no NPU device (torch.npu.is_available() is False)"
    except Exception as exc:  # pragma: no cover - depends on the driver
        return f"torch_npu cannot query its devices ({exc})"
    return ""


def _cuda_problem() -> str:
    import torch
    if not torch.backends.cuda.is_built():
        return f"this torch build ({torch.__version__}) has no CUDA support"
    if not torch.cuda.is_available() or torch.cuda.device_count() < 1:
        return "no CUDA device is available (torch.cuda.is_available() is False)"
    return ""


def _check_index(kind: str, index: int, count: int) -> None:
    if index >= count:
        raise DeviceUnavailable(f"{kind}:{index} requested but only {count} {kind} device(s) exist")


def resolve_device(name: str) -> Any:
    """``name`` (auto, cpu, cuda, cuda:1, npu, npu:0) -> ``torch.device``; raises DeviceUnavailable."""
    import torch

    name = (name or "auto").strip().lower()
    if name == "auto":
        if not _npu_problem():
            return torch.device("npu", 0)
        if not _cuda_problem():
            return torch.device("cuda", 0)
        return torch.device("cpu")
    kind, _, idx = name.partition(":")
    if idx and not idx.isdigit():
        raise DeviceUnavailable(f"device {name!r}: the index after ':' must be a number")
    index = int(idx) if idx else 0
    if kind == "cpu":
        return torch.device("cpu")
    if kind == "cuda":
        problem = _cuda_problem()
        if problem:
            raise DeviceUnavailable(f"device {name!r} requested but {problem}")
        _check_index("cuda", index, torch.cuda.device_count())
        return torch.device("cuda", index)
    if kind == "npu":
        problem = _npu_problem()
        if problem:
            raise DeviceUnavailable(f"device {name!r} requested but {problem}")
        _check_index("npu", index, torch.npu.device_count())
        return torch.device("npu", index)
    raise DeviceUnavailable(f"unknown device {name!r}: expected auto, cpu, cuda[:i] or npu[:i]")
