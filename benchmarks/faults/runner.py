"""Running one benchmark case: dumps, the planted key, compare, and whether the judgement hit.

For a fault on ``device`` (``"fp32"``: float32 with 1e-6 weight noise, ``"bf16"``: bf16 autocast):

1. the bench dump (float32, CPU, full tensors) and the clean device dump, each made once per
   architecture / (architecture, device) and reused;
2. the faulty device dump, the fault installed;
3. the planted API key: the first record where the faulty dump parts from the clean device dump
   (both runs are identical up to the planted call). It must belong to the fault's family and
   direction, and the fault must have fired exactly once; otherwise the case is a plant error;
4. ``compare(...)`` with default settings (full tensors), and again statistics-only
   (``summary_compare=True``), faulty device dump against the bench;
5. hit = the first suspect is the planted API key in the planted direction.

A fault whose size ``e1`` is below ``RESOLUTION`` times the correct kernel's own error ``e0`` in
that dtype is "below resolution" and not scored.
"""
from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from pytest_ptdbg import compare

from benchmarks.faults import dumps
from benchmarks.faults.dumps import DEVICES, first_divergence
from benchmarks.faults.registry import CleanPair, Fault

__all__ = ["Workspace", "FaultResult", "CleanResult", "run_fault", "run_clean", "RESOLUTION"]

RESOLUTION = 4.0


class Workspace:
    """A scratch folder holding the reusable bench and clean device dumps."""

    def __init__(self, root: str) -> None:
        self.root = root
        os.makedirs(root, exist_ok=True)
        self._made: Dict[str, str] = {}

    def clean_dump(self, arch: str, device: Optional[str]) -> str:
        """The bench dump (``device=None``) or the clean dump of ``device``, made once."""
        name = f"{arch}__{device or 'bench'}"
        if name not in self._made:
            path = os.path.join(self.root, name)
            dev = DEVICES[device] if device else dumps.Device("bench")
            dumps.dump_step(arch, path, dev)
            self._made[name] = path
        return self._made[name]

    def scratch(self, name: str) -> str:
        return os.path.join(self.root, "case__" + name)


def _suspect(result: Any) -> Tuple[str, str, str]:
    adv = getattr(result, "advice", None)
    sus = list(getattr(adv, "suspects", None) or [])
    if not sus:
        return "", "", ""
    s = sus[0]
    api = s.api
    for suffix in ("_forward", "_backward"):  # the advisor may name the API with its direction
        if api.endswith(suffix):
            api = api[: -len(suffix)]
    return api, s.direction, s.kind


def _replay_facts(result: Any) -> Tuple[float, List[str], Dict[str, float]]:
    """(replay seconds, not-judged calls as "key: reason", {call key: own error / budget})."""
    j = getattr(result, "judgement", None)
    rep = getattr(j, "replay", None)
    if rep is None:
        return 0.0, [], {}
    return (rep.seconds, [f"{v.api}: {v.reason}" for v in rep.not_judged],
            {v.api: v.ratio for v in rep.judged})


def _compare(npu: str, bench: str, out: str, summary: bool) -> Any:
    param = {"npu_pkl_path": dumps.pkl_path(npu), "bench_pkl_path": dumps.pkl_path(bench),
             "is_print_compare_log": False}
    if not summary:
        param["npu_dump_data_dir"] = dumps.data_dir(npu)
        param["bench_dump_data_dir"] = dumps.data_dir(bench)
    return compare(param, out, summary_compare=True if summary else None)


@dataclass
class FaultResult:
    """One fault on one device setting."""

    case: str
    fault: str
    arch: str
    device: str
    where: str
    family: str
    size: str
    expected: str = ""  # planted API key
    direction: str = ""
    inserted: bool = False  # the planted key is a call the clean code does not make
    e0: float = float("nan")
    e1: float = float("nan")
    below_resolution: bool = False
    plant_error: str = ""
    passed: Optional[bool] = None
    suspect: str = ""
    suspect_direction: str = ""
    suspect_kind: str = ""
    hit: bool = False
    stats_passed: Optional[bool] = None
    stats_suspect: str = ""
    stats_suspect_direction: str = ""
    stats_hit: bool = False
    #: the planted call's own error / budget in the default judgement (inf: NaN/Inf origin)
    ratio: float = float("nan")
    #: the root cause the judgement names for the planted call ("" none)
    cause: str = ""
    replay_seconds: float = 0.0
    not_judged: List[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def scored(self) -> bool:
        return not self.plant_error and not self.below_resolution

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["scored"] = self.scored
        return d


def run_fault(fault: Fault, device: str, ws: Workspace, keep: bool = False) -> FaultResult:
    """Run one fault on one device setting (see the module docstring)."""
    t0 = time.perf_counter()
    res = FaultResult(f"{fault.id}@{device}", fault.id, fault.arch, device, fault.where,
                      fault.family, fault.size, direction=fault.direction)
    bench = ws.clean_dump(fault.arch, None)
    clean = ws.clean_dump(fault.arch, device)
    out = ws.scratch(res.case.replace("@", "__"))
    plant = fault.plant()
    try:
        dumps.dump_step(fault.arch, os.path.join(out, "dump"), DEVICES[device], plant)
        rec = plant.record
        res.e0, res.e1 = rec.e0, rec.e1
        if rec.fired_at is None:
            res.plant_error = f"never fired ({rec.matched} matching calls)"
        elif rec.notes:
            res.plant_error = "; ".join(rec.notes)
        div = first_divergence(os.path.join(out, "dump"), clean)
        if not res.plant_error and res.e1 == 0.0:
            res.below_resolution = True  # the planted output came out bit-identical to the correct one
            div = None
        if div is None:
            if not res.plant_error:
                res.below_resolution = True  # the fault changed nothing the dump holds
        else:
            res.expected, res.inserted = div.api, div.inserted
            fam = div.api.rsplit("_", 1)[0]
            if not res.plant_error and (fam != fault.family or div.direction != fault.direction):
                res.plant_error = (f"first divergence at {div.key} (line {div.line}), not a "
                                   f"{fault.family} {fault.direction} record")
        if not res.plant_error and res.e1 == res.e1 and math.isfinite(res.e1):
            e0 = res.e0 if res.e0 == res.e0 else 0.0
            res.below_resolution = res.below_resolution or res.e1 < RESOLUTION * e0 or res.e1 == 0.0
        if not res.plant_error:
            full = _compare(os.path.join(out, "dump"), bench, os.path.join(out, "cmp"), False)
            res.passed = bool(full.passed)
            res.suspect, res.suspect_direction, res.suspect_kind = _suspect(full)
            res.hit = res.suspect == res.expected and res.suspect_direction == res.direction
            res.replay_seconds, res.not_judged, ratios = _replay_facts(full)
            key = f"{res.expected}_{res.direction}"
            res.ratio = ratios.get(key, float("nan"))
            causes = {c.api: str(c.cause) for c in getattr(full.judgement, "root_causes", [])}
            res.cause = causes.get(key, "")
            stats = _compare(os.path.join(out, "dump"), bench, os.path.join(out, "cmp_s"), True)
            res.stats_passed = bool(stats.passed)
            res.stats_suspect, res.stats_suspect_direction, _ = _suspect(stats)
            res.stats_hit = res.stats_suspect == res.expected and res.stats_suspect_direction == res.direction
    except Exception as e:  # a broken case is reported, the benchmark goes on
        res.plant_error = res.plant_error or f"{type(e).__name__}: {e}"
    finally:
        if not keep:
            shutil.rmtree(out, ignore_errors=True)
    res.seconds = time.perf_counter() - t0
    return res


@dataclass
class CleanResult:
    """One clean pair: device run vs bench, nothing planted."""

    case: str
    arch: str
    device: str
    what: str
    passed: Optional[bool] = None
    suspect: str = ""
    suspect_kind: str = ""
    stats_passed: Optional[bool] = None
    stats_suspect: str = ""
    error: str = ""
    #: the largest own error / budget over the pair's judged calls
    max_ratio: float = float("nan")
    replay_seconds: float = 0.0
    not_judged: List[str] = field(default_factory=list)
    root_causes: List[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def false_alarm(self) -> bool:
        return self.passed is False

    @property
    def stats_false_alarm(self) -> bool:
        return self.stats_passed is False

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["false_alarm"], d["stats_false_alarm"] = self.false_alarm, self.stats_false_alarm
        return d


def run_clean(pair: CleanPair, ws: Workspace) -> CleanResult:
    """Compare a clean device run with the bench (full and statistics-only)."""
    t0 = time.perf_counter()
    res = CleanResult(pair.id, pair.arch, pair.device, pair.what)
    try:
        bench = ws.clean_dump(pair.arch, None)
        dev = ws.clean_dump(pair.arch, pair.device)
        out = ws.scratch("clean__" + pair.id)
        full = _compare(dev, bench, os.path.join(out, "cmp"), False)
        res.passed = bool(full.passed)
        api, d, kind = _suspect(full)
        res.suspect, res.suspect_kind = (f"{api} {d}" if api else ""), kind
        res.replay_seconds, res.not_judged, ratios = _replay_facts(full)
        finite = [r for r in ratios.values() if r == r]
        res.max_ratio = max(finite) if finite else float("nan")
        res.root_causes = [f"{c.api} [{c.cause}]" for c in getattr(full.judgement, "root_causes", [])]
        stats = _compare(dev, bench, os.path.join(out, "cmp_s"), True)
        res.stats_passed = bool(stats.passed)
        api, d, _ = _suspect(stats)
        res.stats_suspect = f"{api} {d}" if api else ""
        shutil.rmtree(out, ignore_errors=True)
    except Exception as e:
        res.error = f"{type(e).__name__}: {e}"
    res.seconds = time.perf_counter() - t0
    return res
