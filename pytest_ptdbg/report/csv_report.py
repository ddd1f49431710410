"""``compare_result_{stem}.csv``: exactly ptdbg's columns, one row per tensor pair.

Full compare (tensors were compared)::

    NPU Name, Bench Name, NPU Tensor Dtype, Bench Tensor Dtype, NPU Tensor Shape,
    Bench Tensor Shape, Cosine, MaxAbsErr, MaxRelativeErr, One Thousandth Err Ratio,
    Five Thousandths Err Ratio, NPU max, NPU min, NPU mean, NPU l2norm, Bench max, Bench min,
    Bench mean, Bench l2norm, Accuracy Reached or Not, Err_message [, NPU_Stack_Info]

Summary compare (statistics only; the table has ``Max diff``) replaces the five metric columns
by ``Max diff, Min diff, Mean diff, L2norm diff``. The table's underscore columns are never
written. Column names are ptdbg's, unchanged, so existing scripts keep working; note that
"One Thousandth Err Ratio" and "Five Thousandths Err Ratio" are *pass fractions* (share of
elements with relative error below 0.001 / 0.005; 1.0 is good) - the advisor file and the HTML
report say so beside the results.

``NPU_Stack_Info`` (``stack_mode=True``) is filled on the first row of each API and left empty
on its other rows, on one line per cell (frames joined by `` | ``), so that the advisor's
``Line:`` is both the spreadsheet row and the text line of that row.

Text cells that a spreadsheet would run as a formula (starting with ``= + - @``, a tab or a carriage
return) are written with a leading ``'`` (OWASP's CSV-injection advice): a dump's names, dtypes and
stacks are data, never formulas. Numbers, and text cells that read as a number (``-0.5``), are
written unchanged. The file is created exclusively (:mod:`.outputs`).

:func:`csv_text` writes the table column by column (each column's cells formatted at once, then
one ``csv.writer`` pass), byte for byte what ``pandas.DataFrame.to_csv`` writes for
:func:`csv_frame` (``N/A`` for missing values, floats as ``repr``, ``True``/``False``, other objects
by ``str``, quoted where the csv module's minimal quoting needs it), without the per-cell
formatting pandas does: a 160 000-row table took 6 s through pandas.
"""
from __future__ import annotations

import csv
import io
import re
from typing import Any, Iterator, List, Optional, Sequence

import numpy as np
import pandas as pd

from pytest_ptdbg.advise.advice_text import as_frames
from pytest_ptdbg.comparison import schema
from pytest_ptdbg.comparison.schema import STACK_COLUMN, csv_columns, is_summary
from pytest_ptdbg.report.outputs import write_new

#: how a missing value (NaN) is written: ptdbg's "N/A" (pandas reads it back as NaN)
NA = "N/A"
#: rows formatted at a time by :func:`csv_text`
ROWS_PER_BLOCK = 8192
#: first characters that make a spreadsheet cell a formula
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_FORMULA_AT_START = re.compile("\x00[=+\\-@\t\r]")


def format_stack_cell(stack: Optional[Sequence[Any]]) -> str:
    """One line: ``File "a.py", line 3, in f: code | File ...`` (innermost frame first)."""
    parts = []
    for f in as_frames(stack):
        code = str(f[3]).strip().replace("\n", " ") if len(f) > 3 and f[3] else ""
        parts.append(f'File "{f[0]}", line {f[1]}, in {f[2]}' + (f": {code}" if code else ""))
    return " | ".join(parts)


def escape_formula(value: Any) -> Any:
    """``value`` made safe for a spreadsheet: text starting like a formula gets a leading ``'``.

    Anything but text, and text that reads as a number (``-0.5``, ``-inf``), is returned unchanged.
    """
    if not isinstance(value, str) or not value.startswith(FORMULA_START):
        return value
    try:
        float(value)
        return value
    except ValueError:
        return "'" + value


def _escape_text_columns(frame: pd.DataFrame) -> pd.DataFrame:
    for col in frame.columns:
        if not pd.api.types.is_numeric_dtype(frame[col]):
            frame[col] = [escape_formula(v) for v in frame[col].tolist()]
    return frame


def csv_frame(table: pd.DataFrame, stack_mode: bool = False) -> pd.DataFrame:
    """The table as it is written: ptdbg's columns only, in order (raises naming missing ones),
    formula-like text cells escaped."""
    cols = csv_columns(is_summary(table), False)
    missing = [c for c in cols if c not in table.columns]
    if missing:
        raise ValueError(f"compare table lacks the CSV column(s) {missing}")
    out = table.loc[:, cols].copy()
    if stack_mode:
        out[STACK_COLUMN] = _stack_cells(table)
    return _escape_text_columns(out)


def column_cells(col: pd.Series, escape: bool = True) -> List[str]:
    """One column's cells as text, as ``DataFrame.to_csv`` formats them (before quoting): missing
    values :data:`NA`; float64 as ``repr`` (numpy's shortest round-trip text: the same digits);
    other numbers and bools by numpy's ``str``; text formula-escaped (``escape``), any other
    object by ``str``."""
    dt = col.dtype
    kind = getattr(dt, "kind", "O")
    if kind in "fbiu" and not isinstance(dt, pd.api.extensions.ExtensionDtype):
        vals = col.to_numpy()
        out = list(map(repr, vals.tolist())) if dt == np.float64 else vals.astype(str).tolist()
        if kind == "f":
            for i in np.flatnonzero(np.isnan(vals)).tolist():
                out[i] = NA
        return out
    arr = col.to_numpy(dtype=object)
    out = arr.tolist()
    mask = np.flatnonzero(pd.isna(arr)).tolist()
    for i in mask:
        out[i] = NA
    texts = isinstance(dt, pd.StringDtype)
    if not texts:   # str(): what the csv writer writes for a cell (repr for a float)
        out = list(map(str, out))
    if escape and not pd.api.types.is_numeric_dtype(dt):
        # one search over the joined column finds whether any cell starts like a formula
        if _FORMULA_AT_START.search("\x00" + "\x00".join(out)):
            raw = arr.tolist()
            for i in [i for i, v in enumerate(raw) if isinstance(v, str) and v.startswith(FORMULA_START)]:
                out[i] = escape_formula(raw[i])
    return out


def _quote_field(v: str) -> str:
    """A field as the csv module's minimal quoting writes it (``v`` is not empty)."""
    if "\r" in v or "\n" in v:
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow([v])
        return buf.getvalue()[:-1]
    if '"' in v:
        return '"' + v.replace('"', '""') + '"'
    if "," in v:
        return '"' + v + '"'
    return v


def _quoted(cells: List[str]) -> List[str]:
    """``cells`` with the fields that need it quoted (a delimiter, quote or line break inside)."""
    joined = "\x00".join(cells)
    if not any(c in joined for c in ',"\r\n'):
        return cells
    return [_quote_field(v) if ("," in v or '"' in v or "\n" in v or "\r" in v) else v for v in cells]


def csv_text(table: pd.DataFrame, stack_mode: bool = False) -> str:
    """The CSV file's text (see :func:`csv_frame`; the same bytes as its ``to_csv``), written from
    the table's columns: each column formatted and quoted at once, rows joined."""
    return "".join(csv_chunks(table, stack_mode))


def csv_chunks(table: pd.DataFrame, stack_mode: bool = False) -> Iterator[str]:
    """:func:`csv_text` piece by piece (the header, then :data:`ROWS_PER_BLOCK` rows at a time),
    so that a writer never holds the whole text."""
    cols = csv_columns(is_summary(table), False)
    missing = [c for c in cols if c not in table.columns]
    if missing:
        raise ValueError(f"compare table lacks the CSV column(s) {missing}")
    header = list(cols)
    stacks = None
    if stack_mode:
        header.append(STACK_COLUMN)
        stacks = _stack_cells(table)
    yield ",".join(_quoted(header)) + "\n"
    series = [table[c] for c in cols]
    # ROWS_PER_BLOCK rows at a time: the cells' text (a float's repr is ~60 bytes) never all at once
    for a in range(0, len(table), ROWS_PER_BLOCK):
        b = a + ROWS_PER_BLOCK
        cells = [_quoted(column_cells(col.iloc[a:b])) for col in series]
        if stacks is not None:
            cells.append(_quoted([escape_formula(v) for v in stacks[a:b]]))
        text = "\n".join(map(",".join, zip(*cells))) + "\n"
        del cells
        yield text


def _stack_cells(table: pd.DataFrame) -> List[str]:
    """``NPU_Stack_Info``: the stack on the first row of each API, "" elsewhere."""
    cells = [""] * len(table)
    if schema.STACK in table.columns:   # a table read back from a CSV has no stacks
        keys = table[schema.API].astype(str).tolist() if schema.API in table.columns else [None] * len(table)
        stacks = table[schema.STACK].tolist()
        seen = set()
        for i, (k, st) in enumerate(zip(keys, stacks)):
            if k not in seen or k is None:
                cell = format_stack_cell(st)
                if cell:
                    cells[i] = cell
                    seen.add(k)
    return cells


def write_csv(table: pd.DataFrame, path: str, stack_mode: bool = False) -> str:
    """Write the compare table to a new file ``path`` with exactly ptdbg's columns; returns ``path``.

    FileExistsError when something (a file, a link) is already at ``path``.
    """
    return write_new(path, csv_text(table, stack_mode))
