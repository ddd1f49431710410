"""Which accelerators are present (CUDA, Ascend NPU through ``torch_npu``), and seeding them."""
from __future__ import annotations

import importlib
from typing import List

__all__ = ["available_devices", "has_npu", "seed_devices"]


def has_npu() -> bool:
    """Whether ``torch_npu`` imports and sees an NPU."""
    try:
        importlib.import_module("torch_npu")
        import torch

        return bool(getattr(torch, "npu", None) and torch.npu.is_available())
    except Exception:
        return False


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
        torch.npu.manual_seed_all(seed)
