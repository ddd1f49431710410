"""The golden's pure parts against hand-computed values: names, rounding, drift, parsing, the
checks and the reference dump (no torch, no pytest session)."""
import json
import math

import pytest

from pytest_ptdbg.format import manifest, records
from pytest_ptdbg.plugin import golden, golden_check
from pytest_ptdbg.plugin.golden_check import FreshDump, check, drift


def test_names_and_paths():
    assert golden.golden_name("t/test_a.py::test_x[mlp-3]") == "test_x-mlp-3.golden.jsonl"
    assert golden.golden_name("t/test_a.py::TestC::test_y", 2) == "TestC.test_y.call2.golden.jsonl"
    # ids whose characters are replaced get a hash: two of them never share a file
    a, b = golden.golden_name("t.py::test_x[a/b]"), golden.golden_name("t.py::test_x[a_b]")
    assert a.startswith("test_x-a_b-") and b == "test_x-a_b.golden.jsonl" and a != b
    assert golden.golden_path("t/test_a.py::test_x", 0, "/r") == \
        "/r/t/__ptdbg__/test_a/test_x.golden.jsonl"
    assert golden.golden_path("t/test_a.py::test_x", 0, "/r", "/g") == "/g/t/test_a/test_x.golden.jsonl"


def test_statistics_at_the_digits_the_tolerance_needs():
    # float32: 5 significant digits; the mean to the decimal place of max/min
    assert golden.round_stats([1.4578152894973755, -0.5, 1.23456789e-7, 3.33333333], "float32") == \
        [1.4578, -0.5, 0.0, 3.3333]
    assert golden.round_stats([3, 1, 2, 5], "int64") == [3, 1, 2, 5]
    assert golden.round_stats([1.00123456789, 0, 0, 1], "float64")[0] == 1.0012345679


def test_rounding_keeps_six_significant_digits():
    assert golden.round_stat(1.4578152894973755, 6) == 1.45782
    assert golden.round_stat(-0.06320667282367746, 6) == -0.0632067
    assert golden.round_stat(1.6453365484873455e-08, 6) == 1.64534e-08
    assert golden.round_stat(float("nan")) == "nan" and golden.round_stat(float("-inf")) == "-inf"
    assert golden.round_stat(3) == 3 and golden.round_stat(True) is True
    assert golden.round_stat(-0.0) == 0.0 and math.copysign(1, golden.round_stat(-0.0)) == 1


def test_drift_relative_to_range_and_l2():
    # max moves by 0.001 over a range of max(1.001, 1) -> 0.001 / 1.001
    assert drift([1, -1, 0, 2], [1.001, -1, 0, 2]) == pytest.approx(0.001 / 1.001)
    # mean near zero moves by 1e-4 of the range 2 -> 5e-5 (not relative to the mean itself)
    assert drift([2, -2, 1e-9, 3], [2, -2, 1e-4 + 1e-9, 3]) == pytest.approx(5e-5)
    # the L2 norm relative to itself: 3 -> 3.03 is 1 %
    assert drift([1, -1, 0, 3], [1, -1, 0, 3.03]) == pytest.approx(0.01)
    assert drift([0, 0, 0, 0], [0, 0, 0, 0]) == 0.0
    assert drift([0, 0, 0, 0], [1e-9, 0, 0, 1e-9]) == math.inf
    assert drift([1, "nan", 0, 1], [1, 0.5, 0, 1]) == math.inf
    assert drift(["nan"] * 4, ["nan"] * 4) == 0.0


KEY = "model.ln/layer_norm#0"


def _lines(scale=1.0, eps=1e-5, extra_call=False):
    out = [{"k": KEY, "api": "Functional_layer_norm", "args": {"eps": eps},
            "forward": {"input.input": ["float32", [2, 4], [1.0, -1.0, 0.0, 2.0]],
                        "output.0": ["float32", [2, 4], [1.5 * scale, -1.5, 0.0, 2.8]]}}]
    if extra_call:
        out.append({"k": "model.fc/to#0", "api": "Tensor_to", "args": {},
                    "forward": {"output.0": ["bfloat16", [2, 4], [1.0, -1.0, 0.0, 2.0]]}})
    return out


def _golden(lines):
    text = golden.render(golden.header("t.py::t", 0, "api_stack", "cpu"), lines)
    return golden.parse(text, "g.golden.jsonl")


def _fresh(lines):
    return FreshDump(lines, {KEY: "Functional_layer_norm_0", "model.fc/to#0": "Tensor_to_0"},
                     {"Functional_layer_norm_0": [["/x/torch/nn/functional.py", 1, "f", "c"],
                                                  ["/u/model.py", 7, "forward", "y = ln(x)"]]},
                     calls=golden.resolve(lines),
                     order={KEY: {"forward": 0}, "model.fc/to#0": {"forward": 1}})


def test_check_agrees_within_the_dtype_tolerance():
    assert check(_golden(_lines()), _fresh(_lines(scale=1.0001))).passed      # 1e-4 < 5e-4


def test_check_names_drift_arguments_and_new_calls():
    res = check(_golden(_lines()), _fresh(_lines(scale=1.01)))
    assert [d.kind for d in res.differences] == ["statistics"]
    assert res.culprit.key == KEY
    assert res.location == "/u/model.py:7 in forward: y = ln(x)"   # outside torch
    assert "1 call changed in model.ln:" in res.message("t.py::t")
    assert "layer_norm#0 forward.output.0 max 1.5 -> 1.515" in res.message("t.py::t")
    res = check(_golden(_lines()), _fresh(_lines(eps=1e-3)))
    assert res.culprit.kind == "arguments" and "eps 1e-05 -> 0.001" in res.message("t.py::t")
    res = check(_golden(_lines()), _fresh(_lines(extra_call=True)))
    assert res.culprit.kind == "new call" and res.culprit.key == "model.fc/to#0"
    res = check(_golden(_lines(extra_call=True)), _fresh(_lines()))
    assert res.culprit.kind == "missing call"
    assert check(_golden(_lines()), _fresh(_lines(eps=1e-3)), ignore=["layer_norm"]).passed


def test_a_renamed_module_path_still_pairs():
    moved = [dict(x, k="model/layer_norm#2") for x in _lines()]
    assert check(_golden(_lines()), _fresh(moved)).passed
    res = check(_golden(_lines()), _fresh([dict(x, k="model/layer_norm#2") for x in _lines(scale=1.01)]))
    assert [d.kind for d in res.differences] == ["statistics"]
    assert "layer_norm#2 (golden model.ln/layer_norm#0)" in res.message("t.py::t")


def test_grouped_message_one_line_per_call_by_module():
    lines = [dict(_lines()[0], k=f"model.blocks.{i // 3}/layer_norm#{i % 3}") for i in range(6)]
    changed = [dict(x, forward=dict(x["forward"], **{"output.0": ["float32", [2, 4], [1.6, -1.5, 0.0, 2.8]]}))
               if i in (0, 1, 4) else x for i, x in enumerate(lines)]
    msg = check(_golden(lines), _fresh(changed)).message("t.py::t")
    body = msg.split("one line per changed call, by module:\n", 1)[1].splitlines()
    assert body[0] == "  2 calls changed in model.blocks.0:"
    assert body[1].startswith("    layer_norm#0 forward.output.0 max 1.5 -> 1.6 (drifted")
    assert body[2].startswith("    layer_norm#1 forward.output.0")
    assert body[3] == "  1 call changed in model.blocks.1:"
    assert body[4].startswith("    layer_norm#1 forward.output.0")


def test_float_arguments_agree_within_their_last_bits():
    same = golden_check.same_arguments
    assert same({"args": [0.125000001, 3], "kwargs": {}}, {"args": [0.125, 3], "kwargs": {}})
    assert not same({"kwargs": {"eps": 1e-5}}, {"kwargs": {"eps": 1e-3}})
    assert not same({"args": [1]}, {"args": [True]}) and not same({"args": [1]}, {"args": ["1"]})
    assert not same({"args": [1, 2]}, {"args": [1]}) and not same({"a": 1}, {"b": 1})
    assert same({"args": [2]}, {"args": [2.0]}) and not same({"args": [2]}, {"args": [3]})


def test_parse_names_the_bad_line(tmp_path):
    text = golden.render(golden.header("t.py::t", 0, "api_stack", "cpu"), _lines())
    assert golden.parse(text, "x").lines == _lines()
    with pytest.raises(golden.GoldenError, match=r"x:2: not a JSON line"):
        golden.parse(text.replace('"output.0":', '"output.0"'), "x")
    with pytest.raises(golden.GoldenError, match=r"x:1: not a pytest-ptdbg golden header"):
        golden.parse('{"nodeid": "a"}\n', "x")
    with pytest.raises(golden.GoldenError, match="empty"):
        golden.parse("", "x")


def test_write_only_when_changed(tmp_path):
    path = str(tmp_path / "a" / "t.golden.jsonl")
    assert golden.write(path, "x\n") is True
    assert golden.write(path, "x\n") is False
    assert golden.write(path, "y\n") is True


def test_reference_dump_pairs_by_alignment_and_keeps_golden_only_calls_apart(tmp_path):
    g = _golden(_lines(extra_call=True))
    fresh = FreshDump(_lines(), {KEY: "Functional_layer_norm_4"}, calls=golden.resolve(_lines()),
                      slots={KEY: {"forward.input.input": "input.0", "forward.output.0": "output.0"}},
                      specs={KEY: {"args": [{"t": "input.0"}], "kwargs": {"eps": 1e-5}}},
                      order={KEY: {"forward": 0}})
    pkl = golden_check.write_reference_dump(g, fresh, str(tmp_path), "api_stack")
    recs = [json.loads(x) for x in open(pkl)]
    assert [r[0] for r in recs] == ["Functional_layer_norm_4_forward_input.0",
                                    "Functional_layer_norm_4_forward_output.0",
                                    "Tensor_to_10000_forward_output.1000"]
    assert recs[0][3] == "torch.float32" and recs[0][6]["call"]["kwargs"]["eps"] == 1e-5
    assert manifest.read_manifest(pkl)["records"] == 3
    assert pkl == records.pkl_path(str(tmp_path), 0, 0, "api_stack")
