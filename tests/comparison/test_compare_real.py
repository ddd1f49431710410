"""compare() on real dumps of a real model step (PrecisionDebugger, forward + backward + SGD step)."""
import pytest

from real_dumps import dump_one_step, perturb

torch = pytest.importorskip("torch")

from example_models import train_step  # noqa: E402
from pytest_ptdbg import PrecisionDebugger, compare, parse  # noqa: E402
from pytest_ptdbg.dump import reader  # noqa: E402


def _dump(path, summary_only=False, scale=None):
    prepare = (lambda m: perturb(m, "fc1.weight", add=scale)) if scale is not None else None
    return dump_one_step(path, summary_only=summary_only, prepare=prepare).dump_path


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    root = tmp_path_factory.mktemp("real")
    return {"a": _dump(root / "a"), "b": _dump(root / "b"), "stat": _dump(root / "stat", summary_only=True),
            "scaled": _dump(root / "scaled", scale=0.2)}


def test_same_run_twice_agrees(real, tmp_path):
    r = compare({"npu_pkl_path": real["a"], "bench_pkl_path": real["b"], "is_print_compare_log": False},
                str(tmp_path), stack_mode=True)
    t = r.table
    assert r.passed and r.advice.all_agree and not r.summary_compare and r.problems == []
    assert t["_paired"].all() and set(t["_direction"]) == {"forward", "backward"}
    assert (t["_ctx"] == "optimizer").any()
    compared = t[t["Cosine"].notna()]
    assert len(compared) > len(t) // 2 and (compared["MaxAbsErr"] == 0).all()


def test_statistics_only_dump_gives_summary_compare(real, tmp_path):
    d = reader.read_dump(real["stat"])
    assert not d.has_data and d.apis[0].stack
    r = compare({"npu_pkl_path": real["stat"], "bench_pkl_path": real["a"], "is_print_compare_log": False},
                str(tmp_path))
    assert r.summary_compare and r.passed
    assert (r.table["Max diff"].dropna() == 0).all()


def test_changed_weights_are_seen_as_inputs_that_differ(real, tmp_path):
    r = compare({"npu_pkl_path": real["scaled"], "bench_pkl_path": real["a"], "is_print_compare_log": False},
                str(tmp_path))
    t = r.table
    assert not r.passed
    first_bad = t[t["Accuracy Reached or Not"] == "No"].iloc[0]
    assert first_bad["_api"] == "Functional_linear_0_forward" and first_bad["_io"] == "input"
    assert first_bad["_index"] == "1"                       # the weight of fc1


def test_parse_real_dump(real, capsys):
    found = parse(real["a"], "Functional_linear_0_forward")
    assert found and "example_models" in capsys.readouterr().out


def _gpt_dump(path):
    from example_models import tiny_gpt

    torch.manual_seed(0)
    model, batch = tiny_gpt(seed=0, batch_size=2, seq_len=8)
    dbg = PrecisionDebugger(dump_path=str(path), hook_name="dump", step=[0])
    dbg.configure_hook(mode="api_stack")
    torch.manual_seed(0)  # same dropout masks
    dbg.start()
    train_step(model, batch)
    dbg.stop()
    dbg.step()
    return str(path)


def test_python_scalars_are_compared_from_their_value_without_problems(tmp_path):
    """tiny GPT: arange(T), scale factors, dims... are Python numbers, never saved as files."""
    import os

    a, b = _gpt_dump(tmp_path / "a"), _gpt_dump(tmp_path / "b")
    r = compare({"npu_pkl_path": a, "bench_pkl_path": b, "is_print_compare_log": False}, str(tmp_path / "o"))
    assert not r.summary_compare and r.passed and r.problems == []
    t = r.table
    scalars = t[t["NPU Tensor Dtype"].isin(["int", "float"])]
    assert len(scalars) > 20 and (scalars["Accuracy Reached or Not"] != "No").all()
    assert (scalars["Accuracy Reached or Not"] == "Yes").sum() > 20   # -inf fill values: nothing finite
    assert not scalars["Err_message"].str.contains("not found").any()
    # a tensor whose file is missing is still reported, 0-d or not
    d = reader.read_dump(a)
    zero_d = next(t for x in d.apis for t in x.tensors if t.shape == () and t.dtype.startswith("torch.") and t.data_file)
    big = next(t for x in d.apis for t in x.tensors if len(t.shape) == 2 and t.data_file)
    for t in (zero_d, big):
        os.remove(t.data_file)
    r = compare({"npu_pkl_path": a, "bench_pkl_path": b, "is_print_compare_log": False}, str(tmp_path / "o2"),
                replay_check=False)
    assert len(r.problems) == 2 and all("not found" in p for p in r.problems)
    assert {zero_d.name, big.name} == {n for n in r.table["NPU Name"] if any(n + ".npy" in p for p in r.problems)}
