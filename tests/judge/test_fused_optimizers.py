"""Fused and foreach optimizers against a per-parameter (for-loop) bench: judged, never a false alarm.

``AdamW(fused=True)`` makes its state with other constructors (``torch.zeros(())`` step counters
where the for-loop makes ``torch.tensor(0.)``), steps them with ``_foreach_add_`` and updates every
parameter in one ``_fused_adamw_`` call; ``foreach=True`` spells the update as ``_foreach_*`` calls
over lists. Inside ``Optimizer.step`` those calls on one side only are bookkeeping (constant state)
or the update spelled another way, judged by the device's own replay (the fused kernel in the
replay allowlist, its lists as data, in place on copies). Real models of ``example_models``.
"""
from __future__ import annotations

import pytest
import torch

import example_models as em
from example_models.models import forward_step
from real_dumps import dump_user_step, patched


def _optimizer(name, params, lr, spelling):
    kw = {"fused": True} if spelling == "fused" else {"foreach": spelling == "foreach"}
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, **kw)
    return torch.optim.SGD(params, lr=lr, momentum=0.9, **kw)


def _dump(path, model, opt, spelling, extra=None):
    """One training step of ``model`` with ``opt`` spelled ``spelling`` ("fused", "foreach", "loop")."""
    m, batch = em.MODELS[model](seed=0)

    def step():
        o = _optimizer(opt, [p for p in m.parameters() if p.requires_grad], 0.01, spelling)
        o.zero_grad(set_to_none=True)
        forward_step(m, batch)
        if extra is not None:
            extra(m)
        o.step()
    return dump_user_step(path, step)


def _root_causes(result):
    return [(rc.api, rc.cause.value) for rc in result.judgement.root_causes]


@pytest.mark.parametrize("model,opt,spelling", [
    ("mlp", "adamw", "fused"), ("mlp", "adamw", "foreach"), ("cnn", "adamw", "fused"),
    ("cnn", "adamw", "foreach"), ("mlp", "sgd", "fused"), ("cnn", "sgd", "foreach"),
])
def test_fused_and_foreach_against_a_for_loop_bench_pass(tmp_path, compare_pair, model, opt, spelling):
    device = _dump(tmp_path / "device", model, opt, spelling)
    bench = _dump(tmp_path / "bench", model, opt, "loop")
    r = compare_pair(device, bench)
    assert r.judgement.passed, r.judgement.text()
    assert not r.judgement.root_causes and not r.judgement.unusable
    # the fused / foreach kernels themselves were judged by replay, not passed unseen
    multi = [v for v in r.judgement.replay.verdicts if v.ctx == "optimizer" and v.family.startswith(
        ("Torch__fused_", "Torch__foreach_"))]
    assert multi and all(v.status.value == "within budget" for v in multi), [v.text() for v in multi]
    if spelling == "fused":
        assert any(v.family == f"Torch__fused_{opt}_" for v in multi)


def _faulty_fused_adamw(orig):
    """``torch._fused_adamw_`` with a wrong update below capture: the parameters moved 30 % further
    than the kernel moved them (a wrong bias correction's size). Capture sees the API only."""
    def kernel(*args, **kwargs):
        ts = tuple(t for a in args for t in (a if isinstance(a, (list, tuple)) else [a])
                   if isinstance(t, torch.Tensor))
        if torch.overrides.has_torch_function(ts):
            return torch.overrides.handle_torch_function(kernel, ts, *args, **kwargs)
        params = args[0]
        with torch._C.DisableTorchFunction(), torch.no_grad():
            before = [p.detach().clone() for p in params]
        out = orig(*args, **kwargs)
        with torch._C.DisableTorchFunction(), torch.no_grad():
            for p, b in zip(params, before):
                p.add_(0.3 * (p - b))
        return out
    kernel.__module__ = "torch"
    kernel.__name__ = kernel.__qualname__ = "_fused_adamw_"
    return kernel


def test_a_wrong_fused_adamw_kernel_is_named(tmp_path, compare_pair):
    with patched(torch, "_fused_adamw_", _faulty_fused_adamw(torch._fused_adamw_)):
        device = _dump(tmp_path / "device", "mlp", "adamw", "fused")
    bench = _dump(tmp_path / "bench", "mlp", "adamw", "loop")
    r = compare_pair(device, bench)
    assert not r.judgement.passed
    assert _root_causes(r) == [("Torch__fused_adamw__0_forward", "own error over budget")], r.judgement.text()


def test_a_state_constructor_outside_the_optimizer_is_still_reported(tmp_path, compare_pair):
    """The bookkeeping rule is narrow: ``torch.zeros(())`` on one side only, outside
    ``Optimizer.step``, stays a call on one side only (the fused update itself passes)."""
    def extra(m):
        torch.zeros(())   # the very constructor the fused AdamW makes its step counters with
    device = _dump(tmp_path / "device", "mlp", "adamw", "fused", extra)
    bench = _dump(tmp_path / "bench", "mlp", "adamw", "loop")
    r = compare_pair(device, bench)
    assert not r.judgement.passed
    assert _root_causes(r) == [("Torch_zeros_0_forward", "call on one side only")], r.judgement.text()


def test_statistics_only_the_fused_update_passes_named_as_not_judged(tmp_path, compare_pair):
    """Without a replay the one-sided fused call cannot be judged: no false alarm, and a note names it."""
    device = _dump(tmp_path / "device", "mlp", "adamw", "fused")
    bench = _dump(tmp_path / "bench", "mlp", "adamw", "loop")
    r = compare_pair(device, bench, summary_compare=True, replay_check=False)
    assert r.judgement.passed, r.judgement.text()
    assert any("Torch__fused_adamw__0_forward" in n for n in r.judgement.notes), r.judgement.notes


def test_statistics_only_a_fused_update_making_nan_is_a_root_cause(tmp_path, compare_pair):
    """Statistics judge an optimizer update for NaN/Inf: a fused update that makes NaN parameters the
    bench's update does not make fails, named, even without a replay."""
    def nan_lr(fused):
        def run(params, *a, **kw):
            kw["lr"] = float("nan")
            return fused(params, *a, **kw)
        return run

    with patched(torch, "_fused_adamw_", nan_lr(torch._fused_adamw_)):
        device = _dump(tmp_path / "device", "mlp", "adamw", "fused")
    bench = _dump(tmp_path / "bench", "mlp", "adamw", "loop")
    r = compare_pair(device, bench, summary_compare=True, replay_check=False)
    assert not r.judgement.passed
    first = r.judgement.root_causes[0]
    assert first.api == "Torch__fused_adamw__0_forward" and str(first.category) == "NaN/Inf origin", r.judgement.text()


@pytest.mark.parametrize("spelling", ["fused", "foreach"])
def test_parameters_read_after_a_fused_update_are_recorded_as_updated(tmp_path, spelling, monkeypatch):
    """torch's ``_fused_adamw_`` writes the parameters without bumping their version counters (the
    ``_foreach_*_`` kernels do bump them): a parameter read again after the step was recorded with
    the statistics and saved file of its value before the update (the cache vouched for an unchanged
    version), and the fused call's outputs looked unchanged (a false alarm x4e4 of budget on tiny
    GPT). Every record of a parameter is now its value at that moment."""
    import json
    import os

    import numpy as np

    from pytest_ptdbg.dump import writer
    from pytest_ptdbg.format import records

    # records are written (and their statistics cached) in batches: a batch ends between the
    # forward and the update, as it does in any model with a thousand records before its step
    monkeypatch.setattr(writer, "QUEUE_MAX", 4)
    torch.manual_seed(0)
    lin = torch.nn.Linear(48, 40)
    x = torch.randn(6, 48)
    opt = torch.optim.AdamW(lin.parameters(), lr=0.1, **({"fused": True} if spelling == "fused" else {"foreach": True}))
    after = {}

    def step():
        lin(x).square().mean().backward()
        opt.step()
        after["weight"] = lin.weight.detach().clone()
        lin(x)  # the updated weight read again in the same step

    dump_user_step(str(tmp_path), step)
    rank = records.rank_dir(str(tmp_path), 0)
    with open(os.path.join(rank, "api_stack_dump.pkl")) as f:
        recs = {r[0]: r for r in map(json.loads, f) if not r[0].endswith("stack_info")}
    updated = recs["Torch__fused_adamw__0_forward_output.0" if spelling == "fused" else
                   "Torch__foreach_addcdiv__0_forward_output.0"]
    assert updated[5][0] == pytest.approx(float(after["weight"].double().max()), rel=1e-7)
    second = recs["Functional_linear_1_forward_input.1"]
    w = after["weight"].double()
    assert second[5][0] == pytest.approx(float(w.max()), rel=1e-7)
    assert second[5][3] == pytest.approx(float(w.norm()), rel=1e-7)
    saved = np.load(os.path.join(rank, "api_stack_dump", second[6]["npy"]))
    assert np.array_equal(saved, after["weight"].numpy())
    first = recs["Functional_linear_0_forward_input.1"]
    assert first[5][0] != second[5][0]  # the update did change it


def test_gradients_read_after_gradscaler_unscales_them_are_recorded_as_unscaled(tmp_path, monkeypatch):
    """``_amp_foreach_non_finite_check_and_unscale_`` (GradScaler.unscale_) divides the gradients in
    place without a version bump: a gradient read after it is recorded unscaled."""
    import json
    import os

    from pytest_ptdbg.dump import writer
    from pytest_ptdbg.format import records

    monkeypatch.setattr(writer, "QUEUE_MAX", 4)
    g = torch.linspace(-4.0, 4.0, 1024)  # large enough for the statistics cache

    def step():
        g.mul(1.0)  # recorded (and, after its batch, cached) at scale 4
        torch.tanh(torch.ones(3))
        torch._amp_foreach_non_finite_check_and_unscale_([g], torch.zeros(1), torch.full((1,), 0.25))
        g.mul(1.0)

    dump_user_step(str(tmp_path), step)
    with open(os.path.join(records.rank_dir(str(tmp_path), 0), "api_stack_dump.pkl")) as f:
        recs = {r[0]: r for r in map(json.loads, f) if not r[0].endswith("stack_info")}
    assert recs["Tensor_mul_0_forward_input.0"][5][0] == 4.0
    assert recs["Tensor_mul_1_forward_input.0"][5][0] == 1.0


def test_statistics_only_a_fused_update_fed_nan_is_no_origin_of_it(tmp_path, compare_pair):
    """A fused update whose inputs are already NaN (a gradient poisoned before the step, on the
    device side only) passes the NaN on: the step fails, named by the call that made it, and the
    update is not called a NaN/Inf origin of its own."""
    def poison(m):
        with torch.no_grad():
            next(iter(m.parameters())).grad.view(-1)[0] = float("nan")

    device = _dump(tmp_path / "device", "mlp", "adamw", "fused", extra=poison)
    bench = _dump(tmp_path / "bench", "mlp", "adamw", "loop")
    r = compare_pair(device, bench, summary_compare=True, replay_check=False)
    assert not r.judgement.passed
    causes = _root_causes(r)
    assert causes and not causes[0][0].startswith("Torch__fused_adamw_"), r.judgement.text()
    assert not any(api.startswith("Torch__fused_adamw_") for api, _ in causes), r.judgement.text()


def test_statistics_only_a_fused_update_fed_nan_unseen_is_still_the_origin(tmp_path, compare_pair):
    """Never a false pass: a gradient made NaN where capture does not see it (through numpy, on
    the device side only) reaches the fused update with nothing recorded before it to blame; the
    update, where the NaN first shows, is the root cause."""
    def poison_unseen(m):
        next(iter(m.parameters())).grad.detach().numpy().reshape(-1)[0] = float("nan")

    device = _dump(tmp_path / "device", "mlp", "adamw", "fused", extra=poison_unseen)
    bench = _dump(tmp_path / "bench", "mlp", "adamw", "loop")
    r = compare_pair(device, bench, summary_compare=True, replay_check=False)
    assert not r.judgement.passed, r.judgement.text()
    assert _root_causes(r)[0] == ("Torch__fused_adamw__0_forward", "NaN/Inf origin"), r.judgement.text()
