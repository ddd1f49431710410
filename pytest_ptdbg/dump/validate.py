"""Checks of one record's own consistency, for the reader. No torch, no numpy.

A record that contradicts itself cannot be trusted for anything it says: statistics whose maximum
is below their minimum, a negative norm, NaN/Inf statistics where the record counts no NaN and no
Inf, a call spec that is not a call. Each function
returns why (``""``: consistent); the reader reports it as unusable data naming the record.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence

__all__ = ["stats_problem", "call_problem"]

_INF = math.inf


def _num(v: Any) -> Optional[float]:
    if v.__class__ is float:
        return v
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def _count(extra: Mapping[str, Any], key: str) -> Optional[int]:
    v = extra.get(key, 0)
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def stats_problem(stats: Any, extra: Any = None, shape: Sequence[int] = (1,)) -> str:
    """Why a record's ``[max, min, mean, l2norm]`` (and its ``nan``/``inf`` counts in ``extra``,
    when it has them) contradict themselves, or ``""``. Absent or non-numeric statistics
    ("Nan" for a bool tensor, ptdbg's strings) are not checked; counts are checked only where the
    record gives them (this project's records always do; msprobe's never)."""
    if not isinstance(stats, list) or not stats:
        return ""
    if len(stats) == 4:   # the common case: four finite floats in order
        mx, mn, me, l2 = stats
        if mx.__class__ is float and mn.__class__ is float and me.__class__ is float and l2.__class__ is float \
                and _INF > mx >= mn > -_INF and -_INF < me < _INF and _INF > l2 >= 0.0:
            return ""
    vals = [_num(v) for v in stats[:4]]
    mx = vals[0]
    mn = vals[1] if len(vals) > 1 else None
    l2 = vals[3] if len(vals) > 3 else None
    if mx is not None and mn is not None and mx < mn:  # False for NaN
        return f"max {mx!r} < min {mn!r}"
    if l2 is not None and l2 < 0 and tuple(shape):
        return f"negative norm {l2!r}"
    if isinstance(extra, dict) and ("nan" in extra or "inf" in extra):
        nan, inf = _count(extra, "nan"), _count(extra, "inf")
        if nan is None or inf is None:
            return f"nan/inf counts {extra.get('nan')!r}/{extra.get('inf')!r} are not counts"
        known = [v for v in vals if v is not None]
        finite = all(-_INF < v < _INF for v in known)
        if not finite and nan == 0 and inf == 0:
            shown = [stats[i] for i in range(min(4, len(stats)))]
            return f"statistics {shown} are not finite, but it counts no NaN and no Inf"
    return ""


def call_problem(spec: Any) -> str:
    """Why a recorded call spec (``extra["call"]``) cannot be a call, or ``""``: it must be an
    object with ``args`` a list and ``kwargs`` an object (or absent)."""
    if not isinstance(spec, dict):
        return f"the call is {type(spec).__name__}, not an object"
    if not isinstance(spec.get("args"), list):
        return f"its args are {type(spec.get('args')).__name__}, not a list"
    kw = spec.get("kwargs")
    if kw is not None and not isinstance(kw, dict):
        return f"its kwargs are {type(kw).__name__}, not an object"
    return ""
