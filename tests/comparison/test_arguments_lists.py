"""Argument rows of calls that take a list of tensors (issue 17, item 3), on real dumped steps:
``torch.cat([a, b])``, ``_VF.lstm``'s weights, ``x[[i, j]]``: the list is tensors, compared by
their tensor rows, so there is no argument row for it, and two identical runs agree."""
import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402


class CatLSTM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm, self.a, self.b = nn.LSTM(8, 8, batch_first=True), nn.Linear(8, 4), nn.Linear(8, 4)

    def forward(self, x):
        h, _ = self.lstm(x)
        z = torch.cat([self.a(h), self.b(h)], dim=-1)
        return z[[torch.tensor([0, 1]), torch.tensor([1, 0])]]


def _step():
    torch.manual_seed(0)
    m, x = CatLSTM(), torch.randn(2, 5, 8)
    return lambda: m(x).pow(2).mean().backward()


def test_a_list_of_tensors_has_no_argument_row_and_identical_runs_agree(dump_step, compare_pair):
    a, b = dump_step("a", _step()), dump_step("b", _step())
    r = compare_pair(a, b)
    t = r.table
    nameless = t[(t["NPU Name"].astype(str) == "") | (t["Bench Name"].astype(str) == "")]
    assert nameless.empty, nameless[["_api", "_arg", "Err_message"]].to_string()
    assert {"Torch_cat_0_forward", "VF_lstm_0_forward"} <= set(t["_api"].astype(str))
    assert t["_paired"].all()
    assert r.passed and not r.advice.suspects, r.advice.text()
    # the list's numbers, where it mixes them with tensors, are still compared (cat's dim is)
    assert (t["_arg"].astype(str) == "dim").any()
