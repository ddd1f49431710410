"""Reproduction packages, replay, the standalone script and ``ptdbg replay`` on real torch calls."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pytest_ptdbg.cli import replay as replay_cli
from pytest_ptdbg.replayer.codec import encode_call
from pytest_ptdbg.repro.package import load_package, package_call, write_package
from pytest_ptdbg.repro.runner import ReplayError, replay, run_package
from pytest_ptdbg.repro.script import write_script


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def conv_forward(tmp_path):
    g = _gen()
    x, w, b = torch.randn(2, 3, 8, 8, generator=g), torch.randn(4, 3, 3, 3, generator=g), torch.randn(4, generator=g)
    out = F.conv2d(x, w, b, stride=1, padding=1)
    return package_call(str(tmp_path / "conv_fwd"), "Functional_conv2d_0_forward", (x, w, b),
                        {"stride": 1, "padding": (1, 1)}, out)


@pytest.fixture
def conv_backward(tmp_path):
    g = _gen(1)
    x = torch.randn(2, 3, 8, 8, generator=g, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, generator=g, requires_grad=True)
    b = torch.randn(4, generator=g)
    out = F.conv2d(x, w, b, padding=1)
    grad = torch.randn(out.shape, generator=g)
    gx, gw = torch.autograd.grad(out, (x, w), grad)
    return package_call(str(tmp_path / "conv_bwd"), "Functional_conv2d_1_backward", (x, w, b), {"padding": 1},
                        out, backward_input={"0": grad}, backward_output={"0": gx, "1": gw})


def test_forward_package_layout_and_identical_replay(conv_forward):
    doc = json.load(open(os.path.join(conv_forward.path, "package.json")))
    assert doc["api"] == "Functional_conv2d_0_forward" and doc["direction"] == "forward"
    assert doc["call"]["args"] == [{"t": "input.0"}, {"t": "input.1"}, {"t": "input.2"}]
    assert doc["call"]["kwargs"] == {"stride": 1, "padding": {"tuple": [1, 1]}}
    assert sorted(doc["tensors"]) == ["input.0", "input.1", "input.2", "output.0"]
    assert doc["tensors"]["input.1"]["shape"] == [4, 3, 3, 3]
    # plain .npy, no pickle
    arr = np.load(os.path.join(conv_forward.path, "input.0.npy"), allow_pickle=False)
    assert arr.dtype == np.float32
    res = replay(conv_forward.path)
    assert res.identical and res.passed
    assert [c.key for c in res.checks] == ["output.0"]


def test_float64_oracle_differs_slightly_but_passes(conv_forward):
    res = replay(conv_forward.path, dtype="float64")
    c = res.checks[0]
    assert c.replay_dtype == "torch.float64"
    assert 0 < c.max_abs_err < 1e-4 and res.passed and not res.identical


def test_backward_package_replays_gradients(conv_backward):
    pkg = load_package(conv_backward.path)
    assert pkg.expected_keys == ["backward_output.0", "backward_output.1"]
    assert pkg.tensors["input.0"].requires_grad and not pkg.tensors["input.2"].requires_grad
    res = replay(conv_backward.path)
    assert res.identical, res.text()
    # a wrong incoming gradient gives different produced gradients: replay really uses it
    g = np.load(os.path.join(conv_backward.path, "backward_input.0.npy"))
    np.save(os.path.join(conv_backward.path, "backward_input.0.npy"), g * 1.5)
    res = replay(conv_backward.path)
    assert not res.passed and res.checks[0].max_abs_err > 0.1


@pytest.mark.parametrize("name,call", [
    ("Torch_cat_0_forward", lambda a, b: (torch.cat, (([a, b],), {"dim": 1}))),
    ("Functional_softmax_0_forward", lambda a, b: (F.softmax, ((a,), {"dim": -1, "dtype": torch.float64}))),
    ("Tensor___getitem___0_forward", lambda a, b: (torch.Tensor.__getitem__, ((a, (slice(0, 2), Ellipsis, None)), {}))),
    ("Torch_clamp_0_forward", lambda a, b: (torch.clamp, ((a,), {"min": float("-inf"), "max": 0.5}))),
    ("Torch_sum_0_forward", lambda a, b: (torch.sum, ((a,), {"dim": (0, 1), "keepdim": True}))),
    ("Tensor_reshape_0_forward", lambda a, b: (torch.Tensor.reshape, ((a, torch.Size([3, 8])), {}))),
    ("Tensor_to_0_forward", lambda a, b: (torch.Tensor.to, ((a, torch.device("cpu"), torch.float16), {}))),
    ("Torch_max_0_forward", lambda a, b: (torch.max, ((a,), {"dim": 1}))),
    ("Functional_layer_norm_0_forward", lambda a, b: (F.layer_norm, ((a, [6], b[0], None, 1e-5), {}))),
])
def test_non_tensor_and_keyword_arguments(tmp_path, name, call):
    g = _gen(2)
    a, b = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    func, (args, kwargs) = call(a, b)
    out = func(*args, **kwargs)
    pkg = package_call(str(tmp_path / name), name, args, kwargs, out)
    res = replay(pkg.path)
    assert res.identical, res.text()
    assert len(res.checks) == (2 if name == "Torch_max_0_forward" else 1)  # values and indices


def test_inplace_api_forward_and_backward(tmp_path):
    g = _gen(3)
    x, y = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g)
    before = x.clone()
    out = x.add_(y, alpha=2.0)  # the caller's x is now changed: the package holds the value before
    pkg = package_call(str(tmp_path / "add_"), "Tensor_add__0_forward", (before, y), {"alpha": 2.0}, out)
    assert np.array_equal(np.load(os.path.join(pkg.path, "input.0.npy")), before.numpy())
    assert replay(pkg.path).identical
    # backward of an in-place op on an input that requires grad: the replay must not touch the leaf
    h = torch.randn(5, 4, generator=g, requires_grad=True)
    h0 = h.detach().clone()
    z = h * 1.0
    out = F.relu(z, inplace=True)
    grad = torch.randn(5, 4, generator=g)
    (gh,) = torch.autograd.grad(out, h, grad)
    pkg = package_call(str(tmp_path / "relu_"), "Functional_relu_0_backward", (h0,), {"inplace": True}, out,
                       backward_input={"0": grad}, backward_output={"0": gh}, requires_grad={"input.0": True})
    assert replay(pkg.path).identical


def test_setitem_compares_the_tensor_it_changed(tmp_path):
    g = _gen(6)
    x, v = torch.randn(4, 3, generator=g), torch.randn(2, 3, generator=g)
    before = x.clone()
    x[1:3] = v  # Tensor.__setitem__ returns None: its result is the changed x
    pkg = package_call(str(tmp_path / "setitem"), "Tensor___setitem___0_forward",
                       (before, (slice(1, 3, None),), v), {}, x)
    res = replay(pkg.path)
    assert res.identical and [c.key for c in res.checks] == ["output.0"]
    np.save(os.path.join(pkg.path, "output.0.npy"), before.numpy())  # as if the write was lost
    assert not replay(pkg.path).passed


def test_planted_imprecise_api_is_flagged(tmp_path):
    """A 'kernel' that computes softmax in bfloat16 and gives back float32: replaying the real API
    on the same inputs exposes it, while an exact one replays bit for bit."""
    g = _gen(4)
    x = torch.randn(8, 32, generator=g) * 3
    exact = F.softmax(x, dim=-1)
    sloppy = F.softmax(x.to(torch.bfloat16), dim=-1).to(torch.float32)
    good = package_call(str(tmp_path / "good"), "Functional_softmax_0_forward", (x,), {"dim": -1}, exact)
    bad = package_call(str(tmp_path / "bad"), "Functional_softmax_0_forward", (x,), {"dim": -1}, sloppy)
    assert replay(good.path).identical
    res = replay(bad.path)
    assert not res.passed and res.checks[0].max_rel_err > 1e-3
    assert "FAILED" in res.text()


def test_bf16_tensors_round_trip(tmp_path):
    g = _gen(5)
    x = torch.randn(4, 8, generator=g).to(torch.bfloat16)
    w = torch.randn(3, 8, generator=g).to(torch.bfloat16)
    out = F.linear(x, w)
    pkg = package_call(str(tmp_path / "lin"), "Functional_linear_0_forward", (x, w), {}, out)
    assert pkg.tensors["output.0"].dtype == "torch.bfloat16"
    (t,) = [v for k, v in run_package(pkg).items() if k == "output.0"]
    assert t.dtype == torch.bfloat16
    assert replay(pkg.path).identical


def test_script_is_standalone_and_reproduces(conv_backward, tmp_path):
    out = write_script(conv_backward.path, str(tmp_path / "repro.py"))
    text = open(out).read()
    assert "torch.nn.functional.conv2d(input_0, input_1, input_2, padding=1)" in text
    assert "pytest_ptdbg" not in text.replace("Written by pytest-ptdbg", "")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, out, "--dtype", "float64"], capture_output=True, text=True,
                          cwd=str(tmp_path), env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = [l.split() for l in proc.stdout.splitlines() if l.startswith("backward_output")]
    assert [r[0] for r in rows] == ["backward_output.0", "backward_output.1"]
    assert all(float(r[1]) > 0.9999 and 0 < float(r[2]) < 1e-4 for r in rows)


def test_cli_replay_and_script(conv_forward, tmp_path, capsys):
    assert replay_cli.main([conv_forward.path]) == 0
    assert "identical" in capsys.readouterr().out
    assert replay_cli.main([conv_forward.path, "--dtype", "float64", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["dtype"] == "float64" and doc["checks"][0]["key"] == "output.0"
    script = str(tmp_path / "s.py")
    assert replay_cli.main([conv_forward.path, "--script", script]) == 0
    assert os.path.exists(script)
    assert replay_cli.main([str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err
    assert replay_cli.main([conv_forward.path, "--dtype", "int8"]) == 2
    assert replay_cli.main([conv_forward.path, "--device", "tpu"]) == 2
    assert "unknown device" in capsys.readouterr().err


def test_ptdbg_console_command(conv_forward, capsys):
    from pytest_ptdbg.cli import main

    assert main(["replay", conv_forward.path, "--device", "cpu", "--dtype", "float64"]) == 0
    out = capsys.readouterr().out
    assert "Functional_conv2d_0_forward on cpu in float64: PASSED" in out


def test_bad_packages_give_clear_errors(conv_forward, tmp_path):
    os.remove(os.path.join(conv_forward.path, "input.1.npy"))
    with pytest.raises(FileNotFoundError, match="input.1"):
        replay(conv_forward.path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="package.json is missing"):
        replay(str(tmp_path / "empty"))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "package.json").write_text(json.dumps({"format": "ptdbg-replay-package", "version": 1,
                                                  "api": "Functional_relu_0_forward", "tensors": {}}))
    with pytest.raises(ValueError, match="missing field 'call'"):
        replay(str(bad))
    (bad / "package.json").write_text(json.dumps({
        "format": "ptdbg-replay-package", "version": 1, "api": "Functional_relu_0_forward",
        "call": {"args": [{"t": "input.0"}], "kwargs": {}},
        "tensors": {"input.0": {"file": "../../etc/passwd.npy", "dtype": "torch.float32", "shape": [1]}}}))
    with pytest.raises(ValueError, match="unsafe|outside"):
        replay(str(bad))
    # an argument saved only as text cannot be replayed: say which
    x = torch.ones(3)
    pkg = write_package(str(tmp_path / "repr"), "Torch_relu_0_forward",
                        {"args": [{"t": "input.0"}], "kwargs": {"weird": {"repr": "<object>"}}},
                        {"input.0": x, "output.0": x})
    with pytest.raises(ReplayError, match="<object>"):
        replay(pkg.path)
    with pytest.raises(ReplayError, match="collective"):
        write_package(str(tmp_path / "dist"), "Distributed_all_reduce_0_forward",
                      encode_call((x,), {}), {"input.0": x})
        replay(str(tmp_path / "dist"))


def test_public_export():
    import pytest_ptdbg

    assert callable(pytest_ptdbg.replay)
    from pytest_ptdbg import replay as exported

    assert callable(exported)
