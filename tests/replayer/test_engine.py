"""The one replay engine: the judgement and ``ptdbg replay`` run a call by the same rules."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from pytest_ptdbg.repro.package import package_call
from pytest_ptdbg.repro.runner import run_package


def _linear_package(path):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(4, 8, generator=g), torch.randn(3, 8, generator=g)
    return package_call(str(path), "Functional_linear_0_forward", (x, w), {}, F.linear(x, w))


def test_package_replay_runs_with_autocast_off_as_the_judgement(tmp_path):
    # the sinks re-run a package from inside the user's step; a user's autocast must not change the
    # replay (the engine's one autocast rule: off, as the judgement's oracle and reference run)
    pkg = _linear_package(tmp_path / "lin")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = run_package(pkg)["output.0"]
    assert out.dtype == torch.float32
    assert torch.equal(out, torch.from_numpy(pkg.load_array("output.0")))


def test_backward_package_of_an_inplace_call_leaves_its_leaf_intact(tmp_path):
    # one leaf rule: the leaves go to the call as they are, and an in-place call that autograd
    # refuses on a leaf runs again on copies; the gradient is the leaf's
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, generator=g, requires_grad=True)
    y = torch.randn(5, generator=g)
    out = x.clone().mul_(y)
    grad = torch.randn(5, generator=g)
    (gx,) = torch.autograd.grad(out, (x,), grad)
    pkg = package_call(str(tmp_path / "mul_"), "Tensor_mul__0_backward", (x.detach().requires_grad_(True), y), {},
                       out, backward_input={"0": grad}, backward_output={"0": gx})
    got = run_package(pkg)
    assert torch.equal(got["backward_output.0"], gx)
