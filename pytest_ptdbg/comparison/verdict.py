"""``Accuracy Reached or Not``: the verdict rules and their thresholds. No torch.

Two rules, chosen by name (``rule="ptdbg"`` default, or ``rule="dtype"``):

**ptdbg** (reference behaviour). Full compare: ``No`` if
``(cosine < 0.99 and MaxAbsErr > 0.001) or cosine < 0.9 or MaxAbsErr > 1``, else ``Yes``
(an undefined cosine takes no part). Summary compare: ``No`` if any of |Δmax|, |Δmin|, |Δmean|
exceeds ``summary_rel`` (0.5, msprobe's warning level) × A, A = max(|b max|, |b min|), or |Δl2norm|
exceeds ``summary_rel`` × ‖b‖ (relative differences, scaled by the tensor's range so that a mean
near zero does not fail on rounding noise).

**dtype** (for a bf16/fp16 device against an fp32 bench). The ``torch.testing.assert_close`` test
with the tolerances of the lower-precision dtype of the pair (fp64 rtol 1e-7 atol 1e-7, fp32 rtol
1.3e-6 atol 1e-5, fp16 rtol 1e-3 atol 1e-5, bf16 rtol 1.6e-2 atol 1e-5, int/bool exact). Full
compare: ``Yes`` iff the fraction of elements with |n − b| > atol + rtol·|b| is at most
``max_fail_fraction`` (0: every element, as assert_close). Summary compare, with A = max(|b max|,
|b min|) and N elements: ``Yes`` iff |Δmax|, |Δmin|, |Δmean| ≤ atol + rtol·A and
|Δl2norm| ≤ atol·√N + rtol·‖b‖ (conditions the elementwise test implies).

Which to use: ``ptdbg`` when both runs use the same dtypes (fp32 device against fp32 bench, a
regression against a golden dump) and for results comparable with ptdbg/msprobe; ``dtype`` when the
device under test computes in bf16/fp16 against an fp32 bench, where ptdbg's absolute thresholds
fail large-valued tensors for the rounding error bf16 always has (MaxAbsErr > 1 on values of ~500)
and cannot tell it from a real fault.

Both rules: NaN/Inf positions (counts, in summary compare) that differ, or a shape mismatch, give
``No``; a pair with nothing to compare (empty, all NaN at the same places) gives ``""``. Data that
could not be used (missing/unreadable files, unpaired calls, a changed dtype class) is judged ``No``
by the table (``comparison/table.py``), never here. ptdbg rule: one side all zeros while the other
is not (cosine undefined) gives ``No`` when MaxAbsErr > ``max_abs`` (both ~0 stays ``Yes``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from pytest_ptdbg.comparison.metrics import PairMetrics, stat_at
from pytest_ptdbg.comparison.rule import Rule
from pytest_ptdbg.runtime.dtypes import FLOATS, short_name

#: the per-tensor rules (``Rule.JUDGE`` is the step judgement, not a row verdict)
RULES = (Rule.PTDBG, Rule.DTYPE)

#: assert_close's default (rtol, atol) by dtype (``runtime/dtypes.py``)
_DEFAULT_TOL = {d: tol for d in ("float64", "float32", "float16", "bfloat16")
                if (tol := FLOATS[d].assert_close_tol) is not None}


@dataclass
class Thresholds:
    """Parameters of both rules (defaults: ptdbg's and assert_close's)."""

    cosine: float = 0.99
    max_abs: float = 0.001
    cosine_hard: float = 0.9
    max_abs_hard: float = 1.0
    summary_rel: float = 0.5
    #: dtype -> (rtol, atol) for the dtype rule
    tolerances: Dict[str, Tuple[float, float]] = field(default_factory=lambda: dict(_DEFAULT_TOL))
    max_fail_fraction: float = 0.0


_short = short_name


def tolerance(npu_dtype: Optional[str], bench_dtype: Optional[str],
              th: Optional[Thresholds] = None) -> Tuple[float, float]:
    """``(rtol, atol)`` of the lower-precision dtype of the pair ((0, 0) for int/bool pairs)."""
    th = th or Thresholds()
    cands = [th.tolerances[d] for d in (_short(npu_dtype), _short(bench_dtype)) if d in th.tolerances]
    if not cands:
        return (0.0, 0.0)
    return max(cands)


def _check_rule(rule: Rule) -> None:
    if rule not in RULES:
        raise ValueError(f"unknown verdict rule {rule!r}; choose one of {RULES}")


def full_verdict(m: PairMetrics, npu_dtype: Optional[str] = None, bench_dtype: Optional[str] = None,
                 rule: Rule = Rule.PTDBG, th: Optional[Thresholds] = None) -> str:
    """``"Yes"``, ``"No"`` or ``""`` for a pair compared element by element.

    The dtype rule needs ``m.tol_fail`` computed with :func:`tolerance`'s ``(atol, rtol)``.
    """
    _check_rule(rule)
    th = th or Thresholds()
    if m.shape_mismatch or m.nan_mismatch:
        return "No"
    if m.compared == 0:
        return ""
    if rule == Rule.DTYPE:
        if m.tol_fail is None:
            raise ValueError("dtype rule: metrics were computed without a tolerance (tol_fail is None)")
        return "Yes" if m.tol_fail <= th.max_fail_fraction * m.compared else "No"
    cos, mae = m.cosine, m.max_abs_err
    if m.zero_side and not mae <= th.max_abs:
        return "No"
    has_cos = not math.isnan(cos)
    bad = (has_cos and cos < th.cosine and mae > th.max_abs) or (has_cos and cos < th.cosine_hard) \
        or mae > th.max_abs_hard or math.isnan(mae)
    return "No" if bad else "Yes"


def _stat_mismatch(a: Optional[float], b: Optional[float]) -> bool:
    if a is None or b is None:
        return False
    fa, fb = math.isfinite(a), math.isfinite(b)
    if fa and fb:
        return False
    if fa != fb:
        return True
    return not (a == b or (math.isnan(a) and math.isnan(b)))


def summary_verdict(npu_stats: Sequence, bench_stats: Sequence, npu_nonfinite: int = 0,
                    bench_nonfinite: int = 0, shape: Sequence[int] = (), npu_dtype: Optional[str] = None,
                    bench_dtype: Optional[str] = None, rule: Rule = Rule.PTDBG,
                    th: Optional[Thresholds] = None) -> Tuple[str, bool]:
    """Verdict from statistics only; returns ``(verdict, nan_mismatch)``."""
    _check_rule(rule)
    th = th or Thresholds()
    n = [stat_at(npu_stats, i) for i in range(4)]
    b = [stat_at(bench_stats, i) for i in range(4)]
    mismatch = npu_nonfinite != bench_nonfinite or any(_stat_mismatch(x, y) for x, y in zip(n, b))
    if mismatch:
        return "No", True
    pairs = [(x, y) for x, y in zip(n, b) if x is not None and y is not None
             and math.isfinite(x) and math.isfinite(y)]
    if not pairs:
        return "", False
    scale = max((abs(v) for v in (b[0], b[1]) if v is not None and math.isfinite(v)), default=0.0)
    if rule == Rule.PTDBG:
        for k in range(4):
            x, y = n[k], b[k]
            if x is None or y is None or not (math.isfinite(x) and math.isfinite(y)):
                continue
            if abs(x - y) > th.summary_rel * (abs(y) if k == 3 else scale):
                return "No", False
        return "Yes", False
    rtol, atol = tolerance(npu_dtype, bench_dtype, th)
    size = 1
    for s in shape:
        size *= int(s)
    for k in range(4):
        x, y = n[k], b[k]
        if x is None or y is None or not (math.isfinite(x) and math.isfinite(y)):
            continue
        bound = atol * math.sqrt(max(size, 1)) + rtol * abs(y) if k == 3 else atol + rtol * scale
        if abs(x - y) > bound * (1 + 1e-12):
            return "No", False
    return "Yes", False


#: :func:`summary_verdicts`' verdict codes, index into this tuple
VERDICT_TEXT = ("", "Yes", "No")


def summary_verdicts(npu: np.ndarray, bench: np.ndarray, npu_nonfinite: np.ndarray,
                     bench_nonfinite: np.ndarray, rule: Rule = Rule.PTDBG, th: Optional[Thresholds] = None,
                     rtol: Optional[np.ndarray] = None, atol: Optional[np.ndarray] = None,
                     sizes: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray]:
    """:func:`summary_verdict` of many rows at once: ``npu``/``bench`` are ``(m, 4)`` float64
    arrays of ``[max, min, mean, l2norm]`` (every statistic present; NaN/Inf allowed), the
    nonfinite counts ``(m,)`` ints. The dtype rule needs each row's ``rtol``, ``atol`` (from
    :func:`tolerance`) and element count ``sizes`` (float64). Returns ``(codes, nan_mismatch)``:
    ``codes`` index :data:`VERDICT_TEXT` (0 ``""``, 1 ``"Yes"``, 2 ``"No"``); the same verdicts, with
    the same floating-point operations, as the row-by-row function."""
    _check_rule(rule)
    th = th or Thresholds()
    n = np.asarray(npu, dtype=np.float64)
    b = np.asarray(bench, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        fn, fb = np.isfinite(n), np.isfinite(b)
        fin = fn & fb
        stat_mis = ~fin & ((fn != fb) | ~((n == b) | (np.isnan(n) & np.isnan(b))))
        mism = (np.asarray(npu_nonfinite) != np.asarray(bench_nonfinite)) | stat_mis.any(axis=1)
        scale = np.where(fb[:, :2], np.abs(b[:, :2]), 0.0).max(axis=1)
        d = np.abs(n - b)
        lim = np.empty_like(n)
        if rule == Rule.PTDBG:
            lim[:, :3] = (th.summary_rel * scale)[:, None]
            lim[:, 3] = th.summary_rel * np.abs(b[:, 3])
            fail = (fin & (d > lim)).any(axis=1)
        else:
            rt, at = np.asarray(rtol, dtype=np.float64), np.asarray(atol, dtype=np.float64)
            lim[:, :3] = (at + rt * scale)[:, None]
            lim[:, 3] = at * np.sqrt(np.maximum(np.asarray(sizes, dtype=np.float64), 1.0)) + rt * np.abs(b[:, 3])
            fail = (fin & (d > lim * (1 + 1e-12))).any(axis=1)
    codes = np.where(mism | fail, 2, np.where(fin.any(axis=1), 1, 0)).astype(np.int8)
    return codes, mism
