"""Devices: which accelerators are present (CUDA, Ascend NPU through ``torch_npu``), resolving a
device name (``auto``/``cpu``/``cuda[:i]``/``npu[:i]``) to a usable ``torch.device``, and seeding them.

``auto`` is npu when ``torch_npu`` imports and has a device, else cuda when available, else cpu. A
requested device that is not available raises :class:`DeviceUnavailable` whose message says what is
missing (the plugin skips the test with it; ``ptdbg replay`` reports it).
"""
from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, List
from pytest_ptdbg.errors import DeviceUnavailable

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["DeviceUnavailable", "available_devices", "has_npu", "resolve_device", "seed_devices"]


def has_npu() -> bool:
    """Whether ``torch_npu`` imports and sees an NPU."""
    return not _npu_problem()


def available_devices() -> List[str]:
    """Device types present here, ``"cpu"`` first (e.g. ``["cpu", "cuda"]``)."""
    import torch

    out = ["cpu"]
    if torch.cuda.is_available():
        out.append("cuda")
    if has_npu():
        out.append("npu")
    return out


def seed_devices(seed: int) -> None:
    """Seed the RNG of every accelerator present (CPU is seeded by ``torch.manual_seed``)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    if has_npu():  # pragma: no cover - needs torch_npu
        torch.npu.manual_seed_all(seed)  # type: ignore[attr-defined]  # torch_npu adds torch.npu




@functools.lru_cache(maxsize=None)
def _npu_problem() -> str:
    """'' when an NPU is usable, else what is missing (checked once per process)."""
    try:
        import torch  # noqa: F401
        importlib.import_module("torch_npu")
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


def resolve_device(name: str) -> torch.device:
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
        _check_index("npu", index, torch.npu.device_count())  # type: ignore[attr-defined]  # from torch_npu
        return torch.device("npu", index)
    raise DeviceUnavailable(f"unknown device {name!r}: expected auto, cpu, cuda[:i] or npu[:i]")
