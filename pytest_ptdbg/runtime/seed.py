"""``seed_all``: one call that makes a run repeatable (python, numpy, torch, accelerators)."""
from __future__ import annotations

import os
import random

__all__ = ["seed_all"]


def seed_all(seed: int = 1234, mode: bool = False) -> None:
    """Seed ``random``, numpy, torch and every present accelerator with ``seed``.

    ``mode=True`` also turns on deterministic algorithms (``torch.use_deterministic_algorithms``,
    cuDNN deterministic, ``CUBLAS_WORKSPACE_CONFIG``). Raises ValueError for a bad ``seed``.
    """
    if type(seed) is not int or not 0 <= seed < 2**32:
        raise ValueError(f"invalid seed={seed!r}: allowed values are ints in [0, 2**32)")
    if not isinstance(mode, bool):
        raise ValueError(f"invalid mode={mode!r}: allowed values are True or False")
    import numpy as np
    import torch

    from pytest_ptdbg.runtime.device import seed_devices

    os.environ["PYTHONHASHSEED"] = str(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    seed_devices(seed)
    if mode:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        os.environ.setdefault("HCCL_DETERMINISTIC", "true")
    torch.use_deterministic_algorithms(mode)
    if hasattr(torch.backends, "cudnn"):
        torch.backends.cudnn.deterministic = mode
        torch.backends.cudnn.benchmark = False if mode else torch.backends.cudnn.benchmark
