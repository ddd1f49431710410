"""Pair the APIs of two dumps in execution order by a sequence alignment. No torch.

Two APIs can pair when they compute the same operation (``ApiRec.op``, ``binding.py``: every spelling
of softmax is ``softmax``; the family ``{Type}_{api}`` for records not bound) and direction and compatible
tensor structure (tensors only: non-tensor arguments never unpair a call): every tensor slot
(``input.0``, ``output.1.0`` ...) present on both sides has the same shape and the same dtype
class (fp16/bf16/fp32/fp64 are one class, ints another, bool another).

The alignment maximises a score over order-preserving pairings (a weighted LCS), so an extra or
missing call on one side (a device-specific API, an extra cast) leaves its neighbours' pairing
intact. Pair score: 3, +1 when the structures are identical, +1 when the call indices are equal
(default mode only; ``fuzzy=True`` ignores call indices, as ptdbg's ``fuzzy_match``).

A call whose shapes changed but whose slots and dtype classes agree ("weakly compatible") can
still pair, at score 1 (+1 for an equal call index) against the compatible pairs' scores times
:data:`STRONG` (so many weak pairs never outweigh one compatible pair): only where no compatible
partner is left, so that the table reports "shape changed" on one row instead of two unpaired
calls. Anchors are never weak pairs.

To stay fast on long dumps, families with the same number of calls on both sides give anchors
(k-th call with k-th call, when compatible); the longest order-preserving chain of anchors splits
the sequences, and only the gaps between anchors are aligned by dynamic programming (numpy, one
vector operation per row). A gap too large for one table (> DP_LIMIT cells) is aligned by windows
of WINDOW calls sliding along the diagonal (30 000 calls without any anchor: about 1 s).

Dataflow (:func:`repair_by_dataflow`, a pass after :func:`align`; :func:`pair_dumps` runs both):
when both dumps record each forward input's producer (``ApiRec.sources``), a paired call whose
producers are not paired with each other is re-paired by swaps between compatible calls, first
in execution order (a call goes to the bench call its producers' partners fed), then in reverse
(a consumer's producers are paired with each other, walking a chain of swapped calls back to
where it forks), then forwards again. Backward records follow their forward call. Where every
edge already agrees (the usual case) nothing is built: one pass over the edges by key.
:class:`Pairing` reports the reordered calls and whether the dumps are different programs.
"""
from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Protocol, Sequence, Tuple

import numpy as np

from pytest_ptdbg.runtime.operations import COMMUTATIVE

if TYPE_CHECKING:
    from pytest_ptdbg.dump.reader import ApiRec

#: cells above which a gap is matched greedily instead of by dynamic programming
DP_LIMIT = 4_000_000
#: NPU calls per window when a long gap is aligned window by window
WINDOW = 1000
_NEG = -(1 << 40)
#: weight of a compatible pair's score (3..5) against a weak (shape-changed) pair's (1..2)
STRONG = 10

_FLOAT = {"float16", "half", "bfloat16", "float32", "float", "float64", "double"}


_CLASS: Dict[str, str] = {}


def dtype_class(dtype: str) -> str:
    """``float`` for fp16/bf16/fp32/fp64 (and Python float), ``int``, ``bool``, ``complex``, else the dtype itself."""
    c = _CLASS.get(dtype)
    if c is None:
        c = _dtype_class(dtype)
        if len(_CLASS) < 4096:   # a dump has a handful of dtypes; a hostile one cannot grow this
            _CLASS[dtype] = c
    return c


def _dtype_class(dtype: str) -> str:
    d = (dtype or "").replace("torch.", "")
    if d.startswith("<class '") and d.endswith("'>"):   # ptdbg v4's Python scalars: "<class 'int'>"
        d = d[len("<class '"):-2]
    if d in _FLOAT:
        return "float"
    if d == "bool":
        return "bool"
    if d.startswith("complex"):
        return "complex"
    if d.startswith(("int", "uint")) or d in ("long", "short"):
        return "int"
    return d


@dataclass(frozen=True)
class ApiSig:
    """What pairing looks at: family, direction, call index and tensor structure."""

    family: str
    direction: str
    call_index: int
    structure: Tuple[Tuple[str, str, Tuple[int, ...]], ...]  # sorted (slot, dtype class, shape)


def signature(api: ApiRec) -> ApiSig:
    """:class:`ApiSig` of a :class:`~pytest_ptdbg.dump.reader.ApiRec`.

    Records of Python number arguments (``int``/``float`` dtype, shape []) are not part of the
    structure: an extra or missing non-tensor argument (``_stacklevel=3``, an explicit default)
    never unpairs a call nor weakens its pair; the table compares arguments by name instead."""
    op = api.op
    # the structure depends on the records' bound slots, dtypes and shapes (in record order) and on
    # whether the operation is commutative: remembered by exactly those (a loop repeats a few)
    key = (op, tuple([(t.param or t.slot, t.dtype, t.shape) for t in api.tensors]))
    try:
        structure = _STRUCTURES.get(key)
        memo = True
    except TypeError:   # an unhashable shape: computed, not remembered
        structure, memo = None, False
    if structure is None:
        st = [(t.param or t.slot, dtype_class(t.dtype), tuple(t.shape)) for t in api.tensors
              if not (tuple(t.shape) == () and not str(t.dtype).startswith("torch."))]
        if op in COMMUTATIVE:
            st = _operands_unordered(st)
        structure = tuple(sorted(st))
        if memo:
            if len(_STRUCTURES) >= _STRUCTURES_MAX:
                _STRUCTURES.clear()
            _STRUCTURES[key] = structure
    return ApiSig(op or api.family, api.direction, api.call_index, structure)


#: :attr:`ApiSig.structure` by what it is computed from (``signature``)
_STRUCTURES: Dict[tuple, Tuple[Tuple[str, str, Tuple[int, ...]], ...]] = {}
_STRUCTURES_MAX = 1 << 14


#: a commutative call's operands (and their gradients), named by their order in the structure
_OPERANDS = {"input.input": "input", "input.other": "input", "output.input": "output", "output.other": "output"}


def _operands_unordered(st: List[Tuple[str, str, Tuple[int, ...]]]) -> List[Tuple[str, str, Tuple[int, ...]]]:
    """``x + a`` and ``a + x`` have one structure: a commutative call's two operands are named by
    their (dtype class, shape) order, not by which was ``input`` (``comparison/operands.py`` pairs
    their rows)."""
    out = [e for e in st if e[0] not in _OPERANDS]
    for io in ("input", "output"):
        ops = sorted((c, sh) for s, c, sh in st if _OPERANDS.get(s) == io)
        out += [(f"{io}.operand{k}", c, sh) for k, (c, sh) in enumerate(ops)]
    return out


def compatible(a: ApiSig, b: ApiSig) -> bool:
    """Same family and direction, and the slots present on both sides agree in class and shape."""
    if a.family != b.family or a.direction != b.direction:
        return False
    return _struct_compatible(a.structure, b.structure)


def _struct_weak(a: tuple, b: tuple) -> bool:
    """The slots present on both sides agree in dtype class (shapes may differ)."""
    da = {s: c for s, c, _ in a}
    db = {s: c for s, c, _ in b}
    common = da.keys() & db.keys()
    if not common and (da or db):
        return False
    return all(da[s] == db[s] for s in common)


def _struct_compatible(a: tuple, b: tuple) -> bool:
    if a == b:
        return True
    da = {s: (c, sh) for s, c, sh in a}
    db = {s: (c, sh) for s, c, sh in b}
    common = da.keys() & db.keys()
    if not common and (da or db):
        return False
    return all(da[s] == db[s] for s in common)


class _Scorer:
    def __init__(self, npu: Sequence[ApiSig], bench: Sequence[ApiSig], fuzzy: bool):
        self.npu, self.bench, self.fuzzy = npu, bench, fuzzy
        fam: Dict[Tuple[str, str], int] = {}
        sid: Dict[tuple, int] = {}
        self.fam_n = np.array([fam.setdefault((s.family, s.direction), len(fam)) for s in npu], dtype=np.int64)
        self.fam_b = np.array([fam.setdefault((s.family, s.direction), len(fam)) for s in bench], dtype=np.int64)
        self.st_n = np.array([sid.setdefault(s.structure, len(sid)) for s in npu], dtype=np.int64)
        self.st_b = np.array([sid.setdefault(s.structure, len(sid)) for s in bench], dtype=np.int64)
        self.ci_n = np.array([s.call_index for s in npu], dtype=np.int64)
        self.ci_b = np.array([s.call_index for s in bench], dtype=np.int64)
        self.structs = list(sid)
        self._compat: Dict[int, np.ndarray] = {}
        self._weak: Dict[int, np.ndarray] = {}

    def _ok_vec(self, sid: int) -> np.ndarray:
        """Which structure ids are compatible with ``sid`` (computed once per id)."""
        v = self._compat.get(sid)
        if v is None:
            a = self.structs[sid]
            v = self._compat[sid] = np.array([_struct_compatible(a, b) for b in self.structs], dtype=bool)
        return v

    def _weak_vec(self, sid: int) -> np.ndarray:
        """Which structure ids are weakly compatible with ``sid`` (same slots' dtype classes)."""
        v = self._weak.get(sid)
        if v is None:
            a = self.structs[sid]
            v = self._weak[sid] = np.array([_struct_weak(a, b) for b in self.structs], dtype=bool)
        return v

    def score(self, i: int, j: int) -> int:
        if self.fam_n[i] != self.fam_b[j]:
            return _NEG
        si, sj = int(self.st_n[i]), int(self.st_b[j])
        ci = int(not self.fuzzy and self.ci_n[i] == self.ci_b[j])
        if si != sj and not self._ok_vec(si)[sj]:
            return 1 + ci if self._weak_vec(si)[sj] else _NEG
        return STRONG * (3 + int(si == sj) + ci)

    def row(self, i: int, j0: int, j1: int) -> np.ndarray:
        stb = self.st_b[j0:j1]
        si = int(self.st_n[i])
        same = stb == si
        fam = self.fam_b[j0:j1] == self.fam_n[i]
        ok = fam & self._ok_vec(si)[stb]
        weak = fam & self._weak_vec(si)[stb]
        s = np.where(ok, STRONG * (3 + same.astype(np.int64)), np.where(weak, 1, _NEG))
        if not self.fuzzy:
            s += (self.ci_b[j0:j1] == self.ci_n[i]) * np.where(ok, STRONG, 1)
        return s


def _lis(pairs: List[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """Longest chain of pairs increasing in both coordinates (pairs sorted by the first)."""
    tails: List[int] = []
    tail_idx: List[int] = []
    prev = [-1] * len(pairs)
    for k, (_, j) in enumerate(pairs):
        pos = bisect.bisect_left(tails, j)
        if pos == len(tails):
            tails.append(j)
            tail_idx.append(k)
        else:
            tails[pos] = j
            tail_idx[pos] = k
        prev[k] = tail_idx[pos - 1] if pos else -1
    out = []
    k = tail_idx[-1] if tail_idx else -1
    while k >= 0:
        out.append(pairs[k])
        k = prev[k]
    return out[::-1]


def _anchors(sc: _Scorer) -> List[Tuple[int, int]]:
    pos_n: Dict[int, List[int]] = {}
    pos_b: Dict[int, List[int]] = {}
    for i, f in enumerate(sc.fam_n.tolist()):
        pos_n.setdefault(f, []).append(i)
    for j, f in enumerate(sc.fam_b.tolist()):
        pos_b.setdefault(f, []).append(j)
    cand = []
    for f, ii in pos_n.items():
        jj = pos_b.get(f)
        if jj is None or len(jj) != len(ii):
            continue
        for i, j in zip(ii, jj):
            if sc.score(i, j) >= STRONG * 3:   # never a weak (shape-changed) pair
                cand.append((i, j))
    cand.sort()
    return _lis(cand)


def _dp(sc: _Scorer, i0: int, i1: int, j0: int, j1: int) -> List[Tuple[int, int]]:
    n, m = i1 - i0, j1 - j0
    if n == 0 or m == 0:
        return []
    if n * m > DP_LIMIT:
        return _windowed(sc, i0, i1, j0, j1)
    return _dp_full(sc, i0, i1, j0, j1)


def _dp_full(sc: _Scorer, i0: int, i1: int, j0: int, j1: int) -> List[Tuple[int, int]]:
    n, m = i1 - i0, j1 - j0
    if n == 0 or m == 0:
        return []
    D = np.zeros((n + 1, m + 1), dtype=np.int64)
    for i in range(1, n + 1):
        s = sc.row(i0 + i - 1, j0, j1)
        t = np.maximum(D[i - 1, 1:], D[i - 1, :-1] + s)
        np.maximum.accumulate(t, out=D[i, 1:])
    out = []
    i, j = n, m
    while i > 0 and j > 0:
        v = D[i, j]
        if v == D[i - 1, j]:
            i -= 1
        elif v == D[i, j - 1]:
            j -= 1
        else:
            out.append((i0 + i - 1, j0 + j - 1))
            i -= 1
            j -= 1
    return out[::-1]


def _windowed(sc: _Scorer, i0: int, i1: int, j0: int, j1: int) -> List[Tuple[int, int]]:
    """Alignment of a long gap by dynamic programming over sliding windows along the diagonal.

    Each window aligns ``block`` NPU calls with ``block + slack`` bench calls (more when the gap is
    lopsided) and keeps the pairs of its first half; the next window starts after the last kept pair.
    """
    block, slack = WINDOW, WINDOW // 2
    out: List[Tuple[int, int]] = []
    i, j = i0, j0
    while i < i1 and j < j1:
        ie = min(i1, i + block)
        extra = min(max(slack, (j1 - j) - (i1 - i)), 4 * block)
        je = min(j1, j + block + extra)
        pairs = _dp_full(sc, i, ie, j, je)
        if ie == i1:
            out.extend(pairs)
            break
        half = i + block // 2
        keep = [pq for pq in pairs if pq[0] < half]
        out.extend(keep)
        if keep:
            i, j = keep[-1][0] + 1, keep[-1][1] + 1
        else:
            i = half
    return out


def align(npu: Sequence[ApiSig], bench: Sequence[ApiSig], fuzzy: bool = False
          ) -> List[Tuple[Optional[int], Optional[int]]]:
    """Align two API sequences. Returns ``(i, j)`` steps in order; ``None`` marks an unpaired side.

    NPU-only and bench-only steps sit where the alignment puts them (between their paired neighbours).
    """
    sc = _Scorer(npu, bench, fuzzy)
    anchors = _anchors(sc)
    pairs: List[Tuple[int, int]] = []
    pi, pj = 0, 0
    for (ai, aj) in anchors + [(len(npu), len(bench))]:
        pairs.extend(_dp(sc, pi, ai, pj, aj))
        if ai < len(npu):
            pairs.append((ai, aj))
        pi, pj = ai + 1, aj + 1
    steps: List[Tuple[Optional[int], Optional[int]]] = []
    pi, pj = 0, 0
    for (i, j) in pairs + [(len(npu), len(bench))]:
        steps.extend((k, None) for k in range(pi, i))
        steps.extend((None, k) for k in range(pj, j))
        if i < len(npu) or j < len(bench):
            steps.append((i, j))
        pi, pj = i + 1, j + 1
    return steps


def pair_apis(npu_apis: Sequence[ApiRec], bench_apis: Sequence[ApiRec],
              fuzzy: bool = False) -> List[Tuple[Optional[ApiRec], Optional[ApiRec]]]:
    """Align two lists of :class:`ApiRec`; returns ``(npu_api | None, bench_api | None)`` in order."""
    steps = align([signature(a) for a in npu_apis], [signature(b) for b in bench_apis], fuzzy)
    return [(npu_apis[i] if i is not None else None, bench_apis[j] if j is not None else None)
            for i, j in steps]


# ----------------------------------------------------------------------------------- dataflow

#: below this share of the larger side's forward calls paired, the two dumps are different programs
MIN_PAIRED_SHARE = 0.5
#: ... or when, of at least MIN_EDGES dataflow edges that both dumps could show, fewer than this
#: share agree (the producers of a paired call's inputs are paired with each other)
MIN_EDGE_SHARE = 0.5
MIN_EDGES = 20
#: a dump with fewer forward calls than this is never called a different program (too little to tell)
MIN_CALLS = 8
#: reordered calls named in the note at most
MAX_NAMED = 5


@dataclass(frozen=True)
class Pairing:
    """What the pairing of two dumps found besides the steps (``table.attrs["pairing"]``).

    ``reordered``: ``(device forward key, bench forward key)`` of the calls the dataflow repair
    paired differently from the sequence alignment (independent calls run in another order).
    ``paired``/``calls``: paired forward calls, and the larger side's forward calls (both outside
    ``Optimizer.step``: a fused or foreach update and a per-parameter one are the same program);
    ``edges``/``agreeing``: dataflow edges both dumps show (a paired call's input whose producers
    are paired on both sides) and those that agree (0/0: no dataflow recorded).
    """

    paired: int = 0
    calls: int = 0
    edges: int = 0
    agreeing: int = 0
    reordered: Tuple[Tuple[str, str], ...] = ()
    dataflow: bool = False

    @property
    def different_programs(self) -> bool:
        """The two dumps do not align: too few calls pair, or their dataflow disagrees."""
        if self.calls < MIN_CALLS:
            return False
        if self.paired < MIN_PAIRED_SHARE * self.calls:
            return True
        return self.edges >= MIN_EDGES and self.agreeing < MIN_EDGE_SHARE * self.edges

    @property
    def programs_text(self) -> str:
        """The one line that says the two runs are different programs."""
        flow = (f"; {self.agreeing} of {self.edges} dataflow edges agree" if self.edges else "")
        return (f"the two runs are different programs: {self.paired} of {self.calls} forward calls pair{flow}; "
                "the calls cannot be compared one by one (compare dumps of the same model and step)")

    @property
    def reordered_text(self) -> str:
        """The info line of the calls the dataflow paired out of order ("" when none)."""
        if not self.reordered:
            return ""
        named = ", ".join(f"{a} with bench {b}" for a, b in self.reordered[:MAX_NAMED])
        more = f" and {len(self.reordered) - MAX_NAMED} more" if len(self.reordered) > MAX_NAMED else ""
        return (f"{len(self.reordered)} call(s) were reordered between the runs (independent calls made in "
                f"another order), paired by their dataflow: {named}{more}")


class FlowRecord(Protocol):
    """What the dataflow repair reads of a call record (an ``ApiRec``, or a golden's call)."""

    key: str
    direction: str
    sources: Dict[str, Tuple[str, str]]


def _forward(a: FlowRecord) -> bool:
    return a.direction == "forward"


def _counted(a: FlowRecord) -> bool:
    """A forward call outside ``Optimizer.step``: what the different-programs share counts."""
    return a.direction == "forward" and getattr(a, "ctx", "") != "optimizer"


class _Flow:
    """The two dumps' dataflow graphs over forward calls and the current partner of each call."""

    def __init__(self, npu: Sequence[FlowRecord], bench: Sequence[FlowRecord], sn: Sequence[ApiSig],
                 sb: Sequence[ApiSig], steps: Sequence[Tuple[Optional[int], Optional[int]]]):
        self.sn, self.sb = sn, sb
        self.pn = [-1] * len(npu)
        self.pb = [-1] * len(bench)
        for i, j in steps:
            if i is not None and j is not None:
                self.pn[i] = j
                self.pb[j] = i
        self.src_n = _edges(npu)
        self.src_b = _edges(bench)
        self.cons_n = _consumers(self.src_n)
        self.cons_b = _consumers(self.src_b)
        self._ok: Dict[Tuple[int, int], bool] = {}
        #: backward key -> index, of each side (built when a backward record must follow)
        self.bwd_n: Optional[Dict[str, int]] = None
        self.bwd_b: Optional[Dict[str, int]] = None

    def compatible(self, i: int, j: int) -> bool:
        k = (i, j)
        v = self._ok.get(k)
        if v is None:
            v = self._ok[k] = compatible(self.sn[i], self.sb[j])
        return v

    def agree(self, i: int) -> int:
        """How many of device call ``i``'s input edges agree with its partner's."""
        j = self.pn[i]
        if j < 0:
            return 0
        mine, theirs = self.src_n.get(i), self.src_b.get(j)
        if not mine or not theirs:
            return 0
        pn = self.pn
        n = 0
        for slot, (p, os) in mine.items():
            e = theirs.get(slot)
            if e is not None and pn[p] == e[0] and os == e[1]:
                n += 1
        return n

    def local(self, nodes: Sequence[int]) -> int:
        """Agreeing edges into ``nodes`` and into their consumers."""
        seen = set()
        total = 0
        for i in nodes:
            for c in [i] + [c for c, _ in self.cons_n.get(i, ())]:
                if c not in seen:
                    seen.add(c)
                    total += self.agree(c)
        return total

    def swap(self, i: int, j2: int) -> Optional[Tuple[int, int]]:
        """Pair device call ``i`` with bench call ``j2`` and their old partners with each other,
        when both new pairs are compatible; returns ``(old partner of i, old partner of j2)``."""
        j, y = self.pn[i], self.pb[j2]
        if j < 0 or y < 0 or j == j2 or not self.compatible(i, j2) or not self.compatible(y, j):
            return None
        self._set(i, j2, y, j)
        return j, y

    def _set(self, i: int, j2: int, y: int, j: int) -> None:
        self.pn[i], self.pb[j2] = j2, i
        self.pn[y], self.pb[j] = j, y

    def try_swap(self, i: int, j2: int, at_least: int, consumers: bool) -> bool:
        """:meth:`swap` kept when the agreeing edges into the two device calls (and, with
        ``consumers``, out of them) grow by ``at_least``."""
        j, y = self.pn[i], self.pb[j2]
        if j < 0 or y < 0 or j == j2:
            return False
        score = self.local if consumers else (lambda nodes: sum(self.agree(k) for k in nodes))
        before = score((i, y))
        if self.swap(i, j2) is None:
            return False
        if score((i, y)) - before >= at_least:
            return True
        self._set(i, j, y, j2)   # undone
        return False

    def candidates(self, i: int) -> List[int]:
        """Bench calls that consume, at the same slots, what the partners of ``i``'s producers made."""
        out: List[int] = []
        for slot, (p, os) in self.src_n.get(i, {}).items():
            q = self.pn[p]
            if q < 0:
                continue
            for c, s in self.cons_b.get(q, ()):
                if s == slot and self.src_b[c][slot][1] == os and c not in out:
                    out.append(c)
        return out


def _edges(apis: Sequence[FlowRecord]) -> Dict[int, Dict[str, Tuple[int, str]]]:
    """Forward call index -> {input slot: (producer's index, its output slot)} (producers in the dump)."""
    index = {a.key: k for k, a in enumerate(apis) if _forward(a)}
    out: Dict[int, Dict[str, Tuple[int, str]]] = {}
    for k, a in enumerate(apis):
        if a.sources and _forward(a):
            e = {slot: (index[p], os) for slot, (p, os) in a.sources.items() if p in index and index[p] < k}
            if e:
                out[k] = e
    return out


def _consumers(edges: Dict[int, Dict[str, Tuple[int, str]]]) -> Dict[int, List[Tuple[int, str]]]:
    out: Dict[int, List[Tuple[int, str]]] = {}
    for c, e in edges.items():
        for slot, (p, _) in e.items():
            out.setdefault(p, []).append((c, slot))
    return out


def _top_down(flow: _Flow, order: Sequence[int]) -> None:
    """In execution order: a call paired with a bench call that its producers' partners did not
    feed, while one they fed is paired elsewhere, is paired with that one (its old partner goes
    to the other's)."""
    for i in order:
        j = flow.pn[i]
        if j < 0 or i not in flow.src_n:
            continue
        have = flow.agree(i)
        if have == len(flow.src_n[i]):
            continue
        for c in flow.candidates(i):
            if c != j and flow.try_swap(i, c, 1, False):
                break


def _bottom_up(flow: _Flow, order: Sequence[int]) -> None:
    """In reverse execution order: where a paired call's input comes from producers that are not
    paired with each other, they are (their old partners paired together), unless that loses
    agreeing edges: a chain of swapped calls is walked back to where it forks."""
    for i in reversed(order):
        j = flow.pn[i]
        mine = flow.src_n.get(i)
        if j < 0 or not mine:
            continue
        theirs = flow.src_b.get(j)
        if not theirs:
            continue
        for slot, (p, os) in mine.items():
            e = theirs.get(slot)
            if e is None or os != e[1] or flow.pn[p] == e[0]:
                continue
            flow.try_swap(p, e[0], 0, True)


def repair_by_dataflow(npu: Sequence[FlowRecord], bench: Sequence[FlowRecord], sn: Sequence[ApiSig],
                       sb: Sequence[ApiSig], steps: List[Tuple[Optional[int], Optional[int]]]
                       ) -> Tuple[List[Tuple[Optional[int], Optional[int]]], Pairing]:
    """The sequence alignment's ``steps`` repaired by the dataflow both dumps record (each forward
    call's ``ApiRec.sources``), and what the pairing found (:class:`Pairing`).

    Only paired calls change partners, by swaps between compatible calls: a call on one side only
    stays where the alignment put it. Backward records follow their forward call's new partner.
    Dumps without sources (ptdbg's, msprobe's) keep the alignment's steps."""
    # the share that pairs is the model's: the optimizer's update is one program however it is
    # spelled (a fused or foreach kernel over lists against one call per parameter and operation)
    fwd_n = sum(1 for a in npu if _counted(a))
    fwd_b = sum(1 for a in bench if _counted(a))
    paired = sum(1 for i, j in steps if i is not None and j is not None and _counted(npu[i]))
    has_flow = any(a.sources for a in npu) and any(a.sources for a in bench)
    if not has_flow:
        return steps, Pairing(paired, max(fwd_n, fwd_b))
    edges, agreeing = _agreement(npu, bench, steps)
    if edges == agreeing:   # the usual case: the alignment is the dataflow's already
        return steps, Pairing(paired, max(fwd_n, fwd_b), edges, agreeing, (), True)
    flow = _Flow(npu, bench, sn, sb, steps)
    before = list(flow.pn)
    order = sorted(flow.src_n)
    _top_down(flow, order)
    _bottom_up(flow, order)
    _top_down(flow, order)
    reordered = []
    for i, j in enumerate(flow.pn):
        if j != before[i] and _forward(npu[i]) and j >= 0:
            reordered.append((npu[i].key, bench[j].key))
            _follow_backward(flow, npu, bench, i, j)
    edges = agreeing = 0
    for i in order:
        j = flow.pn[i]
        theirs = flow.src_b.get(j) if j >= 0 else None
        if not theirs:
            continue
        for slot, (p, os) in flow.src_n[i].items():
            e = theirs.get(slot)
            if e is None or flow.pn[p] < 0 or flow.pb[e[0]] < 0:
                continue
            edges += 1
            agreeing += int(flow.pn[p] == e[0] and os == e[1])
    if reordered:
        steps = [(i, flow.pn[i]) if i is not None and j is not None else (i, j) for i, j in steps]
    return steps, Pairing(paired, max(fwd_n, fwd_b), edges, agreeing, tuple(reordered), True)


def _agreement(npu: Sequence[FlowRecord], bench: Sequence[FlowRecord],
               steps: Sequence[Tuple[Optional[int], Optional[int]]]) -> Tuple[int, int]:
    """``(edges, agreeing)`` of the pairing ``steps``, by keys (no graph built): an edge is a paired
    forward call's input whose producers are paired calls on both sides; it agrees when they are
    paired with each other and give the same output slot."""
    partner: Dict[str, str] = {}
    pairs: List[Tuple[Dict[str, Tuple[str, str]], Dict[str, Tuple[str, str]]]] = []
    append = pairs.append
    for i, j in steps:
        if i is not None and j is not None:
            a = npu[i]
            if a.direction == "forward":
                b = bench[j]
                partner[a.key] = b.key
                if a.sources and b.sources:
                    append((a.sources, b.sources))
    bench_paired = set(partner.values())
    get = partner.get
    edges = agreeing = 0
    for mine, theirs in pairs:
        for slot, (p, os) in mine.items():
            e = theirs.get(slot)
            if e is not None:
                q = get(p)
                if q is not None and e[0] in bench_paired:
                    edges += 1
                    if q == e[0] and os == e[1]:
                        agreeing += 1
    return edges, agreeing


def _backward_key(key: str) -> str:
    return key[: -len("forward")] + "backward" if key.endswith("_forward") else ""


def _follow_backward(flow: _Flow, npu: Sequence[FlowRecord], bench: Sequence[FlowRecord], i: int, j: int) -> None:
    """The backward record of device call ``i`` pairs with that of its new partner ``j`` (both paired)."""
    kn, kb = _backward_key(npu[i].key), _backward_key(bench[j].key)
    if not kn or not kb:
        return
    if flow.bwd_n is None or flow.bwd_b is None:
        flow.bwd_n = {a.key: k for k, a in enumerate(npu) if not _forward(a)}
        flow.bwd_b = {a.key: k for k, a in enumerate(bench) if not _forward(a)}
    bi, bj = flow.bwd_n.get(kn), flow.bwd_b.get(kb)
    if bi is None or bj is None:
        return
    x, y = flow.pn[bi], flow.pb[bj]
    if x < 0 or y < 0 or x == bj:
        return
    flow._set(bi, bj, y, x)


def pair_dumps(npu_apis: Sequence[ApiRec], bench_apis: Sequence[ApiRec], fuzzy: bool = False
               ) -> Tuple[List[Tuple[Optional[ApiRec], Optional[ApiRec]]], Pairing]:
    """:func:`pair_apis` with the dataflow repair (:func:`repair_by_dataflow`), and its :class:`Pairing`."""
    sn = [signature(a) for a in npu_apis]
    sb = [signature(b) for b in bench_apis]
    steps, moved = pair_leftovers(align(sn, sb, fuzzy), sn, sb)
    steps, report = repair_by_dataflow(npu_apis, bench_apis, sn, sb, steps)
    moved_fwd = tuple((npu_apis[i].key, bench_apis[j].key) for i, j in moved if _forward(npu_apis[i]))
    if moved_fwd:
        report = dataclasses.replace(report, reordered=moved_fwd + report.reordered)
    return [(npu_apis[i] if i is not None else None, bench_apis[j] if j is not None else None)
            for i, j in steps], report


def pair_leftovers(steps: List[Tuple[Optional[int], Optional[int]]], sn: Sequence[ApiSig], sb: Sequence[ApiSig]
                   ) -> Tuple[List[Tuple[Optional[int], Optional[int]]], List[Tuple[int, int]]]:
    """Pair the calls an order-preserving alignment left on one side only because they were made in
    another order (``b = x.sigmoid()`` moved before ``a = x.tanh()``): among the unpaired calls of
    one operation, direction and tensor structure, when both sides have as many, the k-th with the
    k-th. Returns the steps (each new pair where its device call was) and the new pairs; any other
    one-sided call stays where it is."""
    left_n: Dict[Tuple[str, str, tuple], List[int]] = {}
    left_b: Dict[Tuple[str, str, tuple], List[int]] = {}
    for i, j in steps:
        if j is None and i is not None:
            left_n.setdefault((sn[i].family, sn[i].direction, sn[i].structure), []).append(i)
        elif i is None and j is not None:
            left_b.setdefault((sb[j].family, sb[j].direction, sb[j].structure), []).append(j)
    partner: Dict[int, int] = {}
    for k, ii in left_n.items():
        jj = left_b.get(k)
        if jj is not None and len(jj) == len(ii):
            partner.update(zip(ii, jj))
    if not partner:
        return steps, []
    taken = set(partner.values())
    out: List[Tuple[Optional[int], Optional[int]]] = []
    for i, j in steps:
        if i is None and j in taken:
            continue
        if j is None and i is not None and i in partner:
            out.append((i, partner[i]))
            continue
        out.append((i, j))
    return out, sorted(partner.items())
