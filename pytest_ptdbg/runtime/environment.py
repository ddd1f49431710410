"""The arithmetic environment a run computes in: what a correct kernel is allowed to compute.

Two records are made from it:

* per dump, :func:`arithmetic_environment` (in the manifest, ``format/environment.py`` reads it
  back): the accelerator (type, name, compute capability), versions (torch, CUDA, cuDNN, torch_npu,
  CANN), the float32 precision of matmuls, convolutions and RNNs per backend (TF32 on CUDA, HF32
  on Ascend, TF32/BF16 in oneDNN on the CPU), reduced-precision reductions of half GEMMs,
  deterministic-algorithm settings, the scaled-dot-product-attention backends enabled, and autocast;
* per call, :func:`fp32_mode`: the reduced float32 format a float32 matmul, convolution or RNN on a
  device type may compute in *now* (flags can change within a step: it is read at the call), which
  the dump writes into the call spec's ``modes`` so that the judgement's reference computes in the
  same mode (``replayer/reduced_fp32.py``).

Reading a flag never raises: a torch without one (or one that refuses the legacy spelling after the
new one was used) gives ``None`` for it, and ``fp32_mode`` falls back to the other spelling.
"""
from __future__ import annotations

import platform
import sys
from typing import Any, Callable, Dict, Optional

__all__ = ["arithmetic_environment", "fp32_mode", "FP32_FAMILIES", "effective_precision"]

#: the families of float32 computation whose precision a backend flag sets
FP32_FAMILIES = ("matmul", "conv", "rnn")

#: ``fp32_precision`` values that mean "a reduced format is allowed" (``ieee``: strict float32)
_REDUCED = ("tf32", "bf16")


def _read(get: Callable[[], Any]) -> Any:
    try:
        v = get()
    except Exception:  # noqa: BLE001 - a flag this torch lacks, or refuses to read: unknown
        return None
    return v if isinstance(v, (bool, int, float, str)) or v is None else str(v)


def _attr(path: str) -> Any:
    """``torch.<path>`` read safely (None when missing or refused)."""
    import torch

    def get() -> Any:
        obj: Any = torch
        for part in path.split("."):
            obj = getattr(obj, part)
        return obj() if callable(obj) else obj
    return _read(get)


def effective_precision(op: Optional[str], backend: Optional[str], top: Optional[str]) -> Optional[str]:
    """torch's ``fp32_precision`` inheritance: the op's own setting, else its backend's, else the
    global one; ``"none"`` (or unknown) defers upwards; all ``"none"``: ``"ieee"``. None when no level
    could be read (an older torch without the setting)."""
    if op is None and backend is None and top is None:
        return None
    for v in (op, backend, top):
        if v not in (None, "none"):
            return str(v)
    return "ieee"


def _precision(backend: str, op: str) -> Optional[str]:
    return effective_precision(_attr(f"backends.{backend}.{op}.fp32_precision"),
                               _attr(f"backends.{backend}.fp32_precision"), _attr("backends.fp32_precision"))


def _legacy_cuda(family: str) -> Optional[str]:
    """CUDA's float32 mode from the legacy flags (torch before ``fp32_precision``)."""
    if family == "matmul":
        tf32 = _attr("backends.cuda.matmul.allow_tf32")
        prec = _attr("get_float32_matmul_precision")
        if tf32 is None and prec is None:
            return None
        if prec == "medium":
            return "bf16"
        return "tf32" if tf32 or prec == "high" else "ieee"
    tf32 = _attr("backends.cudnn.allow_tf32")
    return None if tf32 is None else ("tf32" if tf32 else "ieee")


def _npu_hf32(family: str) -> Optional[bool]:
    """``torch.npu.matmul.allow_hf32`` / ``torch.npu.conv.allow_hf32`` where torch_npu is imported."""
    mod = sys.modules.get("torch_npu")
    if mod is None:
        return None
    import torch

    npu = getattr(torch, "npu", None)
    sub = getattr(npu, "matmul" if family == "matmul" else "conv", None)
    if sub is None:
        return None
    v = _read(lambda: sub.allow_hf32)
    return None if v is None else bool(v)


def fp32_mode(family: str, device_type: str) -> str:
    """The reduced format (``"tf32"``, ``"hf32"``, ``"bf16"``) a float32 ``family`` computation
    (``"matmul"``, ``"conv"``, ``"rnn"``) on ``device_type`` is allowed to use now, or ``""``
    (strict float32). Unknown device types and flags read as strict."""
    if device_type == "cuda":
        backend, op = ("cuda", "matmul") if family == "matmul" else ("cudnn", family)
        mode = _precision(backend, op)
        if mode is None:
            mode = _legacy_cuda(family)
    elif device_type == "cpu":
        mode = _precision("mkldnn", "matmul" if family == "matmul" else "conv" if family == "conv" else "rnn")
        # oneDNN computes float32 in bf16 on a CPU with AMX when asked; its TF32 runs only on
        # Intel GPUs (torch says so when it is set): a CPU computes a "tf32" call in float32
        return mode if mode == "bf16" else ""
    elif device_type == "npu":
        return "hf32" if family in ("matmul", "conv") and _npu_hf32(family) else ""
    else:
        return ""
    return mode if mode in _REDUCED else ""


def _versions() -> Dict[str, Any]:
    import numpy
    import torch

    out: Dict[str, Any] = {"python": platform.python_version(), "torch": str(torch.__version__),
                           "numpy": str(numpy.__version__),
                           "cuda": _attr("version.cuda"), "cudnn": _attr("backends.cudnn.version"),
                           "hip": _attr("version.hip")}
    npu = sys.modules.get("torch_npu")
    if npu is not None:
        out["torch_npu"] = _read(lambda: str(npu.__version__))
        out["cann"] = _read(lambda: str(npu.version.cann))
    return out


def _accelerator() -> Optional[Dict[str, Any]]:
    """The current accelerator (type, index, name, capability), or None on a CPU-only machine."""
    import torch

    acc = getattr(torch, "accelerator", None)
    try:
        if acc is None or not acc.is_available():
            return None
        dev = acc.current_accelerator()
    except Exception:  # noqa: BLE001 - a broken accelerator runtime reads as none
        return None
    if dev is None:
        return None
    kind = dev.type
    out: Dict[str, Any] = {"type": kind, "index": _read(lambda: acc.current_device_index())}
    mod = getattr(torch, kind, None)
    out["name"] = _read(lambda: mod.get_device_name()) if mod is not None else None
    if kind == "cuda":
        out["capability"] = _read(lambda: ".".join(map(str, torch.cuda.get_device_capability())))
    return out


def _autocast() -> Dict[str, Any]:
    import torch

    out: Dict[str, Any] = {}
    for kind in ("cpu", "cuda", "npu"):
        try:
            if torch.is_autocast_enabled(kind):
                out[kind] = str(torch.get_autocast_dtype(kind))
        except Exception:  # noqa: BLE001 - a device type this torch's autocast does not know
            continue
    return out


def arithmetic_environment() -> Dict[str, Any]:
    """The run's arithmetic environment as JSON-ready data (see the module docstring)."""
    acc = _accelerator()
    fp32: Dict[str, Any] = {}
    kinds = ["cpu"] + ([acc["type"]] if acc is not None and acc["type"] != "cpu" else [])
    for kind in kinds:
        fp32[kind] = {family: fp32_mode(family, kind) or "ieee" for family in FP32_FAMILIES}
    env: Dict[str, Any] = {
        "accelerator": acc,
        "versions": _versions(),
        "fp32": fp32,
        "flags": {
            "float32_matmul_precision": _attr("get_float32_matmul_precision"),
            "cuda.matmul.allow_bf16_reduced_precision_reduction":
                _attr("backends.cuda.matmul.allow_bf16_reduced_precision_reduction"),
            "cuda.matmul.allow_fp16_reduced_precision_reduction":
                _attr("backends.cuda.matmul.allow_fp16_reduced_precision_reduction"),
            "cudnn.enabled": _attr("backends.cudnn.enabled"),
            "cudnn.benchmark": _attr("backends.cudnn.benchmark"),
            "cudnn.deterministic": _attr("backends.cudnn.deterministic"),
            "mkldnn.enabled": _attr("backends.mkldnn.enabled"),
            "deterministic_algorithms": _attr("are_deterministic_algorithms_enabled"),
            "deterministic_warn_only": _attr("is_deterministic_algorithms_warn_only_enabled"),
        },
        "autocast": _autocast(),
    }
    if acc is not None and acc["type"] == "cuda":
        env["sdpa"] = {name: _attr(f"backends.cuda.{name}_sdp_enabled")
                       for name in ("flash", "mem_efficient", "math", "cudnn")}
    if acc is not None and acc["type"] == "npu":
        env["flags"]["npu.matmul.allow_hf32"] = _npu_hf32("matmul")
        env["flags"]["npu.conv.allow_hf32"] = _npu_hf32("conv")
    return env
