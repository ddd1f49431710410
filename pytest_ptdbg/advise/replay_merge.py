"""Fold the replay check (:mod:`.replay_check`) into the advisor's findings. No torch here.

The compare stage calls :func:`run_replay_check` after ``advise()`` when both dumps hold full
tensors. Each of the top root-cause suspects (kinds ``own`` and ``nonfinite``) is re-run alone
on the bench device from the device-under-test's own inputs; then :func:`apply_replay`

* adds the verdict to the suspect's advice in plain English (:func:`.replay_verdict.verdict_prose`);
* demotes an ``own`` suspect that the re-run clearly shows to be accurate (its error on identical
  inputs is a small share of the observed one and the device's result agrees with a float64
  oracle: :func:`.replay_verdict.clearly_inherited`) below the other root causes, with role
  ``amplifier``;
* keeps the verdicts on ``Advice.replay`` (the advisor text and the HTML report show them).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence

from pytest_ptdbg.judge.replay_verdict import ReplayVerdict, Verdict, clearly_inherited, verdict_prose

if TYPE_CHECKING:
    from pytest_ptdbg.dump.reader import Dump

__all__ = ["TOP", "targets", "run_replay_check", "apply_replay", "replay_note", "clearly_inherited"]

#: suspects re-run by default
TOP = 3


def targets(advice: Any, top: int = TOP) -> List[Any]:
    """The suspects worth re-running: root causes with a paired call (own, nonfinite), in rank order."""
    return [s for s in advice.suspects if s.kind in ("own", "nonfinite")][:top]


def _has_call_spec(dump: "Dump", api: str) -> bool:
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


def run_replay_check(advice: Any, npu_dump: "Dump", bench_dump: "Dump", bench_device: str = "cpu",
                     top: int = TOP, problems: Optional[List[str]] = None,
                     say: Optional[Callable[[str], None]] = None) -> List[ReplayVerdict]:
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


def replay_note(v: ReplayVerdict) -> str:
    """The sentence the replay check adds in front of a suspect's advice."""
    if v.verdict == Verdict.UNKNOWN:
        return f"Replay check: not conclusive ({v.reason})."
    return f"Replay check: {verdict_prose(v)}"


def apply_replay(advice: Any, verdicts: Sequence[ReplayVerdict]) -> None:
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
