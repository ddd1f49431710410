"""Small tensors are recorded by reference and read at the flush: the records are exactly those a
copy taken at record time gives, through every write capture sees (in place, ``.data``, BatchNorm's
running statistics, optimizer updates); a write it cannot see never leaves a wrong record."""
import json
import os
import threading
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import example_models as em
from pytest_ptdbg import PrecisionDebugger
from pytest_ptdbg.dump import writer as W
from real_dumps import patched


class _Writes(nn.Module):
    """A model whose step writes its own tensors every way a training script does."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 8 * 8, 10)
        self.scale = nn.Parameter(torch.ones(10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.bn(self.conv(x)), inplace=True)
        h = h.flatten(1)
        y = self.fc(h)
        y += y.detach() * 0.5  # __iadd__ on an output recorded a call ago
        z = y * self.scale
        z[:, 0] = 0.0  # __setitem__
        return z


def _step(seed: int = 0):
    torch.manual_seed(seed)
    model = _Writes()
    x = torch.randn(2, 3, 8, 8)
    target = torch.randint(0, 10, (2,))

    def step() -> None:
        loss = F.cross_entropy(model(x), target)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():  # hand-written SGD: every style of update
                if p.dim() == 1:
                    p.data.add_(p.grad, alpha=-0.1)  # through .data (another version counter)
                elif p.dim() == 2:
                    p.data = p.data - 0.1 * p.grad  # .data reassigned (unseen by capture)
                else:
                    p -= 0.1 * p.grad
                p.grad = None
        model(x).sum()  # the updated parameters read again in the same batch

    return step


def _lines(path: str) -> list:
    pkl = os.path.join(path, "ptdbg_dump_v4.0", "step0", "rank0", "api_stack_dump.pkl")
    with open(pkl) as f:
        return f.read().splitlines()


def _dump(path: str, step) -> list:
    torch.manual_seed(1)  # the same dropout masks in both runs
    dbg = PrecisionDebugger(dump_path=path, hook_name="dump", step=[0])
    dbg.configure_hook(mode="api_stack", summary_only=True)
    dbg.start()
    step()
    dbg.stop()
    dbg.close()
    return _lines(path)


def _copy_at_record(orig):
    """``DumpSink._tensor`` that copies every small tensor when it is recorded (the reference)."""
    def _tensor(self, *a, **k):
        orig(self, *a, **k)
        if self._live:
            self._materialize()
    return _tensor


@pytest.mark.parametrize("make", [
    _step,
    lambda: (lambda m, b: lambda: em.train_step(m, b))(*em.cnn(seed=0)),  # BatchNorm, SGD
    lambda: (lambda m, b: lambda: em.train_step(m, b))(*em.tiny_gpt(seed=0)),  # AdamW, residuals
    lambda: (lambda m, b: lambda: em.train_step(m, b))(*em.lstm(seed=0)),
], ids=["writes", "cnn", "tiny_gpt", "lstm"])
def test_deferred_records_equal_records_copied_when_made(tmp_path, make):
    deferred = _dump(str(tmp_path / "deferred"), make())
    with patched(W.DumpSink, "_tensor", _copy_at_record(W.DumpSink._tensor)):
        copied = _dump(str(tmp_path / "copied"), make())
    # (stack records name the lines of this test that ran each step: left out)
    deferred, copied = ([x for x in d if "_stack_info" not in x] for d in (deferred, copied))
    assert len(deferred) == len(copied) > 50
    diff = [(a, b) for a, b in zip(deferred, copied) if a != b]
    assert not diff, diff[:3]


def test_records_are_true_as_at_entry_and_return_through_each_kind_of_write(tmp_path):
    """Hand-checked values: the records of the writes model hold the numbers of the moment."""
    torch.manual_seed(0)
    w = nn.Parameter(torch.linspace(-1, 1, 8))
    v = nn.Parameter(torch.linspace(0, 2, 8))
    x = torch.linspace(1, 8, 8)

    def step():
        torch.mul(w, 2)  # w recorded: max 1
        w.data.add_(10)  # through .data: w's own version stays
        torch.mul(w, 2)  # w recorded again: max 11
        torch.mul(v, 2)  # v recorded: max 2
        v.data = v.data * 100  # reassigned, unseen by capture
        torch.mul(x, 1)  # x: max 8
        x.mul_(3)  # in place: its input max 8, its output max 24

    recs = {r[0]: r for r in map(json.loads, _dump(str(tmp_path), step)) if "stack_info" not in r[0]}
    mx = {k: r[5][0] for k, r in recs.items()}
    assert mx["Torch_mul_0_forward_input.0"] == 1.0
    assert mx["Torch_mul_1_forward_input.0"] == 11.0
    assert mx["Torch_mul_2_forward_input.0"] == 2.0
    assert mx["Torch_mul_3_forward_input.0"] == 8.0
    assert mx["Tensor_mul__0_forward_input.0"] == 8.0
    assert mx["Tensor_mul__0_forward_output.0"] == 24.0


def test_a_write_capture_cannot_see_drops_the_record_with_a_warning_never_a_wrong_number(tmp_path):
    """A tensor written in place by another thread (capture is per thread) after it was recorded
    and before the flush: that record is left out, named in a warning; the others are written."""
    x = torch.linspace(-1, 1, 16)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), hook_name="dump", step=[0])
    dbg.configure_hook(mode="api_stack", summary_only=True)
    dbg.start()
    h = torch.tanh(x)
    th = threading.Thread(target=lambda: h.add_(100))
    th.start()
    th.join()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dbg.stop()
    dbg.close()
    names = [json.loads(line)[0] for line in _lines(str(tmp_path))]
    assert "Torch_tanh_0_forward_input.0" in names
    assert "Torch_tanh_0_forward_output.0" not in names
    text = " ".join(str(w.message) for w in caught)
    assert "Torch_tanh_0_forward_output.0" in text and "written before its statistics were read" in text
    # never a false pass: the manifest says a record is missing, so even this dump against itself
    # (both sides without the record) fails, naming it
    rank = os.path.join(str(tmp_path), "ptdbg_dump_v4.0", "step0", "rank0")
    with open(os.path.join(rank, "api_stack_dump.manifest.json")) as f:
        man = json.load(f)
    assert man["complete"] is False and "Torch_tanh_0_forward_output.0" in man["reason"]
    from pytest_ptdbg import compare

    r = compare({"npu_pkl_path": rank, "bench_pkl_path": rank}, str(tmp_path / "out"), replay_check=False)
    assert not r.passed
    assert "Torch_tanh_0_forward_output.0" in " ".join(str(p) for p in r.problems)


def test_a_gradient_changed_in_place_by_a_users_hook_is_recorded_as_autograd_handed_it_over(tmp_path):
    """A gradient hook that clips in place (``g.mul_``) runs after capture's tap and is not a
    recorded call: the gradient's record holds the value the API produced (the copy taken then),
    and nothing is dropped."""
    w = nn.Parameter(torch.linspace(-1, 1, 8))
    x = torch.linspace(1, 2, 8)
    w.register_hook(lambda g: g.mul_(100))

    def step():
        torch.mul(w, x).sum().backward()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recs = {r[0]: r for r in map(json.loads, _dump(str(tmp_path), step)) if "stack_info" not in r[0]}
    assert not [w for w in caught if "pytest-ptdbg" in str(w.message)]
    assert recs["Torch_mul_0_backward_output.0"][5][:2] == [2.0, 1.0]  # d(w*x)/dw = x, not 100 x
    assert float(w.grad.max()) == 200.0


def test_writes_capture_does_not_record_leave_true_records(tmp_path):
    """Writes made where capture records nothing: an optimizer run in a post-accumulate-grad hook
    during backward (hooks are not captured) and an in-place op outside the name table
    (``torch.ops.aten.add_``). The forward records still hold the values of their moment."""
    w = nn.Parameter(torch.linspace(-1, 1, 8))
    v = torch.linspace(0, 1, 8)
    x = torch.linspace(1, 2, 8)

    def sgd_in_backward(p):
        with torch.no_grad():
            p.add_(p.grad, alpha=-10.0)
        p.grad = None

    w.register_post_accumulate_grad_hook(sgd_in_backward)

    def step():
        torch.mul(w, x).sum().backward()
        torch.exp(v)
        torch.ops.aten.add_(v, 5.0)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recs = {r[0]: r for r in map(json.loads, _dump(str(tmp_path), step)) if "stack_info" not in r[0]}
    assert not [m for m in caught if "pytest-ptdbg" in str(m.message)]
    assert recs["Torch_mul_0_forward_input.0"][5][:2] == [1.0, -1.0]  # w before the update
    assert recs["Torch_exp_0_forward_input.0"][5][:2] == [1.0, 0.0]  # v before add_
    assert float(w.max()) == pytest.approx(-1.0 - 10.0 * 1.0)  # the update did run (w - 10 x)


@pytest.mark.parametrize("model", ["tiny_gpt", "cnn"])
def test_node_taps_checked_on_the_learned_edges_equal_walked_taps(tmp_path, model):
    """Where a call's input gradients were learned to be edges of its output's own node, later calls
    of that signature are tapped by checking those edges instead of walking the graph: the same
    backward records as walking every time."""
    from pytest_ptdbg.capture.engine import CaptureEngine

    def make():  # three training steps in one dumped step: later calls reuse what the first learned
        m, b = em.MODELS[model](seed=0)
        return lambda: [em.train_step(m, b) for _ in range(3)]

    hits = []
    orig = CaptureEngine._direct_hit

    def counting(*a):
        ok = orig(*a)
        hits.append(ok)
        return ok

    with patched(CaptureEngine, "_direct_hit", staticmethod(counting)):
        checked = _dump(str(tmp_path / "checked"), make())
    with patched(CaptureEngine, "_direct_hit", staticmethod(lambda *a: False)):
        walked = _dump(str(tmp_path / "walked"), make())
    assert sum(hits) > 5  # the checked path did tap calls
    checked, walked = ([x for x in d if "_stack_info" not in x] for d in (checked, walked))
    assert checked == walked
    assert sum("backward_output" in x for x in checked) > 10


@pytest.mark.parametrize("width", [8, 512], ids=["small", "large"])
def test_parameter_gradients_are_taken_by_autograd_as_without_the_debugger(tmp_path, width):
    """Recording a parameter's gradient holds no reference autograd does not expect: as in plain
    torch, ``AccumulateGrad`` takes the gradient itself as ``.grad`` (no copy, version 0), so the
    optimizer's read of it is the data already measured, and its record equals the backward's."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
    x = torch.randn(4, width)
    versions: list = []

    def step():
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        versions.append([p.grad._version for p in model.parameters()])
        opt.step()

    step()
    plain = versions.pop()
    dbg = PrecisionDebugger(dump_path=str(tmp_path), hook_name="dump", step=None)
    dbg.configure_hook(mode="api_stack", summary_only=True)
    for _ in range(3):  # the later steps run with capture's learned taps and a warm cache
        dbg.start()
        step()
        dbg.stop()
        dbg.step()
    assert plain == [0, 0, 0, 0] and versions == [plain] * 3
    pkl = os.path.join(str(tmp_path), "ptdbg_dump_v4.0", "step2", "rank0", "api_stack_dump.pkl")
    with open(pkl) as f:
        recs = {r[0]: r for r in map(json.loads, f) if "stack_info" not in r[0]}
    # SGD updates in the parameters' order: the first layer's weight, bias, then the second's
    for k, layer in enumerate((0, 0, 1, 1)):
        assert recs[f"Tensor_add__{k}_forward_input.1"][3:6] == \
            recs[f"Functional_linear_{layer}_backward_output.{1 + k % 2}"][3:6]
