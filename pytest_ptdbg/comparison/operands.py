"""The operands of a commutative call, in the order that pairs them: ``x + a`` against ``a + x``. No torch.

``x + a`` and ``a + x`` compute the same bits (``runtime/operations.COMMUTATIVE``), but bind their
operands the other way round (``input`` is ``x`` on one side, ``a`` on the other). For each paired
forward call of such an operation, :func:`cross_operands` decides whether the bench's operands are
the device's crossed, and if so renames the bench records (``input.input`` <-> ``input.other``,
and the gradients ``output.input`` <-> ``output.other`` of its backward record), so its tensor rows
compare ``x`` with ``x``. Evidence, strongest first: the dataflow (each operand's producer paired
with the other side's producer of the crossed operand), the shapes (only the crossed order
matches), the statistics (the crossed order is clearly closer). Without evidence the order stays.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from pytest_ptdbg.format import records
from pytest_ptdbg.runtime.operations import COMMUTATIVE

if TYPE_CHECKING:
    from pytest_ptdbg.dump.reader import ApiRec, TensorRec

__all__ = ["cross_operands", "operand_slots"]

_A, _B = "input.input", "input.other"
_SWAP = {_A: _B, _B: _A, "output.input": "output.other", "output.other": "output.input"}
#: the crossed order must be this much closer (statistics) to be taken
_CLEARLY = 0.5


def operand_slots(api: ApiRec) -> Optional[Tuple[TensorRec, TensorRec]]:
    """The two tensor operands of a forward call of a commutative operation, else None."""
    if api.op not in COMMUTATIVE or api.direction != records.FORWARD:
        return None
    a = b = None
    for t in api.tensors:
        if t.io != "input":
            continue
        if t.param == _A and t.shape is not None:
            a = t
        elif t.param == _B:
            b = t
        elif t.param == "input.alpha" and t.stats and t.stats[0] != 1:
            return None   # x + 2 * a is not a + 2 * x
    if a is None or b is None or not str(a.dtype).startswith("torch.") or not str(b.dtype).startswith("torch."):
        return None
    return a, b


def _distance(t: TensorRec, u: TensorRec) -> float:
    if tuple(t.shape) != tuple(u.shape):
        return math.inf
    total = 0.0
    for x, y in zip(t.stats or (), u.stats or ()):
        try:
            fx, fy = float(x), float(y)
        except (TypeError, ValueError):
            return math.nan
        if not (math.isfinite(fx) and math.isfinite(fy)):
            if fx != fy:
                total += 1.0
            continue
        total += abs(fx - fy) / max(abs(fx), abs(fy), 1e-30)
    return total


def _producer(api: ApiRec, slot: str) -> Optional[Tuple[str, str]]:
    return api.sources.get(slot) if api.sources else None


def _crossed(na: ApiRec, ba: ApiRec, partner: Dict[str, str]) -> bool:
    on, ob = operand_slots(na), operand_slots(ba)
    if on is None or ob is None:
        return False
    na_a, na_b = _producer(na, _A), _producer(na, _B)
    ba_a, ba_b = _producer(ba, _A), _producer(ba, _B)
    if na_a and na_b and ba_a and ba_b and na_a != na_b:
        def same(n: Tuple[str, str], b: Tuple[str, str]) -> bool:
            return partner.get(n[0]) == b[0] and n[1] == b[1]
        if same(na_a, ba_b) and same(na_b, ba_a):
            return True
        if same(na_a, ba_a) and same(na_b, ba_b):
            return False
    straight = _distance(on[0], ob[0]) + _distance(on[1], ob[1])
    crossed = _distance(on[0], ob[1]) + _distance(on[1], ob[0])
    if math.isnan(straight) or math.isnan(crossed):
        return False
    if math.isinf(straight):
        return not math.isinf(crossed)
    return crossed < _CLEARLY * straight


def cross_operands(steps: Sequence[Tuple[Optional[ApiRec], Optional[ApiRec]]]) -> List[str]:
    """Rename the bench operands of the paired commutative calls whose order is crossed; returns
    the device forward keys of those calls."""
    partner = {n.key: b.key for n, b in steps if n is not None and b is not None and n.direction == records.FORWARD}
    bench_bwd = {(b.family, b.call_index): b for n, b in steps if b is not None and b.direction == records.BACKWARD}
    out: List[str] = []
    for na, ba in steps:
        if na is None or ba is None or na.direction != records.FORWARD or na.op not in COMMUTATIVE:
            continue
        if not _crossed(na, ba, partner):
            continue
        out.append(na.key)
        for rec in (ba, bench_bwd.get((ba.family, ba.call_index))):
            if rec is None:
                continue
            for t in rec.tensors:   # (the dataflow keeps its names: binding the dump again starts over)
                t.param = _SWAP.get(t.param, t.param)
    return out
