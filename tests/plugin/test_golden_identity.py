"""Goldens key and compare calls by what they compute (issue 20): a refactor that keeps the
numbers passes the golden created with the original model; a regression fails naming the call.

A 2-block attention model (pytester, goldens created with the original, then one variant)."""
import pytest

pytest_plugins = ["pytester"]

AMODEL = '''
import os
import torch
import torch.nn as nn
import torch.nn.functional as F

V = os.environ.get("GOLDEN_VARIANT", "")
torch.set_num_threads(1)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(16)
        self.q = nn.Linear(16, 16)
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        if V == "ln_functional":
            h = F.layer_norm(x, (16,), self.ln.weight, self.ln.bias, 1e-5)
        elif V == "ln_keywords":
            h = F.layer_norm(x, normalized_shape=(16,), weight=self.ln.weight, bias=self.ln.bias, eps=1e-5)
        elif V == "ln_eps":
            h = F.layer_norm(x, (16,), self.ln.weight, self.ln.bias, 1e-3)
        else:
            h = self.ln(x)
        s = self.q(h) @ h.transpose(1, 2)
        if V == "softmax_dim2":
            p = F.softmax(s, dim=2)
        elif V == "softmax_torch":
            p = torch.softmax(s, -1)
        elif V == "softmax_method":
            p = s.softmax(-1)
        elif V == "softmax_fp16":
            e = s.to(torch.float16).exp()
            p = (e / e.sum(-1, keepdim=True)).to(torch.float32)
        else:
            p = F.softmax(s, dim=-1)
        a = p @ h
        if V == "scaled":
            a = a * 1.001
        if V == "bf16":
            a = a.to(torch.bfloat16).to(torch.float32)
        if V == "linear_functional":
            m = F.linear(a, self.fc.weight, self.fc.bias)
        else:
            m = self.fc(a)
        if V == "gelu_none":
            m = F.gelu(m, approximate="none")
        elif V == "gelu_tanh":
            m = F.gelu(m, approximate="tanh")
        else:
            m = F.gelu(m)
        return torch.add(x, m) if V == "add_torch" else x + m


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x).pow(2).mean()


def make():
    torch.manual_seed(0)
    return Net(), (torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(0)),)
'''

TESTS = """
from amodel import make
from netlib import train_step

def test_train(ptdbg_dump):
    model, batch = make()
    ptdbg_dump(model, batch, step=train_step).assert_precision()
"""


@pytest.fixture
def atester(tester, monkeypatch):
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    monkeypatch.delenv("GOLDEN_VARIANT", raising=False)
    tester.makepyfile(amodel=AMODEL, test_attn=TESTS)
    res = tester.runpytest("-p", "no:cacheprovider", "--ptdbg-update")
    res.assert_outcomes(passed=1)
    return tester


@pytest.mark.parametrize("variant", ["ln_functional", "ln_keywords", "gelu_none", "softmax_dim2",
                                     "softmax_torch", "softmax_method", "add_torch",
                                     "linear_functional"])
def test_a_refactor_that_keeps_the_numbers_passes(atester, monkeypatch, variant):
    monkeypatch.setenv("GOLDEN_VARIANT", variant)
    res = atester.runpytest("-p", "no:cacheprovider")
    out = res.stdout.str()
    res.assert_outcomes(passed=1)
    assert "golden check failed" not in out, out[-3000:]


@pytest.mark.parametrize("variant, names", [
    ("ln_eps", "model.blocks.0/layer_norm#0 (arguments: non-tensor arguments changed: eps 1e-05 -> 0.001"),
    ("gelu_tanh", "model.blocks.0/gelu#0 (arguments: non-tensor arguments changed: approximate 'none' -> 'tanh'"),
    ("scaled", "model.blocks.0/mul#0 (new call"),
    ("bf16", "model.blocks.0/to#0 (new call"),
    ("softmax_fp16", "model.blocks.0/to#0 (new call"),
])
def test_a_regression_fails_naming_the_call(atester, monkeypatch, variant, names):
    monkeypatch.setenv("GOLDEN_VARIANT", variant)
    res = atester.runpytest("-p", "no:cacheprovider")
    res.assert_outcomes(failed=1)
    out = res.stdout.str()
    assert "golden check failed" in out and f"culprit: {names}" in out, out[-4000:]
    assert "amodel.py:" in out
    res.stdout.fnmatch_lines(["*one line per changed call, by module:*",
                              "*call* changed in model.blocks.0:*"])
