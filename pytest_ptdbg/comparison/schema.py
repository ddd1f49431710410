"""The compare table's columns, listed once: ptdbg's CSV columns and the internal ones.

A full compare has ptdbg's metric columns; a summary (statistics-only) compare replaces them by the
four ``... diff`` columns. The internal columns (all starting with ``_``, never written to the CSV)
are described in docs/DESIGN.md. No torch, no pandas import at module level.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, List

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = [
    "BASE_COLUMNS", "METRIC_COLUMNS", "SUMMARY_DIFF_COLUMNS", "STAT_COLUMNS", "VERDICT_COLUMNS",
    "FULL_COLUMNS", "SUMMARY_COLUMNS", "STACK_COLUMN", "INTERNAL_COLUMNS", "ACCURACY", "ERR_MESSAGE",
    "csv_columns", "is_summary",
]

BASE_COLUMNS = ["NPU Name", "Bench Name", "NPU Tensor Dtype", "Bench Tensor Dtype",
                "NPU Tensor Shape", "Bench Tensor Shape"]
METRIC_COLUMNS = ["Cosine", "MaxAbsErr", "MaxRelativeErr", "One Thousandth Err Ratio",
                  "Five Thousandths Err Ratio"]
#: the statistics differences a summary compare has instead of :data:`METRIC_COLUMNS`
SUMMARY_DIFF_COLUMNS = ["Max diff", "Min diff", "Mean diff", "L2norm diff"]
STAT_COLUMNS = ["NPU max", "NPU min", "NPU mean", "NPU l2norm",
                "Bench max", "Bench min", "Bench mean", "Bench l2norm"]
ACCURACY = "Accuracy Reached or Not"
ERR_MESSAGE = "Err_message"
VERDICT_COLUMNS = [ACCURACY, ERR_MESSAGE]
#: ptdbg's CSV columns of a full compare, and of a summary compare
FULL_COLUMNS = BASE_COLUMNS + METRIC_COLUMNS + STAT_COLUMNS + VERDICT_COLUMNS
SUMMARY_COLUMNS = BASE_COLUMNS + SUMMARY_DIFF_COLUMNS + STAT_COLUMNS + VERDICT_COLUMNS
#: written after the others with ``stack_mode=True``
STACK_COLUMN = "NPU_Stack_Info"
#: the table's own columns, never written to the CSV (docs/DESIGN.md says what each holds)
INTERNAL_COLUMNS = ["_api", "_bench_api", "_family", "_direction", "_io", "_index", "_order", "_ctx",
                    "_stack", "_paired", "_rel_l2", "_nan_mismatch", "_npu_nonfinite",
                    "_bench_nonfinite", "_passed", "_unusable", "_arg", "_arg_changed", "_code_path"]


def csv_columns(summary: bool, stack_mode: bool) -> List[str]:
    """ptdbg's column list for a full or summary compare, with or without the stack column."""
    cols = SUMMARY_COLUMNS if summary else FULL_COLUMNS
    return cols + [STACK_COLUMN] if stack_mode else list(cols)


def is_summary(table: "pd.DataFrame") -> bool:
    """Whether ``table`` is a summary (statistics-only) compare: its ``summary_compare`` attribute,
    or, for a table read back from a CSV (no attributes), whether it has the summary columns."""
    flag = table.attrs.get("summary_compare")
    if flag is not None:
        return bool(flag)
    return SUMMARY_DIFF_COLUMNS[0] in table.columns
