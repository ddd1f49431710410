"""The CSV and advisor-file writers: exactly ptdbg's columns, stacks, line numbers."""
import csv
import math

import pandas as pd
import pytest

from pytest_ptdbg.advise.advisor import advise
from synthetic import api, synthetic_table
from pytest_ptdbg.comparison import schema
from pytest_ptdbg.report import csv_report
from pytest_ptdbg.report.advisor_text import write_advisor

FULL = ["NPU Name", "Bench Name", "NPU Tensor Dtype", "Bench Tensor Dtype", "NPU Tensor Shape",
        "Bench Tensor Shape", "Cosine", "MaxAbsErr", "MaxRelativeErr", "One Thousandth Err Ratio",
        "Five Thousandths Err Ratio", "NPU max", "NPU min", "NPU mean", "NPU l2norm", "Bench max",
        "Bench min", "Bench mean", "Bench l2norm", "Accuracy Reached or Not", "Err_message"]
SUMMARY = FULL[:6] + ["Max diff", "Min diff", "Mean diff", "L2norm diff"] + FULL[11:]
STACK = [["/proj/model.py", 7, "forward", "y = torch.matmul(a, b)  # a, \"b\""],
         ["/proj/train.py", 3, "main", "model(x)"]]


def _table():
    return synthetic_table([
        api("Torch_relu_0_forward", [0.0], [0.0], stack=STACK),
        api("Torch_matmul_0_forward", [1e-6, 0.0], [2e-2], stack=STACK),
        api("Torch_sum_0_forward", [2e-2], [2e-2]),
        api("Tensor_to_0_forward", [0.0], [0.0], side="npu"),
    ])


def _header(path):
    with open(path, newline="", encoding="utf-8") as f:
        return next(csv.reader(f))


def test_full_compare_columns_exactly_ptdbg(tmp_path):
    t = _table()
    p = csv_report.write_csv(t, str(tmp_path / "r.csv"), stack_mode=False)
    assert _header(p) == FULL
    back = pd.read_csv(p)
    assert len(back) == len(t)
    assert not any(c.startswith("_") for c in back.columns)
    assert list(back["NPU Name"].fillna("")) == list(t["NPU Name"])


def test_stack_mode_adds_npu_stack_info_on_the_first_row_of_each_api(tmp_path):
    t = _table()
    p = csv_report.write_csv(t, str(tmp_path / "r.csv"), stack_mode=True)
    assert _header(p) == FULL + ["NPU_Stack_Info"]
    back = pd.read_csv(p, keep_default_na=False)
    cells = list(back["NPU_Stack_Info"])
    relu_rows = [i for i, n in enumerate(t["_api"]) if n == "Torch_relu_0_forward"]
    assert cells[relu_rows[0]].startswith('File "/proj/model.py", line 7, in forward: y = torch.matmul')
    assert "File \"/proj/train.py\", line 3, in main: model(x)" in cells[relu_rows[0]]
    assert all(cells[i] == "" for i in relu_rows[1:])
    assert cells[t.index[t["_api"] == "Torch_sum_0_forward"][0]] == ""  # no stack recorded


def test_line_numbers_are_text_lines_even_with_stacks(tmp_path):
    t = _table()
    adv = advise(t)
    p = csv_report.write_csv(t, str(tmp_path / "r.csv"), stack_mode=True)
    lines = open(p, encoding="utf-8").read().splitlines()
    assert len(lines) == len(t) + 1  # one text line per row: stacks stay on one line
    line = lines[adv.first.csv_line - 1]  # Line: counts from 1 with the header on line 1
    assert line.startswith(adv.first.api)


def test_summary_compare_columns(tmp_path):
    t = _table().drop(columns=schema.METRIC_COLUMNS)
    for c in schema.SUMMARY_DIFF_COLUMNS:
        t[c] = 0.5
    assert schema.is_summary(t)
    p = csv_report.write_csv(t, str(tmp_path / "s.csv"))
    assert _header(p) == SUMMARY
    assert _header(csv_report.write_csv(t, str(tmp_path / "s2.csv"), stack_mode=True)) == SUMMARY + ["NPU_Stack_Info"]


def test_missing_values_are_written_as_na_and_read_back_as_nan(tmp_path):
    t = _table()
    p = csv_report.write_csv(t, str(tmp_path / "r.csv"))
    raw = open(p, encoding="utf-8").read().splitlines()
    unpaired = raw[-1].split(",")
    assert unpaired[0] == "Tensor_to_0_forward_output.0" and "N/A" in unpaired
    back = pd.read_csv(p)
    assert math.isnan(back["Cosine"].iloc[-1])


def test_missing_table_column_is_named(tmp_path):
    with pytest.raises(ValueError, match="MaxAbsErr"):
        csv_report.write_csv(_table().drop(columns=["MaxAbsErr"]), str(tmp_path / "x.csv"))


def test_write_advisor_file(tmp_path):
    adv = advise(_table())
    p = write_advisor(adv, str(tmp_path / "sub" / "advisor_1.txt"))
    text = open(p, encoding="utf-8").read()
    assert text == adv.text()
    assert text.splitlines()[1] == "Suspect Nodes: Torch_matmul_0_forward"
    assert "pass fractions" in text


def _tricky_table():
    """A table with every kind of cell the writer formats: quotes, commas, line breaks, formulas,
    NaN/inf/-0.0, lists, None, bools, str subclasses, numbers that must keep all their digits."""
    t = _table()
    n = len(t)

    class Name(str):
        pass

    texts = ['a,b', 'say "hi"', "line\nbreak", "cr\rhere", "=SUM(A1)", "-0.5", "+x", "@me", "\tt", "plain",
             Name("=sub"), ""]
    t["NPU Name"] = [texts[i % len(texts)] for i in range(n)]
    t["Bench Name"] = [None if i % 2 else texts[(i + 3) % len(texts)] for i in range(n)]
    t["NPU Tensor Shape"] = [[2, 3] if i % 2 else [] for i in range(n)]
    t["Err_message"] = [float("nan") if i % 3 == 0 else "x, y" for i in range(n)]
    floats = [0.1, 1e16, 1e-05, -0.0, math.inf, -math.inf, math.nan, 1 / 3, 5e-324, 123456789.123456789]
    t["Cosine"] = [floats[i % len(floats)] for i in range(n)]
    t["NPU max"] = pd.array([1.5 if i % 2 else None for i in range(n)], dtype="Float64")
    t["Bench max"] = [True if i % 2 else 7 for i in range(n)]
    return t


@pytest.mark.parametrize("stack_mode", [False, True])
@pytest.mark.parametrize("block", [1, 3, 8192])
def test_csv_text_is_byte_identical_to_pandas_to_csv(stack_mode, block, monkeypatch):
    # csv_text formats the table column by column, a block of rows at a time; pandas' to_csv of
    # csv_frame is the reference
    monkeypatch.setattr(csv_report, "ROWS_PER_BLOCK", block)
    t = _tricky_table()
    ref = csv_report.csv_frame(t, stack_mode).to_csv(index=False, na_rep=csv_report.NA, lineterminator="\n")
    assert csv_report.csv_text(t, stack_mode) == ref
    assert '"say ""hi"""' in ref and "'=SUM(A1)" in ref and ",-0.5," in ref and "1e+16" in ref


@pytest.mark.parametrize("summary", [False, True])
def test_csv_text_of_a_real_tiny_gpt_compare_is_pandas_to_csv(dump_step, summary):
    from real_dumps import perturb

    from pytest_ptdbg.comparison.table import build_table
    from pytest_ptdbg.dump.reader import read_dump

    npu = dump_step("n", "tiny_gpt", summary_only=summary,
                    prepare=lambda m: perturb(m, "blocks.0.attn.qkv.weight", rel=1e-2))
    bench = dump_step("b", "tiny_gpt", summary_only=summary)
    t = build_table(read_dump(npu.rank_dir), read_dump(bench.rank_dir))
    assert (t["Accuracy Reached or Not"] == "No").any()     # a real fault: failing rows are written too
    for sm in (False, True):
        assert csv_report.csv_text(t, sm) == csv_report.csv_frame(t, sm).to_csv(
            index=False, na_rep=csv_report.NA, lineterminator="\n")


def test_empty_table_writes_the_header_only():
    t = _table().iloc[0:0]
    assert csv_report.csv_text(t) == ",".join(FULL) + "\n"
