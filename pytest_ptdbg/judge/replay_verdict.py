"""The replay verdict of one suspect: own error, inherited (maybe amplified), or unknown; and its prose.

No torch, no numpy: :mod:`.replay_check` measures the errors (re-running the call), this module
decides what they mean (:func:`decide`, :func:`is_amplified`, :func:`clearly_inherited`) and writes
the one explanation (:func:`verdict_prose`) that the advisor file, the suspect's advice and the
HTML report all show. Every threshold of the replay check is a constant here.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Dict, Sequence

from pytest_ptdbg.format.text import TextEnum, fmt_error

__all__ = ["Verdict", "ReplayVerdict", "decide", "is_amplified", "clearly_inherited", "verdict_prose",
           "replay_section", "OWN_SHARE", "AMPLIFIES", "NOISE", "CLEAR_SHARE"]

#: the API's error on identical inputs must be at least this share of the observed error to be "own"
OWN_SHARE = 0.3
#: an inherited error grown at least this many times (observed / input error) is called amplified
AMPLIFIES = 4.0
#: errors below this are float32 noise
NOISE = 1e-6
#: an "inherited" verdict is clear (the suspect is demoted) when the API's error on identical inputs,
#: and the device's error against the float64 oracle, are both below this share of the observed error
CLEAR_SHARE = 0.1


class Verdict(TextEnum):
    """What re-running a suspect alone from the device's own inputs showed."""

    OWN = "own"              # the API itself is imprecise on the device
    INHERITED = "inherited"  # the API is accurate; its output differs because its inputs did
    UNKNOWN = "unknown"      # it could not be re-run


@dataclass
class ReplayVerdict:
    """Result of re-running one suspect from the device's own inputs."""

    api: str
    verdict: Verdict
    reason: str
    own_error: float = math.nan           # NPU output vs the bench re-run from the NPU's inputs
    observed_error: float = math.nan      # NPU output vs bench output of the two runs
    input_error: float = math.nan         # NPU inputs vs bench inputs of the two runs
    oracle_error: float = math.nan        # NPU output vs float64 re-run from the NPU's inputs
    bench_oracle_error: float = math.nan  # bench re-run vs that float64 re-run
    amplification: float = math.nan       # observed_error / input_error
    device: str = "cpu"
    used_bench_call: bool = False
    per_tensor: Dict[str, Dict[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.verdict = Verdict(self.verdict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["verdict"] = self.verdict.value
        for k, v in list(d.items()):
            if isinstance(v, float) and not math.isfinite(v):
                d[k] = None
        return d

    def text(self) -> str:
        """One paragraph in plain English."""
        return f"{self.api}: {self.verdict.value.upper()} - {self.reason}"


def decide(v: ReplayVerdict) -> Verdict:
    """Own when the API's error on identical inputs is infinite (NaN/Inf of its own) or above noise
    and at least ``OWN_SHARE`` of the observed error; inherited otherwise."""
    own, obs = v.own_error, v.observed_error
    if math.isinf(own):
        return Verdict.OWN
    if own > NOISE and (math.isnan(obs) or own >= OWN_SHARE * obs):
        return Verdict.OWN
    return Verdict.INHERITED


def is_amplified(v: ReplayVerdict) -> bool:
    """An inherited error that grew at least ``AMPLIFIES`` times from the inputs' difference."""
    return not math.isnan(v.amplification) and v.amplification >= AMPLIFIES


def clearly_inherited(v: ReplayVerdict) -> bool:
    """An ``inherited`` verdict the evidence leaves no doubt about (see ``CLEAR_SHARE``)."""
    if v.verdict != Verdict.INHERITED:
        return False
    obs, own, orc = v.observed_error, v.own_error, v.oracle_error
    if math.isnan(obs) or math.isnan(own) or obs <= 0:
        return False
    if own > CLEAR_SHARE * obs:
        return False
    return math.isnan(orc) or orc <= CLEAR_SHARE * obs


def verdict_prose(v: ReplayVerdict) -> str:
    """The explanation of an own or inherited verdict, in plain English (from its numbers)."""
    where = f"re-run alone on {v.device} from the device's own inputs"
    if v.used_bench_call:
        where += " with the bench's arguments"
    oracle = ""
    if not math.isnan(v.oracle_error):
        oracle = (f" Against a float64 oracle on the same inputs the device's result is off by "
                  f"{fmt_error(v.oracle_error)}, the bench's by {fmt_error(v.bench_oracle_error)}.")
    own, obs = v.own_error, v.observed_error
    if v.verdict == Verdict.OWN and math.isinf(own):
        return (f"{where}, the bench gets no NaN/Inf where the device did (or the other way round): "
                f"the API itself is imprecise on identical inputs.{oracle}")
    if v.verdict == Verdict.OWN:
        share = ""
        if not math.isnan(obs) and obs > 0:
            share = f" ({min(own / obs, 9.99):.0%} of the {fmt_error(obs)} observed between the runs)"
        return (f"{where}, the result still differs from the device's by {fmt_error(own)}{share}: "
                f"the API itself is imprecise on identical inputs, not merely its inputs.{oracle}")
    if is_amplified(v):
        how = (f"inherited and amplified about {v.amplification:.3g} times from the "
               f"{fmt_error(v.input_error)} difference of its inputs (it amplifies small differences: "
               "an op badly conditioned for these inputs)")
    elif not math.isnan(v.amplification):
        how = f"inherited from the {fmt_error(v.input_error)} difference of its inputs"
    else:
        how = "inherited from a difference of its inputs"
    return (f"{where}, the bench reproduces the device's output to within {fmt_error(own)}: the API "
            f"is accurate on identical inputs; the {fmt_error(obs)} difference between the runs is "
            f"{how}. Look upstream.{oracle}")


def replay_section(verdicts: Sequence[ReplayVerdict]) -> str:
    """Text block for the advisor file: one line per re-run suspect."""
    if not verdicts:
        return ""
    lines = ["Replay check (each suspect re-run alone from the device's own inputs):"]
    for v in verdicts:
        lines.append(f"  - {v.text()}")
    return "\n".join(lines) + "\n"
