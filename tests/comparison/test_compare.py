"""compare() end to end on synthetic ptdbg dumps (tests/dumps.py): outputs, pairing, bad input."""
import math
import os
import re

import numpy as np
import pandas as pd
import pytest

from pytest_ptdbg import compare
from pytest_ptdbg.comparison.schema import FULL_COLUMNS, SUMMARY_COLUMNS
from pytest_ptdbg.format import records

import dumps
from comparing import input_param_for
from locations import DATA_DIR, step_paths

CSV_FULL = FULL_COLUMNS
CSV_SUMMARY = SUMMARY_COLUMNS


def _pair(tmp_path, npu_apis, bench_apis, **kw):
    dumps.write_dump(str(tmp_path / "npu"), npu_apis, **kw)
    dumps.write_dump(str(tmp_path / "bench"), bench_apis, **kw)
    return str(tmp_path / "npu"), str(tmp_path / "bench")


def _param(npu, bench, data=True):
    """``input_param`` of two dump roots' step 0 rank 0 (their ``.pkl`` files; data folders unless ``data=False``)."""
    return input_param_for(step_paths(npu), step_paths(bench), with_data=data)


def test_clean_pair_writes_ptdbg_outputs(tmp_path):
    npu, bench = _pair(tmp_path, dumps.mlp_apis(noise=1e-6), dumps.mlp_apis())
    r = compare(_param(npu, bench), str(tmp_path / "out"), stack_mode=True)
    assert r.passed and r.problems == [] and not r.summary_compare
    assert r.advice.all_agree and r.first_suspect is None
    csv = pd.read_csv(r.csv_path)
    assert list(csv.columns) == CSV_FULL + ["NPU_Stack_Info"]
    n_tensors = sum(len(a.tensors) for a in dumps.mlp_apis())
    assert len(csv) == n_tensors and (csv["Accuracy Reached or Not"] == "Yes").all()
    assert csv["NPU Name"].iloc[0] == "Functional_linear_0_forward_input.0"
    assert "model.py" in csv["NPU_Stack_Info"].iloc[0]
    assert os.path.basename(r.csv_path).startswith("compare_result_")
    assert os.path.basename(r.advisor_path).startswith("advisor_") and os.path.isfile(r.html_path)
    # the internal columns of DESIGN.md
    t = r.table
    assert t["_paired"].all() and t["_passed"].all()
    assert list(t["_order"].drop_duplicates()) == list(range(len(dumps.mlp_apis())))
    assert set(t["_direction"]) == {"forward", "backward"}
    assert (t.loc[t["_api"] == "Tensor_sub__0_forward", "_ctx"] == "optimizer").all()
    assert (t["_rel_l2"] < 1e-4).all()


def test_planted_forward_fault_fails_and_is_named(tmp_path):
    npu, bench = _pair(tmp_path, dumps.mlp_apis(noise=1e-6, fault="forward", fault_scale=0.5), dumps.mlp_apis())
    r = compare(_param(npu, bench), str(tmp_path / "out"))
    assert not r.passed
    t = r.table
    relu_out = t[(t["_api"] == "Torch_relu_0_forward") & (t["_io"] == "output")].iloc[0]
    relu_in = t[(t["_api"] == "Torch_relu_0_forward") & (t["_io"] == "input")].iloc[0]
    assert relu_out["Accuracy Reached or Not"] == "No" and relu_in["Accuracy Reached or Not"] == "Yes"
    assert r.first_suspect.api == "Torch_relu_0_forward"
    assert "Torch_relu_0_forward" in open(r.advisor_path).read()


def test_nan_appearing_is_flagged(tmp_path):
    npu, bench = _pair(tmp_path, dumps.mlp_apis(fault="nan"), dumps.mlp_apis())
    r = compare(_param(npu, bench), str(tmp_path / "out"))
    row = r.table[r.table["NPU Name"] == "Functional_linear_1_forward_output.0"].iloc[0]
    assert row["_nan_mismatch"] and row["Accuracy Reached or Not"] == "No"
    assert "position of inf or nan do not match" in row["Err_message"]
    assert row["_npu_nonfinite"] == 1 and row["_bench_nonfinite"] == 0
    assert r.first_suspect.api == "Functional_linear_1_forward" and r.first_suspect.kind == "nonfinite"


@pytest.mark.parametrize("data", [True, False])
def test_nan_statistics_raise_no_warning_into_a_strict_run(tmp_path, dump_step, data):
    """NaN and Inf statistics are data: a compare under ``-W error`` (warnings as errors, as many
    CI runs are) judges them without a numpy RuntimeWarning."""
    import warnings

    import torch

    def run(name, scale):
        x = torch.tensor([1.0, float("inf"), -2.0, 3.0] * 64)

        def step():
            y = torch.relu(x) * scale  # Inf on both sides: inf - inf in the statistics
            torch.tanh(y)
        return dump_step(name, step, summary_only=not data).rank_dir

    npu, bench = run("n", 1.5), run("b", 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = compare(input_param_for(npu + "/api_stack_dump.pkl", bench + "/api_stack_dump.pkl"), str(tmp_path / "out"))
    assert not r.passed and r.first_suspect.api == "Tensor_mul_0_forward"


def test_summary_compare_without_data_dirs(tmp_path):
    npu, bench = _pair(tmp_path, dumps.mlp_apis(fault="forward", fault_scale=0.9), dumps.mlp_apis())
    r = compare(_param(npu, bench, data=False), str(tmp_path / "out"))
    assert r.summary_compare
    csv = pd.read_csv(r.csv_path)
    assert list(csv.columns) == CSV_SUMMARY
    row = r.table[r.table["NPU Name"] == "Torch_relu_0_forward_output.0"].iloc[0]
    assert row["Max diff"] == pytest.approx(row["NPU max"] - row["Bench max"])
    assert not math.isnan(row["_rel_l2"])
    # a statistics-only dump on one side also gives a summary compare, with a note
    dumps.write_dump(str(tmp_path / "stat"), dumps.mlp_apis(), save_data=False)
    r2 = compare(input_param_for(npu, str(tmp_path / "stat")), str(tmp_path / "out2"))
    assert r2.summary_compare and any("no saved tensors" in p for p in r2.notes)


def test_extra_call_is_listed_unpaired_and_the_rest_pairs(tmp_path):
    npu, bench = _pair(tmp_path, dumps.mlp_apis(extra_cast=True), dumps.mlp_apis())
    r = compare(_param(npu, bench), str(tmp_path / "out"))
    t = r.table
    extra = t[t["_api"] == "Tensor_to_0_forward"]
    assert len(extra) == 2 and not extra["_paired"].any()
    assert extra["Bench Name"].eq("").all() and "no matching bench API" in extra["Err_message"].iloc[0]
    rest = t[t["_api"] != "Tensor_to_0_forward"]
    assert rest["_paired"].all() and (rest["NPU Name"] == rest["Bench Name"]).all()
    # a call on one side only is classified from its own records (issue 10 item 4; this used to be
    # "No" whatever it did): this cast's output equals its input, so it is bookkeeping and passes
    assert (extra["_code_path"] == "bookkeeping").all() and extra["_passed"].all() and not extra["_unusable"].any()
    assert "bookkeeping" in extra["Err_message"].iloc[0] and r.passed
    assert r.gate == "judge" and not r.judgement.root_causes
    assert rest["_passed"].all() and (rest["_code_path"] == "").all()
    # the same extra call changing its values is a failing, value-changing row (a root cause)
    apis = dumps.mlp_apis(extra_cast=True)
    cast = next(a for a in apis if a.key == "Tensor_to_0_forward")
    cast.tensors["output.0"] = (cast.tensors["output.0"] * 1.01).astype(np.float32)
    npu2 = str(tmp_path / "npu2")
    dumps.write_dump(npu2, apis)
    r2 = compare(_param(npu2, bench), str(tmp_path / "out2"))
    extra2 = r2.table[r2.table["_api"] == "Tensor_to_0_forward"]
    assert (extra2["_code_path"] == "value-changing").all() and not extra2["_passed"].any() and not r2.passed
    assert "differs" in extra2["Err_message"].iloc[0]


def test_dtype_rule_accepts_a_bf16_device(tmp_path):
    def bf16(a):
        u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
        return ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)

    rng = np.random.default_rng(0)
    x = (300 * rng.standard_normal((64, 64))).astype(np.float32)
    npu_api = dumps.Api("Tensor_mul_0_forward", {"input.0": bf16(x), "output.0": bf16(2 * bf16(x))},
                        dtypes={"input.0": "torch.bfloat16", "output.0": "torch.bfloat16"})
    bench_api = dumps.Api("Tensor_mul_0_forward", {"input.0": x, "output.0": 2 * x})
    npu, bench = _pair(tmp_path, [npu_api], [bench_api])
    assert not compare(_param(npu, bench), str(tmp_path / "o1"), rule="ptdbg").passed  # |err| > 1
    assert compare(_param(npu, bench), str(tmp_path / "o0")).passed  # the default judges bf16 as bf16
    r = compare(_param(npu, bench), str(tmp_path / "o2"), rule="dtype")
    assert r.passed and r.table.attrs["rule"] == "dtype"


def test_bad_inputs_are_named_and_the_rest_goes_on(tmp_path):
    special = dumps.Api("Torch_special_0_forward", {
        "input.0": np.full((3,), np.nan, np.float32),         # NaN-only, both sides
        "input.1": np.zeros((0, 4), np.float32),               # empty
        "input.2": np.array(2.5, np.float32),                  # scalar
        "input.3": np.array([1, 2, 3], np.int64),              # int
        "input.4": np.array([True, False]),                    # bool
        "output.0": np.ones((4,), np.float32),
    })
    npu_apis = dumps.mlp_apis() + [special]
    bench_apis = dumps.mlp_apis() + [special]
    npu, bench = _pair(tmp_path, npu_apis, bench_apis)
    rn = records.rank_dir(npu, 0, 0)
    ddir = os.path.join(rn, "api_stack_dump")
    # an .npy that does not match its record, and a missing one
    np.save(os.path.join(ddir, "Torch_relu_0_forward_output.0.npy"), np.zeros((3, 3), np.float32))
    os.remove(os.path.join(ddir, "Functional_softmax_0_forward_output.0.npy"))
    # a corrupt line and a truncated last line in the NPU .pkl
    pkl = os.path.join(rn, "api_stack_dump.pkl")
    lines = open(pkl).read().splitlines(keepends=True)
    lines.insert(2, "[\"broken\n")
    open(pkl, "w").write("".join(lines) + lines[0][:20])
    r = compare(_param(npu, bench), str(tmp_path / "out"))
    t = r.table.set_index("NPU Name")
    shape = t.loc["Torch_relu_0_forward_output.0"]
    assert "Torch_relu_0_forward_output.0.npy" in shape["Err_message"] and "[3, 3]" in shape["Err_message"]
    missing = t.loc["Functional_softmax_0_forward_output.0"]
    assert "not found" in missing["Err_message"] and math.isnan(missing["Cosine"])
    assert any(f"{pkl}:3: corrupt" in p for p in r.problems)
    assert any("truncated" in p and pkl in p for p in r.problems)
    assert any("Torch_relu_0_forward_output.0" in p for p in r.problems)
    assert "no finite element" in t.loc["Torch_special_0_forward_input.0", "Err_message"]
    assert t.loc["Torch_special_0_forward_input.0", "Accuracy Reached or Not"] == ""
    assert "empty" in t.loc["Torch_special_0_forward_input.1", "Err_message"]
    assert "scalar" in t.loc["Torch_special_0_forward_input.2", "Err_message"]
    assert t.loc["Torch_special_0_forward_input.3", "Accuracy Reached or Not"] == "Yes"
    assert t.loc["Torch_special_0_forward_input.4", "MaxAbsErr"] == 0.0
    # everything else was compared
    ok = t.drop(index=["Torch_relu_0_forward_output.0", "Functional_softmax_0_forward_output.0"])
    cos = ok.loc[[n for n in ok.index if not n.startswith("Torch_special")], "Cosine"]
    assert ((cos > 1 - 1e-12) | cos.isna()).all() and cos.notna().sum() >= len(cos) - 2  # 2 scalars


def test_missing_dump_and_different_modes(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        compare({"npu_pkl_path": str(tmp_path / "nowhere"), "bench_pkl_path": str(tmp_path)}, str(tmp_path / "o"))
    with pytest.raises(ValueError, match="bench_pkl_path"):
        compare({"npu_pkl_path": str(tmp_path)}, str(tmp_path / "o"))
    dumps.write_dump(str(tmp_path / "npu"), dumps.mlp_apis())
    dumps.write_dump(str(tmp_path / "bench"), dumps.mlp_apis()[:5], mode="list")
    r = compare(input_param_for(str(tmp_path / "npu"), str(tmp_path / "bench")), str(tmp_path / "o"))
    assert any("different modes" in p and "'list'" in p for p in r.notes)
    assert (~r.table["_paired"]).sum() > 0 and r.table["_paired"].sum() > 0


def test_progress_log_is_printed(tmp_path, capsys):
    npu, bench = _pair(tmp_path, dumps.mlp_apis(), dumps.mlp_apis())
    p = _param(npu, bench)
    p["is_print_compare_log"] = True
    compare(p, str(tmp_path / "out"))
    out = capsys.readouterr().out
    assert "full compare" in out and "tensor pairs" in out and "Suspect Nodes" in out


MSPROBE = os.path.join(DATA_DIR, "msprobe")


@pytest.mark.skipif(not os.path.isdir(MSPROBE), reason="no msprobe sample")
def test_msprobe_dumps(tmp_path):
    p = input_param_for(os.path.join(MSPROBE, "mlp_statistics_bf16"), os.path.join(MSPROBE, "mlp_statistics_fp32"))
    ptdbg_rule = compare(p, str(tmp_path / "a"))
    dtype_rule = compare(p, str(tmp_path / "b"), rule="dtype")
    for r in (ptdbg_rule, dtype_rule):
        assert r.summary_compare and r.table["_paired"].all() and r.problems == []
        assert r.table["NPU Name"].iloc[0] == "Functional.linear.0.forward.input.0"
    pytest.importorskip("torch")
    t = os.path.join(MSPROBE, "mlp_tensor")
    r = compare(input_param_for(t, t), str(tmp_path / "c"))
    assert not r.summary_compare and r.passed and r.problems == []
    assert (r.table["Cosine"].dropna() > 1 - 1e-12).all() and r.table["Cosine"].notna().sum() > 20


def test_two_compares_in_one_second_keep_both_outputs(tmp_path, monkeypatch):
    from pytest_ptdbg import api

    monkeypatch.setattr(api, "_timestamp", lambda: "20260101000000")
    npu, bench = _pair(tmp_path, dumps.mlp_apis(noise=1e-6), dumps.mlp_apis())
    first = compare(_param(npu, bench), str(tmp_path / "out"))
    second = compare(_param(npu, bench, data=False), str(tmp_path / "out"))
    assert first.csv_path != second.csv_path and os.path.isfile(first.csv_path)
    assert first.html_path != second.html_path and first.advisor_path != second.advisor_path
    assert re.fullmatch(r"compare_result_20260101000000_[0-9a-f]{4}\.csv", os.path.basename(second.csv_path))
    assert list(pd.read_csv(first.csv_path).columns) == CSV_FULL
    assert list(pd.read_csv(second.csv_path).columns) == CSV_SUMMARY


@pytest.mark.skipif(not os.path.isdir(MSPROBE), reason="no msprobe sample")
def test_msprobe_dump_json_paths_find_their_tensors(tmp_path):
    """compare() given msprobe dump.json files (no data-dir keys) compares the tensors in
    dump_tensor_data beside them, as the CLI does; a ptdbg .pkl without them stays statistics."""
    pytest.importorskip("torch")
    j = os.path.join(MSPROBE, "mlp_tensor", "step0", "proc7910", "dump.json")
    r = compare(input_param_for(j, j), str(tmp_path / "c"))
    assert not r.summary_compare and r.passed
    assert r.table["Cosine"].notna().sum() > 20


@pytest.mark.skipif(not os.path.isdir(MSPROBE), reason="no msprobe sample")
def test_msprobe_keyword_arguments_are_named_as_msprobe_names_them():
    from pytest_ptdbg.dump import reader

    d = reader.read_dump(os.path.join(MSPROBE, "mlp_statistics_fp32"))
    add = next(a for a in d.apis if a.key == "Tensor.add_.0.forward")
    alpha = next(t for t in add.tensors if t.slot == "input.alpha")
    assert alpha.name == "Tensor.add_.0.forward.input.alpha" and alpha.dtype == "float" and alpha.shape == ()
    assert alpha.stats == [-0.1] * 4
    assert add.tensors[0].extra["call"]["kwargs"] == {"alpha": -0.1}


def test_worker_processes_give_the_same_table_as_threads(tmp_path, monkeypatch):
    from pytest_ptdbg.comparison import table as T
    from pytest_ptdbg.dump import reader

    npu, bench = _pair(tmp_path, dumps.mlp_apis(noise=1e-3), dumps.mlp_apis())
    a, b = reader.read_dump(npu), reader.read_dump(bench)
    threads = T.build_table(a, b, workers=2)
    monkeypatch.setattr(T, "PROCESS_MIN_PAIRS", 1)
    seen = []
    procs = T.build_table(a, b, workers=2, progress=seen.append)
    pd.testing.assert_frame_equal(threads, procs)
    assert seen[-1].startswith("compared ") and threads["Cosine"].notna().sum() > 10
