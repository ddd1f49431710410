"""Cross-rank consistency of one data-parallel step: what must be identical on every rank, is. No torch.

In data-parallel training every rank runs the same program; a collective's result and the
parameters after the update must then agree bit for bit across ranks. :func:`check_ranks` reads
every ``rank<N>`` folder of one step (``dump/reader.py``), pairs the ranks' calls by API key, and
checks, in execution order:

* the outputs of the collectives whose result every rank receives whole (:data:`IDENTICAL`:
  ``all_reduce``, ``broadcast``, ``all_gather`` (each gathered tensor), ``all_gather_into_tensor``,
  ``_all_gather_base``); those that leave each rank a different part or only one rank the result
  (:data:`NOT_IDENTICAL`: ``reduce_scatter``, ``reduce``, ``all_to_all``, ``scatter``, ``send``...)
  are listed as not checked. Their inputs are not checked: a rank's own gradients differ by design;
* every tensor of the optimizer's calls (ctx ``"optimizer"``: the parameters before and after the
  update, their gradients, the optimizer state), replicated in plain data parallelism;
* the inputs of later calls that the dump's dataflow traces to an optimizer call's output (the
  updated parameters as the next forward reads them).

A tensor is compared exactly: its ``.npy`` bytes (dtype, shape, every bit) when every rank saved it,
its record (dtype, shape, statistics, NaN/Inf counts) in a statistics-only dump. When the ranks
disagree, the ranks outside the largest group of equal values diverge (a tie: the group holding
the lowest rank is the reference); each divergence names the rank, call, tensor, and by how much.

A rank folder missing from ``0..N-1`` (``N``: ``world_size``, else the most of the highest rank + 1
and the number of tensors an ``all_gather`` gathered), a dump that cannot be read, an incomplete one,
a checked call or tensor missing on some rank, a data file missing or unreadable: each is a named
problem, and the result does not pass.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from pytest_ptdbg.dump import npy, reader

#: collectives whose outputs are the same on every rank
IDENTICAL = frozenset({"all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "_all_gather_base"})
#: collectives whose outputs differ by rank (or exist on one rank only): not checked, listed
NOT_IDENTICAL = frozenset({
    "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "reduce", "all_to_all",
    "all_to_all_single", "gather", "scatter", "send", "recv", "isend", "irecv",
    "all_gather_object", "broadcast_object_list",
})
#: the ``ctx`` of the optimizer's calls
OPTIMIZER_CTX = "optimizer"
#: divergences listed one by one in the text report (all are in the JSON)
TEXT_LIMIT = 20


@dataclass(frozen=True)
class RankDivergence:
    """One rank's tensor that differs from the reference ranks'."""

    rank: int
    api: str              #: the API key (``Distributed_all_reduce_0_forward``)
    slot: str             #: ``output.0``
    tensor: str           #: the record name
    kind: str             #: ``collective`` | ``optimizer`` | ``parameter``
    order: int            #: the call's place in the reference rank's execution order
    reference: Tuple[int, ...]   #: the ranks it was compared with (that agree with each other)
    compared: str         #: ``data`` (the saved tensors) or ``statistics`` (the records)
    max_abs: float        #: largest absolute difference (``data``: elementwise; ``statistics``: of max/min/mean/norm)
    max_rel: float        #: largest relative difference (same elements)
    n_diff: int           #: elements (``data``) or statistics that differ
    n_total: int          #: elements (``data``) or statistics compared
    detail: str = ""      #: what else differs (dtype, shape, NaN counts)

    def text(self) -> str:
        what = "elements" if self.compared == "data" else "statistics"
        ref = ", ".join(f"rank{r}" for r in self.reference)
        how = (f"max abs diff {self.max_abs:.6g}, max rel diff {self.max_rel:.6g}, "
               f"{self.n_diff}/{self.n_total} {what} differ")
        extra = f"; {self.detail}" if self.detail else ""
        return f"rank{self.rank}: {self.api} {self.slot} ({self.kind}) differs from {ref}: {how}{extra}"

    def to_dict(self) -> Dict[str, Any]:
        return {"rank": self.rank, "api": self.api, "slot": self.slot, "tensor": self.tensor, "kind": self.kind,
                "order": self.order, "reference": list(self.reference), "compared": self.compared,
                "max_abs": _json_float(self.max_abs), "max_rel": _json_float(self.max_rel),
                "n_diff": self.n_diff, "n_total": self.n_total, "detail": self.detail}


@dataclass
class RankConsistencyResult:
    """What :func:`check_ranks` found. ``passed``: no divergence and no problem."""

    step_dir: str
    ranks: List[int]                      #: the rank folders read
    expected_ranks: int                   #: how many ranks the step should hold
    divergences: List[RankDivergence]     #: in execution order
    problems: List[str]                   #: named failures (missing ranks, unreadable data, ...)
    notes: List[str] = field(default_factory=list)
    calls_checked: int = 0
    tensors_checked: int = 0
    not_checked: Dict[str, int] = field(default_factory=dict)   #: collective name -> calls not checked
    text_path: str = ""
    json_path: str = ""

    @property
    def passed(self) -> bool:
        return not self.divergences and not self.problems

    @property
    def first(self) -> Optional[RankDivergence]:
        """The earliest divergence in execution order (None: none)."""
        return self.divergences[0] if self.divergences else None

    @property
    def diverging_ranks(self) -> List[int]:
        return sorted({d.rank for d in self.divergences})

    def summary(self) -> str:
        state = "PASSED" if self.passed else "FAILED"
        lines = [f"check_ranks: {state}: {len(self.ranks)} rank(s) of {self.expected_ranks} in {self.step_dir}; "
                 f"{self.calls_checked} call(s), {self.tensors_checked} tensor(s) checked on every rank"]
        first = self.first
        if first is not None:
            lines.append(f"First divergence: {first.text()}")
            lines.append(f"Diverging ranks: {', '.join(f'rank{r}' for r in self.diverging_ranks)} "
                         f"({len(self.divergences)} tensor(s))")
            for d in self.divergences[:TEXT_LIMIT]:
                lines.append(f"  {d.text()}")
            if len(self.divergences) > TEXT_LIMIT:
                lines.append(f"  ... {len(self.divergences) - TEXT_LIMIT} more (in the JSON report)")
        if self.problems:
            lines.append(f"Problems ({len(self.problems)}, the check fails):")
            lines += [f"  {p}" for p in self.problems[:TEXT_LIMIT]]
            if len(self.problems) > TEXT_LIMIT:
                lines.append(f"  ... {len(self.problems) - TEXT_LIMIT} more (in the JSON report)")
        if self.not_checked:
            lines.append("Not checked (outputs differ by rank by design): "
                         + ", ".join(f"{k} x{n}" for k, n in sorted(self.not_checked.items())))
        if self.notes:
            lines.append("Notes:")
            lines += [f"  {n}" for n in self.notes[:TEXT_LIMIT]]
        if self.passed:
            lines.append("All ranks agree.")
        return "".join(line + "\n" for line in lines)

    def to_dict(self) -> Dict[str, Any]:
        return {"step_dir": self.step_dir, "passed": self.passed, "ranks": self.ranks,
                "expected_ranks": self.expected_ranks, "calls_checked": self.calls_checked,
                "tensors_checked": self.tensors_checked,
                "first": self.first.to_dict() if self.first is not None else None,
                "diverging_ranks": self.diverging_ranks,
                "divergences": [d.to_dict() for d in self.divergences],
                "problems": list(self.problems), "notes": list(self.notes), "not_checked": dict(self.not_checked)}


def _json_float(x: float) -> Any:
    return x if math.isfinite(x) else str(x)


# ---------------------------------------------------------------------------------------- checking

@dataclass
class _Slot:
    """One checked tensor: its call and slot, and why it is checked."""

    api: str
    slot: str
    kind: str
    order: int


def _checked_slots(ref: reader.Dump, collectives: bool, optimizer: bool, parameters: bool,
                   not_checked: Dict[str, int]) -> Tuple[List[_Slot], int]:
    """The slots of the reference rank's calls that must agree across ranks, in execution order, and
    how many calls hold them."""
    out: List[_Slot] = []
    opt_calls = {a.key for a in ref.apis if a.ctx == OPTIMIZER_CTX}
    calls = 0
    for a in ref.apis:
        slots: List[Tuple[str, str]] = []
        if a.api_type == "Distributed":
            if a.api_name in IDENTICAL:
                if collectives:
                    slots = [(t.slot, "collective") for t in a.tensors if t.io == "output"]
            else:
                not_checked[a.api_name] = not_checked.get(a.api_name, 0) + 1
        elif a.ctx == OPTIMIZER_CTX:
            if optimizer:
                slots = [(t.slot, "optimizer") for t in a.tensors]
        elif parameters and a.sources:
            slots = [(slot, "parameter") for slot, (src, _) in a.sources.items() if src in opt_calls]
        if slots:
            calls += 1
            out += [_Slot(a.key, s, kind, a.order) for s, kind in slots]
    return out, calls


def _tensor(api: Optional[reader.ApiRec], slot: str) -> Optional[reader.TensorRec]:
    if api is None:
        return None
    for t in api.tensors:
        if t.slot == slot:
            return t
    return None


def _record_value(t: reader.TensorRec) -> Tuple[Any, ...]:
    return (t.dtype, tuple(t.shape), tuple(float(s) if isinstance(s, (int, float)) else s for s in t.stats),
            int(t.extra.get("nan", 0) or 0), int(t.extra.get("inf", 0) or 0))


def _majority(groups: Dict[Any, List[int]]) -> Any:
    """The reference value: the largest group's, the one holding the lowest rank on a tie."""
    return max(groups, key=lambda k: (len(groups[k]), -min(groups[k])))


def _diff_arrays(a: np.ndarray, b: np.ndarray) -> Tuple[float, float, int, int, str]:
    """(max abs, max rel, differing elements, elements, what else differs) of ``a`` against reference ``b``."""
    detail = []
    if a.dtype != b.dtype:
        detail.append(f"dtype {a.dtype} vs {b.dtype}")
    if a.shape != b.shape:
        detail.append(f"shape {a.shape} vs {b.shape}")
        return math.inf, math.inf, max(a.size, b.size), max(a.size, b.size), "; ".join(detail)
    wide = np.complex128 if "c" in a.dtype.kind + b.dtype.kind else np.float64
    x, y = a.astype(wide), b.astype(wide)
    same = (x == y) | (np.isnan(x) & np.isnan(y))
    bits_differ = a.tobytes() != b.tobytes()
    n_diff = int(same.size - np.count_nonzero(same))
    if n_diff == 0 and bits_differ:  # -0.0 against 0.0, or NaN payloads: equal values, other bits
        detail.append("equal values with different bits (signed zeros or NaN payloads)")
        n_diff = 1
    nan_mismatch = int(np.count_nonzero(np.isnan(x) != np.isnan(y)))
    if nan_mismatch:
        detail.append(f"{nan_mismatch} NaN(s) on one side only")
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        d = np.abs(x - y)
        d = np.where(same, 0.0, d)
        finite = np.isfinite(d)
        max_abs = float(d[finite].max()) if finite.any() else 0.0
        if not finite.all():
            max_abs = math.inf
        rel = d / np.maximum(np.abs(y), np.finfo(np.float64).tiny)
        max_rel = float(np.nanmax(rel)) if rel.size else 0.0
    return max_abs, max_rel, n_diff, int(same.size), "; ".join(detail)


def _diff_records(a: reader.TensorRec, b: reader.TensorRec) -> Tuple[float, float, int, int, str]:
    """The same as :func:`_diff_arrays` for two records' statistics (max, min, mean, norm)."""
    detail = []
    if a.dtype != b.dtype:
        detail.append(f"dtype {a.dtype} vs {b.dtype}")
    if tuple(a.shape) != tuple(b.shape):
        detail.append(f"shape {list(a.shape)} vs {list(b.shape)}")
    for what in ("nan", "inf"):
        na, nb = int(a.extra.get(what, 0) or 0), int(b.extra.get(what, 0) or 0)
        if na != nb:
            detail.append(f"{na} vs {nb} {what.upper()}")
    max_abs = max_rel = 0.0
    n_diff = 0
    n = max(len(a.stats), len(b.stats))
    for i in range(n):
        x = a.stats[i] if i < len(a.stats) else None
        y = b.stats[i] if i < len(b.stats) else None
        if x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)):
            continue
        n_diff += 1
        try:
            fx, fy = float(x), float(y)  # type: ignore[arg-type]
            d = abs(fx - fy)
            max_abs = max(max_abs, d if math.isfinite(d) else math.inf)
            max_rel = max(max_rel, d / max(abs(fy), 1e-300))
        except (TypeError, ValueError):
            max_abs = max_rel = math.inf
    if n_diff == 0 and detail:
        n_diff = 1
    return max_abs, max_rel, n_diff, n, "; ".join(detail)


def _load(t: reader.TensorRec) -> np.ndarray:
    assert t.data_file is not None
    if t.data_file.endswith(".pt"):
        return npy.load_pt(t.data_file, t.name, t.shape, t.dtype)
    return npy.load_npy(t.data_file, t.name, t.shape, t.dtype)


def _check_slot(s: _Slot, recs: Dict[int, reader.TensorRec], stats_only: Dict[int, bool],
                problems: List[str]) -> List[RankDivergence]:
    """Compare one tensor across ranks; data when every rank saved it, else the records."""
    with_data = {r: t for r, t in recs.items() if t.data_file}
    lacking = [r for r, t in recs.items() if not t.data_file and (t.data_problem or (with_data and not stats_only[r]))]
    for r in lacking:
        why = recs[r].data_problem or f"rank{r}: no data file for {recs[r].name!r} (the other ranks saved it)"
        problems.append(f"rank{r}: {why}" if not why.startswith(f"rank{r}") else why)
    values: Dict[int, Any] = {}
    arrays: Dict[int, np.ndarray] = {}
    compared = "data" if with_data and len(with_data) == len(recs) else "statistics"
    if compared == "data":
        for r, t in recs.items():
            try:
                arr = _load(t)
            except (OSError, ValueError) as e:
                problems.append(f"rank{r}: {e}")
                compared = "statistics"
                break
            arrays[r] = arr
            values[r] = (arr.dtype.str, arr.shape, hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest())
    if compared == "statistics":
        arrays.clear()
        values = {r: _record_value(t) for r, t in recs.items()}
    groups: Dict[Any, List[int]] = {}
    for r in sorted(values):
        groups.setdefault(values[r], []).append(r)
    if len(groups) <= 1:
        return []
    ref_value = _majority(groups)
    ref_ranks = tuple(groups[ref_value])
    ref = ref_ranks[0]
    out = []
    for r in sorted(values):
        if values[r] == ref_value:
            continue
        if compared == "data":
            m = _diff_arrays(arrays[r], arrays[ref])
        else:
            m = _diff_records(recs[r], recs[ref])
        out.append(RankDivergence(r, s.api, s.slot, recs[r].name, s.kind, s.order, ref_ranks, compared, *m))
    return out


def check_ranks(step_dir: str, world_size: Optional[int] = None, collectives: bool = True,
                optimizer: bool = True, parameters: bool = True) -> RankConsistencyResult:
    """Check that every rank of the step folder ``step_dir`` agrees where data parallelism requires it.

    ``world_size``: the number of ranks the step must hold (default: inferred, see the module
    docstring). ``collectives``, ``optimizer``, ``parameters``: which checks run. The step folder
    must hold only ``rank<N>`` folders (else ValueError; a missing folder: FileNotFoundError).
    """
    dirs = reader.rank_dirs(step_dir)
    problems: List[str] = []
    notes: List[str] = []
    dumps: Dict[int, reader.Dump] = {}
    for rank, path in dirs:
        try:
            d = reader.read_dump(path)
        except (OSError, ValueError) as e:
            problems.append(f"rank{rank} ({path}): cannot be read: {e}")
            continue
        dumps[rank] = d
        problems += [f"rank{rank}: {p}" for p in d.problems]
        notes += [f"rank{rank}: {n}" for n in d.notes]
        if d.missing_data and d.missing_data not in d.problems:
            problems.append(f"rank{rank}: {d.missing_data}")
    ranks = [r for r, _ in dirs]
    expected = max(ranks) + 1
    for d in dumps.values():   # an all_gather gathers one tensor per rank
        for a in d.apis:
            if a.api_type == "Distributed" and a.api_name == "all_gather":
                expected = max(expected, sum(1 for t in a.tensors if t.io == "output"))
    if world_size is not None:
        if world_size < len(ranks) or world_size <= max(ranks):
            problems.append(f"{step_dir}: holds rank(s) {ranks}, more than world_size={world_size}")
        expected = max(expected, int(world_size))
    missing = [r for r in range(expected) if r not in ranks]
    if missing:
        problems.append(f"{step_dir}: rank folder(s) missing: {', '.join(f'rank{r}' for r in missing)} "
                        f"(expected {expected} ranks, found {ranks})")
    res = RankConsistencyResult(step_dir, ranks, expected, [], problems, notes)
    if not dumps:
        return res
    ref_rank = min(dumps)
    ref = dumps[ref_rank]
    if len(dumps) < 2:
        problems.append(f"{step_dir}: only rank{ref_rank} could be read: nothing to check it against")
    slots, res.calls_checked = _checked_slots(ref, collectives, optimizer, parameters, res.not_checked)
    by_key = {r: {a.key: a for a in d.apis} for r, d in dumps.items()}
    ref_keys = set(by_key[ref_rank])
    for r, keys in by_key.items():   # the same program on every rank: the same calls
        if r == ref_rank:
            continue
        only_ref, only_r = sorted(ref_keys - set(keys)), sorted(set(keys) - ref_keys)
        if only_ref or only_r:
            notes.append(f"rank{r} records other calls than rank{ref_rank}: "
                         f"{len(only_ref)} missing (e.g. {only_ref[:3]}), {len(only_r)} extra (e.g. {only_r[:3]})")
    for r in sorted(by_key):   # a checked call or tensor only some ranks hold
        if r == ref_rank:
            continue
        for key in sorted({k for k in by_key[r] if k not in ref_keys} & _checked_keys(dumps[r], collectives, optimizer,
                                                                                    parameters)):
            problems.append(f"rank{r}: {key} is not recorded on rank{ref_rank} (a checked call on some ranks only)")
    stats_only = {r: d.data_dir is None or not d.has_data for r, d in dumps.items()}
    for s in slots:
        recs: Dict[int, reader.TensorRec] = {}
        absent = []
        for r in sorted(by_key):
            t = _tensor(by_key[r].get(s.api), s.slot)
            if t is None:
                absent.append(r)
            else:
                recs[r] = t
        if absent:
            problems.append(f"{s.api} {s.slot}: not recorded on {', '.join(f'rank{r}' for r in absent)} "
                            f"(recorded on {', '.join(f'rank{r}' for r in sorted(recs))})")
        if len(recs) < 2:
            continue
        res.tensors_checked += 1
        res.divergences += _check_slot(s, recs, stats_only, problems)
    res.divergences.sort(key=lambda d: (d.order, d.slot, d.rank))
    if res.tensors_checked == 0 and len(dumps) >= 2:   # green must mean compared and agreed
        problems.append(f"{step_dir}: nothing to check: no collective output, optimizer tensor or updated "
                        "parameter is recorded on two ranks or more (a dump without collectives or "
                        "optimizer step, or a scope that left them out)")
    return res


def _checked_keys(d: reader.Dump, collectives: bool, optimizer: bool, parameters: bool) -> set:
    slots, _ = _checked_slots(d, collectives, optimizer, parameters, {})
    return {s.api for s in slots}

