"""The compare table's contract: every column named once, typed, and read through :class:`CompareTable`.

A full compare has ptdbg's metric columns; a summary (statistics-only) compare replaces them by the
four ``... diff`` columns. The internal columns (all starting with ``_``, never written to the CSV)
are described in docs/DESIGN.md.

Stages downstream of the compare (judge, advise, report, plugin) never name a column by string:
they take a :class:`CompareTable` (``CompareTable.of(frame)`` validates a DataFrame once) and read
columns by the :class:`Column` constants below, each returned as a numpy array of its kind
(:meth:`CompareTable.text`, :meth:`~CompareTable.floats`, :meth:`~CompareTable.flags`, ...). pandas
stays the export format (the CSV writer, ``CompareResult.table`` for users). No torch import; pandas
only when a table is wrapped.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from pytest_ptdbg.comparison.rule import Rule, parse_rule
from pytest_ptdbg.format import records

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = [
    "Column", "CompareTable", "TableSchemaError",
    "BASE_COLUMNS", "METRIC_COLUMNS", "SUMMARY_DIFF_COLUMNS", "STAT_COLUMNS", "VERDICT_COLUMNS",
    "FULL_COLUMNS", "SUMMARY_COLUMNS", "STACK_COLUMN", "INTERNAL_COLUMNS", "ACCURACY", "ERR_MESSAGE",
    "csv_columns", "is_summary",
]

#: the kinds of column a :class:`Column` holds, and what its accessor returns
TEXT, FLOAT, BOOL, INT, OBJECT = "text", "float", "bool", "int", "object"


class Column(str):
    """A column of the compare table: its name (the ``str`` value, so ``frame[col]`` works) and its
    kind (:data:`TEXT`, :data:`FLOAT`, :data:`BOOL`, :data:`INT` or :data:`OBJECT`)."""

    kind: str

    def __new__(cls, name: str, kind: str) -> "Column":
        col = super().__new__(cls, name)
        col.kind = kind
        return col

    def __reduce__(self) -> Tuple[Any, ...]:   # pickles (worker processes) as what it is
        return (Column, (str(self), self.kind))


# ---------------------------------------------------------------- ptdbg's CSV columns
NPU_NAME = Column("NPU Name", TEXT)
BENCH_NAME = Column("Bench Name", TEXT)
NPU_DTYPE = Column("NPU Tensor Dtype", TEXT)
BENCH_DTYPE = Column("Bench Tensor Dtype", TEXT)
NPU_SHAPE = Column("NPU Tensor Shape", OBJECT)
BENCH_SHAPE = Column("Bench Tensor Shape", OBJECT)
COSINE = Column("Cosine", FLOAT)
MAX_ABS_ERR = Column("MaxAbsErr", FLOAT)
MAX_REL_ERR = Column("MaxRelativeErr", FLOAT)
ONE_THOUSANDTH = Column("One Thousandth Err Ratio", FLOAT)
FIVE_THOUSANDTHS = Column("Five Thousandths Err Ratio", FLOAT)
MAX_DIFF = Column("Max diff", FLOAT)
MIN_DIFF = Column("Min diff", FLOAT)
MEAN_DIFF = Column("Mean diff", FLOAT)
L2NORM_DIFF = Column("L2norm diff", FLOAT)
NPU_MAX = Column("NPU max", FLOAT)
NPU_MIN = Column("NPU min", FLOAT)
NPU_MEAN = Column("NPU mean", FLOAT)
NPU_L2NORM = Column("NPU l2norm", FLOAT)
BENCH_MAX = Column("Bench max", FLOAT)
BENCH_MIN = Column("Bench min", FLOAT)
BENCH_MEAN = Column("Bench mean", FLOAT)
BENCH_L2NORM = Column("Bench l2norm", FLOAT)
ACCURACY = Column("Accuracy Reached or Not", TEXT)
ERR_MESSAGE = Column("Err_message", TEXT)
#: written after the others with ``stack_mode=True`` (built from :data:`STACK` by the CSV writer)
STACK_COLUMN = Column("NPU_Stack_Info", TEXT)

# ---------------------------------------------------------------- the table's own columns
API = Column("_api", TEXT)                    # the call's key on the NPU side (else the bench's)
BENCH_API = Column("_bench_api", TEXT)        # the paired bench call's key ("" when unpaired)
FAMILY = Column("_family", TEXT)              # the API without its call index (Functional_relu)
DIRECTION = Column("_direction", TEXT)        # "forward" / "backward"
IO = Column("_io", TEXT)                      # "input" / "output" / "arg" (argument rows)
INDEX = Column("_index", TEXT)                # the tensor's slot within its call ("0", "1.2")
ORDER = Column("_order", INT)                 # the call's position in NPU execution order
CTX = Column("_ctx", TEXT)                    # "optimizer" for calls inside optimizer.step()
STACK = Column("_stack", OBJECT)              # the call stack (list of frames) or None
PAIRED = Column("_paired", BOOL)              # both sides have this tensor
REL_L2 = Column("_rel_l2", FLOAT)             # ||npu - bench|| / ||bench|| (inf: bench all zero)
NAN_MISMATCH = Column("_nan_mismatch", BOOL)  # NaN/Inf at different places
NPU_NONFINITE = Column("_npu_nonfinite", INT)
BENCH_NONFINITE = Column("_bench_nonfinite", INT)
PASSED = Column("_passed", BOOL)              # the row's verdict under the compare's rule
UNUSABLE = Column("_unusable", BOOL)          # the row's data could not be used (never a pass)
ARG = Column("_arg", TEXT)                    # an argument row's argument name
ARG_CHANGED = Column("_arg_changed", BOOL)    # an argument row whose value differs
CODE_PATH = Column("_code_path", TEXT)        # a one-sided call's classification (code_path.py)

BASE_COLUMNS: List[Column] = [NPU_NAME, BENCH_NAME, NPU_DTYPE, BENCH_DTYPE, NPU_SHAPE, BENCH_SHAPE]
METRIC_COLUMNS: List[Column] = [COSINE, MAX_ABS_ERR, MAX_REL_ERR, ONE_THOUSANDTH, FIVE_THOUSANDTHS]
#: the statistics differences a summary compare has instead of :data:`METRIC_COLUMNS`
SUMMARY_DIFF_COLUMNS: List[Column] = [MAX_DIFF, MIN_DIFF, MEAN_DIFF, L2NORM_DIFF]
NPU_STAT_COLUMNS: List[Column] = [NPU_MAX, NPU_MIN, NPU_MEAN, NPU_L2NORM]
BENCH_STAT_COLUMNS: List[Column] = [BENCH_MAX, BENCH_MIN, BENCH_MEAN, BENCH_L2NORM]
STAT_COLUMNS: List[Column] = NPU_STAT_COLUMNS + BENCH_STAT_COLUMNS
VERDICT_COLUMNS: List[Column] = [ACCURACY, ERR_MESSAGE]
#: ptdbg's CSV columns of a full compare, and of a summary compare
FULL_COLUMNS: List[Column] = BASE_COLUMNS + METRIC_COLUMNS + STAT_COLUMNS + VERDICT_COLUMNS
SUMMARY_COLUMNS: List[Column] = BASE_COLUMNS + SUMMARY_DIFF_COLUMNS + STAT_COLUMNS + VERDICT_COLUMNS
#: the table's own columns, never written to the CSV (docs/DESIGN.md says what each holds)
INTERNAL_COLUMNS: List[Column] = [API, BENCH_API, FAMILY, DIRECTION, IO, INDEX, ORDER, CTX, STACK, PAIRED,
                                  REL_L2, NAN_MISMATCH, NPU_NONFINITE, BENCH_NONFINITE, PASSED, UNUSABLE,
                                  ARG, ARG_CHANGED, CODE_PATH]
#: every column by name
BY_NAME: Dict[str, Column] = {str(c): c for c in FULL_COLUMNS + SUMMARY_DIFF_COLUMNS + INTERNAL_COLUMNS
                              + [STACK_COLUMN]}

#: the values of the text columns with a closed vocabulary
FORWARD, BACKWARD = records.FORWARD, records.BACKWARD
INPUT, OUTPUT, ARGUMENT = "input", "output", "arg"
OPTIMIZER = records.OPTIMIZER_CTX
YES, NO = "Yes", "No"


class TableSchemaError(ValueError):
    """A table that is not a compare table: it lacks columns the compare always writes."""


def csv_columns(summary: bool, stack_mode: bool) -> List[str]:
    """ptdbg's column list for a full or summary compare, with or without the stack column."""
    cols = SUMMARY_COLUMNS if summary else FULL_COLUMNS
    return [str(c) for c in cols] + ([str(STACK_COLUMN)] if stack_mode else [])


def is_summary(table: Union["pd.DataFrame", "CompareTable"]) -> bool:
    """Whether ``table`` is a summary (statistics-only) compare: its ``summary_compare`` attribute,
    or, for a table read back from a CSV (no attributes), whether it has the summary columns."""
    if isinstance(table, CompareTable):
        return table.summary
    flag = table.attrs.get("summary_compare")
    if flag is not None:
        return bool(flag)
    return SUMMARY_DIFF_COLUMNS[0] in table.columns


def _is_true(v: Any) -> bool:
    """A flag cell: bools as they are; ``"true"``/``"1"``/``"yes"`` (any case) in text; NaN False."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, str):
        return v.strip().lower() in ("true", "1", "yes")
    try:
        return bool(v) and not (isinstance(v, float) and math.isnan(v))
    except (TypeError, ValueError):
        return False


class CompareTable:
    """The compare table, validated once: a pandas DataFrame (:attr:`frame`, the export format) whose
    columns are read as typed numpy arrays by :class:`Column`.

    ``CompareTable(frame)`` raises :class:`TableSchemaError` naming the columns ``frame`` lacks:
    every internal column and ptdbg's columns of its kind (full or summary) are required, so no
    reader needs a fallback for a column production never leaves out.
    """

    __slots__ = ("frame", "summary", "_cache")

    def __init__(self, frame: "pd.DataFrame", *, require: Optional[Sequence[Column]] = None) -> None:
        import pandas as pd

        if not isinstance(frame, pd.DataFrame):
            raise TypeError(f"a compare table is a pandas DataFrame, got {type(frame).__name__}")
        self.frame = frame
        self.summary = is_summary(frame)
        wanted = list(require) if require is not None else \
            (SUMMARY_COLUMNS if self.summary else FULL_COLUMNS) + INTERNAL_COLUMNS
        missing = [str(c) for c in wanted if c not in frame.columns]
        if missing:
            raise TableSchemaError(f"compare table lacks column(s) {missing}; see docs/DESIGN.md")
        self._cache: Dict[Tuple[str, str], np.ndarray] = {}

    @classmethod
    def of(cls, table: Union["pd.DataFrame", "CompareTable"]) -> "CompareTable":
        """``table`` itself when it is a :class:`CompareTable`, else the DataFrame validated."""
        return table if isinstance(table, CompareTable) else cls(table)

    # ------------------------------------------------------------------ shape and attributes
    def __len__(self) -> int:
        return len(self.frame)

    @property
    def attrs(self) -> Dict[str, Any]:
        """The frame's attributes (``summary_compare``, ``stack_mode``, ``rule``)."""
        return self.frame.attrs

    @property
    def row_rule(self) -> Rule:
        """The per-tensor rule that filled :data:`ACCURACY` and :data:`PASSED` (the ``rule``
        attribute); ptdbg's when the table does not say (one read back from a CSV)."""
        return parse_rule(self.frame.attrs.get("rule") or Rule.PTDBG)

    def has(self, col: Column) -> bool:
        """Whether the table has ``col`` (the metric columns exist only in a full compare, the
        ``... diff`` columns only in a summary compare)."""
        return col in self.frame.columns

    # ------------------------------------------------------------------ typed reads
    def __getitem__(self, col: Column) -> np.ndarray:
        """Column ``col`` as the array of its kind (:meth:`text`, :meth:`floats`, :meth:`flags`,
        :meth:`ints`, :meth:`objects`)."""
        return {TEXT: self.text, FLOAT: self.floats, BOOL: self.flags, INT: self.ints,
                OBJECT: self.objects}[col.kind](col)

    def text(self, col: Column) -> np.ndarray:
        """The column as an object array of ``str`` (``""`` for an empty cell or a missing column)."""
        return self._memo(col, "text", self._text)

    def floats(self, col: Column) -> np.ndarray:
        """The column as float64 (NaN where a cell is empty, not a number, or the column is absent)."""
        return self._memo(col, "float", self._floats)

    def flags(self, col: Column) -> np.ndarray:
        """The column as bool (text cells ``"true"``/``"1"``/``"yes"`` are True; empty cells False)."""
        return self._memo(col, "bool", self._flags)

    def ints(self, col: Column, missing: int = -1) -> np.ndarray:
        """The column as int64 (``missing`` where a cell is empty or not a number)."""
        f = self.floats(col)
        return np.where(np.isfinite(f), f, missing).astype(np.int64)

    def objects(self, col: Column) -> np.ndarray:
        """The column's cells as they are (an object array; None for a missing column)."""
        if col not in self.frame.columns:
            return np.array([None] * len(self), dtype=object)
        return self.frame[col].to_numpy(dtype=object)

    def cell(self, col: Column, row: int) -> Any:
        """One cell: ``col``'s value at positional ``row``, of the column's kind."""
        return self[col][row]

    def rows(self, mask: Union[np.ndarray, Iterable[int]]) -> "CompareTable":
        """The rows selected by a boolean mask or positions, as a table (index reset)."""
        sel = np.asarray(mask)
        sub = self.frame.iloc[np.flatnonzero(sel) if sel.dtype == bool else sel].reset_index(drop=True)
        sub.attrs.update(self.frame.attrs)
        return CompareTable(sub, require=[])

    def api_pairs(self) -> Dict[str, str]:
        """NPU API key -> bench API key of the calls the pairing matched (the rows with a
        :data:`BENCH_API`; a bench-only row's :data:`API` is its bench key, paired with itself)."""
        api, bench = self.text(API), self.text(BENCH_API)
        keep = bench != ""
        return dict(zip(api[keep].tolist(), bench[keep].tolist()))

    def count(self, col: Column, value: Any) -> int:
        """How many rows of ``col`` (read as its kind) equal ``value``."""
        return int(np.count_nonzero(self[col] == value)) if len(self) else 0

    # ------------------------------------------------------------------ statistics
    def stats(self, side: str) -> np.ndarray:
        """``side``'s (``"npu"`` or ``"bench"``) statistics ``[max, min, mean, l2norm]`` as an
        ``(n, 4)`` float64 array (NaN where unknown)."""
        cols = {"npu": NPU_STAT_COLUMNS, "bench": BENCH_STAT_COLUMNS}[side]
        return np.stack([self.floats(c) for c in cols], axis=1) if len(self) else np.zeros((0, 4))

    def value_range(self, side: str, *, finite_only: bool = False) -> np.ndarray:
        """``side``'s range ``max(|max|, |min|)`` per row (:func:`.stat_error.value_range`)."""
        from pytest_ptdbg.comparison.stat_error import value_range

        st = self.stats(side)
        return value_range(st[:, 0], st[:, 1], finite_only=finite_only)

    def stat_difference(self) -> np.ndarray:
        """The largest of the ``|max|``, ``|min|``, ``|mean|`` differences NPU - bench per row,
        from the statistics columns (:func:`.stat_error.largest_difference`)."""
        from pytest_ptdbg.comparison.stat_error import largest_difference

        with np.errstate(invalid="ignore", over="ignore"):
            d = self.stats("npu") - self.stats("bench")
        return largest_difference(d[:, 0], d[:, 1], d[:, 2])

    def summary_difference(self) -> np.ndarray:
        """The same from a summary compare's ``... diff`` columns (all NaN in a full compare)."""
        from pytest_ptdbg.comparison.stat_error import largest_difference

        return largest_difference(self.floats(MAX_DIFF), self.floats(MIN_DIFF), self.floats(MEAN_DIFF))

    # ------------------------------------------------------------------ writes
    def set(self, col: Column, mask: np.ndarray, value: Any) -> None:
        """Set ``col`` to ``value`` on the rows of boolean ``mask`` (in place)."""
        self.frame.loc[np.asarray(mask, dtype=bool), col] = value
        self._cache = {k: v for k, v in self._cache.items() if k[0] != str(col)}

    # ------------------------------------------------------------------ internals
    def _memo(self, col: Column, kind: str, make: Any) -> np.ndarray:
        key = (str(col), kind)
        arr = self._cache.get(key)
        if arr is None:
            arr = self._cache[key] = make(col)
        return arr

    def _text(self, col: Column) -> np.ndarray:
        if col not in self.frame.columns:
            return np.array([""] * len(self), dtype=object)
        return self.frame[col].fillna("").astype(str).to_numpy(dtype=object)

    def _floats(self, col: Column) -> np.ndarray:
        import pandas as pd

        if col not in self.frame.columns:
            return np.full(len(self), np.nan)
        return pd.to_numeric(self.frame[col], errors="coerce").to_numpy(dtype=float, na_value=np.nan)

    def _flags(self, col: Column) -> np.ndarray:
        if col not in self.frame.columns:
            return np.zeros(len(self), dtype=bool)
        s = self.frame[col]
        if s.dtype == np.bool_:
            return s.to_numpy(dtype=bool)
        return np.array([_is_true(v) for v in s.to_numpy(dtype=object)], dtype=bool)
