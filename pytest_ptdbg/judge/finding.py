"""What the judgement finds: one :class:`Finding` per root-cause call, with its evidence as fields.

A finding is made by the judge (:func:`.step.judge_step`, from the replay's verdicts, the compare
table and the statistics) and read by the advisor and the plugin, which rank and word it. Its
words (:attr:`Finding.detail`) are built from its fields, never parsed back: the advice reads
the fields (the dtype a lower-precision replay matches, the one-sided call's reason, ...).
No torch, no pandas.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Tuple

from pytest_ptdbg.runtime.text import TextEnum, fmt_error

__all__ = ["Cause", "Evidence", "FaultCategory", "Finding", "replay_text", "LOW_PRECISION"]


class Cause(TextEnum):
    """Why a call is a root cause: the one vocabulary of the judgement."""

    OVER_BUDGET = "own error over budget"
    NONFINITE = "NaN/Inf origin"
    CHANGED_ARGUMENT = "changed argument"
    ONE_SIDED = "value-changing call on one side only"
    UNPAIRED = "call on one side only"
    STATISTICS = "own error by statistics"
    INPUTS_DIFFER = "inputs differ at the start"
    #: the two dumps do not align (too few calls pair, their dataflow disagrees): no call is a cause
    DIFFERENT_PROGRAMS = "different programs"


class Evidence(TextEnum):
    """What a finding rests on."""

    REPLAY = "replay"            # the call replayed from its own recorded inputs (own_error.judge_dump)
    TABLE = "table"              # the compare table (an argument row, a one-sided call, a NaN/Inf tensor)
    STATISTICS = "statistics"    # max/min/mean/norm differences only


class FaultCategory(TextEnum):
    """What kind of fault a root cause is, and so what to try (:attr:`Finding.category`)."""

    REDUCED_PRECISION = "reduced-precision kernel"
    CHANGED_ARGUMENT = "changed argument"
    NONFINITE_ORIGIN = "NaN/Inf origin"
    WRONG_FORMULA = "wrong formula"
    CODE_PATH = "code path differs"
    BY_STATISTICS = "own error by statistics"
    INPUTS_DIFFER = "inputs differ at the start"
    DIFFERENT_PROGRAMS = "different programs"


#: reduced float32 formats of matmuls and convolutions (TF32 on CUDA, HF32 on Ascend)
REDUCED_FP32 = frozenset({"tf32", "hf32"})
#: the compute dtypes (as recorded, and bare) of a reduced-precision kernel, and the reduced formats
LOW_PRECISION = frozenset({"torch.bfloat16", "torch.float16", "bfloat16", "float16"}) | REDUCED_FP32


def reduced_fp32_text(fmt: str) -> str:
    """Why a float32 product matching a TF32/HF32 computation is a fault: the run asked for strict float32."""
    bits = {"tf32": 10, "hf32": 11}.get(fmt, 0)
    return (f"computed in {fmt.upper()} (float32 operands rounded to {bits} mantissa bits) although the run "
            "asked for strict float32")


def replay_text(*, nonfinite: bool, own_error: float, worst: str, budget: float, compute_dtype: str,
                ratio: float, matches_dtype: str) -> str:
    """A replayed call's verdict in words (without its API): the NaN/Inf it makes, or its own
    error against its budget (and the lower precision whose replay it matches)."""
    if nonfinite:
        return f"NaN/Inf in {worst} that a replay of the same inputs does not produce"
    low = (f"; {reduced_fp32_text(matches_dtype)}" if matches_dtype in REDUCED_FP32
           else f"; it matches a {matches_dtype} computation" if matches_dtype else "")
    return (f"own error {fmt_error(own_error)} in {worst}, budget "
            f"{fmt_error(budget)} ({compute_dtype}; x{ratio:.3g} of budget{low})")


def _side_word(side: str) -> str:
    """``"device"`` for ptdbg's ``"NPU"`` side (the device under test, whatever it is), else the side."""
    return "device" if side == "NPU" else side


@dataclass(frozen=True)
class Finding:
    """One root cause of a failing step: the call, what it is (:attr:`cause`), and the evidence."""

    api: str                 # API key with direction (``Functional_softmax_1_forward``)
    direction: str
    cause: Cause
    evidence: Evidence
    order: int = 0
    row: int = -1            # first table row of the call (-1: none)
    family: str = ""
    ratio: float = math.nan  # own error / budget (replay), growth over the bound (statistics)
    own_error: float = math.nan   # the call's own error (replay), its outputs' statistics error
    budget: float = math.nan      # its budget (replay), the statistics bound
    side: str = "NPU"        # "NPU" or "bench" (one-sided calls)
    ctx: str = ""
    #: replay: the output judged by, the compute dtype, and the lower precision whose replay
    #: reproduces the device's result ("" when none: not a reduced-precision kernel)
    worst: str = ""
    compute_dtype: str = ""
    matches_dtype: str = ""
    #: changed arguments: each in the words of who compared it (``"eps: 1e-05 vs 0.001"``)
    changes: Tuple[str, ...] = ()
    #: a one-sided value-changing call: why the compare calls it that; different programs: the
    #: pairing's line (``comparison.pairing.Pairing.programs_text``)
    why: str = ""
    #: the tensor it shows in (inputs differ: the input's index; a NaN/Inf tensor: its name)
    tensor: str = ""
    #: statistics: the inputs' error; inputs differ: the input's difference
    input_error: float = math.nan
    #: judged from statistics because the replay could not judge the call
    replay_missed: bool = False

    @property
    def detail(self) -> str:
        """The evidence in words, built from the fields."""
        c, ev = self.cause, self.evidence
        if c == Cause.CHANGED_ARGUMENT:
            text = "; ".join(self.changes) or "a non-tensor argument differs"
        elif c == Cause.ONE_SIDED:
            text = f"only on the {_side_word(self.side)} side: {self.why}"
        elif c == Cause.UNPAIRED:
            text = f"only on the {_side_word(self.side)} side"
        elif c == Cause.DIFFERENT_PROGRAMS:
            text = self.why
        elif c == Cause.INPUTS_DIFFER:
            text = (f"{self.inputs_text} before any recorded call differed: the data, the initial "
                    "weights or the random state differ between the runs")
        elif ev == Evidence.REPLAY:
            text = replay_text(nonfinite=c == Cause.NONFINITE, own_error=self.own_error, worst=self.worst,
                               budget=self.budget, compute_dtype=self.compute_dtype, ratio=self.ratio,
                               matches_dtype=self.matches_dtype)
        elif c == Cause.NONFINITE and ev == Evidence.TABLE:
            text = (f"{self.tensor} has NaN/Inf the bench's does not, and no recorded call before it "
                    "produced one (it came in with the step's inputs, weights or an unrecorded call)")
        elif c == Cause.NONFINITE:
            text = "NaN/Inf appears here (statistics)"
        else:
            text = (f"statistics off by {fmt_error(self.own_error)} of their scale with inputs off by "
                    f"{fmt_error(self.input_error)} (bound {fmt_error(self.budget)})")
        if self.replay_missed:
            text += " (judged from statistics: the replay could not judge this call)"
        return text

    @property
    def inputs_text(self) -> str:
        """Inputs differ at the start: which input, by how much."""
        return f"its input {self.tensor} differs from the bench's by {fmt_error(self.input_error)}"

    @property
    def category(self) -> FaultCategory:
        """The kind of fault (from the cause and, for an own error, whether its compute dtype is a
        lower precision or a lower-precision replay reproduces the device's result)."""
        c = self.cause
        if c == Cause.CHANGED_ARGUMENT:
            return FaultCategory.CHANGED_ARGUMENT
        if c == Cause.NONFINITE:
            return FaultCategory.NONFINITE_ORIGIN
        if c in (Cause.ONE_SIDED, Cause.UNPAIRED):
            return FaultCategory.CODE_PATH
        if c == Cause.STATISTICS:
            return FaultCategory.BY_STATISTICS
        if c == Cause.INPUTS_DIFFER:
            return FaultCategory.INPUTS_DIFFER
        if c == Cause.DIFFERENT_PROGRAMS:
            return FaultCategory.DIFFERENT_PROGRAMS
        if self.matches_dtype in LOW_PRECISION or self.compute_dtype in LOW_PRECISION:
            return FaultCategory.REDUCED_PRECISION
        return FaultCategory.WRONG_FORMULA

    def to_dict(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {"api": self.api, "direction": self.direction, "detail": self.detail,
                             "order": self.order, "row": self.row, "family": self.family,
                             "side": self.side, "ctx": self.ctx, "cause": self.cause.value}
        for k in ("ratio", "own_error", "budget"):
            v = getattr(self, k)
            d[k] = None if v is None or not math.isfinite(v) else float(v)
        return d
