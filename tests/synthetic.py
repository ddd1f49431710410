"""Hand-built compare tables (the docs/DESIGN.md contract) for the advisor and report tests.

``synthetic_table([api(...), ...])`` builds one row per tensor with ptdbg's columns and the
underscore columns, from per-tensor relative errors. No torch.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence

import pandas as pd

from pytest_ptdbg.comparison.schema import FULL_COLUMNS
from pytest_ptdbg.format.records import parse_name

CSV_COLUMNS = FULL_COLUMNS


def api(key: str, inputs: Sequence[float] = (0.0,), outputs: Sequence[float] = (0.0,),
        *, threshold: float = 1e-3, nan_out: Sequence[int] = (), nan_in: Sequence[int] = (),
        ctx: str = "", dtype: str = "torch.float32", bench_dtype: Optional[str] = None,
        stack: Optional[list] = None, side: str = "both") -> Dict[str, Any]:
    """One API: relative error of each input / output tensor; a row fails when error > threshold.

    ``nan_out`` / ``nan_in``: indices of tensors whose NaN positions differ from the bench.
    ``side``: ``"both"``, ``"npu"`` or ``"bench"`` (unpaired).
    """
    return dict(key=key, inputs=list(inputs), outputs=list(outputs), threshold=threshold,
                nan_out=set(nan_out), nan_in=set(nan_in), ctx=ctx, dtype=dtype,
                bench_dtype=bench_dtype or dtype, stack=stack, side=side)


def synthetic_table(apis: Sequence[Dict[str, Any]]) -> pd.DataFrame:
    """The compare table for ``apis`` (in execution order)."""
    rows: List[Dict[str, Any]] = []
    for order, a in enumerate(apis):
        p = parse_name(a["key"])
        for io, errs, nans in (("input", a["inputs"], a["nan_in"]), ("output", a["outputs"], a["nan_out"])):
            for i, e in enumerate(errs):
                name = f"{a['key']}_{io}.{i}"
                paired = a["side"] == "both"
                nan = i in nans
                cos = 1.0 - e * e / 2.0
                passed = not nan and e <= a["threshold"]
                rows.append({
                    "NPU Name": name if a["side"] in ("both", "npu") else "",
                    "Bench Name": name if a["side"] in ("both", "bench") else "",
                    "NPU Tensor Dtype": a["dtype"] if a["side"] != "bench" else "",
                    "Bench Tensor Dtype": a["bench_dtype"] if a["side"] != "npu" else "",
                    "NPU Tensor Shape": "[4, 8]", "Bench Tensor Shape": "[4, 8]",
                    "Cosine": (math.nan if nan else cos) if paired else math.nan,
                    "MaxAbsErr": 2 * e if paired else math.nan,
                    "MaxRelativeErr": 5 * e if paired else math.nan,
                    "One Thousandth Err Ratio": (1.0 if e < 1e-3 else 0.5) if paired else math.nan,
                    "Five Thousandths Err Ratio": (1.0 if e < 5e-3 else 0.7) if paired else math.nan,
                    "NPU max": 1.0, "NPU min": -1.0, "NPU mean": 0.0, "NPU l2norm": 4.0,
                    "Bench max": 1.0, "Bench min": -1.0, "Bench mean": 0.0, "Bench l2norm": 4.0,
                    "Accuracy Reached or Not": ("Yes" if passed else "No") if paired else "",
                    "Err_message": ("position of inf or nan do not match" if nan else "")
                    if paired else f"no {'bench' if a['side'] == 'npu' else 'NPU'} call paired",
                    "_api": a["key"], "_bench_api": a["key"] if a["side"] != "npu" else "",
                    "_family": p.api_family, "_direction": p.direction, "_io": io,
                    "_index": str(i), "_order": order, "_ctx": a["ctx"],
                    "_stack": a["stack"],
                    "_paired": paired, "_rel_l2": e if paired and not nan else math.nan,
                    "_nan_mismatch": nan and paired, "_npu_nonfinite": 1 if nan else 0,
                    "_bench_nonfinite": 0, "_passed": passed if paired else True,
                    # the compare's defaults for a tensor row (no argument, not classified)
                    "_unusable": False, "_arg": "", "_arg_changed": False, "_code_path": "",
                })
    return pd.DataFrame(rows)
