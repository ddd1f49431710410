"""The arithmetic environment a dump's manifest recorded, read back as data, and the differences
between a device's and a bench's in words.

The record (written by ``runtime/environment.py``) is a small JSON object: ``accelerator`` (type,
name, capability, or null), ``versions``, ``fp32`` (per device type, the format float32 matmuls,
convolutions and RNNs may compute in: ``ieee`` for strict float32, ``tf32``, ``hf32``, ``bf16``),
``flags`` (deterministic algorithms, cuDNN benchmark, reduced-precision reductions...), ``sdpa``
(the attention backends enabled), ``autocast`` and ``computed_on`` (the device types the dump's
matmuls and convolutions ran on). Anything else in the file is ignored; nothing in it is run.
No torch here.
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

__all__ = ["checked_environment", "fp32_words", "differences", "compute_device"]

_SCALARS = (str, int, float, bool, type(None))
_MAX_TEXT = 200
_FAMILY_WORDS = {"matmul": "matmuls", "conv": "convolutions", "rnn": "RNNs"}


def _clean(v: Any, depth: int) -> Any:
    if isinstance(v, _SCALARS):
        return v[:_MAX_TEXT] if isinstance(v, str) else v
    if isinstance(v, list) and depth > 0:
        return [_clean(x, depth - 1) for x in v[:16]]
    if isinstance(v, dict) and depth > 0:
        return {str(k)[:_MAX_TEXT]: _clean(x, depth - 1) for k, x in list(v.items())[:64]}
    return None


def checked_environment(raw: Any) -> Optional[Dict[str, Any]]:
    """The record as plain data (strings cut at 200 characters, at most three levels, 64 keys a
    level), or None when ``raw`` is not an object."""
    if not isinstance(raw, dict):
        return None
    out = _clean(raw, 3)
    return out if isinstance(out, dict) else None


def compute_device(env: Mapping[str, Any]) -> str:
    """The device type the dump's matmuls and convolutions ran on (``computed_on``; else the
    accelerator's, else ``cpu``)."""
    on = env.get("computed_on")
    if isinstance(on, list) and on:
        others = [d for d in on if d != "cpu" and isinstance(d, str)]
        return others[0] if others else "cpu"
    acc = env.get("accelerator")
    return str(acc.get("type")) if isinstance(acc, dict) and acc.get("type") else "cpu"


def fp32_words(env: Mapping[str, Any]) -> str:
    """``"TF32 convolutions allowed"``, ``"TF32 matmuls and convolutions allowed"`` or ``"strict
    float32"`` for the dump's compute device (``"float32 precision not recorded"`` when unknown)."""
    modes = env.get("fp32")
    mine = modes.get(compute_device(env)) if isinstance(modes, dict) else None
    if not isinstance(mine, dict):
        return "float32 precision not recorded"
    by_fmt: Dict[str, List[str]] = {}
    for family, words in _FAMILY_WORDS.items():
        fmt = mine.get(family)
        if isinstance(fmt, str) and fmt not in ("ieee", "", "none"):
            by_fmt.setdefault(fmt.upper(), []).append(words)
    if not by_fmt:
        return "strict float32"
    return "; ".join(f"{fmt} {' and '.join(fams)} allowed" for fmt, fams in by_fmt.items())


def _device_words(env: Mapping[str, Any]) -> str:
    kind = compute_device(env)
    acc = env.get("accelerator")
    if isinstance(acc, dict) and acc.get("type") == kind and kind != "cpu":
        name = acc.get("name") or kind
        cap = f", capability {acc['capability']}" if acc.get("capability") else ""
        return f"{name} ({kind}{cap})"
    return kind


def _flat(d: Any, prefix: str = "") -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = d
    return out


def differences(device: Optional[Mapping[str, Any]], bench: Optional[Mapping[str, Any]]) -> List[str]:
    """What differs between the device's and the bench's environment, one line each, most telling
    first (``"float32: device TF32 convolutions allowed; bench strict float32"``). Nothing when
    either is not recorded."""
    if not device or not bench:
        return []
    out: List[str] = []
    dw, bw = _device_words(device), _device_words(bench)
    if dw != bw:
        out.append(f"device: device {dw}; bench {bw}")
    fd, fb = fp32_words(device), fp32_words(bench)
    if fd != fb:
        out.append(f"float32: device {fd}; bench {fb}")
    for section in ("versions", "flags", "sdpa", "autocast"):
        a, b = _flat(device.get(section) or {}), _flat(bench.get(section) or {})
        for key in sorted(set(a) | set(b)):
            va, vb = a.get(key), b.get(key)
            if va != vb and not (section == "sdpa" and (va is None or vb is None)):
                out.append(f"{section} {key}: device {_word(va)}; bench {_word(vb)}")
    return out


def _word(v: Any) -> str:
    return "not recorded" if v is None else str(v)
