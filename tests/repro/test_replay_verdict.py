"""``ptdbg replay PACKAGE`` judges a call as compare's judgement judges it: its own error within its
budget, by the same replay engine, with the same numbers."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from real_dumps import dump_user_step, kernel_times, patched
from pytest_ptdbg.cli import replay as replay_cli
from pytest_ptdbg.dump import reader
from pytest_ptdbg.format import records
from pytest_ptdbg.judge import judge_dump
from pytest_ptdbg.repro.package import write_package
from pytest_ptdbg.repro.runner import replay
from pytest_ptdbg.repro.script import write_script


def _linear_times(k: float):
    """F.linear scaling its output by ``k`` inside the kernel (capture sees linear only)."""
    return kernel_times(k, "torch.nn.functional")(torch.nn.functional.linear)


@pytest.fixture(scope="module")
def step(tmp_path_factory):
    """One forward/backward of a linear layer whose kernel is off by 2e-6 relative: within the
    dtype rule's tolerances, over the judgement's budget (what any correct float32 kernel of a
    32-term contraction stays within, in any summation order: 5e-7 no longer exceeds it)."""
    root = tmp_path_factory.mktemp("lin")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 32, generator=g)
    lin = torch.nn.Linear(32, 24)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(24, 32, generator=g) * 0.2)
        lin.bias.copy_(torch.randn(24, generator=g))

    def run():
        torch.relu(lin(x)).sum().backward()

    with patched(torch.nn.functional, "linear", _linear_times(1 + 2e-6)):
        dump_user_step(root, run)
    rank = records.rank_dir(str(root))
    return rank, reader.read_dump(rank), judge_dump(rank)


def _package(dump, key: str, out: str) -> str:
    """The dump's record of ``key`` (forward, and its backward) as a reproduction package."""
    by_key = {a.key: a for a in dump.apis}
    fwd = by_key[key.replace("_backward", "_forward")]
    tensors, rg, spec = {}, {}, None
    for t in fwd.tensors:
        tensors[t.slot] = (np.load(t.data_file, allow_pickle=False), t.dtype)
        rg[t.slot] = bool(t.extra.get("rg"))
        spec = spec or t.extra.get("call")
    if key.endswith("_backward"):
        for t in by_key[key].tensors:
            tensors["backward_" + t.slot] = (np.load(t.data_file, allow_pickle=False), t.dtype)
            if t.io == "output":  # a produced gradient: its input required grad
                rg["input." + t.index_str] = True
    return write_package(out, key, spec, tensors, rg).path


@pytest.mark.parametrize("key", ["Functional_linear_0_forward", "Functional_linear_0_backward",
                                 "Torch_relu_0_forward"])
def test_replay_gives_the_judgements_verdict_of_that_call(step, tmp_path, key):
    _, dump, judgement = step
    (want,) = [v for v in judgement.verdicts if v.api == key]
    res = replay(_package(dump, key, str(tmp_path / "pkg")))
    assert res.verdict is not None and res.by_budget
    assert res.verdict.status == want.status
    assert res.verdict.own_error == pytest.approx(want.own_error, rel=1e-12)
    assert res.verdict.budget == pytest.approx(want.budget, rel=1e-12)
    assert res.passed == (str(want.status) == "within budget")


def test_a_kernel_off_by_less_than_the_dtype_tolerance_fails_by_its_budget(step, tmp_path, capsys):
    # the per-tensor dtype rule passes it (identical inputs, error below assert_close's rtol); the
    # judgement's budget does not, and ptdbg replay now says so, as compare does
    _, dump, judgement = step
    (want,) = [v for v in judgement.verdicts if v.api == "Functional_linear_0_forward"]
    assert str(want.status) == "root cause", judgement.text()
    pkg = _package(dump, "Functional_linear_0_forward", str(tmp_path / "pkg"))
    assert replay(pkg, rule="dtype").passed  # the per-tensor rule, still there on request
    assert replay_cli.main([pkg]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "root cause: own error" in out and "budget" in out
    assert replay_cli.main([pkg, "--rule", "dtype"]) == 0


def test_script_prints_the_judgements_own_error_and_budget(step, tmp_path):
    _, dump, judgement = step
    (want,) = [v for v in judgement.verdicts if v.api == "Functional_linear_0_forward"]
    pkg = _package(dump, "Functional_linear_0_forward", str(tmp_path / "pkg"))
    script = write_script(pkg, str(tmp_path / "repro.py"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, script], capture_output=True, text=True, cwd=str(tmp_path), env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("  output.0: own error")]
    own = float(line.split("own error ")[1].split(",")[0])
    budget = float(line.split("budget ")[1].split(" ")[0])
    assert "ROOT CAUSE" in line and proc.stdout.rstrip().endswith("ROOT CAUSE: over budget")
    assert own == pytest.approx(want.own_error, rel=1e-2) and budget == pytest.approx(want.budget, rel=1e-2)
