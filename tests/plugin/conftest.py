"""Shared by the plugin tests: ``tester`` (pytester for in-process inner sessions) and the inner
sessions' model module ``netlib``."""
import pytest
from inner_sessions import keep_library_modules

#: an inner test module: a tiny model whose forward returns a scalar loss (default step:
#: forward + backward), and a model variant with a sign flip in one op (a planted fault)
MODEL = '''
import torch
import torch.nn as nn

class Net(nn.Module):
    def __init__(self, k=1.0, p=0.0):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 1)
        self.k = k
        self.drop = nn.Dropout(p)

    def forward(self, x):
        h = torch.tanh(self.fc1(x) * self.k)
        return self.fc2(self.drop(h)).pow(2).mean()

def make(k=1.0, p=0.0):
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    return Net(k, p), (torch.randn(6, 8, generator=g),)

def train_step(model, batch):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(*batch)
    loss.backward()
    opt.step()
    return loss.detach()
'''


@pytest.fixture
def tester(request, monkeypatch, tmp_path_factory):
    """pytester whose in-process runs keep the library modules an inner session imported
    (``inner_sessions.keep_library_modules``: torch cannot be imported twice in one process)."""
    pytester = keep_library_modules(request, monkeypatch, tmp_path_factory)
    # these inner sessions pin the live device-vs-bench comparison: goldens off (the golden
    # tests in test_plugin_golden.py clear this), and never in CI mode (pytester clears
    # PYTEST_ADDOPTS when it starts: set after it)
    monkeypatch.setenv("PYTEST_ADDOPTS", "--ptdbg-golden=none")
    monkeypatch.delenv("CI", raising=False)
    pytester.makepyfile(netlib=MODEL)
    pytester.syspathinsert()
    return pytester


