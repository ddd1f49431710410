"""compare() on real dumps of a real model step (PrecisionDebugger, forward + backward + SGD step)."""
import pytest

from real_dumps import dump_one_step, perturb, seeded

torch = pytest.importorskip("torch")

from pytest_ptdbg import parse  # noqa: E402
from pytest_ptdbg.dump import reader  # noqa: E402


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    root = tmp_path_factory.mktemp("real")
    return {"a": dump_one_step(root / "a").dump_path, "b": dump_one_step(root / "b").dump_path,
            "stat": dump_one_step(root / "stat", summary_only=True).dump_path,
            "scaled": dump_one_step(root / "scaled", prepare=lambda m: perturb(m, "fc1.weight", add=0.2)).dump_path}


def test_same_run_twice_agrees(real, compare_pair):
    r = compare_pair(real["a"], real["b"], stack_mode=True)
    t = r.table
    assert r.passed and r.advice.all_agree and not r.summary_compare and r.problems == []
    assert t["_paired"].all() and set(t["_direction"]) == {"forward", "backward"}
    assert (t["_ctx"] == "optimizer").any()
    compared = t[t["Cosine"].notna()]
    assert len(compared) > len(t) // 2 and (compared["MaxAbsErr"] == 0).all()


def test_statistics_only_dump_gives_summary_compare(real, compare_pair):
    d = reader.read_dump(real["stat"])
    assert not d.has_data and d.apis[0].stack
    r = compare_pair(real["stat"], real["a"])
    assert r.summary_compare and r.passed
    assert (r.table["Max diff"].dropna() == 0).all()


def test_changed_weights_are_seen_as_inputs_that_differ(real, compare_pair):
    r = compare_pair(real["scaled"], real["a"])
    t = r.table
    assert not r.passed
    first_bad = t[t["Accuracy Reached or Not"] == "No"].iloc[0]
    assert first_bad["_api"] == "Functional_linear_0_forward" and first_bad["_io"] == "input"
    assert first_bad["_index"] == "1"                       # the weight of fc1


def test_parse_real_dump(real, capsys):
    found = parse(real["a"], "Functional_linear_0_forward")
    assert found and "example_models" in capsys.readouterr().out


def test_python_scalars_are_compared_from_their_value_without_problems(dump_step, compare_pair):
    """tiny GPT: arange(T), scale factors, dims... are Python numbers, never saved as files."""
    import os

    a, b = (dump_step(name, "tiny_gpt", model_kw=dict(batch_size=2, seq_len=8),
                      around=lambda: seeded(0)).dump_path for name in ("a", "b"))   # same dropout masks
    r = compare_pair(a, b, "o")
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
    r = compare_pair(a, b, "o2", replay_check=False)
    assert len(r.problems) == 2 and all("not found" in p for p in r.problems)
    assert {zero_d.name, big.name} == {n for n in r.table["NPU Name"] if any(n + ".npy" in p for p in r.problems)}
