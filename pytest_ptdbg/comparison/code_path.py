"""A call recorded on one side only: bookkeeping or a value-changing code path? No torch.

A call present in one dump only (an autocast ``.float()``, an extra ``.contiguous()``, a ``.to()``
that one code path makes) is judged from its own records: its output against its input (forward),
the gradient it produced against the gradient it received (backward).

- ``bookkeeping``: the values go through unchanged (a cast to a wider dtype such as ``.float()`` of
  a bf16 value, ``.type()`` and ``.contiguous()`` copies, views): the output equals the input
  element by element (both saved) or, for statistics-only dumps, in all four statistics and NaN/Inf
  counts, for calls that keep the shape or only reshape (a statistic cannot see a reordering, so
  :data:`REORDERING` calls are not classified from statistics). The backward of a bookkeeping
  call is bookkeeping too when the gradient it produced is the incoming one rounded to its
  dtype (the input of ``.float()`` was bf16, so its gradient is).
- ``value-changing``: the output differs from the input (a cast to lower precision, an extra op),
  or (:func:`new_half_precision`) a lossless cast to a 16-bit float dtype that no earlier call of
  that side produced: what follows computes in a precision the run did not use before.
- ``""``: cannot be classified (no data, several outputs, a size change): the row stays unusable.

Inside ``Optimizer.step`` (the record's ``ctx`` is ``"optimizer"``; capture knows), two narrow rules
come first (:func:`optimizer_kind`); a call outside the optimizer never gets them:

- ``bookkeeping``: a constructor (:data:`STATE_CONSTRUCTORS`: ``zeros``, ``zeros_like``, ``tensor``...)
  whose output is the constant 0 or 1 everywhere, or an allocation (``empty_like``: the fused SGD's
  momentum buffers, overwritten by its first step): the optimizer's first step making its state
  (moments, step counters: ``torch.zeros(())`` on one side, ``torch.tensor(0.)`` on the other) or a
  step increment (``torch.tensor(1.)`` of the foreach AdamW); nothing is computed from data;
- :data:`OPTIMIZER_UPDATE`: the two sides spell the update differently (their optimizer steps call
  different multi-tensor kernels, :data:`MULTI_TENSOR`: ``_fused_adamw_``, ``_foreach_mul_``...,
  against one call per parameter and operation): its calls on one side only are the same update
  made another way. They are no cause by themselves: the device's are judged by their own replay
  against a float64 oracle (``judge/step.py`` fails a device call of that kind the replay did not
  judge), the bench's are the reference. When both sides spell it the same way, a call on one side
  only is classified as any other.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, AbstractSet, Any, Callable, Optional, Sequence, Set, Tuple

from pytest_ptdbg.comparison import metrics as M
from pytest_ptdbg.comparison.arguments import is_scalar_record
from pytest_ptdbg.runtime.dtypes import FLOATS, STEP_FLOATS, short_name

if TYPE_CHECKING:
    from pytest_ptdbg.dump.reader import ApiRec, TensorRec

__all__ = ["BOOKKEEPING", "VALUE_CHANGING", "OPTIMIZER_UPDATE", "REORDERING", "STATE_CONSTRUCTORS",
           "MULTI_TENSOR", "classify", "stats_relation", "new_half_precision", "output_dtypes",
           "optimizer_kind", "update_spelling"]

BOOKKEEPING = "bookkeeping"
VALUE_CHANGING = "value-changing"
#: a call inside Optimizer.step on one side only when the sides spell the update differently
OPTIMIZER_UPDATE = "optimizer update"
#: the constructors an optimizer makes its state with (``torch.*``; Python numbers or a tensor's
#: shape in, a constant out)
STATE_CONSTRUCTORS = frozenset({"zeros", "zeros_like", "ones", "ones_like", "full", "full_like", "tensor",
                                "as_tensor", "scalar_tensor", "empty", "empty_like"})
#: ... of them, those that leave the memory uninitialised (the fused SGD's momentum buffers, which
#: its first step overwrites)
_ALLOCATORS = frozenset({"empty", "empty_like"})
#: name prefixes of the multi-tensor kernels an optimizer's update may be made of
MULTI_TENSOR = ("_fused_", "_foreach_")
#: the constants an optimizer's state starts at (moments, step counters) or is stepped by
_STATE_CONSTANTS = (0.0, 1.0)

#: calls that can move elements while keeping their multiset (statistics cannot tell)
REORDERING = frozenset({"permute", "transpose", "transpose_", "t", "t_", "flip", "fliplr", "flipud", "roll",
                        "rot90", "movedim", "moveaxis", "swapaxes", "swapdims", "sort", "T", "mT", "H",
                        "mH", "adjoint", "__getitem__", "index_select", "gather", "take", "scatter",
                        "scatter_", "index_put", "index_put_", "__setitem__", "masked_scatter",
                        "masked_scatter_", "unfold", "channel_shuffle", "pixel_shuffle",
                        "pixel_unshuffle", "as_strided"})

#: storage bits of the floating dtypes a step computes in, by every name (``runtime/dtypes.py``)
_WIDTH = {d: FLOATS[short_name(d)].bits
          for d in ("float16", "half", "bfloat16", "float32", "float", "float64", "double")}


def _bits(dtype: str) -> int:
    return _WIDTH.get((dtype or "").replace("torch.", ""), 0)


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _rounding_eps(dtype: str) -> float:
    """Unit of a rounding to ``dtype`` (its machine eps; float64's for unknown)."""
    return M.dtype_eps(dtype)


def stats_relation(a: Optional[Sequence[Any]], b: Optional[Sequence[Any]], eps: float) -> str:
    """``"equal"`` when statistics ``a`` and ``b`` (max, min, mean, l2norm) are the same,
    ``"rounding"`` when each differs by at most ``eps`` relative, else ``"different"``;
    ``""`` when either has no statistics."""
    va = [v for v in (M.stat_at(a, i) for i in range(4)) if v is not None]
    vb = [v for v in (M.stat_at(b, i) for i in range(4)) if v is not None]
    if len(va) < 4 or len(vb) < 4:  # a statistic is missing
        return ""
    equal = True
    # a rounding moves each element by at most eps relative: max, min and the norm move by eps of
    # themselves, the mean by eps of the largest magnitude (a mean near zero has no scale of its own)
    span = max((abs(v) for v in va[:2] + vb[:2] if math.isfinite(v)), default=0.0)
    for k, (x, y) in enumerate(zip(va, vb)):
        if x == y or (math.isnan(x) and math.isnan(y)):
            continue
        equal = False
        scale = span if k == 2 else max(abs(x), abs(y))
        if not (math.isfinite(x) and math.isfinite(y)) or abs(x - y) > eps * scale:
            return "different"
    return "equal" if equal else "rounding"


#: half the spacing of the smallest subnormal numbers of a dtype: a rounding into it may move a
#: value by this much absolutely (fp16's subnormals are 2**-24 apart: gradients of 1e-8 round so)
_SUBNORMAL_HALF_STEP = {d: FLOATS[short_name(d)].subnormal_spacing / 2
                        for d in ("float16", "half", "bfloat16", "float32", "float")}


def _data_relation(src: TensorRec, out: TensorRec, eps: float, load: Callable[[TensorRec], Any]) -> str:
    import numpy as np

    a = np.asarray(load(src), dtype=np.float64).reshape(-1)
    b = np.asarray(load(out), dtype=np.float64).reshape(-1)
    m = M.compare_arrays(b, a, eps=M._F64_EPS)
    if m.nan_mismatch:
        return "different"
    if m.compared == 0 or m.max_abs_err == 0.0:
        return "equal"
    # each element within one rounding into the output's dtype (relative, or subnormal-absolute)
    floor = _SUBNORMAL_HALF_STEP.get(str(out.dtype).replace("torch.", ""), 0.0)
    ok = np.isfinite(a) & np.isfinite(b)
    within = np.abs(b[ok] - a[ok]) <= eps * np.abs(a[ok]) + floor
    return "rounding" if bool(within.all()) else "different"


def classify(api: ApiRec, summary: bool, forward_kind: str = "",
             load: Optional[Callable[[TensorRec], Any]] = None) -> Tuple[str, str]:
    """``(kind, message)`` of a call recorded on one side only (see the module docstring).

    ``forward_kind``: the classification of the same call's forward (for a backward call).
    ``load(tensor_record)``: the record's data as an array (full compare); statistics otherwise.
    """
    tensors = [t for t in api.tensors if not is_scalar_record(t)]
    ins = [t for t in tensors if t.io == "input"]
    outs = [t for t in tensors if t.io == "output"]
    what = "the gradient it produces" if api.direction == "backward" else "its output"
    against = "the one it receives" if api.direction == "backward" else "its input"
    if len(outs) != 1 or not ins:
        return "", f"not classified ({len(ins)} input and {len(outs)} output tensors)"
    src = next((t for t in ins if t.slot == "input.0"), ins[0])
    out = outs[0]
    if _numel(src.shape) != _numel(out.shape):
        return "", f"not classified ({what} and {against} differ in size: {list(src.shape)} -> {list(out.shape)})"
    eps = _rounding_eps(out.dtype)
    rel, how = "", ""
    if not summary and load is not None and src.data_file and out.data_file:
        try:
            rel, how = _data_relation(src, out, eps, load), "element by element"
        except (ValueError, OSError) as e:
            return "", f"not classified ({e})"
    elif src.stats and out.stats:
        if api.api_name in REORDERING:
            return "", f"not classified ({api.api_name} may reorder elements; statistics cannot tell)"
        if src.nonfinite != out.nonfinite:
            rel = "different"
        else:
            rel = stats_relation(src.stats, out.stats, eps)
        how = "by its statistics"
    if not rel:
        return "", "not classified (no data or statistics)"
    narrower = _bits(out.dtype) and _bits(src.dtype) and _bits(out.dtype) < _bits(src.dtype)
    cast = f"{src.dtype} -> {out.dtype}" if src.dtype != out.dtype else out.dtype
    widening = _bits(out.dtype) and _bits(src.dtype) and _bits(out.dtype) > _bits(src.dtype)
    if rel == "equal":
        return BOOKKEEPING, f"bookkeeping: {what} equals {against} ({how}; {cast})"
    if rel == "rounding" and widening and api.direction == "forward":
        # every bf16/fp16 value is exact in float32: only the statistics' own rounding differs
        return BOOKKEEPING, f"bookkeeping: a widening cast is exact ({how}; {cast})"
    if rel == "rounding" and api.direction == "backward" and forward_kind == BOOKKEEPING:
        return BOOKKEEPING, (f"bookkeeping: backward of a bookkeeping call, the gradient rounded to its "
                             f"input's dtype ({cast}, {how})")
    if narrower:
        return VALUE_CHANGING, f"value-changing: a cast to lower precision ({cast}) on this side only"
    return VALUE_CHANGING, f"value-changing: {what} differs from {against} ({how}; {cast})"


_HALF = frozenset(n for d in STEP_FLOATS if FLOATS[d].bits == 16 for n in (f"torch.{d}", d))


def output_dtypes(api: ApiRec) -> Set[str]:
    """The floating dtypes of a call's output tensors."""
    return {str(t.dtype) for t in api.tensors if t.io == "output" and _bits(str(t.dtype))}


def new_half_precision(api: ApiRec, earlier: AbstractSet[str]) -> str:
    """The 16-bit float dtype a forward call's output introduces (``""`` if none): a dtype of
    :data:`_HALF` that is not among ``earlier``, the output dtypes of that side's earlier calls.
    A lossless ``.to(torch.float16)`` on one side only is such a call: its values survive, but what
    follows computes in float16, which the run did not use before (under bf16 autocast, a cast to
    bf16 introduces nothing new)."""
    if api.direction != "forward":
        return ""
    new = sorted(d for d in output_dtypes(api) if d in _HALF and d not in earlier)
    return new[0] if new else ""


def update_spelling(apis: "Sequence[ApiRec]") -> "frozenset[str]":
    """The multi-tensor kernels (:data:`MULTI_TENSOR`) a side's optimizer steps call: how it spells
    its update (empty: one call per parameter and operation)."""
    return frozenset(a.api_name for a in apis if a.ctx == "optimizer" and a.api_name.startswith(MULTI_TENSOR))


def optimizer_kind(api: ApiRec, spelled_differently: bool) -> Tuple[str, str]:
    """``(kind, message)`` of a call on one side only by the optimizer rules of the module
    docstring; ``("", "")`` when they do not apply (the call is classified as any other).

    ``spelled_differently``: the two sides' optimizer steps call different multi-tensor kernels
    (:func:`update_spelling`)."""
    if api.ctx != "optimizer" or api.direction != "forward":
        return "", ""
    if api.api_type == "Torch" and api.api_name in STATE_CONSTRUCTORS:
        outs = [t for t in api.tensors if t.io == "output"]
        const = _constant(outs)
        if api.api_name in _ALLOCATORS:
            return BOOKKEEPING, (f"bookkeeping: optimizer state allocated inside Optimizer.step ({api.api_name}: "
                                 "uninitialised memory, nothing computed from data; a later call that reads "
                                 "it is judged by its own replay)")
        if const is not None:
            return BOOKKEEPING, (f"bookkeeping: optimizer state made inside Optimizer.step ({api.api_name} "
                                 f"gives the constant {const:g}: a state initialised or a step increment; "
                                 "nothing computed from data)")
        return "", ""
    if spelled_differently:
        return OPTIMIZER_UPDATE, ("optimizer update: the sides spell the optimizer's update differently "
                                  "(fused/foreach kernels against per-parameter calls); this call is part "
                                  "of it, judged by its own replay on the device side")
    return "", ""


def _constant(outs: "Sequence[TensorRec]") -> Optional[float]:
    """The one value of :data:`_STATE_CONSTANTS` every element of the single output holds, by its
    statistics (max == min, no NaN/Inf); None otherwise."""
    if len(outs) != 1 or outs[0].nonfinite:
        return None
    hi, lo = M.stat_at(outs[0].stats, 0), M.stat_at(outs[0].stats, 1)
    if hi is None or lo is None or hi != lo or hi not in _STATE_CONSTANTS:
        return None
    return hi
