"""The math modes a recorded call ran under, read from its call spec as data: :class:`MathModes`.

The capture records (``dump/call_spec.py``: :func:`~pytest_ptdbg.dump.call_spec.math_modes`) the
modes that change what a *correct* kernel computes: autocast's dtype on the call's device type
(PyTorch's own LSTM under bf16 autocast computes its gates in bf16 although its outputs are
float32), oneDNN switched off (a CPU without bf16 instructions has no oneDNN bf16 LSTM), and the
reduced float32 format (TF32, HF32, BF16) a matmul or convolution was allowed. The judgement's
reference replays under them. Each value is checked against a fixed table: a crafted
spec is refused, never run. No torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from pytest_ptdbg.errors import ReplayRefused
from pytest_ptdbg.runtime.reduced_fp32 import FORMATS

__all__ = ["AUTOCAST_DTYPES", "MathModes", "recorded_modes"]

#: autocast dtypes a call spec may name
AUTOCAST_DTYPES = ("torch.bfloat16", "torch.float16")


@dataclass(frozen=True)
class MathModes:
    """What the device's call ran under: ``autocast`` (``"torch.bfloat16"``, ``"torch.float16"`` or
    ``""``: off), ``mkldnn`` (False: oneDNN was switched off) and ``fp32`` (``"tf32"``, ``"hf32"``,
    ``"bf16"``: the reduced format its device's flags allowed a float32 matmul, convolution or RNN
    to compute in; ``""``: strict float32)."""

    autocast: str = ""
    mkldnn: bool = True
    fp32: str = ""


def recorded_modes(spec: Mapping[str, Any], api: str) -> MathModes:
    """The modes of the call spec ``spec`` of record ``api`` (its optional ``"modes"``; none: the
    defaults). Raises ReplayRefused naming the record and the field for anything else."""
    raw = spec.get("modes")
    if raw is None:
        return MathModes()
    if not isinstance(raw, Mapping) or not set(raw) <= {"autocast", "mkldnn", "fp32"}:
        raise ReplayRefused(api, f"'modes' of the call spec is not a known set of modes: {str(raw)[:80]}", "modes")
    autocast, mkldnn, fp32 = raw.get("autocast", ""), raw.get("mkldnn", True), raw.get("fp32", "")
    if autocast not in ("", *AUTOCAST_DTYPES) or type(mkldnn) is not bool or fp32 not in ("", *FORMATS):
        raise ReplayRefused(api, f"'modes' of the call spec names an unknown mode: {str(raw)[:80]}", "modes")
    return MathModes(autocast, mkldnn, fp32)
