"""Bad input for capture: what user code does inside a debugged step must run exactly as without
the debugger (same numbers bit for bit, no crash, no exception), and the records must be true:
inputs as they are at the call's entry, outputs as at its return.

Each case is named by its test. Crashes are observed in a subprocess.
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

from locations import REPO_ROOT
import torch
import torch.nn as nn
import torch.nn.functional as F

import example_models as em
from pytest_ptdbg import PrecisionDebugger, seed_all
from pytest_ptdbg.capture.sink import Sink
from pytest_ptdbg.format import records

ROOT = REPO_ROOT
MODES = {"stats": True, "full": False}  # name -> summary_only


# -------------------------------------------------------------------------------- helpers

def _debugger(tmp_path, mode: str, step=(0,)) -> PrecisionDebugger:
    dbg = PrecisionDebugger(dump_path=str(tmp_path), step=list(step))
    dbg.configure_hook(mode="api_stack", summary_only=MODES[mode])
    return dbg


def _records(tmp_path, step: int = 0) -> dict:
    """``{tensor key: record}`` of one step's dump (stack records left out)."""
    (pkl,) = glob.glob(os.path.join(records.rank_dir(str(tmp_path), step), "*.pkl"))
    out = {}
    with open(pkl) as f:
        for line in f:
            rec = json.loads(line)
            if not rec[0].endswith("_stack_info"):
                out[rec[0]] = rec
    return out


def _npy(tmp_path, rec, step: int = 0) -> np.ndarray:
    data = glob.glob(os.path.join(records.rank_dir(str(tmp_path), step), "*_dump"))[0]
    return np.load(os.path.join(data, rec[6]["npy"]), allow_pickle=False)


def _stats(t: torch.Tensor) -> list:
    x = t.detach().double()
    return [x.max().item(), x.min().item(), x.mean().item(), x.norm().item()]


def _run_script(body: str, timeout: int = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(body)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _record_of(recs: dict, key: str) -> list:
    assert key in recs, f"{key} not recorded; have {sorted(recs)[:40]}"
    return recs[key]


# ------------------------------------------------- 1. in-place ops on views of non-leaf tensors

INPLACE_VARIANTS = (
    "iadd_row", "setitem_row", "add_self", "mul_column_view", "t_", "transpose_add_", "view_input_add_",
    "copy_into_slice", "kv_cache", "masked_fill_", "out_arg", "base_changed_after_view", "inplace_on_stale_view",
)

_INPLACE_STEP = """
import torch

def step(variant):
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4, 3))
    b = torch.nn.Parameter(torch.randn(3))
    h = w * 2                                   # a non-leaf that requires grad
    if variant == "iadd_row":
        h[0] += 1
    elif variant == "setitem_row":
        h[0] = h[3]
    elif variant == "add_self":
        h.add_(h)
    elif variant == "mul_column_view":
        h[:, 0].mul_(2)
    elif variant == "t_":
        h.t_()
    elif variant == "transpose_add_":
        h.transpose(0, 1).add_(1)
    elif variant == "view_input_add_":
        v = h[1:3]
        v.add_(b)
    elif variant == "copy_into_slice":
        h[1:3].copy_(w[0:2] * 3)
    elif variant == "kv_cache":
        cache = torch.zeros(6, 3)
        cache[:4] = h
        cache[4:] = h[:2] + b
        h = cache
    elif variant == "masked_fill_":
        h.masked_fill_(h > 1, 0.0)
    elif variant == "out_arg":
        buf = torch.empty(4, 3)
        torch.mul(w.detach(), 3, out=buf)
        h = h + buf
    elif variant == "base_changed_after_view":
        v = h[0]
        h.mul_(2)
        h = h + v
    elif variant == "inplace_on_stale_view":
        v = h[0]
        h.mul_(2)
        v.add_(b)
    loss = (h * h).sum()
    loss.backward()
    return loss.detach(), w.grad.clone(), None if b.grad is None else b.grad.clone()
"""


@pytest.mark.parametrize("mode", sorted(MODES))
def test_inplace_on_views_of_a_nonleaf_does_not_crash_and_keeps_gradients(tmp_path, mode):
    """``h = w * 2; h[0] += 1`` / ``h[0] = h[3]`` / ``h.add_(h)`` then backward killed the process
    with SIGSEGV under the debugger (hooking a view whose base an API had just changed in place).
    Every variant must run, with loss and gradients bit-identical to the plain run, and the
    gradient ``__setitem__`` produced for its value must be recorded as it really is."""
    script = _INPLACE_STEP + f"""
import json, glob, sys
from pytest_ptdbg import PrecisionDebugger
for i, variant in enumerate({INPLACE_VARIANTS!r}):
    plain = step(variant)
    dbg = PrecisionDebugger(dump_path={str(tmp_path)!r} + "/" + variant, step=[0])
    dbg.configure_hook(mode="api_stack", summary_only={MODES[mode]!r})
    dbg.start()
    got = step(variant)
    dbg.stop()
    dbg.close()
    same = all((a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
               for a, b in zip(plain, got))
    print(variant, "same" if same else "DIFFERENT", flush=True)
    if variant == "setitem_row":
        torch.manual_seed(0)
        h3 = (torch.randn(4, 3) * 2)[3]
        (pkl,) = glob.glob(dbg.rank_dirs[0] + "/*.pkl")
        recs = {{r[0]: r for r in map(json.loads, open(pkl))}}
        g = recs["Tensor___setitem___0_backward_output.2"][5]   # d loss / d value = 2 * h[3]
        print("setitem_grad", g[0] == (2 * h3).max().item() and g[1] == (2 * h3).min().item(), flush=True)
"""
    res = _run_script(script)
    assert res.returncode == 0, f"rc={res.returncode} (139: SIGSEGV)\n{res.stdout}\n{res.stderr[-3000:]}"
    lines = dict(line.split() for line in res.stdout.splitlines() if line.strip())
    assert {v: lines.get(v) for v in INPLACE_VARIANTS} == {v: "same" for v in INPLACE_VARIANTS}
    assert lines["setitem_grad"] == "True"


# ------------------------------------------------------------------------- 2. inference mode

@pytest.mark.parametrize("mode", sorted(MODES))
def test_inference_mode_step_runs_and_is_recorded(tmp_path, mode):
    """Under ``torch.inference_mode()`` the debugger raised ``Inference tensors do not track
    version counter``; the step must run and its records be true."""
    def body():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        x = torch.randn(5, 8)
        with torch.inference_mode():
            y = model(x)
            y.add_(1)
            z = y.sum()
        return y, z

    y0, z0 = body()
    dbg = _debugger(tmp_path, mode)
    dbg.start()
    y1, z1 = body()
    dbg.stop()
    dbg.close()
    assert torch.equal(y0, y1) and torch.equal(z0, z1)
    recs = _records(tmp_path)
    add = _record_of(recs, "Tensor_add__0_forward_output.0")
    assert add[5] == pytest.approx(_stats(y0), rel=1e-6)
    before = _record_of(recs, "Tensor_add__0_forward_input.0")
    assert before[5] == pytest.approx(_stats(y0 - 1), rel=1e-6)  # as at entry, before add_
    if mode == "full":
        assert np.array_equal(_npy(tmp_path, add), y0.numpy())


# ------------------------------------------------------------------ 3. special tensor kinds

def _debug_body(tmp_path, mode, body):
    plain = body()
    dbg = _debugger(tmp_path, mode)
    dbg.start()
    got = body()
    dbg.stop()
    dbg.close()
    return plain, got, _records(tmp_path)


@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_sparse_tensors_are_recorded_with_dense_statistics(tmp_path, mode, layout):
    """Sparse COO/CSR tensors raised ``NotImplementedError`` (aminmax) / "no storage" into the
    user's code; they must be recorded with the statistics (and ``.npy``) of the dense tensor."""
    def body():
        torch.manual_seed(0)
        x = torch.randn(6, 5) * (torch.rand(6, 5) > 0.5)  # zeros left out of the sparse form
        s = x.to_sparse() if layout == "coo" else x.to_sparse_csr()
        return (s * 2).to_dense()

    plain, got, recs = _debug_body(tmp_path, mode, body)
    assert torch.equal(plain, got)
    rec = _record_of(recs, "Tensor_mul_1_forward_output.0")
    assert rec[3:5] == ["torch.float32", [6, 5]]
    assert rec[5] == pytest.approx(_stats(plain), rel=1e-6)
    assert "sparse" in rec[6]["note"]
    if mode == "full":
        assert np.array_equal(_npy(tmp_path, rec), plain.numpy())


@pytest.mark.parametrize("dtype", ["uint16", "uint32", "uint64", "qint8"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_unsigned_and_quantized_tensors_are_recorded(tmp_path, mode, dtype):
    """uint16/uint32/uint64 and quantized (qint8) tensors raised ``aminmax not implemented``;
    they must be recorded with exact statistics (quantized: of the dequantized values)."""
    def body():
        torch.manual_seed(0)
        if dtype == "qint8":
            q = torch.quantize_per_tensor(torch.randn(4, 3), 0.1, 0, torch.qint8)
            return q.dequantize(), torch.int_repr(q.clone())
        t = torch.tensor([[0, 7, 300], [65535, 2, 9]]).to(getattr(torch, dtype))
        return t.to(torch.int64), t.clone().to(torch.int64)

    plain, got, recs = _debug_body(tmp_path, mode, body)
    assert all(torch.equal(a, b) for a, b in zip(plain, got))
    rec = _record_of(recs, "Tensor_clone_0_forward_output.0")
    assert rec[3] == f"torch.{dtype}"
    values = plain[0]
    assert rec[5][:2] == [values.max().item(), values.min().item()]
    assert rec[5][2:] == pytest.approx(_stats(values)[2:], rel=1e-6)
    if mode == "full":
        assert np.array_equal(_npy(tmp_path, rec), values.numpy())


@pytest.mark.parametrize("mode", sorted(MODES))
def test_meta_and_nested_tensors_are_recorded_without_raising(tmp_path, mode):
    """Meta tensors ("Cannot copy out of meta tensor") and nested tensors ("NestedTensorImpl
    doesn't support sizes") raised into the user's code; they are recorded with what can be
    known and a note."""
    def body():
        torch.manual_seed(0)
        m = torch.empty(4, 3, device="meta") * 2
        n = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)])
        return m.shape, (n * 2).to_padded_tensor(0.0)

    plain, got, recs = _debug_body(tmp_path, mode, body)
    assert plain[0] == got[0] and torch.equal(plain[1], got[1])
    meta = _record_of(recs, "Tensor_mul_0_forward_output.0")
    assert meta[3:6] == ["torch.float32", [4, 3], []] and "meta" in meta[6]["note"] and "npy" not in meta[6]
    nested = _record_of(recs, "Tensor_mul_1_forward_output.0")
    padded = plain[1]
    assert nested[5][:2] == [padded.max().item(), padded.min().item()] and "nested" in nested[6]["note"]


@pytest.mark.parametrize("mode", sorted(MODES))
def test_sparse_gradients_and_nested_inputs_that_require_grad_flow(tmp_path, mode):
    """``nn.Embedding(sparse=True)`` (its weight gets a sparse gradient, which the alias view's
    backward could not reshape), a sparse leaf and a nested tensor built from leaves that require
    grad: backward must run and give the plain run's gradients bit for bit."""
    def body():
        torch.manual_seed(0)
        emb = nn.Embedding(10, 4, sparse=True)
        e = emb(torch.tensor([1, 2, 1])).pow(2).sum()
        e.backward()
        sp = torch.randn(5, 3).to_sparse().requires_grad_()
        torch.sparse.sum(sp * 3).backward()
        a, b = torch.randn(2, 3, requires_grad=True), torch.randn(4, 3, requires_grad=True)
        y = (torch.nested.as_nested_tensor([a, b]) * 2).to_padded_tensor(0.0).sum()
        y.backward()
        return e, emb.weight.grad.to_dense(), sp.grad.to_dense(), y, a.grad, b.grad

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # nested tensors are a prototype
        plain, got, recs = _debug_body(tmp_path, mode, body)
    assert all(torch.equal(x, y) for x, y in zip(plain, got))
    grad_in = _record_of(recs, "Functional_embedding_0_backward_input.0")  # d e / d output = 2 * output
    assert grad_in[4] == [3, 4]


class _TracingTensor(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.mark.parametrize("mode", sorted(MODES))
def test_other_tensor_kinds_are_recorded_truly(tmp_path, mode):
    """complex, 0-element, bool, float8_e4m3fn, nn.Parameter, a Tensor subclass with
    ``__torch_function__`` and a requires_grad tensor changed under ``no_grad``: same numbers,
    records as the values are."""
    def body():
        torch.manual_seed(0)
        x = torch.randn(4, 3)
        c = torch.complex(x, x) * 2
        e = torch.empty(0, 3) + 1
        b = (x > 0) & (x < 1)
        f8 = x.to(torch.float8_e4m3fn).to(torch.float32)
        p = nn.Parameter(x.clone())
        (p * 3).sum().backward()
        s = (x.as_subclass(_TracingTensor) * 2 + 1).as_subclass(torch.Tensor)
        with torch.no_grad():
            p.mul_(2)
            q = p + 1
        return c, e, b, f8, p.grad, s, q

    plain, got, recs = _debug_body(tmp_path, mode, body)
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(plain, got))
    c, e, b, f8, grad, s, q = plain
    assert _record_of(recs, "Tensor_mul_0_forward_output.0")[5] == pytest.approx(_stats(c.abs()), rel=1e-6)
    assert _record_of(recs, "Tensor_add_0_forward_output.0")[4:6] == [[0, 3], []]
    assert _record_of(recs, "Tensor_to_1_forward_output.0")[5] == pytest.approx(_stats(f8), rel=1e-6)
    mul_ = _record_of(recs, "Tensor_mul__0_forward_input.0")  # the parameter as at entry
    assert mul_[5] == pytest.approx(_stats((q - 1) / 2), rel=1e-6)
    assert _record_of(recs, "Tensor_add_2_forward_output.0")[5] == pytest.approx(_stats(q), rel=1e-6)


# ------------------------------------------------------- 4. stale data: as at entry / return

@pytest.mark.parametrize("features", [3, 512])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_batchnorm_running_mean_is_recorded_as_at_entry(tmp_path, mode, features):
    """Two BatchNorm1d calls per step: batch_norm updates running_mean in its kernel without a
    version bump, and the second call's ``input.1`` was recorded stale ([0, 0, 0], the first
    call's value) in the ``.pkl`` and the ``.npy``; over two steps the ``.pkl`` and the ``.npy`` of
    one record even disagreed. Each record must hold the value at the call's entry."""
    def make():
        torch.manual_seed(0)
        return nn.BatchNorm1d(features), torch.randn(8, features), torch.randn(8, features) + 1

    bn, x1, x2 = make()
    truth = []  # running_mean at the entry of each batch_norm call, from a plain run
    for _ in range(2):
        for x in (x1, x2):
            truth.append(bn.running_mean.clone())
            bn(x)
    bn, x1, x2 = make()
    dbg = _debugger(tmp_path, mode, step=(0, 1))
    for _ in range(2):
        dbg.start()
        bn(x1)
        bn(x2)
        dbg.stop()
        dbg.step()
    dbg.close()
    for step in range(2):
        recs = _records(tmp_path, step)
        for k in range(2):
            t = truth[2 * step + k]
            rec = _record_of(recs, f"Functional_batch_norm_{k}_forward_input.1")
            assert rec[5][:2] == [t.max().item(), t.min().item()], (step, k)
            assert rec[5][2:] == pytest.approx(_stats(t)[2:], rel=1e-5, abs=1e-7), (step, k)
            if mode == "full":
                assert np.array_equal(_npy(tmp_path, rec, step), t.numpy()), (step, k)


@pytest.mark.parametrize("update", ["adam_foreach", "addcdiv_", "data_add_"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_parameters_updated_in_place_are_recorded_as_at_next_entry(tmp_path, mode, update):
    """Parameters updated in place under no_grad (``torch._foreach_*`` in Adam, ``addcdiv_``,
    ``p.data.add_``, which has its own version counter) and read by the next step's forward:
    each step's record holds the weight as it is then."""
    def make():
        torch.manual_seed(0)
        m = nn.Linear(64, 64)
        opt = torch.optim.Adam(m.parameters(), lr=0.1, foreach=True) if update == "adam_foreach" else None
        return m, torch.randn(16, 64), opt

    def train(m, x, opt):
        m(x).pow(2).mean().backward()
        if opt is not None:
            opt.step()
            opt.zero_grad()
            return
        with torch.no_grad():
            for p in m.parameters():
                if update == "addcdiv_":
                    p.addcdiv_(p.grad, p.grad.abs() + 1, value=-0.1)
                else:
                    p.data.add_(p.grad, alpha=-0.1)
                p.grad = None

    m, x, opt = make()
    truth = []
    for _ in range(3):
        truth.append(m.weight.detach().clone())
        train(m, x, opt)
    m, x, opt = make()
    dbg = _debugger(tmp_path, mode, step=(0, 1, 2))
    for _ in range(3):
        dbg.start()
        train(m, x, opt)
        dbg.stop()
        dbg.step()
    dbg.close()
    assert not torch.equal(m.weight, truth[-1])  # it trained
    for step in range(3):
        rec = _record_of(_records(tmp_path, step), "Functional_linear_0_forward_input.1")
        t = truth[step]
        assert rec[5][:2] == [t.max().item(), t.min().item()], step
        assert rec[5][3] == pytest.approx(t.norm().item(), rel=1e-5), step
        if mode == "full":
            assert np.array_equal(_npy(tmp_path, rec, step), t.numpy()), step


# ---------------------------------------------------- 5. internal errors never reach the user

class _BrokenSink(Sink):
    """A sink with a bug in every callback (a third-party sink, or a bug of ours)."""

    def __init__(self) -> None:
        self.calls = 0

    def start_call(self, call) -> bool:
        self.calls += 1
        if self.calls % 3 == 0:
            raise KeyError("start_call bug")
        return True

    def end_call(self, call) -> None:
        raise ZeroDivisionError("end_call bug")

    def on_backward(self, call, io, index, grad) -> None:
        raise IndexError("on_backward bug")


def _mlp_step(model, batch):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model.loss(batch)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    opt.step()
    return loss.detach(), grads, [p.detach().clone() for p in model.parameters()]


def _same(a, b) -> bool:
    la, ga, pa = a
    lb, gb, pb = b
    return torch.equal(la, lb) and all(torch.equal(x, y) for x, y in zip(ga + pa, gb + pb))


def test_internal_error_in_a_sink_is_warned_once_and_the_step_is_unchanged(tmp_path):
    """A sink raising in start_call/end_call/on_backward used to raise into the user's step; now
    the step computes the same numbers, each kind of failure is warned once, the sink is marked
    degraded, and the other sink's dump is complete."""
    plain = _mlp_step(*em.mlp(seed=0))
    dbg = _debugger(tmp_path, "stats")
    dbg.start()  # builds the dump sink; add the broken one beside it
    broken = _BrokenSink()
    (dump_sink,) = dbg.sinks
    dbg._engine.sinks = [dump_sink, broken]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _mlp_step(*em.mlp(seed=0))
    dbg.stop()
    dbg.close()
    assert _same(plain, got)
    ours = [str(w.message) for w in caught if "pytest-ptdbg: internal error" in str(w.message)]
    assert len(ours) == 3 and {"KeyError", "ZeroDivisionError", "IndexError"} <= set(" ".join(ours).replace(":", " ").split())
    assert broken.degraded and "_BrokenSink" in broken.degraded
    assert dump_sink.degraded is None
    recs = _records(tmp_path)
    assert "Functional_linear_0_backward_output.1" in recs and "Functional_cross_entropy_0_forward_output.0" in recs


def test_internal_error_in_a_record_loses_only_that_record(tmp_path, monkeypatch):
    """An internal error while building one record (here: measuring one kind of tensor fails)
    leaves the user's step unchanged, warns once, marks the dump sink degraded and keeps the
    other records."""
    from pytest_ptdbg.dump import writer

    real = writer.body_line  # every tensor record line is built by it

    def failing(key, *args, **kwargs):
        if "_relu_" in key:
            raise MemoryError("cannot allocate")
        return real(key, *args, **kwargs)

    monkeypatch.setattr(writer, "body_line", failing)
    plain = _mlp_step(*em.mlp(seed=0))
    dbg = _debugger(tmp_path, "full")
    dbg.start()
    sink = dbg.sinks[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = _mlp_step(*em.mlp(seed=0))
        dbg.stop()  # records are built when their batch is written: at the latest here
    dbg.close()
    assert _same(plain, got)
    assert sum("MemoryError" in str(w.message) for w in caught) == 1
    assert sink.degraded and "relu" in sink.degraded
    recs = _records(tmp_path)
    assert not [k for k in recs if "_relu_" in k]
    assert "Functional_linear_1_forward_output.0" in recs and "Functional_linear_0_backward_output.1" in recs
    # never a false pass: the manifest says the dump misses records, naming the first
    man = _manifest(tmp_path)
    assert man["complete"] is False and "relu" in man["reason"] and "MemoryError" in man["reason"]


def _manifest(tmp_path, step: int = 0) -> dict:
    (path,) = glob.glob(os.path.join(records.rank_dir(str(tmp_path), step), "*.manifest.json"))
    with open(path) as f:
        return json.load(f)


def test_an_internal_error_in_capture_makes_the_dump_incomplete_and_no_compare_passes(tmp_path, monkeypatch):
    """Capture failing to tap a call's input gradients (here: checking the learned edges raises,
    as a stale patch once made it do in every later test of a worker) used to leave the dump
    saying complete while it missed those calls' backward_output records: a compare of two such
    dumps passed on fewer records. Now the step is unchanged, the manifest says incomplete and
    names the call, and the compare fails, even of the dump against itself."""
    from pytest_ptdbg import compare
    from pytest_ptdbg.capture.engine import CaptureEngine

    def broken(*_a):
        raise TypeError("edge check bug")

    def run(path):
        seed_all(0)
        model, batch = em.tiny_gpt(seed=0)
        dbg = _debugger(path, "stats")
        dbg.start()
        torch.manual_seed(1)
        out = _mlp_step(model, batch)
        dbg.stop()
        dbg.close()
        return out

    clean = run(tmp_path / "clean")
    monkeypatch.setattr(CaptureEngine, "_direct_hit", staticmethod(broken))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = run(tmp_path / "broken")
    assert _same(clean, got)
    assert any("edge check bug" in str(w.message) for w in caught)
    assert _manifest(tmp_path / "clean")["complete"] is True
    man = _manifest(tmp_path / "broken")
    assert man["complete"] is False and "capture node taps" in man["reason"] and "edge check bug" in man["reason"]
    lost = set(_records(tmp_path / "clean")) - set(_records(tmp_path / "broken"))
    assert lost and all("_backward_output." in k for k in lost)
    rank = records.rank_dir(str(tmp_path / "broken"), 0)
    for bench in (rank, records.rank_dir(str(tmp_path / "clean"), 0)):
        r = compare({"npu_pkl_path": rank, "bench_pkl_path": bench}, str(tmp_path / "out"), replay_check=False)
        assert not r.passed
        assert "capture node taps" in " ".join(str(p) for p in r.problems)


# ------------------------------------- every example model and the idioms above, bit for bit

class _Idioms(nn.Module):
    """The idioms above in one small model: in-place updates of non-leaf rows and columns, a
    KV-cache-like copy into a buffer, a mask, BatchNorm called twice, an in-place transpose view."""

    def __init__(self) -> None:
        super().__init__()
        self.lin1 = nn.Linear(8, 16)
        self.bn = nn.BatchNorm1d(16)
        self.lin2 = nn.Linear(16, 4)
        self.register_buffer("cache", torch.zeros(12, 16))

    def loss(self, batch):
        x, y = batch
        h = self.lin1(x)
        h[0] += 1
        h[1] = h[3]
        h[:, 0].mul_(2)
        h = self.bn(self.bn(h) * 0.5)
        cache = self.cache.clone()
        cache[:8] = h
        cache[8:] = h[:4] * 2
        h = cache.masked_fill(cache > 3, 3.0)
        h.transpose(0, 1).add_(0.1)
        return F.cross_entropy(self.lin2(torch.relu(h)), y)


def _idioms(seed: int = 0):
    torch.manual_seed(seed)
    model = _Idioms()
    return model, (torch.randn(8, 8), torch.randint(0, 4, (12,)))


_ALL_MODELS = dict(em.MODELS, idioms=_idioms)


@pytest.mark.parametrize("name", sorted(_ALL_MODELS))
@pytest.mark.parametrize("mode", sorted(MODES))
def test_models_train_bit_identically_under_the_debugger(tmp_path, mode, name):
    """Two training steps of each example model and of the idioms model: losses, gradients,
    updated parameters and buffers are bit-identical with and without the debugger."""
    def run(dbg):
        seed_all(0)
        model, batch = _ALL_MODELS[name](seed=0)
        model.train()
        opt = em.make_optimizer(model) if name != "idioms" else torch.optim.AdamW(model.parameters(), lr=0.01)
        got = []
        for _ in range(2):
            if dbg:
                dbg.start()
            torch.manual_seed(1)  # same dropout masks in both runs
            opt.zero_grad(set_to_none=True)
            loss = model.loss(batch)
            loss.backward()
            got.append(loss.detach())
            got += [p.grad.clone() for p in model.parameters()]
            opt.step()
            if dbg:
                dbg.stop()
                dbg.step()
        got += [t.detach().clone() for t in model.state_dict().values()]
        if dbg:
            dbg.close()
        return got

    plain = run(None)
    got = run(_debugger(tmp_path, mode, step=(0, 1)))
    assert len(plain) == len(got)
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(plain, got))
    assert _records(tmp_path, 1)  # it did record the second step
