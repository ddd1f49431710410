"""Columns of the compare table as numpy arrays (no torch): numbers and flags, tolerant of text.

Kept only for report/html_report.py (another stage reads columns through
:class:`~pytest_ptdbg.comparison.schema.CompareTable`); remove with its last user."""
from __future__ import annotations

import numpy as np
import pandas as pd


def to_float_array(col: pd.Series) -> np.ndarray:
    """The column as floats; NaN where a cell is empty or not a number."""
    return pd.to_numeric(col, errors="coerce").to_numpy(dtype=float, na_value=np.nan)


def float_column(table: pd.DataFrame, name: str) -> np.ndarray:
    """Column ``name`` of ``table`` as floats (:func:`to_float_array`); all NaN when it is absent."""
    if name not in table.columns:
        return np.full(len(table), np.nan)
    return to_float_array(table[name])


def to_bool_array(col: pd.Series, default: bool) -> np.ndarray:
    """The column as booleans: ``"true"``/``"1"``/``"yes"`` (any case) count as True in text cells,
    empty cells are ``default``."""
    if col.dtype == np.bool_:   # a bool column (the table's own flags): nothing to interpret
        return col.to_numpy(dtype=bool)
    s = col.astype(object).where(col.notna(), default)
    return np.array([bool(v) if not isinstance(v, str) else v.strip().lower() in ("true", "1", "yes")
                     for v in s], dtype=bool)
