"""Planting one fault at one call site of a training step, below capture or in user code.

Both kinds are ``TorchFunctionMode``s that count the calls of one target callable (``torch.Tensor.cos``,
``F.softmax``... by identity, optionally filtered by a predicate on the arguments) and act on
the ``occurrence``-th one only:

* **below capture** (:class:`BelowCapture`): the mode is entered *before* ``debugger.start()``, so
  it sits under the debugger's own mode. The debugger records the call under the original API's
  name with its true inputs; the call it forwards reaches this mode, which returns a wrong output
  (forward: the correct output perturbed; backward: the gradient arriving at the output is
  perturbed before the API's own backward consumes it, so the API's recorded incoming gradient is
  right and the gradients it produces are wrong) - as a faulty device kernel would. Calls that the
  debugger's own machinery makes while it works also pass through here; targets are chosen among
  APIs it does not use, and the runner checks from the dumps where the fault landed.
* **user code** (:class:`UserCode`): the mode is entered *after* ``debugger.start()``, above the
  debugger's mode, and rewrites the call (an argument, a dtype, an extra call, a gradient hook)
  the way a changed line of model code would; the debugger records what the rewritten code calls.

Each firing fills a :class:`FireRecord`: the call index, the fault's size ``e1`` (relative L2
distance of the planted output, or gradient, from the correct one) and ``e0``, the correct kernel's
own error against a float64 oracle on the same inputs in the same dtype (for backward faults the
forward oracle error of the same call stands in for it).
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["FireRecord", "Site", "BelowCapture", "UserCode", "Replace", "rel_l2", "oracle_error", "perturb"]


@dataclass
class FireRecord:
    """What a planted fault did in one run."""

    matched: int = 0  # target calls seen
    fired_at: Optional[int] = None  # the occurrence it acted on
    e0: float = float("nan")  # correct kernel vs float64 oracle (relative L2)
    e1: float = float("nan")  # planted output vs correct output (relative L2)
    notes: List[str] = field(default_factory=list)


@dataclass
class Site:
    """Where to plant: the ``occurrence``-th call of ``target()`` whose arguments satisfy ``match``."""

    target: Callable[[], Any]
    occurrence: int = 0
    match: Optional[Callable[[tuple, dict], bool]] = None

    def hits(self, func: Any, target: Any, args: tuple, kwargs: dict) -> bool:
        if func is not target:
            return False
        return self.match is None or bool(self.match(args, kwargs))


def rel_l2(value: torch.Tensor, ref: torch.Tensor) -> float:
    """‖value − ref‖₂ / ‖ref‖₂ in float64 (inf when non-finite values appear or differ)."""
    with torch._C.DisableTorchFunction(), torch.no_grad():
        a, b = value.detach().double(), ref.detach().double()
        if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
            same = torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(
                torch.nan_to_num(a, 0.0, 1.0, -1.0), torch.nan_to_num(b, 0.0, 1.0, -1.0))
            return 0.0 if same and torch.equal(torch.isinf(a), torch.isinf(b)) else math.inf
        den = float(torch.linalg.vector_norm(b))
        num = float(torch.linalg.vector_norm(a - b))
        return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def _first_tensor(out: Any) -> Optional[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        for o in out:
            t = _first_tensor(o)
            if t is not None:
                return t
    return None


def _has_tensor(v: Any) -> bool:
    if isinstance(v, torch.Tensor):
        return True
    if isinstance(v, (list, tuple)):
        return any(_has_tensor(x) for x in v)
    if isinstance(v, dict):
        return any(_has_tensor(x) for x in v.values())
    return False


def _map(v: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``fn`` applied to every tensor in nested lists, tuples and dicts (other values kept)."""
    if isinstance(v, torch.Tensor):
        return fn(v)
    if not _has_tensor(v):
        return v
    if isinstance(v, dict):
        return {k: _map(x, fn) for k, x in v.items()}
    items = [_map(x, fn) for x in v]
    return items if isinstance(v, list) else tuple(items)


def _to64(v: Any) -> Any:
    return _map(v, lambda t: t.detach().double() if t.is_floating_point() else t.detach().clone())


def _detached(v: Any) -> Any:
    return _map(v, lambda t: t.detach().clone())


def oracle_error(func: Callable, args: tuple, kwargs: dict, out: torch.Tensor) -> float:
    """Relative L2 error of ``out`` against ``func`` re-run in float64 on the same inputs."""
    try:
        with torch._C.DisableTorchFunction(), torch.no_grad(), torch.autocast("cpu", enabled=False):
            ref = _first_tensor(func(*_to64(args), **_to64(kwargs)))
            if ref is None or ref.shape != out.shape:
                return float("nan")
            return rel_l2(out, ref)
    except Exception:  # an op without a float64 kernel: unknown
        return float("nan")


def perturb(t: torch.Tensor, size: Any, seed: int) -> torch.Tensor:
    """A wrong copy of ``t``: relative noise of L2 size ``size`` (a float), or one NaN / Inf."""
    with torch._C.DisableTorchFunction(), torch.no_grad():
        src = t.detach()
        vals = src.contiguous().clone()
        if size in ("nan", "inf"):
            vals.view(-1)[vals.numel() // 3] = float(size)
        else:
            g = torch.Generator().manual_seed(seed)
            z = torch.randn(vals.shape, generator=g, dtype=torch.float32)
            vals = (vals.float() * (1 + float(size) * z)).to(vals.dtype)
        bad = torch.empty_like(src)  # the correct output's strides: later views keep working
        bad.copy_(vals)
        return bad


class Replace(torch.autograd.Function):
    """Forward gives ``bad`` (a planted fault's output, or an alternative kernel's); backward passes
    the gradient to ``out`` unchanged (the CPU kernel's backward)."""

    @staticmethod
    def forward(ctx, out, bad):  # type: ignore[override]
        return bad.clone()

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        return g, None


class _GradFault(torch.autograd.Function):
    """Identity forward; backward hands on a perturbed gradient and records its size."""

    @staticmethod
    def forward(ctx, out, size, seed, record):  # type: ignore[override]
        ctx.size, ctx.seed, ctx.record = size, seed, record
        return out.clone()

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        with torch._C.DisableTorchFunction():
            bad = perturb(g, ctx.size, ctx.seed)
            ctx.record.e1 = rel_l2(bad, g)
        return bad, None, None, None


def _seed(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


class _SiteMode(TorchFunctionMode):
    """Counts calls of the site's target; ``act`` handles the planted one."""

    def __init__(self, site: Site, name: str) -> None:
        super().__init__()
        self.site, self.name = site, name
        self.record = FireRecord()
        self._target: Any = None

    def __enter__(self):
        self._target = self.site.target()
        return super().__enter__()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunction():
            hit = self.site.hits(func, self._target, args, kwargs)
        if hit:
            idx = self.record.matched
            self.record.matched += 1
            if idx == self.site.occurrence:
                self.record.fired_at = idx
                return self.act(func, args, kwargs)
        return func(*args, **kwargs)

    def act(self, func: Callable, args: tuple, kwargs: dict) -> Any:  # pragma: no cover
        raise NotImplementedError


def _is_inplace(func: Any) -> bool:
    name = getattr(func, "__name__", "")
    return name.endswith("_") and not name.endswith("__")


class BelowCapture(_SiteMode):
    """A wrong kernel: enter before ``debugger.start()``, exit after ``debugger.stop()``.

    ``size``: relative L2 size of the error (float) or ``"nan"``/``"inf"``; ``direction``:
    ``"forward"`` (wrong output) or ``"backward"`` (wrong gradients produced for the inputs).
    """

    def __init__(self, site: Site, name: str, size: Any, direction: str = "forward") -> None:
        super().__init__(site, name)
        self.size, self.direction = size, direction

    def act(self, func, args, kwargs):
        rec, seed = self.record, _seed(self.name)
        if _is_inplace(func):  # an optimizer update: compute it, then spoil the updated tensor
            before = _detached(args[0])
            out = func(*args, **kwargs)
            with torch._C.DisableTorchFunction(), torch.no_grad():
                correct = args[0].detach().clone()
                rec.e0 = oracle_error(func, (before,) + tuple(args[1:]), kwargs, correct)
                bad = perturb(correct, self.size, seed)
                args[0].copy_(bad)
                rec.e1 = rel_l2(bad, correct)
            return out
        out = func(*args, **kwargs)
        t = _first_tensor(out)
        if not isinstance(out, torch.Tensor) or t is None:
            rec.notes.append("target returned no single tensor: not planted")
            return out
        rec.e0 = oracle_error(func, args, kwargs, out)
        with torch._C.DisableTorchFunction():
            if self.direction == "backward":
                if not out.requires_grad:
                    rec.notes.append("output does not require grad: backward fault not planted")
                    return out
                return _GradFault.apply(out, self.size, seed, rec)
            bad = perturb(out, self.size, seed)
            rec.e1 = rel_l2(bad, out)
            return Replace.apply(out, bad) if out.requires_grad else bad


class UserCode(_SiteMode):
    """A changed line of model code: enter after ``debugger.start()``, exit before ``stop()``.

    ``rewrite(func, args, kwargs, record)`` runs instead of the call; its own torch calls are
    recorded by the debugger like model code. Unless ``measure=False``, the correct call is also
    run unseen (no autograd, not recorded) to measure ``e0``/``e1`` on the rewritten output.
    """

    def __init__(self, site: Site, name: str, rewrite: Callable[..., Any], measure: bool = True) -> None:
        super().__init__(site, name)
        self.rewrite, self.measure = rewrite, measure

    def act(self, func, args, kwargs):
        rec = self.record
        correct = None
        if self.measure:
            with torch._C.DisableTorchFunction(), torch.no_grad():
                if _is_inplace(func):
                    correct = _detached(args[0])
                    func(correct, *args[1:], **kwargs)
                    rec.e0 = oracle_error(func, (_detached(args[0]),) + tuple(args[1:]), kwargs, correct)
                else:
                    correct = _first_tensor(func(*args, **kwargs))
                    if correct is not None:
                        rec.e0 = oracle_error(func, args, kwargs, correct)
        out = self.rewrite(func, args, kwargs, rec)
        if correct is not None:
            with torch._C.DisableTorchFunction():
                got = args[0] if _is_inplace(func) else _first_tensor(out)
                if got is not None and got.shape == correct.shape:
                    rec.e1 = rel_l2(got.to(correct.dtype), correct)
        return out
