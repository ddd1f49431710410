"""The judge's edge cases on real dumped steps (issue 17, item 3): clean steps that must pass
and a fault that must not, each on a tiny model with the structure of the model it came from."""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

from pytest_ptdbg.judge import judge_dump  # noqa: E402


def _npy(rank, name):
    return os.path.join(rank, "api_stack_dump", f"{name}.npy")


def _nudge(path, idx=(0, 5)):
    """Move a saved float32 tensor's elements ``idx`` by one unit in the last place each way (what
    another summation order of a correct kernel does)."""
    a = np.load(path)
    b = a.copy().reshape(-1)
    for j, i in enumerate(idx):
        b[i] = np.nextafter(b[i], np.float32(1 if j % 2 == 0 else -1))
    np.save(path, b.reshape(a.shape))


def test_a_bias_gradient_whose_reference_is_exact_still_has_a_rounding_budget(dump_step):
    """GPT-NeoX under bf16 autocast: a layer norm feeding an autocast linear gets bf16-valued
    gradients, so its bias gradient (a sum of them) is exact in the CPU's order; a device that
    sums in another order is one rounding off, which is not a root cause. A cast, which only
    selects its input's values, keeps a budget of 0."""
    torch.manual_seed(0)
    ln, lin = nn.LayerNorm(32), nn.Linear(32, 16)
    x = torch.randn(4, 8, 32)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = lin(ln(x))
        y.float().pow(2).mean().backward()

    rank = dump_step("dump", step).rank_dir
    before = judge_dump(rank)
    assert before.passed, before.text()
    _nudge(_npy(rank, "Functional_layer_norm_0_backward_output.3"))
    j = judge_dump(rank)
    v = j.by_api()["Functional_layer_norm_0_backward"]
    assert str(v.status) == "within budget" and v.budget > 0, j.text()
    assert j.passed, j.text()
    # an exact call (the bf16 -> float32 cast of the linear's output) stays exact
    _nudge(_npy(rank, "Tensor_float_0_forward_output.0"))
    j = judge_dump(rank)
    assert [c.api for c in j.root_causes] == ["Tensor_float_0_forward"], j.text()
    assert j.root_causes[0].ratio == float("inf")


def _conv_bn_step(channels_last):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                      nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
    if channels_last:
        m, x = m.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
    return lambda: nn.functional.cross_entropy(m(x), y).backward()


def test_a_channels_last_step_is_replayed_in_its_recorded_layout(dump_step):
    """A ResNet block in channels_last: BatchNorm's channels-last kernel sums in another order
    than its contiguous kernel; replayed in the layout it was called with, it is within budget."""
    rank = dump_step("dump", _conv_bn_step(True)).rank_dir
    with open(os.path.join(rank, "api_stack_dump.pkl")) as f:
        assert '"strides": {"input.0": [4096, 1, 256, 16]}' in f.read()
    j = judge_dump(rank)
    bn = [v for v in j.verdicts if v.family == "Functional_batch_norm"]
    assert len(bn) == 4 and all(str(v.status) == "within budget" for v in bn), j.text()
    assert j.passed, j.text()


def test_a_crafted_layout_is_refused_not_replayed(dump_step):
    """Strides that would overlap memory are not handed to ``empty_strided``: the call is not judged."""
    rank = dump_step("dump", _conv_bn_step(True)).rank_dir
    pkl = os.path.join(rank, "api_stack_dump.pkl")
    with open(pkl) as f:
        text = f.read()
    with open(pkl, "w") as f:
        f.write(text.replace('"strides": {"input.0": [4096, 1, 256, 16]}', '"strides": {"input.0": [1, 1, 1, 1]}', 1))
    j = judge_dump(rank)
    refused = [v for v in j.not_judged if "strides" in v.reason]
    assert refused and refused[0].family == "Functional_batch_norm", j.text()


def _zero_bias_step(noise):
    torch.manual_seed(0)
    ln, lin = nn.LayerNorm(16), nn.Linear(16, 4)
    x = torch.randn(8, 16)
    if noise:
        with torch.no_grad():
            ln.bias.add_(noise * torch.randn(16, generator=torch.Generator().manual_seed(1)))
    return lambda: lin(ln(x)).pow(2).mean().backward()


@pytest.mark.parametrize("summary_only", [False, True])
def test_a_zero_bias_with_noise_is_judged_at_the_scale_of_its_data(dump_step, compare_pair, summary_only):
    """A zero-initialised LayerNorm bias with absolute 1e-6 noise on one side differs by 1e-6 at
    the scale of the data it is added to (RMS 1), not by 1.0 relative to zero; a bias that is
    really different (0.1) still makes the inputs differ at the start."""
    bench = dump_step("bench", _zero_bias_step(0.0))
    for noise, differs in ((1e-6, False), (1e-1, True)):
        npu = dump_step(f"npu{noise}", _zero_bias_step(noise))
        r = compare_pair(npu, bench, f"out{noise}", with_data=not summary_only)
        start = [c for c in r.judgement.root_causes if str(c.cause) == "inputs differ at the start"]
        assert bool(start) == differs, r.judgement.text()
        assert r.passed == (not differs), r.judgement.text()
        if differs:
            assert start[0].api == "Functional_layer_norm_0_forward" and "input 3" in start[0].detail


class Residual(nn.Module):
    """A pre-norm block with an RMSNorm that computes in float32 (Llama, T5, NeoX): ``downcast``
    rounds the residual stream to the dtype of the branch, ``x.to(h.dtype) + h``; ``attention``
    adds the casts HF attention makes on purpose (``softmax(..., dtype=float32).to(q.dtype)``
    before a matmul, a rotary ``cos.to(q.dtype)``), which autocast's matmul lowers anyway."""

    def __init__(self, downcast: bool, d: int = 16) -> None:
        super().__init__()
        self.downcast = downcast
        self.q, self.v, self.out, self.head = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, 4)
        self.cos = torch.cos(torch.arange(d, dtype=torch.float32) / d)

    def forward(self, x):
        q, v = self.q(x), self.v(x)
        q = q * self.cos.to(q.dtype)
        p = torch.softmax(q @ v.transpose(0, 1), dim=-1, dtype=torch.float32).to(q.dtype)
        h = self.out(nn.functional.dropout(p, 0.0) @ v)
        x = (x.to(h.dtype) if self.downcast else x) + h
        n = x.to(torch.float32)
        return self.head(n * torch.rsqrt(n.pow(2).mean(-1, keepdim=True) + 1e-6))


def _residual_step(downcast, autocast):
    torch.manual_seed(0)
    m, x = Residual(downcast), torch.randn(8, 16)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = m(x)
        y.float().pow(2).mean().backward()
    return step


def test_a_downcast_of_the_residual_stream_under_autocast_is_the_root_cause(dump_step, compare_pair):
    """``x.to(h.dtype)`` is bf16 on the autocast device, a no-op on the float32 bench: right for
    its inputs and its dtype follows the run, yet the RMSNorm then computes in float32 on bf16
    values. The cast's forward is named and the step fails; the attention's casts, whose values
    only autocast-lowered matmuls compute on, stay clean."""
    bench = dump_step("bench", _residual_step(True, False))
    npu = dump_step("npu", _residual_step(True, True))
    r = compare_pair(npu, bench, "out")
    assert not r.passed, r.judgement.text()
    first = r.judgement.root_causes[0]
    assert first.api == "Tensor_to_2_forward" and str(first.cause) == "changed argument", r.judgement.text()
    assert "torch.bfloat16 vs torch.float32" in first.detail and "Tensor_to_3_forward" in first.detail
    assert r.first_suspect.api == "Tensor_to_2_forward", r.advice.text()
    # the same code without the residual downcast: only the attention's casts, clean
    npu = dump_step("clean", _residual_step(False, True))
    bench = dump_step("bench_clean", _residual_step(False, False))
    r = compare_pair(npu, bench, "out_clean")
    assert r.passed, r.judgement.text()


class T5FF(nn.Module):
    """T5's feed-forward with its clamp: ``torch.where(isinf(h).any(), finfo(h.dtype).max - 1000,
    finfo(h.dtype).max)``; the finfo numbers follow the run's precision (bf16 under autocast)."""

    def __init__(self, d: int = 16, mask_dtype=None) -> None:
        super().__init__()
        self.wi, self.wo, self.head = nn.Linear(d, 32), nn.Linear(32, d), nn.Linear(d, 4)
        self.mask_dtype = mask_dtype

    def forward(self, x):
        h = self.wo(torch.relu(self.wi(x)))
        dt = self.mask_dtype or h.dtype
        clamp = torch.where(torch.isinf(h).any(), torch.finfo(dt).max - 1000, torch.finfo(dt).max)
        return self.head(x + torch.clamp(h, min=-clamp, max=clamp))


def _t5_step(autocast, mask_dtype=None):
    torch.manual_seed(0)
    m, x = T5FF(mask_dtype=mask_dtype), torch.randn(8, 16)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = m(x)
        y.float().pow(2).mean().backward()
    return step


def test_a_where_on_finfo_numbers_of_the_runs_precision_is_replayed_on_its_own_arguments(dump_step, compare_pair):
    """T5 under bf16 autocast: the device's where picks bf16's finfo.max, the bench's float32's.
    Replayed from its own recorded inputs the where is exact, so the clean step passes; a finfo
    number of a precision the device never computed in (float16's, in a float32 run) is still
    the bench's argument, and its where is a root cause."""
    bench = dump_step("bench", _t5_step(False))
    npu = dump_step("npu", _t5_step(True))
    r = compare_pair(npu, bench, "out")
    where = r.judgement.replay.by_api()["Torch_where_0_forward"]
    assert str(where.status) == "within budget" and where.bench_arguments and where.ratio == 0, r.judgement.text()
    assert r.passed, r.judgement.text()
    fp16 = dump_step("fp16", _t5_step(False, mask_dtype=torch.float16))
    r = compare_pair(fp16, bench, "out16")
    assert not r.passed and r.judgement.root_causes[0].api == "Torch_where_0_forward", r.judgement.text()
