"""Judge a fresh run against its golden, and turn a golden into a dump ``compare()`` reads.

A call is what it computes, not how it was spelled: golden and fresh run are read in their bound
form (``comparison/binding.py``, ``comparison/arguments.py``): a call's identity is its operation
(``F.softmax``, ``torch.softmax`` and ``x.softmax`` are ``softmax``), its tensors are named by the
parameter they were passed as, its non-tensor arguments are bound to the signature (defaults
filled, negative dims normalised), so a refactor that computes the same numbers passes.

- :func:`golden_lines`: a fresh run's dump (``.pkl`` of this project, read with
  ``dump/reader.py``) and its stable call keys -> its calls and the golden's lines
  (what ``golden.render`` writes);
- :func:`pair_calls`: golden calls and fresh calls paired by a sequence alignment, as
  ``comparison/pairing.py`` pairs two dumps (same operation, compatible tensor structure; an
  equal stable key is a bonus): a call added or removed stays local, a call whose module path
  changed (``nn.Linear`` replaced by ``F.linear`` in the parent's forward) still pairs;
- :func:`check`: the golden-specific checks of a fresh run against a golden: calls missing or
  new, non-tensor arguments, tensor dtypes and shapes, NaN/Inf counts, and statistics drift
  beyond what the tensor's dtype explains (:data:`DRIFT_TOL`) and beyond the rounding level of
  the data the record was computed from (:func:`noise_floor`: a mathematically-zero bias
  gradient is rounding noise, judged at its inputs' scale); the culprit is the first structural
  difference in execution order, or, when only statistics drift, the first API whose outputs
  drift while its inputs do not; the message lists one line per changed call, by module;
- :func:`write_reference_dump`: the golden as a statistics-only ptdbg dump (``.pkl`` written with
  ``format/records`` helpers and a manifest) whose API keys and record slots are the fresh run's
  own for the paired call, so that ``compare()`` pairs call by call; golden calls the fresh run
  does not make get keys of their own and stay unpaired (a failure, never a pass).

Reads only JSON lines (the dump is data).
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from pytest_ptdbg.comparison import arguments as A
from pytest_ptdbg.comparison.binding import bind_apis
from pytest_ptdbg.comparison.pairing import ApiSig, align, dtype_class, pair_leftovers, repair_by_dataflow
from pytest_ptdbg.dump.reader import ApiRec, read_dump
from pytest_ptdbg.format import manifest, records
from pytest_ptdbg.judge.budget import SENTINEL, unit_roundoff
from pytest_ptdbg.plugin.golden import (DIRECTIONS, Call, Golden, encode, key_module, key_name, reference,
                                        round_stat, round_stats, stat_value, tensor_entry)
from pytest_ptdbg.runtime.dtypes import STEP_FLOATS
from pytest_ptdbg.runtime.operations import COMMUTATIVE, operation
from pytest_ptdbg.runtime.text import TextEnum

#: statistics drift (relative to the tensor's range; the L2 norm relative to itself) allowed per
#: dtype: what rounding and summation order explain on another CPU or thread count, far below
#: what a changed op does. Integer and bool values must agree exactly.
DRIFT_TOL = {"float64": 1e-9, "float32": 5e-4, "float16": 4e-3, "bfloat16": 3e-2,
             # a Python float argument, kept to 7 significant digits
             "float": 2e-5}
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
#: changed calls listed in a failure message
_MAX_SHOWN = 30
#: records a failure message shows as the golden and this run hold them
_MAX_RECORDS = 3
#: where calls made outside any module of the model are (``callkeys.OUTSIDE``)
_OUTSIDE = "step"


def _dtype(raw: Any) -> str:
    return str(raw).replace("torch.", "")


def _clean(obj: Any) -> Any:
    """Bound arguments without what changes from run to run: object addresses in reprs; floats at
    the golden's digits."""
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    if isinstance(obj, str):
        return _ADDRESS.sub("0x?", obj)
    if isinstance(obj, float):
        return round_stat(obj)
    return obj


@dataclass
class FreshDump:
    """A fresh run's dump read for the golden: its calls, its golden lines, and what the
    reference dump and the messages need of its records."""

    lines: List[Dict[str, Any]]
    api_of: Dict[str, str]                       # stable key -> api key (Functional_linear_3)
    stacks: Dict[str, List[Any]] = field(default_factory=dict)   # api key -> frames
    calls: List[Call] = field(default_factory=list)
    #: stable key -> {bound tensor name (forward.input.weight): recorded slot (input.1)}
    slots: Dict[str, Dict[str, str]] = field(default_factory=dict)
    #: stable key -> the forward call spec as recorded
    specs: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    #: stable key -> [(recorded slot, bound parameter path, dtype, stats)] of its Python number records
    scalars: Dict[str, List[Tuple[str, Tuple[Any, ...], str, List[Any]]]] = field(default_factory=dict)
    #: stable key -> {direction: position of its record in the dump}
    order: Dict[str, Dict[str, int]] = field(default_factory=dict)
    #: stable keys of the commutative calls whose operands were put in the golden's order
    crossed: Set[str] = field(default_factory=set)


def _fingerprint1(entry: Dict[str, Any]) -> str:
    return json.dumps([entry.get("dtype"), entry.get("shape"), entry.get("stats"),
                       entry.get("nonfinite")])


def golden_lines(pkl: str, keys: Dict[str, str]) -> FreshDump:
    """The calls and golden lines of the fresh dump ``pkl``; ``keys`` maps api keys to stable keys
    (an api key without one gets ``step/{operation}#{n}``, e.g. when the call keys could not be
    attached)."""
    dump = read_dump(pkl, data_dir="")
    bind_apis(dump.apis)
    by_call: Dict[Tuple[str, int], Dict[str, ApiRec]] = {}
    for api in dump.apis:
        by_call.setdefault((api.family, api.call_index), {})[api.direction] = api
    counts: Dict[str, int] = {}
    fresh = FreshDump([], {})
    calls: Dict[Tuple[str, int], Call] = {}
    for (family, index), recs in by_call.items():
        any_rec = next(iter(recs.values()))
        api_key = f"{family}_{index}"
        key = keys.get(api_key)
        if key is None:
            op = any_rec.op or operation(any_rec.api_type, any_rec.api_name).name
            n = counts.get(op, 0)
            counts[op] = n + 1
            key = f"{_OUTSIDE}/{op}#{n}"
            while key in fresh.api_of:
                key += "'"
        fresh.api_of[key] = api_key
        fwd = recs.get(records.FORWARD)
        args = A.bound_arguments(fwd) if fwd is not None else None
        spec = A.call_spec(fwd) if fwd is not None else None
        if spec is not None:
            fresh.specs[key] = spec
        call = Call(key, family, _clean(args) if args is not None else None)
        slots: Dict[str, str] = {}
        for direction in DIRECTIONS:
            rec = recs.get(direction)
            if rec is None:
                continue
            fresh.order.setdefault(key, {})[direction] = rec.order
            if rec.stack and api_key not in fresh.stacks:
                fresh.stacks[api_key] = rec.stack
            for t in rec.tensors:
                if args is not None and A.is_scalar_record(t):
                    path = (t.param or t.slot).split(".")[1:]
                    fresh.scalars.setdefault(key, []).append(
                        (t.slot, tuple(int(x) if x.isdigit() else x for x in path), str(t.dtype),
                         list(t.stats)))
                    continue
                name = f"{direction}.{t.param or t.slot}"
                if name in call.tensors:  # two records bound to one slot: keep the recorded one
                    name = f"{direction}.{t.slot}"
                dtype = _dtype(t.dtype)
                entry: Dict[str, Any] = {"dtype": dtype, "shape": list(t.shape),
                                         "stats": round_stats(t.stats if isinstance(t.stats, list) else [],
                                                              dtype)}
                nan, inf = int(t.extra.get("nan", 0) or 0), int(t.extra.get("inf", 0) or 0)
                if nan or inf:
                    entry["nonfinite"] = [nan, inf]
                call.tensors[name] = entry
                slots[name] = t.slot
        fresh.slots[key] = slots
        calls[(family, index)] = call
    # golden lines: references to an earlier entry with the same values, in dump order
    seen: Dict[str, Tuple[str, str]] = {}
    written: Dict[str, Dict[str, Any]] = {}
    for api in dump.apis:
        call = calls[(api.family, api.call_index)]
        line = written.get(call.key)
        if line is None:
            line = written[call.key] = {"k": call.key, "api": call.api}
            if call.args is not None:
                line["args"] = call.args
        part = line.setdefault(api.direction, {})
        prefix = api.direction + "."
        mine = [t for t in call.tensors if t.startswith(prefix)]
        for name in sorted(mine, key=lambda x: (".output" in x, )):   # inputs before outputs
            entry = call.tensors[name]
            fp = _fingerprint1(entry)
            ref = seen.get(fp)
            if ".input" in name and ref is not None and entry.get("shape"):
                part[name[len(prefix):]] = reference(*ref)
                if ref[0].startswith("forward.output"):
                    call.sources[name] = (ref[1], ref[0])
            else:
                part[name[len(prefix):]] = tensor_entry(entry["dtype"], entry["shape"], entry["stats"],
                                                        entry.get("nonfinite"))
                seen[fp] = (name, call.key)
    fresh.calls = list(calls.values())
    fresh.lines = [written[c.key] for c in fresh.calls if c.key in written]
    for line in fresh.lines:
        for d in DIRECTIONS:
            if d in line and not line[d]:
                del line[d]
    return fresh


# ------------------------------------------------------------------------------ pairing

def _struct(call: Call) -> Tuple[Tuple[str, str, Tuple[int, ...]], ...]:
    st = [(t, dtype_class(str(e.get("dtype", ""))), tuple(e.get("shape") or ()))
          for t, e in call.tensors.items() if t.startswith("forward.")]
    if call.op in COMMUTATIVE:   # x + a and a + x: one structure (their rows: cross_operands)
        ops = sorted((c, sh) for t, c, sh in st if t in _CROSS)
        st = [e for e in st if e[0] not in _CROSS] + [(f"forward.input.operand{k}", c, sh)
                                                      for k, (c, sh) in enumerate(ops)]
    return tuple(sorted(st))


def pair_calls(golden_calls: Sequence[Call], fresh_calls: Sequence[Call]
               ) -> List[Tuple[Optional[int], Optional[int]]]:
    """``(golden index | None, fresh index | None)`` in order: the calls aligned as
    ``comparison/pairing.py`` aligns two dumps (same operation, compatible tensor structure,
    order kept), an equal stable key counting as an equal call index (a bonus, never required)."""
    ids: Dict[str, int] = {}
    g = [ApiSig(c.op, "call", ids.setdefault(c.key, len(ids)), _struct(c)) for c in golden_calls]
    f = [ApiSig(c.op, "call", ids.setdefault(c.key, len(ids)), _struct(c)) for c in fresh_calls]
    steps, _ = pair_leftovers(align(f, g), f, g)
    if any(c.sources for c in golden_calls) and any(c.sources for c in fresh_calls):
        # independent calls made in another order (k's view before q's): paired by what they read
        steps, _ = repair_by_dataflow([_FlowCall(c) for c in fresh_calls], [_FlowCall(c) for c in golden_calls],
                                      f, g, steps)
    return [(j, i) for i, j in steps]


class _FlowCall:
    """A golden call as the dataflow repair reads a call record: its key, direction and sources."""

    __slots__ = ("key", "direction", "sources")

    def __init__(self, call: Call) -> None:
        self.key, self.direction, self.sources = call.key, records.FORWARD, call.sources


_CROSS = {"forward.input.input": "forward.input.other", "forward.input.other": "forward.input.input",
          "backward.output.input": "backward.output.other", "backward.output.other": "backward.output.input"}


def paired_steps(golden: Golden, fresh: FreshDump) -> List[Tuple[Optional[int], Optional[int]]]:
    """:func:`pair_calls` of the golden and this run, with each paired commutative call's operands
    in the golden's order (:func:`cross_operands`, applied once per fresh dump)."""
    steps = pair_calls(golden.calls, fresh.calls)
    partner = {fresh.calls[fi].key: golden.calls[gi].key for gi, fi in steps if gi is not None and fi is not None}
    for gi, fi in steps:
        if gi is None or fi is None:
            continue
        f = fresh.calls[fi]
        if f.key not in fresh.crossed and cross_operands(golden.calls[gi], f, partner):
            fresh.crossed.add(f.key)
            fresh.slots[f.key] = {_CROSS.get(t, t): v for t, v in fresh.slots.get(f.key, {}).items()}
    return steps


def cross_operands(g: Call, f: Call, partner: Dict[str, str]) -> bool:
    """Rename the operands of ``f`` (this run) when they are ``g``'s (the golden's) crossed, for a
    commutative call (``x + a`` against ``a + x``): by the dataflow, else by the values."""
    if g.op not in COMMUTATIVE or f.op != g.op:
        return False
    a, b = "forward.input.input", "forward.input.other"
    if not all(t in c.tensors for c in (g, f) for t in (a, b)):
        return False
    if (g.args or {}).get("alpha", 1) != 1:
        return False
    ga, gb, fa, fb = g.sources.get(a), g.sources.get(b), f.sources.get(a), f.sources.get(b)
    crossed: Optional[bool] = None
    if ga and gb and fa and fb and ga != gb:
        if partner.get(fa[0]) == gb[0] and partner.get(fb[0]) == ga[0] and fa[1] == gb[1] and fb[1] == ga[1]:
            crossed = True
        elif partner.get(fa[0]) == ga[0] and partner.get(fb[0]) == gb[0]:
            crossed = False
    if crossed is None:
        straight = _gap(g.tensors[a], f.tensors[a]) + _gap(g.tensors[b], f.tensors[b])
        across = _gap(g.tensors[a], f.tensors[b]) + _gap(g.tensors[b], f.tensors[a])
        crossed = across < 0.5 * straight
    if crossed:
        f.tensors = {_CROSS.get(t, t): e for t, e in f.tensors.items()}
        f.sources = {_CROSS.get(t, t): v for t, v in f.sources.items()}
    return crossed


def _gap(g: Dict[str, Any], f: Dict[str, Any]) -> float:
    """How far two entries are apart: inf for another shape, else the statistics' relative gaps."""
    if g.get("shape") != f.get("shape"):
        return math.inf
    total = 0.0
    for x, y in zip(_finite_stats(g) or (), _finite_stats(f) or ()):
        total += abs(x - y) / max(abs(x), abs(y), 1e-30)
    return total


# ------------------------------------------------------------------------------ the checks

#: relative difference allowed between two float arguments (a number computed from the data,
#: ``x / x.max().item()``, may move in its last float32 bits on another CPU; an eps changed from
#: 1e-5 to 1e-3 moves by a factor of 100)
ARG_RTOL = 1e-5


def same_arguments(a: Any, b: Any) -> bool:
    """Two argument values agree: the same structure, equal values, floats within :data:`ARG_RTOL`."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b if isinstance(a, bool) and isinstance(b, bool) else False
    if isinstance(a, float) or isinstance(b, float):
        if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
            return False
        return a == b or abs(a - b) <= ARG_RTOL * max(abs(a), abs(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_arguments(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_arguments(x, y) for x, y in zip(a, b))
    if isinstance(a, list) != isinstance(b, list):
        # torch reads an int where it takes a list of ints as that list (``sum(x, 1)``, ``sum(x, (1,))``)
        one, other = (a, b) if isinstance(a, list) else (b, a)
        return len(one) == 1 and isinstance(other, int) and same_arguments(one[0], other)
    return type(a) is type(b) and a == b


def changed_arguments(g: Call, f: Call) -> List[Tuple[str, Any, Any]]:
    """``(parameter, golden value, fresh value)`` of every argument that differs. A parameter only
    one side's signature has (another spelling of the same operation) is not compared; between
    two calls of the same API every parameter is."""
    if g.args is None or f.args is None:
        return []
    out = []
    same_api = g.api == f.api
    for name in list(g.args) + [k for k in f.args if k not in g.args]:
        missing = object()
        a, b = g.args.get(name, missing), f.args.get(name, missing)
        if a is missing or b is missing:
            if same_api:
                out.append((name, None if a is missing else a, None if b is missing else b))
            continue
        if not same_arguments(a, b):
            out.append((name, a, b))
    return out


class DiffKind(TextEnum):
    """What differs between a golden and this run in one record."""

    MISSING_CALL = "missing call"   #: called in the golden, not in this run
    NEW_CALL = "new call"           #: called in this run, not in the golden
    ARGUMENTS = "arguments"         #: its non-tensor arguments changed
    TENSOR = "tensor"               #: a tensor added, gone, or of another dtype or shape
    NONFINITE = "nan/inf"           #: its NaN/Inf counts changed
    STATISTICS = "statistics"       #: its statistics drifted beyond the dtype's allowance


_STAT_NAMES = ("max", "min", "mean", "l2")


def _num(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return json.dumps(v, ensure_ascii=False) if not isinstance(v, str) else v


def _arg_text(v: Any) -> str:
    if v is None:
        return "(not given)"
    if isinstance(v, str):
        return repr(v)
    if isinstance(v, dict) and len(v) == 1:
        return str(next(iter(v.values())))
    return _num(v) if not isinstance(v, (list, dict)) else json.dumps(v, ensure_ascii=False)


def _tensor_text(e: Optional[Dict[str, Any]]) -> str:
    if e is None:
        return "(none)"
    return f"{e.get('dtype')}{json.dumps(e.get('shape'))}"


@dataclass
class Difference:
    """One differing record: what differs, the stable key (this run's when the call is in it),
    the golden's key when it is another, and the two sides (None: absent): tensor entries
    (``{"t", "dtype", "shape", "stats"}``) or call lines."""

    kind: DiffKind
    key: str
    what: str
    golden: Optional[Dict[str, Any]]
    fresh: Optional[Dict[str, Any]]
    order: float = 0
    drift: float = 0.0
    golden_key: str = ""
    api: str = ""                                 # this run's api key (Functional_linear_3)
    changes: List[Tuple[str, Any, Any]] = field(default_factory=list)   # arguments changed

    @property
    def module(self) -> str:
        return key_module(self.key)

    def summary(self) -> str:
        """One short text of what changed (``forward.output.0 max 1.23 -> 1.25 (drift ...)``)."""
        g, f = self.golden or {}, self.fresh or {}
        t = str(f.get("t") or g.get("t") or "")
        if self.kind is DiffKind.STATISTICS:
            parts = [f"{n} {_num(stat_value(a))} -> {_num(stat_value(b))}"
                     for n, a, b in zip(_STAT_NAMES, g.get("stats") or [], f.get("stats") or []) if a != b]
            return f"{t} {', '.join(parts)} ({self.what.split(' ', 1)[1]})"
        if self.kind is DiffKind.ARGUMENTS:
            return "arguments " + ", ".join(f"{n} {_arg_text(a)} -> {_arg_text(b)}" for n, a, b in self.changes)
        if self.kind is DiffKind.TENSOR:
            return f"{t} {_tensor_text(self.golden)} -> {_tensor_text(self.fresh)}"
        if self.kind is DiffKind.NONFINITE:
            return f"{t} NaN/Inf {g.get('nonfinite') or [0, 0]} -> {f.get('nonfinite') or [0, 0]}"
        line = self.fresh if self.kind is DiffKind.NEW_CALL else self.golden
        args = (line or {}).get("args")
        shown = ", ".join(f"{k}={_arg_text(v)}" for k, v in (args or {}).items())
        return f"{self.kind}: {(line or {}).get('api', '')}({shown}) {self.what}"

    def diff_lines(self) -> List[str]:
        out = []
        if self.golden is not None:
            out.append(f"  - {encode(self.golden)}")
        if self.fresh is not None:
            out.append(f"  + {encode(self.fresh)}")
        return out


@dataclass
class GoldenCheck:
    """The golden-specific verdict of a fresh run."""

    path: str
    differences: List[Difference]
    culprit: Optional[Difference] = None
    location: str = ""
    ignored: int = 0

    @property
    def passed(self) -> bool:
        return not self.differences

    def by_module(self) -> List[Tuple[str, List[List[Difference]]]]:
        """The differences by module (in the order of their first difference), then by call."""
        modules: Dict[str, Dict[str, List[Difference]]] = {}
        for d in self.differences:
            modules.setdefault(d.module, {}).setdefault(d.key, []).append(d)
        return [(m, list(calls.values())) for m, calls in modules.items()]

    def message(self, nodeid: str) -> str:
        n = len(self.differences)
        groups = self.by_module()
        n_calls = sum(len(calls) for _, calls in groups)
        lines = [f"golden check failed: {n} record(s) of {n_calls} call(s) differ from the golden "
                 f"{self.path}"]
        if self.culprit is not None:
            c = self.culprit
            renamed = f", golden {c.golden_key}" if c.golden_key and c.golden_key != c.key else ""
            lines.append(f"culprit: {c.key} ({c.kind}: {c.what}{renamed})")
            if self.location:
                lines.append(f"  at {self.location}")
        lines.append("diff (- golden, + this run):")
        # the culprit's records as the golden and this run hold them, and the first others
        first = [d for d in [self.culprit] if d is not None]
        for side in ("golden", "fresh", ""):   # both sides shown where the differences have them
            if len(first) >= _MAX_RECORDS:
                break
            if side and any(getattr(d, side) is not None for d in first):
                continue
            first += [d for d in self.differences if d not in first and (
                not side or getattr(d, side) is not None)][:1 if side else _MAX_RECORDS - len(first)]
        for d in first:
            lines += d.diff_lines()
        lines.append("one line per changed call, by module:")
        shown = 0
        for module, calls in groups:
            lines.append(f"  {len(calls)} call{'s' if len(calls) != 1 else ''} changed in "
                         f"{module or '(no module)'}:")
            for diffs in calls:
                if shown >= _MAX_SHOWN:
                    break
                shown += 1
                d = diffs[0]
                renamed = ""
                if d.golden_key and d.golden_key != d.key:
                    same_module = key_module(d.golden_key) == module
                    renamed = f" (golden {key_name(d.golden_key) if same_module else d.golden_key})"
                more = f"; +{len(diffs) - 1} more" if len(diffs) > 1 else ""
                lines.append(f"    {key_name(d.key)}{renamed} {d.summary()}{more}")
        if n_calls > shown:
            lines.append(f"  ... and {n_calls - shown} more changed call(s)")
        lines.append(f"if the change is intended, update the golden: pytest --ptdbg-update '{nodeid}'")
        return "\n".join(lines)


def drift(g: Sequence[Any], f: Sequence[Any]) -> float:
    """Largest difference of max/min/mean relative to the range, and of the L2 norm relative to
    itself; 0 when equal, inf when one side is not finite and the other is."""
    gv = [stat_value(v) for v in g]
    fv = [stat_value(v) for v in f]
    if len(gv) != len(fv):
        return math.inf
    if not gv:
        return 0.0
    for a, b in zip(gv, fv):
        if math.isfinite(a) != math.isfinite(b) or (not math.isfinite(a) and str(a) != str(b)):
            return math.inf
    fin = [(a, b) for a, b in zip(gv, fv) if math.isfinite(a)]
    if not fin:
        return 0.0
    head = [(a, b) for a, b in zip(gv[:3], fv[:3]) if math.isfinite(a)]
    scale = max([abs(v) for v in gv[:2] + fv[:2] if math.isfinite(v)] or [0.0])
    worst = 0.0
    for a, b in head:
        if a != b:
            worst = max(worst, abs(a - b) / scale if scale else math.inf)
    if len(gv) > 3 and math.isfinite(gv[3]) and gv[3] != fv[3]:
        worst = max(worst, abs(gv[3] - fv[3]) / abs(gv[3]) if gv[3] else math.inf)
    return worst


# ------------------------------------------------------------------------------ rounding noise

#: the noise floor of a record, in roundings (unit roundoffs) at the scale of its call's data:
#: what summation order and kernels of another CPU move a value by (measured: a conv bias
#: gradient that a BatchNorm makes mathematically zero is up to ~5 roundings of its
#: reduction's sum on one CPU, summed in another order)
NOISE_UNITS = 16.0
#: the floating dtypes that round (python numbers, integer and bool tensors get no floor)
_ROUNDED = STEP_FLOATS
#: division-like operations: (numerator, denominator) parameters; a quotient's rounding level is
#: the numerator's divided by the smallest denominator (Adam's ``addcdiv(p, m, sqrt(v) + eps)``
#: divides rounding noise of a zero gradient by ``eps``)
_DIVISIONS = {"div": ("input", "other"), "addcdiv": ("tensor1", "tensor2")}
#: product operations: their factors; a product's rounding level is the factors' (a product of two
#: small tensors is small, and exact to a rounding of itself)
_PRODUCTS = {"mul": ("input", "other"), "addcmul": ("tensor1", "tensor2")}


def _numel(shape: Any) -> int:
    n = 1
    for x in shape if isinstance(shape, list) else []:
        n *= int(x) if isinstance(x, int) and x > 0 else 1
    return n


def _finite_stats(line: Dict[str, Any]) -> Optional[List[float]]:
    """max, min, mean, l2 of a floating tensor record whose values are data (finite, below
    the ``finfo.min`` masks' magnitude); None for anything else."""
    if str(line.get("dtype")) not in _ROUNDED:
        return None
    try:
        v = [stat_value(x) for x in (line.get("stats") or [])]
    except (TypeError, ValueError):
        return None
    if len(v) < 4 or not all(math.isfinite(x) for x in v) or line.get("nonfinite"):
        return None
    if max(abs(v[0]), abs(v[1])) >= SENTINEL:
        return None
    return v


def _rms(line: Dict[str, Any]) -> float:
    v = _finite_stats(line)
    return 0.0 if v is None else v[3] / math.sqrt(max(_numel(line.get("shape")), 1))


def noise_floor(tensors: Dict[str, Dict[str, Any]], op: str, t: str,
                args: Optional[Dict[str, Any]] = None) -> float:
    """The absolute drift of one element of record ``t`` of call ``key`` that rounding at the
    scale of its call's data explains (0.0: none known; the relative tolerance alone judges).
    ``tensors``: the call's tensor entries by ``t`` (``forward.input.weight``); ``op``: its
    operation; ``args``: its bound non-tensor arguments (a Python number operand is one).

    An output of a call is computed from the call's inputs in the same direction: a result
    is never more exact than ``NOISE_UNITS`` roundings at the smallest RMS among its floating
    inputs, times the reduction length (input elements per output element, at least 1): a
    mathematically-zero bias gradient (a BatchNorm after the conv) is the rounding noise of a
    sum of 512 gradient elements. A quotient's (``div``, ``addcdiv``) rounding level is the
    numerator's largest value over the smallest denominator, when the denominator keeps one
    sign. An input of a call is judged at the scale of the call's other tensors: a change
    below their rounding level is not visible to the call (its producer judged it already).
    """
    line = tensors.get(t)
    if line is None or _finite_stats(line) is None:
        return 0.0
    u = unit_roundoff(str(line.get("dtype")))
    direction, _, rest = t.partition(".")
    peers = {pt: pl for pt, pl in tensors.items() if pt != t and pt.startswith(direction + ".")}
    if rest.startswith("input"):
        scale = max([_rms(pl) for pl in peers.values()] or [0.0])
        return NOISE_UNITS * u * scale
    inputs = {pt: pl for pt, pl in peers.items() if pt.startswith(direction + ".input")
              and _finite_stats(pl) is not None}
    scales = [s for s in (_rms(pl) for pl in inputs.values()) if s > 0]
    n_out = max(_numel(line.get("shape")), 1)
    reduction = max([_numel(pl.get("shape")) / n_out for pl in inputs.values()] + [1.0])
    floor = NOISE_UNITS * u * reduction * min(scales) if scales else 0.0
    if direction != records.FORWARD:
        return floor
    value = _value_argument(args) if op in ("addcmul", "addcdiv") else 1.0

    def operand(name: str) -> Optional[List[float]]:
        return _operand(tensors.get(f"forward.input.{name}"), (args or {}).get(name))

    if op in _PRODUCTS:
        a, b = (operand(x) for x in _PRODUCTS[op])
        if a is not None and b is not None:
            addend = operand("input") if op == "addcmul" else [0.0, 0.0]
            if addend is not None:
                floor = NOISE_UNITS * u * (max(abs(a[0]), abs(a[1])) * max(abs(b[0]), abs(b[1]))
                                           * value + max(abs(addend[0]), abs(addend[1])))
    elif op in _DIVISIONS:
        num, den = (operand(x) for x in _DIVISIONS[op])
        if num is not None and den is not None and (den[1] > 0 or den[0] < 0):
            smallest = den[1] if den[1] > 0 else -den[0]
            biggest = max(abs(num[0]), abs(num[1]))
            floor = max(floor, NOISE_UNITS * u * value * biggest / smallest)
    return floor


def _operand(line: Optional[Dict[str, Any]], number: Any = None) -> Optional[List[float]]:
    """max and min of a tensor operand (data only) or of a python number; None if unknown."""
    if line is None:
        if isinstance(number, (int, float)) and not isinstance(number, bool) and math.isfinite(number):
            return [float(number), float(number)]
        return None
    if str(line.get("dtype")) in ("float", "int"):
        try:
            pair = [stat_value(x) for x in (line.get("stats") or [])][:2]
        except (TypeError, ValueError):
            return None
        return pair if len(pair) == 2 and all(math.isfinite(x) for x in pair) else None
    v = _finite_stats(line)
    return None if v is None else v[:2]


def _value_argument(args: Optional[Dict[str, Any]]) -> float:
    """``|value|`` of an ``addcmul``/``addcdiv`` call's bound arguments (1 when not given)."""
    raw = (args or {}).get("value")
    return abs(float(raw)) if isinstance(raw, (int, float)) and not isinstance(raw, bool) else 1.0


def within_floor(g: Sequence[Any], f: Sequence[Any], tol: float, floor: float, n: int) -> bool:
    """Every statistic's drift within the relative tolerance or the absolute noise ``floor``
    of one element (max, min, mean; the L2 norm: ``floor`` x sqrt(n))."""
    try:
        gv = [stat_value(v) for v in g]
        fv = [stat_value(v) for v in f]
    except (TypeError, ValueError):
        return False
    if len(gv) != len(fv) or not all(math.isfinite(x) for x in gv + fv):
        return False
    scale = max([abs(v) for v in gv[:2] + fv[:2]] or [0.0])
    for i, (a, b) in enumerate(zip(gv, fv)):
        allowed = (max(tol * abs(a), floor * math.sqrt(max(n, 1))) if i == 3
                   else max(tol * scale, floor))
        if abs(a - b) > allowed:
            return False
    return True




def _fingerprint(golden_line: Dict[str, Any], fresh_line: Dict[str, Any]) -> Tuple[Any, ...]:
    """What identifies one tensor across calls: dtype, shape and statistics on both sides."""
    return tuple(json.dumps([x.get("dtype"), x.get("shape"), x.get("stats")], sort_keys=True)
                 for x in (golden_line, fresh_line))


def _call_line(c: Call) -> Dict[str, Any]:
    out: Dict[str, Any] = {"k": c.key, "api": c.api}
    if c.args is not None:
        out["args"] = c.args
    return out


def _tensor_line(c: Call, t: str) -> Dict[str, Any]:
    return dict({"t": t}, **c.tensors[t])


def check(golden: Golden, fresh: FreshDump, ignore: Sequence[str] = (), only: Sequence[str] = (),
          ignore_optimizer: bool = False) -> GoldenCheck:
    """The fresh run against ``golden`` (see the module docstring). ``ignore``/``only`` (API
    name substrings, matched against the stable key and the recorded API) and
    ``ignore_optimizer`` leave calls out, as in ``assert_precision``."""
    g_calls, f_calls = golden.calls, fresh.calls
    steps = paired_steps(golden, fresh)

    def skipped(c: Call) -> bool:
        low = f"{c.key} {c.api}".lower()
        if ignore_optimizer and c.key.startswith("optimizer/"):
            return True
        if any(str(p).lower() in low for p in ignore):
            return True
        return bool(only) and not any(str(p).lower() in low for p in only)

    # where each step sorts: this run's record positions (golden-only calls after their
    # predecessor in the alignment)
    orders: List[Dict[str, float]] = []
    last = dict.fromkeys(DIRECTIONS, -1.0)
    for _gi, fi in steps:
        if fi is not None:
            o = {d: float(v) for d, v in fresh.order.get(f_calls[fi].key, {}).items()}
            for d in DIRECTIONS:
                o.setdefault(d, last[d] + 0.5)
        else:
            o = {d: last[d] + 0.5 for d in DIRECTIONS}
        last = o
        orders.append(o)

    diffs: List[Difference] = []
    ignored = 0
    paired: List[Tuple[Call, Call, Dict[str, float]]] = []
    for (gi, fi), o in zip(steps, orders):
        g = g_calls[gi] if gi is not None else None
        f = f_calls[fi] if fi is not None else None
        if (g is not None and skipped(g)) or (f is not None and skipped(f)):
            ignored += 1
            continue
        if f is None:
            assert g is not None
            diffs.append(Difference(DiffKind.MISSING_CALL, g.key, "called in the golden, not in this run",
                                    _call_line(g), None, o[records.FORWARD]))
            continue
        api = fresh.api_of.get(f.key, "")
        if g is None:
            diffs.append(Difference(DiffKind.NEW_CALL, f.key, f"{f.api}, not in the golden", None, _call_line(f),
                                    o[records.FORWARD], api=api))
            continue
        changes = changed_arguments(g, f)
        if changes:
            diffs.append(Difference(DiffKind.ARGUMENTS, f.key, "non-tensor arguments changed: " + ", ".join(
                f"{n} {_arg_text(a)} -> {_arg_text(b)}" for n, a, b in changes), _call_line(g), _call_line(f),
                o[records.FORWARD], golden_key=g.key, api=api, changes=changes))
        paired.append((g, f, o))

    def floor_of(g: Call, f: Call, t: str) -> float:
        return max(noise_floor(g.tensors, g.op, t, g.args), noise_floor(f.tensors, f.op, t, f.args))

    # outputs by what they hold in the golden and in this run: an input with the same values
    # on both sides is that output, passed on
    produced: Dict[Tuple[Any, ...], List[Tuple[Call, Call, str]]] = {}
    for g, f, _ in paired:
        for t, fl in f.tensors.items():
            gl = g.tensors.get(t)
            if gl is not None and ".output" in t:
                produced.setdefault(_fingerprint(gl, fl), []).append((g, f, t))
    for g, f, o in paired:
        api = fresh.api_of.get(f.key, "")

        def add(kind: DiffKind, what: str, t: str, gl: Optional[Dict[str, Any]], fl: Optional[Dict[str, Any]],
                d: float = 0.0, g: Call = g, f: Call = f, o: Dict[str, float] = o, api: str = api) -> None:
            diffs.append(Difference(kind, f.key, what, None if gl is None else dict({"t": t}, **gl),
                                    None if fl is None else dict({"t": t}, **fl),
                                    o[t.split(".")[0]] + (0.25 if ".output" in t else 0.0), d, g.key, api))

        for t, fl in f.tensors.items():
            gl = g.tensors.get(t)
            if gl is None:
                add(DiffKind.TENSOR, f"{t} not in the golden", t, None, fl)
                continue
            if gl.get("dtype") != fl.get("dtype") or gl.get("shape") != fl.get("shape"):
                add(DiffKind.TENSOR, f"{t} dtype/shape changed", t, gl, fl)
                continue
            if gl.get("nonfinite") != fl.get("nonfinite"):
                add(DiffKind.NONFINITE, f"{t} NaN/Inf counts changed", t, gl, fl)
                continue
            tol = DRIFT_TOL.get(str(fl.get("dtype")), 0.0)
            dr = drift(gl.get("stats") or [], fl.get("stats") or [])
            if dr > tol:
                floor = floor_of(g, f, t)
                if ".input" in t:  # the tensor as its producer made it: that call's rounding level
                    for pg, pf, pt in produced.get(_fingerprint(gl, fl), ()):
                        floor = max(floor, floor_of(pg, pf, pt))
                if floor and within_floor(gl.get("stats") or [], fl.get("stats") or [], tol, floor,
                                          _numel(fl.get("shape"))):
                    continue
                floor_text = f", or {floor:.3g} at its call's rounding level" if floor else ""
                add(DiffKind.STATISTICS, f"{t} drifted {dr:.3g} (allowed {tol:g} for {fl.get('dtype')}"
                    f"{floor_text})", t, gl, fl, dr)
        for t, gl in g.tensors.items():
            if t not in f.tensors:
                add(DiffKind.TENSOR, f"{t} missing in this run", t, gl, None)
    diffs.sort(key=lambda d: (d.order, d.what))
    culprit = _culprit(diffs)
    loc = ""
    if culprit is not None:
        loc = user_location(fresh.stacks.get(culprit.api or fresh.api_of.get(culprit.key, ""), []))
    return GoldenCheck(golden.path, diffs, culprit, loc, ignored)


_TORCH_DIR = os.sep + "torch" + os.sep


def user_location(frames: Sequence[Any]) -> str:
    """``file:line in function: code`` of the innermost frame outside torch itself."""
    good = [f for f in frames if isinstance(f, list) and len(f) >= 4]
    if not good:
        return ""
    mine = [f for f in good if _TORCH_DIR not in str(f[0])]
    f0 = (mine or good)[0]
    return f"{f0[0]}:{f0[1]} in {f0[2]}: {f0[3]}"




def _culprit(diffs: List[Difference]) -> Optional[Difference]:
    """A structural difference first (in execution order); else the first API whose outputs
    drift while its inputs do not (forward before backward); else the first difference."""
    if not diffs:
        return None
    for d in diffs:
        if d.kind is not DiffKind.STATISTICS:
            return d
    drifting: Dict[Tuple[str, str], List[Difference]] = {}
    for d in diffs:
        t = str((d.fresh or {}).get("t", ""))
        drifting.setdefault((d.key, t.split(".")[0]), []).append(d)
    for direction in records.DIRECTIONS:
        for d in diffs:
            t = str((d.fresh or {}).get("t", ""))
            if not t.startswith(direction):
                continue
            group = drifting[(d.key, direction)]
            outs = [x for x in group if str((x.fresh or {}).get("t")).startswith(f"{direction}.output")]
            ins = [x for x in group if str((x.fresh or {}).get("t")).startswith(f"{direction}.input")]
            if outs and not ins:
                return outs[0]
    return diffs[0]


# ------------------------------------------------------------------------------ reference dump

def _arg_at(args: Optional[Dict[str, Any]], path: Tuple[Any, ...]) -> Any:
    v: Any = args
    for p in path:
        if isinstance(v, dict) and isinstance(p, str):
            v = v.get(p)
        elif isinstance(v, list) and isinstance(p, int) and 0 <= p < len(v):
            v = v[p]
        else:
            return None
    return v


def write_reference_dump(golden: Golden, fresh: FreshDump, dump_path: str, mode: str) -> str:
    """The golden as a statistics-only dump under ``dump_path`` (step 0, rank 0); its ``.pkl``.

    A golden call paired with a call of this run (:func:`pair_calls`) is written under that call's
    API key, its tensors under that call's recorded slots and its call spec, with the golden's
    values; its Python number records from the golden's arguments. The records are in this run's
    order (so ``compare()`` aligns them call by call); golden-only calls come last, under keys of
    their own (never paired)."""
    steps = paired_steps(golden, fresh)
    used = set(fresh.api_of.values())
    counters: Dict[str, int] = {}
    rows: List[Tuple[float, int, str]] = []
    seq = 0
    for gi, fi in steps:
        if gi is None:
            continue
        g = golden.calls[gi]
        f = fresh.calls[fi] if fi is not None else None
        if f is not None:
            api = fresh.api_of[f.key]
            slots = fresh.slots.get(f.key, {})
            order = fresh.order.get(f.key, {})
            spec = fresh.specs.get(f.key)
        else:  # a call this run does not make: a name of its own, never paired
            family = g.api or g.op
            n = counters.get(family, 10000)
            while f"{family}_{n}" in used:
                n += 1
            counters[family] = n + 1
            api = f"{family}_{n}"
            used.add(api)
            slots, order, spec = {}, {}, None
        extra_slot = 1000
        first_forward = True
        records_of: List[Tuple[str, str, str, List[Any], List[Any], Dict[str, Any]]] = []
        for t, e in g.tensors.items():
            direction, _, bound = t.partition(".")
            slot = slots.get(t)
            if slot is None:
                io = bound.split(".")[0]
                slot = f"{io}.{extra_slot}"
                extra_slot += 1
            records_of.append((direction, slot, str(e.get("dtype", "?")), list(e.get("shape") or []),
                               [stat_value(v) for v in e.get("stats") or []],
                               {"nan": (e.get("nonfinite") or [0, 0])[0], "inf": (e.get("nonfinite") or [0, 0])[1]}))
        if f is not None:
            for slot, path, dtype, stats in fresh.scalars.get(f.key, []):
                value = _arg_at(g.args, path)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    if not same_arguments(value, stat_value(stats[0]) if stats else None):
                        stats = [value, value, value, value]
                    records_of.append((records.FORWARD, slot, dtype, [], list(stats), {"nan": 0, "inf": 0}))
        for direction, slot, dtype, shape, stats, extra in records_of:
            io, _, idx = slot.partition(".")
            name = f"{api}_{direction}_{io}" + (f".{idx}" if idx else "")
            if dtype not in ("int", "float", "bool", "?") and "." not in dtype:
                dtype = f"torch.{dtype}"
            if g.key.startswith("optimizer/"):
                extra["ctx"] = records.OPTIMIZER_CTX
            if direction == records.FORWARD and first_forward:
                first_forward = False
                if spec is not None:
                    extra["call"] = spec
            where = float(order[direction]) if direction in order else math.inf
            rows.append((where, seq, records.encode_line(records.tensor_record(name, dtype, shape, stats, extra))))
            seq += 1
    rows.sort(key=lambda r: (r[0], r[1]))
    pkl = records.pkl_path(dump_path, 0, 0, mode)
    os.makedirs(os.path.dirname(pkl), exist_ok=True)
    with open(pkl, "w", encoding="utf-8") as fh:
        fh.writelines(r[2] for r in rows)
    manifest.write_manifest(pkl, len(rows), True)
    return pkl
