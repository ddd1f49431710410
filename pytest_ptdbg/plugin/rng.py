"""Device-independent random numbers for the two sides of a comparison.

The same seed gives the same numbers only on the same kind of generator: CPU against CPU (bf16
autocast on one side) agrees, but a CUDA or NPU dropout mask differs from the CPU bench's
whatever the seeds. While :class:`CpuRandom` is active, dropout and the common random functions
draw their numbers from one CPU generator, seeded identically on both sides, and move them to the
tensor's device; the arithmetic (mask multiply, scaling) still runs on the device under test.
The mode sits below the dump hooks, so ``Functional_dropout`` is still recorded as one API call.
Calls that pass their own ``generator=`` are left alone.
"""
from __future__ import annotations

from typing import Any, Callable, Dict

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode


def _dropout(gen: torch.Generator, x: torch.Tensor, p: float, training: bool,
             inplace: bool) -> torch.Tensor:
    if not training or p == 0.0:
        return x
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    keep = torch.rand(x.shape, generator=gen) >= p
    scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
    mask = keep.to(device=x.device, dtype=x.dtype) * scale
    return x.mul_(mask) if inplace else x * mask


def _f_dropout(gen, func, args, kwargs):
    names = ("input", "p", "training", "inplace")
    b = dict(zip(names, args), **kwargs)
    return _dropout(gen, b["input"], float(b.get("p", 0.5)), bool(b.get("training", True)),
                    bool(b.get("inplace", False)))


def _torch_dropout(gen, func, args, kwargs):
    b = dict(zip(("input", "p", "train"), args), **kwargs)
    return _dropout(gen, b["input"], float(b["p"]), bool(b["train"]), func is torch.dropout_)


def _factory(gen, func, args, kwargs):
    device = kwargs.pop("device", None)
    requires_grad = kwargs.pop("requires_grad", False)
    kwargs.pop("pin_memory", None)
    out = func(*args, generator=gen, **kwargs).to(device if device is not None else "cpu")
    return out.requires_grad_(True) if requires_grad else out


def _like(gen, func, args, kwargs):
    base = {torch.rand_like: torch.rand, torch.randn_like: torch.randn}[func]
    x = args[0]
    dtype = kwargs.get("dtype") or x.dtype
    out = base(tuple(x.shape), generator=gen, dtype=dtype).to(kwargs.get("device") or x.device)
    return out.requires_grad_(True) if kwargs.get("requires_grad") else out


def _bernoulli(gen, func, args, kwargs):
    x = args[0]
    p = args[1] if len(args) > 1 else kwargs.get("p")
    src = x.detach().to("cpu", torch.float32)
    drawn = torch.bernoulli(src if p is None else torch.full_like(src, float(p)), generator=gen)
    return drawn.to(device=x.device, dtype=x.dtype)


def _bernoulli_(gen, func, args, kwargs):
    x = args[0]
    p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
    probs = p.detach().to("cpu", torch.float32) if isinstance(p, torch.Tensor) else \
        torch.full(x.shape, float(p))
    with torch.no_grad():
        return x.copy_(torch.bernoulli(probs.expand(x.shape), generator=gen))


def _fill(kind: str) -> Callable:
    def fill(gen, func, args, kwargs):
        x = args[0]
        rest = dict(zip(("a", "b") if kind == "uniform" else ("mean", "std"), args[1:]), **kwargs)
        tmp = torch.empty(x.shape, dtype=torch.float32)
        if kind == "uniform":
            tmp.uniform_(float(rest.get("a", rest.get("from", 0.0))),
                         float(rest.get("b", rest.get("to", 1.0))), generator=gen)
        else:
            tmp.normal_(float(rest.get("mean", 0.0)), float(rest.get("std", 1.0)), generator=gen)
        with torch.no_grad():
            return x.copy_(tmp)
    return fill


_HANDLERS: Dict[Any, Callable] = {
    F.dropout: _f_dropout,
    torch.dropout: _torch_dropout,
    torch.dropout_: _torch_dropout,
    torch.rand: _factory,
    torch.randn: _factory,
    torch.rand_like: _like,
    torch.randn_like: _like,
    torch.bernoulli: _bernoulli,
    torch.Tensor.bernoulli: _bernoulli,
    torch.Tensor.bernoulli_: _bernoulli_,
    torch.Tensor.uniform_: _fill("uniform"),
    torch.Tensor.normal_: _fill("normal"),
}


class CpuRandom(TorchFunctionMode):
    """Draw dropout masks and random tensors from one seeded CPU generator (see module doc)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.generator = torch.Generator().manual_seed(seed)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        handler = _HANDLERS.get(func)
        if handler is None or kwargs.get("generator") is not None or "out" in kwargs:
            return func(*args, **kwargs)
        return handler(self.generator, func, args, kwargs)
