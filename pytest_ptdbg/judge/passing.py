"""Whether a compared step passes: the one place that decides it. No torch, no pandas.

A step passes iff nothing fails: no root cause (the default judgement, :func:`.step.judge_step`),
no row failing the rule that gates it (``rule="ptdbg"``/``"dtype"``: the table's ``_passed``), no
unusable datum, no problem while reading or comparing, and every other check asked for holds
(the golden's own check, the NaN/Inf health check). Every verdict calls :func:`passes`:
``judge_step``, ``compare()``'s rule gates, ``assert_precision`` and the fixture's result.
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence

import numpy as np

__all__ = ["passes"]


def passes(*, root_causes: Sequence[object] = (), failing_rows: Optional[np.ndarray] = None,
           unusable: Sequence[object] = (), problems: Sequence[object] = (),
           checks: Iterable[bool] = ()) -> bool:
    """True iff there is no root cause, no failing row (a boolean mask, one per table row), no
    unusable datum, no problem, and every one of ``checks`` (other verdicts that must hold) is True."""
    if len(root_causes) or len(unusable) or len(problems):
        return False
    if failing_rows is not None and bool(np.asarray(failing_rows, dtype=bool).any()):
        return False
    return all(bool(c) for c in checks)
