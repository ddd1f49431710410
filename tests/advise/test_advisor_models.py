"""The advisor on real dumps of a real model: a fault planted in ONE API call must be named.

Both runs train an example model (MLP; CNN for the conv case) for one step (forward, loss,
backward, SGD step) under
PrecisionDebugger (statistics + full tensors). The "NPU" run gets relative 1e-6 noise on every
weight, so every API differs slightly from the bench, plus one planted fault:

* forward: the 2nd ``F.linear`` call (fc2) returns its output times (1 + 1e-2 z);
* backward: the gradient flowing back through the 1st ``F.gelu`` call is scaled by (1 + 1e-2 z)
  inside the call, so only the gradient it *produces* is wrong;
* NaN: the 2nd ``F.linear`` call puts one NaN in its output.

The faulty function replaces ``F.linear`` / ``F.gelu`` while the step runs and takes part in
``__torch_function__`` dispatch, so capture records it as that one API call (its extra
arithmetic runs inside the call and is not recorded). The comparison uses the dtype-aware rule:
ptdbg's default rule passes a 1e-2 relative error (cosine 0.99995). Each case is also compared
from statistics alone (summary compare), which must point at the same call.
"""
import os

import pandas as pd
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from pytest_ptdbg.advise import advice_text as at  # noqa: E402
from real_dumps import dump_one_step, patched, seeded  # noqa: E402

NOISE = 1e-6
FAULT = 1e-2
#: the compare of every case: the dtype-aware rule, stacks in the report
DTYPE = dict(stack_mode=True, rule="dtype")


def _faulty(orig, name, call_index, change):
    """``orig`` with ``change(output)`` applied inside its ``call_index``-th call only."""
    state = {"n": 0}

    def fn(*args, **kwargs):
        ts = tuple(a for a in args if isinstance(a, torch.Tensor))
        if torch.overrides.has_torch_function(ts):
            return torch.overrides.handle_torch_function(fn, ts, *args, **kwargs)
        k = state["n"]
        state["n"] += 1
        out = orig(*args, **kwargs)
        return change(out) if k == call_index else out

    fn.__name__ = fn.__qualname__ = name
    fn.__module__ = "torch.nn.functional"
    return fn


def _pattern(shape):
    return 1 + FAULT * torch.randn(shape, generator=torch.Generator().manual_seed(7))


def _perturb(y):
    return y * _pattern(y.shape)


def _put_nan(y):
    y = y.clone()
    y.view(-1)[5] = float("nan")
    return y


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by a fixed random pattern."""

    @staticmethod
    def forward(ctx, y):
        return y.view_as(y)

    @staticmethod
    def backward(ctx, g):
        with torch._C.DisableTorchFunction():  # not an API call of the model
            return g * _pattern(g.shape)


FAULTS = {
    "forward": ("linear", 1, _perturb),
    "backward": ("gelu", 0, _ScaleGrad.apply),
    "nan": ("linear", 1, _put_nan),
    "conv_forward": ("conv2d", 1, _perturb),
}


def _add_noise(model, rel):
    g = torch.Generator().manual_seed(123)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1 + rel * torch.randn(p.shape, generator=g))


def _planted(fault=None, noise=0.0):
    """``dump_one_step`` arguments of a case: relative ``noise`` on every weight, ``fault`` planted."""
    kw = {}
    if noise:
        kw["prepare"] = lambda model: _add_noise(model, noise)
    if fault:
        name, k, change = FAULTS[fault]
        kw["around"] = lambda: patched(F, name, _faulty(getattr(F, name), name, k, change))
    return kw


@pytest.fixture(scope="module")
def benches(tmp_path_factory):
    """Clean reference dumps, one per model, made on first use."""
    made = {}

    def get(model_name="mlp"):
        if model_name not in made:
            made[model_name] = dump_one_step(tmp_path_factory.mktemp("bench_" + model_name),
                                             model_name).rank_dir
        return made[model_name]
    return get


@pytest.fixture
def bench(benches):
    return benches("mlp")


@pytest.mark.parametrize("model_name, fault, api, kind", [
    ("mlp", "forward", "Functional_linear_1_forward", "own"),
    ("mlp", "backward", "Functional_gelu_0_backward", "own"),
    ("mlp", "nan", "Functional_linear_1_forward", "nonfinite"),
    ("cnn", "conv_forward", "Functional_conv2d_1_forward", "own"),
])
def test_planted_fault_is_the_first_suspect_despite_parameter_noise(benches, dump_step, compare_pair,
                                                                    model_name, fault, api, kind):
    bench = benches(model_name)
    npu = dump_step("npu", model_name, **_planted(fault, noise=NOISE)).rank_dir
    res = compare_pair(npu, bench, **DTYPE)
    t = res.table
    # the noise really makes the runs differ everywhere: every weight, and the first layer's output
    weights = t[t["NPU Name"].str.match(r"Functional_(linear|conv2d)_\d_forward_input\.1$")]
    assert len(weights) >= 2 and (weights["_rel_l2"] > NOISE / 10).all()
    first_out = t[t["_io"] == "output"].iloc[0]
    assert first_out["_rel_l2"] > 0
    # ... and many rows fail downstream of the fault: the first failing row is not enough
    assert (~t["_passed"]).sum() > 5

    adv = res.advice
    first = adv.first
    assert first is not None and first.api == api and first.kind == kind
    # exactly that call; anything else named only amplifies the error it received from there,
    # or is the same faulty call's other direction (the planted kernel scales inside autograd, so
    # the replay finds its produced gradients wrong for their inputs too)
    call = api.rsplit("_", 1)[0]
    assert adv.root_causes[0].api == api
    assert all(s.role == "amplifier" or s.api.rsplit("_", 1)[0] == call for s in adv.root_causes[1:]), adv.text()
    if model_name == "mlp":
        assert {s.api for s in adv.root_causes} <= {api, call + "_backward"} and not res.passed
    assert adv.n_inherited >= 2  # the calls after it fail too, and are explained as inherited
    if kind == "own":
        assert first.growth > 100 and first.input_error < 1e-4
        assert 3e-3 < first.output_error < 3e-2
    else:
        assert first.category == at.NONFINITE
    assert t.iloc[first.csv_line - 2]["_api"] == api  # Line: points at that API's row
    assert first.stack and os.path.basename(__file__) in first.location + at.format_stack(first.stack)

    text = open(res.advisor_path, encoding="utf-8").read().splitlines()
    assert text[0] == f"Line: {first.csv_line}" and text[1] == f"Suspect Nodes: {api}"
    html = open(res.html_path, encoding="utf-8").read()
    assert api in html and "<svg" in html
    csv = pd.read_csv(res.csv_path)
    assert csv.loc[first.csv_line - 2, "NPU Name"].startswith(api)
    # statistics alone (summary compare, no .npy read) point at the same call
    summ = compare_pair(npu, bench, "summary", summary_compare=True, rule="dtype")
    assert summ.summary_compare and summ.advice.first.api == api
    assert summ.advice.first.kind == kind


def test_clean_pair_reports_no_suspect(bench, dump_step, compare_pair):
    npu = dump_step("npu").rank_dir
    res = compare_pair(npu, bench, **DTYPE)
    adv = res.advice
    assert adv.first is None and adv.suspects == [] and adv.all_agree
    assert adv.n_compared > 40 and adv.n_failed == 0
    lines = open(res.advisor_path, encoding="utf-8").read().splitlines()
    assert lines[:2] == ["Line: None", "Suspect Nodes: None"]


def test_noise_alone_is_no_root_cause(bench, dump_step, compare_pair):
    npu = dump_step("npu", **_planted(noise=NOISE)).rank_dir
    res = compare_pair(npu, bench, **DTYPE)
    assert (res.table["_rel_l2"].fillna(0) > 0).sum() > 20  # the runs do differ
    assert res.advice.root_causes == []


def test_half_precision_softmax_in_one_gpt_layer_is_traced_to_that_layer(dump_step, compare_pair):
    """tiny GPT, layer 1 computes softmax in float16 without max subtraction (the example fault).

    The calls in float16 pass float16's tolerance, the float32 calls after them fail with error
    they only received: the judgement must trace it back into layer 1's softmax, to the cast that
    introduces float16 (the bench makes the same ``.to`` call with float32: a changed argument).
    """
    def run(name, faulty):
        return dump_step(name, "tiny_gpt", model_kw=dict(batch_size=2, seq_len=8, faulty_softmax=faulty),
                         around=lambda: seeded(0)).rank_dir   # same dropout masks

    res = compare_pair(run("npu", True), run("bench", False), **DTYPE)
    first = res.advice.first
    assert not res.passed
    assert first.kind == "own" and first.fault == "changed argument", res.advice.text()
    assert first.api == "Tensor_to_2_forward" and "torch.float16 vs torch.float32" in first.advice
    assert "torch.float16" in set(res.table.loc[res.table["_api"] == first.api, "NPU Tensor Dtype"])
    assert "in softmax" in first.location  # CausalSelfAttention.softmax
    # layer 1, not layer 0: the first softmax's calls agree with the bench
    layer0 = res.table[res.table["_api"] == "Tensor_exp_0_forward"]
    assert layer0["_passed"].all() and (layer0["_rel_l2"] < 1e-6).all()
    assert res.advice.n_inherited > 10
