"""The HTML report: self-contained, suspects with stacks first, the error plot with the suspect."""
import math
import re

from pytest_ptdbg.advise.advisor import advise
from synthetic import api, synthetic_table
from pytest_ptdbg.report.html_report import api_series, render_html, write_html
from pytest_ptdbg.report.svg_plot import Mark, PlotData, Series, error_plot

STACK = [["/usr/lib/python3/site-packages/torch/nn/modules/linear.py", 125, "forward", "return F.linear(x)"],
         ["/proj/model.py", 12, "forward", "if a < b: y = self.fc2(x)"]]


def _faulty():
    return synthetic_table([
        api("Functional_linear_0_forward", [1e-6, 1e-6], [1e-6]),
        api("Functional_linear_1_forward", [1e-6, 1e-6], [2e-2], stack=STACK),
        api("Torch_relu_0_forward", [2e-2], [2e-2]),
        api("Torch_log_0_forward", [2e-2], [0.0], nan_out=[0]),
        api("Torch_relu_0_backward", [0.0], [3e-2]),
        api("Tensor_add__0_forward", [1e-6, 3e-2], [1e-3], ctx="optimizer"),
    ])


def test_report_is_self_contained_and_shows_the_suspect_first(tmp_path):
    t = _faulty()
    adv = advise(t)
    p = write_html(t, adv, str(tmp_path / "r" / "report.html"), title="my run")
    html = open(p, encoding="utf-8").read()
    assert html.startswith("<!DOCTYPE html>") and "<title>my run</title>" in html
    # no network, no scripts: the only URL is the SVG namespace
    assert "<script" not in html and "src=" not in html
    assert set(re.findall(r"https?://[^\s\"']+", html)) == {"http://www.w3.org/2000/svg"}
    first = adv.first
    assert first.api == "Torch_log_0_forward" and first.kind == "nonfinite"
    # suspects come before the plots, each with its stack; code is escaped
    assert html.index("Torch_log_0_forward") < html.index("<svg")
    assert html.index("#2 Functional_linear_1_forward") < html.index("<svg")
    assert "/proj/model.py:12 in forward: if a &lt; b: y = self.fc2(x)" in html
    assert "<details><summary>call stack (2 frames)</summary>" in html
    # three panels: forward, backward, optimizer; the suspects are marked in the forward one
    assert html.count("<svg") == 3
    fw = html[html.index("<svg"):html.index("</svg>")]
    assert "#1 Torch_log_0_forward" in fw and "#2 Functional_linear_1_forward" in fw
    assert "NaN/Inf</title>" in fw  # the NaN triangle
    assert "pass fraction" in html


def test_clean_report_says_everything_agrees(tmp_path):
    t = synthetic_table([api("Torch_relu_0_forward"), api("Torch_relu_0_backward")])
    html = render_html(t, advise(t))
    assert "Everything agrees." in html and "No suspect." in html and "No row fails." in html


def test_api_series_takes_the_largest_output_error_per_call_in_order():
    t = _faulty()
    names, c, r, f = api_series(t, "forward", optimizer=False)
    assert names == ["Functional_linear_0_forward", "Functional_linear_1_forward",
                     "Torch_relu_0_forward", "Torch_log_0_forward"]
    assert r[1] == 2e-2 and list(f) == [False, True, True, True]
    assert math.isinf(r[3]) and math.isinf(c[3])
    assert c[1] == 1 - (1 - 2e-2 ** 2 / 2)
    names, c, r, f = api_series(t, "forward", optimizer=True)
    assert names == ["Tensor_add__0_forward"]
    assert api_series(t, "backward")[0] == ["Torch_relu_0_backward"]


def test_error_plot_handles_zero_nan_inf_and_marks():
    data = PlotData(names=["a", "b<", "c", "d"],
                    series=[Series("rel", [0.0, 1e-6, float("nan"), float("inf")]),
                            Series("cos", [1e-12, 1e-3, 2.0, 0.5])],
                    failing=[False, True, False, True], marks=[Mark(1, "#1 b<")], shade_from=1)
    svg = error_plot(data, "T")
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert "#1 b&lt;" in svg
    assert "\u2264" + "1e-13<" in svg and ">1e1<" in svg  # decades cover 1e-12 .. 2; zero on the floor
    assert svg.count("<polyline") == 2  # 'rel' stops at the NaN (the inf after it is a triangle)
    assert "fill=\"#fee2e2\"" in svg
    assert "no calls" in error_plot(PlotData(names=[], series=[]), "empty")


def test_reports_do_not_import_torch():
    import subprocess
    import sys

    code = ("import sys; import pytest_ptdbg.report.html_report, pytest_ptdbg.report.csv_report, "
            "pytest_ptdbg.report.advisor_text; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
