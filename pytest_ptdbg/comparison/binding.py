"""A dump's calls in their bound form: each call's operation, and each tensor named by its parameter.

:func:`bind_apis` sets, on every API record of a dump, ``op`` (the operation it computes,
``runtime/operations.py``: ``Functional_softmax``, ``Torch_softmax`` and ``Tensor_softmax`` are
``softmax``) and, on every tensor record, ``param``: the slot named by the parameter it was passed
as (``input.weight``, ``input.tensors.1`` for the second tensor of ``torch.cat``'s list), so a call
that passes ``weight`` by keyword and one that passes it by position hold the same slots. A backward
record's gradient for an input is ``output.{parameter}``; the dataflow (``ApiRec.sources``) names
each input by its parameter too. Records whose call spec is missing (ptdbg
v4 dumps without one) or whose call fits no signature keep their recorded slot.

Pairing (``pairing.py``) and the table's tensor rows pair by these; the record names (ptdbg's
``..._input.4``) stay what the CSV shows.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Tuple

from pytest_ptdbg.comparison import arguments as A
from pytest_ptdbg.format import records
from pytest_ptdbg.runtime import operations as O

if TYPE_CHECKING:
    from pytest_ptdbg.dump.reader import ApiRec

__all__ = ["bind_apis", "bound_slots", "bound_slot"]

#: call specs' slot mappings by their structure (``_MEMO``) and by their values (``_MEMO_VALUES``)
_MEMO: Dict[Tuple[Any, ...], Dict[str, str]] = {}
_MEMO_VALUES: Dict[Tuple[Any, ...], Dict[str, str]] = {}
_MEMO_MAX = 100_000


def _structure(v: Any) -> Any:
    """A call-spec value's shape for the memo: ``T`` a tensor, lists by their elements, a tagged
    value by its tag, ``None``, and a Python value by its type (not its value)."""
    if isinstance(v, dict):
        if "t" in v:
            return "T"
        if "tuple" in v and isinstance(v["tuple"], list):
            return ("tuple",) + tuple(_structure(x) for x in v["tuple"])
        return tuple(v)
    if isinstance(v, list):
        return ("list",) + tuple(_structure(x) for x in v)
    if v is None:
        return None
    return type(v).__name__


def _walk(v: Any, path: Tuple[int, ...], out: List[Tuple[Tuple[int, ...], Any]]) -> None:
    if isinstance(v, tuple):
        for i, x in enumerate(v):
            _walk(x, path + (i,), out)
    else:
        out.append((path, v))


def _suffix(path: Tuple[int, ...]) -> str:
    return "".join(f".{i}" for i in path)


def bound_slots(api: ApiRec, spec: dict, kw_named: bool = False) -> Dict[str, str]:
    """``{recorded input slot: bound slot}`` of one forward call (``input.2`` -> ``input.bias``)."""
    args, kwargs = spec.get("args", []), spec.get("kwargs", {})
    rank = A._input_rank(api)
    try:
        # first by the spec's values (a call made again, every layer, every step: cheaper to key);
        # equal values have an equal structure, so this memo gives what the one below gives
        vkey: Optional[Tuple[Any, ...]] = (api.api_type, api.api_name, rank, kw_named, A._frozen((args, kwargs)))
    except (TypeError, ValueError):
        vkey = None
    if vkey is not None:
        hit = _MEMO_VALUES.get(vkey)
        if hit is not None:
            return hit
    try:
        # what the mapping depends on: the API, its input's rank (dims), and the spec's structure
        # (tensors, lists, Python values by kind), never the values of its numbers
        key: Optional[Tuple[Any, ...]] = (api.api_type, api.api_name, rank, kw_named,
                                          tuple(_structure(a) for a in args),
                                          tuple((k, _structure(v)) for k, v in kwargs.items()))
    except (TypeError, RecursionError):
        key = None
    if key is not None:
        hit = _MEMO.get(key)
        if hit is not None:
            _remember(_MEMO_VALUES, vkey, hit)
            return hit
    out: Dict[str, str] = {}
    for p in A._params(api, spec, kw_named).values():
        if not p.given:
            continue
        leaves: List[Tuple[Tuple[int, ...], Any]] = []
        _walk(p.value, (), leaves)
        for path, v in leaves:
            bound = f"input.{p.name}{_suffix(path)}"
            if isinstance(v, A._Tensor):
                out[v.slot] = bound
            elif p.slot:
                out[A._slot(p.slot, path, p.packed)] = bound
    _remember(_MEMO, key, out)
    _remember(_MEMO_VALUES, vkey, out)
    return out


def _remember(memo: Dict[Tuple[Any, ...], Dict[str, str]], key: Optional[Tuple[Any, ...]],
              value: Dict[str, str]) -> None:
    if key is not None:
        if len(memo) >= _MEMO_MAX:
            memo.clear()
        memo[key] = value


def bound_slot(slot: str, io: str, direction: str, mapping: Dict[str, str]) -> str:
    """The bound name of one record slot of a call whose forward inputs map by ``mapping``."""
    if direction == records.FORWARD:
        return mapping.get(slot, slot) if io == "input" else slot
    if io == "output":   # the gradient for forward input k
        b = mapping.get("input" + slot[len("output"):])
        return "output" + b[len("input"):] if b else slot
    return slot


def bind_apis(apis: Iterable[ApiRec], kw_named: bool = False) -> None:
    """Set ``op`` on every API record and ``param`` on every tensor record (see the module docstring)."""
    apis = list(apis)
    by_call: Dict[Tuple[str, int], Dict[str, str]] = {}
    for api in apis:
        if api.direction != records.FORWARD:
            continue
        spec = A.call_spec(api)
        if spec is None:
            continue
        try:
            by_call[(api.family, api.call_index)] = bound_slots(api, spec, kw_named)
        except Exception:  # a malformed spec: this call keeps its recorded slots
            continue
    for api in apis:
        api.op = O.operation(api.api_type, api.api_name).name
        mapping = by_call.get((api.family, api.call_index))
        for t in api.tensors:
            t.param = bound_slot(t.slot, t.io, api.direction, mapping) if mapping else t.slot
        if mapping and api.sources:   # the dataflow names each input by its parameter too
            api.sources = {mapping.get(k, k): v for k, v in api.sources.items()}
