"""The replay judgement's verdicts: one :class:`CallVerdict` per call, a :class:`DumpJudgement`
per dump (made by :func:`pytest_ptdbg.judge.own_error.judge_dump`). No torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List

from pytest_ptdbg.runtime.text import TextEnum
from pytest_ptdbg.judge import budget as B
from pytest_ptdbg.judge.finding import replay_text

__all__ = ["Status", "CallVerdict", "DumpJudgement"]


class Status(TextEnum):
    """What the judge concluded about one call."""

    WITHIN = "within budget"        # replayed; its own error is within the budget
    ROOT_CAUSE = "root cause"       # over budget, or NaN/Inf of its own
    NOT_JUDGED = "not judged"       # not replayed or not comparable (reason given)


@dataclass
class CallVerdict:
    """The judgement of one call (one API key with its direction)."""

    api: str                         # e.g. ``Functional_linear_0_forward``
    direction: str
    order: int
    family: str
    status: Status
    reason: str = ""
    ratio: float = math.nan          # worst own error / budget over its outputs
    own_error: float = math.nan      # relative own error of that output
    budget: float = math.nan         # the budget, relative to the oracle's norm
    worst: str = ""                  # the output it was judged by
    nonfinite: bool = False          # a NaN/Inf the replays do not produce
    compute_dtype: str = ""
    bench_arguments: bool = False    # replayed with the bench's recorded arguments
    changed_args: List[str] = field(default_factory=list)
    #: the dtype arguments among ``changed_args`` that lower the call's precision (:func:`lowered_precision`)
    lowered_precision: List[str] = field(default_factory=list)
    ctx: str = ""
    #: every floating output equals one of its inputs value for value (a cast that loses nothing,
    #: a copy, a view): what a call on one side only does when it is bookkeeping
    passes_through: bool = False
    #: a root cause whose result a replay in this lower precision reproduces (a reduced-precision kernel)
    matches_dtype: str = ""
    #: not judged, and not for a reason its statistics may stand in for: its record is malformed,
    #: its replay failed (out of memory, an unexpected error) or it asks for more memory than its
    #: record made (a memory bomb); the step fails naming it
    unusable: bool = False

    @property
    def key(self) -> str:
        return self.api

    def to_dict(self) -> Dict[str, Any]:
        d = {k: getattr(self, k) for k in ("api", "direction", "order", "family", "reason", "worst",
                                           "nonfinite", "compute_dtype", "bench_arguments",
                                           "changed_args", "ctx", "passes_through", "matches_dtype",
                                           "unusable")}
        d["status"] = self.status.value
        for k in ("ratio", "own_error", "budget"):
            v = getattr(self, k)
            d[k] = None if v is None or not math.isfinite(v) else float(v)
        return d

    def text(self) -> str:
        if self.status == Status.NOT_JUDGED:
            return f"{self.api}: {'could not be judged' if self.unusable else 'not judged'} ({self.reason})"
        return f"{self.api}: " + replay_text(
            nonfinite=self.nonfinite, own_error=self.own_error, worst=self.worst, budget=self.budget,
            compute_dtype=self.compute_dtype, ratio=self.ratio, matches_dtype=self.matches_dtype)


@dataclass
class DumpJudgement:
    """Every call of one dump, judged by replay (see the module docstring)."""

    source: str
    device: str
    verdicts: List[CallVerdict] = field(default_factory=list)
    seconds: float = 0.0
    factor: float = B.FACTOR

    @property
    def root_causes(self) -> List[CallVerdict]:
        """Calls over their budget or with NaN/Inf of their own, in execution order."""
        return [v for v in self.verdicts if v.status == Status.ROOT_CAUSE]

    @property
    def not_judged(self) -> List[CallVerdict]:
        return [v for v in self.verdicts if v.status == Status.NOT_JUDGED]

    @property
    def judged(self) -> List[CallVerdict]:
        return [v for v in self.verdicts if v.status != Status.NOT_JUDGED]

    @property
    def unusable(self) -> List[CallVerdict]:
        """Calls that could not be judged for a reason statistics cannot stand in for (a malformed
        record, a replay out of memory or failing unexpectedly): they fail the judgement."""
        return [v for v in self.verdicts if v.unusable]

    @property
    def passed(self) -> bool:
        return not self.root_causes and not self.unusable

    def by_api(self) -> Dict[str, CallVerdict]:
        return {v.api: v for v in self.verdicts}

    def largest_ratio(self, within_only: bool = True) -> float:
        """The largest own-error/budget ratio among the calls within budget (or all judged)."""
        vs = [v.ratio for v in (self.verdicts if not within_only else
                                [x for x in self.verdicts if x.status == Status.WITHIN])
              if v.ratio == v.ratio]
        return max(vs) if vs else 0.0

    def summary(self) -> str:
        n, nj = len(self.verdicts), len(self.not_judged)
        return (f"judged {n - nj} of {n} calls by replay on {self.device} in {self.seconds:.1f} s: "
                f"{len(self.root_causes)} over budget; {nj} not judged")

    def text(self, limit: int = 20) -> str:
        lines = [f"Judgement by replay ({self.summary()}; budget: {self.factor:g} x a "
                 "reference kernel's error in the call's compute dtype against a float64 oracle):"]
        for v in self.root_causes[:limit]:
            lines.append(f"  ROOT CAUSE {v.text()}")
        for v in self.unusable[:limit]:
            lines.append(f"  UNUSABLE {v.text()}")
        nj = self.not_judged
        if nj:
            reasons: Dict[str, int] = {}
            for v in nj:
                reasons[v.reason] = reasons.get(v.reason, 0) + 1
            lines.append(f"  not judged ({len(nj)}): " + "; ".join(
                f"{r} x{k}" for r, k in sorted(reasons.items(), key=lambda x: -x[1])[:8]))
            lines.append("    " + ", ".join(v.api for v in nj[:limit]) + (" ..." if len(nj) > limit else ""))
        return "\n".join(lines) + "\n"

    def to_dict(self) -> Dict[str, Any]:
        return {"source": self.source, "device": self.device, "seconds": self.seconds,
                "factor": self.factor, "root_causes": [v.api for v in self.root_causes],
                "not_judged": [[v.api, v.reason] for v in self.not_judged],
                "unusable": [[v.api, v.reason] for v in self.unusable],
                "verdicts": [v.to_dict() for v in self.verdicts]}
