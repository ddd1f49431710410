"""The default judgement of a compared step: unusable data, or a root cause. No torch.

A step fails (:func:`judge_step`) iff

* its data are unusable: ``problems`` (an unreadable or cut-short dump...), ``_unusable`` rows
  of the compare table (a call or tensor on one side only that the compare stage did not classify
  as bookkeeping, a missing file, a changed shape), or calls the replay could not judge for a
  reason statistics cannot stand in for (``CallVerdict.unusable``: a malformed record, a replay
  out of memory or failing unexpectedly); or
* there is a **root cause** (:class:`Cause`):

  - ``OVER_BUDGET`` / ``NONFINITE``: the device's own error on its own recorded inputs is over its
    budget, or it has a NaN/Inf the replay of the same inputs does not produce
    (:func:`pytest_ptdbg.judge.own_error.judge_dump`); and a NaN/Inf the bench does not have
    that no earlier root cause explains (a NaN run's first input): its first tensor;
  - ``CHANGED_ARGUMENT``: a non-tensor argument differs (the table's ``_arg_changed`` rows, whose
    ``Err_message`` names both values), or a dtype argument lowers the call's precision (the
    replay's ``lowered_precision``);
  - ``ONE_SIDED``: a value-changing call on one side only (``_code_path == "value-changing"``;
    an ``"optimizer update"`` call, the update spelled another way inside ``Optimizer.step``, is
    none: the bench's is the reference, the device's must be judged by the replay, else its row
    is unusable; statistics only, a note names it as not judged);
    a call on one side only that the compare stage did not classify as bookkeeping is
    ``UNPAIRED`` (its rows are unusable);
  - ``STATISTICS``: with no full tensors to replay, an API whose statistics differ from the bench
    far more than its inputs' do and than its dtype's rounding explains (:func:`statistics_causes`;
    localisation is weaker, and the judgement says how to re-dump the suspects in full).

When the two dumps are different programs (``comparison.pairing.Pairing.different_programs``: too
few calls pair, or their dataflow disagrees), the step fails with one ``DIFFERENT_PROGRAMS`` finding
and no call is named: a call on one side only is then no cause of anything.

Root causes are ranked in execution order (the earliest first). The table is read through
:class:`~pytest_ptdbg.comparison.schema.CompareTable` (validated once: every column is there).
"""
from __future__ import annotations

import dataclasses
import functools

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd

from pytest_ptdbg.comparison import schema as S
from pytest_ptdbg.comparison.code_path import BOOKKEEPING, OPTIMIZER_UPDATE, VALUE_CHANGING
from pytest_ptdbg.comparison.pairing import Pairing
from pytest_ptdbg.comparison.schema import CompareTable
from pytest_ptdbg.comparison.stat_error import range_scaled, scaled_one
from pytest_ptdbg.judge.finding import Cause, Evidence, Finding
from pytest_ptdbg.judge.passing import passes
from pytest_ptdbg.judge.verdicts import CallVerdict, DumpJudgement, Status

__all__ = ["Cause", "Finding", "StepJudgement", "judge_step", "statistics_causes", "rescan_hint", "unusable_text",
           "STAT_FACTOR", "STAT_FLOOR_UNITS", "STAT_SIGNIFICANT"]

#: statistics-only: an output's statistic error must exceed this many times its inputs' ...
STAT_FACTOR = 10.0
#: ... and this many units of rounding of its lowest-precision dtype ...
STAT_FLOOR_UNITS = 8.0
#: a step's first inputs (weights, data) differing by more than this (relative) before any
#: recorded call differed by more than INPUTS_AGREE fail it: inputs that differ at the start
INPUTS_DIFFER = 1e-3
INPUTS_AGREE = 1e-5
#: ... and this share of its scale (below it, statistics cannot tell amplification from a fault)
STAT_SIGNIFICANT = 1e-2


@dataclass
class StepJudgement:
    """The verdict of one compared step and what it rests on."""

    passed: bool
    root_causes: List[Finding] = field(default_factory=list)
    unusable: List[str] = field(default_factory=list)
    #: the replay judgement of the device dump (None: no full tensors, or replay off)
    replay: Optional[DumpJudgement] = None
    by_statistics: bool = False
    rescan: str = ""
    notes: List[str] = field(default_factory=list)

    @property
    def first(self) -> Optional[Finding]:
        return self.root_causes[0] if self.root_causes else None

    def text(self) -> str:
        lines = []
        if self.passed:
            lines.append("Judgement: PASSED (no root cause, every datum usable)")
        else:
            lines.append(f"Judgement: FAILED ({len(self.root_causes)} root cause(s), "
                         f"{len(self.unusable)} unusable datum/data)")
        for r in self.root_causes[:10]:
            lines.append(f"  - {r.api + ' ' if r.api else ''}[{r.cause}] {r.detail}")
        for u in self.unusable[:5]:
            lines.append(f"  - unusable: {u}")
        if self.replay is not None:
            lines.append(self.replay.text().rstrip("\n"))
        if self.by_statistics:
            lines.append("  Statistics only: the calls were not replayed (no full tensors, or a statistics "
                         "compare was asked for), so root causes are judged from "
                         "max/min/mean/norm differences against the inputs' and the dtype's; "
                         "localisation is weaker.")
        if self.rescan:
            lines.append(f"  To localise by replay, re-dump the suspects in full: {self.rescan}")
        return "\n".join(lines) + "\n"

    def to_dict(self) -> Dict[str, Any]:
        return {"passed": self.passed, "root_causes": [r.to_dict() for r in self.root_causes],
                "unusable": list(self.unusable), "by_statistics": self.by_statistics,
                "rescan": self.rescan,
                "replay": self.replay.to_dict() if self.replay is not None else None}


# ----------------------------------------------------------------------------------- sides


def _side(api: str, bench_api: str, npu_name: str) -> str:
    return "NPU" if (npu_name and npu_name.lower() not in ("nan", "n/a", "")) else "bench"


# ----------------------------------------------------------------------------------- judging


def unusable_text(v: CallVerdict) -> str:
    """How a call the replay could not judge (``CallVerdict.unusable``) is listed as unusable."""
    return f"{v.api}: could not be judged ({v.reason})"


def judge_step(table: Union[pd.DataFrame, CompareTable], problems: Sequence[str],
               replay: Optional[DumpJudgement] = None,
               statistics: bool = True) -> StepJudgement:
    """The step's verdict (module docstring). ``replay``: the device dump's
    :class:`~pytest_ptdbg.judge.own_error.DumpJudgement` or None; ``statistics``: judge by
    statistics when there is no replay judgement."""
    t = CompareTable.of(table)
    pairing = t.attrs.get("pairing")
    if isinstance(pairing, Pairing) and pairing.different_programs:
        # nothing pairs call by call: one finding says so, instead of every one-sided call
        rc = Finding("", "", Cause.DIFFERENT_PROGRAMS, Evidence.TABLE, why=pairing.programs_text)
        return StepJudgement(passes(root_causes=[rc]), [rc], list(problems), replay)
    n = len(t)
    apis, direction, family, ctx = t[S.API], t[S.DIRECTION], t[S.FAMILY], t[S.CTX]
    order, paired, unusable, arg_changed = t[S.ORDER], t[S.PAIRED], t[S.UNUSABLE], t[S.ARG_CHANGED]
    code_path, msg, npu_name = t[S.CODE_PATH], t[S.ERR_MESSAGE], t[S.NPU_NAME]

    first_row: Dict[str, int] = {}
    for i in range(n):
        first_row.setdefault(apis[i], i)
    causes: Dict[str, Finding] = {}

    def add(rc: Finding) -> None:
        if rc.api not in causes:
            causes[rc.api] = rc

    bad_rows: List[str] = []
    npu_nonfinite = np.nan_to_num(t.floats(S.NPU_NONFINITE), nan=0.0)
    bench_nonfinite = np.nan_to_num(t.floats(S.BENCH_NONFINITE), nan=0.0)
    bench_update_nonfinite = any(code_path[i].strip().lower() == OPTIMIZER_UPDATE and bench_nonfinite[i] > 0
                                 for i in range(n) if not paired[i])
    io, npu_dtype = t[S.IO], t[S.NPU_DTYPE]
    # calls handed a NaN/Inf tensor (not a Python number: lr=nan is the update's own argument)
    fed_nonfinite = {apis[i] for i in range(n) if npu_nonfinite[i] > 0 and io[i] != S.OUTPUT
                     and str(npu_dtype[i]).startswith("torch.")}
    fed_updates: Dict[str, Finding] = {}   # such one-sided updates: origins only if nothing before explains it
    judged_by_replay = {v.api for v in replay.verdicts if v.status != Status.NOT_JUDGED} if replay else set()
    seen_update: set = set()
    unjudged_update: Dict[str, None] = {}   # statistics only: the device's update calls, in order
    for i in range(n):
        if arg_changed[i]:
            add(Finding(apis[i], direction[i], Cause.CHANGED_ARGUMENT, Evidence.TABLE, int(order[i]),
                        first_row.get(apis[i], i), family[i], ctx=ctx[i], changes=(msg[i],) if msg[i] else ()))
            continue
        if paired[i]:
            if unusable[i]:
                bad_rows.append(f"CSV line {i + 2}: {apis[i]}: {msg[i] or 'unusable'}")
            continue
        cp = code_path[i].strip().lower()
        side = _side(apis[i], "", npu_name[i])
        if cp == BOOKKEEPING:
            continue
        if cp == OPTIMIZER_UPDATE:
            # the optimizer's update spelled another way on this side (fused/foreach kernels
            # against per-parameter calls): the bench's calls are the reference; the device's
            # pass only where the replay judged them (their own error, against a float64 oracle)
            if side == "NPU" and replay is None:
                unjudged_update.setdefault(apis[i], None)
                if npu_nonfinite[i] > 0 and not bench_update_nonfinite:
                    # statistics judge an update for NaN/Inf: one the bench's update does not make
                    f = Finding(apis[i], direction[i], Cause.NONFINITE, Evidence.TABLE, int(order[i]),
                                first_row.get(apis[i], i), family[i], math.inf, ctx=ctx[i], tensor=npu_name[i])
                    if apis[i] in fed_nonfinite:
                        fed_updates.setdefault(apis[i], f)
                    else:
                        add(f)
            elif side == "NPU" and apis[i] not in judged_by_replay and apis[i] not in seen_update:
                seen_update.add(apis[i])
                bad_rows.append(f"CSV line {i + 2}: {apis[i]}: the optimizer's update on the device side "
                                "only, not judged by replay (its own replay is what checks it: no bench partner)")
            continue
        if cp == VALUE_CHANGING:
            # the compare stage writes code_path.classify's reason after the pairing's message
            why = msg[i].split("; ", 1)[-1] if VALUE_CHANGING in msg[i] else "it changes values"
            add(Finding(apis[i], direction[i], Cause.ONE_SIDED, Evidence.TABLE, int(order[i]),
                        first_row.get(apis[i], i), family[i], side=side, ctx=ctx[i], why=why))
            continue
        if unusable[i]:
            add(Finding(apis[i], direction[i], Cause.UNPAIRED, Evidence.TABLE, int(order[i]),
                        first_row.get(apis[i], i), family[i], side=side, ctx=ctx[i]))
            bad_rows.append(f"CSV line {i + 2}: {apis[i]}: {msg[i] or 'on one side only'}")

    if replay is not None:
        for v in replay.verdicts:
            row = first_row.get(v.api, -1)
            if v.unusable:  # a malformed record, a replay out of memory, a memory bomb: not a pass
                bad_rows.append(unusable_text(v))
            if v.status == Status.ROOT_CAUSE:
                add(Finding(v.api, v.direction, Cause.NONFINITE if v.nonfinite else Cause.OVER_BUDGET,
                            Evidence.REPLAY, v.order, row, v.family, v.ratio, v.own_error, v.budget,
                            ctx=v.ctx, worst=v.worst, compute_dtype=v.compute_dtype,
                            matches_dtype=v.matches_dtype))
            # the compare stage's argument rows are the changed arguments, except for dtype
            # arguments: it lists those as following the run's precision, the judge knows when a
            # dtype lowers the call's precision below anything computed before
            changed = list(v.lowered_precision)
            if changed:
                add(Finding(v.api, v.direction, Cause.CHANGED_ARGUMENT, Evidence.REPLAY, v.order, row,
                            v.family, ctx=v.ctx, changes=tuple(changed)))
    first_in = _inputs_differ(t)
    if first_in is not None:
        i, e = first_in
        add(Finding(apis[i], direction[i], Cause.INPUTS_DIFFER, Evidence.TABLE, int(order[i]), i, family[i],
                    ctx=ctx[i], tensor=t[S.INDEX][i], input_error=e))
    by_stats = False
    if replay is None and statistics and n:
        by_stats = True
        for rc in statistics_causes(t):
            add(rc)
    elif replay is not None and statistics and n:
        # calls the replay could not judge (an API outside the allowlist, no call spec, no saved
        # tensors) are not passed unseen: their statistics judge them, as in a statistics compare
        judged = {v.api for v in replay.verdicts if v.status != Status.NOT_JUDGED}
        for rc in statistics_causes(t):
            if rc.api not in judged:
                add(dataclasses.replace(rc, replay_missed=True))

    nf = _unmatched_nonfinite(t)
    if nf is not None and not any(0 <= rc.row <= nf for rc in causes.values()):
        # a NaN/Inf the bench does not have and that no call before it explains (every statistic
        # NaN from the step's first input on): the first such tensor is where it shows, and it fails
        add(Finding(apis[nf], direction[nf], Cause.NONFINITE, Evidence.TABLE, int(order[nf]), nf, family[nf],
                    math.inf, ctx=ctx[nf], tensor=npu_name[nf]))

    for f in fed_updates.values():
        # an update handed NaN/Inf passes it on: its origin is the cause found before it, if any
        if not any(0 <= rc.row <= f.row for rc in causes.values()):
            add(f)

    def key(rc: Finding) -> tuple:
        row = rc.row if rc.row >= 0 else first_row.get(rc.api, n)
        return (row, rc.side != "NPU")

    ranked = sorted(causes.values(), key=key)
    listed = set(problems)   # compare() lists the replay's unusable calls among its problems too
    unusable_all = list(problems) + [b for b in bad_rows if b not in listed]
    j = StepJudgement(passes(root_causes=ranked, unusable=unusable_all), ranked, unusable_all, replay, by_stats)
    if by_stats and ranked:
        j.rescan = rescan_hint([r.api for r in ranked if r.side == "NPU"][:5])
    if unjudged_update:
        names = list(unjudged_update)
        j.notes.append(f"the device's optimizer update is spelled otherwise than the bench's (fused/foreach "
                       f"kernels) and has no bench partner; statistics cannot judge it, only a replay of its "
                       f"full tensors can: {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}")
    return j


def _unmatched_nonfinite(t: CompareTable) -> Optional[int]:
    """The first paired row whose NPU tensor has NaN/Inf (counted, or in its statistics) where the
    bench's has none; None when there is none."""
    if not len(t):
        return None
    nn = np.nan_to_num(t.floats(S.NPU_NONFINITE), nan=0.0)
    bn = np.nan_to_num(t.floats(S.BENCH_NONFINITE), nan=0.0)
    hit = np.flatnonzero(t[S.PAIRED] & (nn > 0) & (bn <= 0))
    return int(hit[0]) if len(hit) else None


@np.errstate(invalid="ignore", over="ignore", divide="ignore")  # NaN/Inf statistics are data here
def _inputs_differ(t: CompareTable) -> Optional[tuple]:
    """``(row, error)`` of the first input row (execution order) that differs from the bench's by
    more than :data:`INPUTS_DIFFER` (and 4 roundings of its dtype) while every row before it
    agrees to :data:`INPUTS_AGREE`; None when there is none, or when a call of the not-judged
    table (uninitialised, random) differed first (relative L2 of full tensors, else statistics)."""
    from pytest_ptdbg.judge import not_judged as NJ

    n = len(t)
    if not n:
        return None
    rel = np.abs(t[S.REL_L2])
    rel = np.where(np.isinf(rel), 1.0, rel)
    rng = t.value_range("bench")
    diffs = t.stat_difference()
    err = np.where(np.isnan(rel), range_scaled(diffs, rng), rel)
    err = _zero_tensors_at_data_scale(t, err, rel, rng, diffs)
    paired, io, family = t[S.PAIRED], t[S.IO], t[S.FAMILY]
    dts = [a + "|" + b for a, b in zip(t[S.NPU_DTYPE], t[S.BENCH_DTYPE])]
    for i in range(n):
        if not paired[i]:
            continue
        e = float(err[i])
        if NJ.special_of(family[i]) is not None:
            if not (e <= INPUTS_AGREE):  # uninitialised or random values that may flow on
                return None
            continue
        if not np.isfinite(e):
            return None
        u = max([_unit("torch.float32")] + [_unit(d) for d in dts[i].split("|") if "float" in d])
        # data stored in a lower precision (a bf16 device's inputs) differ by its rounding
        if e > max(INPUTS_DIFFER, 4 * u) and io[i] == S.INPUT:
            return i, e
        if e > INPUTS_AGREE:
            return None
    return None


#: the scale a zero tensor's difference is judged at when its call has no other data (RMS 1)
ZERO_FLOOR = 1.0


def _numel(shape: object) -> float:
    try:
        return float(np.prod([int(x) for x in shape])) if isinstance(shape, (list, tuple)) else math.nan
    except (TypeError, ValueError):
        return math.nan


def _zero_tensors_at_data_scale(t: CompareTable, err: np.ndarray, rel: np.ndarray, rng: np.ndarray,
                                diffs: np.ndarray) -> np.ndarray:
    """``err`` with the rows of tensors that are zero on a side (a zero-initialised bias) judged
    at the scale of their call's data instead of relative to zero: the difference over the
    largest RMS (full tensors; range, statistics only) among the call's other floating tensor
    inputs, or over :data:`ZERO_FLOOR` when it has none. Other rows are unchanged."""
    b_l2, n_l2 = np.abs(t.floats(S.BENCH_L2NORM)), np.abs(t.floats(S.NPU_L2NORM))
    n_rng = t.value_range("npu")
    zero = ((b_l2 == 0) | (n_l2 == 0) | (rng == 0) | (n_rng == 0)) & (err > 0)
    if not zero.any():
        return err
    apis, io, arg, dts = t[S.API], t[S.IO], t[S.ARG], t[S.BENCH_DTYPE]
    numel = np.array([_numel(x) for x in t[S.BENCH_SHAPE]])
    data = (io == S.INPUT) & np.isin(arg, ("", "nan")) & np.array(["float" in d for d in dts], dtype=bool) & (numel > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        rms = np.where(data, b_l2 / np.sqrt(numel), np.nan)
    scale_rms: Dict[str, float] = {}
    scale_rng: Dict[str, float] = {}
    for i in range(len(t)):
        if data[i]:
            if np.isfinite(rms[i]) and rms[i] > 0:
                scale_rms[apis[i]] = max(scale_rms.get(apis[i], 0.0), float(rms[i]))
            if np.isfinite(rng[i]) and rng[i] > 0:
                scale_rng[apis[i]] = max(scale_rng.get(apis[i], 0.0), float(rng[i]))
    out = err.copy()
    for i in np.flatnonzero(zero).tolist():
        if not np.isnan(rel[i]) and np.isfinite(numel[i]) and numel[i] > 0:
            diff_l2 = float(rel[i]) * float(b_l2[i]) if np.isfinite(rel[i]) and b_l2[i] > 0 else float(n_l2[i])
            floor = scale_rms.get(apis[i], ZERO_FLOOR) * math.sqrt(numel[i])
            out[i] = diff_l2 / max(float(b_l2[i]) if np.isfinite(b_l2[i]) else 0.0, floor)
        elif np.isnan(rel[i]) and np.isfinite(diffs[i]):
            out[i] = float(diffs[i]) / max(float(rng[i]) if np.isfinite(rng[i]) else 0.0,
                                           scale_rng.get(apis[i], ZERO_FLOOR))
    return out


def rescan_hint(apis: Sequence[str]) -> str:
    """The ``configure_hook`` call that re-dumps ``apis`` (API keys) in full, both directions."""
    from pytest_ptdbg.format import records

    scope = []
    for a in apis:
        try:
            p = records.parse_name(a)
            s = f"{p.api_type}_{p.api_name}_{p.call_index}_"
        except ValueError:
            s = a
        if s not in scope:
            scope.append(s)
    if not scope:
        return ""
    return f'debugger.configure_hook(mode="list", scope={scope!r}, summary_only=False)'


# ----------------------------------------------------------------------------------- statistics


@functools.lru_cache(maxsize=64)
def _unit(dtype: str) -> float:
    from pytest_ptdbg.judge.budget import unit_roundoff

    return unit_roundoff(dtype)


@np.errstate(invalid="ignore", over="ignore", divide="ignore")  # NaN/Inf statistics are data here
def statistics_causes(table: Union[pd.DataFrame, CompareTable], factor: float = STAT_FACTOR,
                      floor_units: float = STAT_FLOOR_UNITS, significant: float = STAT_SIGNIFICANT) -> List[Finding]:
    """Root causes from statistics alone (summary compare, or a compare without replay).

    A tensor's error is the largest of its |max|, |min|, |mean| differences over a scale (and, in
    a full-compare table, its L2 difference over the larger of its and its inputs' norms): the
    larger of its bench range max(|max|, |min|) and its call's inputs' ranges (a near-zero result
    such as a mathematically-zero bias gradient is judged at the scale it was computed from). A
    call is a root cause when an output's error exceeds ``factor`` x the largest error among its
    inputs (backward: also the forward tensors of the same call), ``floor_units`` roundings of its
    lowest-precision dtype and ``significant`` (statistics cannot tell an ill-conditioned op, such
    as AdamW's first step, from a faulty one below that); or when an output has NaN/Inf (counts)
    where neither its inputs nor the bench's output have. Calls whose inputs' statistics are not
    finite (masked with -inf), the calls of :mod:`.not_judged`'s table, and the optimizer's
    update (``ctx == "optimizer"``: AdamW's first step turns rounding-level gradient differences
    into whole steps; statistics cannot tell that from a fault, replay can) are judged for
    NaN/Inf only.
    """
    from pytest_ptdbg.judge import not_judged as NJ

    t = CompareTable.of(table)
    n = len(t)
    if not n:
        return []
    apis, io, direction, family, ctx = t[S.API], t[S.IO], t[S.DIRECTION], t[S.FAMILY], t[S.CTX]
    order, paired = t[S.ORDER], t[S.PAIRED]
    rng, npu_rng = t.value_range("bench"), t.value_range("npu")
    diffs = t.summary_difference()
    if np.isnan(diffs).all():  # a full-compare table: the statistics differences from the stat columns
        diffs = t.stat_difference()
    finite = np.isfinite(diffs) & np.isfinite(rng) & np.isfinite(npu_rng)
    # a full-compare table also has the tensors' own L2 difference (‖n − b‖ = rel_l2 x ‖b‖)
    rel = np.abs(t[S.REL_L2])
    b_l2 = np.abs(t.floats(S.BENCH_L2NORM))
    l2diff = np.where(np.isinf(rel), np.abs(t.floats(S.NPU_L2NORM)), rel * b_l2)
    # the per-row walk below reads Python values (a numpy element read per row costs more): lists
    # of bools and strings (no new objects), the floats of the calls judged one by one (.item)
    nn_pos = (t.floats(S.NPU_NONFINITE) > 0).tolist()   # (False for NaN: unknown counts)
    bn_pos = (t.floats(S.BENCH_NONFINITE) > 0).tolist()
    paired_, io_, finite_ = np.asarray(paired, dtype=bool).tolist(), list(io), finite.tolist()
    rng_, diffs_, b_l2_, l2diff_ = rng.item, diffs.item, b_l2.item, l2diff.item
    units: Dict[Tuple[str, str], float] = {}   # the coarsest rounding of a row's two dtypes

    def unit_of(nd: str, bd: str) -> float:
        u = units.get((nd, bd))
        if u is None:
            u = units[(nd, bd)] = max([_unit(d) for d in (nd, bd) if "float" in d] or [0.0])
        return u

    per: Dict[str, Dict[str, Any]] = {}
    for i, nd, bd in zip(range(n), t[S.NPU_DTYPE], t[S.BENCH_DTYPE]):
        if not paired_[i]:
            continue
        v = per.setdefault(apis[i], {"ins": [], "outs": [], "nan_in": False, "nan_out": False, "unknown": False,
                                     "u": _unit("torch.float32"), "row": i})
        v["u"] = max(v["u"], unit_of(nd, bd))
        if io_[i] == S.OUTPUT:
            v["outs"].append(i)
            if nn_pos[i] and not bn_pos[i]:
                v["nan_out"] = True
        else:
            v["ins"].append(i)
            v["nan_in"] = v["nan_in"] or nn_pos[i]
            v["unknown"] = v["unknown"] or not finite_[i]
    for api, v in per.items():  # backward formulas read the forward tensors of the same call
        if api.endswith("_" + S.BACKWARD):
            f = per.get(api[: -len(S.BACKWARD)] + S.FORWARD)
            if f is not None:
                v["ins"] = v["ins"] + f["ins"] + f["outs"]
                v["nan_in"] = v["nan_in"] or f["nan_in"] or f["nan_out"]
                v["unknown"] = v["unknown"] or f["unknown"] or any(not finite_[j] for j in f["outs"])
    out: List[Finding] = []
    for api, v in per.items():
        i = v["row"]
        sp = NJ.special_of(family[i])
        if sp is not None and sp.treatment != NJ.Treatment.TIES:
            continue
        optimizer = ctx[i] == S.OPTIMIZER
        if v["nan_out"] and not v["nan_in"]:
            out.append(Finding(api, direction[i], Cause.NONFINITE, Evidence.STATISTICS, int(order[i]), i,
                               family[i], math.inf, ctx=ctx[i]))
            continue
        if v["unknown"] or not v["outs"] or optimizer:
            continue
        in_scale = max([rng_(j) for j in v["ins"] if finite_[j]] or [0.0])
        in_l2 = max([b_l2_(j) for j in v["ins"] if math.isfinite(b_l2_(j))] or [0.0])

        def err(j: int, scale: float, l2scale: float) -> float:
            if not finite_[j]:
                return 0.0
            e = scaled_one(diffs_(j), max(rng_(j), scale))
            d2 = l2diff_(j)
            if math.isfinite(d2):
                b2 = b_l2_(j)
                e = max(e, scaled_one(d2, max(b2 if math.isfinite(b2) else 0.0, l2scale)))
            return e

        e_in = max([err(j, 0.0, 0.0) for j in v["ins"]] or [0.0])
        e_out = max(err(j, in_scale, in_l2) for j in v["outs"])
        bound = max(factor * e_in, floor_units * v["u"], significant)
        if e_out > bound:
            out.append(Finding(api, direction[i], Cause.STATISTICS, Evidence.STATISTICS, int(order[i]), i,
                               family[i], e_out / bound, e_out, bound, ctx=ctx[i], input_error=e_in))
    return out
