"""Correct alternative kernels, planted below capture: a device that computes right, but otherwise.

A real device (a CUDA GPU, an Ascend NPU) computes correctly but not as this CPU does: other
summation orders, other algorithms. :class:`AltKernels` is a ``TorchFunctionMode`` entered
*before* ``debugger.start()`` (as ``planting.BelowCapture``): the debugger records each call under
its own API name with its true inputs, and the call it forwards returns what the alternative
kernel computes. Families (:data:`FAMILIES`):

* ``splitk``: GEMMs (``linear``, ``matmul``, ``mm``, ``bmm``, ``addmm``) with K split into chunks,
  each partial product accumulated in the compute dtype's accumulator (float32 for bf16/fp16) and
  the partials added left to right; ``linear`` and ``matmul`` also split K in their gradients;
* ``seqsum``: ``sum``/``mean`` as blocked left-to-right sums (blocks of 8 summed sequentially, then
  the block totals sequentially), not pairwise;
* ``online_softmax``: ``softmax``/``log_softmax`` flash-style, block by block with a running max;
* ``welford``: ``layer_norm``/``batch_norm`` (training) statistics by blockwise Welford (Chan's merge);
* ``winograd``: 3x3, stride-1, ungrouped ``conv2d`` by Winograd F(2x2, 3x3), transforms in float32;
* ``adamw``: the optimizer's ``addcdiv_``/``lerp_``/``addcmul_`` in another association
  (``p + (v*a)/b`` for ``p + v*(a/b)``, ``p*(1-w) + e*w`` for ``p + w*(e-p)``...);
* ``libm``: ``exp``, ``log``, ``tanh``, ``sigmoid``, ``rsqrt``, ``gelu``, ``silu`` within 2 ulp:
  the float64 value perturbed by a deterministic uniform [-1.5, 1.5] ulp of float32 and rounded
  (half-precision outputs are rounded from that float32 value, as such kernels compute).

Every kernel computes on inputs cast to the compute dtype of the CPU's kernel (the dtype of its
result: bf16 under autocast for a GEMM) and returns a result of that dtype and shape. Forward-only
kernels keep the CPU kernel's backward (its graph is built, its values replaced). Calls the
debugger makes while it works are isolated from torch-function modes (``capture/isolation.py``).
:func:`self_test` checks each kernel against float64 next to the CPU kernel.
"""
from __future__ import annotations

import math
import zlib
from collections import Counter
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from benchmarks.faults.planting import Replace

__all__ = ["FAMILIES", "AltKernels", "family_of", "self_test", "FAMILY_APIS"]

T = torch.Tensor
_LOW = (torch.bfloat16, torch.float16)


class _Decline(Exception):
    """The alternative kernel does not cover this call: the CPU kernel runs."""


def _acc(dtype: torch.dtype) -> torch.dtype:
    """The accumulator of a compute dtype: float32 for half precisions."""
    return torch.float32 if dtype in _LOW else dtype


def _floating(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point()


def _forward_only(func: Callable, args: tuple, kwargs: dict, alt: Callable[[torch.dtype], T]) -> T:
    out = func(*args, **kwargs)
    if not isinstance(out, torch.Tensor) or not out.is_floating_point():
        raise _Decline()
    with torch.no_grad(), torch.autocast("cpu", enabled=False):
        val = alt(out.dtype)
    if val.shape != out.shape:
        raise _Decline()
    val = val.to(out.dtype)
    return Replace.apply(out, val) if out.requires_grad else val


# ----------------------------------------------------------------------------- sums


def blocked_sum(x: T, block: int = 8) -> T:
    """The sum over the last axis, left to right in blocks of ``block``, then the block totals left
    to right, in ``x``'s dtype (the caller gives the accumulator's)."""
    n = x.shape[-1]
    if n == 0:
        return x.sum(-1)
    nb = -(-n // block)
    pad = nb * block - n
    if pad:
        x = torch.cat([x, x.new_zeros(x.shape[:-1] + (pad,))], -1)
    xb = x.reshape(x.shape[:-1] + (nb, block))
    s = xb[..., 0]
    for j in range(1, block):
        s = s + xb[..., j]
    t = s[..., 0]
    for i in range(1, nb):
        t = t + s[..., i]
    return t


def _dims(dim: Any, ndim: int) -> List[int]:
    if dim is None:
        return list(range(ndim))
    if isinstance(dim, int):
        dim = [dim]
    return sorted({d % max(ndim, 1) for d in dim})


def _reduce_last(x: T, dims: Sequence[int]) -> Tuple[T, List[int]]:
    """``x`` with ``dims`` moved last and flattened into one axis; the kept shape."""
    keep = [d for d in range(x.ndim) if d not in dims]
    xp = x.permute(keep + list(dims))
    kept = [x.shape[d] for d in keep]
    return xp.reshape(kept + [-1]), kept


def _sum_kernel(mean: bool) -> Callable:
    def kernel(func: Callable, args: tuple, kwargs: dict) -> T:
        x = args[0]
        rest = list(args[1:])
        dim = kwargs.get("dim", rest.pop(0) if rest else None)
        keepdim = kwargs.get("keepdim", rest.pop(0) if rest else False)
        if not _floating(x) or kwargs.get("dtype") is not None or rest or x.ndim == 0:
            raise _Decline()

        def alt(dt: torch.dtype) -> T:
            dims = _dims(dim, x.ndim)
            xr, kept = _reduce_last(x.to(dt).to(_acc(dt)), dims)
            s = blocked_sum(xr)
            if mean:
                s = s / xr.shape[-1]
            s = s.reshape(kept)
            if keepdim:
                for d in dims:
                    s = s.unsqueeze(d)
            return s.to(dt)
        return _forward_only(func, args, kwargs, alt)
    return kernel


# ---------------------------------------------------------------------------- split-K


def splitk_acc(a: T, b: T, chunk: int = 16) -> T:
    """``a @ b`` with K split into chunks of ``chunk`` (at least two chunks), each in ``a``'s dtype
    (the accumulator), the partials added left to right."""
    k = a.shape[-1]
    c = max(1, min(chunk, k // 2 if k > 1 else 1))
    out = None
    for i in range(0, k, c):
        p = torch.matmul(a[..., i:i + c], b[..., i:i + c, :])
        out = p if out is None else out + p
    assert out is not None
    return out


def _sum_to(g: T, shape: torch.Size) -> T:
    """``g`` summed (blocked, sequential) over its broadcast dimensions down to ``shape``."""
    lead = g.ndim - len(shape)
    dims = list(range(lead)) + [lead + i for i, s in enumerate(shape) if s == 1 and g.shape[lead + i] != 1]
    if not dims:
        return g
    r, kept = _reduce_last(g, dims)
    s = blocked_sum(r)
    full = [g.shape[d] for d in range(g.ndim) if d not in dims]
    assert list(full) == kept
    return s.reshape([shape[i] if (lead + i) not in dims else 1 for i in range(len(shape))]) \
        if len(shape) else s.reshape(())


class _SplitKMatmul(torch.autograd.Function):
    """``a @ b (+ bias)`` by split-K, forward and gradients, in ``cdt`` (accumulated in its
    accumulator, rounded once to ``cdt``); gradients returned in the inputs' dtypes."""

    @staticmethod
    def forward(ctx, a, b, bias, cdt):  # type: ignore[override]
        acc = _acc(cdt)
        ctx.save_for_backward(a, b)
        ctx.cdt, ctx.has_bias = cdt, bias is not None
        ctx.bias_meta = (bias.shape, bias.dtype) if bias is not None else None
        with torch._C.DisableTorchFunction(), torch.autocast("cpu", enabled=False):
            y = splitk_acc(a.to(cdt).to(acc), b.to(cdt).to(acc))
            if bias is not None:
                y = y + bias.to(cdt).to(acc)
            return y.to(cdt)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        a, b = ctx.saved_tensors
        cdt = ctx.cdt
        acc = _acc(cdt)
        ga = gb = gbias = None
        with torch._C.DisableTorchFunction(), torch.no_grad(), torch.autocast("cpu", enabled=False):
            g2 = g.to(cdt).to(acc)
            a2, b2 = a.to(cdt).to(acc), b.to(cdt).to(acc)
            if ctx.needs_input_grad[0]:
                ga = _sum_to(splitk_acc(g2, b2.transpose(-1, -2)), a.shape).to(cdt).to(a.dtype)
            if ctx.needs_input_grad[1]:
                gb = _sum_to(splitk_acc(a2.transpose(-1, -2), g2), b.shape).to(cdt).to(b.dtype)
            if ctx.has_bias and ctx.needs_input_grad[2]:
                shape, dt = ctx.bias_meta
                gbias = _sum_to(g2, shape).to(cdt).to(dt)
        return ga, gb, gbias, None


def _compute_dtype(func: Callable, args: tuple, kwargs: dict) -> torch.dtype:
    with torch.no_grad():
        out = func(*[a.detach() if isinstance(a, torch.Tensor) else a for a in args], **kwargs)
    if not isinstance(out, torch.Tensor) or not out.is_floating_point():
        raise _Decline()
    return out.dtype


def _linear(func: Callable, args: tuple, kwargs: dict) -> T:
    x = args[0]
    w = args[1] if len(args) > 1 else kwargs.get("weight")
    b = args[2] if len(args) > 2 else kwargs.get("bias")
    if not (_floating(x) and _floating(w)) or x.ndim < 1 or w.ndim != 2:
        raise _Decline()
    cdt = _compute_dtype(func, args, kwargs)
    if x.ndim == 1:
        raise _Decline()
    return _SplitKMatmul.apply(x, w.t(), b, cdt)


def _matmul(func: Callable, args: tuple, kwargs: dict) -> T:
    a, b = args[0], (args[1] if len(args) > 1 else kwargs.get("other"))
    if not (_floating(a) and _floating(b)) or a.ndim < 2 or b.ndim < 2 or kwargs.get("out") is not None:
        raise _Decline()
    cdt = _compute_dtype(func, args, kwargs)
    return _SplitKMatmul.apply(a, b, None, cdt)


def _addmm(func: Callable, args: tuple, kwargs: dict) -> T:
    if len(args) != 3 or kwargs.get("beta", 1) != 1 or kwargs.get("alpha", 1) != 1 or kwargs.get("out") is not None:
        raise _Decline()
    bias, m1, m2 = args

    def alt(dt: torch.dtype) -> T:
        acc = _acc(dt)
        return (splitk_acc(m1.to(dt).to(acc), m2.to(dt).to(acc)) + bias.to(dt).to(acc)).to(dt)
    return _forward_only(func, args, kwargs, alt)


# ---------------------------------------------------------------------------- softmax


def online_softmax(x: T, log: bool, block: int = 8) -> T:
    """Softmax (or log-softmax) over the last axis of ``x`` (the accumulator's dtype) block by
    block with a running max and a rescaled running sum, as flash-style kernels do."""
    n = x.shape[-1]
    m = x[..., :block].amax(-1)
    lsum = torch.zeros_like(m)
    for i in range(0, n, block):
        xb = x[..., i:i + block]
        m_new = torch.maximum(m, xb.amax(-1))
        scale = torch.exp(torch.where(torch.isinf(m) & (m == m_new), torch.zeros_like(m), m - m_new))
        lsum = lsum * scale + blocked_sum(torch.exp(xb - m_new.unsqueeze(-1)), block)
        m = m_new
    if log:
        return x - m.unsqueeze(-1) - torch.log(lsum).unsqueeze(-1)
    return torch.exp(x - m.unsqueeze(-1)) / lsum.unsqueeze(-1)


def _softmax_kernel(log: bool) -> Callable:
    def kernel(func: Callable, args: tuple, kwargs: dict) -> T:
        x = args[0]
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        if not _floating(x) or not isinstance(dim, int) or x.ndim == 0:
            raise _Decline()

        def alt(dt: torch.dtype) -> T:
            xs = x.to(dt).to(_acc(dt)).movedim(dim, -1)
            return online_softmax(xs, log).movedim(-1, dim).to(dt)
        return _forward_only(func, args, kwargs, alt)
    return kernel


# ---------------------------------------------------------------------------- Welford


def welford(x: T, block: int = 8) -> Tuple[T, T]:
    """(mean, biased variance) over the last axis by blocks of ``block`` merged with Chan's update."""
    n = x.shape[-1]
    mean = torch.zeros(x.shape[:-1], dtype=x.dtype)
    m2 = torch.zeros_like(mean)
    cnt = 0
    for i in range(0, n, block):
        xb = x[..., i:i + block]
        nb = xb.shape[-1]
        bm = blocked_sum(xb, block) / nb
        bm2 = blocked_sum((xb - bm.unsqueeze(-1)) ** 2, block)
        tot = cnt + nb
        delta = bm - mean
        mean = mean + delta * (nb / tot)
        m2 = m2 + bm2 + delta * delta * (cnt * nb / tot)
        cnt = tot
    return mean, m2 / n


def _layer_norm(func: Callable, args: tuple, kwargs: dict) -> T:
    names = ("input", "normalized_shape", "weight", "bias", "eps")
    a = dict(zip(names, args))
    a.update(kwargs)
    x, shape = a["input"], a.get("normalized_shape")
    w, b, eps = a.get("weight"), a.get("bias"), a.get("eps", 1e-5)
    if not _floating(x) or shape is None:
        raise _Decline()
    k = len(tuple(shape))

    def alt(dt: torch.dtype) -> T:
        acc = _acc(dt)
        xr = x.to(acc).reshape(tuple(x.shape[:x.ndim - k]) + (-1,))
        mean, var = welford(xr)
        y = (xr - mean.unsqueeze(-1)) * torch.rsqrt(var.unsqueeze(-1) + eps)
        y = y.reshape(x.shape)
        if w is not None:
            y = y * w.to(acc)
        if b is not None:
            y = y + b.to(acc)
        return y.to(dt)
    return _forward_only(func, args, kwargs, alt)


def _batch_norm(func: Callable, args: tuple, kwargs: dict) -> T:
    names = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps")
    a = dict(zip(names, args))
    a.update(kwargs)
    x = a["input"]
    if not _floating(x) or not a.get("training", False) or x.ndim < 2:
        raise _Decline()
    w, b, eps = a.get("weight"), a.get("bias"), a.get("eps", 1e-5)

    def alt(dt: torch.dtype) -> T:
        acc = _acc(dt)
        xr, _ = _reduce_last(x.to(acc), [d for d in range(x.ndim) if d != 1])
        mean, var = welford(xr)
        shape = [1, x.shape[1]] + [1] * (x.ndim - 2)
        y = (x.to(acc) - mean.reshape(shape)) * torch.rsqrt(var.reshape(shape) + eps)
        if w is not None:
            y = y * w.to(acc).reshape(shape)
        if b is not None:
            y = y + b.to(acc).reshape(shape)
        return y.to(dt)
    return _forward_only(func, args, kwargs, alt)


# ---------------------------------------------------------------------------- Winograd

_BT = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]
_G = [[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]]
_AT = [[1, 1, 1, 0], [0, 1, -1, -1]]


def winograd_conv3x3(x: T, w: T, bias: Optional[T], pad: Tuple[int, int]) -> T:
    """A stride-1 3x3 convolution by Winograd F(2x2, 3x3), in ``x``'s dtype throughout."""
    dt = x.dtype
    bt, g, at = (torch.tensor(m, dtype=dt) for m in (_BT, _G, _AT))
    x = F.pad(x, (pad[1], pad[1], pad[0], pad[0]))
    n, c, h, wd = x.shape
    ho, wo = h - 2, wd - 2
    th, tw = -(-ho // 2), -(-wo // 2)
    x = F.pad(x, (0, 2 * tw + 2 - wd, 0, 2 * th + 2 - h))
    d = x.unfold(2, 4, 2).unfold(3, 4, 2)                       # n c th tw 4 4
    v = torch.einsum("ai,nctwij,bj->nctwab", bt, d, bt)
    u = torch.einsum("ai,kcij,bj->kcab", g, w.to(dt), g)
    m = torch.einsum("kcab,nctwab->nktwab", u, v)
    y = torch.einsum("ia,nktwab,jb->nktwij", at, m, at)          # n k th tw 2 2
    y = y.permute(0, 1, 2, 4, 3, 5).reshape(n, w.shape[0], 2 * th, 2 * tw)[:, :, :ho, :wo]
    if bias is not None:
        y = y + bias.to(dt).reshape(1, -1, 1, 1)
    return y


def _pair(v: Any) -> Optional[Tuple[int, int]]:
    if isinstance(v, int):
        return (v, v)
    if isinstance(v, (tuple, list)) and len(v) == 2 and all(isinstance(i, int) for i in v):
        return (int(v[0]), int(v[1]))
    return None


def _conv2d(func: Callable, args: tuple, kwargs: dict) -> T:
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    a = dict(zip(names, args))
    a.update(kwargs)
    x, w, b = a["input"], a.get("weight"), a.get("bias")
    pad = _pair(a.get("padding", 0)) if a.get("padding", 0) != "same" else (1, 1)
    if (not _floating(x) or not _floating(w) or x.ndim != 4 or tuple(w.shape[2:]) != (3, 3) or pad is None
            or _pair(a.get("stride", 1)) != (1, 1) or _pair(a.get("dilation", 1)) != (1, 1)
            or a.get("groups", 1) != 1):
        raise _Decline()

    def alt(dt: torch.dtype) -> T:
        acc = _acc(dt)
        return winograd_conv3x3(x.to(dt).to(acc), w.to(dt).to(acc), None if b is None else b.to(dt).to(acc),
                                pad).to(dt)
    return _forward_only(func, args, kwargs, alt)


# ---------------------------------------------------------------------------- AdamW ops


def _inplace(compute: Callable[..., T]) -> Callable:
    def kernel(func: Callable, args: tuple, kwargs: dict) -> T:
        p = args[0]
        if not _floating(p) or p.requires_grad and torch.is_grad_enabled():
            raise _Decline()
        with torch.no_grad():
            val = compute(*args, **kwargs)
            if val is None or val.shape != p.shape:
                raise _Decline()
            p.copy_(val.to(p.dtype))
        return p
    return kernel


def _addcdiv(p: T, t1: T, t2: T, value: float = 1.0) -> T:
    return p + (value * t1) / t2                   # the CPU: p + value * (t1 / t2)


def _addcmul(p: T, t1: T, t2: T, value: float = 1.0) -> T:
    return p + (value * t1) * t2                   # the CPU: p + value * (t1 * t2)


def _lerp(p: T, end: T, weight: Any) -> Optional[T]:
    if not isinstance(weight, (int, float)):
        return None
    return p * (1.0 - weight) + end * weight       # the CPU: p + weight * (end - p)


# ---------------------------------------------------------------------------- libm


def _ulp32(x: T) -> T:
    """The spacing of float32 at float64 values ``x`` (subnormal spacing below the normal range)."""
    _, e = torch.frexp(x.abs().clamp_min(torch.finfo(torch.float32).tiny))
    return torch.ldexp(torch.ones_like(x), e - 24)


_CALLS: Counter = Counter()


def _libm_kernel(exact: Callable[[T], T], name: str) -> Callable:
    def kernel(func: Callable, args: tuple, kwargs: dict) -> T:
        x = args[0]
        if not _floating(x) or len(args) > 1 or any(k != "approximate" or v != "none" for k, v in kwargs.items()):
            raise _Decline()

        def alt(dt: torch.dtype) -> T:
            src = x.to(dt) if dt in _LOW else x
            y = exact(src.double())
            _CALLS[name] += 1
            gen = torch.Generator().manual_seed(zlib.crc32(f"{name}{_CALLS[name]}".encode()) & 0x7FFFFFFF)
            delta = (torch.rand(y.shape, generator=gen, dtype=torch.float64) * 3.0 - 1.5) * _ulp32(y)
            y = torch.where(torch.isfinite(y), y + delta, y)
            return y.to(torch.float32).to(dt)
        return _forward_only(func, args, kwargs, alt)
    return kernel


def _gelu64(x: T) -> T:
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


# ---------------------------------------------------------------------------- the table

#: family -> [(API prefix as the dump names it, callable getter, kernel)]
_TABLE: Dict[str, List[Tuple[str, Callable[[], Any], Callable]]] = {
    "splitk": [("Functional_linear", lambda: F.linear, _linear),
               ("Torch_matmul", lambda: torch.matmul, _matmul), ("Tensor_matmul", lambda: T.matmul, _matmul),
               ("Tensor___matmul__", lambda: T.__matmul__, _matmul),
               ("Torch_mm", lambda: torch.mm, _matmul), ("Torch_bmm", lambda: torch.bmm, _matmul),
               ("Torch_addmm", lambda: torch.addmm, _addmm)],
    "seqsum": [("Torch_sum", lambda: torch.sum, _sum_kernel(False)),
               ("Tensor_sum", lambda: T.sum, _sum_kernel(False)),
               ("Torch_mean", lambda: torch.mean, _sum_kernel(True)),
               ("Tensor_mean", lambda: T.mean, _sum_kernel(True))],
    "online_softmax": [("Functional_softmax", lambda: F.softmax, _softmax_kernel(False)),
                       ("Torch_softmax", lambda: torch.softmax, _softmax_kernel(False)),
                       ("Tensor_softmax", lambda: T.softmax, _softmax_kernel(False)),
                       ("Functional_log_softmax", lambda: F.log_softmax, _softmax_kernel(True)),
                       ("Torch_log_softmax", lambda: torch.log_softmax, _softmax_kernel(True)),
                       ("Tensor_log_softmax", lambda: T.log_softmax, _softmax_kernel(True))],
    "welford": [("Functional_layer_norm", lambda: F.layer_norm, _layer_norm),
                ("Functional_batch_norm", lambda: F.batch_norm, _batch_norm)],
    "winograd": [("Functional_conv2d", lambda: F.conv2d, _conv2d)],
    "adamw": [("Tensor_addcdiv_", lambda: T.addcdiv_, _inplace(_addcdiv)),
              ("Tensor_addcmul_", lambda: T.addcmul_, _inplace(_addcmul)),
              ("Tensor_lerp_", lambda: T.lerp_, _inplace(_lerp))],
    "libm": [(f"{kind}_{name}", get, _libm_kernel(ex, name)) for kind, name, get, ex in [
        ("Torch", "exp", lambda: torch.exp, torch.exp), ("Tensor", "exp", lambda: T.exp, torch.exp),
        ("Torch", "log", lambda: torch.log, torch.log), ("Tensor", "log", lambda: T.log, torch.log),
        ("Torch", "tanh", lambda: torch.tanh, torch.tanh), ("Tensor", "tanh", lambda: T.tanh, torch.tanh),
        ("Torch", "sigmoid", lambda: torch.sigmoid, torch.sigmoid),
        ("Tensor", "sigmoid", lambda: T.sigmoid, torch.sigmoid),
        ("Torch", "rsqrt", lambda: torch.rsqrt, torch.rsqrt), ("Tensor", "rsqrt", lambda: T.rsqrt, torch.rsqrt),
        ("Functional", "gelu", lambda: F.gelu, _gelu64),
        ("Functional", "silu", lambda: F.silu, lambda v: v * torch.sigmoid(v))]],
}

FAMILIES = tuple(_TABLE)
#: family -> the API prefixes (``{Type}_{name}``) its kernels stand in for
FAMILY_APIS: Dict[str, Tuple[str, ...]] = {f: tuple(p for p, _, _ in rows) for f, rows in _TABLE.items()}


def family_of(api_key: str) -> str:
    """The family whose kernel a recorded call (``"Functional_linear_0_forward"``) ran, or ""."""
    base = api_key
    for suffix in ("_forward", "_backward"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    base = base.rsplit("_", 1)[0] if base.rsplit("_", 1)[-1].isdigit() else base
    for fam, apis in FAMILY_APIS.items():
        if base in apis:
            return fam
    return ""


class AltKernels(TorchFunctionMode):
    """The alternative kernels of ``families`` (default: all), below capture. ``used`` counts the
    calls each family computed."""

    def __init__(self, families: Sequence[str] = FAMILIES) -> None:
        super().__init__()
        unknown = set(families) - set(FAMILIES)
        if unknown:
            raise ValueError(f"unknown kernel families: {sorted(unknown)}")
        self.families = tuple(families)
        self.used: Counter = Counter()
        self._by_func: Dict[Any, Tuple[str, Callable]] = {}

    def __enter__(self):
        _CALLS.clear()
        for fam in self.families:
            for _, get, kernel in _TABLE[fam]:
                self._by_func[get()] = (fam, kernel)
        return super().__enter__()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        hit = self._by_func.get(func)
        if hit is None:
            return func(*args, **kwargs)
        fam, kernel = hit
        try:
            out = kernel(func, args, kwargs)
        except _Decline:
            return func(*args, **kwargs)
        self.used[fam] += 1
        return out


# ---------------------------------------------------------------------------- self-test


def _rel(a: T, b: T) -> float:
    a, b = a.double(), b.double()
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b))


def self_test(seed: int = 0) -> List[Tuple[str, str, float, float]]:
    """``(family, case, alternative's error, CPU kernel's error)``, both relative L2 against float64,
    for each kernel on random float32 inputs: a correct kernel's error is of the CPU's order."""
    g = torch.Generator().manual_seed(seed)

    def r(*s: int, pos: bool = False) -> T:
        t = torch.randn(*s, generator=g)
        return t.abs() + 0.5 if pos else t

    x, w, bb = r(64, 256), r(128, 256), r(128)
    cases: List[Tuple[str, str, Callable[[], Any], tuple]] = [
        ("splitk", "linear 64x256 @ 256x128", lambda: F.linear, (x, w, bb)),
        ("splitk", "bmm 4x32x64 @ 4x64x32", lambda: torch.bmm, (r(4, 32, 64), r(4, 64, 32))),
        ("seqsum", "sum of 4096 positive", lambda: torch.sum, (r(8, 4096, pos=True), -1)),
        ("seqsum", "mean of 2048", lambda: torch.mean, (r(16, 2048), -1)),
        ("online_softmax", "softmax 64x200", lambda: F.softmax, (3 * r(64, 200), -1)),
        ("online_softmax", "log_softmax 64x200", lambda: F.log_softmax, (3 * r(64, 200), -1)),
        ("welford", "layer_norm 64x256", lambda: F.layer_norm, (r(64, 256) + 3.0, (256,))),
        ("welford", "batch_norm 16x8x16x16", lambda: F.batch_norm,
         (r(16, 8, 16, 16) + 2.0, torch.zeros(8), torch.ones(8), None, None, True)),
        ("winograd", "conv2d 3x3 8->16 on 4x8x16x16", lambda: F.conv2d,
         (r(4, 8, 16, 16), r(16, 8, 3, 3), r(16), 1, 1)),
        ("libm", "exp", lambda: torch.exp, (r(4096),)),
        ("libm", "tanh", lambda: torch.tanh, (r(4096),)),
        ("libm", "gelu", lambda: F.gelu, (r(4096),)),
    ]
    out = []
    for fam, what, get, args in cases:
        func = get()
        with torch.no_grad():
            ref = func(*args)
            exact = func(*[a.double() if _floating(a) else a for a in args])
            with AltKernels([fam]):
                alt = func(*args)
        out.append((fam, what, _rel(alt, exact), _rel(ref, exact)))
    p, a, b = r(4096), r(4096), r(4096, pos=True)
    for name, fn in (("addcdiv_", lambda t: t.addcdiv_(a.to(t.dtype), b.to(t.dtype), value=-1e-3)),
                     ("lerp_", lambda t: t.lerp_(a.to(t.dtype), 0.1))):
        with torch.no_grad():
            ref = fn(p.clone())
            exact = fn(p.double())
            with AltKernels(["adamw"]):
                alt = fn(p.clone())
        out.append(("adamw", name, _rel(alt, exact), _rel(ref, exact)))
    return out
