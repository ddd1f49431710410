"""A golden judges rounding noise at the scale of the data it was computed from (issue 17, item 0).

A conv's bias gradient is mathematically zero when a BatchNorm follows the conv: what the dump
records (~1e-8) is rounding noise, and another CPU, kernel or summation order gives other noise
(relative drift 0.2-0.9). Adam divides such noise by ``eps`` (``addcdiv``). Both must pass;
a real change (a 1.001 scaling, a bf16 round trip, an eps change) must still fail.
Real runs of the example CNN (conv + BN, SGD) and tiny GPT (AdamW) on the CPU.
"""
import contextlib
import os

import pytest
import torch

import example_models as em
from pytest_ptdbg.plugin import golden, golden_check
from pytest_ptdbg.plugin.golden_check import DRIFT_TOL, NOISE_UNITS, drift, noise_floor
from pytest_ptdbg.plugin.options import Settings
from pytest_ptdbg.plugin.run import run_model

U32 = 2.0 ** -24


def _t(key, t, shape, stats, dtype="float32"):
    return {"k": key, "t": t, "dtype": dtype, "shape": shape, "stats": stats}


def _call(lines):
    """A call's tensor lines by name, and its call line."""
    return ({x["t"]: x for x in lines if "t" in x},
            next((x for x in lines if "t" not in x), None))


def test_noise_floor_by_hand():
    conv = "model.conv/Functional_conv2d#0"
    lines = [_t(conv, "backward.input.0", [8, 16, 8, 8], [1e-3, -1e-3, 0.0, 0.04]),
             _t(conv, "backward.output.2", [16], [1e-8, -2e-8, 0.0, 4e-8]),
             _t(conv, "backward.output.1", [16, 8, 3, 3], [0.02, -0.04, 0.0, 0.24])]
    tens, _ = _call(lines)
    conv = "conv2d"
    rms = 0.04 / (8 * 16 * 8 * 8) ** 0.5
    # a sum of 512 gradient elements per bias: 512 x the input's RMS, NOISE_UNITS roundings
    assert noise_floor(tens, conv, "backward.output.2") == pytest.approx(NOISE_UNITS * U32 * 512 * rms)
    assert noise_floor(tens, conv, "backward.output.1") == pytest.approx(
        NOISE_UNITS * U32 * 8192 / 1152 * rms)
    # an input: at the scale of the call's other tensors (the largest RMS)
    assert noise_floor(tens, conv, "backward.input.0") == pytest.approx(
        NOISE_UNITS * U32 * 0.24 / 1152 ** 0.5)
    div = "addcdiv"
    lines = [_t(div, "forward.input.input", [4], [0.0, 0.0, 0.0, 0.0]),
             _t(div, "forward.input.tensor1", [4], [0.01, -0.005, 0.0, 0.02]),
             _t(div, "forward.input.tensor2", [4], [0.1, 1e-8, 0.05, 0.2]),
             _t(div, "forward.output.0", [4], [0.003, -0.003, 0.0, 0.005])]
    tens, _ = _call(lines)
    call = {"value": -0.03}   # the bound arguments
    # the largest numerator over the smallest denominator, times |value|
    assert noise_floor(tens, div, "forward.output.0", call) == pytest.approx(
        NOISE_UNITS * U32 * 0.03 * 0.01 / 1e-8)
    mul = "mul"
    lines = [_t(mul, "forward.input.input", [4], [1e-4, -1e-4, 0.0, 2e-4]),
             _t(mul, "forward.input.other", [4], [2e-4, -1e-4, 0.0, 3e-4]),
             _t(mul, "forward.output.0", [4], [2e-8, -1e-8, 0.0, 3e-8])]
    tens, _ = _call(lines)
    # a product of two small tensors rounds at its own scale, not at its factors'
    assert noise_floor(tens, mul, "forward.output.0") == pytest.approx(NOISE_UNITS * U32 * 2e-8)
    # integers, python numbers and masks (finfo.min) carry no floor
    assert noise_floor({"forward.output.0": _t(mul, "forward.output.0", [2], [3, 1, 2, 3], "int64")},
                       mul, "forward.output.0") == 0.0
    masked = {"forward.input.0": _t(mul, "forward.input.0", [2], [1.0, -3.4e38, 0, 3.4e38]),
              "forward.output.0": _t(mul, "forward.output.0", [2], [1.0, 0.0, 0.5, 1.0])}
    assert noise_floor(masked, mul, "forward.output.0") == 0.0


def _lines(name, ctx=None, plant=None, permute=False):
    model, batch = em.MODELS[name]()
    if plant is not None:
        with torch.no_grad():
            plant(model)
    if permute:  # the same batch in another order: the same numbers, summed in another order
        perm = torch.randperm(batch[0].shape[0], generator=torch.Generator().manual_seed(1))
        batch = tuple(b[perm] for b in batch)
    import tempfile

    with tempfile.TemporaryDirectory() as d, (ctx or contextlib.nullcontext()):
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            side = run_model(model, batch, em.train_step, device=torch.device("cpu"),
                             dtype="float32", dump_path=os.path.join(d, "npu"),
                             settings=Settings(), summary_only=True)
            return golden_check.golden_lines(side.pkl_path, side.keys or {})
        finally:
            torch.set_num_threads(before)


def _golden(fresh):
    text = golden.render(golden.header("t.py::t", 0, "api_stack", "cpu"), fresh.lines)
    return golden.parse(text, "t.golden.jsonl")


def _flat(calls):
    return {(c.key, t): e for c in calls for t, e in c.tensors.items()}


def _relative_drifts(ref, fresh):
    """Records the relative rule alone (the old check) fails."""
    g, f = _flat(ref.calls), _flat(fresh.calls)
    return sorted(k for k in g if k in f and g[k]["dtype"] in DRIFT_TOL and
                  drift(g[k]["stats"], f[k]["stats"]) > DRIFT_TOL[g[k]["dtype"]])


@pytest.fixture(scope="module")
def cnn_golden():
    return _lines("cnn")


_NO_MKLDNN = "no-mkldnn"  # another conv kernel (the reference conv, not oneDNN's)


@pytest.mark.parametrize("variant", [_NO_MKLDNN, "permuted batch"])
def test_conv_bias_gradient_noise_passes(cnn_golden, variant):
    ctx = torch.backends.mkldnn.flags(enabled=False) if variant == _NO_MKLDNN else None
    fresh = _lines("cnn", ctx=ctx, permute=variant != _NO_MKLDNN)
    noisy = _relative_drifts(cnn_golden, fresh)
    # the relative rule fails the zero bias gradients and the optimizer's use of them
    assert ("model.conv2/conv2d#0", "backward.output.bias") in noisy
    assert any(k.startswith("optimizer/add#") and t == "forward.input.other" for k, t in noisy), noisy
    result = golden_check.check(_golden(cnn_golden), fresh)
    assert result.passed, result.message("t.py::t")


def test_adam_quotient_of_noise_passes():
    """AdamW's first step divides the zero key-bias gradient's noise by eps (tiny GPT)."""
    ref = _lines("tiny_gpt")
    fresh = _lines("tiny_gpt", ctx=torch.backends.mkldnn.flags(enabled=False))
    noisy = _relative_drifts(ref, fresh)
    assert any(k.startswith("optimizer/addcdiv#") for k, _ in noisy), noisy
    result = golden_check.check(_golden(ref), fresh)
    assert result.passed, result.message("t.py::t")


def _scale(attr, factor):
    def plant(model):
        p = model.get_submodule(attr.rsplit(".", 1)[0]).get_parameter(attr.rsplit(".", 1)[1])
        p.mul_(factor)
    return plant


def _bf16_round_trip(model):
    model.conv1.weight.copy_(model.conv1.weight.bfloat16().float())


def _eps(model):
    model.bn1.eps = 1e-3


@pytest.mark.parametrize("plant,where", [
    (_scale("bn2.weight", 1.001), "model.bn2/batch_norm#0"),   # the activation x 1.001
    (_scale("conv2.bias", 1.001), "model.conv2/conv2d#0"),
    (_bf16_round_trip, "model.conv1/conv2d#0"),
    (_eps, "model.bn1/batch_norm#0"),
], ids=["bn2-output-x1.001", "conv2-bias-x1.001", "conv1-weight-bf16", "bn1-eps-1e-3"])
def test_real_changes_still_fail(cnn_golden, plant, where):
    result = golden_check.check(_golden(cnn_golden), _lines("cnn", plant=plant))
    assert not result.passed
    stats = [d for d in result.differences if d.kind == "statistics"]
    assert stats, result.message("t.py::t")
    assert any(d.key == where for d in result.differences), result.message("t.py::t")
