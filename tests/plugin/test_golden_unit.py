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


def test_rounding_keeps_six_significant_digits():
    assert golden.round_stat(1.4578152894973755) == 1.45782
    assert golden.round_stat(-0.06320667282367746) == -0.0632067
    assert golden.round_stat(1.6453365484873455e-08) == 1.64534e-08
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


def _lines(scale=1.0, eps=1e-5, extra_call=False):
    out = [{"k": "model.ln/Functional_layer_norm#0",
            "call": {"args": [{"t": "input.0"}], "kwargs": {"eps": eps, "device": "<device>"}}},
           {"k": "model.ln/Functional_layer_norm#0", "t": "forward.input.0", "dtype": "float32",
            "shape": [2, 4], "stats": [1.0, -1.0, 0.0, 2.0]},
           {"k": "model.ln/Functional_layer_norm#0", "t": "forward.output.0", "dtype": "float32",
            "shape": [2, 4], "stats": [1.5 * scale, -1.5, 0.0, 2.8]}]
    if extra_call:
        out.append({"k": "model.fc/Tensor_to#0", "call": {"args": [{"t": "input.0"}], "kwargs": {}}})
        out.append({"k": "model.fc/Tensor_to#0", "t": "forward.output.0", "dtype": "bfloat16",
                    "shape": [2, 4], "stats": [1.0, -1.0, 0.0, 2.0]})
    return out


def _golden(lines):
    return golden.Golden("g.golden.jsonl", golden.header("t.py::t", 0, "api_stack", "cpu"), lines)


def _fresh(lines):
    return FreshDump(lines, {"model.ln/Functional_layer_norm#0": "Functional_layer_norm_0",
                             "model.fc/Tensor_to#0": "Tensor_to_0"},
                     {"Functional_layer_norm_0": [["/x/torch/nn/functional.py", 1, "f", "c"],
                                                  ["/u/model.py", 7, "forward", "y = ln(x)"]]})


def test_check_agrees_within_the_dtype_tolerance():
    assert check(_golden(_lines()), _fresh(_lines(scale=1.0001))).passed      # 1e-4 < 5e-4


def test_check_names_drift_arguments_and_new_calls():
    res = check(_golden(_lines()), _fresh(_lines(scale=1.01)))
    assert [d.kind for d in res.differences] == ["statistics"]
    assert res.culprit.key == "model.ln/Functional_layer_norm#0"
    assert res.location == "/u/model.py:7 in forward: y = ln(x)"   # outside torch
    res = check(_golden(_lines()), _fresh(_lines(eps=1e-3)))
    assert res.culprit.kind == "arguments" and "1e-05" in res.message("t.py::t")
    res = check(_golden(_lines()), _fresh(_lines(extra_call=True)))
    assert res.culprit.kind == "new call" and res.culprit.key == "model.fc/Tensor_to#0"
    res = check(_golden(_lines(extra_call=True)), _fresh(_lines()))
    assert res.culprit.kind == "missing call"
    assert check(_golden(_lines()), _fresh(_lines(eps=1e-3)), ignore=["layer_norm"]).passed


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
    with pytest.raises(golden.GoldenError, match=r"x:3: not a JSON line"):
        golden.parse(text.replace('"t":"forward.input.0"', '"t":forward'), "x")
    with pytest.raises(golden.GoldenError, match=r"x:1: not a pytest-ptdbg golden header"):
        golden.parse('{"nodeid": "a"}\n', "x")
    with pytest.raises(golden.GoldenError, match="empty"):
        golden.parse("", "x")


def test_write_only_when_changed(tmp_path):
    path = str(tmp_path / "a" / "t.golden.jsonl")
    assert golden.write(path, "x\n") is True
    assert golden.write(path, "x\n") is False
    assert golden.write(path, "y\n") is True


def test_reference_dump_pairs_by_stable_key_and_keeps_golden_only_calls_apart(tmp_path):
    g = _golden(_lines(extra_call=True))
    fresh = FreshDump(_lines(), {"model.ln/Functional_layer_norm#0": "Functional_layer_norm_4"})
    pkl = golden_check.write_reference_dump(g, fresh, str(tmp_path), "api_stack")
    recs = [json.loads(x) for x in open(pkl)]
    assert [r[0] for r in recs] == ["Functional_layer_norm_4_forward_input.0",
                                    "Functional_layer_norm_4_forward_output.0",
                                    "Tensor_to_10000_forward_output.0"]
    assert recs[0][3] == "torch.float32" and recs[0][6]["call"]["kwargs"]["eps"] == 1e-5
    assert manifest.read_manifest(pkl)["records"] == 3
    assert pkl == records.pkl_path(str(tmp_path), 0, 0, "api_stack")
