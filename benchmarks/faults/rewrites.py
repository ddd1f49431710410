"""User-code rewrites: what a changed line of model code calls instead of the original call.

Each returns ``rewrite(func, args, kwargs, record) -> output`` for :class:`planting.UserCode`;
their torch calls are recorded by the debugger like model code.
"""
from __future__ import annotations

import inspect
import math
from typing import Any, Callable, Dict

import torch

from benchmarks.faults.planting import FireRecord, rel_l2

Rewrite = Callable[[Callable, tuple, dict, FireRecord], Any]


def set_args(**changes: Any) -> Rewrite:
    """Call with some arguments changed (bound by name for Python functions, else as keywords)."""
    def rw(func, args, kwargs, rec):
        try:
            ba = inspect.signature(func).bind(*args, **kwargs)
        except (TypeError, ValueError):
            return func(*args, **{**kwargs, **changes})
        ba.arguments.update(changes)
        return func(*ba.args, **ba.kwargs)
    return rw


def scale_arg(name: str, factor: float, position: int) -> Rewrite:
    """Multiply a float argument (keyword ``name`` or positional ``position``) by ``factor``."""
    def rw(func, args, kwargs, rec):
        if name in kwargs:
            return func(*args, **{**kwargs, name: kwargs[name] * factor})
        a = list(args)
        a[position] = a[position] * factor
        return func(*a, **kwargs)
    return rw


def sdpa_scale(factor: float) -> Rewrite:
    """``scaled_dot_product_attention`` with its scale off by ``factor``."""
    def rw(func, args, kwargs, rec):
        scale = kwargs.get("scale")
        if scale is None:
            scale = 1.0 / math.sqrt(args[0].shape[-1])
        return func(*args, **{**kwargs, "scale": scale * factor})
    return rw


def softmax_in(dtype: torch.dtype) -> Rewrite:
    """``F.softmax(x, dim, dtype=dtype)`` cast back to ``x``'s dtype (one extra cast after)."""
    def rw(func, args, kwargs, rec):
        return func(*args, **{**kwargs, "dtype": dtype}).to(args[0].dtype)
    return rw


def softmax_no_max(dtype: torch.dtype) -> Rewrite:
    """Hand-written ``exp(x) / sum(exp(x))`` in ``dtype`` without max subtraction."""
    def rw(func, args, kwargs, rec):
        x = args[0]
        dim = kwargs.get("dim", args[1] if len(args) > 1 else -1)
        e = x.to(dtype).exp()
        return (e / e.sum(dim, keepdim=True)).to(x.dtype)
    return rw


def cast_first_input(dtype: torch.dtype, back: bool = True) -> Rewrite:
    """Round the first argument through ``dtype`` (extra casts before the call); ``back=False``:
    the call itself runs in ``dtype`` (e.g. ``exp`` in float16, and whatever follows it)."""
    def rw(func, args, kwargs, rec):
        x = args[0]
        y = x.to(dtype)
        return func(y.to(x.dtype) if back else y, *args[1:], **kwargs)
    return rw


def add_to_input(delta: float) -> Rewrite:
    """``func(x + delta)``: e.g. a rotary phase off by ``delta`` (one extra add before)."""
    def rw(func, args, kwargs, rec):
        return func(args[0] + delta, *args[1:], **kwargs)
    return rw


def replace_arg(position: int, value: Any) -> Rewrite:
    """Positional argument ``position`` replaced by ``value``."""
    def rw(func, args, kwargs, rec):
        a = list(args)
        a[position] = value
        return func(*a, **kwargs)
    return rw


def with_kwargs(**kw: Any) -> Rewrite:
    """Extra keyword arguments (e.g. ``dtype=torch.bfloat16`` for a reduction)."""
    def rw(func, args, kwargs, rec):
        return func(*args, **{**kwargs, **kw})
    return rw


def grad_hook(kind: str, size: float, seed: int = 5) -> Rewrite:
    """The call as is, plus a user gradient hook on its output: ``"drop"`` zeroes a ``size`` share
    of the gradient's elements, ``"scale"`` multiplies it by ``1 + size``. The debugger's own tap on
    the output is registered first, so it records the gradient before the hook changes it."""
    def rw(func, args, kwargs, rec):
        out = func(*args, **kwargs)

        def hook(g: torch.Tensor) -> torch.Tensor:
            with torch._C.DisableTorchFunction():
                if kind == "drop":
                    gen = torch.Generator().manual_seed(seed)
                    keep = torch.rand(g.shape, generator=gen) >= size
                    bad = g * keep.to(g.dtype)
                else:
                    bad = g * (1 + size)
                rec.e1 = rel_l2(bad, g)
            return bad

        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(hook)
        else:
            rec.notes.append("output does not require grad: hook not planted")
        return out
    return rw


REWRITES: Dict[str, Callable[..., Rewrite]] = {
    "set_args": set_args, "scale_arg": scale_arg, "sdpa_scale": sdpa_scale, "softmax_in": softmax_in,
    "softmax_no_max": softmax_no_max, "cast_first_input": cast_first_input,
    "add_to_input": add_to_input, "replace_arg": replace_arg, "with_kwargs": with_kwargs,
    "grad_hook": grad_hook,
}
