"""mode="acl": one API of a real training step saved as a reproduction package and re-run alone."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from example_models.models import cnn, mlp, tiny_gpt, train_step
from pytest_ptdbg import PrecisionDebugger
from pytest_ptdbg.judge import replay
from pytest_ptdbg.sinks.acl import load_acl_config
from pytest_ptdbg.repro.package import load_package
from pytest_ptdbg.format import records


def _acl_config(d, dump_path="acl_out", **over):
    body = {"dump_list": [], "dump_path": None if dump_path is None else str(dump_path), "dump_mode": "all", "dump_op_switch": "on"}
    body.update(over)
    body = {k: v for k, v in body.items() if v is not None}
    path = os.path.join(str(d), "dump.json")
    with open(path, "w") as fh:
        json.dump({"dump": body}, fh)
    return path


def _packages(root):
    return sorted(os.path.relpath(r, root) for r, _, files in os.walk(root) if "package.json" in files)


def _run_acl(tmp_path, factory, scope, backward_input=None, name="acl"):
    cfg = _acl_config(tmp_path / name) if (tmp_path / name).mkdir() is None else None
    model, batch = factory()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / name / "dump"), hook_name="dump", step=[0])
    dbg.configure_hook(mode="acl", scope=[scope], acl_config=cfg, backward_input=backward_input)
    dbg.start()
    train_step(model, batch)
    dbg.stop()
    dbg.close()
    return str(tmp_path / name / "acl_out")


@pytest.fixture(scope="module")
def mlp_dump(tmp_path_factory):
    """A full-tensor dump of one MLP training step (the source of backward_input files)."""
    root = tmp_path_factory.mktemp("mlp_dump")
    model, batch = mlp()
    dbg = PrecisionDebugger(dump_path=str(root), hook_name="dump", step=[0])
    dbg.start()
    train_step(model, batch)
    dbg.stop()
    dbg.close()
    return records.data_path(str(root))


def test_nested_api_is_captured_once(tmp_path):
    """F.batch_norm calls torch.batch_norm: one package, of the outer API, with its inputs before
    the call (batch_norm updates its running statistics in place)."""
    out = _run_acl(tmp_path, cnn, "Functional_batch_norm_0_forward")
    assert _packages(out) == [os.path.join("step0", "rank0", "Functional_batch_norm_0_forward")]
    pkg = load_package(os.path.join(out, "step0", "rank0", "Functional_batch_norm_0_forward"))
    assert pkg.api == "Functional_batch_norm_0_forward"
    assert pkg.meta["reason"] == "acl" and any(f[0].endswith("models.py") for f in pkg.stack)
    assert np.all(pkg.load_array("input.1") == 0), "running_mean must be saved before the in-place update"
    assert np.all(pkg.load_array("input.2") == 1)
    rerun = json.load(open(os.path.join(pkg.path, "rerun.json")))
    assert rerun["result"]["identical"] and rerun["kernel_dump"] is False
    assert replay(pkg.path).identical


def test_forward_scope_replays_identically(tmp_path):
    out = _run_acl(tmp_path, mlp, "Functional_linear_1_forward")
    (rel,) = _packages(out)
    res = replay(os.path.join(out, rel))
    assert res.identical and res.api == "Functional_linear_1_forward"


def test_inplace_optimizer_update(tmp_path):
    """The SGD step's first in-place update: the package holds the parameter before the update."""
    model, _ = mlp()
    first_param = next(model.parameters()).detach().clone()
    out = _run_acl(tmp_path, mlp, "Tensor_add__0_forward")
    (rel,) = _packages(out)
    pkg = load_package(os.path.join(out, rel))
    assert pkg.meta.get("ctx") == "optimizer"
    assert np.array_equal(pkg.load_array("input.0"), first_param.numpy())
    assert not np.array_equal(pkg.load_array("output.0"), first_param.numpy())
    assert replay(pkg.path).identical


def test_random_api_replays_the_same_draws(tmp_path):
    """Dropout draws from the generator: the package keeps its state from before the call."""
    out = _run_acl(tmp_path, tiny_gpt, "Functional_dropout_0_forward")
    (rel,) = _packages(out)
    pkg = load_package(os.path.join(out, rel))
    assert pkg.rng == {"device": "cpu", "file": "rng_state.npy"}
    before = torch.get_rng_state()
    assert replay(pkg.path).identical
    assert torch.equal(torch.get_rng_state(), before)  # the caller's generator is left alone


def test_backward_scope_with_backward_input(tmp_path, mlp_dump):
    grad_file = os.path.join(mlp_dump, "Functional_linear_1_backward_input.0.npy")
    out = _run_acl(tmp_path, mlp, "Functional_linear_1_backward", backward_input=[grad_file])
    (rel,) = _packages(out)
    pkg = load_package(os.path.join(out, rel))
    assert pkg.api == "Functional_linear_1_backward"
    assert np.array_equal(pkg.load_array("backward_input.0"), np.load(grad_file))
    # the re-run's gradients are those the whole-network dump recorded for this API
    for j in (0, 1, 2):
        dumped = np.load(os.path.join(mlp_dump, f"Functional_linear_1_backward_output.{j}.npy"))
        np.testing.assert_allclose(pkg.load_array(f"backward_output.{j}"), dumped, rtol=1e-5, atol=1e-6)
    assert replay(pkg.path).identical


def test_bad_acl_config_messages(tmp_path):
    with pytest.raises(FileNotFoundError, match="file not found"):
        load_acl_config(str(tmp_path / "nope.json"))
    (tmp_path / "a").mkdir()
    with pytest.raises(ValueError, match="missing field 'dump.dump_path'"):
        load_acl_config(_acl_config(tmp_path / "a", dump_path=None))
    with pytest.raises(ValueError, match="missing fields 'dump.dump_mode', 'dump.dump_op_switch'"):
        load_acl_config(_acl_config(tmp_path / "a", dump_mode=None, dump_op_switch=None))
    with pytest.raises(ValueError, match="'dump.dump_mode' is 'everything'; allowed: input, output, all"):
        load_acl_config(_acl_config(tmp_path / "a", dump_mode="everything"))
    with pytest.raises(ValueError, match="'dump.dump_list' must be a list"):
        load_acl_config(_acl_config(tmp_path / "a", dump_list="x"))
    (tmp_path / "a" / "dump.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_acl_config(str(tmp_path / "a" / "dump.json"))
    cfg = load_acl_config(_acl_config(tmp_path / "a", dump_path="rel/out"))
    assert cfg.dump_path == str(tmp_path / "a" / "rel" / "out") and os.path.isdir(cfg.dump_path)
    # through the debugger: the error comes at start(), before anything runs
    model, batch = mlp()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), step=[0])
    dbg.configure_hook(mode="acl", scope=["Functional_linear_0_forward"],
                       acl_config=_acl_config(tmp_path / "a", dump_op_switch="maybe"))
    with pytest.raises(ValueError, match="dump_op_switch"):
        dbg.start()


def test_bad_scope_and_backward_input(tmp_path, capsys):
    cfg = _acl_config(tmp_path)
    for scope, msg in (("linear", "not an API name"),
                       ("Functional_linear_0_forward_input.0", "names a tensor")):
        dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), step=[0])
        dbg.configure_hook(mode="acl", scope=[scope], acl_config=cfg)
        with pytest.raises(ValueError, match=msg):
            dbg.start()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), step=[0])
    dbg.configure_hook(mode="acl", scope=["Functional_linear_0_backward"], acl_config=cfg,
                       backward_input=[str(tmp_path / "missing_backward_input.0.npy")])
    with pytest.raises(FileNotFoundError, match=r"backward_input\[0\] .*missing_backward_input.0.npy: file not found"):
        dbg.start()
    # a gradient of the wrong shape is named with the API and both shapes
    np.save(str(tmp_path / "g.npy"), np.ones((2, 2), dtype=np.float32))
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d2"), step=[0])
    dbg.configure_hook(mode="acl", scope=["Functional_linear_0_backward"], acl_config=cfg,
                       backward_input=[str(tmp_path / "g.npy")])
    model, batch = mlp()
    dbg.start()
    with pytest.raises(ValueError, match=r"Functional_linear_0_backward: backward_input for output 0 has shape \[2, 2\]"):
        train_step(model, batch)
    dbg.stop()
    # a scope that is never called: nothing saved, and the user is told
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d3"), step=[0])
    dbg.configure_hook(mode="acl", scope=["Functional_conv2d_0_forward"], acl_config=cfg)
    dbg.start()
    train_step(model, batch)
    dbg.stop()
    dbg.close()
    assert "Functional_conv2d_0_forward was not called" in capsys.readouterr().err
