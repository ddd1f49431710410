"""Fold the replay check (``advise/replay_check.py``) into the advisor's findings. No torch here.

The compare stage calls :func:`run_replay_check` after ``advise()`` when both dumps hold full
tensors. Each of the top root-cause suspects (kinds ``own`` and ``nonfinite``) is re-run alone
on the bench device from the device-under-test's own inputs; then :func:`apply_replay`

* adds the verdict to the suspect's advice in plain English ("the API itself is imprecise on
  identical inputs" / "the error is inherited, amplified ... times: look upstream");
* demotes an ``own`` suspect that the re-run clearly shows to be accurate (its error on identical
  inputs is a small share of the observed one and the device's result agrees with a float64
  oracle) below the other root causes, with role ``amplifier``;
* keeps the verdicts on ``Advice.replay`` (the advisor text and the HTML report show them).
"""
from __future__ import annotations

import math
from typing import Any, Callable, List, Optional, Sequence

from pytest_ptdbg.judge.replay_check import fmt_error

#: suspects re-run by default
TOP = 3
#: an "inherited" verdict is clear when the API's error on identical inputs is below this share
#: of the observed error (and the device agrees with the float64 oracle as well)
CLEAR_SHARE = 0.1


def targets(advice: Any, top: int = TOP) -> List[Any]:
    """The suspects worth re-running: root causes with a paired call (own, nonfinite), in rank order."""
    return [s for s in advice.suspects if s.kind in ("own", "nonfinite")][:top]


def _has_call_spec(dump: Any, api: str) -> bool:
    """Whether ``dump`` recorded the call (arguments) of ``api``'s forward: needed to re-run it."""
    from pytest_ptdbg.format import records

    try:
        p = records.parse_name(api)
    except ValueError:
        return False
    fkey = records.api_key(p.api_type, p.api_name, p.call_index, "forward")
    for a in dump.apis:
        if a.key == fkey:
            return any(isinstance(t.extra, dict) and isinstance(t.extra.get("call"), dict) for t in a.tensors)
    return False


def run_replay_check(advice: Any, npu_dump: Any, bench_dump: Any, bench_device: str = "cpu",
                     top: int = TOP, problems: Optional[List[str]] = None,
                     say: Optional[Callable[[str], None]] = None) -> list:
    """Re-run the top suspects (see the module docstring), fold the verdicts into ``advice``.

    ``npu_dump``/``bench_dump``: read dumps (``dump.reader.Dump``) with tensor data. Returns the
    verdicts (empty when there is nothing to re-run). Imports torch only when some suspect's call
    was recorded; a failure of the check itself is added to ``problems`` and the compare goes on.
    """
    sus = targets(advice, top)
    if not sus:
        return []
    if not any(_has_call_spec(npu_dump, s.api) for s in sus):
        msg = ("replay check skipped: the NPU dump has no recorded call (arguments) for the "
               "suspects (a dump written by ptdbg or msprobe, or an older version)")
        if problems is not None:
            problems.append(msg)
        return []
    try:
        from pytest_ptdbg.judge.replay_check import check_suspects

        verdicts = check_suspects(sus, npu_dump, bench_dump, bench_device=bench_device, top=top)
    except ImportError as e:
        if problems is not None:
            problems.append(f"replay check skipped: {e} (it needs torch)")
        return []
    except Exception as e:  # noqa: BLE001 - a failed re-run must not lose the compare's reports
        if problems is not None:
            problems.append(f"replay check failed: {type(e).__name__}: {e}")
        return []
    apply_replay(advice, verdicts)
    if say is not None:
        for v in verdicts:
            say(f"replay check: {v.api}: {v.verdict}")
    return verdicts


def _e(x: float) -> str:
    return fmt_error(x, inf_text="NaN/Inf")


def clearly_inherited(v: Any) -> bool:
    """An ``inherited`` verdict the evidence leaves no doubt about (see the module docstring)."""
    if v.verdict != "inherited":
        return False
    obs, own, orc = v.observed_error, v.own_error, v.oracle_error
    if math.isnan(obs) or math.isnan(own) or obs <= 0:
        return False
    if own > CLEAR_SHARE * obs:
        return False
    return math.isnan(orc) or orc <= CLEAR_SHARE * obs


def replay_note(v: Any) -> str:
    """One or two sentences for the suspect's advice."""
    where = f"re-run alone on {v.device} from the device's own inputs"
    if v.used_bench_call:
        where += " (with the bench's arguments)"
    if v.verdict == "own":
        if math.isinf(v.own_error):
            return (f"Replay check: {where}, the bench gets no NaN/Inf where the device did (or the "
                    "other way round): the API itself is imprecise on identical inputs.")
        share = ""
        if v.observed_error and not math.isnan(v.observed_error) and v.observed_error > 0:
            share = f", {min(v.own_error / v.observed_error, 9.99):.0%} of the {_e(v.observed_error)} observed"
        return (f"Replay check: {where}, the result still differs from the device's by "
                f"{_e(v.own_error)}{share}: the API itself is imprecise on identical inputs.")
    if v.verdict == "inherited":
        amp = v.amplification
        if not math.isnan(amp) and amp > 1.5:
            how = (f"inherited and amplified about {amp:.3g} times from the {_e(v.input_error)} "
                   "difference of its inputs (the op is badly conditioned for these inputs)")
        else:
            how = "inherited from its inputs"
        orc = "" if math.isnan(v.oracle_error) else \
            f" The device's result is within {_e(v.oracle_error)} of a float64 oracle on the same inputs."
        return (f"Replay check: {where}, the bench reproduces the device's output to within "
                f"{_e(v.own_error)}: the API is accurate on identical inputs; the {_e(v.observed_error)} "
                f"error between the runs is {how}. Look upstream.{orc}")
    return f"Replay check: not conclusive ({v.reason})."


def apply_replay(advice: Any, verdicts: Sequence[Any]) -> None:
    """Annotate and re-rank ``advice`` (in place) with replay verdicts; see the module docstring."""
    advice.replay = list(verdicts)
    by_api = {v.api: v for v in verdicts}
    demoted = []
    for s in advice.suspects:
        v = by_api.get(s.api)
        if v is None or s.kind == "inherited":
            continue
        s.replay = v.verdict
        s.advice = replay_note(v) + " " + s.advice
        if s.kind == "own" and clearly_inherited(v):
            s.role = "amplifier"
            demoted.append(s)
    if not demoted:
        return
    ids = {id(s) for s in demoted}
    kept = [s for s in advice.suspects if id(s) not in ids]
    at = 0  # after the last own/nonfinite suspect that stays, before unpaired and inherited calls
    for i, s in enumerate(kept):
        if s.kind in ("own", "nonfinite"):
            at = i + 1
    advice.suspects = kept[:at] + demoted + kept[at:]
