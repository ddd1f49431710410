"""Judge a finished compare table again under another rule or other thresholds. No torch.

Used by ``assert_precision(compare_result, rtol=...)`` on a plain ``CompareResult`` (the fixture's
result runs ``compare()`` again instead). The rules are ``comparison.verdict``'s, applied to the
table's columns:

- statistics (summary) compare, both rules, and full compare under the ``ptdbg`` rule: exact (the
  table holds every number those rules read: the statistics, ``Cosine``, ``MaxAbsErr``);
- full compare under the ``dtype`` rule, which counts elements with |n - b| > atol + rtol*|b|:
  decided from bounds where they suffice. Every element passes when ``MaxAbsErr <= atol`` or
  ``MaxRelativeErr <= rtol``; one element fails when ``MaxAbsErr > atol + rtol*A``
  (A = max(|bench max|, |bench min|)); with ``max_fail_fraction`` > 0 the error ratio columns
  bound the failing fraction. Rows between the bounds are returned as undecided.

Rows that are unpaired or unusable (``_unusable``: unreadable data, changed shape or dtype
class), with NaN/Inf at different places, or with nothing compared keep their verdict (no
threshold changes it): unusable rows never re-judge to pass. So do argument rows (``_arg``: a
changed argument is no matter of tolerance) and one-sided calls' classifications (``_code_path``).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, List, Optional, Tuple

from pytest_ptdbg.comparison.rule import Rule
from pytest_ptdbg.comparison.schema import is_summary

if TYPE_CHECKING:
    import pandas as pd

    from pytest_ptdbg.comparison.verdict import Thresholds

__all__ = ["rejudge_table"]

_STATS = ("max", "min", "mean", "l2norm")
#: relative margin on the dtype rule's bounds (the compare computes them in floating point)
_MARGIN = 1e-9


def _f(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _shape(value: Any) -> Tuple[int, ...]:
    try:
        return tuple(int(v) for v in value)
    except TypeError:
        return ()


def _stats(row: pd.Series, side: str) -> List[Optional[float]]:
    out: List[Optional[float]] = []
    for k in _STATS:
        v = _f(row.get(f"{side} {k}"))
        out.append(None if math.isnan(v) else v)
    return out


def _summary(row: pd.Series, rule: Rule, th: Thresholds) -> str:
    from pytest_ptdbg.comparison import verdict as V

    verdict, _ = V.summary_verdict(_stats(row, "NPU"), _stats(row, "Bench"), 0, 0,
                                   _shape(row.get("NPU Tensor Shape")),
                                   row.get("NPU Tensor Dtype"), row.get("Bench Tensor Dtype"),
                                   rule, th)
    return verdict


def _full_ptdbg(row: pd.Series, th: Thresholds) -> str:
    from pytest_ptdbg.comparison import verdict as V
    from pytest_ptdbg.comparison.metrics import PairMetrics

    msg = str(row.get("Err_message", ""))
    zero = "NPU" if "all zeros on the NPU side" in msg else ("bench" if "all zeros on the bench side" in msg else "")
    m = PairMetrics(cosine=_f(row.get("Cosine")), max_abs_err=_f(row.get("MaxAbsErr")),
                    compared=1, zero_side=zero)
    return V.full_verdict(m, rule=Rule.PTDBG, th=th)


def _full_dtype(row: pd.Series, th: Thresholds) -> Optional[str]:
    """``Yes``/``No`` when the table's bounds decide the dtype rule, else None."""
    from pytest_ptdbg.comparison import verdict as V
    from pytest_ptdbg.comparison.metrics import zero_eps

    rtol, atol = V.tolerance(row.get("NPU Tensor Dtype"), row.get("Bench Tensor Dtype"), th)
    err, rel = _f(row.get("MaxAbsErr")), _f(row.get("MaxRelativeErr"))
    if math.isnan(err):
        return None
    eps = zero_eps(row.get("Bench Tensor Dtype"))  # MaxRelativeErr's denominator where b == 0
    if err <= atol * (1 - _MARGIN) or (rel <= rtol * (1 - _MARGIN) and rtol * eps <= atol):
        return "Yes"
    span = max(abs(_f(row.get("Bench max"))), abs(_f(row.get("Bench min"))))
    some_fail = math.isfinite(span) and err > (atol + rtol * span) * (1 + _MARGIN)
    frac = th.max_fail_fraction
    if some_fail and frac <= 0:
        return "No"
    # an element failing atol + rtol*|b| has a relative error > rtol: it is outside the ratios
    for level, col in ((0.001, "One Thousandth Err Ratio"), (0.005, "Five Thousandths Err Ratio")):
        within = _f(row.get(col))
        if rtol >= level and atol >= level * eps and not math.isnan(within) \
                and 1.0 - within <= frac * (1 - _MARGIN):
            return "Yes"
    return None


def _is_argument_or_code_path(row: pd.Series) -> bool:
    """Rows no threshold changes: a non-tensor argument (same or changed) and a one-sided call's
    classification (``_arg``, ``_arg_changed``, ``_code_path``)."""
    arg = row.get("_arg", "")
    cp = row.get("_code_path", "")
    return (isinstance(arg, str) and arg != "") or bool(row.get("_arg_changed", False) is True) or \
        (isinstance(cp, str) and cp != "")


def rejudge_table(table: pd.DataFrame, rule: Rule, th: Thresholds) -> Tuple[pd.DataFrame, List[str]]:
    """A copy of ``table`` with ``Accuracy Reached or Not`` and ``_passed`` judged again under
    ``rule`` and ``th`` (``comparison.verdict.Thresholds``), and the names of the rows the table
    cannot decide (their verdict is left as it was)."""
    from pytest_ptdbg.comparison import verdict as V

    V._check_rule(rule)
    out = table.copy()
    if not len(out):
        return out, []
    summary = is_summary(out)
    verdicts = list(out["Accuracy Reached or Not"])
    undecided: List[str] = []
    for i, (_, row) in enumerate(out.iterrows()):
        old = verdicts[i]
        if not bool(row.get("_paired", True)) or bool(row.get("_nan_mismatch", False)) or \
                bool(row.get("_unusable", False)) or _is_argument_or_code_path(row) or \
                _shape(row.get("NPU Tensor Shape")) != _shape(row.get("Bench Tensor Shape")) or \
                old == "":
            continue
        if summary:
            new: Optional[str] = _summary(row, rule, th)
        elif rule == Rule.PTDBG:
            new = _full_ptdbg(row, th)
        else:
            new = _full_dtype(row, th)
        if new is None:
            undecided.append(str(row.get("NPU Name", i)))
        else:
            verdicts[i] = new
    out["Accuracy Reached or Not"] = verdicts
    out["_passed"] = [v != "No" for v in verdicts]
    out.attrs["rule"] = rule
    return out, undecided
