"""The advisor's ranking on real compared steps (issue 17, item 3): what the judgement does not
judge by value, or judges within budget, must not come first."""
import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402


class Router(nn.Module):
    """Mixtral's token sort: ``inv_perm = torch.empty_like(perm); inv_perm[perm] = arange``."""

    def __init__(self, d: int = 16, experts: int = 4) -> None:
        super().__init__()
        self.gate, self.expert = nn.Linear(d, experts), nn.Linear(d, d)

    def forward(self, x):
        logits = self.gate(x)
        perm = torch.argsort(logits.argmax(-1), stable=True)
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.numel())   # written after the call: the record differs
        y = self.expert(x[perm]) * torch.softmax(logits[perm], -1)[:, :1]
        return y[inv]


def _router_step(autocast):
    torch.manual_seed(0)
    m, x = Router(), torch.randn(12, 16)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y = m(x)
        y.float().pow(2).mean().backward()
    return step


def test_an_empty_like_written_later_is_never_a_suspect(dump_step, compare_pair):
    npu = dump_step("npu", _router_step(True))
    bench = dump_step("bench", _router_step(False))
    r = compare_pair(npu, bench)
    empty = [s for s in r.advice.suspects if s.family == "Torch_empty_like"]
    assert not empty, r.advice.text()
    assert r.passed, r.advice.text()
    assert any(v.family == "Torch_empty_like" and v.reason == "uninitialised memory"
               for v in r.judgement.replay.not_judged)
