"""The error every correct kernel of a call's algorithm family stays within (issue 22).

The budget's reference term (FACTOR x the CPU kernel's error) is calibrated on this CPU's kernels;
a device's correct kernel may sum in another order (sequential, blocked, split-K) or use another
algorithm (online softmax, Welford, Winograd, a libm within 2 ulp), whose error the CPU's does
not bound. :func:`kernel_bound` gives, for the families it knows from the API name and the call
spec, the bound :mod:`.budget` derives (:func:`budget.order_bound` over the reduction or
contraction length at the scale of the inputs' magnitudes, :func:`budget.libm_bound`), computed
in the compute dtype's accumulator; 0.0 for anything else (the budget is then as before).

The magnitude of a sum's partial sums, for data in an arrangement a kernel's fixed order does not
know about: the sum itself (same-sign terms) plus the spread of a random walk of its terms,
sqrt(sum of squared terms) (mixed signs); in L2 over the outputs, ‖oracle‖ plus (for ``C = A B``)
sqrt(sum_k ‖A[:, k]‖² ‖B[k, :]‖²), from column and row norms, or (for a sum) ‖x‖. This is a
probabilistic bound: an order chosen adversarially for the values could exceed it; no kernel's is.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Optional

import numpy as np

from pytest_ptdbg.judge import budget as B

__all__ = ["kernel_bound", "GEMMS", "REDUCTIONS", "LIBM"]

#: name -> (first operand, second operand, bias) argument positions
GEMMS = {"linear": (0, 1, 2), "matmul": (0, 1, None), "__matmul__": (0, 1, None), "__rmatmul__": (1, 0, None),
         "mm": (0, 1, None), "bmm": (0, 1, None), "addmm": (1, 2, 0), "baddbmm": (1, 2, 0),
         "conv1d": (0, 1, 2), "conv2d": (0, 1, 2), "conv3d": (0, 1, 2)}
#: sums whose outputs each add numel(input) / numel(output) terms
SUMS = {"sum": False, "nansum": False, "mean": True, "nanmean": True}
SOFTMAX = {"softmax": False, "_softmax": False, "log_softmax": True, "_log_softmax": True}
NORMS = {"layer_norm", "batch_norm", "group_norm", "rms_norm", "instance_norm"}
REDUCTIONS = set(SUMS) | set(SOFTMAX) | NORMS | {"cross_entropy"}
#: libm-style functions: correct kernels are within budget.LIBM_ULPS ulps (forward and backward)
LIBM = {"exp", "exp_", "exp2", "expm1", "log", "log_", "log1p", "log2", "log10", "tanh", "tanh_", "sigmoid",
        "sigmoid_", "gelu", "silu", "silu_", "mish", "softplus", "erf", "erfc", "erfinv", "sin", "cos", "tan",
        "rsqrt", "rsqrt_", "logsigmoid", "elu", "selu", "celu", "pow", "__pow__", "__rpow__", "atan", "asin",
        "acos", "sinh", "cosh", "asinh", "acosh", "atanh", "lgamma", "digamma", "logit", "hardswish"}


def _ref(spec: Mapping[str, Any], pos: Optional[int], name: str = "") -> Optional[str]:
    """The tensor key (``"input.1"``) of argument ``pos`` (or keyword ``name``), or None."""
    args, kw = spec.get("args") or [], spec.get("kwargs") or {}
    v = args[pos] if pos is not None and pos < len(args) else kw.get(name)
    if isinstance(v, dict) and isinstance(v.get("t"), str):
        return v["t"]
    return None


def _arg(spec: Mapping[str, Any], pos: int, name: str, default: Any = None) -> Any:
    args, kw = spec.get("args") or [], spec.get("kwargs") or {}
    return args[pos] if pos < len(args) else kw.get(name, default)


def kernel_bound(name: str, spec: Mapping[str, Any], arrays: Mapping[str, np.ndarray],
                 norm: Callable[[str], float], key: str, scale: float, dtype: str) -> float:
    """The error (L2) every correct kernel of API ``name`` stays within for output ``key``
    (``output.i`` or ``backward_output.i``) whose oracle has L2 norm ``scale``, in compute dtype
    ``dtype``; ``norm(k)``: the L2 norm of the call's array ``k``. 0.0: no family known."""
    try:
        return _bound(name, spec, arrays, norm, key, scale, B.accumulator_roundoff(dtype))
    except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError, OverflowError):
        return 0.0  # a shape or argument it does not understand: no extra bound


def _size(arrays: Mapping[str, np.ndarray], k: Optional[str]) -> int:
    return int(arrays[k].size) if k is not None and k in arrays else 0


def _bound(name: str, spec: Mapping[str, Any], arrays: Mapping[str, np.ndarray], norm: Callable[[str], float],
           key: str, scale: float, u: float) -> float:
    base = name
    backward = key.startswith("backward_")
    if base in LIBM:
        return B.libm_bound(scale, u)
    if base in GEMMS:
        return _gemm(base, spec, arrays, norm, key, u, backward, scale)
    if base in SUMS and not backward:
        x = _ref(spec, 0, "input")
        n = _size(arrays, x) // max(_size(arrays, key), 1)
        # partial sums: the output itself (same signs) plus a random walk's spread, ‖x‖ (mixed signs)
        spread = norm(x) if x else 0.0
        return B.order_bound(n, u, scale + (spread / n if SUMS[base] else spread))
    if base in SOFTMAX:
        return _softmax(base, spec, arrays, key, scale, u, backward)
    if base in NORMS and not backward:
        return _norm(base, spec, arrays, key, scale, u)
    if base == "cross_entropy" and not backward:
        x = _ref(spec, 0, "input")
        if x is None or x not in arrays or key not in arrays:
            return 0.0
        a = arrays[x]
        c = int(a.shape[1]) if a.ndim >= 2 else int(a.shape[0])
        rows = max(a.size // max(c, 1), 1)
        # each row's log-sum-exp (relative error of its sum: absolute error of its log), then the
        # mean or sum of the rows' losses (same-sign terms: partial sums within the result)
        return (B.order_bound(c, u, math.sqrt(max(arrays[key].size, 1)))
                + B.order_bound(rows if arrays[key].size == 1 else 1, u, scale))
    return 0.0


def _mm_spread(a: np.ndarray, b: np.ndarray) -> float:
    """sqrt(sum over the outputs of ``a @ b`` of the sum of its squared terms) (batched, broadcast):
    sum over k of ‖a[..., :, k]‖² ‖b[..., k, :]‖², from column and row norms."""
    a2 = np.square(np.asarray(a, dtype=np.float64)).sum(axis=-2)
    b2 = np.square(np.asarray(b, dtype=np.float64)).sum(axis=-1)
    with np.errstate(over="ignore", invalid="ignore"):
        tot = float(np.sum(a2 * b2)) if a2.ndim == 1 and b2.ndim == 1 else float(np.sum(np.broadcast_arrays(
            a2, b2)[0] * np.broadcast_arrays(a2, b2)[1]))
    return math.sqrt(tot) if math.isfinite(tot) else math.inf


def _conv_spread(x: np.ndarray, w: np.ndarray, g: Optional[np.ndarray], slot: str) -> float:
    """:func:`_mm_spread` of a convolution (groups 1): forward sum over channels of ‖x[:, c]‖² x
    ‖w[:, c]‖²; input gradient sum over k of ‖g[:, k]‖² ‖w[k]‖²; weight gradient, with each
    gradient element meeting an average input element, sum over n, k, c of ‖g[n, k]‖² ‖x[n, c]‖² x
    taps / positions."""
    xx = np.square(np.asarray(x, dtype=np.float64))
    ww = np.square(np.asarray(w, dtype=np.float64))
    if w.shape[1] != x.shape[1]:
        raise ValueError("grouped convolution")
    if slot == "output":
        return math.sqrt(float(np.sum(xx.sum(axis=tuple(i for i in range(xx.ndim) if i != 1))
                                      * ww.sum(axis=tuple(i for i in range(ww.ndim) if i != 1)))))
    assert g is not None
    gg = np.square(np.asarray(g, dtype=np.float64))
    spatial = tuple(range(2, gg.ndim))
    if slot == "input":
        return math.sqrt(float(np.sum(gg.sum(axis=(0,) + spatial) * ww.reshape(ww.shape[0], -1).sum(axis=1))))
    g_nk, x_nc = gg.sum(axis=spatial), xx.sum(axis=tuple(range(2, xx.ndim)))
    taps = int(np.prod(w.shape[2:]))
    pos = max(int(np.prod(x.shape[2:])), 1)
    return math.sqrt(float(np.sum(g_nk[:, :, None] * x_nc[:, None, :])) * taps / pos)


def _gemm(base: str, spec: Mapping[str, Any], arrays: Mapping[str, np.ndarray], norm: Callable[[str], float],
          key: str, u: float, backward: bool, scale: float) -> float:
    """Each output sums K products (any order: split-K, blocked, Winograd). The magnitude of an
    output's partial sums: its own value (same-sign terms) plus the spread of a random walk of its
    terms, sqrt(sum of squared terms) (mixed signs); in L2 over the outputs, ``scale`` plus
    :func:`_mm_spread`."""
    ia, ib, ibias = GEMMS[base]
    conv = base.startswith("conv")
    a = _ref(spec, ia, "input")
    b = _ref(spec, ib, "weight" if base == "linear" or conv else "mat2" if base in ("addmm", "baddbmm") else "other")
    if a is None or b is None or a not in arrays or b not in arrays:
        return 0.0
    xa, xb = arrays[a], arrays[b]
    if xa.ndim < (1 if base == "linear" else 2) or xb.ndim < 2:
        return 0.0
    idx = key.split(".", 1)[1]
    slot = "output" if not backward else f"input.{idx}"
    g = arrays.get("backward_input.0") if backward else None
    if backward and g is None:
        return 0.0
    units = B.ORDER_UNITS
    if conv:
        taps = int(np.prod(xb.shape[2:])) if xb.ndim > 2 else 1
        if taps == 9:
            units *= B.WINOGRAD_UNITS
        k = int(xb.size // max(xb.shape[0], 1))
        if slot == "output":
            return B.order_bound(k, u, scale + _conv_spread(xa, xb, None, "output"), units)
        out = _size(arrays, "output.0")
        if slot == a:
            return B.order_bound(out * k // max(xa.size, 1), u, scale + _conv_spread(xa, xb, g, "input"), units)
        if slot == b:
            return B.order_bound(out * k // max(xb.size, 1), u, scale + _conv_spread(xa, xb, g, "weight"), units)
    else:
        if base == "linear":   # x @ W.T over rows
            mat_a, mat_b = xa.reshape(-1, xa.shape[-1]), xb.T
        elif base == "__rmatmul__":
            mat_a, mat_b = xa, xb
        else:
            mat_a, mat_b = xa, xb
        k = int(mat_a.shape[-1])
        if slot == "output":
            return B.order_bound(k, u, scale + _mm_spread(mat_a, mat_b), units)
        assert g is not None
        gm = g.reshape(-1, g.shape[-1]) if base == "linear" else g
        if slot == a:      # dA = G @ B^T, over B's outputs
            return B.order_bound(int(mat_b.shape[-1]), u, scale + _mm_spread(gm, np.swapaxes(mat_b, -1, -2)), units)
        if slot == b:      # dB = A^T @ G, over A's rows
            return B.order_bound(int(np.prod(mat_a.shape[:-1])) // max(int(np.prod(mat_b.shape[:-2])), 1), u,
                                 scale + _mm_spread(np.swapaxes(mat_a, -1, -2), gm), units)
    bias = _ref(spec, ibias, "bias") if ibias is not None else None
    if backward and bias is not None and slot == bias and g is not None:
        n = g.size // max(_size(arrays, bias), 1)
        return B.order_bound(n, u, scale + norm("backward_input.0"), units)
    return 0.0


def _dim(spec: Mapping[str, Any], ndim: int) -> Optional[int]:
    d = _arg(spec, 1, "dim")
    if not isinstance(d, int) or ndim == 0:
        return None
    return d % ndim


def _rows(a: np.ndarray, dim: int) -> np.ndarray:
    return np.moveaxis(np.asarray(a, dtype=np.float64), dim, -1).reshape(-1, a.shape[dim])


def _finite_norm(v: np.ndarray) -> float:
    v = v[np.isfinite(v)]
    return float(np.linalg.norm(v)) if v.size else 0.0


def _softmax(base: str, spec: Mapping[str, Any], arrays: Mapping[str, np.ndarray], key: str, scale: float,
             u: float, backward: bool) -> float:
    log = SOFTMAX[base]
    y = arrays.get("output.0")
    if y is None:
        return 0.0
    dim = _dim(spec, y.ndim)
    if dim is None:
        return 0.0
    n = int(y.shape[dim])
    if not backward:
        # the sum of exp (positive terms) to a relative error; log-softmax: that error absolutely
        return B.order_bound(n, u, math.sqrt(y.size) if log else scale)
    g = arrays.get("backward_input.0")
    if g is None or g.shape != y.shape:
        return 0.0
    p = _rows(np.exp(y) if log else y, dim)
    gr = _rows(g, dim)
    with np.errstate(invalid="ignore", over="ignore"):
        # dx = y (g - sum g y) or g - p sum g: the row's sum, to its sum of |terms|, times the row's p
        s = np.nansum(np.abs(gr) if log else np.abs(gr * p), axis=1)
        mag = _finite_norm(np.sqrt(np.nansum(p * p, axis=1)) * s)
    return B.order_bound(n, u, mag)


def _norm(base: str, spec: Mapping[str, Any], arrays: Mapping[str, np.ndarray], key: str, scale: float,
          u: float) -> float:
    x = _ref(spec, 0, "input")
    if x is None or x not in arrays or key != "output.0":
        return 0.0
    a = np.asarray(arrays[x], dtype=np.float64)
    if base == "layer_norm" or base == "rms_norm":
        shape = _arg(spec, 1, "normalized_shape")
        shape = shape.get("tuple", shape.get("size")) if isinstance(shape, dict) else shape
        k = len(shape) if isinstance(shape, (list, tuple)) else 1
        rows = a.reshape(-1, int(np.prod(a.shape[a.ndim - k:])))
    elif base == "group_norm":
        groups = _arg(spec, 1, "num_groups")
        rows = a.reshape(a.shape[0] * int(groups), -1)
    elif base == "instance_norm":
        rows = a.reshape(a.shape[0] * a.shape[1], -1)
    else:  # batch_norm: per channel
        if not _arg(spec, 5, "training", False):
            return 0.0  # running statistics: no reduction
        rows = np.moveaxis(a, 1, 0).reshape(a.shape[1], -1)
    n = rows.shape[1]
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        rms = np.sqrt(np.mean(rows * rows, axis=1))
        std = rms if base == "rms_norm" else np.std(rows, axis=1)
        kappa = np.where(std > 0, rms / std, 1.0)    # the mean's error is amplified by |mean| / std
        k_eff = float(np.sqrt(np.mean(kappa[np.isfinite(kappa)] ** 2))) if np.isfinite(kappa).any() else 1.0
    # the statistics to a relative error (positive sums) at the scale of the output, amplified by kappa
    return B.order_bound(n, u, (1.0 + k_eff) * scale)
