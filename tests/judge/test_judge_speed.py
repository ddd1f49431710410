"""What makes the judgement fast changes none of its numbers, on real dumped steps: saved tensors
read once and shared (judge/arrays.py), norms in one pass, input RMS only where it decides,
autograd leaves copied only for calls that change them in place."""
import os

import numpy as np
import pytest

from real_dumps import dump_one_step

torch = pytest.importorskip("torch")

import example_models as em  # noqa: E402
from pytest_ptdbg import PrecisionDebugger  # noqa: E402
from pytest_ptdbg.dump import reader  # noqa: E402
from pytest_ptdbg.format import records  # noqa: E402
from pytest_ptdbg.judge import arrays as A  # noqa: E402
from pytest_ptdbg.judge import budget as B  # noqa: E402
from pytest_ptdbg.judge import judge_dump  # noqa: E402
from pytest_ptdbg.judge import own_error  # noqa: E402
from pytest_ptdbg.replayer import engine  # noqa: E402


@pytest.fixture(scope="module")
def gpt_bf16(tmp_path_factory):
    """A tiny GPT step under bf16 autocast: dropout, -inf causal masks, AdamW, fp16-free."""
    torch.manual_seed(0)
    return dump_one_step(tmp_path_factory.mktemp("gpt_bf16"), "tiny_gpt",
                         around=lambda: torch.autocast("cpu", dtype=torch.bfloat16)).rank_dir


def test_store_reads_each_file_once_and_gives_the_saved_arrays(gpt_bf16):
    d = reader.read_dump(gpt_bf16)
    recs = [t for a in d.apis for t in a.tensors if t.data_file]
    store = A.ArrayStore()
    for t in recs:
        got = store.load(t.data_file, t.name, t.shape, t.dtype, t.data_inode)
        want = np.load(t.data_file, allow_pickle=False)
        assert got.dtype == want.dtype and got.shape == want.shape == tuple(t.shape)
        assert np.array_equal(got, want, equal_nan=True)
    files = {(os.path.dirname(t.data_file), t.data_inode, tuple(t.shape), t.dtype) for t in recs}
    assert store.reads == len(files) < len(recs)       # hard-linked copies: read once
    assert store.hits == len(recs) - len(files)
    small = A.ArrayStore(max_bytes=0)                   # nothing kept: every record read
    for t in recs:
        small.load(t.data_file, t.name, t.shape, t.dtype, t.data_inode)
    assert small.reads == len(recs) and small.hits == 0


def test_read_npy_refuses_what_load_npy_refuses(tmp_path):
    good = tmp_path / "x.npy"
    np.save(good, np.arange(6, dtype=np.float32).reshape(2, 3))
    assert read_ok(good, (2, 3), "torch.float32").tolist() == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ValueError, match="does not match record"):
        A.read_npy(str(good), "r", (3, 2), "torch.float32")
    with pytest.raises(ValueError, match="dtype kind"):
        A.read_npy(str(good), "r", (2, 3), "torch.int64")
    cut = tmp_path / "cut.npy"
    cut.write_bytes(good.read_bytes()[:-4])
    with pytest.raises(ValueError, match="truncated"):
        A.read_npy(str(cut), "r", (2, 3), "torch.float32")
    obj = tmp_path / "obj.npy"
    np.save(obj, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="object arrays are refused"):
        A.read_npy(str(obj), "r", (1,), None)
    fortran = tmp_path / "f.npy"
    np.save(fortran, np.asfortranarray(np.arange(6.0).reshape(2, 3)))
    assert read_ok(fortran, (2, 3), "torch.float64").tolist() == [[0, 1, 2], [3, 4, 5]]


def read_ok(path, shape, dtype):
    return A.read_npy(str(path), "r", shape, dtype)


def _numbers(j):
    return [v.to_dict() for v in j.verdicts]


def test_the_fast_paths_give_the_element_wise_judgement_number_for_number(gpt_bf16, monkeypatch):
    fast = judge_dump(gpt_bf16)
    assert fast.judged and fast.passed, fast.text()
    # every input RMS computed exactly, nothing shared between calls, every norm element-wise,
    # and every backward leaf copied: what the judgement did before it was made fast
    monkeypatch.setattr(B, "input_rms_decided", lambda *a, **k: False)
    monkeypatch.setattr(A, "MAX_BYTES", 0)
    monkeypatch.setattr(own_error, "ArrayStore", lambda *a: A.ArrayStore(0))
    monkeypatch.setattr(B, "finite_norms", lambda *a: None)
    orig = engine._replay_once
    monkeypatch.setattr(engine, "_replay_once", lambda *a: orig(*a[:-1], True))
    slow = judge_dump(gpt_bf16)
    assert _numbers(slow) == _numbers(fast)


class ResidualMLP(torch.nn.Module):
    """Linear -> ReLU -> Linear with an in-place residual add (``out += identity`` in ResNets)."""

    def __init__(self, d: int = 16, n_classes: int = 5) -> None:
        super().__init__()
        self.fc1, self.fc2, self.head = torch.nn.Linear(d, d), torch.nn.Linear(d, d), torch.nn.Linear(d, n_classes)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        out = self.fc2(h)
        out.add_(h)
        return self.head(out)


def test_an_in_place_call_with_a_backward_is_replayed_on_copies(tmp_path, monkeypatch):
    """``out.add_(h)`` changes its first input, which requires grad: replayed on the autograd leaf
    itself it is refused by autograd, and is then replayed on copies: judged, within budget."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = ResidualMLP()
        x, y = torch.randn(8, 16), torch.randint(0, 5, (8,))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), hook_name="dump", step=[0])
    dbg.configure_hook(mode="api_stack")
    dbg.start()
    try:
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    finally:
        dbg.stop()
    dbg.close()
    runs = []
    orig = engine._replay_once

    def spy(*a):
        runs.append((a[1], a[-1]))
        return orig(*a)

    monkeypatch.setattr(engine, "_replay_once", spy)
    j = judge_dump(records.rank_dir(str(tmp_path)))
    add = [v for v in j.verdicts if v.family == "Tensor_add_" and v.ctx != "optimizer"]
    assert {v.direction for v in add} == {"forward", "backward"}, j.text()
    assert all(str(v.status) == "within budget" for v in add), j.text()
    assert ("Tensor_add__0_forward", True) in runs          # the copies' replay ran
    assert ("Functional_linear_0_forward", True) not in runs  # calls that change nothing: no copies
    assert j.passed, j.text()
