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
