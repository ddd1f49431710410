"""Arguments are data: rebuild a call spec's arguments for replay, refusing anything else.

Accepted (``docs/DESIGN.md``'s call spec): tensors of the dump (``{"t": "input.0"}``), numbers
(integers within 64 bits), bools, None, ``{"size": [...]}`` of ints, slices, ellipsis, tuples
and lists of these, ``{"float": "nan"|"inf"|"-inf"}``, ``{"list_data"|"tuple_data": "input.0"}``
(a long list of numbers rebuilt from its saved data, which was recorded in float64/int64/bool);
``dtype``/``layout``/``memory_format`` tags only through the tables of
:mod:`pytest_ptdbg.replayer.allowlist`; ``{"device": ...}`` tags and device strings become the
replay device (their text is never parsed); a string only where the rule of its (API,
parameter) allows it (:data:`~pytest_ptdbg.replayer.allowlist.STRING_RULES`). Never a callable.
Anything else raises :class:`~pytest_ptdbg.judge.ReplayRefused` naming the record and argument.
"""
from __future__ import annotations

import functools
import re
from typing import Any, Mapping, Optional, Tuple

import torch

from pytest_ptdbg.replayer import allowlist
from pytest_ptdbg.errors import NotReplayable, ReplayRefused
from pytest_ptdbg.runtime.dtypes import FLOATS, STEP_FLOATS

__all__ = ["decode_call", "check_call", "family_of", "follows_precision", "with_own_precision"]

#: nesting deeper than this is refused (a crafted spec must not exhaust the stack)
MAX_DEPTH = 16
#: the integers torch takes (int64; uint64 for bit patterns)
_INT_MIN, _INT_MAX = -(2 ** 63), 2 ** 64 - 1
_KEYWORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_FAMILY = re.compile(r"^(?P<type>[A-Za-z]+)_(?P<api>.+?)(?:_\d+_(?:forward|backward))?$")


def family_of(api: Optional[str]) -> Optional[str]:
    """``Functional_softmax`` of ``Functional_softmax_0_forward`` (a family is returned as is)."""
    if not api or not isinstance(api, str):
        return None
    return _family_of(api)


@functools.lru_cache(maxsize=4096)  # a call is decoded for each of its replays
def _family_of(api: str) -> Optional[str]:
    from pytest_ptdbg.format import records

    try:
        return records.parse_name(api).api_family
    except ValueError:
        m = _FAMILY.match(api)
        return f"{m.group('type')}_{m.group('api')}" if m else None


def _short_int(v: int) -> str:
    s = str(v) if abs(v) < 10 ** 40 else f"{'-' if v < 0 else ''}~10^{len(str(abs(v))) - 1}"
    return s


class _Ctx:
    def __init__(self, record: str, family: Optional[str], tensors: Mapping[str, Any], device: Any) -> None:
        self.record, self.family, self.tensors, self.device = record, family, tensors, device

    def refuse(self, where: str, reason: str) -> ReplayRefused:
        return ReplayRefused(self.record, reason, where)


def _decode(v: Any, c: _Ctx, where: str, depth: int, pos: Optional[int] = None, kw: Optional[str] = None) -> Any:
    if depth > MAX_DEPTH:
        raise c.refuse(where, f"nested deeper than {MAX_DEPTH} levels")
    if v is None or isinstance(v, bool):
        return v
    if type(v) is float:
        return v
    if type(v) is int:
        if not _INT_MIN <= v <= _INT_MAX:
            raise c.refuse(where, f"integer {_short_int(v)} is out of range (64-bit integers only)")
        return v
    if isinstance(v, str):
        rule = allowlist.string_rule(c.family, pos, kw) if (depth == 0 and c.family) else None
        shown = repr(v[:60]) + ("..." if len(v) > 60 else "")
        if rule is None:
            why = "a string is not accepted here" if c.family else "a string needs its API to be judged"
            raise c.refuse(where, f"{why} (got {shown})")
        if rule.device:
            return c.device
        if not rule.allows(v):
            raise c.refuse(where, f"{shown} is not {rule.describe()}")
        return v
    if isinstance(v, list):
        return [_decode(x, c, f"{where}[{j}]", depth + 1) for j, x in enumerate(v)]
    if not isinstance(v, dict) or len(v) != 1:
        raise c.refuse(where, f"malformed value {str(v)[:80]!r} (expected data or one tag)")
    (tag, x), = v.items()
    if tag == "t":
        if not isinstance(x, str):
            raise c.refuse(where, "a tensor reference must be a string such as 'input.0'")
        if x not in c.tensors:
            raise NotReplayable(f"{c.record}: argument {where} needs tensor {x!r}, which was not given "
                                f"(have {sorted(c.tensors)[:8]})")
        return c.tensors[x]
    if tag in ("list_data", "tuple_data"):  # a long list of numbers, recorded as data (dump/call_spec.py)
        if not isinstance(x, str):
            raise c.refuse(where, f"a {tag} reference must be a string such as 'input.0'")
        if x not in c.tensors:
            raise NotReplayable(f"{c.record}: argument {where} is a list of numbers recorded as data {x!r}, "
                                "which was not saved (statistics only)")
        t = c.tensors[x]
        if not isinstance(t, torch.Tensor) or t.dim() == 0 or t.dim() > MAX_DEPTH:
            raise c.refuse(where, f"the data {x!r} of a list is not a tensor of 1 to {MAX_DEPTH} dimensions")
        vals = t.detach().cpu().tolist()
        return vals if tag == "list_data" else _tuples(vals)
    if tag == "float":
        if x not in ("nan", "inf", "-inf"):
            raise c.refuse(where, f"float tag {str(x)[:40]!r} is not 'nan', 'inf' or '-inf'")
        return float(x)
    if tag in ("dtype", "layout", "memory_format"):
        of = {"dtype": allowlist.dtype_of, "layout": allowlist.layout_of,
              "memory_format": allowlist.memory_format_of}[tag]
        got = of(x)
        if got is None:
            raise c.refuse(where, f"{tag} tag {str(x)[:60]!r} is not a torch {tag} of the table "
                                  f"({', '.join(allowlist.tag_names(tag)[:6])}, ...)")
        return got
    if tag == "device":
        if not isinstance(x, str) or len(x) > 64:
            raise c.refuse(where, "a device tag must be a short string")
        return c.device
    if tag == "size":
        if not isinstance(x, list) or not all(type(i) is int and _INT_MIN <= i <= _INT_MAX for i in x):
            raise c.refuse(where, "a size must be a list of 64-bit integers")
        return torch.Size(x)
    if tag == "slice":
        if not isinstance(x, list) or len(x) != 3:
            raise c.refuse(where, "a slice must be [start, stop, step]")
        parts = [_decode(p, c, f"{where}.slice[{j}]", depth + 1) for j, p in enumerate(x)]
        if not all(p is None or type(p) is int or isinstance(p, torch.Tensor) for p in parts):
            raise c.refuse(where, "slice bounds must be integers, None or tensors")
        return slice(*parts)
    if tag == "ellipsis":
        if x is not True:
            raise c.refuse(where, "an ellipsis tag must be true")
        return Ellipsis
    if tag == "tuple":
        if not isinstance(x, list):
            raise c.refuse(where, "a tuple tag must hold a list")
        return tuple(_decode(p, c, f"{where}[{j}]", depth + 1) for j, p in enumerate(x))
    if tag == "repr":
        raise NotReplayable(f"{c.record}: argument {where} {str(x)[:200]!r} was recorded only as its repr "
                            "and cannot be rebuilt")
    raise c.refuse(where, f"unknown tag {str(tag)[:40]!r}")


def _tuples(v: Any) -> Any:
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


def decode_call(spec: Any, tensors: Mapping[str, Any], api: Optional[str] = None,
                device: Any = None) -> Tuple[tuple, dict]:
    """``(args, kwargs)`` of a call spec, as data only (see the module docstring).

    ``api``: the record's API key or family (its string rules apply; without it every string is
    refused). ``tensors`` maps ``"input.0"`` to tensors; ``device`` replaces every device (default
    cpu). Raises ReplayRefused for what is not data, NotReplayable for a repr or a missing tensor.
    """
    record = str(api) if api else "call"
    c = _Ctx(record, family_of(api), tensors, torch.device(device) if device is not None else torch.device("cpu"))
    if not isinstance(spec, Mapping) or not isinstance(spec.get("args"), list):
        raise c.refuse("", f"not a call spec (needs an 'args' list): {str(spec)[:120]}")
    kw_spec = spec.get("kwargs") or {}
    if not isinstance(kw_spec, Mapping):
        raise c.refuse("", "'kwargs' of the call spec is not an object")
    args = tuple(_decode(a, c, f"#{i}", 0, pos=i) for i, a in enumerate(spec["args"]))
    kwargs = {}
    for k, v in kw_spec.items():
        if not isinstance(k, str) or not _KEYWORD.fullmatch(k) or k.startswith("__"):
            raise c.refuse(f"{str(k)[:40]!r}", "a keyword must be a plain identifier")
        kwargs[k] = _decode(v, c, repr(k), 0, kw=k)
    return args, kwargs


class _AnyTensor(Mapping):
    """Every tensor key is present (script generation checks the spec without loading data)."""

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str)

    def __getitem__(self, key: str) -> Any:
        return torch.empty(0)

    def __iter__(self):
        return iter(())

    def __len__(self) -> int:
        return 0


def check_call(spec: Any, api: str) -> None:
    """Raise ReplayRefused/NotReplayable when ``spec`` is not a replayable call of ``api``
    (its API in the allowlist, its arguments data); loads nothing, calls nothing."""
    from pytest_ptdbg.format import records

    p = records.parse_name(api)
    allowlist.entry(p.api_type, p.api_name, api)
    decode_call(spec, _AnyTensor(), api)


@functools.lru_cache(maxsize=1)
def _finfo_numbers() -> dict:
    """|characteristic number| -> the dtype names it belongs to."""
    vals: dict = {}
    for d in STEP_FLOATS:   # runtime/dtypes.py (finfo's tiny is its smallest_normal)
        for v in (FLOATS[d].max, FLOATS[d].eps, FLOATS[d].tiny):
            vals.setdefault(v, set()).add(f"torch.{d}")
    return vals


def follows_precision(a: Any, b: Any, seen: Any = None) -> bool:
    """Two recorded numbers that are the same characteristic number (``finfo(dtype).max``, ``.min``,
    ``.eps``, ``.tiny``) of two floating dtypes: ``torch.finfo(x.dtype).max`` follows the run's
    precision (bf16 under autocast, float32 on the bench), it is not another argument. With
    ``seen`` (the floating dtypes the device computed in before), ``a``'s dtype must be among them
    or float32/float64 (an fp16 ``finfo.min`` mask in a float32 run is a change, not a following)."""
    if type(a) is not float or type(b) is not float or a == b or (a > 0) != (b > 0):
        return False
    f = _finfo_numbers()
    da, db = f.get(abs(a)), f.get(abs(b))
    if not da or not db:
        return False
    if seen is None:
        return True
    return bool(da & (set(seen) | {"torch.float32", "torch.float64"}))


def with_own_precision(device_spec: Any, bench_spec: Any, seen: Any = ()) -> Any:
    """``bench_spec`` with every number that :func:`follows_precision` of the device's number at
    the same place (in a precision among ``seen``) replaced by the device's: a replay from the
    device's inputs takes the bench's arguments, except those that only follow the precision the
    device ran in (T5's ``torch.where(..., finfo(dtype).max - 1000, finfo(dtype).max)``)."""
    def merge(d: Any, b: Any) -> Any:
        if follows_precision(d, b, seen):
            return d
        if isinstance(d, list) and isinstance(b, list) and len(d) == len(b):
            return [merge(x, y) for x, y in zip(d, b)]
        if isinstance(d, dict) and isinstance(b, dict) and set(d) == set(b) and len(b) == 1 and "tuple" in b:
            return {"tuple": merge(d["tuple"], b["tuple"])}
        return b

    if not isinstance(device_spec, Mapping) or not isinstance(bench_spec, Mapping):
        return bench_spec
    out = dict(bench_spec)
    out["args"] = merge(device_spec.get("args"), bench_spec.get("args"))
    dk, bk = device_spec.get("kwargs") or {}, bench_spec.get("kwargs") or {}
    if isinstance(dk, Mapping) and isinstance(bk, Mapping):
        out["kwargs"] = {k: merge(dk[k], v) if k in dk else v for k, v in bk.items()}
    return out
