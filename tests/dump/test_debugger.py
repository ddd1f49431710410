"""PrecisionDebugger on real models: modes and options, steps and segments, unchanged numbers,
bad configuration messages."""
import json
import os

import pytest
import torch

from example_models import cnn, lstm, mlp, tiny_gpt, train_step
from pytest_ptdbg import PrecisionDebugger, seed_all
from pytest_ptdbg.format import records


def read_pkl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def api_keys(recs, direction=None):
    """API keys of the tensor records, in order of first appearance."""
    out = []
    for r in recs:
        if records.is_stack_record(r):
            continue
        p = records.parse_name(r[0])
        if (direction is None or p.direction == direction) and p.api_key not in out:
            out.append(p.api_key)
    return out


def run_mlp(tmp_path, name="d", steps=(0,), **hook):
    model, batch = mlp(seed=0)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / name), step=list(steps))
    dbg.configure_hook(**hook)
    with dbg:
        train_step(model, batch)
    dbg.close()
    mode = hook.get("mode", "api_stack")
    rank_dir = records.rank_dir(str(tmp_path / name), 0, 0)
    return rank_dir, os.path.join(rank_dir, records.pkl_name(mode)), os.path.join(rank_dir, records.data_dir_name(mode))


@pytest.fixture(scope="module")
def full_dump(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("full")
    rank_dir, pkl, data = run_mlp(tmp)
    return read_pkl(pkl), data


def test_api_stack_layout_records_and_files(full_dump):
    recs, data = full_dump
    stacks = [r for r in recs if records.is_stack_record(r)]
    tensors = [r for r in recs if not records.is_stack_record(r)]
    assert tensors and stacks
    fwd = api_keys(recs, "forward")
    # one stack record per API and direction, each after a tensor record of that API
    assert {records.parse_name(s[0][: -len(records.STACK_SUFFIX)]).api_key for s in stacks} >= set(fwd)
    for r in tensors:
        name, zero, empty, dtype, shape, stats, extra = r
        assert zero == 0 and empty == [] and isinstance(shape, list)
        assert "nan" in extra and "inf" in extra
        if dtype.startswith("torch."):
            assert os.path.isfile(os.path.join(data, extra["npy"])), name
    # the call spec sits on each API's first forward record
    firsts = {}
    for r in tensors:
        p = records.parse_name(r[0])
        if p.direction == "forward":
            firsts.setdefault(p.api_key, r)
    assert all("call" in r[6] for r in firsts.values())
    # frames name this test's model code
    assert any("models.py" in fr[0] for s in stacks for fr in s[1])


def test_optimizer_calls_carry_ctx(full_dump):
    recs, _ = full_dump
    opt = [r for r in recs if not records.is_stack_record(r) and r[6].get("ctx") == "optimizer"]
    assert opt and all(records.parse_name(r[0]).api_name == "add_" for r in opt)
    model_recs = [r for r in recs if not records.is_stack_record(r) and "linear" in r[0]]
    assert all("ctx" not in r[6] for r in model_recs)


def test_npy_holds_the_tensor(full_dump):
    import numpy as np

    recs, data = full_dump
    for r in recs[:40]:
        if records.is_stack_record(r) or "npy" not in r[6]:
            continue
        arr = np.load(os.path.join(data, r[6]["npy"]), allow_pickle=False)
        assert list(arr.shape) == r[4]
        if arr.size and arr.dtype.kind == "f":
            assert float(arr.max()) == pytest.approx(r[5][0], rel=1e-6)
            assert float(arr.min()) == pytest.approx(r[5][1], rel=1e-6)


def test_mode_all_has_no_stack(tmp_path):
    _, pkl, _ = run_mlp(tmp_path, mode="all", summary_only=True)
    recs = read_pkl(pkl)
    assert recs and not any(records.is_stack_record(r) for r in recs)
    assert os.path.basename(pkl) == "all_dump.pkl"


def test_mode_stack_has_only_stacks(tmp_path):
    rank_dir, pkl, data = run_mlp(tmp_path, mode="stack")
    recs = read_pkl(pkl)
    assert recs and all(records.is_stack_record(r) for r in recs)
    assert not os.path.exists(data)


def test_summary_only_writes_no_npy(tmp_path):
    rank_dir, pkl, data = run_mlp(tmp_path, summary_only=True)
    recs = read_pkl(pkl)
    assert recs and not os.path.exists(data)
    assert not any("npy" in r[6] for r in recs if not records.is_stack_record(r))


def test_mode_list(tmp_path):
    _, pkl, _ = run_mlp(tmp_path, mode="list", scope=["Functional_linear_1_forward", "Torch_relu_0"],
                        summary_only=True)
    keys = api_keys(read_pkl(pkl))
    assert set(keys) == {"Functional_linear_1_forward", "Torch_relu_0_forward", "Torch_relu_0_backward"}


def test_mode_range(tmp_path):
    _, pkl, _ = run_mlp(tmp_path, mode="range", scope=["Functional_gelu_0_forward", "Torch_relu_0_forward"],
                        summary_only=True)
    keys = api_keys(read_pkl(pkl), "forward")
    assert keys == ["Functional_gelu_0_forward", "Functional_linear_1_forward", "Torch_relu_0_forward"]


def test_mode_api_list(tmp_path):
    _, pkl, _ = run_mlp(tmp_path, mode="api_list", api_list=["LINEAR"], summary_only=True)
    keys = api_keys(read_pkl(pkl))
    assert keys and all("linear" in k for k in keys)
    assert len([k for k in keys if k.endswith("forward")]) == 3


@pytest.mark.parametrize("io, kept", [
    (["forward"], {("forward", "input"), ("forward", "output")}),
    (["backward"], {("backward", "input"), ("backward", "output")}),
    (["input"], {("forward", "input"), ("backward", "input")}),
    (["output"], {("forward", "output"), ("backward", "output")}),
])
def test_input_output_mode(tmp_path, io, kept):
    _, pkl, _ = run_mlp(tmp_path, input_output_mode=io, summary_only=True)
    seen = {(p.direction, p.io) for p in (records.parse_name(r[0]) for r in read_pkl(pkl)
                                          if not records.is_stack_record(r))}
    assert seen == kept


def test_filter_switch_on_skips_ints_scalars_and_0d(tmp_path):
    _, pkl, _ = run_mlp(tmp_path, filter_switch="ON", summary_only=True)
    recs = [r for r in read_pkl(pkl) if not records.is_stack_record(r)]
    assert recs
    assert all(r[3] in ("torch.float32",) and len(r[4]) > 0 for r in recs)
    _, pkl2, _ = run_mlp(tmp_path, name="off", filter_switch="OFF", summary_only=True)
    recs2 = [r for r in read_pkl(pkl2) if not records.is_stack_record(r)]
    assert any(r[3] == "torch.int64" for r in recs2) and any(r[4] == [] for r in recs2)


def test_steps_segments_and_counters(tmp_path):
    model, batch = mlp(seed=0)
    x = batch[0]
    dbg = PrecisionDebugger(dump_path=str(tmp_path), step=[0, 2])
    dbg.configure_hook(mode="all", summary_only=True)
    for _ in range(4):
        dbg.start()
        torch.relu(x)
        dbg.stop()
        torch.relu(x)  # between segments: not recorded
        dbg.start()
        torch.relu(x)
        dbg.stop()
        dbg.step()
    dbg.close()
    step_dirs = sorted(os.listdir(os.path.join(str(tmp_path), records.DUMP_DIR_NAME)))
    assert step_dirs == ["step0", "step2"]
    for s in (0, 2):
        keys = api_keys(read_pkl(os.path.join(records.rank_dir(str(tmp_path), s, 0), "all_dump.pkl")))
        assert keys == ["Torch_relu_0_forward", "Torch_relu_1_forward"]  # counters reset each step


def test_class_level_calls_and_rank_filter(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "a"), step=[0])
    dbg.configure_hook(mode="all", summary_only=True)
    ones = torch.ones(2)
    PrecisionDebugger.start()
    torch.exp(ones)
    PrecisionDebugger.stop()
    PrecisionDebugger.step()
    dbg.close()
    assert api_keys(read_pkl(os.path.join(records.rank_dir(str(tmp_path / "a"), 0, 0), "all_dump.pkl"))) == [
        "Torch_exp_0_forward"]
    other = PrecisionDebugger(dump_path=str(tmp_path / "b"), step=[0], rank=[1])  # this process is rank 0
    with other:
        torch.exp(torch.ones(2))
    other.close()
    assert not os.path.exists(os.path.join(str(tmp_path / "b"), records.DUMP_DIR_NAME))


def test_redump_replaces_the_rank_directory(tmp_path):
    rank_dir, pkl, data = run_mlp(tmp_path)
    stale = os.path.join(data, "stale_from_an_old_run.npy")
    open(stale, "w").close()
    rank_dir2, pkl2, data2 = run_mlp(tmp_path, mode="all", summary_only=True)
    assert rank_dir2 == rank_dir
    # the old api_stack files are gone; the new dump is its .pkl and its completeness manifest
    assert sorted(os.listdir(rank_dir)) == ["all_dump.manifest.json", "all_dump.pkl"]
    assert not [d for d in os.listdir(os.path.dirname(rank_dir)) if d != "rank0"]


@pytest.mark.parametrize("factory, summary_only, optimizer", [
    (mlp, True, "sgd"), (cnn, True, "sgd"), (tiny_gpt, True, "sgd"),
    (mlp, False, "adamw"), (tiny_gpt, False, "adamw"), (lstm, False, "adamw"), (lstm, True, "sgd"),
])
def test_loss_and_grads_unchanged_by_the_debugger(tmp_path, factory, summary_only, optimizer):
    def run(dbg):
        seed_all(0)
        model, batch = factory(seed=0)
        if dbg:
            dbg.start()
        opt = (torch.optim.SGD(model.parameters(), lr=0.1) if optimizer == "sgd"
               else torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False))
        loss = model.loss(batch)
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        opt.step()
        if dbg:
            dbg.stop()
            dbg.close()
        return loss.detach(), grads, [p.detach().clone() for p in model.parameters()]

    l0, g0, p0 = run(None)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), step=[0])
    dbg.configure_hook(summary_only=summary_only)
    l1, g1, p1 = run(dbg)
    assert torch.equal(l0, l1)
    assert all(torch.equal(a, b) for a, b in zip(g0, g1))
    assert all(torch.equal(a, b) for a, b in zip(p0, p1))


@pytest.mark.parametrize("kwargs, param", [
    (dict(step=0), "step"),
    (dict(step=[-1]), "step"),
    (dict(step=["0"]), "step"),
    (dict(hook_name="dumps"), "hook_name"),
    (dict(rank="0"), "rank"),
])
def test_bad_constructor_arguments(tmp_path, kwargs, param):
    with pytest.raises(ValueError, match=rf"invalid {param}=.*allowed values"):
        PrecisionDebugger(dump_path=str(tmp_path), **kwargs)


def test_unwritable_dump_path(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match="invalid dump_path=.*allowed values"):
        PrecisionDebugger(dump_path=str(f))
    with pytest.raises(ValueError, match="invalid dump_path=.*allowed values"):
        PrecisionDebugger(dump_path=str(f / "sub"))


@pytest.mark.parametrize("hook, match", [
    (dict(mode="everything"), r"invalid mode='everything'.*'api_stack'.*'api_list'"),
    (dict(mode="list"), r"scope=\[\] for mode='list'"),
    (dict(mode="range", scope=["a"]), r"mode='range'.*exactly two"),
    (dict(mode="api_list"), r"api_list=\[\] for mode='api_list'"),
    (dict(filter_switch="on"), r"filter_switch='on'.*'ON' or 'OFF'"),
    (dict(input_output_mode=["fwd"]), r"input_output_mode=\['fwd'\].*subset"),
    (dict(summary_only="yes"), r"summary_only='yes'.*True or False"),
    (dict(mode="acl", scope=["Tensor_permute_1_forward"]), r"acl_config=None"),
    (dict(mode="acl", scope=["a", "b"], acl_config="x.json"), r"scope=.*mode='acl'.*exactly one"),
    (dict(mode="acl", scope=["Functional_conv2d_1_backward"], acl_config="x.json"), r"backward_input"),
    (dict(acl_config="x.json"), r"acl_config='x.json'.*unless mode='acl'"),
    (dict(overflow_nums=0), r"overflow_nums=0"),
])
def test_bad_configure_hook(tmp_path, hook, match):
    dbg = PrecisionDebugger(dump_path=str(tmp_path))
    with pytest.raises(ValueError, match=match):
        dbg.configure_hook(**hook)


def test_acl_configuration_is_accepted(tmp_path):
    dbg = PrecisionDebugger(dump_path=str(tmp_path))
    dbg.configure_hook(mode="acl", scope=["Functional_conv2d_1_backward"], acl_config="dump.json",
                       backward_input=["Functional_conv2d_1_backward_input.0.npy"])
    assert dbg.config.mode == "acl" and dbg.config.backward_input


@pytest.mark.parametrize("n", [8, 300, 20000])  # snapshot never reused / reused by version / measured at once
def test_small_and_large_tensors_changed_in_place_are_recorded_as_at_entry_and_return(tmp_path, n):
    """Statistics are measured later, in batches, from snapshots: a tensor changed in place right
    after it was recorded keeps the values it had at that moment in every record."""
    x = torch.arange(n, dtype=torch.float32)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), step=[0])
    dbg.configure_hook(mode="api_stack", summary_only=True)
    dbg.start()
    y = x * 2            # output.0: 2 * x
    y.add_(1)            # input.0 at entry: 2 * x; output.0: 2 * x + 1
    y.mul_(-1)           # input.0 at entry: 2 * x + 1
    z = torch.tanh(y)    # input.0: -(2 * x + 1)
    dbg.stop()
    dbg.close()
    recs = {r[0]: r for r in read_pkl(os.path.join(records.rank_dir(str(tmp_path), 0, 0), "api_stack_dump.pkl"))}

    def mx_mn(key):
        return recs[key][5][:2]

    top = float(n - 1)
    assert mx_mn("Tensor_mul_0_forward_output.0") == [2 * top, 0.0]
    assert mx_mn("Tensor_add__0_forward_input.0") == [2 * top, 0.0]
    assert mx_mn("Tensor_add__0_forward_output.0") == [2 * top + 1, 1.0]
    assert mx_mn("Tensor_mul__0_forward_input.0") == [2 * top + 1, 1.0]
    assert mx_mn("Tensor_mul__0_forward_output.0") == [-1.0, -(2 * top + 1)]
    assert mx_mn("Torch_tanh_0_forward_input.0") == [-1.0, -(2 * top + 1)]
    assert recs["Torch_tanh_0_forward_output.0"][5][0] == pytest.approx(float(torch.tanh(torch.tensor(-1.0))))
    assert z.shape == (n,)
