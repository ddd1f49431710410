"""Respelled device runs: the same computation as the bench's, spelled otherwise (issue 20).

A :class:`Respell` mode is entered after ``debugger.start()`` (above the debugger's mode, below a
user-code fault's) and re-issues some calls of the model in another spelling, which the debugger
records: the numbers are the same bit for bit, only the call's name or the way its arguments are
passed changes. A planted user-code fault still targets the original spelling (it sits above
this mode and sees the model's own calls); a below-capture fault targets the respelled callable
(it sees what the debugger forwards).

Spellings (:data:`SPELLINGS`):

* ``"kw"``: arguments by keyword where the model passes them positionally, names kept:
  ``F.linear(input=x, weight=w, bias=b)``, ``x.add(other=y)``, ``x.mul(other=y)``,
  ``a.matmul(other=b)``, ``torch.matmul(input=a, other=b)``, ``torch.addmm(input=b, mat1=x,
  mat2=w)``, ``F.gelu(input=x, approximate="none")`` (the default spelled out) and
  ``F.layer_norm`` with ``normalized_shape`` as a list (nn.LayerNorm passes a tuple);
* ``"ns"``: the same call under another namespace or form: ``torch.softmax`` for ``F.softmax``,
  ``torch.add``/``torch.mul`` for ``x + y``/``x * y`` (``x.add(y)``), ``torch.matmul`` for
  ``a @ b`` and ``a.matmul(b)`` for ``torch.matmul(a, b)``, ``torch.layer_norm`` for the module's
  ``F.layer_norm``.

(``x + y`` and ``x.add(y)`` reach torch's function protocol as the same call, as do ``a @ b``
and ``a.matmul(b)``; ``F.softmax``'s and ``F.layer_norm``'s keywords are normalised by their
Python wrappers before any mode sees them.)
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

__all__ = ["Respell", "SPELLINGS"]

T = torch.Tensor
Call = Tuple[Callable, tuple, dict]


def _plain(args: tuple, n: int, kwargs: dict, allowed: Tuple[str, ...] = ()) -> bool:
    return len(args) == n and all(k in allowed for k in kwargs)


def _kw(func: Any, args: tuple, kwargs: dict) -> Optional[Call]:
    if func is F.linear and 2 <= len(args) <= 3 and not kwargs:
        return F.linear, (), dict(zip(("input", "weight", "bias"), args))
    if func in (T.add, T.mul) and _plain(args, 2, kwargs):
        return func, (args[0],), {"other": args[1]}
    if func is T.matmul and _plain(args, 2, kwargs):
        return T.matmul, (args[0],), {"other": args[1]}
    if func is torch.matmul and _plain(args, 2, kwargs):
        return torch.matmul, (), {"input": args[0], "other": args[1]}
    if func is torch.addmm and _plain(args, 3, kwargs):
        return torch.addmm, (), dict(zip(("input", "mat1", "mat2"), args))
    if func is F.gelu and _plain(args, 1, kwargs, ("approximate",)):
        return F.gelu, (), {"input": args[0], "approximate": kwargs.get("approximate", "none")}
    if func is F.layer_norm and len(args) == 2 and isinstance(args[1], tuple):
        return F.layer_norm, (args[0], list(args[1])), kwargs
    return None


def _ns(func: Any, args: tuple, kwargs: dict) -> Optional[Call]:
    if func is F.softmax and len(args) == 1 and kwargs.get("dim") is not None:
        dtype = kwargs.get("dtype")
        return torch.softmax, (args[0], kwargs["dim"]), ({"dtype": dtype} if dtype is not None else {})
    if func is T.add and _plain(args, 2, kwargs):
        return torch.add, args, {}
    if func is T.mul and _plain(args, 2, kwargs):
        return torch.mul, args, {}
    if func is T.matmul and _plain(args, 2, kwargs):
        return torch.matmul, args, {}
    if func is torch.matmul and _plain(args, 2, kwargs):
        return T.matmul, args, {}
    if func is F.layer_norm and len(args) == 2 and set(kwargs) <= {"weight", "bias", "eps"}:
        return torch.layer_norm, (args[0], args[1], kwargs.get("weight"), kwargs.get("bias"),
                                  kwargs.get("eps", 1e-5)), {}
    return None


SPELLINGS: Dict[str, Callable[[Any, tuple, dict], Optional[Call]]] = {"kw": _kw, "ns": _ns}


class Respell(TorchFunctionMode):
    """Re-issue the model's calls in ``spelling`` (a key of :data:`SPELLINGS`); ``respelled``
    counts the calls it changed."""

    def __init__(self, spelling: str) -> None:
        super().__init__()
        self.rule = SPELLINGS[spelling]
        self.respelled = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunction():
            new = self.rule(func, tuple(args), dict(kwargs))
        if new is None:
            return func(*args, **kwargs)
        self.respelled += 1
        f, a, k = new
        return f(*a, **k)
