"""Own error against a budget: the numerical kernels of the judge. Pure numpy, no torch.

For one output tensor of one call, replayed from the device's recorded inputs:

* ``device``: what the device recorded; ``oracle``: the call in float64; ``reference``: the call in
  its compute dtype (what a correct kernel in that dtype makes on the same inputs).
* own error = ‖device − oracle‖₂; reference error = ‖reference − oracle‖₂ (over the elements
  finite in all three).
* budget = max(FACTOR × reference error, floor), floor = FLOOR_UNITS × u × max(‖oracle‖₂,
  s_in × √n) (none when the reference reproduces the oracle exactly and the result only selects
  values of its inputs, ``rounds`` False: getitem, cat, relu, an exact cast give it exactly; a
  sum whose reference happens to be exact, such as a bias gradient of bf16-valued gradients, is
  still rounded by a kernel that adds in another order, ``rounds`` True), where u is the unit roundoff
  of the compute dtype and s_in the smallest RMS among the call's floating inputs (a correct kernel's
  result is never more exact than one rounding at the scale of what it was computed from: a
  mathematically-zero bias gradient of ~1e-11 is judged against its inputs' scale, not by its
  relative error; ``finfo.min`` mask values are not data).
* the call is a root cause for this output when own error > budget, or when the device has NaN/Inf
  that neither the reference nor the oracle has at the same places (``masked_fill(-inf)`` and
  causal masks produce them in every replay too).

A correct kernel of another device may sum in another order or use another algorithm, whose error
the CPU reference's does not bound (a blocked sequential sum of 4 096 terms is ~9x a pairwise one's).
So where the judge knows the call's algorithm family (``own_error.py``: GEMMs and convolutions by
their contraction length, reductions and normalisations by their reduction length, libm-style
functions), the budget is also at least a bound *derived* for every correct kernel of that family
(:func:`order_bound`, :func:`libm_bound`), computed in the compute dtype's accumulator
(:func:`accumulator_roundoff`: float32 for bf16/fp16, whose own rounding the reference's term
already covers).

FACTOR is below the benchmark's resolution (a fault smaller than 4x the correct kernel's error is
"below resolution"), so every resolvable fault exceeds its budget, while a correct kernel of
another device (another summation order) stays within FACTOR times the CPU reference's error.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Tuple, Union

import numpy as np

from pytest_ptdbg.runtime.dtypes import COMPLEX_PARTS, FLOATS

__all__ = ["FACTOR", "FLOOR_UNITS", "ORDER_UNITS", "LIBM_ULPS", "WINOGRAD_UNITS", "order_bound", "libm_bound",
           "accumulator_roundoff", "unit_roundoff", "OutputCheck", "check_output", "finite_norms", "judged",
           "input_rms_decided", "rms_bound", "check_exact", "selects_inputs",
           "check_indices", "check_dropout", "has_duplicates", "rms"]

#: a correct kernel's error is at most this many times the reference kernel's (< the benchmark's 4)
FACTOR = 3.0
#: the floor of a budget, in units of the compute dtype's rounding
FLOOR_UNITS = 1.0

#: :func:`order_bound` in units of sqrt(n) u S (about 3.5 standard deviations of a random walk of
#: roundings each at most u x the largest partial sum: ``benchmarks/bench_alt_kernels.py``)
ORDER_UNITS = 2.0
#: libm-style functions (exp, tanh, gelu...): a correct kernel is within this many ulps
LIBM_ULPS = 2.0
#: Winograd F(2x2, 3x3) rounds its transforms too: its error bound is this many times a direct 3x3 sum's
WINOGRAD_UNITS = 4.0

#: unit roundoff by torch dtype name (``runtime/dtypes.py``; a complex dtype's is its parts')
_UNIT = {**{f"torch.{n}": f.unit_roundoff for n, f in FLOATS.items()},
         **{f"torch.{c}": FLOATS[part].unit_roundoff for c, part in COMPLEX_PARTS.items()}}
_F32_UNIT = FLOATS["float32"].unit_roundoff

_TINY = {f"torch.{n}": FLOATS[n].tiny for n in ("float16", "bfloat16", "float32", "float64")}


def subnormal_spacing(dtype: str) -> float:
    """The spacing of a dtype's subnormal numbers (smallest normal x 2u): the absolute rounding
    of values below its normal range (float16: 6e-8)."""
    name = dtype if str(dtype).startswith("torch.") else f"torch.{dtype}"
    return _TINY.get(name, FLOATS["float32"].tiny) * 2 * unit_roundoff(name)


def unit_roundoff(dtype: str) -> float:
    """Unit roundoff u = eps / 2 of a torch dtype name (``"torch.bfloat16"`` -> 2**-8); float32's
    for anything unknown."""
    name = dtype if str(dtype).startswith("torch.") else f"torch.{dtype}"
    return _UNIT.get(name, _F32_UNIT)


def accumulator_roundoff(dtype: str) -> float:
    """Unit roundoff of the accumulator a correct kernel of compute dtype ``dtype`` sums in:
    float32's for bfloat16/float16 (and anything coarser), the dtype's own when finer."""
    return min(unit_roundoff(dtype), _F32_UNIT)


def order_bound(n: int, u: float, magnitude: float, units: float = ORDER_UNITS) -> float:
    """The error, in L2 over the outputs, that a sum of ``n`` terms per output stays within in
    *any* order (sequential, blocked, pairwise, split into chunks): ``units x sqrt(n - 1) x u x
    magnitude``, where ``magnitude`` is (a bound of) the L2 norm over the outputs of each output's
    sum of |terms|. Every partial sum any order forms is at most that sum, each of the n - 1
    additions rounds by at most u of its partial sum, and roundings of random sign add as a
    random walk (sqrt(n - 1)); the deterministic bound (n - 1) u would hide faults."""
    if n <= 1 or magnitude <= 0 or not math.isfinite(magnitude):
        return 0.0
    return units * math.sqrt(n - 1) * u * magnitude


def libm_bound(scale: float, u: float, ulps: float = LIBM_ULPS) -> float:
    """The error, in L2, of a libm-style function within ``ulps`` ulps of its exact values, whose
    L2 norm is ``scale``: an ulp at x is at most 2u|x|, so ``ulps x 2u x scale``."""
    return ulps * 2.0 * u * scale if scale > 0 and math.isfinite(scale) else 0.0


#: magnitudes at or above this are masks (``torch.finfo(dtype).min`` fills), not data
SENTINEL = 1e30
#: a sum of squares below this has no element at or above SENTINEL (with room for rounding)
_ALL_DATA = 1e59


def rms(a: np.ndarray) -> float:
    """Root mean square over the finite elements below :data:`SENTINEL` in magnitude (0.0 for
    none): the scale of a tensor's data, not of the ``finfo.min`` values masking it."""
    a = np.asarray(a)
    if a.size and a.dtype.kind == "f":
        # one pass when every element is data: a sum of squares below 1e59 means no element is
        # NaN/Inf or a mask; the same pairwise sum np.mean makes, so the same number
        with np.errstate(over="ignore", invalid="ignore"):
            tot = np.add.reduce(np.square(a, dtype=np.float64).ravel())
        if tot < _ALL_DATA:
            return float(np.sqrt(tot / a.size))
    a = np.asarray(a, dtype=np.float64).ravel()
    a = a[np.isfinite(a) & (np.abs(a) < SENTINEL)]
    return float(np.sqrt(np.mean(a * a))) if a.size else 0.0


@dataclass
class OutputCheck:
    """The judgement of one output tensor."""

    key: str
    own: float            # ‖device − oracle‖₂ (inf: NaN/Inf of its own)
    reference: float      # ‖reference − oracle‖₂
    budget: float
    scale: float          # ‖oracle‖₂
    nonfinite_origin: bool = False
    note: str = ""

    @property
    def ratio(self) -> float:
        """own / budget (inf for a NaN/Inf origin; 0 when both are 0)."""
        if self.nonfinite_origin or math.isinf(self.own):
            return math.inf
        if self.budget > 0:
            return self.own / self.budget
        return 0.0 if self.own == 0 else math.inf

    @property
    def relative(self) -> float:
        """own error relative to the oracle's norm."""
        if math.isinf(self.own):
            return math.inf
        return self.own / self.scale if self.scale > 0 else (0.0 if self.own == 0 else math.inf)

    @property
    def over(self) -> bool:
        return self.ratio > 1.0


def _nonfinite_pattern(a: np.ndarray) -> np.ndarray:
    """0 where finite, 1 NaN, 2 +inf, 3 -inf."""
    out = np.zeros(a.shape, dtype=np.int8)
    out[np.isnan(a)] = 1
    out[np.isposinf(a)] = 2
    out[np.isneginf(a)] = 3
    return out


def check_output(key: str, device: np.ndarray, oracle: np.ndarray, reference: np.ndarray, dtype: str,
                 input_rms: float = 0.0, factor: float = FACTOR, floor_units: float = FLOOR_UNITS,
                 rounds: Union[bool, Callable[[], bool]] = False,
                 kernels: Union[float, Callable[[float], float]] = 0.0) -> OutputCheck:
    """Judge one floating output (see the module docstring). Arrays of one shape, any float dtype.
    ``rounds`` (see :func:`judged`) may be a function, asked only when the device differs from a
    reference that reproduces the oracle exactly (the only case where it changes the verdict)."""
    fast = finite_norms(device, oracle, reference)
    if fast is not None:
        own, ref = fast[0], fast[1]
        return judged(key, *fast, dtype, input_rms, factor, floor_units, rounds=_ask(rounds, own, ref),
                      kernels=kernels(fast[2]) if callable(kernels) else kernels)
    d = np.asarray(device, dtype=np.float64)
    o = np.asarray(oracle, dtype=np.float64)
    r = np.asarray(reference, dtype=np.float64)
    fd, fo, fr = np.isfinite(d), np.isfinite(o), np.isfinite(r)
    origin = False
    if not fd.all():
        pd_ = _nonfinite_pattern(d)
        bad = pd_ != 0
        # a NaN/Inf the reference or the oracle has at the same place is not the device's own
        explained = (pd_ == _nonfinite_pattern(r)) | (pd_ == _nonfinite_pattern(o))
        origin = bool((bad & ~explained).any())
    mask = fd & fo & fr
    if not mask.all():
        d, o, r = d[mask], o[mask], r[mask]
    own = float(np.linalg.norm((d - o).ravel()))
    ref = float(np.linalg.norm((r - o).ravel()))
    scale = float(np.linalg.norm(o.ravel()))
    return judged(key, own, ref, scale, d.size, dtype, input_rms, factor, floor_units, origin,
                  _ask(rounds, own, ref), kernels(scale) if callable(kernels) else kernels)


def _ask(rounds: Union[bool, Callable[[], bool]], own: float, ref: float) -> bool:
    if not callable(rounds):
        return bool(rounds)
    return ref == 0 and own > 0 and bool(rounds())


def judged(key: str, own: float, ref: float, scale: float, n: int, dtype: str, input_rms: float = 0.0,
           factor: float = FACTOR, floor_units: float = FLOOR_UNITS, origin: bool = False,
           rounds: bool = False, kernels: float = 0.0) -> OutputCheck:
    """The check of one output from its norms (``n``: the elements they were taken over).
    ``rounds``: the result is computed, not selected from the inputs (see the module docstring):
    the floor holds even when the reference reproduces the oracle exactly. ``kernels``: the error
    every correct kernel of the call's algorithm family stays within (:func:`order_bound`,
    :func:`libm_bound`; 0: not known), the budget's least value."""
    u = unit_roundoff(dtype)
    # a reference that reproduces the oracle exactly (getitem, cat, relu, an exact cast) of a
    # result selected from its inputs: a correct kernel gives it exactly, so there is no floor
    floor = floor_units * u * max(scale, input_rms * math.sqrt(max(n, 1))) if (ref > 0 or rounds) else 0.0
    budget = max(factor * ref, floor, kernels)
    return OutputCheck(key, math.inf if origin else own, ref, budget, scale, origin,
                       "NaN/Inf where the reference replay has none" if origin else "")


def input_rms_decided(bound: Optional[float], ref: float, scale: float, n: int, dtype: str,
                      factor: float = FACTOR, floor_units: float = FLOOR_UNITS, rounds: bool = False) -> bool:
    """Whether any input RMS at most ``bound`` gives the budget :func:`judged` gives with
    ``bound`` itself: no floor (``ref`` 0), the oracle's norm above ``bound`` x sqrt(n), or a floor
    at ``bound`` still within ``factor`` x ``ref`` (the floor only grows with the RMS)."""
    if ref <= 0 and not rounds:
        return True
    if bound is None:
        return False
    at = bound * math.sqrt(max(n, 1))
    return at <= scale or floor_units * unit_roundoff(dtype) * max(scale, at) <= factor * ref


def rms_bound(own: float, scale: float, n: int) -> Optional[float]:
    """An upper bound of :func:`rms` of a device output from its check's norms (‖device − oracle‖
    ``own``, ‖oracle‖ ``scale``, all ``n`` elements finite): ‖device‖ <= own + scale, with room for
    the norms' rounding; None unless every element is provably data (own + scale < 1e29, below
    :data:`SENTINEL`) and the RMS provably positive (own < scale)."""
    if n <= 0 or not own < scale or not own + scale < 1e29:
        return None
    return (own + scale) / math.sqrt(n) * (1.0 + 1e-6 + n * 1e-15)


def selects_inputs(result: np.ndarray, inputs: Sequence[np.ndarray], numbers: Sequence[float] = ()) -> bool:
    """Whether every finite value of ``result`` is 0, one of ``numbers`` (the call's scalar
    arguments) or a value of one of ``inputs``: a result a kernel selects (getitem, cat, relu,
    masked_fill, where), not one it computes and rounds."""
    r = np.asarray(result, dtype=np.float64).ravel()
    r = r[np.isfinite(r)]
    if not r.size:
        return True
    pool = [np.asarray(a, dtype=np.float64).ravel() for a in inputs if np.asarray(a).dtype.kind in "fiub"]
    pool.append(np.asarray([0.0] + [float(x) for x in numbers], dtype=np.float64))
    return bool(np.isin(r, np.concatenate(pool)).all())


def finite_norms(device: np.ndarray, oracle: np.ndarray,
                 reference: np.ndarray) -> Optional[Tuple[float, float, float, int]]:
    """``(‖device − oracle‖₂, ‖reference − oracle‖₂, ‖oracle‖₂, n)`` when every element of the
    three is finite (finite squared norms say so: a NaN/Inf makes its sum NaN/Inf), else None.
    Differences are taken in float64 straight from the arrays' own dtypes (the same numbers as
    converting first) and each norm is ``sqrt(x·x)``, as ``np.linalg.norm`` computes it."""
    d, o, r = np.asarray(device), np.asarray(oracle), np.asarray(reference)
    if d.dtype.kind != "f" or o.dtype.kind != "f" or r.dtype.kind != "f":
        return None
    with np.errstate(over="ignore", invalid="ignore"):   # an overflow only sends it element-wise
        ov = o.astype(np.float64, copy=False).reshape(-1)   # C order, as ravel()
        s2 = ov.dot(ov)
        if not math.isfinite(s2):
            return None
        e = d.astype(np.float64).reshape(-1)       # widened first: faster than a mixed subtraction
        np.subtract(e, ov, out=e)
        own2 = e.dot(e)
        if not math.isfinite(own2):
            return None
        np.copyto(e, r.reshape(-1))                # the same buffer: one allocation
        np.subtract(e, ov, out=e)
        ref2 = e.dot(e)
        if not math.isfinite(ref2):
            return None
    return float(np.sqrt(own2)), float(np.sqrt(ref2)), float(np.sqrt(s2)), int(o.size)


def check_exact(key: str, device: np.ndarray, oracle: np.ndarray, reference: np.ndarray,
                factor: float = FACTOR) -> OutputCheck:
    """Integer or bool outputs: own = number of elements differing from the oracle."""
    own = float(np.count_nonzero(np.asarray(device) != np.asarray(oracle)))
    ref = float(np.count_nonzero(np.asarray(reference) != np.asarray(oracle)))
    return OutputCheck(key, own, ref, factor * ref, float(np.asarray(oracle).size),
                       note="elements differ" if own > factor * ref else "")


def check_indices(key: str, device_idx: np.ndarray, oracle_idx: np.ndarray, values: np.ndarray,
                  dim: Optional[int]) -> OutputCheck:
    """Index outputs of argmax/topk/sort-like calls: an index is right when the input value it
    points to equals the one the oracle's index points to (ties are not errors)."""
    di = np.asarray(device_idx).astype(np.int64)
    oi = np.asarray(oracle_idx).astype(np.int64)
    v = np.asarray(values, dtype=np.float64)
    if di.shape != oi.shape:
        return OutputCheck(key, math.inf, 0.0, 0.0, 0.0, note="index shapes differ")
    if np.array_equal(di, oi):
        return OutputCheck(key, 0.0, 0.0, 0.0, float(di.size))
    try:
        if dim is None or v.ndim == 0:
            flat = v.ravel()
            a, b = flat[np.clip(di, 0, flat.size - 1)], flat[np.clip(oi, 0, flat.size - 1)]
        else:
            ax = dim % v.ndim
            if di.ndim != v.ndim:  # keepdim=False: put the reduced axis back
                di, oi = np.expand_dims(di, ax), np.expand_dims(oi, ax)
            n = v.shape[ax]
            a = np.take_along_axis(v, np.clip(di, 0, n - 1), ax)
            b = np.take_along_axis(v, np.clip(oi, 0, n - 1), ax)
    except (ValueError, IndexError):
        return OutputCheck(key, math.inf, 0.0, 0.0, 0.0, note="indices could not be checked")
    wrong = float(np.count_nonzero(~((a == b) | (np.isnan(a) & np.isnan(b)))))
    return OutputCheck(key, wrong, 0.0, 0.0, float(di.size),
                       note="indices point to other values" if wrong else "ties resolved differently")


def check_dropout(key: str, produced: np.ndarray, source: np.ndarray, p: float, dtype: str) -> OutputCheck:
    """Dropout, structurally: every element of ``produced`` is 0 or ``source / (1 - p)``, within a
    few roundings of ``dtype``. ``own`` counts the elements that are neither."""
    out_, src_ = np.asarray(produced), np.asarray(source)
    if out_.shape != src_.shape:
        return OutputCheck(key, math.inf, 0.0, 0.0, 0.0, note="shape differs from its input")
    flat_out, flat_src = out_.reshape(-1), src_.reshape(-1)
    wrong = 0
    # element by element, so in cache-sized pieces (the same count as over the whole)
    for i in range(0, max(flat_out.size, 1), _CHUNK):
        out = flat_out[i:i + _CHUNK].astype(np.float64)
        if p >= 1.0:
            wrong += int(np.count_nonzero(out != 0))
            continue
        src = flat_src[i:i + _CHUNK].astype(np.float64)
        kept = src / (1.0 - p)
        tol = (4 * unit_roundoff(dtype) * (np.abs(kept) + np.abs(src))
               + 4 * subnormal_spacing(dtype))  # values below the normal range round absolutely
        ok = (out == 0) | (np.abs(out - kept) <= tol) | (np.isnan(out) & np.isnan(src))
        wrong += int(np.count_nonzero(~ok))
    return OutputCheck(key, float(wrong), 0.0, 0.0, float(out_.size),
                       note="elements neither 0 nor input/(1-p)" if wrong else "")


#: elements per piece of an element-wise check (a few hundred KB of float64: stays in cache)
_CHUNK = 1 << 15


def has_duplicates(index: np.ndarray, dim: Optional[int]) -> bool:
    """Whether an index tensor repeats a value along ``dim`` at some position (scatter targets)."""
    idx = np.asarray(index)
    if idx.ndim == 0 or idx.size < 2:
        return False
    if dim is None:
        flat = np.sort(idx.ravel())
        return bool((flat[1:] == flat[:-1]).any())
    rows = np.moveaxis(idx, dim % idx.ndim, -1).reshape(-1, idx.shape[dim % idx.ndim])
    s = np.sort(rows, axis=1)
    return bool((s[:, 1:] == s[:, :-1]).any())


def worst(checks: Sequence[OutputCheck]) -> Optional[OutputCheck]:
    """The check with the largest own/budget ratio."""
    return max(checks, key=lambda c: c.ratio) if checks else None
