"""Statistics of one tensor (or Python scalar) for a dump record.

``[max, min, mean, l2norm]`` computed in float32 or wider whatever the tensor's dtype, plus NaN and
Inf counts. Few kernels and one host transfer per tensor: ``aminmax`` + ``sum`` + ``vector_norm``
stacked and read back with one ``.tolist()``; NaN/Inf are counted only when a statistic is not
finite. :class:`StatsCache` remembers the statistics of the last tensors seen (same object, same
``_version``) so that an API's output is not measured again as the next API's input.
"""
from __future__ import annotations

import math
import weakref
from typing import Any, List, NamedTuple, Optional, Tuple

import torch

__all__ = ["TensorStats", "tensor_stats", "scalar_stats", "StatsCache", "is_float_dtype"]

_WIDE = (torch.float32, torch.float64)
_DTYPE_NAMES: dict = {}
#: below this many elements numpy's sum (pairwise) is used, above it torch's
_NUMPY_SUM_MAX = 8192


def _dot(a, b):
    import numpy as np

    with np.errstate(over="ignore", invalid="ignore"):
        return np.dot(a, b)



class TensorStats(NamedTuple):
    """What a record holds about one tensor."""

    dtype: str  # "torch.float32"
    shape: Tuple[int, ...]
    stats: list  # [max, min, mean, l2norm] or [] (empty tensor)
    nan: int
    inf: int


def is_float_dtype(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


def _finite(v: Any) -> bool:
    return isinstance(v, (int, bool)) or math.isfinite(v)


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
    x = t.detach()
    if True:
        if dtype.is_complex:
            x = x.abs()
            dtype_eff = x.dtype
        else:
            dtype_eff = dtype
        if dtype_eff.is_floating_point:
            if dtype_eff not in _WIDE:
                x = x.float()
            if x.device.type == "cpu" and x.is_contiguous():
                # CPU: numpy's max/min and BLAS dot are single passes without dispatch overhead;
                # torch's vectorised sum is faster than numpy's on large arrays
                a = x.numpy().reshape(-1)
                mx_v = float(a.max())
                mn_v = float(a.min())
                s = float(a.sum()) if n < _NUMPY_SUM_MAX else float(x.sum())
                l2 = math.sqrt(float(_dot(a, a))) if mx_v == mx_v else math.nan
            else:
                mn, mx = torch.aminmax(x)
                mx_v, mn_v, s, l2 = torch.stack((mx, mn, x.sum(), torch.linalg.vector_norm(x))).tolist()
            mean = s / n
            nan = inf = 0
            if not (math.isfinite(mx_v) and math.isfinite(mn_v) and math.isfinite(s) and math.isfinite(l2)):
                nan, inf = torch.stack((torch.isnan(x).sum(), torch.isinf(x).sum())).tolist()
                if not inf and not nan:  # finite values whose sum or square sum overflowed
                    l2 = float(torch.linalg.vector_norm(x.double()))
                    s = float(x.sum(dtype=torch.float64))
                    mean = s / n
            return TensorStats(dname, shape, [mx_v, mn_v, mean, l2], int(nan), int(inf))
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


def scalar_stats(v: Any) -> Optional[TensorStats]:
    """A Python number as ptdbg records it: the value four times (None for non-numbers)."""
    if isinstance(v, bool):
        return TensorStats("bool", (), [v, v, v, v], 0, 0)
    if isinstance(v, int):
        return TensorStats("int", (), [v, v, v, abs(v)], 0, 0)
    if isinstance(v, float):
        nan = int(math.isnan(v))
        inf = int(math.isinf(v))
        return TensorStats("float", (), [v, v, v, abs(v)], nan, inf)
    return None


class StatsCache:
    """Statistics of recently measured tensors.

    Keyed by what identifies the data (``data_ptr``, dtype, shape, strides, device), so a view
    object over the same memory (e.g. the gradient autograd hands to the next hook, or ``p.grad``)
    hits too. A hit needs the tensor first measured to be still alive (checked through a weak
    reference: its memory cannot have been reused) and the shared version counter unchanged, so an
    in-place change never returns stale numbers.
    """

    def __init__(self, size: int = 1024) -> None:
        self.size = size
        self._d: dict = {}
        self.hits = 0
        self.misses = 0

    @staticmethod
    def _key(t: torch.Tensor) -> Any:
        return (t.data_ptr(), t.dtype, t.shape, t.stride(), t.device)

    def get(self, t: torch.Tensor) -> Optional[TensorStats]:
        if t.numel() == 0 or t.is_sparse:
            return None
        e = self._d.get(self._key(t))
        if e is not None and e[0]() is not None and e[1] == t._version:
            self.hits += 1
            return e[2]
        return None

    def put(self, t: torch.Tensor, st: TensorStats) -> None:
        if t.numel() == 0 or t.is_sparse:
            return
        if len(self._d) >= self.size:
            self._d.clear()
        try:
            ref = weakref.ref(t)
        except TypeError:
            return
        self._d[self._key(t)] = (ref, t._version, st)

    def stats(self, t: torch.Tensor) -> TensorStats:
        """Cached statistics of ``t``, computing them on a miss."""
        if t.numel() == 0 or t.is_sparse:
            return tensor_stats(t)
        key = (t.data_ptr(), t.dtype, t.shape, t.stride(), t.device)
        e = self._d.get(key)
        if e is not None and e[0]() is not None and e[1] == t._version:
            self.hits += 1
            return e[2]
        self.misses += 1
        st = tensor_stats(t)
        if len(self._d) >= self.size:
            self._d.clear()
        self._d[key] = (weakref.ref(t), t._version, st)
        return st

    def fresh(self, t: torch.Tensor) -> TensorStats:
        """Statistics computed now, replacing any cached entry (for data changed behind autograd's
        back, e.g. by a collective, which does not bump the version counter)."""
        st = tensor_stats(t)
        if t.numel() and not t.is_sparse:
            self._d[(t.data_ptr(), t.dtype, t.shape, t.stride(), t.device)] = (weakref.ref(t), t._version, st)
        return st

    def clear(self) -> None:
        self._d.clear()


#: one cache per process: statistics stay valid across steps (a parameter updated by the
#: optimizer at the end of step k is the same data the model reads at step k+1)
SHARED_CACHE = StatsCache()
