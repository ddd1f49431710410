"""Facts about floating-point dtypes, in one table: :data:`FLOATS`. No torch, no numpy.

Each :class:`FloatFacts` holds a dtype's stored mantissa bits, largest and smallest normal value,
and ``torch.testing.assert_close``'s default tolerances; its machine epsilon, unit roundoff and
subnormal spacing follow from them. The stages' own lookups (the replay's budget, the metrics'
zero denominators, the code-path classifier, the advice, the argument comparer, the dtype rule)
are built from this table, each under the dtype names it has always accepted.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

__all__ = ["FloatFacts", "FLOATS", "STEP_FLOATS", "ALIASES", "COMPLEX_PARTS", "float_facts", "short_name"]


@dataclass(frozen=True)
class FloatFacts:
    """One floating-point dtype (IEEE-style binary format)."""

    name: str               #: ``float16``, ``bfloat16``, ... (torch's name without ``torch.``)
    bits: int               #: storage width (float16 and bfloat16: 16)
    mantissa_bits: int      #: stored fraction bits (float16: 10, bfloat16: 7, float32: 23)
    max_exponent: int       #: exponent of the largest finite value (float16: 15)
    min_exponent: int       #: exponent of the smallest normal value (float16: -14)
    #: ``torch.testing.assert_close``'s default ``(rtol, atol)`` (None: it has none)
    assert_close_tol: Optional[Tuple[float, float]] = None
    #: the largest finite value when the format does not follow IEEE's (float8_e4m3fn: 448)
    max_override: Optional[float] = None

    @property
    def eps(self) -> float:
        """Machine epsilon: the spacing of the numbers in [1, 2) (``torch.finfo(dtype).eps``)."""
        return 2.0 ** -self.mantissa_bits

    @property
    def unit_roundoff(self) -> float:
        """u = eps / 2: the largest relative error of one rounding to nearest."""
        return 2.0 ** -(self.mantissa_bits + 1)

    @property
    def max(self) -> float:
        """The largest finite value (``torch.finfo(dtype).max``)."""
        if self.max_override is not None:
            return self.max_override
        return (2.0 - self.eps) * 2.0 ** self.max_exponent

    @property
    def tiny(self) -> float:
        """The smallest positive normal value (``torch.finfo(dtype).tiny``)."""
        return 2.0 ** self.min_exponent

    @property
    def subnormal_spacing(self) -> float:
        """The spacing of the subnormal numbers (tiny x eps): the absolute rounding below the
        normal range (float16: 6e-8)."""
        return self.tiny * self.eps


#: the floating dtypes by torch's name without ``torch.``
FLOATS: Dict[str, FloatFacts] = {f.name: f for f in (
    FloatFacts("float64", 64, 52, 1023, -1022, (1e-7, 1e-7)),
    FloatFacts("float32", 32, 23, 127, -126, (1.3e-6, 1e-5)),
    FloatFacts("bfloat16", 16, 7, 127, -126, (1.6e-2, 1e-5)),
    FloatFacts("float16", 16, 10, 15, -14, (1e-3, 1e-5)),
    FloatFacts("float8_e4m3fn", 8, 3, 8, -6, None, 448.0),
    FloatFacts("float8_e5m2", 8, 2, 15, -14),
)}
#: the floating dtypes a training step computes in (autocast's and the bench's)
STEP_FLOATS = ("float16", "bfloat16", "float32", "float64")
#: torch's other names of those dtypes
ALIASES: Dict[str, str] = {"double": "float64", "float": "float32", "half": "float16"}
#: a complex dtype's real and imaginary parts
COMPLEX_PARTS: Dict[str, str] = {"complex64": "float32", "complex128": "float64"}


def short_name(dtype: Optional[str]) -> str:
    """``"torch.half"`` -> ``"float16"``: the table's name of a dtype name (others unchanged,
    without ``torch.``)."""
    d = (dtype or "").replace("torch.", "")
    return ALIASES.get(d, d)


def float_facts(dtype: Optional[str]) -> Optional[FloatFacts]:
    """The facts of a floating dtype name (``"torch.bfloat16"``, ``"half"``); None for others."""
    return FLOATS.get(short_name(dtype))
