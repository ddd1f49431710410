"""The plugin's seam to the compare stage: call ``compare()`` with a test's rule and thresholds,
re-run the advisor on a filtered table. No torch here.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional

from pytest_ptdbg.comparison.rule import Rule
from pytest_ptdbg.plugin.options import Settings

if TYPE_CHECKING:
    import pandas as pd

    from pytest_ptdbg.advise.advisor import Advice
    from pytest_ptdbg.api import CompareResult
    from pytest_ptdbg.comparison.options import CompareOptions
    from pytest_ptdbg.comparison.verdict import Thresholds

_PTDBG_KEYS = ("cosine", "max_abs", "cosine_hard", "max_abs_hard", "summary_rel")
_DTYPE_KEYS = ("max_fail_fraction",)


def to_thresholds(settings: Settings) -> Thresholds:
    """``comparison.verdict.Thresholds`` from the settings' threshold dict."""
    from pytest_ptdbg.comparison.verdict import Thresholds

    th = Thresholds()
    given = dict(settings.thresholds)
    for key in _PTDBG_KEYS + _DTYPE_KEYS:
        if key in given:
            setattr(th, key, float(given[key]))
    if "rtol" in given or "atol" in given:
        th.tolerances = {d: (float(given.get("rtol", r)), float(given.get("atol", a)))
                         for d, (r, a) in th.tolerances.items()}
    return th


def effective_thresholds(settings: Settings) -> Dict[str, Any]:
    """The thresholds in force for the settings' rule, for messages."""
    th = to_thresholds(settings)
    if settings.rule == Rule.JUDGE:
        return {}
    if settings.rule == Rule.PTDBG:
        return {k: getattr(th, k) for k in _PTDBG_KEYS}
    out: Dict[str, Any] = {}
    given = settings.thresholds
    if "rtol" in given or "atol" in given:
        out["rtol"] = given.get("rtol", "per dtype")
        out["atol"] = given.get("atol", "per dtype")
    else:
        out["tolerances"] = "assert_close's for the lower-precision dtype (bf16 rtol 1.6e-2, " \
                            "fp16 1e-3, fp32 1.3e-6; atol 1e-5)"
    out["max_fail_fraction"] = th.max_fail_fraction
    return out


def compare_options(settings: Settings, log: bool = False) -> CompareOptions:
    """The ``CompareOptions`` of a test: its rule and thresholds, stack and advisor on."""
    from pytest_ptdbg.comparison.options import CompareOptions

    return CompareOptions(stack_mode=True, auto_analyze=True, fuzzy_match=False, rule=settings.rule,
                          thresholds=to_thresholds(settings), log=log)


def call_compare(params: Dict[str, Any], out_dir: str, settings: Settings) -> CompareResult:
    """The compare of ``params`` (ptdbg's ``input_param``) into ``out_dir`` under ``settings``."""
    from pytest_ptdbg.api import compare_inputs
    from pytest_ptdbg.comparison.options import inputs_from_param

    options = compare_options(settings, log=bool(params.get("is_print_compare_log", True)))
    result = compare_inputs(*inputs_from_param(params), out_dir, options)
    result.input_param = dict(params)
    return result


def advise_table(table: pd.DataFrame, previous: Optional[Advice] = None) -> Advice:
    """The advisor's findings for a (filtered or re-judged) table; the judgement of ``previous``
    (the compare's own advice) is kept."""
    from pytest_ptdbg.advise.advisor import advise

    advice = advise(table)
    advice.judgement = getattr(previous, "judgement", None)
    return advice
