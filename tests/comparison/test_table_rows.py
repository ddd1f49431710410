"""The table's fast row builders give exactly the cells of the general one (``comparison/table.py``)."""
import math
from operator import itemgetter

import pytest

from pytest_ptdbg.comparison import table as T
from pytest_ptdbg.comparison.schema import INTERNAL_COLUMNS, SUMMARY_COLUMNS
from pytest_ptdbg.dump.reader import ApiRec, TensorRec

_COLS = [str(c) for c in SUMMARY_COLUMNS + INTERNAL_COLUMNS]


def _t(api: str, io: str, index: tuple, stats: list, extra: dict, shape=(2, 3)) -> TensorRec:
    return TensorRec(f"{api}_{io}.{'.'.join(map(str, index))}", api, io, index, "forward", "torch.float32",
                     shape, stats, extra, 1)


def _api(key: str, ctx: str, tensors: list) -> ApiRec:
    return ApiRec(key, "Tensor", "add", 0, "forward", 7, tensors, stack=[["f.py", 1, "g", "x"]], ctx=ctx)


@pytest.mark.parametrize("ctx", [("", ""), ("optimizer", ""), ("", "optimizer"), ("a", "b")])
@pytest.mark.parametrize("stats,extra", [
    ([1.0, -1.0, 0.5, 2.0], {}),
    ([1.0, -1.0, 0.5, 2.0], {"nan": 0, "inf": 0}),
    ([math.inf, -1.0, math.nan, 2.0], {}),
    ([math.inf, -1.0, math.nan, 2.0], {"nan": 3, "inf": None}),
    ([1.0, math.nan, 0.5, 2.0], {"inf": 2}),
])
def test_stats_row_is_the_row_in_column_order(ctx, stats, extra):
    nt = _t("Tensor_add_0_forward", "output", (0,), stats, extra)
    bt = _t("Tensor_add_0_forward", "output", (0,), [2.0, -2.0, 0.25, 1.0], {}, shape=(2, 3))
    na, ba = _api("Tensor_add_0_forward", ctx[0], [nt]), _api("Tensor_add_1_forward", ctx[1], [bt])
    want = itemgetter(*_COLS)(T._row(nt, bt, na, na, ba, na.stack, True))
    nf = T._four_float_pair(nt, bt)
    assert nf == (T._nonfinite_from_stats(nt), T._nonfinite_from_stats(bt))
    nnf, bnf = nf
    got = T._stats_row(nt, bt, na, ba, na.stack, nnf, bnf)
    assert len(got) == len(_COLS)
    # the cells _summary_rows fills in hold a value of the type they get; the others are the row's
    assert [type(v) for v in got] == [type(v) for v in want]
    later = set(T._DEFERRED_COLUMNS)
    assert later >= {"NPU max", "Bench l2norm", "Max diff", "_passed"}
    # NaN cells compare by identity in a tuple; spell them out
    assert [("nan" if isinstance(v, float) and math.isnan(v) else v) for c, v in zip(_COLS, got) if c not in later] == \
        [("nan" if isinstance(v, float) and math.isnan(v) else v) for c, v in zip(_COLS, want) if c not in later]


@pytest.mark.parametrize("stats", [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 2.0, 3.0, 4],
                                   [1.0, 2.0, 3.0, True], (1.0, 2.0, 3.0, 4.0), [1.0, 2.0, 3.0, "4.0"],
                                   [1.0, None, 3.0, 4.0], []])
def test_four_float_pair_is_none_unless_both_sides_have_four_floats(stats):
    four = [1.0, 2.0, 3.0, 4.0]
    for n, b in ((stats, four), (four, stats)):
        nt = _t("Tensor_add_0_forward", "output", (0,), n, {})
        bt = _t("Tensor_add_0_forward", "output", (0,), b, {})
        assert T._four_float_pair(nt, bt) is None
        assert not (T._four_floats(nt.stats) and T._four_floats(bt.stats))
