"""Statistics of one tensor (or Python scalar) for a dump record.

``[max, min, mean, l2norm]`` computed in float32 or wider whatever the tensor's dtype, plus NaN and
Inf counts. Few passes and no extra host syncs: on CPU numpy's ``max``/``min``, a sum and a BLAS
dot over the tensor's own memory; elsewhere ``aminmax`` + ``sum`` + ``vector_norm`` stacked and
read back with one ``.tolist()``. NaN/Inf are counted only when a statistic is not finite.
:class:`StatsCache` remembers the statistics of recent tensors (same memory, same ``_version``)
so that an API's output is not measured again as the next API's input, or a parameter updated
by the optimizer again when the next step's forward reads it.
"""
from __future__ import annotations

import collections
import math
import weakref
from typing import Any, NamedTuple, Optional, Tuple

import numpy as np
import torch

__all__ = ["TensorStats", "tensor_stats", "scalar_stats", "StatsCache", "SHARED_CACHE"]

_WIDE = (torch.float32, torch.float64)
_DTYPE_NAMES: dict = {}
_SQ_SAFE = 1e37  # below float32's max (3.4e38) with margin for rounding
#: below this many elements numpy's sum (pairwise) is used, above it torch's
_NUMPY_SUM_MAX = 2048


_F64 = np.float64
_NP_INTS = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
_MAX = np.maximum.reduce
_MIN = np.minimum.reduce
_ADD = np.add.reduce
_DOT = np.dot
_isfinite = math.isfinite
_sqrt = math.sqrt
_float32 = torch.float32


class TensorStats(NamedTuple):
    """What a record holds about one tensor."""

    dtype: str  # "torch.float32"
    shape: Tuple[int, ...]
    stats: list  # [max, min, mean, l2norm] or [] (empty tensor)
    nan: int
    inf: int


def tensor_stats(t: torch.Tensor) -> TensorStats:
    """Statistics of ``t``: floats in float32 or wider, ints exactly (sum in int64), bools as 0/1.

    Empty tensors have empty statistics. Complex tensors are measured on their absolute value.
    Never records autograd history (works under any grad mode) and never changes ``t``.
    """
    dtype = t.dtype
    dname = _DTYPE_NAMES.get(dtype)
    if dname is None:
        dname = _DTYPE_NAMES[dtype] = str(dtype)
    shape = tuple(t.shape)
    n = t.numel()
    if n == 0:
        return TensorStats(dname, shape, [], 0, 0)
    x = t.detach() if t.requires_grad else t
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
        s_v = int(a.sum(dtype=np.int64))
        f = a.astype(np.float64)
        l2 = math.sqrt(float(np.dot(f, f)))
        if dtype == torch.bool:
            return TensorStats(dname, shape, [bool(mx_v), bool(mn_v), s_v / n, l2], 0, 0)
        return TensorStats(dname, shape, [mx_v, mn_v, s_v / n, l2], 0, 0)
    if dtype_eff == torch.bool:
        x = x.to(torch.int64)
    # integers: exact max/min/sum; norm in float64
    mn, mx = torch.aminmax(x)
    s = x.sum(dtype=torch.int64)
    mx_v, mn_v, s_v = torch.stack((mx.to(torch.int64), mn.to(torch.int64), s)).tolist()
    l2 = float(torch.linalg.vector_norm(x.to(torch.float64)))
    if dtype == torch.bool:
        return TensorStats(dname, shape, [bool(mx_v), bool(mn_v), s_v / n, l2], 0, 0)
    return TensorStats(dname, shape, [mx_v, mn_v, s_v / n, l2], 0, 0)


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
    """

    def __init__(self, size: int = 4096, keep_recent: int = 4) -> None:
        self.size = size
        self._d: dict = {}
        # the last few measured tensors are held strongly: autograd passes a gradient on to the
        # next hook as a new view object while the previous one is already gone
        self._recent: Any = collections.deque(maxlen=keep_recent)
        self.hits = 0
        self.misses = 0

    @staticmethod
    def _key(t: torch.Tensor) -> Any:
        return _data_key(t)

    def get(self, t: torch.Tensor) -> Optional[TensorStats]:
        if t.numel() == 0 or t.is_sparse:
            return None
        key = _data_key(t)
        e = self._d.get(key)
        if e is not None and e[1] == t._version and (e[0]() is not None or _owns_grad(e[3], key)):
            self.hits += 1
            return e[2]
        return None

    def put(self, t: torch.Tensor, st: TensorStats) -> None:
        if t.numel() == 0 or t.is_sparse:
            return
        if len(self._d) >= self.size:
            self._prune()
        try:
            ref = weakref.ref(t)
        except TypeError:
            return
        self._d[_data_key(t)] = (ref, t._version, st, None)

    def _lookup(self, t: torch.Tensor) -> Tuple[TensorStats, Any]:
        """``(statistics, key)``; key is None for tensors that are never cached."""
        if t.is_sparse or t.numel() == 0:
            return tensor_stats(t), None
        key = (t.data_ptr(), t.dtype, t.shape, t.stride(), None if t.is_cpu else t.device)
        e = self._d.get(key)
        if e is not None and e[1] == t._version and (e[0]() is not None or _owns_grad(e[3], key)):
            self.hits += 1
            return e[2], key
        self.misses += 1
        st = tensor_stats(t)
        d = self._d
        if len(d) >= self.size:
            self._prune()
        d[key] = (weakref.ref(t), t._version, st, None)
        self._recent.append(t)
        return st, key

    def stats(self, t: torch.Tensor) -> TensorStats:
        """Cached statistics of ``t``, computing them on a miss."""
        if t.is_sparse or t.numel() == 0:
            return tensor_stats(t)
        key = (t.data_ptr(), t.dtype, t.shape, t.stride(), None if t.is_cpu else t.device)
        d = self._d
        e = d.get(key)
        if e is not None and e[1] == t._version and (e[0]() is not None or _owns_grad(e[3], key)):
            self.hits += 1
            return e[2]
        self.misses += 1
        st = tensor_stats(t)
        if len(d) >= self.size:
            self._prune()
        d[key] = (weakref.ref(t), t._version, st, None)
        self._recent.append(t)
        return st

    def grad_stats(self, grad: torch.Tensor, leaf: Any) -> TensorStats:
        """Statistics of a gradient produced for the leaf tensor ``leaf`` (a parameter).

        Autograd hands the gradient object to the hook, then stores (a view of) its memory as
        ``leaf.grad``; the hook's object is gone by the time the optimizer reads ``leaf.grad``.
        The entry stays valid while ``leaf.grad`` still holds that memory (so it cannot have been
        reused) and the version counter is unchanged.
        """
        st, key = self._lookup(grad)
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
        st = tensor_stats(t)
        if t.numel() and not t.is_sparse:
            self._d[_data_key(t)] = (weakref.ref(t), t._version, st, None)
        return st

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
SHARED_CACHE = StatsCache()
