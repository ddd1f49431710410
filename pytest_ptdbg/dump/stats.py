"""Statistics of one tensor (or Python scalar) for a dump record.

``[max, min, mean, l2norm]`` computed in float32 or wider whatever the tensor's dtype, plus NaN and
Inf counts. Few passes and no extra host syncs: on CPU numpy's ``max``/``min``, a sum and a BLAS
dot over the tensor's own memory (a tensor of a million elements or more chunk by chunk, each
chunk read once into cache for all four); elsewhere ``aminmax`` + ``sum`` + ``vector_norm`` stacked and
read back with one ``.tolist()``. NaN/Inf are counted only when a statistic is not finite.
Tensor kinds the fast paths cannot read (sparse, quantized, nested, meta, unsigned 16-64 bit...)
are summarised by :func:`special_stats` as far as they can be, with a ``note`` saying how; measuring
a tensor never raises.
:class:`StatsCache` remembers the statistics of recent tensors (same memory, same ``_version``)
so that an API's output is not measured again as the next API's input, or a parameter updated
by the optimizer again when the next step's forward reads it. Only tensors whose version counter
can be trusted are cached (see :class:`StatsCache`).
"""
from __future__ import annotations

import collections
import math
import weakref
from typing import Any, NamedTuple, Optional, Tuple

import numpy as np
import torch

__all__ = ["TensorStats", "tensor_stats", "special_stats", "scalar_stats", "batch_stats", "batch_stat_columns",
           "BATCH_DTYPES", "StatsCache", "SHARED_CACHE"]

_WIDE = (torch.float32, torch.float64)
_DTYPE_NAMES: dict = {}
_SQ_SAFE = 1e37  # below float32's max (3.4e38) with margin for rounding
#: below this many elements numpy's sum (pairwise) is used, above it torch's
_NUMPY_SUM_MAX = 2048


_F64 = np.float64
_NP_INTS = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64) + tuple(
    getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n))
_UINT64 = getattr(torch, "uint64", None)
_MAX = np.maximum.reduce
_MIN = np.minimum.reduce
_ADD = np.add.reduce
_DOT = np.dot
_isfinite = math.isfinite
_sqrt = math.sqrt
_float32 = torch.float32
_STRIDED = torch.strided
#: the debugger's statistics never run under the user's autocast: it would cast (``torch.cat`` of
#: float16 snapshots under a bfloat16 autocast raises) and change the numbers
_any_autocast = torch._C._is_any_autocast_enabled
_DisableAutocast = torch._C._DisableAutocast


class TensorStats(NamedTuple):
    """What a record holds about one tensor."""

    dtype: str  # "torch.float32"
    shape: Tuple[int, ...]
    stats: list  # [max, min, mean, l2norm] or [] (empty tensor, or a kind without readable data)
    nan: int
    inf: int
    note: str = ""  # how a tensor of a special kind was summarised (the record's extra["note"])


def tensor_stats(t: torch.Tensor) -> TensorStats:
    """Statistics of ``t``: floats in float32 or wider, ints exactly (sum in int64), bools as 0/1.

    Empty tensors have empty statistics. Complex tensors are measured on their absolute value.
    Never records autograd history (works under any grad mode), never changes ``t`` and never
    raises: a kind of tensor the fast paths cannot read goes to :func:`special_stats`. Runs outside
    the user's autocast (see :data:`_any_autocast`).
    """
    if _any_autocast():
        with _DisableAutocast():
            return tensor_stats(t)
    try:
        return _dense_stats(t)
    except Exception as e:  # sparse, quantized, nested, meta, a dtype a kernel lacks...
        return special_stats(t, e)


def _dense_stats(t: torch.Tensor) -> TensorStats:
    dtype = t.dtype
    dname = _DTYPE_NAMES.get(dtype)
    if dname is None:
        dname = _DTYPE_NAMES[dtype] = str(dtype)
    shape = tuple(t.shape)
    n = t.numel()
    if n == 0:
        return TensorStats(dname, shape, [], 0, 0)
    x = t.detach() if t.requires_grad else t
    if n >= CHUNKED_MIN and dtype in _CHUNK_DTYPES and x.is_cpu and x.is_contiguous() and not x.is_neg():
        st = _chunked_stats(x, dname, shape, n)
        if st is not None:
            return st
    if dtype in _WIDE and x.is_cpu and x.is_contiguous() and not x.is_neg() and not x.is_conj():
        # the common case, with as few calls as possible: numpy's max/min and BLAS dot are
        # single passes without dispatch overhead; torch's vectorised sum is faster than numpy's
        # on large arrays
        if n == 1:
            return _one(dname, shape, float(x.item()))
        a = x.numpy().reshape(-1)
        mx_v = float(_MAX(a))
        mn_v = float(_MIN(a))
        if n < _NUMPY_SUM_MAX and dtype is _float32:
            s = float(_ADD(a, dtype=_F64))  # float64 accumulation: exact enough, no overflow
        else:
            s = float(x.sum())
        big = mx_v if mx_v >= -mn_v else -mn_v
        if big * big * n < _SQ_SAFE:  # the float32 square sum cannot overflow (False for NaN)
            l2 = _sqrt(float(_DOT(a, a)))
            if _isfinite(s):
                return TensorStats(dname, shape, [mx_v, mn_v, s / n, l2], 0, 0)
        else:  # NaN, Inf or huge values: float64 (no numpy overflow warning)
            l2 = float(torch.linalg.vector_norm(x, dtype=torch.float64))
        return _nonfinite(x, dname, shape, n, mx_v, mn_v, s, l2)
    if dtype.is_complex:
        x = x.abs()
        dtype_eff = x.dtype
    else:
        dtype_eff = dtype
    if dtype_eff.is_floating_point:
        if dtype_eff not in _WIDE:
            x = x.float()
        if n == 1:
            return _one(dname, shape, float(x.item()))
        if x.device.type == "cpu" and x.is_contiguous():
            a = x.numpy().reshape(-1)
            mx_v = float(_MAX(a))
            mn_v = float(_MIN(a))
            if n < _NUMPY_SUM_MAX and x.dtype == torch.float32:
                s = float(_ADD(a, dtype=_F64))
            else:
                s = float(x.sum())
            big = max(abs(mx_v), abs(mn_v))
            if big * big * n < _SQ_SAFE:
                l2 = _sqrt(float(_DOT(a, a)))
            else:
                l2 = float(torch.linalg.vector_norm(x, dtype=torch.float64))
        else:
            mn, mx = torch.aminmax(x)
            mx_v, mn_v, s, l2 = torch.stack((mx, mn, x.sum(), torch.linalg.vector_norm(x))).tolist()
        return _nonfinite(x, dname, shape, n, mx_v, mn_v, s, l2)
    if x.device.type == "cpu" and dtype_eff in _NP_INTS:
        # integers and bools: exact max/min/sum, norm in float64
        a = x.numpy().reshape(-1)
        if dtype_eff == torch.bool:
            a = a.view(np.uint8)
        mx_v = int(_MAX(a))
        mn_v = int(_MIN(a))
        s_v = float(a.sum(dtype=_F64)) if dtype_eff == _UINT64 else int(a.sum(dtype=np.int64))
        f = a.astype(np.float64)
        l2 = math.sqrt(float(np.dot(f, f)))
        if dtype == torch.bool:
            return TensorStats(dname, shape, [bool(mx_v), bool(mn_v), s_v / n, l2], 0, 0)
        return TensorStats(dname, shape, [mx_v, mn_v, s_v / n, l2], 0, 0)
    if dtype_eff == torch.bool:
        x = x.to(torch.int64)
    # integers: exact max/min/sum; norm in float64
    mn, mx = torch.aminmax(x)
    total = x.sum(dtype=torch.int64)
    mx_v, mn_v, s_v = torch.stack((mx.to(torch.int64), mn.to(torch.int64), total)).tolist()
    l2 = float(torch.linalg.vector_norm(x.to(torch.float64)))
    if dtype == torch.bool:
        return TensorStats(dname, shape, [bool(mx_v), bool(mn_v), s_v / n, l2], 0, 0)
    return TensorStats(dname, shape, [mx_v, mn_v, s_v / n, l2], 0, 0)


#: tensors of at least this many elements are measured chunk by chunk (:func:`_chunked_stats`)
CHUNKED_MIN = 1 << 20
#: elements per chunk: 1 MiB of float32, well inside L2 (4 MiB here)
CHUNK = 1 << 18
_CHUNK_DTYPES = frozenset((torch.float32, torch.float64, torch.float16, torch.bfloat16))


def _chunked_stats(x: torch.Tensor, dname: str, shape: Tuple[int, ...], n: int) -> Optional[TensorStats]:
    """Statistics of a large dense contiguous CPU floating tensor, one chunk of :data:`CHUNK`
    elements at a time: max, min, sum and square sum of a chunk are read while it is in cache,
    so memory is read once instead of four times (a 51 M-element float32 tensor: 100 ms whole,
    52 ms in chunks, here), and bf16/fp16 are widened a chunk at a time (no float32 copy of the
    whole tensor). Chunk sums and square sums (float32 BLAS dot products of 2^18 elements) are
    added in float64: the norm's relative error is ~1e-7, where one float32 dot product over 51 M
    elements was 2e-4 off. None when a statistic is not finite (NaN, Inf, or a square sum that
    could overflow float32): the whole-tensor path counts and recomputes those."""
    flat = x.reshape(-1)
    widen = flat.dtype not in _WIDE
    maxes = []
    mins = []
    s = 0.0
    sq = 0.0
    for i in range(0, n, CHUNK):
        ct = flat[i:i + CHUNK]
        if widen:
            ct = ct.float()
        c = ct.numpy()
        cmx = float(_MAX(c))
        cmn = float(_MIN(c))
        big = cmx if cmx >= -cmn else -cmn
        if not big * big * c.size < _SQ_SAFE:  # NaN, Inf or values whose squares overflow float32
            return None
        maxes.append(cmx)
        mins.append(cmn)
        s += float(ct.sum())
        sq += float(_DOT(c, c))
    if not (_isfinite(s) and _isfinite(sq)):
        return None
    return TensorStats(dname, shape, [max(maxes), min(mins), s / n, _sqrt(sq)], 0, 0)


#: dtypes :func:`batch_stats` measures (floating types; every other dtype goes to :func:`tensor_stats`)
BATCH_DTYPES = frozenset((torch.float32, torch.float64, torch.float16, torch.bfloat16))


def batch_stats(tensors: list, names: list, shapes: list) -> list:
    """Statistics of many small dense CPU floating tensors at once (one pass per statistic over
    their concatenation): ``[TensorStats, ...]`` in the order given.

    ``tensors`` are non-empty tensors of :data:`BATCH_DTYPES` (private snapshots: they are read
    only), ``names``/``shapes`` their recorded dtype names and shapes. Max and min are exact;
    sum and square sum accumulate in float64 (so no finite float32/16 value overflows); NaN and
    Inf are counted only in tensors whose statistics are not finite, as :func:`tensor_stats` does.
    """
    mx, mn, mean, l2, nan, inf, _ = batch_stat_columns(tensors)
    return [TensorStats(names[i], shapes[i], [mx[i], mn[i], mean[i], l2[i]], nan[i], inf[i])
            for i in range(len(tensors))]


def batch_stat_columns(tensors: list) -> Tuple[list, list, list, list, list, list, list]:
    """:func:`batch_stats` as columns: ``(max, min, mean, l2norm, nan, inf, finite)``, one list
    entry per tensor (``finite``: all four statistics are finite), without a record object each.
    Runs outside the user's autocast."""
    if _any_autocast():
        with _DisableAutocast():
            return batch_stat_columns(tensors)
    n_all = len(tensors)
    mx_o: list = [0.0] * n_all
    mn_o: list = [0.0] * n_all
    mean_o: list = [0.0] * n_all
    l2_o: list = [0.0] * n_all
    nan_o: list = [0] * n_all
    inf_o: list = [0] * n_all
    ok_o: list = [True] * n_all
    groups: dict = {}
    for i, t in enumerate(tensors):
        g = groups.get(t.dtype)
        if g is None:
            g = groups[t.dtype] = []
        g.append(i)
    single = len(groups) == 1
    for dtype, idx in groups.items():
        flat, counts = _concat(tensors if single else [tensors[i] for i in idx])
        if dtype not in _WIDE:
            flat = flat.float()
        a = flat.numpy()
        starts = np.zeros(len(idx), dtype=np.int64)
        np.cumsum(counts[:-1], out=starts[1:])
        mx = np.maximum.reduceat(a, starts)
        mn = np.minimum.reduceat(a, starts)
        a64 = a.astype(np.float64) if a.dtype != np.float64 else a
        with np.errstate(all="ignore"):
            s = np.add.reduceat(a64, starts)
            sq = np.add.reduceat(a64 * a64, starts)
            l2 = np.sqrt(sq)
            mean = s / counts
        bad = ~(np.isfinite(mx) & np.isfinite(mn) & np.isfinite(s) & np.isfinite(l2))
        if single:
            mx_o, mn_o, mean_o, l2_o = mx.tolist(), mn.tolist(), mean.tolist(), l2.tolist()
        else:
            for col, vals in ((mx_o, mx), (mn_o, mn), (mean_o, mean), (l2_o, l2)):
                for i, v in zip(idx, vals.tolist()):
                    col[i] = v
        if bad.any():
            nans = np.add.reduceat(np.isnan(a).astype(np.int64), starts).tolist()
            infs = np.add.reduceat(np.isinf(a).astype(np.int64), starts).tolist()
            for j, b in enumerate(bad.tolist()):
                if b:
                    i = idx[j]
                    nan_o[i] = int(nans[j])
                    inf_o[i] = int(infs[j])
                    ok_o[i] = False
    return mx_o, mn_o, mean_o, l2_o, nan_o, inf_o, ok_o


def _concat(parts: list) -> Tuple[torch.Tensor, np.ndarray]:
    """The elements of same-dtype tensors one after the other in a 1-D tensor (each in its
    row-major order, as ``t.reshape(-1)`` gives them), and each one's element count.

    Tensors whose shapes agree after the first dimension go through one ``torch.cat`` (0-d ones
    through one ``torch.stack``) instead of a ``reshape`` each: a per-tensor call costs more than
    copying a small tensor's elements."""
    n = len(parts)
    if n == 1:
        t = parts[0]
        return t.reshape(-1), np.array([t.numel()], dtype=np.int64)
    shapes = [t.shape for t in parts]
    first = shapes[0]
    tail = first[1:]
    if all(s[1:] == tail and len(s) == len(first) for s in shapes):
        flat = torch.stack(parts) if not first else torch.cat(parts)
        if first and len(first) > 1:
            flat = flat.reshape(-1)
        if not first:
            counts = np.ones(n, dtype=np.int64)
        else:
            inner = 1
            for d in tail:
                inner *= d
            counts = np.fromiter((s[0] * inner for s in shapes), dtype=np.int64, count=n)
        return flat, counts
    # mixed shapes: one cat per shape class, then the pieces put back in their order
    classes: dict = {}
    for i, s in enumerate(shapes):
        classes.setdefault((len(s), s[1:]), []).append(i)
    pieces: list = [None] * n
    for members in classes.values():
        sub = [parts[i] for i in members]
        if len(sub) == 1:
            pieces[members[0]] = sub[0].reshape(-1)
            continue
        flat_c, counts_c = _concat(sub)
        for i, piece in zip(members, torch.split(flat_c, counts_c.tolist())):
            pieces[i] = piece
    counts = np.fromiter((p.numel() for p in pieces), dtype=np.int64, count=n)
    return torch.cat(pieces), counts


def dtype_name(dtype: Any) -> str:
    """``"torch.float32"`` for ``torch.float32`` (cached)."""
    d = _DTYPE_NAMES.get(dtype)
    if d is None:
        d = _DTYPE_NAMES[dtype] = str(dtype)
    return d


def _one(dname: str, shape: Tuple[int, ...], v: float) -> TensorStats:
    """A one-element floating tensor: the value four times (its absolute value as the norm)."""
    return TensorStats(dname, shape, [v, v, v, abs(v)], int(v != v), int(v == v and not _isfinite(v)))


def _nonfinite(x: torch.Tensor, dname: str, shape: Tuple[int, ...], n: int, mx_v: float, mn_v: float,
               s: float, l2: float) -> TensorStats:
    """Finish the statistics of a floating tensor; NaN/Inf are counted only when a statistic is
    not finite (finite values whose sum or square sum overflowed are summed again in float64)."""
    mean = s / n
    nan = inf = 0
    if not (_isfinite(mx_v) and _isfinite(mn_v) and _isfinite(s) and _isfinite(l2)):
        nan, inf = torch.stack((torch.isnan(x).sum(), torch.isinf(x).sum())).tolist()
        if not inf and not nan:  # finite values whose sum or square sum overflowed
            l2 = float(torch.linalg.vector_norm(x.double()))
            s = float(x.sum(dtype=torch.float64))
            mean = s / n
    return TensorStats(dname, shape, [mx_v, mn_v, mean, l2], int(nan), int(inf))


_SPARSE = tuple(getattr(torch, n) for n in ("sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc")
                if hasattr(torch, n))


def special_stats(t: torch.Tensor, error: Optional[BaseException] = None) -> TensorStats:
    """Statistics of a tensor the dense fast paths cannot read, as far as they can be known.

    Sparse: exact dense statistics from the stored values and the implicit zeros. Quantized: of the
    dequantized values. Nested: over all components' values (shape ``[]``). Non-CPU dtypes a
    kernel lacks: of a CPU copy. Meta tensors and anything else: empty statistics. ``note`` says
    which; never raises.
    """
    try:
        dname = str(t.dtype)
    except Exception:  # pragma: no cover - every tensor has a dtype
        dname = "unknown"
    try:
        shape = tuple(t.shape)
    except Exception:  # nested tensors have no single shape
        shape = ()
    try:
        x = t.detach()
        if x.is_meta:
            return TensorStats(dname, shape, [], 0, 0, "meta tensor: no data")
        if x.is_nested:
            parts = [c.reshape(-1) for c in x.unbind()]
            st = _dense_stats(torch.cat(parts)) if parts else TensorStats(dname, (), [], 0, 0)
            return TensorStats(dname, (), st.stats, st.nan, st.inf,
                               f"nested tensor of {len(parts)} components: statistics over all their values")
        if x.layout in _SPARSE:
            return _sparse_stats(x, dname, shape)
        if x.is_quantized:
            st = _dense_stats(x.dequantize())
            return TensorStats(dname, shape, st.stats, st.nan, st.inf,
                               "quantized: statistics of the dequantized values")
        if x.device.type != "cpu":
            st = _dense_stats(x.cpu())
            return TensorStats(dname, shape, st.stats, st.nan, st.inf, st.note)
    except Exception as e:
        error = e
    why = f"{type(error).__name__}: {error}" if error is not None else "unsupported tensor kind"
    return TensorStats(dname, shape, [], 0, 0, "not summarised (" + why.splitlines()[0][:160] + ")")


def _sparse_stats(x: torch.Tensor, dname: str, shape: Tuple[int, ...]) -> TensorStats:
    """Dense statistics of a sparse tensor: stored values plus the zeros they leave out."""
    if x.layout == torch.sparse_coo:
        x = x.coalesce()  # duplicate indices add up
    vals = x.values()
    n = x.numel()
    note = f"{str(x.layout).replace('torch.', '')}: statistics of the dense tensor"
    if n == 0:
        return TensorStats(dname, shape, [], 0, 0, note)
    nv = vals.numel()
    if nv == 0:
        z = False if x.dtype == torch.bool else 0
        return TensorStats(dname, shape, [z, z, 0.0, 0.0], 0, 0, note)
    st = _dense_stats(vals.reshape(-1))
    mx_v, mn_v, mean, l2 = st.stats
    if nv < n:  # implicit zeros
        zero = False if x.dtype == torch.bool else 0
        mx_v = mx_v if mx_v >= zero or mx_v != mx_v else zero
        mn_v = mn_v if mn_v <= zero or mn_v != mn_v else zero
    return TensorStats(dname, shape, [mx_v, mn_v, mean * nv / n, l2], st.nan, st.inf, note)


_SCALARS: dict = {}


def scalar_stats(v: Any) -> Optional[TensorStats]:
    """A Python number as ptdbg records it: the value four times (None for non-numbers).

    The same number gives the same (shared, immutable) object, so its record text is cached too.
    """
    tv = type(v)
    if tv is int or tv is bool or (tv is float and v != 0.0):  # -0.0 == 0.0: not a cache key
        key = (tv, v)
        st = _SCALARS.get(key)
        if st is None:
            st = _scalar_stats(v)
            if len(_SCALARS) >= 4096:
                _SCALARS.clear()
            _SCALARS[key] = st
        return st
    return _scalar_stats(v)


def _scalar_stats(v: Any) -> Optional[TensorStats]:
    if isinstance(v, bool):
        return TensorStats("bool", (), [v, v, v, v], 0, 0)
    if isinstance(v, int):
        return TensorStats("int", (), [v, v, v, abs(v)], 0, 0)
    if isinstance(v, float):
        nan = int(math.isnan(v))
        inf = int(math.isinf(v))
        return TensorStats("float", (), [v, v, v, abs(v)], nan, inf)
    return None


def _data_key(t: torch.Tensor) -> tuple:
    """What identifies a tensor's data: any view object over the same memory has the same key."""
    return (t.data_ptr(), t.dtype, t.shape, t.stride(), None if t.is_cpu else t.device)


def _owns_grad(owner_ref: Any, key: tuple) -> bool:
    """Whether the leaf behind ``owner_ref`` still holds the memory ``key`` names as its ``.grad``."""
    if owner_ref is None:
        return False
    owner = owner_ref()
    if owner is None:
        return False
    g = owner.grad
    return g is not None and g.data_ptr() == key[0] and g.dtype == key[1] and g.shape == key[2] \
        and g.stride() == key[3]


class StatsCache:
    """Statistics of recently measured tensors.

    Keyed by what identifies the data (``data_ptr``, dtype, shape, strides, device), so a view
    object over the same memory (e.g. the gradient autograd hands to the next hook, or ``p.grad``)
    hits too. A hit needs the tensor first measured to be still alive (checked through a weak
    reference: its memory cannot have been reused) and the shared version counter unchanged, so an
    in-place change never returns stale numbers. When ``size`` entries are reached, the entries
    that can no longer hit are dropped first, so the parameters stay cached from one step to the
    next even in models with thousands of API calls per step.

    Only tensors whose version counter can be trusted are cached: strided, not inference tensors
    (they have no version counter), and at least ``min_numel`` elements (small tensors are cheap to
    measure again, and small state such as BatchNorm's running statistics is what kernels update
    without a version bump). Data changed behind the counter's back is dropped with :meth:`forget`.
    ``last_hit`` says whether the last :meth:`stats`/:meth:`grad_stats` call was a hit: only then
    may a writer reuse a file saved earlier for the same data.
    """

    def __init__(self, size: int = 4096, keep_recent: int = 4, min_numel: int = 1) -> None:
        self.size = size
        self.min_numel = max(1, int(min_numel))
        self._d: dict = {}
        # the last few measured tensors are held strongly: autograd passes a gradient on to the
        # next hook as a new view object while the previous one is already gone
        self._recent: Any = collections.deque(maxlen=keep_recent)
        self.hits = 0
        self.misses = 0
        self.last_hit = False

    def _ident(self, t: torch.Tensor) -> Any:
        """``(key, version)``, or None for a tensor that is never cached."""
        try:
            if t.layout is not _STRIDED or t.numel() < self.min_numel or t.is_nested:
                return None
            return _data_key(t), t._version  # inference tensors raise here: no version counter
        except Exception:
            return None

    def _lookup(self, t: torch.Tensor, hold: bool = True) -> Tuple[TensorStats, Any]:
        """``(statistics, key)``; key is None for tensors that are never cached. ``hold``: keep
        ``t`` among the recent tensors (held strongly, see ``__init__``)."""
        ident = self._ident(t)
        if ident is None:
            self.last_hit = False
            return tensor_stats(t), None
        key, ver = ident
        d = self._d
        e = d.get(key)
        if e is not None and e[1] == ver and (e[0]() is not None or _owns_grad(e[3], key)):
            self.hits += 1
            self.last_hit = True
            return e[2], key
        self.misses += 1
        self.last_hit = False
        st = tensor_stats(t)
        if len(d) >= self.size:
            self._prune()
        try:
            d[key] = (weakref.ref(t), ver, st, None)
        except TypeError:
            return st, None
        if hold:
            self._recent.append(t)
        return st, key

    def peek(self, t: torch.Tensor) -> Optional[TensorStats]:
        """Cached statistics of ``t`` or None (no computing; sets :attr:`last_hit`)."""
        ident = self._ident(t)
        if ident is not None:
            e = self._d.get(ident[0])
            if e is not None and e[1] == ident[1] and (e[0]() is not None or _owns_grad(e[3], ident[0])):
                self.hits += 1
                self.last_hit = True
                return e[2]
        self.last_hit = False
        return None

    def put(self, key: tuple, ref: Any, version: int, st: TensorStats) -> None:
        """Remember ``st`` as the statistics of the data ``key`` (see :meth:`data_key`) at
        ``version`` while the tensor behind the weak reference ``ref`` lives (measured later from
        a snapshot taken at that version, so a hit needs the version unchanged)."""
        d = self._d
        if len(d) >= self.size:
            self._prune()
        d[key] = (ref, version, st, None)

    @staticmethod
    def data_key(t: torch.Tensor) -> tuple:
        """The cache's key of ``t``'s data."""
        return _data_key(t)

    def stats(self, t: torch.Tensor) -> TensorStats:
        """Cached statistics of ``t``, computing them on a miss (sets :attr:`last_hit`)."""
        return self._lookup(t)[0]

    def grad_stats(self, grad: torch.Tensor, leaf: Any) -> TensorStats:
        """Statistics of a gradient produced for the leaf tensor ``leaf`` (a parameter).

        Autograd hands the gradient object to the hook, then stores (a view of) its memory as
        ``leaf.grad``; the hook's object is gone by the time the optimizer reads ``leaf.grad``.
        The entry stays valid while ``leaf.grad`` still holds that memory (so it cannot have been
        reused) and the version counter is unchanged. Such a gradient is not held strongly: a
        reference autograd does not expect makes ``AccumulateGrad`` copy the gradient into a new
        ``leaf.grad`` instead of taking it (a copy of the data plain torch never makes, and a
        ``.grad`` this entry then cannot vouch for).
        """
        st, key = self._lookup(grad, hold=leaf is None)
        if leaf is not None and key is not None:
            e = self._d.get(key)
            if e is not None and e[2] is st:
                try:
                    self._d[key] = (e[0], e[1], st, weakref.ref(leaf))
                except TypeError:
                    pass
        return st

    def fresh(self, t: torch.Tensor) -> TensorStats:
        """Statistics computed now, replacing any cached entry (for data changed behind autograd's
        back, e.g. by a collective, which does not bump the version counter)."""
        self.last_hit = False
        st = tensor_stats(t)
        ident = self._ident(t)
        if ident is not None:
            try:
                self._d[ident[0]] = (weakref.ref(t), ident[1], st, None)
            except TypeError:
                pass
        return st

    def forget(self, t: Any) -> None:
        """Drop the entry of ``t``'s data (written without a version bump, e.g. BatchNorm's
        running statistics inside ``batch_norm``)."""
        try:
            self._d.pop(_data_key(t), None)
        except Exception:
            pass

    def _prune(self) -> None:
        """Full: forget the entries that can no longer hit (tensor and owning leaf gone); when
        most entries are still valid, forget everything."""
        d = self._d
        dead = [k for k, e in d.items() if e[0]() is None and (e[3] is None or e[3]() is None)]
        for k in dead:
            del d[k]
        if len(d) >= self.size * 3 // 4:
            d.clear()

    def clear(self) -> None:
        self._d.clear()
        self._recent.clear()


#: one cache per process: statistics stay valid across steps (a parameter updated by the
#: optimizer at the end of step k is the same data the model reads at step k+1)
SHARED_CACHE = StatsCache(min_numel=256)
