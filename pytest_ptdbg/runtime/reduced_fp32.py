"""Reduced float32 formats of matmuls, convolutions and RNNs: which APIs, which operands, and the
rounding itself.

A GPU with TF32 allowed (``torch.backends.cudnn.allow_tf32``, on by default for convolutions;
``torch.backends.cuda.matmul.allow_tf32`` / ``set_float32_matmul_precision("high")`` for matmuls)
rounds the float32 operands of a product to TF32 (10 explicit mantissa bits) and accumulates in
float32; an Ascend NPU with HF32 allowed (``torch.npu.conv.allow_hf32``, on by default) rounds them
to 11 bits; ``fp32_precision="bf16"`` (``set_float32_matmul_precision("medium")``) to bfloat16's 7.

:data:`FP32_APIS` names, per recorded API, its family (``runtime/environment.py`` reads the flag of
that family) and its product operands, by position and name (a bias is added in float32, not
rounded). :func:`round_mantissa` rounds a float32 tensor as the hardware does (to nearest, ties to
even; NaN, Inf and zeros kept). The capture records the mode allowed per call; the judgement's
reference replays a call in it (``replayer/engine.py``).
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

__all__ = ["FORMATS", "FP32_APIS", "Operands", "api_family", "round_mantissa", "format_words"]

#: reduced float32 format -> explicit mantissa bits kept
FORMATS: Dict[str, int] = {"tf32": 10, "hf32": 11, "bf16": 7}

#: the product operands of a call: ``(position, keyword name)`` pairs; None: every floating tensor
Operands = Optional[Tuple[Tuple[int, str], ...]]

_LINEAR = ((0, "input"), (1, "weight"))
_ADD_PRODUCT = {"addmm": ((1, "mat1"), (2, "mat2")), "addbmm": ((1, "batch1"), (2, "batch2")),
                "baddbmm": ((1, "batch1"), (2, "batch2")), "addmv": ((1, "mat"), (2, "vec"))}
_PRODUCTS = {"matmul": ((0, "input"), (1, "other")), "mm": ((0, "input"), (1, "mat2")),
             "bmm": ((0, "input"), (1, "mat2")), "mv": ((0, "input"), (1, "vec")),
             "inner": ((0, "input"), (1, "other")), "tensordot": ((0, "a"), (1, "b")),
             "einsum": None, "chain_matmul": None}
_CONVS = ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
_RNNS = ("lstm", "gru", "rnn_tanh", "rnn_relu", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell")


def _table() -> Dict[Tuple[str, str], Tuple[str, Operands]]:
    out: Dict[Tuple[str, str], Tuple[str, Operands]] = {}
    for kind in ("Torch", "Tensor"):
        for name, ops in {**_PRODUCTS, **_ADD_PRODUCT}.items():
            out[(kind, name)] = ("matmul", ops)
        for name in _ADD_PRODUCT:
            out[("Tensor", name + "_")] = ("matmul", _ADD_PRODUCT[name])
    out[("Tensor", "__matmul__")] = ("matmul", ((0, "self"), (1, "other")))
    out[("Tensor", "__rmatmul__")] = ("matmul", ((0, "self"), (1, "other")))
    out[("Functional", "linear")] = ("matmul", _LINEAR)
    out[("Functional", "bilinear")] = ("matmul", ((0, "input1"), (1, "input2"), (2, "weight")))
    out[("Functional", "scaled_dot_product_attention")] = ("matmul", ((0, "query"), (1, "key"), (2, "value")))
    for name in _CONVS:
        out[("Functional", name)] = ("conv", _LINEAR)
        out[("Torch", name)] = ("conv", _LINEAR)
    for name in _RNNS:
        out[("VF", name)] = ("rnn", None)
        out[("Torch", name)] = ("rnn", None)
    return out


#: (api type, api name) -> (family, product operands)
FP32_APIS: Dict[Tuple[str, str], Tuple[str, Operands]] = _table()


def api_family(api_type: str, api_name: str) -> Optional[str]:
    """``"matmul"``, ``"conv"`` or ``"rnn"`` for an API whose float32 precision a backend flag sets."""
    hit = FP32_APIS.get((api_type, api_name))
    return hit[0] if hit is not None else None


def format_words(fmt: str) -> str:
    """``"TF32 (float32 operands rounded to 10 mantissa bits)"``."""
    bits = FORMATS.get(fmt)
    return f"{fmt.upper()} (float32 operands rounded to {bits} mantissa bits)" if bits else fmt


def round_mantissa(t: Any, fmt: str) -> Any:
    """A float32 tensor ``t`` rounded to format ``fmt``'s mantissa (to nearest, ties to even), as a
    float32 tensor; NaN, Inf and signed zeros kept. Other dtypes are returned unchanged."""
    import torch

    if t.dtype != torch.float32:
        return t
    drop = 23 - FORMATS[fmt]
    bits = t.detach().contiguous().view(torch.int32)
    half = (1 << (drop - 1)) - 1
    lsb = (bits >> drop) & 1
    rounded = ((bits + half + lsb) >> drop) << drop
    out = rounded.view(torch.float32).reshape(t.shape)
    # NaN/Inf (exponent all ones) as they were; a finite value that rounds past the largest float32
    # becomes Inf, as the hardware's rounding does
    special = ~torch.isfinite(t.detach())
    return torch.where(special, t.detach(), out)
