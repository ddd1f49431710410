"""Issue 10 items 3 and 4 on real dumped training steps: non-tensor arguments are evidence, and a
call recorded on one side only is classified as bookkeeping or value-changing."""
import torch
import torch.nn.functional as F



def _gpt(dump_step, name, **kw):
    torch.manual_seed(0)   # the same dropout masks in every dump
    return dump_step(name, "tiny_gpt", **kw)


def _eps(value):
    def prepare(model):
        model.blocks[0].ln1.eps = value
    return prepare


def test_changed_layer_norm_eps_is_a_failing_argument_row_naming_both_values(dump_step, compare_pair):
    npu = _gpt(dump_step, "npu", prepare=_eps(1e-2))
    bench = _gpt(dump_step, "bench")
    r = compare_pair(npu, bench, replay_check=False)
    t = r.table
    changed = t[t["_arg_changed"]]
    assert list(changed["_api"]) == ["Functional_layer_norm_0_forward"]
    row = changed.iloc[0]
    assert row["_arg"] == "eps" and row["Err_message"] == "eps: 0.01 vs 1e-05"
    assert row["Accuracy Reached or Not"] == "No" and not row["_passed"] and not r.passed
    assert row["NPU Tensor Dtype"] == "float" and row["NPU Tensor Shape"] == [] and row["NPU max"] == 0.01
    assert row["Bench min"] == 1e-05 and row["NPU Name"] == "Functional_layer_norm_0_forward_input.4"
    # every other argument of the step agrees (the other layer norms' eps among them)
    args = t[t["_arg"] != ""]
    same = args[~args["_arg_changed"]]
    assert len(same) > 20 and (same["Accuracy Reached or Not"] != "No").all()
    assert set(t.loc[(t["_arg"] == "eps") & ~t["_arg_changed"], "NPU max"]) == {1e-05}
    clean = compare_pair(_gpt(dump_step, "npu2"), bench, "out2", replay_check=False)
    assert clean.passed and not clean.table["_arg_changed"].any()


class _Hook:
    """A forward hook on ``fc1`` making one extra call; removed after the step."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, model):
        return [model.fc1.register_forward_hook(lambda mod, inp, out: self.fn(out))]


def test_a_stacklevel_difference_pairs_and_passes(dump_step, compare_pair):
    npu = dump_step("npu", "mlp", prepare=_Hook(lambda out: (F.softmax(out, -1, _stacklevel=5), None)[1]))
    bench = dump_step("bench", "mlp", prepare=_Hook(lambda out: (F.softmax(out, -1), None)[1]))
    r = compare_pair(npu, bench, replay_check=False)
    t = r.table
    sm = t[t["_api"] == "Functional_softmax_0_forward"]
    assert sm["_paired"].all() and (sm["_bench_api"] == "Functional_softmax_0_forward").all()
    lvl = sm[sm["_arg"] == "_stacklevel"]
    assert len(lvl) == 1 and lvl["_passed"].all() and "not compared" in lvl["Err_message"].iloc[0]
    dim = sm[sm["_arg"] == "dim"]
    assert len(dim) == 1 and dim["Accuracy Reached or Not"].iloc[0] == "Yes"
    assert r.passed, r.table.loc[~r.table["_passed"], ["NPU Name", "Err_message"]]


def test_an_omitted_default_and_a_negative_dim_are_the_same_argument(dump_step, compare_pair):
    npu = dump_step("npu", "mlp", prepare=_Hook(lambda out: (out.sum(-1, keepdim=False), None)[1]))
    bench = dump_step("bench", "mlp", prepare=_Hook(lambda out: (out.sum(1), None)[1]))
    r = compare_pair(npu, bench, replay_check=False)
    s = r.table[r.table["_api"] == "Tensor_sum_0_forward"]
    assert s["_paired"].all() and not s["_arg_changed"].any() and r.passed
    assert set(s["_arg"]) == {"", "dim", "keepdim"}
    keep = s[s["_arg"] == "keepdim"].iloc[0]
    assert keep["Bench Name"] == "Tensor_sum_0_forward_input.keepdim" and keep["Bench max"] == 0.0
    changed = compare_pair(npu, dump_step("b2", "mlp", prepare=_Hook(
        lambda out: (out.sum(0), None)[1])), "o2", replay_check=False)
    row = changed.table[changed.table["_arg_changed"]]
    assert list(row["_arg"]) == ["dim"] and row["Err_message"].iloc[0] == "dim: 1 vs 0"


def test_one_sided_casts_are_bookkeeping_or_value_changing(dump_step, compare_pair):
    """NPU only: ``out.to(torch.bfloat16)`` (a cast to lower precision: value-changing, a root cause)
    then ``.float()`` of that bf16 value (exact: bookkeeping), as an autocast-only path makes them."""
    npu = dump_step("npu", "mlp", prepare=_Hook(lambda out: out.to(torch.bfloat16).float()))
    bench = dump_step("bench", "mlp")
    t = compare_pair(npu, bench, replay_check=False).table
    to = t[t["_api"] == "Tensor_to_0_forward"]
    fl = t[t["_api"] == "Tensor_float_0_forward"]
    assert len(to) and (to["_code_path"] == "value-changing").all() and not to["_passed"].any()
    assert "lower precision (torch.float32 -> torch.bfloat16)" in to["Err_message"].iloc[0]
    assert len(fl) and (fl["_code_path"] == "bookkeeping").all() and fl["_passed"].all()
    assert not fl["_unusable"].any() and not to["_unusable"].any()
    fb = t[t["_api"] == "Tensor_float_0_backward"]
    assert len(fb) and (fb["_code_path"] == "bookkeeping").all() and fb["_passed"].all()
    # statistics only: the same classification from the records' statistics
    s = compare_pair(dump_step("ns", "mlp", summary_only=True,
                               prepare=_Hook(lambda out: out.to(torch.bfloat16).float())),
                     dump_step("bs", "mlp", summary_only=True), "os", replay_check=False).table
    assert (s.loc[s["_api"] == "Tensor_to_0_forward", "_code_path"] == "value-changing").all()
    assert (s.loc[s["_api"] == "Tensor_float_0_forward", "_code_path"] == "bookkeeping").all()


def test_an_extra_exact_cast_does_not_fail_the_step(dump_step, compare_pair):
    npu = dump_step("npu", "mlp", prepare=_Hook(lambda out: out.double().float().contiguous()))
    bench = dump_step("bench", "mlp")
    r = compare_pair(npu, bench, replay_check=False)
    one = r.table[~r.table["_paired"]]
    assert len(one) and (one["_code_path"] == "bookkeeping").all()
    assert r.passed, r.table.loc[~r.table["_passed"], ["NPU Name", "Err_message"]]
