"""Judge a fresh run against its golden, and turn a golden into a dump ``compare()`` reads.

- :func:`golden_lines`: a fresh run's dump (``.pkl`` of this project) and its stable call keys ->
  the golden's lines (what ``golden.render`` writes);
- :func:`check`: the golden-specific checks of a fresh run against a golden: call structure
  (calls missing or new), non-tensor arguments, tensor dtypes and shapes, NaN/Inf counts, and
  statistics drift beyond what the tensor's dtype explains (:data:`DRIFT_TOL`) and beyond the
  rounding level of the data the record was computed from (:func:`noise_floor`: a
  mathematically-zero bias gradient is rounding noise, judged at its inputs' scale); each difference
  keeps both lines for a diff, and the culprit is the first difference in execution order, or,
  when only statistics drift, the first API whose outputs drift while its inputs do not;
- :func:`write_reference_dump`: the golden as a statistics-only ptdbg dump (``.pkl`` written with
  ``format/records`` helpers and a manifest) whose API keys are the fresh run's own keys for the
  same stable key, so that ``compare()`` pairs call by call; golden calls the fresh run does not
  make get keys of their own and stay unpaired (a failure, never a pass).

Reads only JSON lines (the dump is data). No torch here.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from pytest_ptdbg.format import manifest, records
from pytest_ptdbg.judge.budget import SENTINEL, unit_roundoff
from pytest_ptdbg.plugin.golden import Golden, encode, round_stat, stat_value
from pytest_ptdbg.runtime.dtypes import STEP_FLOATS
from pytest_ptdbg.runtime.text import TextEnum

#: statistics drift (relative to the tensor's range; the L2 norm relative to itself) allowed per
#: dtype: what rounding and summation order explain on another CPU or thread count, far below
#: what a changed op does. Integer and bool values must agree exactly.
DRIFT_TOL = {"float64": 1e-9, "float32": 5e-4, "float16": 4e-3, "bfloat16": 3e-2,
             # a Python float argument, kept to 6 significant digits
             "float": 2e-5}
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_MAX_SHOWN = 12


def _dtype(raw: Any) -> str:
    return str(raw).replace("torch.", "")


#: what a device argument reads as in a golden (a golden holds no device: it is the reference
#: wherever device and bench are the same)
DEVICE = "<device>"


def _clean(obj: Any) -> Any:
    """A call spec without what changes from run to run or machine to machine: object
    addresses in reprs, device arguments (``device="cpu"``, ``{"device": "cuda:0"}``)."""
    if isinstance(obj, dict):
        return {k: (DEVICE if k == "device" and isinstance(v, str) else _clean(v))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    if isinstance(obj, str):
        return _ADDRESS.sub("0x?", obj)
    return obj


@dataclass
class FreshDump:
    """A fresh run's dump read for the golden: lines, api key of each stable key, stacks."""

    lines: List[Dict[str, Any]]
    api_of: Dict[str, str]                       # stable key -> api key (Functional_linear_3)
    stacks: Dict[str, List[Any]] = field(default_factory=dict)   # api key -> frames


def _read_pkl(pkl: str) -> List[list]:
    out = []
    with open(pkl, encoding="utf-8") as f:
        for n, row in enumerate(f, 1):
            if not row.strip():
                continue
            try:
                rec = json.loads(row)
            except ValueError:
                raise ValueError(f"{pkl}:{n}: unreadable record; the fresh dump is unusable") from None
            if isinstance(rec, list) and rec and isinstance(rec[0], str):
                out.append(rec)
    return out


def golden_lines(pkl: str, keys: Dict[str, str]) -> FreshDump:
    """The golden lines of the fresh dump ``pkl``; ``keys`` maps api keys to stable keys (an api
    key without one keeps its own name, e.g. when the call keys could not be attached)."""
    lines: List[Dict[str, Any]] = []
    api_of: Dict[str, str] = {}
    stacks: Dict[str, List[Any]] = {}
    seen_call = set()
    for rec in _read_pkl(pkl):
        if records.is_stack_record(rec):
            api = rec[0][: -len(records.STACK_SUFFIX)]
            stacks[api.rsplit("_", 1)[0]] = rec[1] if len(rec) > 1 else []
            continue
        try:
            name = records.parse_name(rec[0])
        except ValueError:
            continue
        api = f"{name.api_family}_{name.call_index}"
        key = keys.get(api, api)
        api_of.setdefault(key, api)
        extra = rec[6] if len(rec) > 6 and isinstance(rec[6], dict) else {}
        if name.direction == records.FORWARD and api not in seen_call:
            seen_call.add(api)
            call = extra.get("call")
            if isinstance(call, dict) and ("strides" in call or "modes" in call or "src" in call):
                # the inputs' layout, the math modes and the dataflow are not arguments
                call = {k: v for k, v in call.items() if k not in ("strides", "modes", "src")}
            lines.append({"k": key, "call": _clean(call) if isinstance(call, dict) else None})
        idx = ".".join(str(i) for i in (name.index or ()))
        line: Dict[str, Any] = {
            "k": key, "t": f"{name.direction}.{name.io}" + (f".{idx}" if idx else ""),
            "dtype": _dtype(rec[3]) if len(rec) > 3 else "?",
            "shape": list(rec[4]) if len(rec) > 4 and isinstance(rec[4], list) else [],
            "stats": [round_stat(v) for v in (rec[5] if len(rec) > 5 and isinstance(rec[5], list) else [])],
        }
        nan, inf = int(extra.get("nan", 0) or 0), int(extra.get("inf", 0) or 0)
        if nan or inf:
            line["nonfinite"] = [nan, inf]
        lines.append(line)
    return FreshDump(lines, api_of, stacks)


# ------------------------------------------------------------------------------ the checks

#: relative difference allowed between two float arguments (a number computed from the data,
#: ``x / x.max().item()``, may move in its last float32 bits on another CPU; an eps changed from
#: 1e-5 to 1e-3 moves by a factor of 100)
ARG_RTOL = 1e-5


def same_arguments(a: Any, b: Any) -> bool:
    """Two call specs agree: the same structure, equal values, floats within :data:`ARG_RTOL`."""
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
    return type(a) is type(b) and a == b


class DiffKind(TextEnum):
    """What differs between a golden and this run in one record."""

    MISSING_CALL = "missing call"   #: called in the golden, not in this run
    NEW_CALL = "new call"           #: called in this run, not in the golden
    ARGUMENTS = "arguments"         #: its non-tensor arguments changed
    TENSOR = "tensor"               #: a tensor added, gone, or of another dtype or shape
    NONFINITE = "nan/inf"           #: its NaN/Inf counts changed
    STATISTICS = "statistics"       #: its statistics drifted beyond the dtype's allowance


@dataclass
class Difference:
    """One differing record: what differs, the stable key, and the two lines (None: absent)."""

    kind: DiffKind
    key: str
    what: str
    golden: Optional[Dict[str, Any]]
    fresh: Optional[Dict[str, Any]]
    order: int = 0
    drift: float = 0.0

    def diff_lines(self) -> List[str]:
        out = [f"  {self.key} {self.what}: {self.kind}"]
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

    def message(self, nodeid: str) -> str:
        n = len(self.differences)
        lines = [f"golden check failed: {n} record(s) differ from the golden {self.path}"]
        if self.culprit is not None:
            c = self.culprit
            lines.append(f"culprit: {c.key} ({c.kind}: {c.what})")
            if self.location:
                lines.append(f"  at {self.location}")
        lines.append("diff (- golden, + this run):")
        for d in self.differences[:_MAX_SHOWN]:
            lines += d.diff_lines()
        if n > _MAX_SHOWN:
            lines.append(f"  ... and {n - _MAX_SHOWN} more")
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
#: division-like APIs: (numerator input, denominator input); a quotient's rounding level is the
#: numerator's divided by the smallest denominator (Adam's ``addcdiv(p, m, sqrt(v) + eps)``
#: divides rounding noise of a zero gradient by ``eps``)
_DIVISIONS = {"div": ("input.0", "input.1"), "div_": ("input.0", "input.1"),
              "true_divide": ("input.0", "input.1"), "true_divide_": ("input.0", "input.1"),
              "__truediv__": ("input.0", "input.1"), "__itruediv__": ("input.0", "input.1"),
              "__rtruediv__": ("input.1", "input.0"),
              "addcdiv": ("input.1", "input.2"), "addcdiv_": ("input.1", "input.2")}
#: product APIs: their factors; a product's rounding level is the factors' (a product of two
#: small tensors is small, and exact to a rounding of itself)
_PRODUCTS = {"mul": ("input.0", "input.1"), "mul_": ("input.0", "input.1"),
             "multiply": ("input.0", "input.1"), "__mul__": ("input.0", "input.1"),
             "__rmul__": ("input.0", "input.1"), "__imul__": ("input.0", "input.1"),
             "addcmul": ("input.1", "input.2"), "addcmul_": ("input.1", "input.2")}


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


def noise_floor(tensors: Dict[str, Dict[str, Any]], key: str, t: str,
                call: Optional[Dict[str, Any]] = None) -> float:
    """The absolute drift of one element of record ``t`` of call ``key`` that rounding at the
    scale of its call's data explains (0.0: none known; the relative tolerance alone judges).
    ``tensors``: the call's tensor lines by ``t``; ``call``: its call line.

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
    api = key.rsplit("/", 1)[-1].split("#")[0].split("_", 1)[-1]
    value = _value_argument(call) if api.startswith(("addcmul", "addcdiv")) else 1.0
    if api in _PRODUCTS:
        a, b = (_operand(tensors.get(f"forward.{x}")) for x in _PRODUCTS[api])
        if a is not None and b is not None:
            addend = _operand(tensors.get("forward.input.0")) if api.startswith(
                "addcmul") else [0.0, 0.0]
            if addend is not None:
                floor = NOISE_UNITS * u * (max(abs(a[0]), abs(a[1])) * max(abs(b[0]), abs(b[1]))
                                           * value + max(abs(addend[0]), abs(addend[1])))
    elif api in _DIVISIONS:
        num, den = (_operand(tensors.get(f"forward.{x}")) for x in _DIVISIONS[api])
        if num is not None and den is not None and (den[1] > 0 or den[0] < 0):
            smallest = den[1] if den[1] > 0 else -den[0]
            biggest = max(abs(num[0]), abs(num[1]))
            floor = max(floor, NOISE_UNITS * u * value * biggest / smallest)
    return floor


def _operand(line: Optional[Dict[str, Any]]) -> Optional[List[float]]:
    """max and min of a tensor operand (data only) or of a python number; None if unknown."""
    if line is None:
        return None
    if str(line.get("dtype")) in ("float", "int"):
        try:
            pair = [stat_value(x) for x in (line.get("stats") or [])][:2]
        except (TypeError, ValueError):
            return None
        return pair if len(pair) == 2 and all(math.isfinite(x) for x in pair) else None
    v = _finite_stats(line)
    return None if v is None else v[:2]


def _value_argument(call: Optional[Dict[str, Any]]) -> float:
    """``|value|`` of an ``addcmul``/``addcdiv`` call line (1 when not given)."""
    spec = call.get("call") if isinstance(call, dict) else None
    raw = (spec.get("kwargs") or {}).get("value") if isinstance(spec, dict) else None
    return abs(float(raw)) if isinstance(raw, (int, float)) and not isinstance(raw, bool) else 1.0


def _by_call(tensors: Dict[Tuple[str, str], Dict[str, Any]]) -> Dict[str, Dict[str, Dict[str, Any]]]:
    out: Dict[str, Dict[str, Dict[str, Any]]] = {}
    for (key, t), line in tensors.items():
        out.setdefault(key, {})[t] = line
    return out


def _fingerprint(golden_line: Dict[str, Any], fresh_line: Dict[str, Any]) -> Tuple[Any, ...]:
    """What identifies one tensor across calls: dtype, shape and statistics on both sides."""
    return tuple(json.dumps([x.get("dtype"), x.get("shape"), x.get("stats")], sort_keys=True)
                 for x in (golden_line, fresh_line))


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


def _index(lines: List[Dict[str, Any]]
           ) -> Tuple[Dict[str, Dict[str, Any]], Dict[Tuple[str, str], Dict[str, Any]], List[str]]:
    calls: Dict[str, Dict[str, Any]] = {}
    tensors: Dict[Tuple[str, str], Dict[str, Any]] = {}
    order: List[str] = []
    for line in lines:
        key = line["k"]
        if key not in calls and key not in order:
            order.append(key)
        if "t" in line:
            tensors[(key, line["t"])] = line
        else:
            calls[key] = line
    return calls, tensors, order


def check(golden: Golden, fresh: FreshDump, ignore: Sequence[str] = (), only: Sequence[str] = (),
          ignore_optimizer: bool = False) -> GoldenCheck:
    """The fresh run against ``golden`` (see the module docstring). ``ignore``/``only`` (API
    name substrings) and ``ignore_optimizer`` leave calls out, as in ``assert_precision``."""
    g_calls, g_tensors, g_order = _index(golden.lines)
    f_calls, f_tensors, f_order = _index(fresh.lines)
    # a difference sorts where its record is in this run (golden-only ones where the golden had
    # them, relative to the keys around them)
    pos: Dict[Any, int] = {}
    for i, line in enumerate(fresh.lines):
        pos.setdefault((line["k"], line.get("t")), 2 * i)
    g_pos: Dict[str, int] = {}
    last = 0
    for line in golden.lines:
        ident = (line["k"], line.get("t"))
        last = pos.get(ident, last)
        g_pos.setdefault(line["k"], last + 1)
        pos.setdefault(ident, last + 1)

    def skipped(key: str) -> bool:
        low = key.lower()
        if ignore_optimizer and key.startswith("optimizer/"):
            return True
        if any(str(p).lower() in low for p in ignore):
            return True
        return bool(only) and not any(str(p).lower() in low for p in only)

    diffs: List[Difference] = []
    ignored = 0
    for key in list(dict.fromkeys(g_order + f_order)):
        if skipped(key):
            ignored += 1
            continue
        order = pos.get((key, None), g_pos.get(key, 0))
        in_g, in_f = key in g_order, key in f_order
        if in_g and not in_f:
            diffs.append(Difference(DiffKind.MISSING_CALL, key, "called in the golden, not in this run",
                                    g_calls.get(key), None, order))
            continue
        if in_f and not in_g:
            diffs.append(Difference(DiffKind.NEW_CALL, key, "not in the golden", None, f_calls.get(key),
                                    order))
            continue
        gc, fc = g_calls.get(key), f_calls.get(key)
        if not same_arguments((gc or {}).get("call"), (fc or {}).get("call")):
            diffs.append(Difference(DiffKind.ARGUMENTS, key, "non-tensor arguments changed", gc, fc, order))
    changed_args = {d.key for d in diffs if d.kind is DiffKind.ARGUMENTS}

    g_by_call, f_by_call = _by_call(g_tensors), _by_call(f_tensors)

    def floor_of(key: str, t: str) -> float:
        return max(noise_floor(g_by_call.get(key, {}), key, t, g_calls.get(key)),
                   noise_floor(f_by_call.get(key, {}), key, t, f_calls.get(key)))

    # outputs by what they hold in the golden and in this run: an input with the same values
    # on both sides is that output, passed on
    produced: Dict[Tuple[Any, ...], List[Tuple[str, str]]] = {}
    for (key, t), fl in f_tensors.items():
        gl = g_tensors.get((key, t))
        if gl is not None and ".output" in t:
            produced.setdefault(_fingerprint(gl, fl), []).append((key, t))
    for (key, t), fl in f_tensors.items():
        if skipped(key) or key not in g_order:
            continue
        gl = g_tensors.get((key, t))
        order = pos[(key, t)]
        if gl is None:
            diffs.append(Difference(DiffKind.TENSOR, key, f"{t} not in the golden", None, fl, order))
            continue
        if gl.get("dtype") != fl.get("dtype") or gl.get("shape") != fl.get("shape"):
            diffs.append(Difference(DiffKind.TENSOR, key, f"{t} dtype/shape changed", gl, fl, order))
            continue
        if gl.get("nonfinite") != fl.get("nonfinite"):
            diffs.append(Difference(DiffKind.NONFINITE, key, f"{t} NaN/Inf counts changed", gl, fl, order))
            continue
        if key in changed_args and fl.get("dtype") in ("int", "float", "bool"):
            continue  # a number argument: the arguments difference shows it
        tol = DRIFT_TOL.get(str(fl.get("dtype")), 0.0)
        d = drift(gl.get("stats") or [], fl.get("stats") or [])
        if d > tol:
            floor = floor_of(key, t)
            if ".input" in t:  # the tensor as its producer made it: that call's rounding level
                for pk, pt in produced.get(_fingerprint(gl, fl), ()):
                    floor = max(floor, floor_of(pk, pt))
            if floor and within_floor(gl.get("stats") or [], fl.get("stats") or [], tol, floor,
                                      _numel(fl.get("shape"))):
                continue
            floor_text = f", or {floor:.3g} at its call's rounding level" if floor else ""
            diffs.append(Difference(DiffKind.STATISTICS, key, f"{t} drifted {d:.3g} (allowed "
                                    f"{tol:g} for {fl.get('dtype')}{floor_text})", gl, fl,
                                    order, d))
    for (key, t), gl in g_tensors.items():
        if skipped(key) or key not in f_order or (key, t) in f_tensors:
            continue
        diffs.append(Difference(DiffKind.TENSOR, key, f"{t} missing in this run", gl, None, pos[(key, t)]))
    diffs.sort(key=lambda d: (d.order, d.what))
    culprit = _culprit(diffs)
    loc = ""
    if culprit is not None:
        api = fresh.api_of.get(culprit.key)
        loc = user_location(fresh.stacks.get(api or "", []))
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
        direction = t.split(".")[0]
        drifting.setdefault((d.key, direction), []).append(d)
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

def write_reference_dump(golden: Golden, fresh: FreshDump, dump_path: str, mode: str) -> str:
    """The golden as a statistics-only dump under ``dump_path`` (step 0, rank 0); its ``.pkl``."""
    used = set(fresh.api_of.values())
    counters: Dict[str, int] = {}
    api_for: Dict[str, str] = {}
    rows: List[str] = []
    calls = {line["k"]: line.get("call") for line in golden.lines if "t" not in line}
    first_forward = set()
    for line in golden.lines:
        if "t" not in line:
            continue
        key = line["k"]
        api = api_for.get(key)
        if api is None:
            api = fresh.api_of.get(key)
            if api is None:  # a call this run does not make: a name of its own, never paired
                family = key.rsplit("/", 1)[-1].split("#")[0]
                n = counters.get(family, 10000)
                while f"{family}_{n}" in used:
                    n += 1
                counters[family] = n + 1
                api = f"{family}_{n}"
                used.add(api)
            api_for[key] = api
        direction, _, rest = line["t"].partition(".")
        io, _, idx = rest.partition(".")
        name = f"{api}_{direction}_{io}" + (f".{idx}" if idx else "")
        dtype = line.get("dtype", "?")
        dtype = f"torch.{dtype}" if dtype not in ("int", "float", "bool", "?") and "." not in dtype else dtype
        nan, inf = (line.get("nonfinite") or [0, 0])[:2]
        extra: Dict[str, Any] = {"nan": nan, "inf": inf}
        if key.startswith("optimizer/"):
            extra["ctx"] = records.OPTIMIZER_CTX
        if direction == records.FORWARD and api not in first_forward:
            first_forward.add(api)
            if isinstance(calls.get(key), dict):
                extra["call"] = calls[key]
        stats = [stat_value(v) for v in line.get("stats") or []]
        rows.append(records.encode_line(records.tensor_record(name, dtype, line.get("shape") or [],
                                                              stats, extra)))
    pkl = records.pkl_path(dump_path, 0, 0, mode)
    os.makedirs(os.path.dirname(pkl), exist_ok=True)
    with open(pkl, "w", encoding="utf-8") as f:
        f.writelines(rows)
    manifest.write_manifest(pkl, len(rows), True)
    return pkl
