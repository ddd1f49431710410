"""The replay engine: which callable a record names, on which device, and what it gave back.

``resolve_api`` resolves an API only through the allowlist (:mod:`.allowlist`); collectives are
refused. ``check_device``/``parse_dtype`` check the replay's device and dtype; ``retarget``
replaces recorded devices (and, for an oracle, floating dtype arguments); ``effective_output`` is
what an in-place API that returns nothing gave back.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple

from pytest_ptdbg.errors import ReplayError
from pytest_ptdbg.replayer import codec

__all__ = ["api_path", "resolve_api", "parse_dtype", "check_device", "effective_output", "retarget"]


def api_path(api_type: str, api_name: str, record: Optional[str] = None) -> Tuple[str, List[str]]:
    """``(module path, [attribute])`` of an allowlisted API, e.g. ``("torch.nn.functional", ["conv2d"])``,
    from the judge's table (``pytest_ptdbg/replayer/allowlist.py``).

    Raises ReplayError for collectives (not replayable alone) and ReplayRefused (a ValueError) for
    an API that is not in the allowlist.
    """
    from pytest_ptdbg.replayer import allowlist

    _no_collective(api_type, api_name)
    root, _, attr = allowlist.qualified_name(api_type, api_name, record).rpartition(".")
    return root, [attr]


def _no_collective(api_type: str, api_name: str) -> None:
    if api_type == "Distributed":
        raise ReplayError(f"Distributed_{api_name}: a collective needs its process group and cannot be replayed alone")


def resolve_api(api_type: str, api_name: str, record: Optional[str] = None) -> Callable:
    """The callable of ``{api_type}_{api_name}`` from the judge's allowlist (``Tensor`` methods
    take ``self`` first). Raises ReplayRefused (a ValueError) naming ``record`` when the API is not
    allowlisted; nothing is looked up by the name itself."""
    from pytest_ptdbg.replayer import allowlist

    _no_collective(api_type, api_name)
    return allowlist.resolve(api_type, api_name, record)


def parse_dtype(dtype: Any) -> Any:
    """``None``, a ``torch.dtype`` or a name like ``"float64"``/``"torch.bfloat16"`` -> dtype."""
    import torch

    from pytest_ptdbg.replayer.allowlist import dtype_of

    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    dt = dtype_of(str(dtype))
    if dt is None or not dt.is_floating_point:
        raise ValueError(f"--dtype must be a floating-point torch dtype such as 'float64', got {dtype!r}")
    return dt


def check_device(device: str) -> Any:
    """A usable ``torch.device`` for ``device`` (``cpu``, ``cuda[:i]``, ``npu[:i]``) or ReplayError."""
    from pytest_ptdbg.runtime.device import DeviceUnavailable, resolve_device

    if str(device).strip().lower() == "auto":
        raise ReplayError("replay needs an explicit device: cpu, cuda[:i] or npu[:i]")
    try:
        return resolve_device(str(device))
    except DeviceUnavailable as exc:
        raise ReplayError(str(exc)) from None


def effective_output(output: Any, args: Any) -> Any:
    """What an API gave back; for an in-place API that returns nothing (``__setitem__``) the
    tensor it modified, its first argument."""
    import torch

    if not codec.flatten_output(output) and args and isinstance(args[0], torch.Tensor):
        return args[0]
    return output


def retarget(args: list, kwargs: dict, dev: Any, dtype: Any) -> Tuple[list, dict]:
    """Replace saved ``torch.device`` arguments (e.g. ``device="npu:0"``) by the replay device and,
    with a ``dtype`` override, floating ``torch.dtype`` arguments by it (an oracle runs in float64)."""
    import torch

    def fix(v: Any) -> Any:
        if isinstance(v, torch.device):
            return dev
        if dtype is not None and isinstance(v, torch.dtype) and v.is_floating_point:
            return dtype
        if isinstance(v, list):
            return [fix(x) for x in v]
        if isinstance(v, tuple):
            return tuple(fix(x) for x in v)
        return v

    return fix(args), {k: fix(v) for k, v in kwargs.items()}
