"""Metric kernels for one tensor pair (pure numpy, float64, no torch).

Definitions (ptdbg's, ``n`` = NPU values, ``b`` = bench values, both flattened):

- ``cosine`` = n·b / (‖n‖‖b‖); both norms ~0 -> 1.0; one side all zero -> NaN (undefined);
  a single element -> NaN (unsupported, as in ptdbg).
- ``max_abs_err`` = max |n − b|.
- relative error r = |n − b| / |b|, with a machine eps as denominator where b == 0 (ptdbg's and
  msprobe's rule: float32's eps for fp16/bf16/fp32 bench tensors, which both save as float32;
  float64's for float64 and integers: :func:`zero_eps`); ``max_rel_err`` = max r.
- ``one_thousandth`` / ``five_thousandths``: **pass fractions**, the share of elements with
  r < 0.001 / r < 0.005 (1.0 is good).
- ``rel_l2`` = ‖n − b‖₂ / ‖b‖₂ (0 when both are zero, inf when only b is).
- NaN/Inf: positions (and Inf signs) are compared; where they agree the elements are left out of
  every metric, where they differ ``nan_mismatch`` is set (the pair fails).
- ``tol_fail``: with ``tol=(atol, rtol)``, the number of elements with |n − b| > atol + rtol·|b|
  (the ``torch.testing.assert_close`` test), used by the dtype-aware verdict.

Speed: arrays are processed in blocks of :data:`BLOCK` elements through preallocated float64
buffers (per thread); sums of squares are BLAS dot products over DOT_SLICE slices, added per
:data:`CHUNK` in order, so every value is independent of BLOCK. NaN/Inf handling only runs for
chunks whose sums are not finite; b == 0 gets its eps denominator branch-free; ``.npy`` files are
streamed (:class:`~pytest_ptdbg.dump.npy.NpyStream`), so memory stays at a few blocks whatever
the tensor size. Threads: numpy holds the GIL in the BLAS dot, the float32 -> float64 copy and
``count_nonzero``, so a second worker thread gains little (measured per op in
benchmarks/bench_compare.py's notes).
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Optional, Sequence, Tuple, Union

import numpy as np

from pytest_ptdbg.runtime.dtypes import FLOATS, short_name

if TYPE_CHECKING:  # pragma: no cover
    from numpy.typing import ArrayLike

    from pytest_ptdbg.dump.npy import NpyStream

#: a record's statistics as the dump holds them (``[max, min, mean, l2norm]``: numbers, or strings
#: such as ``"inf"``; anything else is not a number)
Stats = Optional[Sequence[object]]

#: the summation unit: sums of squares are taken per CHUNK elements (as slices of DOT_SLICE) and
#: added to the totals chunk by chunk, in order, so the results do not depend on BLOCK
CHUNK = 1 << 15
#: elements read and processed per numpy call (a multiple of CHUNK): fewer, larger calls
BLOCK = 4 * CHUNK
THOUSANDTH = 0.001
FIVE_THOUSANDTHS = 0.005
_F64_EPS = FLOATS["float64"].eps

#: machine eps by record dtype (``runtime/dtypes.py``)
DTYPE_EPS = {f"torch.{d}": FLOATS[short_name(d)].eps
             for d in ("float16", "half", "bfloat16", "float32", "float", "float64", "double")}


def dtype_eps(dtype: Optional[str]) -> float:
    """Machine eps of a record dtype (``"torch.float16"`` ...); float64's for int/bool/unknown."""
    if dtype is None:
        return _F64_EPS
    d = dtype if dtype.startswith("torch.") else "torch." + dtype
    return DTYPE_EPS.get(d, _F64_EPS)


_F32_EPS = FLOATS["float32"].eps
#: record dtypes whose zero-bench denominator is float32's eps (ptdbg and msprobe read them as float32)
_F32_ZERO_EPS = {"float16", "half", "bfloat16", "float32", "float"}


def zero_eps(dtype: Optional[str]) -> float:
    """The denominator of the relative error where the bench value is 0, for a bench record dtype.

    ptdbg and msprobe compare fp16/bf16 tensors as float32 arrays and add float32's eps there (not
    the 16-bit dtype's, which would make the relative error of a value next to a zero 16 to 64000
    times smaller); float64 gets its own eps; integers, bool and unknown dtypes float64's.
    """
    d = (dtype or "").replace("torch.", "")
    if d.startswith("<class '") and d.endswith("'>"):
        d = d[len("<class '"):-2]
    return _F32_EPS if d in _F32_ZERO_EPS else _F64_EPS


@dataclass
class PairMetrics:
    """Metrics of one tensor pair; NaN where a metric is undefined (see ``message``)."""

    cosine: float = math.nan
    max_abs_err: float = math.nan
    max_rel_err: float = math.nan
    one_thousandth: float = math.nan
    five_thousandths: float = math.nan
    rel_l2: float = math.nan
    nan_mismatch: bool = False
    shape_mismatch: bool = False
    npu_nonfinite: int = 0
    bench_nonfinite: int = 0
    tol_fail: Optional[int] = None
    #: "NPU" or "bench" when that side is all zeros and the other is not (cosine undefined)
    zero_side: str = ""
    compared: int = 0
    size: int = 0
    message: str = ""


class _Acc:
    __slots__ = ("nn", "bb", "nb", "dd", "mabs", "mrel", "c1", "c5", "tolf", "cnt",
                 "nf_n", "nf_b", "mismatch", "size")

    def __init__(self) -> None:
        self.nn = self.bb = self.nb = self.dd = 0.0
        self.mabs = self.mrel = -math.inf
        self.c1 = self.c5 = self.tolf = self.cnt = self.nf_n = self.nf_b = self.size = 0
        self.mismatch = False


class _Work(threading.local):
    def __init__(self) -> None:
        self.x = np.empty(BLOCK)
        self.y = np.empty(BLOCK)
        self.d = np.empty(BLOCK)
        self.r = np.empty(BLOCK)
        self.m = np.empty(BLOCK, dtype=bool)
        self.raw: Dict[Tuple[str, int], np.ndarray] = {}

    def raw_buf(self, dtype: np.dtype, slot: int) -> np.ndarray:
        key = (dtype.str, slot)
        buf = self.raw.get(key)
        if buf is None:
            buf = self.raw[key] = np.empty(BLOCK, dtype=dtype)
        return buf


_WORK = _Work()


#: OpenBLAS runs a dot product on several threads above 10000 elements; on a busy 2-core machine
#: those threads cost far more than they give, so sums are taken over slices of this many elements.
DOT_SLICE = 8192
_PER_CHUNK = CHUNK // DOT_SLICE


def _dots(a: np.ndarray, b: np.ndarray) -> list:
    """a·b per CHUNK of elements (the last one may be short), each summed over DOT_SLICE slices in order."""
    n = len(a)
    if n <= DOT_SLICE:
        return [float(np.dot(a, b))]
    # One batched call: (m,1,S) @ (m,S,1) runs one BLAS dot of DOT_SLICE elements per slice (below
    # the threading threshold); the slice results are then added in order per CHUNK, exactly as a
    # Python loop over slices would, without ~2 us of Python per slice.
    q = n - n % DOT_SLICE
    vals = np.matmul(a[:q].reshape(-1, 1, DOT_SLICE), b[:q].reshape(-1, DOT_SLICE, 1)).ravel().tolist()
    if q < n:
        vals.append(float(np.dot(a[q:], b[q:])))
    out = []
    for i in range(0, len(vals), _PER_CHUNK):
        s = 0.0
        for v in vals[i:i + _PER_CHUNK]:
            s += v
        out.append(s)
    return out


def _add(total: float, parts: list) -> float:
    for v in parts:
        total += v
    return total


_maxr = np.maximum.reduce
_minr = np.minimum.reduce


def _finite_chunk(acc: _Acc, x, y, d, r, m, eps: float, tol, nn=None, bb=None) -> None:
    """Accumulate a block known (or assumed) to be finite. ``y`` is overwritten.

    ``nn``/``bb``: the per-CHUNK sums of squares (:func:`_dots`) when already known.
    Call under ``np.errstate(divide="ignore", invalid="ignore")``.
    """
    k = len(x)
    acc.cnt += k
    acc.nn = _add(acc.nn, _dots(x, x) if nn is None else nn)
    acc.bb = _add(acc.bb, _dots(y, y) if bb is None else bb)
    acc.nb = _add(acc.nb, _dots(x, y))
    np.subtract(x, y, out=d)
    acc.dd = _add(acc.dd, _dots(d, d))
    np.abs(d, out=d)
    mabs = float(_maxr(d))
    if mabs > acc.mabs:
        acc.mabs = mabs
    if mabs == 0.0:  # identical chunk: every relative error is 0, every tolerance test passes
        if acc.mrel < 0.0:
            acc.mrel = 0.0
        acc.c1 += k
        acc.c5 += k
        return
    np.abs(y, out=y)
    if tol is not None:
        atol, rtol = tol
        np.multiply(y, rtol, out=r)
        r += atol
        acc.tolf += int(np.count_nonzero(np.greater(d, r, out=m)))
    if _minr(y) == 0.0:
        # some b == 0 -> ptdbg's eps denominator there. Branch-free (a boolean-indexed write
        # costs ~8 ns per element on a half-zero ReLU output): y += eps * (y == 0), exact since
        # y + 0.0 == y and 0.0 + eps == eps, so d / y is d / eps exactly where b == 0.
        np.equal(y, 0.0, out=m)
        np.multiply(m, eps, out=r)
        np.add(y, r, out=y)
    np.divide(d, y, out=r)
    mrel = float(_maxr(r))
    if mrel > acc.mrel:
        acc.mrel = mrel
    if mrel < THOUSANDTH:
        acc.c1 += k
        acc.c5 += k
        return
    acc.c1 += int(np.count_nonzero(np.less(r, THOUSANDTH, out=m)))
    acc.c5 += k if mrel < FIVE_THOUSANDTHS else int(np.count_nonzero(np.less(r, FIVE_THOUSANDTHS, out=m)))


def _chunk(acc: _Acc, x, y, d, r, m, eps: float, tol) -> None:
    """Accumulate a block of at most BLOCK elements (CHUNK by CHUNK where it holds NaN/Inf)."""
    nn = _dots(x, x)
    bb = _dots(y, y)
    if all(p + q < math.inf for p, q in zip(nn, bb)):  # fast path: every value finite
        acc.size += len(x)
        _finite_chunk(acc, x, y, d, r, m, eps, tol, nn, bb)
        return
    for j, i in enumerate(range(0, len(x), CHUNK)):
        e = i + CHUNK
        _small_chunk(acc, x[i:e], y[i:e], d[i:e], r[i:e], m[i:e], eps, tol, nn[j], bb[j])


def _small_chunk(acc: _Acc, x, y, d, r, m, eps: float, tol, nn: float, bb: float) -> None:
    k = len(x)
    acc.size += k
    if nn + bb < math.inf:
        _finite_chunk(acc, x, y, d, r, m, eps, tol, [nn], [bb])
        return
    fx = np.isfinite(x)
    fy = np.isfinite(y)
    acc.nf_n += int(k - np.count_nonzero(fx))
    acc.nf_b += int(k - np.count_nonzero(fy))
    if not np.array_equal(fx, fy):
        acc.mismatch = True
    else:
        bad = ~fx
        xb, yb = x[bad], y[bad]
        same = (xb == yb) | (np.isnan(xb) & np.isnan(yb))
        if not bool(same.all()):
            acc.mismatch = True
    both = fx & fy
    xs, ys = x[both], y[both]
    n = len(xs)
    if n:
        _finite_chunk(acc, xs, ys, d[:n], r[:n], m[:n], eps, tol)


def _flat(a) -> np.ndarray:
    a = np.asarray(a)
    return a.reshape(-1)


def _run(acc: _Acc, src_n, src_b, size: int, eps: float, tol) -> None:
    """Feed chunks from two sources (flat arrays or NpyStreams) through the accumulator."""
    w = _WORK
    x, y, d, r, m = w.x, w.y, w.d, w.r, w.m
    is_arr_n = isinstance(src_n, np.ndarray)
    is_arr_b = isinstance(src_b, np.ndarray)
    raw_n = None if is_arr_n else w.raw_buf(src_n.dtype, 0)
    raw_b = None if is_arr_b else w.raw_buf(src_b.dtype, 1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        _loop(acc, src_n, src_b, size, eps, tol, x, y, d, r, m, is_arr_n, is_arr_b, raw_n, raw_b)


def _loop(acc, src_n, src_b, size, eps, tol, x, y, d, r, m, is_arr_n, is_arr_b, raw_n, raw_b) -> None:
    pos = 0
    while pos < size:
        k = min(BLOCK, size - pos)
        xv, yv = x[:k], y[:k]
        if is_arr_n:
            np.copyto(xv, src_n[pos:pos + k], casting="unsafe")
        else:
            src_n.read_into(raw_n[:k])
            np.copyto(xv, raw_n[:k], casting="unsafe")
        if is_arr_b:
            np.copyto(yv, src_b[pos:pos + k], casting="unsafe")
        else:
            src_b.read_into(raw_b[:k])
            np.copyto(yv, raw_b[:k], casting="unsafe")
        _chunk(acc, xv, yv, d[:k], r[:k], m[:k], eps, tol)
        pos += k


def _finish(acc: _Acc, size: int) -> PairMetrics:
    out = PairMetrics(size=size, npu_nonfinite=acc.nf_n, bench_nonfinite=acc.nf_b,
                      nan_mismatch=acc.mismatch, compared=acc.cnt)
    msgs = []
    if acc.mismatch:
        msgs.append("position of inf or nan do not match")
    elif acc.nf_n:
        msgs.append(f"{acc.nf_n} NaN/Inf at the same positions on both sides (left out)")
    if size == 0:
        out.message = "empty tensor: nothing to compare"
        return out
    if acc.cnt == 0:
        msgs.append("no finite element to compare")
        out.message = "; ".join(msgs)
        return out
    out.max_abs_err = acc.mabs
    out.max_rel_err = acc.mrel
    out.one_thousandth = acc.c1 / acc.cnt
    out.five_thousandths = acc.c5 / acc.cnt
    out.tol_fail = acc.tolf
    nrm_n, nrm_b = math.sqrt(acc.nn), math.sqrt(acc.bb)
    out.rel_l2 = math.sqrt(acc.dd) / nrm_b if nrm_b > 0 else (0.0 if acc.dd == 0 else math.inf)
    if size == 1:
        msgs.append("scalar: cosine not supported")
    elif nrm_n < _F64_EPS and nrm_b < _F64_EPS:
        out.cosine = 1.0
    elif nrm_n < _F64_EPS:
        msgs.append("all zeros on the NPU side: cosine undefined")
        out.zero_side = "NPU"
    elif nrm_b < _F64_EPS:
        msgs.append("all zeros on the bench side: cosine undefined")
        out.zero_side = "bench"
    else:
        out.cosine = cosine_from_sums(acc.nb, acc.nn, acc.bb, acc.dd)
    out.message = "; ".join(msgs)
    return out


def cosine_from_sums(nb: float, nn: float, bb: float, dd: float = math.nan) -> float:
    """Cosine n·b / (‖n‖‖b‖) from the sums n·b, ‖n‖², ‖b‖² (and ‖n − b‖², when known).

    Computed from n·b itself, never as (‖n‖² + ‖b‖² − ‖n − b‖²) / 2‖n‖‖b‖, which cancels when the
    norms differ (n = b·1e-15 gave 0.78). Identical data (``dd == 0``) is exactly 1.0; the norms'
    product is formed as sqrt(‖n‖²)·sqrt(‖b‖²) so it neither overflows nor underflows; the result
    is clamped to [-1, 1]; NaN when a sum is not finite. Both norms must be > 0.
    """
    if dd == 0.0:
        return 1.0
    c = nb / (math.sqrt(nn) * math.sqrt(bb))
    if not math.isfinite(c):
        return math.nan
    return min(1.0, max(-1.0, c))


def shape_mismatch(npu_shape: Sequence[int], bench_shape: Sequence[int]) -> PairMetrics:
    """The metrics row of a pair whose shapes differ (ptdbg's "Unmatched")."""
    return PairMetrics(shape_mismatch=True,
                       message=f"shape changed (Unmatched): NPU {list(npu_shape)} vs bench {list(bench_shape)}")


def compare_arrays(npu: ArrayLike, bench: ArrayLike, eps: Optional[float] = None,
                   tol: Optional[Tuple[float, float]] = None) -> PairMetrics:
    """All metrics of one pair of arrays (any numeric/bool dtype), chunked, in float64.

    ``eps``: denominator where bench == 0 (default: :func:`zero_eps` of the bench array's dtype:
    float32's for float16/float32, float64's for float64, int and bool). ``tol``: optional
    ``(atol, rtol)`` for ``tol_fail``.
    """
    n, b = np.asarray(npu), np.asarray(bench)
    if n.shape != b.shape:
        return shape_mismatch(n.shape, b.shape)
    if eps is None:
        eps = zero_eps(b.dtype.name) if b.dtype.kind == "f" else _F64_EPS
    acc = _Acc()
    _run(acc, _flat(n), _flat(b), n.size, eps, tol)
    return _finish(acc, n.size)


def compare_streams(src_n: Union[np.ndarray, NpyStream], src_b: Union[np.ndarray, NpyStream], eps: float,
                    tol: Optional[Tuple[float, float]] = None) -> PairMetrics:
    """Like :func:`compare_arrays` for two sources with ``.size``/``.shape``: flat arrays or NpyStreams."""
    if tuple(src_n.shape) != tuple(src_b.shape):
        return shape_mismatch(src_n.shape, src_b.shape)
    size = int(src_n.size)
    acc = _Acc()
    a = _flat(src_n) if isinstance(src_n, np.ndarray) else src_n
    b = _flat(src_b) if isinstance(src_b, np.ndarray) else src_b
    _run(acc, a, b, size, eps, tol)
    return _finish(acc, size)


# A single-metric helper (a thin wrapper, for tests and interactive use).

def cosine(npu: ArrayLike, bench: ArrayLike) -> float:
    return compare_arrays(npu, bench).cosine


def _rel(a: float, b: float) -> float:
    if b == 0:
        return 0.0 if a == 0 else math.inf
    return abs(a - b) / abs(b)


def summary_diffs(npu_stats: Stats, bench_stats: Stats) -> Tuple[float, float, float, float]:
    """Summary compare: (max, min, mean, l2norm) differences NPU − bench; NaN where unknown."""
    out = []
    for i in range(4):
        a = stat_at(npu_stats, i)
        b = stat_at(bench_stats, i)
        out.append(a - b if a is not None and b is not None else math.nan)
    return out[0], out[1], out[2], out[3]


def summary_rel_l2(npu_stats: Stats, bench_stats: Stats) -> float:
    """Relative L2-norm difference |‖n‖ − ‖b‖| / ‖b‖ from the statistics; NaN when unknown."""
    a, b = stat_at(npu_stats, 3), stat_at(bench_stats, 3)
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return math.nan
    return _rel(a, b)


def stat_at(stats: Stats, i: int) -> Optional[float]:
    """Statistic ``i`` of ``[max, min, mean, l2norm]`` as a float; None when absent or not a number."""
    if not stats or len(stats) <= i:
        return None
    v = stats[i]
    if type(v) is float:   # the common case first
        return v
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def summary_diffs_rel_l2(npu: np.ndarray, bench: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """:func:`summary_diffs` and :func:`summary_rel_l2` of many rows at once: ``(m, 4)`` float64
    statistics (every one present) -> ``(diffs (m, 4), rel_l2 (m,))``, the same values."""
    n = np.asarray(npu, dtype=np.float64)
    b = np.asarray(bench, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        diffs = n - b
        a3, b3 = n[:, 3], b[:, 3]
        rel = np.abs(a3 - b3) / np.abs(b3)
        rel = np.where(b3 == 0, np.where(a3 == 0, 0.0, math.inf), rel)
        rel = np.where(np.isfinite(a3) & np.isfinite(b3), rel, math.nan)
    return diffs, rel
