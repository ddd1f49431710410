"""Non-tensor arguments of two paired calls, compared after normalisation. No torch import.

An argument is evidence: ``F.layer_norm(x, s, eps=1e-5)`` against ``eps=1e-2`` computes another
function. Each side's arguments come from its call spec (``extra["call"]`` on the API's first
forward record, docs/DESIGN.md; msprobe's ``input_args``/``input_kwargs`` are read into the same
form by ``dump/reader.py``) and are normalised before they are compared:

- positional and keyword arguments are bound to the API's signature, read from torch itself
  (``runtime/operations.py``: the Python signature of ``torch.nn.functional``'s functions, the
  aten schema's overloads otherwise), and parameters a side omitted get the signature's default,
  so an omitted ``eps`` equals ``1e-05`` and ``weight`` passed by keyword equals ``weight`` passed
  by position; an API whose signature is unknown names its positional arguments ``arg1``, ``arg2``, ...;
- dimensions (``dim``, ``dim0``, ``dims``, ``start_dim`` ...) that are negative are taken modulo the
  rank of the call's first input tensor (its rank + 1 for ``unsqueeze``/``stack``), so ``-1`` on a
  3-d input equals ``2``;
- lists and tuples are the same; devices and the parameters :data:`IGNORED` (``device``,
  ``_stacklevel``, ``inplace``, ``non_blocking``, ``memory_format``, ``layout``, ``pin_memory``,
  ``requires_grad``, ``out``; why for each: :data:`IGNORED_WHY`) are not compared; ``None``
  equals an omitted parameter;
- two floating-point dtypes (``x.to(q.dtype)``: bf16 under autocast, fp32 on the bench), or two of
  their ``finfo`` numbers (``masked_fill(mask, torch.finfo(dtype).min)``), are not a changed
  argument: they follow the run's precision, and the tensor rows judge it;
- numbers agree when they differ by at most :data:`FLOAT_RTOL` relative (ints, bools, strings,
  other dtypes exactly): a changed constant of the code (``eps`` 1e-5 vs 1e-2, ``approximate``, ``dim``)
  is found, a Python float computed from slightly different data (``.item()``) is not. Under the
  ``dtype`` rule a number within the rule's tolerance (the user's rtol/atol) is the same too
  (``comparison/table.py``).

:func:`compare_arguments` returns one :class:`ArgLeaf` per scalar leaf of every parameter (a tuple
argument such as ``normalized_shape=(32,)`` has one leaf per element, as ptdbg and msprobe list
them), with the parameter's verdict (``same``, ``changed``, ``ignored``, ``unknown``: given on one
side only and no default known).
"""
from __future__ import annotations

import marshal
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    from pytest_ptdbg.dump.reader import ApiRec, TensorRec

from pytest_ptdbg.runtime import operations as O
from pytest_ptdbg.runtime.dtypes import FLOATS, STEP_FLOATS

__all__ = ["ArgLeaf", "MISSING", "IGNORED", "IGNORED_WHY", "FLOAT_RTOL", "call_spec", "compare_arguments",
           "format_value", "is_scalar_record"]

#: the one list of parameters that never change the numbers a call computes, each with why; neither
#: the compare's argument rows nor the judgement's ``changed_args`` (``judge/own_error.py``) compare them
IGNORED_WHY = {
    "device": "where the call runs: the replay and the bench run on their own device",
    "_stacklevel": "which frame a warning names",
    "inplace": "whether the result overwrites the input (the same values either way)",
    "non_blocking": "whether a copy waits for the transfer (the same values)",
    "memory_format": "the result's layout in memory, not its values",
    "layout": "strided or sparse storage of the same values",
    "pin_memory": "page-locked host memory for faster transfers (the same values)",
    "requires_grad": "whether autograd records the result (the gradients are compared as tensors)",
    "out": "the tensor the result is written to (compared as the output)",
}
IGNORED = frozenset(IGNORED_WHY)
#: parameters holding dimensions, normalised modulo the input's rank
DIM_PARAMS = frozenset({"dim", "dim0", "dim1", "dims", "start_dim", "end_dim", "source", "destination"})
#: APIs whose dimension ranges over rank + 1 (they insert one)
_RANK_PLUS_ONE = frozenset({"unsqueeze", "unsqueeze_", "stack"})
#: relative difference below which two numbers are the same argument
FLOAT_RTOL = 1e-3


# ------------------------------------------------------------------------------ values

@dataclass(frozen=True)
class _Tag:
    """A tagged value of the call spec (dtype, slice, repr ...), compared as text."""

    kind: str
    text: str


@dataclass(frozen=True)
class _Tensor:
    slot: str


_IGNORED_VALUE = _Tag("device", "")
_DTYPE_ALIASES = {"torch.float": "torch.float32", "torch.half": "torch.float16", "torch.double": "torch.float64",
                  "torch.long": "torch.int64", "torch.int": "torch.int32", "torch.short": "torch.int16",
                  "torch.cfloat": "torch.complex64", "torch.cdouble": "torch.complex128"}


def _value(v: Any) -> Any:
    """A call-spec value as a plain, comparable Python value (data only)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, list):
        return tuple(_value(x) for x in v)
    if isinstance(v, dict):
        if "t" in v and isinstance(v["t"], str):
            return _Tensor(v["t"])
        if "tuple" in v and isinstance(v["tuple"], list):
            return tuple(_value(x) for x in v["tuple"])
        if "size" in v and isinstance(v["size"], list):
            return tuple(_value(x) for x in v["size"])
        if "float" in v:
            try:
                return float(v["float"])
            except (TypeError, ValueError):
                return _Tag("repr", str(v["float"]))
        if "device" in v:
            return _IGNORED_VALUE
        if "dtype" in v:
            s = str(v["dtype"])
            return _Tag("dtype", _DTYPE_ALIASES.get(s, s))
        for kind in ("memory_format", "layout", "repr"):
            if kind in v:
                return _Tag(kind, str(v[kind]))
        if "slice" in v and isinstance(v["slice"], list):
            return _Tag("slice", repr(tuple(_value(x) for x in v["slice"])))
        if "ellipsis" in v:
            return _Tag("ellipsis", "...")
    return _Tag("repr", repr(v)[:200])


def format_value(v: Any) -> str:
    """An argument value as the report shows it (``1e-05``, ``'tanh'``, ``torch.float16``, ``[32]``)."""
    if v is MISSING:
        return "(not given)"
    if isinstance(v, _Tag):
        return "slice" + v.text if v.kind == "slice" else v.text
    if isinstance(v, _Tensor):
        return f"tensor {v.slot}"
    if isinstance(v, tuple):
        return "[" + ", ".join(format_value(x) for x in v) + "]"
    if isinstance(v, str):
        return repr(v)
    return repr(v)


class _Missing:
    def __repr__(self) -> str:
        return "(not given)"


MISSING = _Missing()


def call_spec(api: ApiRec) -> Optional[dict]:
    """The call spec of an API record (``extra["call"]`` of one of its tensor records), or None."""
    for t in api.tensors:
        c = t.extra.get("call") if isinstance(t.extra, dict) else None
        if isinstance(c, dict) and isinstance(c.get("args", []), list) and isinstance(c.get("kwargs", {}), dict):
            return c
    return None


def is_scalar_record(t: TensorRec) -> bool:
    """A record of a Python number argument (dtype ``int``/``float``/``<class 'int'>``, shape [])."""
    return not t.shape and not str(t.dtype).startswith("torch.")


@dataclass
class _Param:
    name: str
    value: Any           # normalised; MISSING when the side omitted it and no default is known
    slot: str            # the record slot of this argument on this side ("input.4"), "" when omitted
    given: bool          # passed explicitly (not filled from the signature)
    packed: bool = False  # the call's remaining positional arguments (``x.view(2, 3)``: one record each)


def _is_tensor(v: Any) -> Optional[bool]:
    if isinstance(v, _Tensor):
        return True
    if isinstance(v, tuple):
        return True if any(isinstance(x, _Tensor) for x in v) else (False if v else None)
    if v is None:
        return None
    return False


def _params(api: ApiRec, spec: dict, kw_named: bool) -> Dict[str, _Param]:
    """Parameter name -> value of one side, bound to the API's signature (``runtime/operations.py``),
    defaults filled, dims normalised. A call no signature fits names its positional arguments
    ``input``, ``arg1``, ``arg2``... and its keyword arguments by their keywords."""
    args = [_value(a) for a in spec.get("args", [])]
    kwargs = {str(k): _value(v) for k, v in spec.get("kwargs", {}).items()}
    kw_pos = {k: len(args) + j for j, k in enumerate(kwargs)}

    def slot_of(src: Any) -> str:
        if isinstance(src, int):
            return f"input.{src}"
        return f"input.{src}" if kw_named else f"input.{kw_pos[src]}"

    out: Dict[str, _Param] = {}
    bound = O.bind(api.api_type, api.api_name, args, kwargs, _is_tensor)
    if bound is not None:
        for name, v in bound.values.items():
            given = name in bound.source
            out[name] = _Param(name, v, slot_of(bound.source[name]) if given else "", given,
                               packed=name == bound.packed)
    else:
        for j, v in enumerate(args):
            out[f"arg{j}" if j else "input"] = _Param(f"arg{j}" if j else "input", v, f"input.{j}", True)
        for k, v in kwargs.items():
            out[k] = _Param(k, v, slot_of(k), True)
    rank = _input_rank(api)
    if rank is not None:
        r = rank + (1 if O.operation(api.api_type, api.api_name).name in _RANK_PLUS_ONE else 0)
        for p in out.values():
            if p.name in DIM_PARAMS and r > 0:
                p.value = _norm_dim(p.value, r)
    return out


def _norm_dim(v: Any, rank: int) -> Any:
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return v + rank if -rank <= v < 0 else v
    if isinstance(v, tuple):
        return tuple(_norm_dim(x, rank) for x in v)
    return v


def _input_rank(api: ApiRec) -> Optional[int]:
    nested = None
    for t in api.tensors:
        if t.slot == "input.0" and not is_scalar_record(t):
            return len(t.shape)
        if t.slot == "input.0.0" and nested is None and not is_scalar_record(t):
            nested = len(t.shape)
    return nested


def _leaves(v: Any, path: Tuple[int, ...] = ()) -> List[Tuple[Tuple[int, ...], Any]]:
    if isinstance(v, tuple):
        out: List[Tuple[Tuple[int, ...], Any]] = []
        for i, x in enumerate(v):
            out.extend(_leaves(x, path + (i,)))
        return out
    return [(path, v)]


def _same(a: Any, b: Any) -> bool:
    """Whether two normalised argument values are the same (None equals an omitted value)."""
    if a is MISSING or b is MISSING:
        return (a is MISSING or a is None) and (b is MISSING or b is None)
    if isinstance(a, tuple) != isinstance(b, tuple):
        # torch reads an int where it takes a list of ints as that list (``sum(x, 1)``, ``sum(x, (1,))``)
        one, other = (a, b) if isinstance(a, tuple) else (b, a)
        return len(one) == 1 and isinstance(other, int) and not isinstance(other, bool) and _same(one[0], other)
    if isinstance(a, tuple):
        if len(a) != len(b):
            return False
        return all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, _Tensor) or isinstance(b, _Tensor):
        return isinstance(a, _Tensor) and isinstance(b, _Tensor)
    num = (int, float)
    if isinstance(a, num) and isinstance(b, num) and not isinstance(a, str):
        if isinstance(a, float) or isinstance(b, float):
            fa, fb = float(a), float(b)
            if math.isnan(fa) or math.isnan(fb):
                return math.isnan(fa) and math.isnan(fb)
            if math.isinf(fa) or math.isinf(fb):
                return fa == fb
            return abs(fa - fb) <= FLOAT_RTOL * max(abs(fa), abs(fb))
        return a == b
    return type(a) is type(b) and a == b


def _has_tensor(v: Any) -> bool:
    if isinstance(v, _Tensor):
        return True
    return isinstance(v, tuple) and any(_has_tensor(x) for x in v)


def _only_tensors(v: Any) -> bool:
    """A (nested) list whose every leaf is a tensor: no number of it to compare."""
    return all(isinstance(x, _Tensor) for _, x in _leaves(v))


@dataclass
class ArgLeaf:
    """One scalar leaf of one non-tensor parameter of a paired call (one table row)."""

    param: str
    path: Tuple[int, ...]
    npu_value: Any
    bench_value: Any
    npu_slot: str            # record slot on the NPU side ("input.4", "input.1.0"), "" when not given
    bench_slot: str
    status: str              # "same" | "changed" | "ignored" | "unknown"
    message: str = ""
    npu_given: bool = True
    bench_given: bool = True


def _slot(base: str, path: Tuple[int, ...], packed: bool = False) -> str:
    """The record slot of the leaf at ``path`` of a parameter recorded at ``base``; the leaves of a
    packed parameter (``x.view(2, 3)``) are consecutive positional records (``input.1``, ``input.2``)."""
    if not base or not path:
        return base
    if packed and base.startswith("input.") and base[6:].isdigit():
        return f"input.{int(base[6:]) + path[0]}" + "".join(f".{i}" for i in path[1:])
    return base + "".join(f".{i}" for i in path)


def compare_arguments(npu_api: ApiRec, bench_api: ApiRec, npu_kw_named: bool = False,
                      bench_kw_named: bool = False) -> Optional[List[ArgLeaf]]:
    """The non-tensor arguments of two paired calls, leaf by leaf; None when a side has no call spec.

    ``*_kw_named``: that side names keyword-argument records ``input.{name}`` (msprobe) instead of
    numbering them after the positional ones (ptdbg layout of this project).
    Leaves are listed for every parameter given on at least one side (or changed), in the NPU
    call's order, then the bench's; ignored parameters only where a side has a record for them.
    """
    sn, sb = call_spec(npu_api), call_spec(bench_api)
    if sn is None or sb is None:
        return None
    # the same call made again (every layer, every step) gives the same leaves: computed once;
    # keyed by what the leaves depend on (the arguments, not the spec's dataflow ``"src"``, which
    # names the producing call and so differs from call to call)
    try:
        key = (npu_api.api_type, npu_api.api_name, bench_api.api_type, bench_api.api_name,
               _input_rank(npu_api), _input_rank(bench_api), npu_kw_named, bench_kw_named,
               _frozen((sn.get("args", []), sn.get("kwargs", {}))),
               _frozen((sb.get("args", []), sb.get("kwargs", {}))))
    except (TypeError, ValueError):
        key = None
    if key is not None:
        hit = _MEMO.get(key)
        if hit is not None:
            return hit
    out = _compare(npu_api, bench_api, sn, sb, npu_kw_named, bench_kw_named)
    if key is not None:
        if len(_MEMO) >= _MEMO_MAX:
            _MEMO.clear()
        _MEMO[key] = out
    return out


def _frozen(v: Any) -> bytes:
    """``v`` as bytes that equal another value's only when the two values are equal, types and dict
    order included (the memo's key of a call spec): ``marshal`` version 2 has one code per type and
    no back-references (version 3's depend on reference counts), floats bit for bit; it takes the
    exact built-in types only (a spec's JSON values) and raises ValueError for anything else."""
    return marshal.dumps(v, 2)


_MEMO: Dict[tuple, List["ArgLeaf"]] = {}
_MEMO_MAX = 100_000


def _compare(npu_api: ApiRec, bench_api: ApiRec, sn: dict, sb: dict, npu_kw_named: bool,
             bench_kw_named: bool) -> List["ArgLeaf"]:
    pn = _params(npu_api, sn, npu_kw_named)
    pb = _params(bench_api, sb, bench_kw_named)
    out: List[ArgLeaf] = []
    for name in list(pn) + [k for k in pb if k not in pn]:
        a = pn.get(name, _Param(name, MISSING, "", False))
        b = pb.get(name, _Param(name, MISSING, "", False))
        if not (a.given or b.given):
            continue
        av, bv = a.value, b.value
        if _has_tensor(av) or _has_tensor(bv):
            if not (isinstance(av, _Tensor) or isinstance(bv, _Tensor)) and isinstance(av, tuple) \
                    and isinstance(bv, tuple) and not (_only_tensors(av) and _only_tensors(bv)):
                pass  # a list mixing tensors and numbers: its numbers are compared below
            else:
                continue  # tensors (torch.cat's list, an LSTM's weights): their tensor rows compare them
        ignored = name in IGNORED or av is _IGNORED_VALUE or bv is _IGNORED_VALUE
        if ignored:
            status, msg = "ignored", f"{name}: not compared (does not change the result)"
        elif (av is MISSING) != (bv is MISSING) and not _same(av, bv):
            status = "unknown"
            side = "NPU" if a.given else "bench"
            msg = (f"{name}: given on the {side} side only ({format_value(av if a.given else bv)}), "
                   "its default is unknown: not compared")
        elif _same(av, bv):
            if all(v is None or v is MISSING for v in (av, bv)):
                continue  # None on both sides: nothing to list
            status = "same"
            shown = av if av is not MISSING else bv
            msg = "" if all(isinstance(x, (int, float)) for _, x in _leaves(shown)) else \
                f"{name} = {format_value(shown)}"
        elif _float_dtypes(av, bv):
            # x.to(q.dtype) is bf16 on an autocast device and fp32 on the bench: a floating dtype
            # follows the run's precision; what it does to the numbers is in the tensor rows
            status = "ignored"
            msg = (f"{name}: {_shown(av, a.given)} vs {_shown(bv, b.given)}: a floating-point dtype follows "
                   "the run's precision (the tensors are compared)")
        else:
            status = "changed"
            msg = f"{name}: {_shown(av, a.given)} vs {_shown(bv, b.given)}"
        la = [(p, v) for p, v in _leaves(av) if not isinstance(v, _Tensor)] if av is not MISSING else []
        lb = [(p, v) for p, v in _leaves(bv) if not isinstance(v, _Tensor)] if bv is not MISSING else []
        if isinstance(av, tuple) and not av:
            la = [((), av)]
        if isinstance(bv, tuple) and not bv:
            lb = [((), bv)]
        da, db = dict(la), dict(lb)
        paths = [p for p, _ in la] + [p for p, _ in lb if p not in da]
        if not paths:
            paths = [()]
        for p in paths:
            out.append(ArgLeaf(name, p, da.get(p, MISSING), db.get(p, MISSING),
                               _slot(a.slot, p, a.packed) if p in da else "",
                               _slot(b.slot, p, b.packed) if p in db else "",
                               status, msg, a.given, b.given))
    return out


_FLOAT_DTYPES = frozenset(f"torch.{d}" for d in STEP_FLOATS)


#: ``torch.finfo`` max, eps and tiny of fp16, bf16, fp32 and fp64 (``masked_fill(m, finfo(dtype).min)``)
_FINFO = frozenset(v for d in STEP_FLOATS
                   for v in (FLOATS[d].max, FLOATS[d].eps, FLOATS[d].tiny))


def _float_dtypes(a: Any, b: Any) -> bool:
    """Both values are floating-point dtypes (``torch.bfloat16`` vs ``torch.float32``), or both are
    a floating dtype's characteristic numbers (``torch.finfo(dtype).min`` of bf16 vs fp32)."""
    if all(isinstance(v, _Tag) and v.kind == "dtype" and v.text in _FLOAT_DTYPES for v in (a, b)):
        return True
    return all(type(v) is float and abs(v) in _FINFO for v in (a, b))


def _shown(v: Any, given: bool) -> str:
    s = format_value(v)
    return s if given else f"{s} (default)"


def leaf_value(v: Any) -> Optional[float]:
    """A leaf's value as a float for the statistics columns (bool as 0/1), None when not a number."""
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v) if type(v) is not int or abs(v) < 2 ** 1023 else (math.inf if v > 0 else -math.inf)
    return None


def leaf_dtype(v: Any) -> str:
    """The dtype column of an argument row without a record: the Python type (``float``, ``str`` ...)."""
    if isinstance(v, _Tag):
        return "torch.dtype" if v.kind == "dtype" else v.kind
    if v is None or v is MISSING:
        return "NoneType" if v is None else ""
    if isinstance(v, tuple):
        return "tuple"
    return type(v).__name__


def name_sep(api_key: str) -> str:
    """The separator of a record name after the API key: ``_`` (ptdbg) or ``.`` (msprobe)."""
    return "." if api_key.endswith((".forward", ".backward")) else "_"



def _plain_value(v: Any) -> Any:
    """A normalised argument value as JSON data: tuples as lists, tagged values as ``{kind: text}``."""
    if isinstance(v, tuple):
        return [_plain_value(x) for x in v]
    if isinstance(v, _Tag):
        return {v.kind: v.text}
    return v


def bound_arguments(api: ApiRec, kw_named: bool = False) -> Optional[Dict[str, Any]]:
    """The non-tensor arguments of one forward call in their bound form, as JSON data: every
    parameter of the API's signature by name, defaults filled (an omitted ``eps`` is ``1e-05``),
    dimensions normalised modulo the input's rank, and without what never changes the numbers:
    the :data:`IGNORED` parameters, devices, ``None`` (equal to an omitted parameter) and the tensors
    (those are the call's tensor records). None when the call has no spec or it fits nothing."""
    spec = call_spec(api)
    if spec is None:
        return None
    try:
        params = _params(api, spec, kw_named)
    except Exception:  # a malformed spec: no bound form
        return None
    out: Dict[str, Any] = {}
    for name, p in params.items():
        v = p.value
        if name in IGNORED or v is MISSING or v is None or v is _IGNORED_VALUE or _has_tensor(v):
            continue
        out[name] = _plain_value(v)
    return out
