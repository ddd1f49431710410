"""Numbers and errors as text, one way for every stage (no torch, no numpy).

``fmt_error`` writes an error measure (``1.23e-04``), ``fmt_growth`` a growth factor (``x1.2e4``),
``fmt_number`` any other number (``0.999812``); all three write ``n/a`` for an unknown value.
:class:`TextEnum` is the base of the string-valued enums (roles, kinds, verdicts) whose text, JSON
and comparisons are their value.
"""
from __future__ import annotations

import enum
import math
from typing import Any, Optional

__all__ = ["TextEnum", "fmt_error", "fmt_growth", "fmt_number", "is_missing"]


class TextEnum(str, enum.Enum):
    """A ``str`` enum: ``Kind.OWN == "own"``, ``f"{Kind.OWN}"`` and ``json.dumps`` give ``own``."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


def is_missing(x: Any) -> bool:
    """None or a float NaN."""
    return x is None or (isinstance(x, float) and math.isnan(x))


def fmt_error(x: Optional[float]) -> str:
    """An error for people: ``1.23e-04``, ``0``, ``NaN/Inf`` (infinite: NaN/Inf positions differ),
    ``n/a`` (unknown)."""
    if x is None or is_missing(x):
        return "n/a"
    if math.isinf(x):
        return "NaN/Inf"
    if x == 0:
        return "0"
    return f"{x:.2e}"


def fmt_growth(g: Optional[float], carried_nonfinite: bool = False) -> str:
    """A growth factor for people: ``x1.2``, ``x500``, ``x1.2e4``; ``new NaN/Inf`` when infinite.

    ``carried_nonfinite``: input and output both hold NaN/Inf (``carries NaN/Inf``).
    """
    if carried_nonfinite:
        return "carries NaN/Inf"
    if g is None or is_missing(g):
        return "n/a"
    if math.isinf(g):
        return "new NaN/Inf"
    if g < 1:
        return f"x{g:.2g}"
    if g < 10:
        return f"x{g:.1f}"
    if g < 1e4:
        return f"x{g:.0f}"
    m, e = f"{g:.1e}".split("e")
    return f"x{m}e{int(e)}"


def fmt_number(x: Any, digits: int = 6) -> str:
    """A metric or threshold for people: floats with ``digits`` significant digits (``0.999812``,
    ``1.5e-05``, ``inf``), ``n/a`` for None or NaN, anything else as ``str``."""
    if is_missing(x):
        return "n/a"
    if isinstance(x, float):
        return f"{x:.{digits}g}"
    return str(x)
