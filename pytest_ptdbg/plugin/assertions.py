"""``assert_precision(result, **thresholds)`` and ``PrecisionError``: turn a comparison into a verdict.

Works on what ``ptdbg_dump`` returns and on a plain ``CompareResult`` from ``compare()``.
The failure message names the first suspect API and where it is in the user's code, how far it
is from the threshold (the tolerance that would have passed), the other suspects, the advice and
the paths of the artifacts. Imports pandas lazily (the plugin imports this module at test time).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from pytest_ptdbg.comparison import schema as S
from pytest_ptdbg.comparison.rule import Rule
from pytest_ptdbg.comparison.schema import CompareTable
from pytest_ptdbg.comparison.stat_error import range_scaled
from pytest_ptdbg.comparison.verdict import Thresholds
from pytest_ptdbg.judge.passing import passes
from pytest_ptdbg.judge.verdicts import Status
from pytest_ptdbg.plugin.options import Settings, per_test
from pytest_ptdbg.errors import PrecisionError
from pytest_ptdbg.runtime.text import fmt_number

if TYPE_CHECKING:  # pragma: no cover
    from pytest_ptdbg.judge.finding import Finding

__all__ = ["PrecisionError", "assert_precision", "evaluate", "Evaluation"]




@dataclass
class Evaluation:
    """The verdict of one comparison under given settings (rule, thresholds, ignore lists)."""

    passed: bool
    table: Any
    advice: Any
    settings: Settings
    n_failed: int = 0
    n_ignored: int = 0
    worst: Optional[Dict[str, Any]] = None
    needed: Dict[str, float] = field(default_factory=dict)
    problems: List[str] = field(default_factory=list)
    compare_result: Any = None
    #: failing rows whose data could not be used (``_unusable``): no threshold passes them
    n_unusable: int = 0
    #: the judgement's root causes (rule ``judge``), ignored APIs left out
    root_causes: List["Finding"] = field(default_factory=list)

    @property
    def first_suspect(self) -> Any:
        """The advisor's first suspect (its ranking: root causes before inherited errors)."""
        return self.advice.first


def _to_float(value: Any) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return math.nan
    return out


def _ignored_mask(table: Any, settings: Settings) -> Any:
    import numpy as np

    t = CompareTable.of(table)
    n = len(t)
    mask = np.zeros(n, dtype=bool)
    if not n:
        return mask
    names = [f"{a} {f}".lower() for a, f in zip(t[S.API], t[S.FAMILY])]

    def matching(pat: Any) -> Any:
        p = str(pat).lower()
        return np.array([p in x for x in names], dtype=bool)

    for pat in settings.ignore:
        mask |= matching(pat)
    if settings.only:
        keep = np.zeros(n, dtype=bool)
        for pat in settings.only:
            keep |= matching(pat)
        mask |= ~keep
    if settings.ignore_optimizer:
        mask |= t[S.CTX] == S.OPTIMIZER
    return mask


def evaluate(result: Any, settings: Optional[Settings] = None, **overrides: Any) -> Evaluation:
    """The verdict of ``result`` (a ``ptdbg_dump`` result or a ``CompareResult``).

    ``settings`` default to the result's own (the test's) or the defaults; ``overrides`` (threshold
    names, ``rule``, ``ignore``, ``only``, ``ignore_optimizer``) win over them. When the rule or
    thresholds differ from those the comparison used, the rows are judged again (the fixture's
    result by ``compare()`` again; a ``CompareResult`` from its table, see ``comparison/rejudge.py``,
    which assumes it was compared with the default thresholds of its table's rule); ignored rows
    count as passed, and the advisor is run again on what is left.
    """
    from pytest_ptdbg.plugin.compat import advise_table

    cmp = getattr(result, "compare_result", result)
    table = cmp.table
    advice = cmp.advice
    used = getattr(result, "settings", None)
    if used is None:  # a plain CompareResult: what gated it (the judgement, or its table's rule)
        gate = getattr(cmp, "gate", None)
        used = Settings(rule=Rule.JUDGE if gate == Rule.JUDGE else CompareTable.of(table).row_rule)
    base = settings or used
    s = per_test(base, overrides, "assert_precision(...)") if overrides else base
    rejudge = used.rule != s.rule or dict(used.thresholds) != dict(s.thresholds)
    if rejudge:
        redo = getattr(result, "recompare", None)
        # the fixture's result: compare() again, element by element; else from the table
        cmp = redo(s) if redo is not None else _rejudge(cmp, s)
        table, advice = cmp.table, cmp.advice
    ignored = _ignored_mask(table, s)
    if rejudge or ignored.any():
        table = table.copy()
        if ignored.any():
            t = CompareTable(table)
            t.set(S.PASSED, ignored, True)
            t.set(S.ACCURACY, ignored, "")
        advice = advise_table(table, advice)
    problems = list(getattr(cmp, "problems", []) or [])   # unusable data: never a pass
    t = CompareTable.of(table)
    unusable_col = t[S.UNUSABLE]
    worst = _worst(table, ~ignored)
    causes: List["Finding"] = []
    if s.rule == Rule.JUDGE:
        failing, causes, judged = _judged_failing(cmp, table, ignored, unusable_col)
        unusable = failing & unusable_col
        needed: Dict[str, float] = {}
        passed = passes(root_causes=causes, failing_rows=failing, problems=problems, checks=[judged])
    else:
        failing = ~t[S.PASSED]
        unusable = failing & unusable_col
        # thresholds that would pass: only when every failure is a threshold matter
        needed = _needed(t.rows(failing), s) if failing.any() and not unusable.any() and not problems else {}
        passed = passes(failing_rows=failing, problems=problems)
    if advice is not None and advice.passed != passed:
        import dataclasses

        # the verdict decides the first suspect (advise.advisor.decide): a passing one has none
        advice = dataclasses.replace(advice, passed=passed)
    if passed and s.rule == Rule.JUDGE:
        # what the verdict used: the call closest to its own-error budget, not the largest
        # per-tensor difference (a mathematically-zero gradient's is huge and means nothing)
        worst = _closest_to_budget(getattr(cmp, "judgement", None), ignored_apis(table, ignored)) or worst
    return Evaluation(passed=passed, table=table, advice=advice, settings=s,
                      compare_result=cmp,
                      n_failed=int(failing.sum()), n_ignored=int(ignored.sum()), worst=worst,
                      needed=needed, problems=problems, n_unusable=int(unusable.sum()),
                      root_causes=causes)


def _judged_failing(cmp: Any, table: Any, ignored: Any, unusable: Any) -> Tuple[Any, List["Finding"], bool]:
    """Under compare()'s judgement: ``(failing rows, root causes, judged)`` with the ignored
    APIs left out. Failing rows are the unusable ones and every row of a root-cause API;
    ``judged`` is False when the result carries no judgement (then nothing passes)."""
    import numpy as np

    judgement = getattr(cmp, "judgement", None)
    if judgement is None:
        return np.ones(len(table), bool), [], False
    apis = CompareTable.of(table)[S.API]
    left_out = set(apis[ignored]) - set(apis[~ignored])
    causes = [rc for rc in judgement.root_causes if str(rc.api) not in left_out]
    cause_apis = {str(rc.api) for rc in causes}
    failing = (unusable & ~ignored) | np.isin(apis, list(cause_apis))
    return failing, causes, True


def _rejudge(cmp: Any, s: Settings) -> Any:
    """A plain ``CompareResult`` judged again under ``s``: from its table (``comparison/rejudge.py``), or,
    for rows the table cannot decide, by ``compare()`` again when the result records its
    ``input_param``. Returns the ``CompareResult`` whose table holds the new verdicts."""
    import dataclasses
    import os

    from pytest_ptdbg.plugin.compat import call_compare, to_thresholds
    from pytest_ptdbg.comparison.rejudge import rejudge_table

    table, undecided = rejudge_table(cmp.table, s.rule, to_thresholds(s))
    if not undecided:
        passed = passes(failing_rows=~CompareTable.of(table)[S.PASSED], problems=getattr(cmp, "problems", None) or [])
        return dataclasses.replace(cmp, table=table, passed=passed)
    params = getattr(cmp, "input_param", None)
    if params:
        out = os.path.join(os.path.dirname(cmp.csv_path), f"rejudged-{s.rule}")
        return call_compare(dict(params, is_print_compare_log=False), out, s)
    names = ", ".join(undecided[:5]) + (f" and {len(undecided) - 5} more"
                                        if len(undecided) > 5 else "")
    raise ValueError(
        f"assert_precision(CompareResult, rule={s.rule!r}, ...): {len(undecided)} row(s) "
        f"cannot be judged from the compare table ({names}): under the dtype rule their "
        "element-wise errors lie between the bounds the table keeps. Give the rule and "
        "thresholds to compare(..., rule=, thresholds=) instead, or assert on ptdbg_dump's "
        "result (which compares again).")


def ignored_apis(table: Any, ignored: Any) -> set:
    """The APIs every row of which ``ignored`` leaves out."""
    if not len(table) or not ignored.any():
        return set()
    apis = CompareTable.of(table)[S.API]
    return set(apis[ignored]) - set(apis[~ignored])


def _closest_to_budget(judgement: Any, left_out: set) -> Optional[Dict[str, Any]]:
    """The replayed call with the largest own error / budget (what the judgement passed it on):
    ``{"api", "tensor", "own_error", "budget", "ratio"}``; None without a replay."""
    replay = getattr(judgement, "replay", None)
    if replay is None:
        return None
    vs = [v for v in replay.verdicts if v.ratio == v.ratio and v.api not in left_out
          and v.status != Status.NOT_JUDGED]
    if not vs:
        return None
    v = max(vs, key=lambda v: v.ratio)
    out: Dict[str, Any] = {"api": v.api, "tensor": f"{v.api} {v.worst}".strip(), "ratio": float(v.ratio)}
    for k in ("own_error", "budget"):
        x = _to_float(getattr(v, k, math.nan))
        out[k] = None if not math.isfinite(x) else x
    return out


def _worst(table: Any, considered: Any) -> Optional[Dict[str, Any]]:
    """The compared row with the largest error: its API and metrics."""
    import numpy as np

    from pytest_ptdbg.advise.advisor import row_errors

    t = CompareTable.of(table)
    if not len(t):
        return None
    err = row_errors(t)
    err = np.where(considered, err, np.nan)
    if np.all(np.isnan(err)) or not np.nanmax(err) > 1e-12:  # equal up to rounding noise
        return None
    i = int(np.nanargmax(err))
    out: Dict[str, Any] = {"api": str(t[S.API][i]), "tensor": str(t[S.NPU_NAME][i])}
    for col, key in ((S.COSINE, "cosine"), (S.MAX_ABS_ERR, "max_abs_err"), (S.REL_L2, "rel_l2")):
        if t.has(col):   # the metric columns: a full compare only
            v = float(t.floats(col)[i])
            out[key] = None if math.isnan(v) else v
    return out


def _max(values: Any) -> Optional[float]:
    vals = [float(v) for v in values if not math.isnan(v)]
    return max(vals) if vals else None


def _stat_rel(failing: CompareTable, scale_by_range: bool) -> Any:
    """Per failing row: the largest |npu stat - bench stat| / scale over max, min, mean, l2norm
    (the tolerance that passes it: ``inf`` when the bench's is zero and the device's not; NaN when
    no statistic is finite on both sides). The scale is the bench's ``|stat|``, or with
    ``scale_by_range`` its finite range for max, min and mean (:mod:`~pytest_ptdbg.comparison.stat_error`)."""
    import numpy as np

    n, b = failing.stats("npu"), failing.stats("bench")
    with np.errstate(invalid="ignore", over="ignore"):
        fin = np.isfinite(n) & np.isfinite(b)
        scale = np.abs(b)
        if scale_by_range:
            scale[:, :3] = failing.value_range("bench", finite_only=True)[:, None]
        rel = np.where(fin, range_scaled(np.abs(n - b), scale, when_zero=math.inf), np.nan)
    return np.fmax.reduce(rel, axis=1) if len(rel) else rel[:, 0]


def _needed(failing: CompareTable, s: Settings) -> Dict[str, float]:
    """Threshold values with which every failing row would have passed (a sufficient set, for
    the message: rows failing on NaN/Inf or shape cannot pass by any tolerance)."""
    from pytest_ptdbg.plugin.compat import effective_thresholds

    th = effective_thresholds(s)
    failing = failing.rows(~failing[S.NAN_MISMATCH])
    if not len(failing):
        return {}
    out: Dict[str, float] = {}
    full = not failing.summary
    defaults = Thresholds()
    if s.rule == Rule.PTDBG:
        if full:
            cos = [float(c) for c in failing.floats(S.COSINE) if not math.isnan(c)]
            mae = _max(failing.floats(S.MAX_ABS_ERR))
            if cos and min(cos) < th.get("cosine", defaults.cosine):
                out["cosine"] = min(cos)
            if cos and min(cos) < th.get("cosine_hard", defaults.cosine_hard):
                out["cosine_hard"] = min(cos)
            if mae is not None and mae > th.get("max_abs_hard", defaults.max_abs_hard):
                out["max_abs_hard"] = mae
        else:
            rel = _max(_stat_rel(failing, scale_by_range=False))
            if rel is not None:
                out["summary_rel"] = rel
    else:
        if full:  # |n - b| <= atol passes whatever rtol (MaxRelativeErr explodes near b = 0)
            mae = _max(failing.floats(S.MAX_ABS_ERR))
            if mae is not None:
                out["atol"] = mae
        else:
            rel = _max(_stat_rel(failing, scale_by_range=True))
            if rel is not None:
                out["rtol"] = rel
    return {k: v for k, v in out.items() if math.isfinite(v)}


# ------------------------------------------------------------------------------ messages

def _suspect_line(i: int, s: Any) -> str:
    growth = s.growth if s.growth is not None and math.isfinite(s.growth) else None
    from pytest_ptdbg.advise.advisor import Kind, kind_text

    if s.kind == Kind.UNPAIRED:
        return f"  {i}. {s.api} [{kind_text(s)}] at {s.location}"
    what = kind_text(s)
    cat = f"; {s.category}" if s.category and s.category != what else ""
    extra = f", error x{growth:.3g} from inputs to outputs" if growth else ""
    return f"  {i}. {s.api} [{what}{cat}{extra}] at {s.location}"


def failure_message(ev: Evaluation, result: Any) -> str:
    """The text of a :class:`PrecisionError`."""
    from pytest_ptdbg.advise.advisor import Kind, kind_text
    from pytest_ptdbg.plugin.compat import effective_thresholds

    cmp = ev.compare_result if ev.compare_result is not None else result
    s = ev.settings
    lines: List[str] = []
    who = ""
    if hasattr(result, "device"):
        who = f" ({result.device}{' ' + s.dtype if s.dtype != 'float32' else ''} vs " \
              f"{result.bench_label})"
    if s.rule == Rule.JUDGE:
        judgement = getattr(cmp, "judgement", None)
        how = ("judged from statistics: the calls were not replayed" if getattr(judgement, "by_statistics", False)
               else "each call replayed against a float64 oracle")
        lines.append(f"precision check failed{who}: {len(ev.root_causes)} root cause(s) found by the "
                     f"judgement ({how})")
        for rc in ev.root_causes[:5]:
            lines.append(f"  - {rc.api + ' ' if rc.api else ''}[{rc.cause.value}] {rc.detail}")
    else:
        lines.append(f"precision check failed{who}: {ev.n_failed} tensor(s) out of tolerance under "
                     f"the {s.rule} rule")
    if ev.n_unusable or ev.problems:
        lines.append(f"unusable data (no threshold passes it): {ev.n_unusable} row(s) not comparable "
                     f"(unpaired, unreadable, shape or dtype class changed), {len(ev.problems)} problem(s)")
    first = ev.first_suspect
    if first is not None:
        what = kind_text(first)
        cat = f", {first.category}" if first.category and first.category != what else ""
        lines.append(f"first suspect: {first.api} ({first.direction}, {what}{cat})")
        lines.append(f"  at {first.location}")
        err = first.error_text()   # only what is known
        if err:
            lines.append(f"  {err}")
    elif getattr(ev.advice, "programs", ""):
        lines.append(f"first suspect: none: {ev.advice.programs}")
    else:
        lines.append("first suspect: none named by the advisor (see the CSV)")
    if ev.worst:
        w = ev.worst
        metrics = ", ".join(f"{k}={fmt_number(w[k])}" for k in ("cosine", "max_abs_err", "rel_l2")
                            if w.get(k) is not None)
        lines.append(f"worst tensor: {w.get('tensor') or w['api']} ({metrics})")
    th = effective_thresholds(s)
    if th:
        lines.append("thresholds: " + ", ".join(f"{k}={fmt_number(v)}" for k, v in th.items()))
    if ev.needed:
        args = ", ".join(f"{k}={fmt_number(v)}" for k, v in ev.needed.items())
        lines.append(f"would have passed with: assert_precision({args})  (or @pytest.mark.ptdbg"
                     f"({args}))")
    others = [x for x in ev.advice.suspects if x is not first and x.kind != Kind.INHERITED][:4]
    if others:
        lines.append("other suspects:")
        lines += [_suspect_line(i, x) for i, x in enumerate(others, 2)]
    if first is not None and first.advice:
        lines.append(f"advice: {first.advice}")
    if ev.n_ignored:
        lines.append(f"({ev.n_ignored} row(s) ignored by ignore/only/ignore_optimizer)")
    paths = [(k, getattr(cmp, a, None)) for k, a in
             (("html", "html_path"), ("csv", "csv_path"), ("advisor", "advisor_path"))]
    paths = [(k, p) for k, p in paths if p]
    if paths:
        lines.append("artifacts:")
        lines += [f"  {k}: {p}" for k, p in paths]
    if ev.problems:
        lines.append(f"problems while comparing: {len(ev.problems)} (first: {ev.problems[0]})")
    return "\n".join(lines)


def assert_precision(result: Any, **thresholds: Any) -> Any:
    """Raise :class:`PrecisionError` unless every compared tensor of ``result`` is within tolerance.

    ``result``: what ``ptdbg_dump`` returns, or a ``CompareResult`` from ``compare()``.
    Keyword arguments: threshold names (``cosine``, ``max_abs``, ``cosine_hard``,
    ``max_abs_hard``, ``summary_rel``, ``rtol``, ``atol``, ``max_fail_fraction``), ``rule``
    (``"ptdbg"``/``"dtype"``), ``ignore`` / ``only`` (API name substrings),
    ``ignore_optimizer``; they win over the test's marker and options. On a ``CompareResult``
    the rule and thresholds re-judge its table; ``ValueError`` names the rows the dtype rule
    cannot decide without the tensors. Returns the :class:`Evaluation` when it passes.
    """
    __tracebackhide__ = True
    ev = evaluate(result, **thresholds)
    health = list(getattr(result, "health_problems", None) or [])
    gcheck = _golden_in_force(getattr(result, "golden_check", None), ev.settings)
    if passes(problems=health, checks=(ev.passed, gcheck is None or gcheck.passed)):
        return ev
    parts: List[str] = []
    if health:
        parts.append("NaN/Inf check failed: " + "; ".join(health))
    if gcheck is not None and not gcheck.passed:
        parts.append(gcheck.message(getattr(result, "nodeid", "")))
    if not ev.passed:
        parts.append(failure_message(ev, result))
    elif parts:
        paths = [getattr(ev.compare_result, a, None) for a in ("html_path", "csv_path")]
        if any(paths):
            parts.append("artifacts:\n" + "\n".join(f"  {p}" for p in paths if p))
    raise PrecisionError("\n".join(parts), ev)


def _golden_in_force(gcheck: Any, s: Settings) -> Any:
    """The golden check with the differences that ``ignore``/``only``/``ignore_optimizer`` of
    ``s`` leave out removed (None without a golden)."""
    if gcheck is None:
        return None
    import dataclasses

    def skipped(key: str) -> bool:
        low = key.lower()
        if s.ignore_optimizer and key.startswith("optimizer/"):
            return True
        if any(str(p).lower() in low for p in s.ignore):
            return True
        return bool(s.only) and not any(str(p).lower() in low for p in s.only)

    kept = [d for d in gcheck.differences if not skipped(d.key)]
    if len(kept) == len(gcheck.differences):
        return gcheck
    culprit = gcheck.culprit if gcheck.culprit in kept else (kept[0] if kept else None)
    return dataclasses.replace(gcheck, differences=kept, culprit=culprit,
                               location=gcheck.location if culprit is gcheck.culprit else "")


def unasserted_message(results: List[Any]) -> str:
    """Why a test that passed is reported failed: comparisons that failed and were never asserted."""
    lines = [f"{len(results)} precision comparison(s) failed and the test never asserted them "
             "(call result.assert_precision(); to expect the failure, result.expect_failure() "
             "or pytest.raises(PrecisionError))"]
    for r in results:
        try:
            assert_precision(r)
        except PrecisionError as exc:
            lines.append(str(exc))
    return "\n".join(lines)
