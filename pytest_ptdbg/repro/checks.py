"""Replay's bridge to the compare stage: its metric kernels and verdict rule (none of its own)."""
from __future__ import annotations

from typing import Optional

import numpy as np

from pytest_ptdbg.comparison import metrics, verdict
from pytest_ptdbg.comparison.rule import Rule


def pair_metrics(saved: np.ndarray, replayed: np.ndarray, saved_dtype: str, replay_dtype: str,
                 rule: Optional[str] = None) -> dict:
    """Metrics of one (saved, replayed) pair as TensorCheck fields (minus key, dtypes, shape).

    The saved result plays the compare stage's "NPU" side and the replay the "bench" side;
    ``rule`` is a ``comparison.verdict`` rule name (default ``"ptdbg"``). A pair with nothing to
    compare (empty, or NaN/Inf at the same places only) passes.
    """
    rule = rule or "ptdbg"
    rtol, atol = verdict.tolerance(saved_dtype, replay_dtype)
    m = metrics.compare_arrays(saved, replayed, eps=metrics.dtype_eps(replay_dtype), tol=(atol, rtol))
    v = verdict.full_verdict(m, saved_dtype, replay_dtype, rule=Rule(rule))
    return {"cosine": m.cosine, "max_abs_err": m.max_abs_err, "max_rel_err": m.max_rel_err,
            "one_thousandth": m.one_thousandth, "five_thousandths": m.five_thousandths,
            "rel_l2": m.rel_l2, "passed": v != "No", "message": m.message}
