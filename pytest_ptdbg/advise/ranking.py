"""Rank the advice by the step's judgement: root causes first, in execution order. No torch.

:func:`apply_judgement` folds a :class:`~pytest_ptdbg.judge.step.StepJudgement` into the advisor's
:class:`~pytest_ptdbg.advise.advisor.Advice`:

1. every root cause, earliest in execution order first, as a suspect with its fault category
   (:attr:`~pytest_ptdbg.judge.finding.Finding.category`) and advice saying what to try;
2. then the advisor's other suspects, labelled: a call the table called "own" that the replay
   finds within its own-error budget is an *amplifier* (it grows a difference it received, e.g.
   AdamW's first step g/|g|, an ill-conditioned op) or *inherited*; calls not judged keep their
   table-based label, except uninitialised memory (``empty*``), which is no suspect at all: its
   values are whatever memory held, or whatever the user wrote into it later.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional, Union

import pandas as pd

from pytest_ptdbg.advise import advice_text as at
from pytest_ptdbg.comparison import schema as S
from pytest_ptdbg.comparison.schema import CompareTable
from pytest_ptdbg.advise.advisor import MIN_GROWTH, Advice, Kind, Role, Suspect
from pytest_ptdbg.runtime.text import fmt_error
from pytest_ptdbg.judge import not_judged as NJ
from pytest_ptdbg.judge.finding import REDUCED_FP32, Cause, FaultCategory, Finding
from pytest_ptdbg.judge.step import StepJudgement
from pytest_ptdbg.judge.verdicts import Status

__all__ = ["advice_for_cause", "apply_judgement"]


def advice_for_cause(rc: Finding, category: FaultCategory) -> str:
    """What happened and what to try, for one root cause (``category``: :attr:`Finding.category`)."""
    op = at.op_name(rc.family) if rc.family else rc.api
    key = rc.api
    where = "its produced gradients" if rc.direction == S.BACKWARD else "its outputs"
    replay = (f'Reproduce it alone: configure_hook(mode="acl", scope=["{key}"]) and `ptdbg replay '
              "PACKAGE` (the same own-error budget as this verdict).")
    if category == FaultCategory.CHANGED_ARGUMENT:
        return (f"{op} is called with other non-tensor arguments than on the bench ({rc.detail}). "
                "Use the same value on both sides: check the model config, a default that changed "
                "between library versions, or a device-specific code path that sets it.")
    if category == FaultCategory.NONFINITE_ORIGIN:
        return (f"NaN/Inf first appears in {where} of {op}, and a replay of the same recorded inputs "
                "(in its dtype and in float64) does not produce it: the kernel overflows or divides "
                "by zero where a correct one does not. Compute it in float32, subtract the max "
                "before exp, clamp or add an eps before log/sqrt/division. " + replay)
    if category == FaultCategory.INPUTS_DIFFER:
        return f"{at.INPUTS_DIFFER_ADVICE} (Here {rc.inputs_text}.)"
    if category == FaultCategory.CODE_PATH:
        side = at.side_word(rc.side)
        why = rc.why if rc.cause == Cause.ONE_SIDED else rc.detail
        return (f"This call runs only on the {side} side ({why}): another code path, an "
                "extra cast or op. If it lowers precision (a cast to float16/bfloat16, a hand-written "
                "softmax without the max subtraction), make both sides run the same code, or keep "
                "the computation in float32.")
    if category == FaultCategory.BY_STATISTICS:
        return (f"From statistics only: {rc.detail}. Localisation without full tensors is weaker; "
                "re-dump this call in full (summary_only=False, mode=\"list\") to judge it by replay.")
    size = (f"{fmt_error(rc.own_error)} (budget {fmt_error(rc.budget)})" if rc.own_error == rc.own_error
            and rc.budget == rc.budget else "more than its budget")  # unknown numbers are left out
    if category == FaultCategory.REDUCED_PRECISION and rc.matches_dtype in REDUCED_FP32:
        return (f"{op} loses precision by itself: on its own recorded inputs {where} are off by {size}, "
                f"and they match a {rc.matches_dtype.upper()} computation: the device rounded this float32 "
                f"{'convolution' if 'conv' in rc.family else 'matmul'}'s operands to "
                f"{rc.matches_dtype.upper()} although the run's flags asked for strict float32 (the dump "
                "records them). Either the device ignores the flags (a bug to report), or set them where "
                "the device honours them: torch.backends.cudnn.allow_tf32 / "
                "torch.backends.cuda.matmul.allow_tf32 = False or torch.set_float32_matmul_precision("
                "'highest') on CUDA, torch.npu.conv.allow_hf32 / torch.npu.matmul.allow_hf32 = False on "
                "Ascend; a run that allows the mode is judged in it. " + replay)
    if category == FaultCategory.REDUCED_PRECISION:
        return (f"{op} loses precision by itself: on its own recorded inputs {where} are off by "
                f"{size}, more than a correct kernel in its compute dtype makes. The kernel computes "
                "or accumulates in lower precision than it should. Compute this op in float32 "
                "(exclude it from autocast, or .float() around it), accumulate in float32, and for "
                "softmax-like ops subtract the max first. " + replay)
    return (f"{op} is wrong by itself: on its own recorded inputs {where} are off by {size}, "
            "beyond any correct kernel's rounding: a different formula or algorithm (an "
            "approximation such as GELU's tanh form, a scale, an eps, a bug in the device kernel). "
            "Check the implementation against the bench's. " + replay)


def _kind(rc: Finding) -> Kind:
    if rc.cause == Cause.NONFINITE:
        return Kind.NONFINITE
    if rc.cause in (Cause.ONE_SIDED, Cause.UNPAIRED):
        return Kind.UNPAIRED
    if rc.cause == Cause.INPUTS_DIFFER:
        return Kind.INPUTS
    return Kind.OWN


def _new_suspect(rc: Finding, t: CompareTable) -> Suspect:
    stack = t.objects(S.STACK)[rc.row] if 0 <= rc.row < len(t) else None
    frames = at.as_frames(stack) or None
    return Suspect(api=rc.api, direction=rc.direction, kind=_kind(rc), csv_line=rc.row + 2 if rc.row >= 0 else 0,
                   stack=frames, input_error=math.nan, output_error=rc.own_error, growth=math.nan,
                   category="", advice="", family=rc.family, ctx=rc.ctx, order=rc.order,
                   side=rc.side if _kind(rc) == Kind.UNPAIRED else "")


def _uninitialised(family: str) -> bool:
    """``empty*`` calls: never judged by value, so never a suspect by their values."""
    sp = NJ.special_of(family or "")
    return sp is not None and sp.treatment == NJ.Treatment.UNINITIALISED


def _as_root(s: Optional[Suspect], rc: Finding, t: CompareTable) -> Suspect:
    """The suspect for root cause ``rc``: the advisor's suspect for that call (a new one when it
    has none) with the judgement's kind, category and advice."""
    cat = rc.category
    if s is None:
        s = _new_suspect(rc, t)
    keep_category = not (s.kind == Kind.INHERITED or not s.category
                         or rc.cause in (Cause.CHANGED_ARGUMENT, Cause.INPUTS_DIFFER))
    return dataclasses.replace(
        s, kind=_kind(rc), role=Role.ORIGIN, fault=str(cat),
        # the table's view of it (inherited...) does not hold
        category=s.category if keep_category else str(cat),
        side=rc.side if rc.cause == Cause.UNPAIRED else s.side,
        output_error=s.output_error if math.isnan(rc.own_error) else rc.own_error,
        advice=advice_for_cause(rc, cat),
        replay="own" if rc.cause in (Cause.OVER_BUDGET, Cause.NONFINITE) else s.replay)


def _within_budget(s: Suspect, ratio: float) -> Suspect:
    """An own suspect of the table that the replay finds within its own-error budget."""
    amplifies = not math.isnan(s.growth) and s.growth >= MIN_GROWTH
    return dataclasses.replace(
        s, kind=Kind.INHERITED, role=Role.AMPLIFIER if amplifies else Role.NONE, replay="inherited",
        advice=(f"Replayed from the device's own inputs it is within its own-error budget "
                f"(x{ratio:.2g} of budget): the difference is "
                + ("amplified from upstream (an ill-conditioned op or an update such as "
                   "AdamW's first step g/|g|). " if amplifies else "inherited from upstream. ")
                + "Fix the root cause before it."))


def apply_judgement(advice: Advice, judgement: Optional[StepJudgement],
                    table: Union[pd.DataFrame, CompareTable]) -> Advice:
    """Rank ``advice``'s suspects by ``judgement`` (see the module docstring): ``advice`` gets the
    judgement and the new list of suspects (the advisor's own suspects are left as they were:
    the ones the judgement relabels are copies); returns it."""
    advice.judgement = judgement
    if judgement is None:
        return advice
    programs = [rc for rc in judgement.root_causes if rc.cause == Cause.DIFFERENT_PROGRAMS]
    if programs:   # no call is a suspect: the calls do not correspond
        advice.programs = programs[0].detail
        advice.suspects = []
        advice.n_root_causes = 0
        advice.n_inherited = 0
        advice.all_agree = False
        return advice
    old = list(advice.suspects)
    by_api: Dict[str, Suspect] = {s.api: s for s in old}
    t = CompareTable.of(table)
    roots: List[Suspect] = []
    seen = set()
    for rc in judgement.root_causes:
        if rc.api not in seen:
            seen.add(rc.api)
            roots.append(_as_root(by_api.get(rc.api), rc, t))
    verdicts = judgement.replay.by_api() if judgement.replay is not None else {}
    rest = []
    for s in old:
        if s.api in seen or _uninitialised(s.family):
            continue
        v = verdicts.get(s.api)
        if v is not None and v.status == Status.WITHIN and s.kind in (Kind.OWN, Kind.NONFINITE):
            s = _within_budget(s, v.ratio)
        rest.append(s)
    own_rest = [s for s in rest if s.kind != Kind.INHERITED]
    inh_rest = [s for s in rest if s.kind == Kind.INHERITED]
    advice.suspects = roots + own_rest + inh_rest
    advice.n_root_causes = len(judgement.root_causes)
    advice.all_agree = advice.all_agree and judgement.passed
    return advice
