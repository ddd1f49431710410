"""Build the compare table (a pandas DataFrame) from two parsed dumps. No torch (except msprobe ``.pt``).

One row per tensor pair in NPU execution order, unpaired rows where the alignment puts them.
Columns: ptdbg's CSV columns (``comparison/schema.py``: full or summary compare),
then the internal underscore columns of docs/DESIGN.md (the CSV writer builds ``NPU_Stack_Info``
from ``_stack`` when ``stack_mode``).
Metric cells are floats (NaN when not computed; ``Err_message`` says why), shapes are lists.

Nothing unusable passes: a row whose data could not be used (a call or tensor on one side only, a
missing/unreadable/mismatched data file, a changed shape or dtype class) is ``Accuracy Reached or
Not`` = ``"No"`` with ``_passed`` False and ``_unusable`` True, and its ``Err_message`` names the
record or file. ``""`` (not compared) is left only for pairs with nothing to compare (empty tensors,
bool tensors without statistics, NaN at the same places everywhere).
``table.attrs``: ``summary_compare``, ``stack_mode``, ``rule``, ``pairing`` (``pairing.Pairing``: the
calls the dataflow reordered, whether the dumps are different programs).

Non-tensor arguments of paired calls are argument rows (``comparison/arguments.py``: ``_arg``,
``_arg_changed``); a call on one side only is classified (``comparison/code_path.py``:
``_code_path``). docs/DESIGN.md lists the columns.

Tensor pairs are compared by a small thread pool, or by worker processes for large compares
(``runtime/pool.py``: they never import the caller's ``__main__``;
:data:`PROCESS_MIN_BYTES`, :data:`PROCESS_MIN_PAIRS`: numpy holds the GIL in its dot products);
each pair is streamed from disk chunk by chunk, so memory does not grow with the tensors
(``workers``, default :data:`WORKERS` as it is when the table is built).

The table is built with the garbage collector paused: each finished row is one tuple in column
order, transposed into one list per column at the end, and a column of one Python type goes to
pandas as its numpy array. Statistics-only rows whose sides both have four float statistics are
judged at once over arrays (``verdict.summary_verdicts``, ``metrics.summary_diffs_rel_l2``: the
same values as the row-by-row ``_summary_row``, which judges the others); such a row is built as
its tuple directly (``_stats_row``, no row dict), and its statistics and judged number cells go
into the typed columns as those arrays (``_patched``; the row holds a value of the same type there
until then, so a column's type is that of its final values).
"""
from __future__ import annotations

import math
import os
from itertools import chain
from operator import itemgetter
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Optional, Protocol, Sequence, Set, Tuple, Union

import numpy as np

from pytest_ptdbg.comparison import arguments as A
from pytest_ptdbg.comparison import code_path as CP
from pytest_ptdbg.comparison import metrics as M
from pytest_ptdbg.comparison import verdict as V
from pytest_ptdbg.comparison.binding import bind_apis
from pytest_ptdbg.comparison.operands import cross_operands
from pytest_ptdbg.comparison.pairing import dtype_class, pair_dumps
from pytest_ptdbg.comparison.rule import Rule
from pytest_ptdbg.comparison.schema import (FULL_COLUMNS, INTERNAL_COLUMNS, STAT_COLUMNS, SUMMARY_COLUMNS,
                                             SUMMARY_DIFF_COLUMNS, CompareTable)
from pytest_ptdbg.dump import npy
from pytest_ptdbg.dump.reader import ApiRec, Dump, TensorRec
from pytest_ptdbg.runtime.gc_pause import paused_gc
from pytest_ptdbg.runtime.progress import Progress
from pytest_ptdbg.runtime import pool

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

    class _Saved(Protocol):
        """What a comparison job reads of a tensor record (a ``TensorRec``, or a ``_Lite`` in a worker)."""

        @property
        def data_file(self) -> Optional[str]: ...
        @property
        def name(self) -> str: ...
        @property
        def shape(self) -> Sequence[int]: ...
        @property
        def dtype(self) -> str: ...

    class _Cells(Protocol):
        """A row being filled in: a row dict, or a :class:`_Row` of the column lists."""

        def __getitem__(self, key: str, /) -> Any: ...
        def __setitem__(self, key: str, value: Any, /) -> None: ...
        def get(self, key: str, default: Any = None, /) -> Any: ...

#: the aligned calls of the two dumps (``pairing.pair_apis``): either side may be missing, never both
_Steps = Sequence[Tuple[Optional[ApiRec], Optional[ApiRec]]]
#: a tensor pair of one call: either side may be missing, never both
_Pair = Tuple[Optional[TensorRec], Optional[TensorRec]]
#: ``(atol, rtol)`` of the dtype rule, None under ptdbg's rule
_Tol = Optional[Tuple[float, float]]
#: a tensor pair to compare element by element: ``(row, NPU record, bench record, tolerance)``
_Job = Tuple[int, TensorRec, TensorRec, _Tol]


#: worker threads (or processes, for large compares) comparing tensor pairs
WORKERS = 2
#: compares of at least this many API calls (or tensor pairs) show a progress bar on a terminal
BAR_MIN_APIS = 2000


def _stat(stats: M.Stats, i: int) -> float:
    v = M.stat_at(stats, i)
    return math.nan if v is None else v


def _nonfinite_from_stats(t: TensorRec) -> int:
    if "nan" in t.extra or "inf" in t.extra:
        return t.nonfinite
    vals = [M.stat_at(t.stats, i) for i in range(4)]
    return int(any(v is not None and not math.isfinite(v) for v in vals))


def _path(t: _Saved) -> str:
    """The record's data file (jobs and loads are made only for records that have one)."""
    path = t.data_file
    assert path is not None, f"{t.name}: no data file"
    return path


def _source(t: _Saved) -> Union[np.ndarray, npy.NpyStream]:
    path = _path(t)
    if path.endswith(".pt"):
        return npy.load_pt(path, t.name, t.shape, t.dtype)
    return npy.NpyStream(path, t.name, t.shape, t.dtype)


def _as_real(t: _Saved) -> np.ndarray:
    """A complex tensor's data as interleaved (real, imag) floats."""
    path = _path(t)
    arr = npy.load_pt(path, t.name, t.shape, t.dtype) if path.endswith(".pt") \
        else npy.load_npy(path, t.name, t.shape, t.dtype, mmap=True)
    arr = np.ascontiguousarray(arr)
    return arr.view(arr.real.dtype) if arr.dtype.kind == "c" else arr


def _compare_job(nt: _Saved, bt: _Saved, tol: _Tol) -> Tuple[Optional[M.PairMetrics], str]:
    if tuple(nt.shape) != tuple(bt.shape):
        return M.shape_mismatch(nt.shape, bt.shape), ""
    if "complex" in nt.dtype or "complex" in bt.dtype:
        try:
            return M.compare_arrays(_as_real(nt), _as_real(bt), M.zero_eps(bt.dtype), tol), ""
        except (ValueError, OSError) as e:
            return None, str(e)
    a = b = None
    try:
        a = _source(nt)
        b = _source(bt)
        return M.compare_streams(a, b, M.zero_eps(bt.dtype), tol), ""
    except (ValueError, OSError) as e:
        return None, str(e)
    finally:
        for s in (a, b):
            if isinstance(s, npy.NpyStream):
                s.close()


def _pair_records(nts: Sequence[TensorRec], bts: Sequence[TensorRec]) -> List[_Pair]:
    """Two paired calls' tensor records (``nts`` of the NPU call, ``bts`` of the bench call, each in
    record order), paired by their bound slot (``TensorRec.param``, else the recorded slot): the NPU
    records in order, each with the bench record of its slot or None, then the bench records of
    slots the NPU side lacks."""
    n_keys = [t.param or t.slot for t in nts]
    b_keys = [t.param or t.slot for t in bts]
    if n_keys == b_keys and len(set(b_keys)) == len(b_keys):
        return list(zip(nts, bts))   # the usual case: the same slots in the same order, each once
    by_slot = dict(zip(b_keys, bts))
    used = set()
    out: List[_Pair] = []
    for t, s in zip(nts, n_keys):
        b = by_slot.get(s)
        if b is not None:
            used.add(s)
        out.append((t, b))
    out.extend((None, b) for b, s in zip(bts, b_keys) if s not in used)
    return out


def _split_scalars(ts: Sequence[TensorRec]) -> Tuple[List[TensorRec], List[TensorRec]]:
    """``(tensor records, Python number records)`` of a call, each in record order."""
    tensors: List[TensorRec] = []
    scalars: List[TensorRec] = []
    for t in ts:
        (scalars if A.is_scalar_record(t) else tensors).append(t)
    return tensors, scalars


def _either(nt: Optional[TensorRec], bt: Optional[TensorRec]) -> TensorRec:
    """The NPU record of a pair, else its bench record (a pair has at least one)."""
    t = nt or bt
    assert t is not None, "a tensor pair has at least one side"
    return t


def _loader(t: TensorRec) -> np.ndarray:
    """A record's saved data as an array (memory-mapped ``.npy``; msprobe ``.pt`` loaded)."""
    path = _path(t)
    if path.endswith(".pt"):
        return npy.load_pt(path, t.name, t.shape, t.dtype)
    return npy.load_npy(path, t.name, t.shape, t.dtype, mmap=True)


def _code_paths(steps: _Steps, summary: bool) -> Dict[Tuple[str, str], Tuple[str, str]]:
    """``{(side, API key): (kind, message)}`` for every call recorded on one side only."""
    one: List[Tuple[str, ApiRec]] = []
    for na, ba in steps:
        if ba is None and na is not None:
            one.append(("NPU", na))
        elif na is None and ba is not None:
            one.append(("bench", ba))
    one.sort(key=lambda sa: sa[1].direction == "backward")   # forwards first: backwards read them
    load = None if summary else _loader
    kinds: dict = {}
    spelled_differently = bool(one) and _spellings_differ(steps)
    paired_forwards: Optional[dict] = None
    earlier: Optional[dict] = None
    for side, api in one:
        fwd = ""
        for bw, fw in (("_backward", "_forward"), (".backward", ".forward")):
            if not api.key.endswith(bw):
                continue
            fkey = api.key[: -len(bw)] + fw
            if (side, fkey) in kinds:
                fwd = kinds[(side, fkey)][0]
                continue
            # the forward ran on both sides (an autocast .float() of a bf16 value pairs with the
            # bench's no-op .float(), whose backward does not exist): it passes the gradient back
            # rounded to its input's dtype when its own forward kept the values
            if paired_forwards is None:
                paired_forwards = {(sd, a.key): a for na, ba in steps if na is not None and ba is not None
                                   for sd, a in (("NPU", na), ("bench", ba))}
            f_api = paired_forwards.get((side, fkey))
            if f_api is not None:
                fwd = CP.classify(f_api, summary, "", load)[0]
        kind, why = CP.optimizer_kind(api, spelled_differently)
        if not kind:
            kind, why = CP.classify(api, summary, fwd, load)
        if kind == CP.BOOKKEEPING and api.direction == "forward":
            if earlier is None:
                earlier = _earlier_dtypes(steps, {id(a) for _, a in one})
            half = CP.new_half_precision(api, earlier.get(id(api), set()))
            if half:
                kind, why = CP.VALUE_CHANGING, (f"value-changing: a cast to {half} on this side only; its "
                                                f"values survive, but what follows computes in {half}, "
                                                "which no earlier call used")
        kinds[(side, api.key)] = (kind, why)
    return kinds


def _earlier_dtypes(steps: _Steps, wanted: Set[int]) -> Dict[int, Set[str]]:
    """``{id(api): output float dtypes of that side's forward calls before it}`` for the calls in
    ``wanted`` (one pass over the aligned sequence)."""
    seen: Tuple[Set[str], Set[str]] = (set(), set())
    out: dict = {}
    for pair in steps:
        for k in (0, 1):
            a = pair[k]
            if a is None:
                continue
            if id(a) in wanted:
                out[id(a)] = set(seen[k])
            if a.direction == "forward":
                seen[k].update(CP.output_dtypes(a))
    return out


_NAN4 = (math.nan, math.nan, math.nan, math.nan)


def _stats4(t: Optional[TensorRec]) -> tuple:
    if t is None:
        return _NAN4
    st = t.stats
    if len(st) == 4:
        a, b, c, d = st
        if a.__class__ is float and b.__class__ is float and c.__class__ is float and d.__class__ is float:
            return (a, b, c, d)   # the common case
    return tuple(_stat(st, k) for k in range(4))


#: one list per distinct shape for the table's shape cells (cells are read, never changed)
_SHAPE_LISTS: Dict[tuple, list] = {}


def _shape_list(shape: Tuple[int, ...]) -> list:
    got = _SHAPE_LISTS.get(shape)
    if got is None:
        if len(_SHAPE_LISTS) >= 1 << 14:
            _SHAPE_LISTS.clear()
        got = _SHAPE_LISTS[shape] = list(shape)
    return got


#: the cells every row starts with, by kind of compare (copied, then the row's own cells set)
_TEMPLATES: Dict[bool, dict] = {
    summary: {**dict.fromkeys(("Max diff", "Min diff", "Mean diff", "L2norm diff") if summary else
                              ("Cosine", "MaxAbsErr", "MaxRelativeErr", "One Thousandth Err Ratio",
                               "Five Thousandths Err Ratio"), math.nan),
              "Accuracy Reached or Not": "", "Err_message": "", "_rel_l2": math.nan, "_nan_mismatch": False,
              "_passed": True, "_unusable": False, "_arg": "", "_arg_changed": False, "_code_path": ""}
    for summary in (True, False)
}


def _row(nt: Optional[TensorRec], bt: Optional[TensorRec], api: ApiRec, na: Optional[ApiRec],
         ba: Optional[ApiRec], stack: Optional[list], summary: bool) -> dict:
    t = nt or bt
    r = _TEMPLATES[summary].copy()
    r["NPU max"], r["NPU min"], r["NPU mean"], r["NPU l2norm"] = _stats4(nt)
    r["Bench max"], r["Bench min"], r["Bench mean"], r["Bench l2norm"] = _stats4(bt)
    if nt is not None:
        r["NPU Name"], r["NPU Tensor Dtype"], r["NPU Tensor Shape"] = nt.name, nt.dtype, _shape_list(nt.shape)
        r["_npu_nonfinite"] = _nonfinite_from_stats(nt)
    else:
        r["NPU Name"], r["NPU Tensor Dtype"], r["NPU Tensor Shape"], r["_npu_nonfinite"] = "", "", [], 0
    if bt is not None:
        r["Bench Name"], r["Bench Tensor Dtype"], r["Bench Tensor Shape"] = bt.name, bt.dtype, _shape_list(bt.shape)
        r["_bench_nonfinite"] = _nonfinite_from_stats(bt)
    else:
        r["Bench Name"], r["Bench Tensor Dtype"], r["Bench Tensor Shape"], r["_bench_nonfinite"] = "", "", [], 0
    r["_api"] = api.key
    r["_bench_api"] = ba.key if ba else ""
    r["_family"] = api.family
    r["_direction"] = api.direction
    if t is not None:
        r["_io"], r["_index"] = t.io, t.index_str
    else:
        r["_io"], r["_index"] = "input", ""
    r["_order"] = api.order
    r["_ctx"] = (na.ctx if na else "") or (ba.ctx if ba else "")
    r["_stack"] = stack
    r["_paired"] = bool(nt and bt)
    return r


#: the columns of a summary compare, in the order :func:`_stats_row` gives its values
_STATS_ROW_COLUMNS = ("NPU Name", "Bench Name", "NPU Tensor Dtype", "Bench Tensor Dtype", "NPU Tensor Shape",
                      "Bench Tensor Shape", "Max diff", "Min diff", "Mean diff", "L2norm diff",
                      "NPU max", "NPU min", "NPU mean", "NPU l2norm", "Bench max", "Bench min", "Bench mean",
                      "Bench l2norm", "Accuracy Reached or Not", "Err_message", "_api", "_bench_api", "_family",
                      "_direction", "_io", "_index", "_order", "_ctx", "_stack", "_paired", "_rel_l2",
                      "_nan_mismatch", "_npu_nonfinite", "_bench_nonfinite", "_passed", "_unusable", "_arg",
                      "_arg_changed", "_code_path")
assert list(_STATS_ROW_COLUMNS) == [str(c) for c in SUMMARY_COLUMNS + INTERNAL_COLUMNS], \
    "_stats_row gives the summary compare's columns in their order"


def _four_float_pair(nt: TensorRec, bt: TensorRec) -> Optional[Tuple[int, int]]:
    """The nonfinite counts (:func:`_nonfinite_from_stats`) of two records whose statistics are both
    four floats (:func:`_four_floats`); None when they are not."""
    ns, bs = nt.stats, bt.stats
    if ns.__class__ is not list or bs.__class__ is not list or len(ns) != 4 or len(bs) != 4:
        return None
    n0, n1, n2, n3 = ns
    b0, b1, b2, b3 = bs
    if not (n0.__class__ is float and n1.__class__ is float and n2.__class__ is float and n3.__class__ is float
            and b0.__class__ is float and b1.__class__ is float and b2.__class__ is float
            and b3.__class__ is float):
        return None
    fin = _isfinite
    e = nt.extra
    nnf = nt.nonfinite if "nan" in e or "inf" in e else \
        int(not (fin(n0) and fin(n1) and fin(n2) and fin(n3)))
    e = bt.extra
    bnf = bt.nonfinite if "nan" in e or "inf" in e else \
        int(not (fin(b0) and fin(b1) and fin(b2) and fin(b3)))
    return nnf, bnf


_isfinite = math.isfinite
_NAN = math.nan


def _stats_row(nt: TensorRec, bt: TensorRec, na: ApiRec, ba: ApiRec, stack: Optional[list], nnf: int,
               bnf: int) -> tuple:
    """The row :func:`_row` makes for a pair of a summary compare whose statistics are four floats on
    both sides (``nt`` of call ``na``, ``bt`` of ``ba``; nonfinite counts ``nnf``, ``bnf``), as one
    tuple in column order (:data:`_STATS_ROW_COLUMNS`), no dict; its statistics cells are NaN,
    filled in from arrays with the cells :func:`_summary_rows` judges (:data:`_DEFERRED_COLUMNS`)."""
    nan = _NAN
    return (nt.name, bt.name, nt.dtype, bt.dtype, _shape_list(nt.shape), _shape_list(bt.shape),
            nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, "", "",
            na.key, ba.key, na.family, na.direction, nt.io, nt.index_str, na.order, na.ctx or ba.ctx, stack, True,
            nan, False, nnf, bnf, True, False, "", False, "")


def _arg_rows(leaves: List[A.ArgLeaf], na: ApiRec, ba: ApiRec, n_num: List[TensorRec], b_num: List[TensorRec],
              stack: Optional[list], summary: bool, rule: Rule,
              th: V.Thresholds) -> Tuple[List[dict], Set[str], Set[str]]:
    """One row per argument leaf of a paired call (``n_num``, ``b_num``: its Python number records
    on each side); the record slots they stand for on each side."""
    rows = []
    n_rec = {t.slot: t for t in n_num}
    b_rec = {t.slot: t for t in b_num}
    used_n: Set[str] = set()
    used_b: Set[str] = set()
    sep_n, sep_b = A.name_sep(na.key), A.name_sep(ba.key)
    nan, missing, leaf_value, leaf_dtype, isfinite = math.nan, A.MISSING, A.leaf_value, A.leaf_dtype, math.isfinite
    key, bench_key, family, direction, order = na.key, ba.key, na.family, na.direction, na.order
    ctx = na.ctx or ba.ctx
    for leaf in leaves:
        if leaf.status == "ignored" and not (leaf.npu_slot in n_rec or leaf.bench_slot in b_rec):
            continue   # ignored and not recorded either side: nothing to show
        nrec, brec = n_rec.get(leaf.npu_slot), b_rec.get(leaf.bench_slot)
        used_n.add(leaf.npu_slot)
        used_b.add(leaf.bench_slot)
        sub = "".join(f".{i}" for i in leaf.path)
        nv, bv = leaf.npu_value, leaf.bench_value
        have_n, have_b = nv is not missing, bv is not missing
        n_dtype = nrec.dtype if nrec else (leaf_dtype(nv) if have_n else "")
        b_dtype = brec.dtype if brec else (leaf_dtype(bv) if have_b else "")
        a, b = leaf_value(nv), leaf_value(bv)
        status, message = leaf.status, leaf.message
        if status == "changed" and rule == Rule.DTYPE and a is not None and b is not None \
                and not isinstance(nv, bool) and not isinstance(bv, bool):
            # the dtype rule's tolerances (the user's rtol/atol) apply to numbers, arguments included
            rtol, atol = V.tolerance(n_dtype, b_dtype, th)
            if abs(a - b) <= atol + rtol * abs(b):
                status, message = "same", f"{leaf.message} (within the dtype rule's tolerance)"
        changed = status == "changed"
        an = a if a is not None else nan
        bn = b if b is not None else nan
        # an argument row carries no tensor error (_rel_l2 0, no summary diffs): what it says is
        # _arg_changed; its values are in the statistics columns, their difference in MaxAbsErr.
        # Both kinds of compare's metric cells are here (the table takes its own columns).
        r = {"NPU Name": nrec.name if nrec else (f"{key}{sep_n}{leaf.npu_slot or 'input.' + leaf.param + sub}"
                                                 if have_n else ""),
             "Bench Name": brec.name if brec else (
                 f"{bench_key}{sep_b}{leaf.bench_slot or 'input.' + leaf.param + sub}" if have_b else ""),
             "NPU Tensor Dtype": n_dtype, "Bench Tensor Dtype": b_dtype, "NPU Tensor Shape": [],
             "Bench Tensor Shape": [],
             "Max diff": nan, "Min diff": nan, "Mean diff": nan, "L2norm diff": nan,
             "Cosine": nan, "MaxAbsErr": nan, "MaxRelativeErr": nan, "One Thousandth Err Ratio": nan,
             "Five Thousandths Err Ratio": nan,
             "NPU max": an, "NPU min": an, "NPU mean": an, "NPU l2norm": abs(a) if a is not None else nan,
             "Bench max": bn, "Bench min": bn, "Bench mean": bn, "Bench l2norm": abs(b) if b is not None else nan,
             "Accuracy Reached or Not": "No" if changed else ("Yes" if status == "same" else ""),
             "Err_message": message,
             "_api": key, "_bench_api": bench_key, "_family": family, "_direction": direction, "_io": "input",
             "_index": (leaf.npu_slot or leaf.bench_slot or "input." + leaf.param + sub)[len("input."):],
             "_order": order, "_ctx": ctx, "_stack": stack, "_paired": have_n and have_b,
             "_rel_l2": 0.0 if have_n and have_b else nan, "_nan_mismatch": False,
             "_npu_nonfinite": int(a is not None and not isfinite(a)),
             "_bench_nonfinite": int(b is not None and not isfinite(b)),
             "_passed": not changed, "_unusable": False, "_arg": leaf.param, "_arg_changed": changed,
             "_code_path": ""}
        if a is not None and b is not None and not summary:
            m = M.compare_arrays(np.array(a), np.array(b), eps=M.zero_eps(b_dtype))
            r["MaxAbsErr"], r["MaxRelativeErr"] = m.max_abs_err, m.max_rel_err
            r["One Thousandth Err Ratio"], r["Five Thousandths Err Ratio"] = m.one_thousandth, m.five_thousandths
        rows.append(r)
    return rows, used_n, used_b


def build_table(npu: Dump, bench: Dump, *, summary: Optional[bool] = None, stack_mode: bool = False,
                fuzzy_match: bool = False, rule: Rule = Rule.PTDBG, thresholds: Optional[V.Thresholds] = None,
                problems: Optional[List[str]] = None, progress: Optional[Callable[[str], None]] = None,
                workers: Optional[int] = None) -> pd.DataFrame:
    """The compare table of two dumps (see the module docstring), built with the cyclic garbage
    collector paused (``runtime/gc_pause.py``).

    ``summary=None`` chooses a summary compare when either dump has no saved tensors. ``rule``: the
    per-tensor rule of the verdict column (``Rule.PTDBG`` or ``Rule.DTYPE``). Problems met on the
    way (missing/mismatched data files) are appended to ``problems``. ``workers``: threads or
    processes comparing tensor pairs (None: :data:`WORKERS` as it is now).
    """
    V._check_rule(rule)
    with paused_gc():
        return _build_table(npu, bench, summary, stack_mode, fuzzy_match, Rule(rule), thresholds,
                            problems, progress, workers)


def _build_table(npu: Dump, bench: Dump, summary: Optional[bool], stack_mode: bool, fuzzy_match: bool,
                 rule: Rule, thresholds: Optional[V.Thresholds], problems: Optional[List[str]],
                 progress: Optional[Callable[[str], None]], workers: Optional[int]) -> pd.DataFrame:
    th = thresholds or V.Thresholds()
    workers = WORKERS if workers is None else workers   # read now: a caller may have set WORKERS
    if summary is None:
        summary = not (npu.has_data and bench.has_data)
    problems = problems if problems is not None else []
    bind_apis(npu.apis, npu.layout == "msprobe")
    bind_apis(bench.apis, bench.layout == "msprobe")
    steps, pairing = pair_dumps(npu.apis, bench.apis, fuzzy=fuzzy_match)
    cross_operands(steps)   # x + a against a + x: operands' rows pair x with x
    kinds = _code_paths(steps, summary)
    cols = [str(c) for c in (SUMMARY_COLUMNS if summary else FULL_COLUMNS) + INTERNAL_COLUMNS]
    rows = _Columns(cols)   # each finished row is one tuple (no dict per row kept)
    jobs: List[_Job] = []
    deferred: list = []     # summary rows judged at once, over arrays (_summary_rows)
    # long work: a progress bar where a person waits (a terminal), nothing elsewhere
    bar = Progress(len(steps), "compare: pairing", enabled=None if len(steps) >= BAR_MIN_APIS else False)
    for k_step, (na, ba) in enumerate(steps):
        if not k_step & 255:
            bar.update(k_step)
        api = na if na is not None else ba
        assert api is not None, "pair_apis pairs a call with a call or with None, never None with None"
        stack = api.stack
        leaves = A.compare_arguments(na, ba, npu.layout == "msprobe", bench.layout == "msprobe") \
            if na is not None and ba is not None else None
        arg_rows: List[dict] = []
        if na is not None and ba is not None and leaves is not None:
            n_ten, n_num = _split_scalars(na.tensors)
            b_ten, b_num = _split_scalars(ba.tensors)
            pairs = _pair_records(n_ten, b_ten)
            arg_rows, used_n, used_b = _arg_rows(leaves, na, ba, n_num, b_num, stack, summary, rule, th)
            # scalar records the call specs do not account for: compared slot by slot
            n_left = [t for t in n_num if t.slot not in used_n]
            b_left = [t for t in b_num if t.slot not in used_b]
            if n_left or b_left:
                pairs += _pair_records(n_left, b_left)
        else:
            pairs = _pair_records(na.tensors if na else (), ba.tensors if ba else ())
        n_inputs = sum(1 for nt, bt in pairs if _either(nt, bt).io == "input") if arg_rows else 0
        for k, (nt, bt) in enumerate(pairs):
            if arg_rows and k == n_inputs:
                rows.extend(arg_rows)
                arg_rows = []
            if summary and nt is not None and bt is not None and na is not None and ba is not None \
                    and tuple(nt.shape) == tuple(bt.shape) \
                    and (nt.dtype == bt.dtype or dtype_class(nt.dtype) == dtype_class(bt.dtype)):
                nf = _four_float_pair(nt, bt)
                if nf is not None:
                    # the common case: judged with the others at once over arrays (_summary_rows)
                    deferred.append((rows.add(_stats_row(nt, bt, na, ba, stack, *nf)), nt, bt) + nf)
                    continue
            r = _row(nt, bt, api, na, ba, stack, summary)
            if nt is None or bt is None:
                if na is None or ba is None:
                    side = "NPU" if ba is None else "bench"
                    other = "bench" if ba is None else "NPU"
                    msg = f"{side} API {api.key} has no matching {other} API (unpaired)"
                    kind, why = kinds.get((side, api.key), ("", ""))
                    _code_path_row(r, msg, kind, why)
                else:
                    side = "bench" if bt is None else "NPU"
                    _unusable(r, f"no {side} tensor {_either(nt, bt).slot} for this API (unpaired tensor)")
            elif tuple(nt.shape) != tuple(bt.shape):
                _unusable(r, f"shape changed (Unmatched): NPU {list(nt.shape)} vs bench {list(bt.shape)}")
            elif dtype_class(nt.dtype) != dtype_class(bt.dtype):
                _unusable(r, f"dtype class changed: NPU {nt.dtype} ({dtype_class(nt.dtype)}) vs bench "
                             f"{bt.dtype} ({dtype_class(bt.dtype)})")
            elif summary:   # statistics that are not four floats (the others are deferred above)
                _summary_row(r, nt, bt, rule, th)
            elif nt.data_file and bt.data_file:
                tol: _Tol = None
                if rule == Rule.DTYPE:
                    rtol, atol = V.tolerance(nt.dtype, bt.dtype, th)
                    tol = (atol, rtol)
                jobs.append((len(rows), nt, bt, tol))
            elif _is_scalar(nt) and _is_scalar(bt):
                _scalar_row(r, nt, bt, rule, th)
                why = nt.data_problem or bt.data_problem   # a 0-d tensor whose file is missing
                if why:
                    r["Err_message"] = "; ".join(m for m in (r["Err_message"], f"compared from statistics: {why}") if m)
                    problems.append(why)
            else:
                why = nt.data_problem or bt.data_problem or \
                    f"no data file saved for {nt.name if not nt.data_file else bt.name}"
                _unusable(r, f"no data to compare (Nan): {why}")
                if nt.data_problem or bt.data_problem:
                    problems.append(why)
            rows.append(r)
        rows.extend(arg_rows)
    bar.update(len(steps))
    bar.close()
    n_rows = len(rows)
    data = rows.columns()
    if jobs:
        bar = Progress(0, "compare: tensors", enabled=None if len(jobs) >= BAR_MIN_APIS else False)
        tell = progress
        if bar.enabled:
            def tell(msg: str, _p: Optional[Callable[[str], None]] = progress) -> None:
                done, _, total = msg.split()[1].partition("/")
                bar.total = int(total)
                bar.update(int(done))
                if _p:
                    _p(msg)
        _run_jobs(data, jobs, rule, th, problems, tell, workers)
        bar.close()
    jobs = []
    rows_judged, judged = _summary_rows(data, deferred, rule, th) if deferred else (np.zeros(0, np.intp), {})
    deferred = []
    import pandas as pd   # here, not at import: worker processes import this module (runtime/pool.py)

    # from columns (pandas builds a frame from a list of dicts cell by cell), each column of one
    # Python type as its numpy array (what pandas would infer from the list, without inferring)
    def column(c: str) -> Union[list, np.ndarray]:
        col = _typed(data.pop(c))
        return _patched(col, rows_judged, judged[c]) if c in judged else col

    df = pd.DataFrame({c: column(c) for c in cols}, columns=cols) if n_rows \
        else pd.DataFrame({c: [] for c in cols})
    df.attrs.update({"summary_compare": bool(summary), "stack_mode": bool(stack_mode), "rule": rule,
                     "pairing": pairing})
    CompareTable(df)   # the contract (comparison/schema.py): every column of its kind is there
    return df


def _spellings_differ(steps: _Steps) -> bool:
    """Whether the two sides' optimizer steps call different multi-tensor kernels (``code_path.py``)."""
    return CP.update_spelling([na for na, _ in steps if na is not None]) != \
        CP.update_spelling([ba for _, ba in steps if ba is not None])


def _code_path_row(r: dict, message: str, kind: str, why: str) -> None:
    """A row of a call recorded on one side only, by its classification (``comparison/code_path.py``):
    bookkeeping passes, value-changing fails (a root cause, not unusable data), unclassified is unusable."""
    if kind in (CP.BOOKKEEPING, CP.OPTIMIZER_UPDATE):
        r["_code_path"] = kind
        r["Err_message"] = f"{message}; {why}"
    elif kind == CP.VALUE_CHANGING:
        r["_code_path"] = kind
        r["Accuracy Reached or Not"] = "No"
        r["_passed"] = False
        r["Err_message"] = f"{message}; {why}"
    else:
        _unusable(r, f"{message}; {why}" if why else message)


class _Row:
    """Row ``i`` of the column lists ``data`` as a mapping (the rows filled in after the loop)."""

    __slots__ = ("data", "i")

    def __init__(self, data: Dict[str, list], i: int) -> None:
        self.data, self.i = data, i

    def __getitem__(self, key: str) -> Any:
        return self.data[key][self.i]

    def __setitem__(self, key: str, value: Any) -> None:
        self.data[key][self.i] = value

    def get(self, key: str, default: Any = None) -> Any:
        col = self.data.get(key)
        return default if col is None else col[self.i]


#: finished rows held as tuples before they are moved into the column lists
ROWS_PER_BLOCK = 4096


class _Columns:
    """The table being built: one tuple per finished row, its values in column order (taken from
    the row dict by one ``itemgetter`` call), moved into one list per column every
    :data:`ROWS_PER_BLOCK` rows (so a big table is never held both as tuples and as columns);
    :meth:`columns` returns the lists (where the rows judged after the loop are filled in,
    through :class:`_Row`)."""

    def __init__(self, cols: List[str]) -> None:
        self.cols = list(cols)
        self._get = itemgetter(*self.cols)
        self.rows: list = []
        self._data: List[list] = [[] for _ in self.cols]
        self._done = 0

    def __len__(self) -> int:
        return self._done + len(self.rows)

    def add(self, values: tuple) -> int:
        """A finished row given as its values in column order; returns its index."""
        i = self._done + len(self.rows)
        self.rows.append(values)
        if len(self.rows) >= ROWS_PER_BLOCK:
            self._flush()
        return i

    def append(self, r: dict) -> None:
        self.rows.append(self._get(r))
        if len(self.rows) >= ROWS_PER_BLOCK:
            self._flush()

    def extend(self, rs: Iterable[dict]) -> None:
        get, add = self._get, self.rows.append
        for r in rs:
            add(get(r))
        if len(self.rows) >= ROWS_PER_BLOCK:
            self._flush()

    def _flush(self) -> None:
        rows, self.rows = self.rows, []
        if not rows:
            return
        self._done += len(rows)
        if len(self.cols) == 1:
            self._data[0].extend(r if not isinstance(r, tuple) else r[0] for r in rows)
            return
        for col, v in zip(self._data, zip(*rows)):
            col.extend(v)

    def columns(self) -> Dict[str, list]:
        """``{column: [values...]}``; the rows are dropped."""
        self._flush()
        data, self._data = self._data, [[] for _ in self.cols]
        return dict(zip(self.cols, data))


def _unusable(r: _Cells, message: str) -> None:
    """Mark a row whose data could not be used: it fails the verdict, whatever the thresholds."""
    r["Accuracy Reached or Not"] = "No"
    r["_passed"] = False
    r["_unusable"] = True
    r["Err_message"] = "; ".join(m for m in (r.get("Err_message"), message) if m)


def _is_scalar(t: TensorRec) -> bool:
    return tuple(t.shape) == () and M.stat_at(t.stats, 0) is not None


def _scalar_row(r: dict, nt: TensorRec, bt: TensorRec, rule: Rule, th: V.Thresholds) -> None:
    """A 0-d value without data file (a Python scalar argument): compared from its statistics."""
    a, b = M.stat_at(nt.stats, 0), M.stat_at(bt.stats, 0)
    tol = None
    if rule == Rule.DTYPE:
        rtol, atol = V.tolerance(nt.dtype, bt.dtype, th)
        tol = (atol, rtol)
    m = M.compare_arrays(np.array(a), np.array(b), eps=M.zero_eps(bt.dtype), tol=tol)
    _fill_metrics(r, m, nt, bt, rule, th)


def _fill_metrics(r: _Cells, m: M.PairMetrics, nt: TensorRec, bt: TensorRec, rule: Rule, th: V.Thresholds) -> None:
    r["Cosine"] = m.cosine
    r["MaxAbsErr"] = m.max_abs_err
    r["MaxRelativeErr"] = m.max_rel_err
    r["One Thousandth Err Ratio"] = m.one_thousandth
    r["Five Thousandths Err Ratio"] = m.five_thousandths
    r["_rel_l2"] = m.rel_l2
    r["_nan_mismatch"] = m.nan_mismatch
    r["_npu_nonfinite"] = m.npu_nonfinite
    r["_bench_nonfinite"] = m.bench_nonfinite
    v = V.full_verdict(m, nt.dtype, bt.dtype, rule, th)
    r["Accuracy Reached or Not"] = v
    r["_passed"] = v != "No"
    r["Err_message"] = m.message


def _summary_row(r: dict, nt: TensorRec, bt: TensorRec, rule: Rule, th: V.Thresholds) -> None:
    diffs = M.summary_diffs(nt.stats, bt.stats)
    for c, v in zip(SUMMARY_DIFF_COLUMNS, diffs):
        r[c] = v
    msgs = []
    verdict, mism = V.summary_verdict(nt.stats, bt.stats, r["_npu_nonfinite"], r["_bench_nonfinite"],
                                      nt.shape, nt.dtype, bt.dtype, rule, th)
    r["_rel_l2"] = M.summary_rel_l2(nt.stats, bt.stats)
    r["_nan_mismatch"] = mism
    if mism:
        msgs.append("NaN/Inf counts or statistics do not match")
    if not nt.stats or not bt.stats:
        msgs.append("no statistics recorded (empty or bool tensor)")
    r["Accuracy Reached or Not"] = verdict
    r["_passed"] = verdict != "No"
    r["Err_message"] = "; ".join(msgs)


def _four_floats(stats: M.Stats) -> bool:
    if stats.__class__ is not list or len(stats) != 4:
        return False
    a, b, c, d = stats
    return a.__class__ is float and b.__class__ is float and c.__class__ is float and d.__class__ is float


#: the cells of a deferred row (:func:`_stats_row`) that :func:`_summary_rows` gives as arrays:
#: the row holds a value of the same Python type there (NaN, True, False), so that the column's
#: type (:func:`_typed`) is the one of its final values
_DEFERRED_COLUMNS = tuple(str(c) for c in SUMMARY_DIFF_COLUMNS + STAT_COLUMNS) + ("_rel_l2", "_passed",
                                                                                  "_nan_mismatch")


def _summary_rows(data: Dict[str, list], deferred: list, rule: Rule,
                  th: V.Thresholds) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
    """:func:`_summary_row` of the rows whose two sides both have four float statistics, at once
    over arrays (``verdict.summary_verdicts``, ``metrics.summary_diffs_rel_l2``): the same values.
    The text cells are set in the column lists ``data``; returned: the rows, and the values of
    their :data:`_DEFERRED_COLUMNS` cells (float64 or bool arrays), to set with :func:`_patched`."""
    m = len(deferred)
    idx = np.fromiter(map(itemgetter(0), deferred), np.intp, m)
    # four floats a side (checked when the row was deferred): one flat run each, not m small lists
    n = np.fromiter(chain.from_iterable([d[1].stats for d in deferred]), np.float64, 4 * m).reshape(m, 4)
    b = np.fromiter(chain.from_iterable([d[2].stats for d in deferred]), np.float64, 4 * m).reshape(m, 4)
    nnf = np.fromiter(map(itemgetter(3), deferred), np.int64, m)
    bnf = np.fromiter(map(itemgetter(4), deferred), np.int64, m)
    rt = at = sizes = None
    if rule == Rule.DTYPE:
        tols: dict = {}
        pairs = [(d[1].dtype, d[2].dtype) for d in deferred]
        for p in set(pairs):
            tols[p] = V.tolerance(p[0], p[1], th)
        rt = np.array([tols[p][0] for p in pairs], dtype=np.float64)
        at = np.array([tols[p][1] for p in pairs], dtype=np.float64)
        sizes = np.array([float(max(math.prod(int(s) for s in d[1].shape), 1)) for d in deferred])
    codes, mism = V.summary_verdicts(n, b, nnf, bnf, rule, th, rt, at, sizes)
    diffs, rel = M.summary_diffs_rel_l2(n, b)
    cells: Dict[str, np.ndarray] = {}
    for k, c in enumerate(SUMMARY_DIFF_COLUMNS):
        cells[str(c)] = diffs[:, k]
    for k, c in enumerate(STAT_COLUMNS):
        cells[str(c)] = (n if k < 4 else b)[:, k % 4]
    cells["_rel_l2"], cells["_passed"], cells["_nan_mismatch"] = rel, codes != 2, mism
    assert set(cells) == set(_DEFERRED_COLUMNS)
    text = V.VERDICT_TEXT
    acc, msg = data["Accuracy Reached or Not"], data["Err_message"]
    bad_msg = "NaN/Inf counts or statistics do not match"
    for i, code, bad in zip(idx.tolist(), codes.tolist(), mism.tolist()):
        acc[i] = text[code]
        msg[i] = bad_msg if bad else ""
    return idx, cells


def _patched(col: Union[list, np.ndarray], rows: np.ndarray, values: np.ndarray) -> Union[list, np.ndarray]:
    """The typed column ``col`` (:func:`_typed`) with its cells ``rows`` set to ``values``: into the
    array, or, where it stayed a list, each cell as the Python value."""
    if isinstance(col, np.ndarray):
        col[rows] = values
        return col
    for i, v in zip(rows.tolist(), values.tolist()):
        col[i] = v
    return col


def _typed(values: list) -> Union[list, np.ndarray]:
    """A column's values as the numpy array pandas would infer for them (float64, bool, int64)
    when they are all of one such Python type; else the list itself (pandas infers)."""
    if not values:
        return values
    kinds = set(map(type, values))
    if len(kinds) != 1:
        return values
    kind = kinds.pop()
    if kind is float:
        return np.array(values, dtype=np.float64)
    if kind is bool:
        return np.array(values, dtype=bool)
    if kind is int and -(1 << 63) <= min(values) and max(values) < (1 << 63):
        return np.array(values, dtype=np.int64)
    return values


#: tensor pairs are compared by worker *processes* (numpy holds the GIL in its BLAS dot products
#: and casts, so threads scale ~1.0-1.1x) when there is at least this much data or pairs to compare;
#: smaller compares use threads (a worker, a fresh interpreter importing numpy, costs ~0.35 s of CPU
#: and 0.2-0.3 s before its first chunk: below ~0.5 GB this process is done first)
PROCESS_MIN_BYTES = 512 << 20
PROCESS_MIN_PAIRS = 4096


class _Lite:
    """The fields of a tensor record a comparison job needs (sent to worker processes)."""

    __slots__ = ("data_file", "name", "shape", "dtype")

    def __init__(self, data_file: str, name: str, shape: tuple, dtype: str) -> None:
        self.data_file, self.name, self.shape, self.dtype = data_file, name, shape, dtype


def _job_spec(nt: TensorRec, bt: TensorRec, tol: _Tol) -> tuple:
    return (nt.data_file, nt.name, tuple(nt.shape), nt.dtype, bt.data_file, bt.name, tuple(bt.shape), bt.dtype, tol)


def _compare_specs(specs: List[tuple]) -> List[Tuple[Optional[M.PairMetrics], str]]:
    """Worker process: compare a chunk of tensor pairs."""
    return [_compare_job(_Lite(*s[0:4]), _Lite(*s[4:8]), s[8]) for s in specs]


def _pair_bytes(nt: TensorRec, bt: TensorRec) -> int:
    n = 1
    for d in nt.shape:
        n *= int(d)
    return 8 * n   # both sides, ~4 bytes each


def _run_jobs(data: Dict[str, list], jobs: List[_Job], rule: Rule, th: V.Thresholds, problems: List[str],
              progress: Optional[Callable[[str], None]], workers: int) -> None:
    """Compare the tensor pairs of ``jobs`` (``(row, nt, bt, tol)``) and fill their rows in the
    column lists ``data`` as the results arrive (none kept: a 160 000-pair compare would hold
    as many metrics objects); problems in row order, as the rows."""
    def work(job: _Job) -> Tuple[Optional[M.PairMetrics], str]:
        _, nt, bt, tol = job
        return _compare_job(nt, bt, tol)

    # hard-linked copies of one tensor (the writer links unchanged tensors) are compared once
    first_of: Dict[tuple, int] = {}
    unique: List[_Job] = []
    owners: List[Union[int, List[int]]] = []   # the job, or the jobs, each unique pair stands for
    for j, job in enumerate(jobs):
        _, nt, bt, tol = job
        n_file, b_file = _path(nt), _path(bt)
        key: tuple = (n_file, b_file) if not (nt.data_inode and bt.data_inode) else \
            (nt.data_inode, bt.data_inode, os.path.dirname(n_file), os.path.dirname(b_file))
        key = key + (bt.dtype, tol, tuple(nt.shape), tuple(bt.shape), nt.dtype)
        u = first_of.get(key)
        if u is None:
            first_of[key] = len(unique)
            unique.append(job)
            owners.append(j)
        else:
            o = owners[u]
            owners[u] = [o, j] if isinstance(o, int) else o + [j]
    del first_of
    total = len(unique)
    nbytes = sum(_pair_bytes(job[1], job[2]) for job in unique)
    done = 0
    last = [-1]
    failed: List[Tuple[int, str]] = []

    def tell(k: int) -> None:
        if progress and (k * 10 // max(total, 1) != last[0] or k == total):
            last[0] = k * 10 // max(total, 1)
            progress(f"compared {k}/{total} tensor pairs")

    def apply(u: int, res: Tuple[Optional[M.PairMetrics], str]) -> None:
        m, err = res
        o = owners[u]
        for j in ((o,) if isinstance(o, int) else o):
            idx, nt, bt, _ = jobs[j]
            r = _Row(data, idx)
            if m is None:
                _unusable(r, f"no data to compare (Nan): {err}")
                failed.append((j, err))
                continue
            _fill_metrics(r, m, nt, bt, rule, th)

    if workers > 1 and (nbytes >= PROCESS_MIN_BYTES or total >= PROCESS_MIN_PAIRS):
        # worker processes of this package only (runtime/pool.py); what they cannot do is done here
        chunks = pool.chunk_ranges([_pair_bytes(job[1], job[2]) for job in unique], workers)
        specs = [[_job_spec(*unique[i][1:]) for i in range(a, b)] for a, b in chunks]
        for c, res in pool.run_parallel(_compare_specs, specs, workers, pure=True):
            for k, one in enumerate(res):
                apply(chunks[c][0] + k, one)
            done += len(res)
            tell(done)
    if done < total:
        with ThreadPoolExecutor(max_workers=max(1, workers)) as ex:
            for k, res in enumerate(ex.map(work, unique)):
                apply(k, res)
                tell(k + 1)
    failed.sort(key=lambda je: je[0])
    problems.extend(err for _, err in failed)
