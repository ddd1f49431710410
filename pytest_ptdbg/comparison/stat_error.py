"""The range-scaled statistics error, once: how far a tensor's statistics are from the bench's,
relative to the tensor's range. Pure functions over numpy arrays (no pandas, no torch).

A tensor's *range* is ``max(|max|, |min|)``; its *statistics difference* the largest of its
``|max|``, ``|min|`` and ``|mean|`` differences; the *error* a difference over a scale
(:func:`range_scaled`). The advisor's row errors, the judgement's statistics causes and first
differing input, and ``assert_precision``'s "would have passed with" tolerance all use these.
"""
from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["value_range", "largest_difference", "range_scaled", "scaled_one"]


@np.errstate(invalid="ignore")
def value_range(vmax: np.ndarray, vmin: np.ndarray, *, finite_only: bool = False) -> np.ndarray:
    """``max(|vmax|, |vmin|)`` per row. NaN is ignored (NaN only when both are); with
    ``finite_only`` a non-finite value counts as 0 (the summary verdict's scale), else an infinite
    one makes the range infinite."""
    a, b = np.abs(np.asarray(vmax, dtype=float)), np.abs(np.asarray(vmin, dtype=float))
    if finite_only:
        return np.maximum(np.where(np.isfinite(a), a, 0.0), np.where(np.isfinite(b), b, 0.0))
    return np.fmax(a, b)


@np.errstate(invalid="ignore")
def largest_difference(dmax: np.ndarray, dmin: np.ndarray, dmean: np.ndarray) -> np.ndarray:
    """``max(|dmax|, |dmin|, |dmean|)`` per row, NaN ignored (NaN only when all three are)."""
    return np.fmax(np.fmax(np.abs(np.asarray(dmax, dtype=float)), np.abs(np.asarray(dmin, dtype=float))),
                   np.abs(np.asarray(dmean, dtype=float)))


@np.errstate(invalid="ignore", divide="ignore")
def range_scaled(diff: ArrayLike, scale: ArrayLike, *, when_zero: float = 1.0) -> np.ndarray:
    """``diff / scale`` where ``scale > 0``; where it is not (a zero tensor, an unknown scale):
    ``when_zero`` for a positive difference, 0 for none. ``diff`` is non-negative (an absolute
    difference); a NaN difference gives NaN over a positive scale and 0 over none (callers mask
    unknown differences themselves). ``when_zero``: 1.0 for an error measure (a zero tensor that became
    non-zero is off by its whole self), ``inf`` for a tolerance (none passes it)."""
    d, s = np.asarray(diff, dtype=float), np.asarray(scale, dtype=float)
    return np.where(s > 0, d / s, np.where(d > 0, when_zero, 0.0))


def scaled_one(diff: float, scale: float, when_zero: float = 1.0) -> float:
    """:func:`range_scaled` of one difference and one scale as Python floats (the same IEEE
    division, without an array per call: for per-call loops)."""
    return diff / scale if scale > 0 else (when_zero if diff > 0 else 0.0)
