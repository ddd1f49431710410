"""Bad input for capture: the user's autocast, functorch transforms, torch.compile and an API
whose autograd nodes depend on its options (issues 17 and 18).

Under the debugger the user's numbers stay bit for bit what they are without it, nothing the
debugger does raises into the user's code, and a warning says truly what happened.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import example_models as em
from pytest_ptdbg import PrecisionDebugger
from pytest_ptdbg.dump import stats, writer
from pytest_ptdbg.format import records

MODES = {"stats": True, "full": False}  # name -> summary_only


def _debugger(tmp_path, mode: str) -> PrecisionDebugger:
    dbg = PrecisionDebugger(dump_path=str(tmp_path), step=[0])
    dbg.configure_hook(mode="api_stack", summary_only=MODES[mode])
    return dbg


def _lines(tmp_path) -> list:
    (pkl,) = glob.glob(os.path.join(records.rank_dir(str(tmp_path), 0), "*.pkl"))
    with open(pkl) as f:
        return [json.loads(line) for line in f]


def _records(tmp_path) -> dict:
    return {r[0]: r for r in _lines(tmp_path) if not r[0].endswith("_stack_info")}


def _ours(caught) -> list:
    return [str(w.message) for w in caught if "pytest-ptdbg" in str(w.message)]


def _debugged(tmp_path, mode: str, fn):
    """``fn()`` between start() and stop() (all warnings caught): ``(result, our warnings)``."""
    dbg = _debugger(tmp_path, mode)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dbg.start()
        try:
            out = fn()
        finally:
            dbg.stop()
            dbg.close()
    return out, _ours(caught)


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return a == b


# ------------------------------------------------------- 1. statistics outside the user's autocast

def _autocast_loop() -> torch.Tensor:
    h = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for _ in range(40):
            h = torch.softmax((h @ torch.eye(8)).half(), -1).float()
    return h


def test_statistics_are_computed_outside_the_users_autocast(tmp_path, monkeypatch):
    """Issue 17.1: the batched statistics ran under the user's autocast (``torch.cat`` of float16
    snapshots under a bfloat16 autocast raised "Unexpected floating ScalarType in
    at::autocast::prioritize"; a fallback measured them one by one, with other numbers than the
    batch, and the warning said records were missing). Now the batch is measured outside autocast,
    nothing is warned, and every record holds exactly the batch statistics of its own saved tensor,
    as without autocast; the user's numbers are unchanged."""
    monkeypatch.setattr(writer, "QUEUE_MAX", 16)  # batches are measured inside the autocast block
    plain = _autocast_loop()
    got, ours = _debugged(tmp_path, "full", _autocast_loop)
    assert _equal(plain, got)
    assert not ours, ours
    data = glob.glob(os.path.join(records.rank_dir(str(tmp_path), 0), "*_dump"))[0]
    checked = set()
    for key, rec in _records(tmp_path).items():
        if "npy" not in rec[6] or rec[3] not in ("torch.float32", "torch.float16"):
            continue
        t = torch.from_numpy(np.load(os.path.join(data, rec[6]["npy"]), allow_pickle=False))
        mx, mn, mean, l2, nan, inf, _ = stats.batch_stat_columns([t])
        assert rec[5] == [mx[0], mn[0], mean[0], l2[0]], key
        checked.add(rec[3])
    assert checked == {"torch.float32", "torch.float16"}


def test_a_flush_inside_autocast_measures_outside_it(tmp_path):
    """stop() called inside the user's autocast block measures the waiting batch outside it."""
    dbg = _debugger(tmp_path, "stats")
    h = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            dbg.start()
            x = (h @ torch.eye(8)).half()
            y = torch.softmax(x, -1).float()
            dbg.stop()
        dbg.close()
    assert not _ours(caught), _ours(caught)
    recs = _records(tmp_path)
    out = recs["Torch_softmax_0_forward_output.0"]
    mx, mn, mean, l2, _, _, _ = stats.batch_stat_columns([y.float()])
    assert out[3] == "torch.float16" and out[5] == [mx[0], mn[0], mean[0], l2[0]]


def test_a_warning_says_what_really_happened(tmp_path, monkeypatch):
    """When the batch does fail, its records are measured one by one, with the batch's numbers,
    and the warning says that none is missing (it said "the dump misses this record")."""
    real = stats.batch_stat_columns

    def failing(tensors):
        if len(tensors) > 1:
            raise RuntimeError("batch failed")
        return real(tensors)

    monkeypatch.setattr(writer, "batch_stat_columns", failing)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(2))
    got, ours = _debugged(tmp_path, "stats", lambda: torch.tanh(x) * 2)
    assert len(ours) == 1 and "batch failed" in ours[0] and "none is missing" in ours[0], ours
    assert "misses" not in ours[0]
    recs = _records(tmp_path)
    t = torch.tanh(x)
    mx, mn, mean, l2, _, _, _ = real([t])
    assert recs["Torch_tanh_0_forward_output.0"][5] == [mx[0], mn[0], mean[0], l2[0]]


# -------------------------------------------- 2. an API whose nodes depend on its options (einsum)

class _LinearAttention(nn.Module):
    """A linear-attention mixer: running sums of k v^T and of k, read by q."""

    def __init__(self, d: int = 8, dk: int = 4, dv: int = 4) -> None:
        super().__init__()
        self.q = nn.Linear(d, dk)
        self.k = nn.Linear(d, dk)
        self.v = nn.Linear(d, dv)
        self.o = nn.Linear(dv, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = F.elu(self.q(x)) + 1, F.elu(self.k(x)) + 1, self.v(x)
        kv = torch.cumsum(torch.einsum("btk,btv->btkv", k, v), 1)
        z = torch.cumsum(k, 1)
        num = torch.einsum("btk,btkv->btv", q, kv)
        den = torch.einsum("btk,btk->bt", q, z)
        return self.o(num / den.unsqueeze(-1))


def _mixer_steps(steps: int = 3):
    torch.manual_seed(0)
    m = _LinearAttention()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x = torch.randn(2, 6, 8)
    out = []
    for _ in range(steps):
        opt.zero_grad()
        loss = m(x).pow(2).mean()
        loss.backward()
        out.append((loss.detach(), [p.grad.clone() for p in m.parameters()]))
        opt.step()
    return out


def test_einsum_with_another_equation_gets_its_input_gradients(tmp_path):
    """Issue 17.2: capture learned from ``einsum("btk,btv->btkv", k, v)`` that node taps find the
    inputs' gradients and used them for ``einsum("btk,btk->bt", q, z)`` (same function, same
    ranks), whose nodes differ: every step warned "input gradients not found in the API's autograd
    nodes" and its backward_output records were missing. Now the equation is part of what is
    learned: every einsum call's input gradients are recorded, nothing is warned, the numbers are
    unchanged."""
    plain = _mixer_steps()
    got, ours = _debugged(tmp_path, "stats", _mixer_steps)
    assert _equal(plain, got)
    assert not ours, ours
    recs = _records(tmp_path)
    n_einsum = sum(1 for k in recs if k.startswith("Torch_einsum_") and k.endswith("_forward_output.0"))
    assert n_einsum == 9
    for i in range(n_einsum):
        for j in (1, 2):  # input 0 is the equation
            assert f"Torch_einsum_{i}_backward_output.{j}" in recs, (i, j)


def test_einsum_input_gradient_records_are_this_calls_share(tmp_path):
    """The den einsum's recorded input gradients are its own share: ``d sum(w * den) / d q`` is
    ``w[..., None] * z`` (q also feeds another einsum, whose share is not in this record)."""
    torch.manual_seed(0)
    q = torch.randn(2, 5, 4, requires_grad=True)
    k = torch.randn(2, 5, 4, requires_grad=True)
    v = torch.randn(2, 5, 3, requires_grad=True)
    w = torch.randn(2, 5)

    def run():
        kv = torch.cumsum(torch.einsum("btk,btv->btkv", k, v), 1)
        z = torch.cumsum(k, 1)
        num = torch.einsum("btk,btkv->btv", q, kv)
        den = torch.einsum("btk,btk->bt", q, z)
        (num.sum() + (w * den).sum()).backward()
        return z.detach()

    z, ours = _debugged(tmp_path, "stats", run)
    assert not ours, ours
    rec = _records(tmp_path)["Torch_einsum_2_backward_output.1"]
    g = (w[..., None] * z).double()
    assert rec[5][:2] == pytest.approx([g.max().item(), g.min().item()], rel=1e-6)
    assert rec[5][3] == pytest.approx(g.norm().item(), rel=1e-6)


# ------------------------------------------------------------------ 3. functorch transforms

def _mlp_params():
    model, _ = em.mlp(seed=0, batch_size=4, d_in=6, hidden=8, n_classes=3)
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(3))
    y = torch.tensor([0, 2, 1, 0])
    return model, params, x, y


def _transforms():
    """Every functorch transform on a real MLP's loss, plus the issue's one-liners."""
    from torch.func import functional_call, grad, hessian, jacfwd, jacrev, vjp, vmap

    model, params, x, y = _mlp_params()

    def loss(p, xb, yb):
        return F.cross_entropy(functional_call(model, p, (xb,)), yb)

    def one(p, xi, yi):
        return loss(p, xi[None], yi[None])

    def loss_w(wv):
        return loss({**params, "fc1.weight": wv}, x, y)

    def loss_b(bv):
        return loss({**params, "fc3.bias": bv}, x, y)

    xs = torch.tensor([1.0, 2.0, 3.0])
    f = lambda v: (v * v).sum()  # noqa: E731
    out, fn = vjp(lambda p: functional_call(model, p, (x,)), params)
    return {
        "grad": grad(loss)(params, x, y),
        "vmap_grad": vmap(grad(one), in_dims=(None, 0, 0))(params, x, y),
        "vjp": (out, fn(torch.ones_like(out))),
        "jacrev": jacrev(loss_w)(params["fc1.weight"]),
        "jacfwd": jacfwd(loss_w)(params["fc1.weight"]),
        "hessian": hessian(loss_b)(params["fc3.bias"]),
        "vmap": vmap(lambda xi: functional_call(model, params, (xi[None],)))(x),
        "issue_grad": grad(f)(xs),
        "issue_vmap_grad": vmap(grad(f))(torch.stack([xs, 2 * xs])),
        "issue_vjp": vjp(f, xs)[1](torch.tensor(1.0)),
        "issue_jacrev": jacrev(f)(xs),
        "issue_hessian": hessian(f)(xs),
    }


@pytest.mark.parametrize("mode", list(MODES))
def test_functorch_transforms_are_bit_identical_under_the_debugger(tmp_path, mode):
    """Issue 17.3 (critical): between start() and stop() ``torch.func.grad(f)(x)`` was all zeros
    (an alias of a wrapped tensor cut what the transform differentiates) with a warning that the
    step went on unchanged; vjp/jacrev/hessian raised "element 0 of tensors does not require grad"
    into the user's code. Now functorch's wrapped tensors are never aliased or hooked: every
    transform gives exactly what it gives without the debugger, and nothing is warned."""
    plain = _transforms()
    assert _equal(plain["issue_grad"], torch.tensor([2.0, 4.0, 6.0]))
    got, ours = _debugged(tmp_path, mode, _transforms)
    assert not ours, ours
    for name in plain:
        assert _equal(plain[name], got[name]), name


def test_functorch_calls_are_recorded_with_their_values(tmp_path):
    """Inside ``torch.func.grad`` the records hold the wrapped tensors' values (a vmapped tensor:
    all its lanes), not a dropped record."""
    from torch.func import grad, vmap

    xs = torch.tensor([1.0, 2.0, 3.0])

    def run():
        g = grad(lambda v: (v * v).sum())(xs)
        b = vmap(torch.sin)(torch.stack([xs, 2 * xs]))
        return g, b

    (g, b), ours = _debugged(tmp_path, "full", run)
    assert not ours, ours
    recs = _records(tmp_path)
    mul_in = recs["Tensor_mul_0_forward_input.0"]
    assert mul_in[3] == "torch.float32" and mul_in[4] == [3] and mul_in[5][:3] == [3.0, 1.0, 2.0]
    mul_out = recs["Tensor_mul_0_forward_output.0"]
    assert mul_out[5][:3] == [9.0, 1.0, 14.0 / 3]
    sin_out = recs["Torch_sin_0_forward_output.0"]
    assert sin_out[4] == [2, 3]  # both lanes
    assert sin_out[5][0] == pytest.approx(torch.sin(torch.stack([xs, 2 * xs])).max().item())


def test_torch_autograd_grad_is_not_aliased(tmp_path):
    """``torch.autograd.grad(y, x)`` between start() and stop() raised "The differentiated Tensor
    at index 0 appears to not have been used in the graph" (capture recorded it as an API and passed
    aliases of x, which the graph never saw). It is autograd's driver, not an API: not recorded,
    untouched; the calls that made y are."""
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)

    def run():
        y = (x * x).sum()
        (g,) = torch.autograd.grad(y, x, create_graph=True)
        (h,) = torch.autograd.grad(g.sum(), [x])
        return g.detach(), h

    (g, h), ours = _debugged(tmp_path, "stats", run)
    assert not ours, ours
    assert _equal(g, torch.tensor([2.0, 4.0, 6.0])) and _equal(h, torch.tensor([2.0, 2.0, 2.0]))
    recs = _records(tmp_path)
    assert "Tensor_mul_0_forward_output.0" in recs and not [k for k in recs if "_grad_" in k]


# ---------------------------------------------------------------- 4. torch.compile with inductor

def _compiled_steps(debug_dir=None):
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    cm = torch.compile(m, backend="inductor")
    x = torch.randn(5, 8)
    dbg = None
    if debug_dir is not None:
        dbg = PrecisionDebugger(dump_path=str(debug_dir), step=[0])
        dbg.configure_hook(mode="api_stack", summary_only=True)
        dbg.start()
    out = []
    try:
        for _ in range(2):
            m.zero_grad()
            loss = (cm(x) ** 2).mean() * 3
            loss.backward()
            out.append((loss.detach(), [p.grad.clone() for p in m.parameters()]))
    finally:
        if dbg is not None:
            dbg.stop()
            dbg.close()
    from torch._dynamo.utils import counters

    breaks = dict(counters["graph_break"])
    return out, breaks


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="inductor compiles C++ kernels: no C++ compiler (g++/c++) on PATH")
def test_torch_compile_inductor_is_bit_identical_and_the_debugger_is_invisible_to_dynamo(tmp_path):
    """Issue 17.4: dynamo traced into the debugger's mode (graph breaks in dump/writer.py, a
    recompile limit hit), so inductor compiled other graphs: loss and gradients differed in the 8th
    digit. Now the mode hands dynamo the bare call: no graph break, the same compiled graph, the
    same numbers bit for bit; the calls outside the compiled region are recorded."""
    pytest.importorskip("torch._inductor")
    plain, plain_breaks = _compiled_steps()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got, breaks = _compiled_steps(tmp_path)
    assert not _ours(caught), _ours(caught)
    assert not breaks and not plain_breaks, breaks
    assert _equal(plain, got)
    recs = _records(tmp_path)
    assert "Tensor_mean_0_forward_output.0" in recs and "Tensor___pow___0_backward_output.0" in recs
    assert not [k for k in recs if "linear" in k or "gelu" in k]  # the compiled region runs opaque


# ------------------------------------------------- the user's own modes and storage-less subclasses

class _FunctionLog(torch.overrides.TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


class _DispatchLog(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


def _logged_step(tmp_path, mode_cls, debug: bool):
    model, batch = em.mlp(seed=0, batch_size=4, d_in=6, hidden=8, n_classes=3)
    dbg = _debugger(tmp_path, "full") if debug else None
    log = mode_cls()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with log:
            if dbg is not None:
                dbg.start()
            loss = model.loss(batch)
            loss.backward()
            if dbg is not None:
                dbg.stop()
        if dbg is not None:
            dbg.close()
    return (loss.detach(), [p.grad for p in model.parameters()]), log.seen, _ours(caught)


def test_a_users_torch_function_mode_sees_only_the_users_calls(tmp_path):
    """A TorchFunctionMode the user entered before start() saw the debugger's own calls (the
    aliases' view_as, dim() and grad_fn reads of its bookkeeping, every statistic): 71 calls
    instead of 8 on a tiny step. Now it sees exactly the calls it sees without the debugger."""
    plain, seen_plain, _ = _logged_step(tmp_path / "plain", _FunctionLog, False)
    got, seen, ours = _logged_step(tmp_path / "dbg", _FunctionLog, True)
    assert not ours, ours
    assert _equal(plain, got)
    assert seen == seen_plain
    assert "Functional_linear_0_backward_output.1" in _records(tmp_path / "dbg")


def test_a_users_dispatch_mode_does_not_see_the_statistics(tmp_path):
    """A TorchDispatchMode the user entered saw the debugger's snapshots and statistics (clone,
    cat, sum...). Now the only extra ops it sees come from the aliases capture puts into the user's
    graph (``x.view_as(x)``, which is how an API's own share of a gradient is tapped)."""
    plain, seen_plain, _ = _logged_step(tmp_path / "plain", _DispatchLog, False)
    got, seen, ours = _logged_step(tmp_path / "dbg", _DispatchLog, True)
    assert not ours, ours
    assert _equal(plain, got)
    # the aliases' views, and the copies the autograd engine makes to pass their gradients on
    graph = {"aten.view.default", "aten.new_empty_strided.default", "aten.copy_.default"}
    assert set(seen) - set(seen_plain) <= graph, sorted(set(seen) - set(seen_plain))
    assert "Functional_linear_0_backward_output.1" in _records(tmp_path / "dbg")


class _Wrapper(torch.Tensor):
    """A wrapper subclass: no storage of its own, its value held in ``elem``."""

    @staticmethod
    def __new__(cls, elem):
        r = torch.Tensor._make_wrapper_subclass(cls, elem.shape, dtype=elem.dtype)
        r.elem = elem
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        from torch.utils._pytree import tree_map

        def un(t):
            return t.elem if isinstance(t, _Wrapper) else t

        out = func(*tree_map(un, args), **tree_map(un, kwargs or {}))
        return tree_map(lambda t: _Wrapper(t) if isinstance(t, torch.Tensor) else t, out)


def test_a_wrapper_subclass_without_storage_does_not_stop_a_full_dump(tmp_path):
    """Saving a storage-less wrapper subclass's ``.npy`` raised inside the writer, which stopped
    the whole dump ("the dump stopped: write error ..."). Now such a tensor has no file, its record
    says what could (not) be summarised, and the rest of the dump is written; the user's numbers
    are unchanged."""
    torch.manual_seed(0)
    x, w = torch.randn(2, 4), torch.randn(4, 3)

    def run():
        y = torch.tanh(_Wrapper(x) @ _Wrapper(w))
        return y.elem.clone(), torch.relu(x).sum()

    plain = run()
    got, ours = _debugged(tmp_path, "full", run)
    assert not ours, ours
    assert _equal(plain, got)
    recs = _records(tmp_path)
    rec = recs["Tensor_matmul_0_forward_input.0"]
    assert "npy" not in rec[6] and rec[6].get("note") and rec[4] == [2, 4]
    assert "npy" in recs["Torch_relu_0_forward_input.0"][6]
    with open(glob.glob(os.path.join(records.rank_dir(str(tmp_path), 0), "*manifest*"))[0]) as f:
        assert json.load(f)["complete"] is True
