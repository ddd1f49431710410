"""CompareOptions, DumpInput and the Rule enum: compare()'s arguments as one validated value."""
import os

import pytest

from pytest_ptdbg import api, compare, compare_distributed
from pytest_ptdbg.comparison.options import CompareOptions, DumpInput, inputs_from_param, param_from_inputs
from pytest_ptdbg.comparison.rule import Rule, parse_rule
from pytest_ptdbg.comparison.verdict import Thresholds
from pytest_ptdbg.dump import reader
from pytest_ptdbg.format import records

import dumps


def _pair(tmp_path):
    dumps.write_dump(str(tmp_path / "npu"), dumps.mlp_apis(noise=1e-6))
    dumps.write_dump(str(tmp_path / "bench"), dumps.mlp_apis())
    rn, rb = (records.rank_dir(str(tmp_path / s), 0, 0) for s in ("npu", "bench"))
    return {"npu_pkl_path": os.path.join(rn, "api_stack_dump.pkl"),
            "bench_pkl_path": os.path.join(rb, "api_stack_dump.pkl"),
            "npu_dump_data_dir": os.path.join(rn, "api_stack_dump"),
            "bench_dump_data_dir": os.path.join(rb, "api_stack_dump"), "is_print_compare_log": False}


def test_rule_is_a_str_enum_written_and_repred_as_its_value():
    assert Rule.JUDGE == "judge" and f"{Rule.DTYPE}" == "dtype" and repr(Rule.PTDBG) == "'ptdbg'"
    assert parse_rule(None) is Rule.JUDGE and parse_rule("dtype") is Rule.DTYPE
    assert Rule.JUDGE.row_rule is Rule.PTDBG and Rule.DTYPE.row_rule is Rule.DTYPE
    with pytest.raises(ValueError, match="unknown verdict rule 'nope'"):
        parse_rule("nope")


def test_options_are_validated_once_where_they_are_made():
    assert CompareOptions().rule is Rule.JUDGE
    assert CompareOptions(rule="dtype").rule is Rule.DTYPE   # a name becomes the enum
    with pytest.raises(ValueError, match="unknown verdict rule"):
        CompareOptions(rule="nope")
    with pytest.raises(ValueError, match="workers"):
        CompareOptions(workers=0)
    with pytest.raises(TypeError, match="thresholds"):
        CompareOptions(thresholds={"cosine": 0.9})
    with pytest.raises(TypeError, match="unexpected keyword"):
        CompareOptions.build(stack=True)
    o = CompareOptions.build(rule=None, thresholds=Thresholds(cosine=0.5))
    assert o.rule is Rule.JUDGE and o.replace(tag="rank0").tag == "rank0" and o.tag == ""
    with pytest.raises(Exception):
        o.rule = Rule.DTYPE   # frozen


def test_input_param_becomes_dump_inputs_and_back(tmp_path):
    pkl = str(tmp_path / "a.pkl")
    n, b = inputs_from_param({"npu_pkl_path": pkl, "bench_pkl_path": str(tmp_path),
                              "npu_dump_data_dir": None})
    assert n == DumpInput(pkl, None)             # given as None: found beside the .pkl
    assert b == DumpInput(str(tmp_path), None)   # a folder: found inside
    n, _ = inputs_from_param({"npu_pkl_path": pkl, "bench_pkl_path": pkl})
    assert n.data_dir == ""                      # ptdbg: no data folder given, statistics only
    assert inputs_from_param(param_from_inputs(DumpInput(pkl, ""), DumpInput(pkl, "d"))) == \
        (DumpInput(pkl, ""), DumpInput(pkl, "d"))
    with pytest.raises(ValueError, match="lacks 'bench_pkl_path'"):
        inputs_from_param({"npu_pkl_path": pkl})


def test_rule_judge_by_name_is_the_default_judgement(tmp_path):
    param = _pair(tmp_path)
    default = compare(param, str(tmp_path / "a"), replay_check=False)
    named = compare(param, str(tmp_path / "b"), replay_check=False, rule="judge")
    assert default.gate is Rule.JUDGE and named.gate is Rule.JUDGE
    assert named.passed == default.passed and open(named.csv_path, "rb").read() == open(default.csv_path, "rb").read()
    assert named.options.rule is Rule.JUDGE and named.table.attrs["rule"] is Rule.PTDBG


def test_compare_dumps_on_read_dumps_writes_what_compare_writes(tmp_path):
    param = _pair(tmp_path)
    via_shim = compare(param, str(tmp_path / "a"), replay_check=False, rule="dtype")
    n, b = inputs_from_param(param)
    res = api.compare_dumps(api.load_dump(n, "npu"), api.load_dump(b, "bench"), str(tmp_path / "b"),
                            CompareOptions(rule=Rule.DTYPE, replay_check=False, log=False))
    assert res.gate is Rule.DTYPE and res.passed == via_shim.passed
    assert open(res.csv_path, "rb").read() == open(via_shim.csv_path, "rb").read()
    assert via_shim.input_param == param


def test_a_missing_data_folder_is_the_dumps_first_problem(tmp_path):
    param = _pair(tmp_path)
    n, _ = inputs_from_param(param)
    d = api.load_dump(DumpInput(n.path, str(tmp_path / "nowhere")), "npu")
    assert d.problems[0].endswith("NPU data directory not found (statistics only)")
    assert not d.has_data
    assert isinstance(d, reader.Dump)


def test_compare_distributed_raises_a_bad_rule_once(tmp_path):
    """A bad argument is the caller's error, raised before any rank (it was each rank's error)."""
    for side in ("npu", "bench"):
        dumps.write_dump(str(tmp_path / side), dumps.mlp_apis(), rank=0)
    npu, bench = records.step_dir(str(tmp_path / "npu"), 0), records.step_dir(str(tmp_path / "bench"), 0)
    with pytest.raises(ValueError, match="unknown verdict rule 'nope'"):
        compare_distributed(npu, bench, str(tmp_path / "out"), is_print_compare_log=False, rule="nope")
    res = compare_distributed(npu, bench, str(tmp_path / "out"), is_print_compare_log=False, rule="ptdbg",
                              workers=1)
    assert res.passed and res.results[(0, 0)].gate is Rule.PTDBG


def test_rule_is_public_and_compare_takes_it(tmp_path):
    import pytest_ptdbg

    r = compare(_pair(tmp_path), str(tmp_path / "out"), replay_check=False, rule=pytest_ptdbg.Rule.PTDBG)
    assert r.gate is Rule.PTDBG and r.options.rule is Rule.PTDBG


def test_compare_given_paths_instead_of_input_param_says_what_it_takes(tmp_path):
    from pytest_ptdbg import compare

    with pytest.raises(TypeError, match=r"input_param is ptdbg's dict, not a str: compare\(\{'npu_pkl_path'"):
        compare(str(tmp_path / "npu"), str(tmp_path / "bench"))
