"""The compare table's contract (comparison/schema.py): validated once, read by typed columns."""
import math

import numpy as np
import pandas as pd
import pytest

from pytest_ptdbg.comparison import schema as S


def _frame(n=3, summary=False):
    cols = (S.SUMMARY_COLUMNS if summary else S.FULL_COLUMNS) + S.INTERNAL_COLUMNS
    df = pd.DataFrame({str(c): [None] * n for c in cols})
    df.attrs["summary_compare"] = summary
    return df


def test_missing_columns_are_named():
    df = _frame().drop(columns=["_passed", "Cosine"])
    with pytest.raises(S.TableSchemaError) as e:
        S.CompareTable(df)
    assert "_passed" in str(e.value) and "Cosine" in str(e.value)


def test_summary_table_needs_the_diff_columns_not_the_metrics():
    df = _frame(summary=True)
    t = S.CompareTable(df)
    assert t.summary and not t.has(S.COSINE) and t.has(S.MAX_DIFF)
    with pytest.raises(S.TableSchemaError, match="Max diff"):
        S.CompareTable(df.drop(columns=["Max diff"]))


def test_typed_reads():
    df = _frame()
    df["_api"] = ["Torch_add_0_forward", None, 3]
    df["_rel_l2"] = [0.5, "n/a", math.inf]
    df["_paired"] = [True, "yes", float("nan")]
    df["_order"] = [2, None, "7"]
    t = S.CompareTable(df)
    assert list(t[S.API]) == ["Torch_add_0_forward", "", "3"]
    rel = t[S.REL_L2]
    assert rel[0] == 0.5 and math.isnan(rel[1]) and rel[2] == math.inf
    assert list(t[S.PAIRED]) == [True, True, False]
    assert list(t[S.ORDER]) == [2, -1, 7]
    assert t.cell(S.API, 0) == "Torch_add_0_forward"


def test_set_updates_what_is_read():
    df = _frame()
    df["_passed"] = [False, False, True]
    t = S.CompareTable(df)
    assert not t[S.PASSED].all()
    t.set(S.PASSED, np.array([True, False, False]), True)
    assert list(t[S.PASSED]) == [True, False, True]


def test_columns_are_their_names():
    assert S.ACCURACY == "Accuracy Reached or Not" and S.csv_columns(False, True)[-1] == "NPU_Stack_Info"
    assert all(type(c) is str for c in S.csv_columns(True, False))
    assert S.BY_NAME["_passed"].kind == S.BOOL


@pytest.mark.parametrize("summary", [False, True])
def test_built_table_satisfies_the_contract(tmp_path, summary):
    import dumps
    from pytest_ptdbg.comparison.table import build_table
    from pytest_ptdbg.dump.reader import read_dump

    n = read_dump(dumps.write_dump(str(tmp_path / "n"), dumps.mlp_apis(noise=1e-3)))
    b = read_dump(dumps.write_dump(str(tmp_path / "b"), dumps.mlp_apis()))
    t = S.CompareTable(build_table(n, b, summary=summary))
    assert t.summary is summary and len(t) > 0
    assert set(t[S.DIRECTION]) == {S.FORWARD, S.BACKWARD}
    assert t[S.PAIRED].all() and t[S.REL_L2].dtype == np.float64
    assert (t[S.ORDER] >= 0).all()


def test_api_pairs_are_the_rows_with_a_bench_call():
    df = _frame(4)
    df["_api"] = ["Torch_add_0_forward", "Torch_add_0_forward", "Tensor_mul_0_forward", "Functional_relu_0_forward"]
    df["_bench_api"] = ["Torch_add_1_forward", "Torch_add_1_forward", "", "Functional_relu_0_forward"]
    assert S.CompareTable(df).api_pairs() == {"Torch_add_0_forward": "Torch_add_1_forward",
                                               "Functional_relu_0_forward": "Functional_relu_0_forward"}
    assert S.CompareTable(_frame(0)).api_pairs() == {}


def test_count_reads_the_column_as_its_kind():
    df = _frame(4)
    df["Accuracy Reached or Not"] = ["No", "Yes", None, "No"]
    df["_passed"] = [True, "false", False, "yes"]
    t = S.CompareTable(df)
    assert t.count(S.ACCURACY, S.NO) == 2 and t.count(S.ACCURACY, "") == 1
    assert t.count(S.PASSED, True) == 2
    assert S.CompareTable(_frame(0)).count(S.ACCURACY, S.NO) == 0


def test_row_rule_is_the_tables_rule_else_ptdbgs():
    from pytest_ptdbg.comparison.rule import Rule

    df = _frame()
    assert S.CompareTable(df).row_rule is Rule.PTDBG          # a table read back from a CSV says none
    df.attrs["rule"] = "dtype"
    assert S.CompareTable(df).row_rule is Rule.DTYPE
    df.attrs["rule"] = "bogus"
    with pytest.raises(ValueError, match="bogus"):
        _ = S.CompareTable(df).row_rule
