"""The advisor: from the compare table to the API that is the root cause, ranked, with advice.

ptdbg named the first failing row. That is often downstream of the real culprit, or an input
row. Here every API is judged on its own: its *input error* (the largest error among the
tensors it received) against its *output error* (the largest among the tensors it produced).

* forward: inputs = forward inputs, outputs = forward outputs;
* backward: inputs = the incoming gradient (``_io == "input"``) *and* the forward tensors of
  the same call (a backward formula reads them: ``grad_W = grad_out^T x``), outputs = the
  gradients it produces (``_io == "output"``).

The error of one tensor is ``max(1 - cosine, relative L2 error)`` (whichever the table has);
``growth = output_error / max(input_error, NOISE_FLOOR)``. An API is

* ``nonfinite``  - an output's NaN/Inf positions differ from the bench while no input's do;
* ``own``        - an output fails the verdict (``_passed`` False) and ``growth >= min_growth``;
* ``inherited``  - an output fails but its error is about what it received;
* ``unpaired``   - the call exists on one side only.

An own suspect's ``role``: ``origin`` (it creates the error), ``amplifier`` (its input error is
explained by an earlier suspect's output error, and it grows it), or ``latent``: a call that
passes its own verdict (e.g. within float16's tolerance) but whose error, of the same size,
is what a later call fails with while inheriting it - found by tracing an unexplained inherited
failure back to the earlier call with the largest growth and an output error of that size.

Ranking: nonfinite (earliest first); origins and latent origins (largest growth first);
"sensitive" origins (a discontinuous op - relu's gradient, max_pool, comparisons - where only a
few elements flip on tiny input differences); amplifiers; unpaired calls that come before the
first inherited error; inherited calls (earliest first); the other unpaired calls.

Thresholds are module constants below; they assume float32 noise levels (NOISE_FLOOR,
SIGNIFICANT) and are relative otherwise.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Union

import numpy as np
import pandas as pd

from pytest_ptdbg.advise import advice_text as at
from pytest_ptdbg.comparison import schema as S
from pytest_ptdbg.comparison.schema import CompareTable
from pytest_ptdbg.comparison.stat_error import range_scaled
from pytest_ptdbg.runtime.text import TextEnum, fmt_error, fmt_growth
from pytest_ptdbg.judge.passing import passes

#: Errors below this count as agreement when computing growth (about float32 resolution).
NOISE_FLOOR = 1e-7
#: An output error at least this many times the input error is the API's own error.
MIN_GROWTH = 10.0
#: A failure is explained by an earlier origin whose output error is >= this times its input error.
EXPLAIN_RATIO = 0.01
#: A latent origin's output error is within this factor (either way) of the input error of the
#: failure it explains.
LATENT_RATIO = 0.1
#: Input errors above this are not float32 noise: an own failure receiving them is traced back.
SIGNIFICANT = 1e-4
#: The same for a summary compare, whose statistics show only part of an input's error.
SIGNIFICANT_SUMMARY = 1e-5
#: A discontinuous op whose failing output has fewer elements than this share off by > 0.1%
#: only flipped branches (role "sensitive").
FLIP_FRACTION = 0.05

PASS_FRACTION_NOTE = (
    f'Note: "{S.ONE_THOUSANDTH}" and "{S.FIVE_THOUSANDTHS}" in the CSV are pass '
    "fractions: the share of elements whose relative error is below 0.001 / 0.005 "
    "(1.0 = every element within the bound)."
)


class Kind(TextEnum):
    """What a suspect is."""

    OWN = "own"                # it creates the error (own error over budget, or by the table)
    NONFINITE = "nonfinite"    # NaN/Inf first appears here
    UNPAIRED = "unpaired"      # the call exists on one side only
    INHERITED = "inherited"    # it only passes on error it received
    INPUTS = "inputs"          # its inputs differ at the start: data, weights or random state


class Role(TextEnum):
    """How a suspect relates to the others."""

    NONE = ""
    ORIGIN = "origin"          # creates the error
    AMPLIFIER = "amplifier"    # grows error it received (ill-conditioned, Adam's first step)
    LATENT = "latent"          # passes its own verdict but creates the error that fails later
    SENSITIVE = "sensitive"    # a discontinuous op where a few elements flip on tiny input differences
    NEGLIGIBLE = "negligible"  # inherited: fails a strict rule at noise level


def _unknown(x: Optional[float]) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


@dataclass
class Suspect:
    """One API the advisor points at (or, for ``kind == "inherited"``, explains away)."""

    api: str
    direction: str
    kind: str  # a Kind value
    csv_line: int
    stack: Optional[list]
    input_error: float
    output_error: float
    growth: float
    category: str
    advice: str
    family: str
    ctx: str = ""
    order: int = 0
    side: str = ""  # unpaired: "NPU" or "bench"
    #: own: "origin" (creates the error), "amplifier" (grows error it received), "latent"
    #: (passes its own verdict, but creates the error that fails later), "sensitive" (a
    #: discontinuous op where a few elements flip on tiny input differences); inherited:
    #: "negligible" (fails the rule with an error at noise level)
    role: str = ""  # a Role value
    #: the replay check's verdict ("own", "inherited", "unknown"; "" when not re-run)
    replay: str = ""
    #: a latent origin: the later call whose failure it explains
    explains: str = ""
    #: the fault category of a root cause (``judge.finding.FaultCategory``), "" otherwise
    fault: str = ""

    def __post_init__(self) -> None:
        # validated by the enums, kept as their plain ``str`` values: suspects travel through
        # JSON and xdist's execnet, which accept no str subclass (``s.kind == Kind.OWN`` holds)
        self.kind = Kind(self.kind).value
        self.role = Role(self.role).value

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "kind":
            value = Kind(value).value
        elif name == "role":
            value = Role(value).value
        elif name == "fault" and value:
            value = str(value)
        super().__setattr__(name, value)

    @property
    def growth_text(self) -> str:
        """``x1.2e4``, ``new NaN/Inf``, ``carries NaN/Inf``."""
        carried = math.isinf(self.input_error) and math.isinf(self.output_error)
        return fmt_growth(self.growth, carried)

    def error_text(self, arrow: str = "->") -> str:
        """``error 1e-07 in -> 2e-03 out (x2e4)`` with only what is known ("" when nothing is)."""
        known = [not _unknown(self.input_error), not _unknown(self.output_error)]
        if self.kind == "unpaired" or not any(known):
            return ""
        if not known[0]:
            return f"error {fmt_error(self.output_error)} out"
        if not known[1]:
            return f"error {fmt_error(self.input_error)} in"
        g = "" if _unknown(self.growth) else f" ({self.growth_text})"
        return (f"error {fmt_error(self.input_error)} in {arrow} {fmt_error(self.output_error)} out"
                + g)

    @property
    def location(self) -> str:
        """Where the call is in the user's code: the first stack frame outside torch."""
        return at.format_frame(at.user_frame(self.stack))

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["kind"], d["role"] = str(self.kind), str(self.role)
        for k in ("input_error", "output_error", "growth"):
            v = d[k]
            d[k] = None if v is None or not math.isfinite(v) else float(v)
        d["location"] = self.location
        return d


@dataclass
class Advice:
    """The advisor's findings: ranked suspects (root causes first), and whether all agree.

    ``all_agree``: at least one tensor pair was compared, none fails the verdict and no NaN/Inf
    differs. Calls present on one side only do not change it (they are listed as suspects of
    kind ``"unpaired"``).
    """

    suspects: List[Suspect] = field(default_factory=list)
    all_agree: bool = True
    n_rows: int = 0
    n_compared: int = 0
    n_failed: int = 0
    n_inherited: int = 0
    n_unpaired: int = 0
    #: root-cause calls found (nonfinite, own, unpaired) before ``top`` cut the list
    n_root_causes: int = 0
    #: the default judgement of the step (``judge.step.StepJudgement``), when compare made one
    judgement: Optional[Any] = None
    #: the verdict of the rule that gated the compare (compare() and the plugin set it); None:
    #: the judgement's, else the table's (see :func:`decide`)
    passed: Optional[bool] = None
    #: the two dumps are different programs: the line that says so ("" otherwise); no suspect then
    programs: str = ""

    @property
    def decision(self) -> "Decision":
        """The verdict and the first suspect, as every output says them (:func:`decide`)."""
        return decide(self)

    @property
    def first(self) -> Optional[Suspect]:
        """The first suspect: None when the comparison passed (:func:`decide`)."""
        return self.decision.first

    @property
    def root_causes(self) -> List[Suspect]:
        """The suspects that are root causes: none when the comparison passed."""
        return self.decision.root_causes

    def text(self) -> str:
        """The advisor file: ptdbg's three lines for the first suspect, then the ranked list.

        The verdict and the first suspect are :func:`decide`'s, as in every other output: a
        passing comparison names no suspect; the differences it explains are listed as such."""
        d = self.decision
        first = d.first
        lines: List[str] = []
        if first is None and self.n_compared == 0:
            lines += ["Line: None", "Suspect Nodes: None",
                      "Expert Advice: Nothing was compared: no tensor of the device dump has a "
                      "partner in the bench dump. Check the paths, the dump mode and the step."]
        elif first is None and d.passed:
            lines += ["Line: None", "Suspect Nodes: None", "Expert Advice: " + self.passed_text()]
        elif first is None and self.programs:
            lines += ["Line: None", "Suspect Nodes: None",
                      f"Expert Advice: The comparison fails: {self.programs}."]
        elif first is None:
            lines += ["Line: None", "Suspect Nodes: None",
                      "Expert Advice: The comparison fails, but no call is a suspect: the data "
                      "could not be used (see the unusable data below and the CSV's Err_message)."]
        else:
            lines += [f"Line: {first.csv_line}", f"Suspect Nodes: {first.api}",
                      f"Expert Advice: {first.advice}"]
        lines.append("")
        inh = [x for x in self.suspects if x.kind == Kind.INHERITED]
        n_inh = max(self.n_inherited, len(inh))
        n_sus = 0 if d.passed else max(self.n_root_causes, len(d.root_causes))
        lines.append(f"Summary: {self.n_compared} of {self.n_rows} tensor rows compared, "
                     f"{self.n_failed} fail the per-tensor rule; "
                     f"{n_sus} suspect call(s), "
                     f"{n_inh} call(s) with inherited error, "
                     f"{self.n_unpaired} unpaired call(s).")
        if d.passed and not self.suspects:
            lines.append("Everything agrees: no suspect.")
        if d.passed and self.suspects:
            lines += ["", "Differences the verdict explains (not root causes; the comparison "
                      "passed):"]
            lines += [f"  - {_explained_line(x)}" for x in self.suspects]
        roots = d.root_causes
        if roots:
            lines += ["", "Ranked suspects (most likely root cause first):"]
            for i, x in enumerate(roots, 1):
                lines += _suspect_lines(i, x)
        if inh and not d.passed:
            lines += ["", "Inherited errors (these calls only pass on error they received; "
                      "not root causes):"]
            for x in inh:
                lines.append(f"  - {_explained_line(x)}")
            more = self.n_inherited - len(inh)
            if more > 0:
                lines.append(f"  ... and {more} more")
        if self.judgement is not None:
            lines += ["", self.judgement.text().rstrip("\n")]
        lines += ["", PASS_FRACTION_NOTE]
        return "\n".join(lines) + "\n"

    def passed_text(self) -> str:
        """Expert Advice of a passing comparison: what passed, and what the differences are."""
        if not self.suspects and self.n_failed == 0:
            return ("All data in the comparison meets the accuracy requirement: every compared "
                    "tensor agrees with the bench, no API lost precision.")
        j = self.judgement
        if j is not None and getattr(j, "replay", None) is not None:
            why = ("The comparison passes the judgement: replayed from its own recorded inputs, "
                   "every call's own error is within its budget, and every datum is usable.")
        elif j is not None:
            why = ("The comparison passes the judgement (from statistics): no call's statistics "
                   "differ by more than its inputs' and its dtype's rounding explain, and every "
                   "datum is usable.")
        else:
            why = "The comparison passes its rule."
        if self.n_failed:
            why += (f" {self.n_failed} tensor row(s) fail the per-tensor rule of the CSV: the calls "
                    "behind them pass on differences they received, or round a tensor that is "
                    "zero in exact arithmetic (such as the bias gradient of a conv before a "
                    "BatchNorm); none is a root cause.")
        return why + " Nothing to fix."

    def to_dict(self) -> Dict[str, Any]:
        """JSON-able summary (non-finite numbers become None); ``passed`` and ``first`` are
        :func:`decide`'s."""
        d = self.decision
        return {
            "passed": d.passed,
            "all_agree": self.all_agree,
            "n_rows": self.n_rows, "n_compared": self.n_compared, "n_failed": self.n_failed,
            "n_inherited": self.n_inherited, "n_unpaired": self.n_unpaired,
            "n_root_causes": 0 if d.passed else self.n_root_causes,
            "first": d.first.api if d.first else None,
            "programs": self.programs,
            "suspects": [s.to_dict() for s in self.suspects],
            "judgement": self.judgement.to_dict() if self.judgement is not None else None,
        }


@dataclass(frozen=True)
class Decision:
    """The verdict of one comparison and its first suspect, as every output says them."""

    passed: bool
    #: the first suspect: None when the comparison passed
    first: Optional[Suspect]
    #: the root causes (every suspect but the inherited ones); none when it passed
    root_causes: List[Suspect]


def decide(advice: Advice, passed: Optional[bool] = None) -> Decision:
    """Whether the comparison passed, and what its first suspect is: the one place that decides.

    ``passed``: the verdict of the gate (else ``advice.passed``, set by ``compare()`` and the
    plugin; else the judgement's; else the table's: every compared tensor agrees and no call is
    on one side only). A comparison that passed has no suspect and no root cause: the advisor's
    suspects are then differences the verdict explains. One that failed names its top suspect.
    """
    if passed is None:
        passed = advice.passed
    if passed is None:
        j = advice.judgement
        passed = bool(j.passed) if j is not None else passes(checks=(advice.all_agree, not advice.n_unpaired))
    if passed:
        return Decision(True, None, [])
    roots = [s for s in advice.suspects if s.kind != Kind.INHERITED]
    return Decision(False, advice.suspects[0] if advice.suspects else None, roots)


def side_word(side: str) -> str:
    """A dump side for people: ``"device"`` (ptdbg's ``"NPU"``) or ``"bench"``."""
    return at.side_word(side)


def kind_text(s: Suspect) -> str:
    """What a suspect is, in words (``own error``, ``only on the device side``, ...)."""
    return {"own": "own error", "nonfinite": "NaN/Inf appears here",
            "inputs": "inputs differ at the start",
            "unpaired": f"only on the {at.side_word(s.side) or 'one'} side",
            "inherited": "inherited"}.get(s.kind, str(s.kind))


def _explained_line(s: Suspect) -> str:
    """One line for a call the verdict explains (inherited, within budget, bookkeeping)."""
    tag = {"negligible": " [negligible: fails a strict rule at noise level]",
           "amplifier": " [amplifies a difference it received]"}.get(s.role, "")
    if s.role == "amplifier" and not (s.input_error > NOISE_FLOOR):  # it received none
        tag = ""
    what = kind_text(s) if s.kind != "inherited" else ""
    if s.replay == "inherited":
        what = (what + ", " if what else "") + "within its own-error budget on replay"
    head = f"{s.api}{tag}" + (f" (CSV line {s.csv_line})" if s.csv_line else "")
    bits = [b for b in (what, s.error_text()) if b]
    return head + (": " + ", ".join(bits) if bits else "") + f"  at {s.location}"


def _suspect_lines(i: int, s: Suspect) -> List[str]:
    kind = kind_text(s)
    if s.replay in ("own", "inherited"):
        kind += {"own": ", confirmed by replay", "inherited": ", accurate on replay"}[s.replay]
    kind += {"amplifier": ", amplifies an earlier error",
             "sensitive": ", a few elements flip on tiny input differences",
             "latent": ", passes its own verdict but causes a later failure",
             "negligible": ", negligible difference"}.get(s.role, "")
    cat = f"; {s.category}" if s.category and s.category != kind else ""
    out = [f"{i}. {s.api}  [{kind}; {s.direction}{cat}]" + (f"  CSV line {s.csv_line}" if s.csv_line else "")]
    err = s.error_text()
    if err or s.ctx:
        out.append(f"   {err}".rstrip() + ("  [in optimizer step]" if s.ctx else ""))
    out.append(f"   at {s.location}")
    out.append(f"   advice: {s.advice}")
    return out


# ------------------------------------------------------------------------------ row errors

def row_errors(table: Union[pd.DataFrame, CompareTable]) -> np.ndarray:
    """Per-row error ``max(1 - cosine, _rel_l2)``; inf where NaN/Inf positions differ.

    Summary compare (statistics only) adds the largest of |max diff|, |min diff|, |mean diff|
    divided by the bench's range ``max(|max|, |min|)`` (:mod:`~pytest_ptdbg.comparison.stat_error`):
    a local change moves the extremes more than the L2 norm.
    An infinite ``_rel_l2`` (bench all zero, NPU not) counts as 1.0.
    Unpaired rows get NaN. A compared row with neither measure (shape mismatch, empty) gets 1.0
    when it fails the verdict and 0.0 when it passes.
    """
    t = CompareTable.of(table)
    e_cos = np.clip(1.0 - t.floats(S.COSINE), 0.0, None)   # NaN in a summary compare
    rel = t[S.REL_L2]
    rel = np.where(np.isinf(rel), 1.0, np.abs(rel))  # inf: the bench is all zero, the NPU not
    with np.errstate(invalid="ignore", divide="ignore"):
        err = np.fmax(e_cos, rel)
        if t.summary:  # summary compare: also the statistics, against the range
            by_range = range_scaled(t.summary_difference(), t.value_range("bench"))
            err = np.fmax(err, np.where(np.isfinite(by_range), by_range, np.nan))
    passed, paired, nanm = t[S.PASSED], t[S.PAIRED], t[S.NAN_MISMATCH]
    missing = np.isnan(err)
    err = np.where(missing & ~passed, 1.0, np.where(missing, 0.0, err))
    err = np.where(nanm, np.inf, err)
    return np.where(paired, err, np.nan)


def _counterpart(api: str) -> Optional[str]:
    for bw, fw in (("_backward", "_forward"), (".backward", ".forward")):
        if api.endswith(bw):
            return api[: -len(bw)] + fw
    return None


# ------------------------------------------------------------------------------- advising

@dataclass
class _ApiView:
    key: str
    api: str
    family: str
    direction: str
    order: int
    ctx: str
    stack: Any
    first_row: int
    paired: bool
    side: str
    in_err: float = 0.0
    out_err: float = 0.0
    in_nan: bool = False
    out_nan: bool = False
    out_fail: bool = False
    fail_err: float = 0.0  # the largest error among failing output rows
    fail_row: int = -1
    nan_row: int = -1
    err_row: int = -1  # the output row with the largest error
    npu_dtypes: tuple = ()
    bench_dtypes: tuple = ()


def _api_views(t: CompareTable, err: np.ndarray) -> List[_ApiView]:
    n = len(t)
    apis, npu_names, paired, passed = t[S.API], t[S.NPU_NAME], t[S.PAIRED], t[S.PASSED]
    nanm, io, fam, direction = t[S.NAN_MISMATCH], t[S.IO], t[S.FAMILY], t[S.DIRECTION]
    order, ctx, stack = t[S.ORDER], t[S.CTX], t[S.STACK]
    ndt, bdt, arg = t[S.NPU_DTYPE], t[S.BENCH_DTYPE], t[S.ARG]

    views: Dict[str, _ApiView] = {}
    for i in range(n):
        # an argument row belongs to its paired call (F.softmax's _stacklevel, given on the bench
        # side only against torch.softmax, is no call of the bench's own)
        npu_side = paired[i] or bool(arg[i]) or (npu_names[i] not in ("", "nan", "None", "N/A"))
        key = apis[i] if npu_side else apis[i] + "\x00bench"
        v = views.get(key)
        if v is None:
            st = stack[i]
            v = views[key] = _ApiView(
                key=key, api=apis[i], family=fam[i], direction=direction[i], order=int(order[i]),
                ctx=ctx[i],
                stack=st if isinstance(st, (list, tuple)) else None, first_row=i, paired=False,
                side="NPU" if npu_side else "bench")
        if v.stack is None and isinstance(stack[i], (list, tuple)):
            v.stack = stack[i]
        if ndt[i] and ndt[i] not in v.npu_dtypes:
            v.npu_dtypes += (ndt[i],)
        if bdt[i] and bdt[i] not in v.bench_dtypes:
            v.bench_dtypes += (bdt[i],)
        if not paired[i]:
            continue
        v.paired = True
        e = err[i]
        if io[i] == S.OUTPUT:
            if v.err_row < 0 or e > v.out_err:
                v.err_row = i
            v.out_err = max(v.out_err, e)
            if nanm[i]:
                v.out_nan = True
                if v.nan_row < 0:
                    v.nan_row = i
            if not passed[i] or nanm[i]:
                v.fail_err = max(v.fail_err, e)
                v.out_fail = True
                if v.fail_row < 0:
                    v.fail_row = i
        else:
            v.in_err = max(v.in_err, e)
            v.in_nan = v.in_nan or bool(nanm[i])
    # backward formulas read the forward tensors of the same call
    for v in views.values():
        if v.direction == S.BACKWARD:
            fw = views.get(_counterpart(v.api) or "")
            if fw is not None and fw.paired:
                v.in_err = max(v.in_err, fw.in_err, fw.out_err)
                v.in_nan = v.in_nan or fw.in_nan or fw.out_nan
    return sorted(views.values(), key=lambda v: (v.order, v.first_row))


def _flip_fraction(t: CompareTable, row: int) -> float:
    """Share of the row's elements off by more than 0.1% (1 - pass fraction); NaN when unknown
    (a summary compare has no pass fractions)."""
    if row < 0:
        return math.nan
    v = float(t.floats(S.ONE_THOUSANDTH)[row])
    return 1.0 - v if v == v else math.nan


def _growth(out_err: float, in_err: float) -> float:
    if math.isinf(out_err):
        return 1.0 if math.isinf(in_err) else math.inf
    return out_err / max(in_err, NOISE_FLOOR)


def advise(table: Union[pd.DataFrame, CompareTable], top: int = 5, min_growth: float = MIN_GROWTH) -> Advice:
    """Find the APIs that are the root cause of the differences in a compare table.

    ``top`` caps the ranked root-cause suspects and, separately, the inherited ones listed.
    ``min_growth``: how many times its input error an output error must be to count as the
    API's own. ``table``: a compare table (a DataFrame is validated:
    :class:`~pytest_ptdbg.comparison.schema.TableSchemaError`, a ValueError, names the missing
    columns).
    """
    t = CompareTable.of(table)
    err = row_errors(t)
    views = _api_views(t, err)
    passed, paired = t[S.PASSED], t[S.PAIRED]

    nonfinite: List[_ApiView] = []
    own: List[_ApiView] = []
    inherited: List[_ApiView] = []
    unpaired: List[_ApiView] = []
    latent_pool: List[_ApiView] = []
    for v in views:
        if v.out_fail:
            # judge a failing call by its failing outputs: a passing output with a large relative
            # error is usually a near-zero tensor (e.g. the bias gradient of a conv before a norm)
            v.out_err = v.fail_err
        if not v.paired:
            unpaired.append(v)
        elif v.out_nan and not v.in_nan:
            nonfinite.append(v)
        elif v.out_fail:
            g = _growth(v.out_err, v.in_err)
            (own if g >= min_growth and not v.in_nan else inherited).append(v)
        elif not v.out_nan and _growth(v.out_err, v.in_err) >= min_growth:
            latent_pool.append(v)

    # failures whose error is below what counts as significant: the rule is stricter than the
    # noise (or, in a summary compare, a statistic near zero has a large relative difference)
    significant = SIGNIFICANT_SUMMARY if t.summary else SIGNIFICANT
    negligible = [v for v in inherited if not v.in_nan and v.out_err < significant]
    neg_ids = {id(v) for v in negligible}
    inherited = [v for v in inherited if id(v) not in neg_ids]

    # Who explains whom: a failure whose input error is comparable to an earlier origin's output
    # error received it from there (an "amplifier" when it then grows it >= min_growth times).
    # A failure nothing explains is traced back to the call that created an error of that size
    # while passing its own (e.g. float16) tolerance: a "latent" origin.
    sources: List[_ApiView] = list(nonfinite)
    roles: Dict[int, Role] = {}
    explains: Dict[int, str] = {}
    latent: List[_ApiView] = []

    def explained(f: _ApiView) -> bool:
        return any(s.order < f.order and s.out_err >= EXPLAIN_RATIO * f.in_err for s in sources)

    own_ids = {id(o) for o in own}
    for f in sorted(own + inherited, key=lambda v: (v.order, v.first_row)):
        is_own = id(f) in own_ids
        if is_own and f.in_err < significant:
            roles[id(f)] = Role.ORIGIN  # its inputs agree with the bench up to float noise
        elif explained(f):
            roles[id(f)] = Role.AMPLIFIER if is_own else Role.NONE
        else:
            cands = [y for y in latent_pool if y.order < f.order
                     and LATENT_RATIO * f.in_err <= y.out_err <= f.in_err / LATENT_RATIO
                     and not any(y is z for z in latent)]
            if cands:
                y = max(cands, key=lambda y: (_growth(y.out_err, y.in_err), -y.order))
                latent.append(y)
                roles[id(y)] = Role.LATENT
                explains[id(y)] = f.api
                sources.append(y)
            roles[id(f)] = (Role.AMPLIFIER if cands else Role.ORIGIN) if is_own else Role.NONE
        if is_own:
            sources.append(f)

    def by_growth(vs: List[_ApiView]) -> List[_ApiView]:
        return sorted(vs, key=lambda v: (-_growth(v.out_err, v.in_err), v.order))

    # an origin that only flips a few elements of a discontinuous op (relu's gradient, max_pool,
    # comparisons) on tiny input differences is sensitivity, ranked after the real origins
    for v in own:
        if (roles.get(id(v)) == Role.ORIGIN and v.in_err > 0
                and at.categorize(v.family, "own", v.ctx) == at.DISCONTINUOUS
                and _flip_fraction(t, v.fail_row) < FLIP_FRACTION):
            roles[id(v)] = Role.SENSITIVE
    origins = by_growth([v for v in own if roles.get(id(v)) == Role.ORIGIN] + latent
                        ) + by_growth([v for v in own if roles.get(id(v)) == Role.SENSITIVE])
    amplifiers = by_growth([v for v in own if roles.get(id(v)) == Role.AMPLIFIER])
    first_inh = inherited[0].order if inherited else math.inf
    early_unp = [v for v in unpaired if v.order <= first_inh]
    late_unp = [v for v in unpaired if v.order > first_inh]
    ranked = (nonfinite + origins + amplifiers + early_unp)[:top]
    causes = nonfinite + origins + amplifiers + early_unp

    kinds = {id(v): Kind.NONFINITE for v in nonfinite}
    kinds.update({id(v): Kind.OWN for v in own + latent})
    suspects = [_suspect(t, v, kinds.get(id(v), Kind.UNPAIRED), role=roles.get(id(v), Role.NONE),
                         explains=explains.get(id(v), "")) for v in ranked]
    n_start = 0
    for j, v in enumerate(inherited[:top]):
        before = [c for c in causes if c.order < v.order]
        up = max(before, key=lambda c: c.order).api if before else ""
        # the earliest inherited error with no recorded cause before it: the inputs differ at the
        # start (the data, the weights or the random state): a root cause of its own kind
        start = j == 0 and not before
        n_start += start
        suspects.append(_suspect(t, v, Kind.INPUTS if start else Kind.INHERITED, upstream=up,
                                 start=start))
    suspects += [_suspect(t, v, Kind.INHERITED, role=Role.NEGLIGIBLE,
                          summary=t.summary) for v in negligible[:top]]
    left = top - len(ranked)
    suspects += [_suspect(t, v, Kind.UNPAIRED) for v in late_unp[:max(left, 0)]]

    n_failed = int((~passed & paired).sum())
    any_nan = any(v.out_nan for v in views)
    return Advice(
        suspects=suspects,
        all_agree=n_failed == 0 and not any_nan and bool(paired.any()),
        n_rows=len(t), n_compared=int(paired.sum()), n_failed=n_failed,
        n_inherited=len(inherited) + len(negligible) - n_start, n_unpaired=len(unpaired),
        n_root_causes=len(nonfinite) + len(origins) + len(amplifiers) + len(unpaired) + n_start,
    )


def _suspect(t: CompareTable, v: _ApiView, kind: Kind, upstream: str = "",
             start: bool = False, role: Role = Role.NONE, summary: bool = False,
             explains: str = "") -> Suspect:
    row = {"nonfinite": v.nan_row, "own": v.fail_row if v.fail_row >= 0 else v.err_row,
           "inherited": v.fail_row, "inputs": v.fail_row}.get(kind, v.first_row)
    row = v.first_row if row < 0 else row
    g = _growth(v.out_err, v.in_err) if kind != "unpaired" else math.nan
    cat = at.categorize(v.family, kind, v.ctx, v.npu_dtypes, v.bench_dtypes)
    if start:
        cat = at.INPUTS_DIFFER
    if role == Role.NEGLIGIBLE:
        cat = at.NEGLIGIBLE
    adv = at.advice_for(at.AdviceFacts(cat, str(kind), v.family, v.direction, v.in_err, v.out_err, g,
                                       v.npu_dtypes, v.bench_dtypes, side=v.side, upstream=upstream,
                                       role=str(role), flip=_flip_fraction(t, row), api=v.api,
                                       explains=explains, summary=summary))
    msg = str(t[S.ERR_MESSAGE][row]) if row >= 0 else ""
    if kind == "own" and ("shape" in msg.lower() or "unmatched" in msg.lower()):
        adv = f"The shapes differ from the bench ({msg}): a different code path or API semantics. " + adv
    return Suspect(
        api=v.api, direction=v.direction, kind=kind, csv_line=row + 2, stack=_plain_stack(v.stack),
        input_error=float(v.in_err) if kind != "unpaired" else math.nan,
        output_error=float(v.out_err) if kind != "unpaired" else math.nan,
        growth=float(g), category=cat, advice=adv, family=v.family, ctx=v.ctx, order=v.order,
        side=v.side if kind == "unpaired" else "", role=role, explains=explains,
    )


def _plain_stack(stack: Any) -> Optional[list]:
    frames = at.as_frames(stack)
    return frames or None
