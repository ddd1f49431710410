"""Pairing by dataflow (issue 20): calls reordered on one side pair by what they compute, and two
unrelated models are said to be different programs. Real dumps of real steps."""
from __future__ import annotations

import json
import math
import os

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import example_models as em  # noqa: E402
from real_dumps import patched  # noqa: E402
from pytest_ptdbg.comparison import schema as S  # noqa: E402
from pytest_ptdbg.comparison.pairing import pair_apis, pair_dumps  # noqa: E402
from pytest_ptdbg.comparison.schema import CompareTable  # noqa: E402
from pytest_ptdbg.dump.reader import read_dump  # noqa: E402
from pytest_ptdbg.judge.finding import Cause  # noqa: E402


class Gated(torch.nn.Module):
    """``a * sigmoid(b)`` of two independent linears of the same shape; ``b_first`` computes b's first."""

    def __init__(self, d: int = 16, b_first: bool = False) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.wa = torch.nn.Parameter(torch.randn(d, d, generator=g) * 0.3)
        self.wb = torch.nn.Parameter(torch.randn(d, d, generator=g) * 0.3)
        self.x = torch.randn(8, d, generator=g)
        self.b_first = b_first

    def forward(self) -> torch.Tensor:
        if self.b_first:
            b = F.linear(self.x, self.wb)
            a = F.linear(self.x, self.wa)
        else:
            a = F.linear(self.x, self.wa)
            b = F.linear(self.x, self.wb)
        return (a * torch.sigmoid(b)).pow(2).mean()


def _gated_step(b_first: bool):
    m = Gated(b_first=b_first)
    return lambda: m().backward()


def _faulty_linear(weight_of: Gated, k: float):
    """F.linear whose kernel scales its output by ``k`` for b's weight only (capture sees linear)."""
    orig = F.linear

    def linear(*args, **kwargs):
        ts = tuple(a for a in args if isinstance(a, torch.Tensor))
        if torch.overrides.has_torch_function(ts):
            return torch.overrides.handle_torch_function(linear, ts, *args, **kwargs)
        out = orig(*args, **kwargs)
        if args[1].data_ptr() == weight_of.wb.data_ptr():   # (capture passes an alias of it)
            with torch._C.DisableTorchFunction():
                return out * k
        return out
    linear.__module__ = "torch.nn.functional"
    return linear


def _k_first(self, x):
    """CausalSelfAttention.forward with k's view (and transpose) made before q's."""
    B, T, C = x.shape
    h = self.n_heads
    q, k, v = self.qkv(x).split(C, dim=2)
    k = k.view(B, T, h, C // h).transpose(1, 2)
    q = q.view(B, T, h, C // h).transpose(1, 2)
    v = v.view(B, T, h, C // h).transpose(1, 2)
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // h))
    scores = scores.masked_fill(self.causal_mask[:T, :T], float("-inf"))
    att = self.attn_drop(self.softmax(scores))
    y = (att @ v).transpose(1, 2).reshape(B, T, C)
    return self.resid_drop(self.proj(y))


def _strip_sources(pkl: str) -> None:
    """The dump as an older writer (or ptdbg) wrote it: no ``"src"`` in any call spec."""
    out = []
    with open(pkl) as f:
        for line in f:
            rec = json.loads(line)
            extra = rec[6] if len(rec) > 6 and isinstance(rec[6], dict) else None
            if extra and isinstance(extra.get("call"), dict) and "src" in extra["call"]:
                del extra["call"]["src"]
                line = json.dumps(rec, separators=(", ", ": ")) + "\n"
            out.append(line)
    with open(pkl, "w") as f:
        f.writelines(out)


def _partners(npu_pkl: str, bench_pkl: str, family: str) -> dict:
    steps, _ = pair_dumps(read_dump(npu_pkl).apis, read_dump(bench_pkl).apis)
    return {a.key: b.key for a, b in steps if a is not None and b is not None and a.family == family}


def _failing(r) -> int:
    return CompareTable.of(r.table).count(S.ACCURACY, S.NO)


def test_swapped_independent_linears_pair_by_dataflow_and_pass(dump_step, compare_pair):
    bench = dump_step("bench", _gated_step(False))
    dev = dump_step("dev", _gated_step(True))
    assert _partners(dev.pkl, bench.pkl, "Functional_linear") == {
        "Functional_linear_0_forward": "Functional_linear_1_forward",
        "Functional_linear_1_forward": "Functional_linear_0_forward",
        "Functional_linear_0_backward": "Functional_linear_1_backward",
        "Functional_linear_1_backward": "Functional_linear_0_backward"}
    for replay in (True, False):
        r = compare_pair(dev, bench, out=f"out{replay}", replay_check=replay)
        assert r.passed, r.advice.text()
        assert _failing(r) == 0
        assert any("reordered" in n and "Functional_linear_0_forward with bench Functional_linear_1_forward" in n
                   for n in r.notes), r.notes


def test_without_sources_pairing_is_the_sequence_alignment(dump_step, compare_pair):
    """A dump without the dataflow (stripped: an older writer, ptdbg) pairs as before: in order."""
    bench = dump_step("bench", _gated_step(False))
    dev = dump_step("dev", _gated_step(True))
    _strip_sources(dev.pkl)
    n, b = read_dump(dev.pkl), read_dump(bench.pkl)
    assert not any(a.sources for a in n.apis) and not n.notes
    steps, report = pair_dumps(n.apis, b.apis)
    assert [(x and x.key, y and y.key) for x, y in steps] == \
        [(x and x.key, y and y.key) for x, y in pair_apis(n.apis, b.apis)]
    assert not report.reordered and not report.different_programs
    r = compare_pair(dev, bench, replay_check=False)
    assert _failing(r) > 0   # b's linear compared with a's: what the dataflow repairs


def test_fault_on_a_swapped_call_is_still_named(dump_step, compare_pair):
    bench = dump_step("bench", _gated_step(False))
    m = Gated(b_first=True)
    with patched(F, "linear", _faulty_linear(m, 1.1)):
        dev = dump_step("dev", lambda: m().backward())
    for replay in (True, False):
        r = compare_pair(dev, bench, out=f"out{replay}", replay_check=replay)
        assert not r.passed
        linears = {rc.api.rsplit("_", 1)[0] for rc in r.judgement.root_causes if rc.family == "Functional_linear"}
        assert linears == {"Functional_linear_0"}, r.judgement.text()   # b's (made first on the device) only
        assert r.first_suspect.api == "Functional_linear_0_forward"


def test_swapped_q_k_views_of_a_transformer_pair_and_pass(dump_step, compare_pair):
    kw = {"dropout": 0.0}
    bench = dump_step("bench", "tiny_gpt", model_kw=kw)
    dev = dump_step("dev", "tiny_gpt", model_kw=kw,
                    around=lambda: patched(em.CausalSelfAttention, "forward", _k_first))
    views = _partners(dev.pkl, bench.pkl, "Tensor_view")
    assert views["Tensor_view_0_forward"] == "Tensor_view_1_forward"   # k's view with k's
    assert views["Tensor_view_1_forward"] == "Tensor_view_0_forward"
    assert views["Tensor_view_0_backward"] == "Tensor_view_1_backward"
    r = compare_pair(dev, bench, replay_check=False)
    assert r.passed, r.advice.text()
    assert _failing(r) == 0
    _strip_sources(dev.pkl)   # the same dumps paired in order: q's view against k's
    assert _failing(compare_pair(dev, bench, out="stripped", replay_check=False)) > 0


def test_a_language_model_against_a_cnn_is_a_different_program(dump_step, compare_pair):
    lm = dump_step("lm", "tiny_gpt")
    cnn = dump_step("cnn", "cnn")
    r = compare_pair(lm, cnn)
    assert not r.passed
    rcs = r.judgement.root_causes
    assert [rc.cause for rc in rcs] == [Cause.DIFFERENT_PROGRAMS]
    assert "the two runs are different programs" in rcs[0].detail and " forward calls pair" in rcs[0].detail
    assert r.first_suspect is None and not r.advice.suspects
    text = r.advice.text()
    assert "Expert Advice: The comparison fails: the two runs are different programs" in text
    assert "only on the" not in text   # no one-sided call ranked as a cause
    with open(r.advisor_path) as f:
        assert "different programs" in f.read()
    assert os.path.exists(r.csv_path)
