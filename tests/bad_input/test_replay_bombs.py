"""Replay bombs and crashes: a crafted record asks for memory, or a package is malformed (issue 18).

Memory bombs: a one-record call spec (the ``Torch_relu_0_forward`` record of a real MLP step,
renamed and given new arguments, recorded output ``[16, 64]``) that would make gigabytes. Each
runs in a subprocess under ``RLIMIT_AS`` of 3 GiB, so that without the guard the replay fails to
allocate (or dies) there instead of taking the machine down; with it, the call is refused before
anything is allocated: in ``compare()`` an unusable record that fails the step, naming it; in
``ptdbg replay`` exit 2 with a message. Ordinary calls replay exactly as without the guard.

Internal errors: a dropout ``p=10**400``, a bad ``rng_state.npy``, a ``package.json`` nested 100k
deep give a message (exit 0/1 for compare, 2 for replay), never a traceback; ``--script`` writes
``float('inf')``, and only to a new path (never through a symlink, never over a file).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from comparing import input_param_for
from locations import REPO_ROOT
from real_dumps import dump_one_step, step_paths
from pytest_ptdbg.cli import main as ptdbg_main
from pytest_ptdbg.format import records

TARGET = "Torch_relu_0_forward"
T = {"t": "input.0"}
#: address space of a bomb's subprocess: torch itself takes about 0.7 GiB of it
LIMIT = 3 << 30


# ------------------------------------------------------------------------------------ fixtures


def _acl_hook(cfg: str, acl: str) -> dict:
    """``configure_hook`` arguments of an acl dump of the ReLU call into ``acl`` (config at ``cfg``)."""
    with open(cfg, "w") as fh:
        json.dump({"dump": {"dump_list": [], "dump_path": acl, "dump_mode": "all", "dump_op_switch": "on"}}, fh)
    return dict(mode="acl", scope=[TARGET], acl_config=cfg)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A full-tensor dump of an MLP step and the acl package of its ReLU call."""
    root = tmp_path_factory.mktemp("replay_bombs")
    dump_one_step(str(root / "npu"))
    dump_one_step(str(root / "acl_dump"), hook=_acl_hook(str(root / "acl.json"), str(root / "acl")))
    pkgs = [r for r, _, files in os.walk(str(root / "acl")) if "package.json" in files]
    assert len(pkgs) == 1
    return {"npu": str(root / "npu"), "package": pkgs[0]}


def _pkl(dump_root: str) -> str:
    return os.path.join(records.rank_dir(dump_root, 0, 0), "api_stack_dump.pkl")


def crafted_dump(dst: str, base: dict, family: str, spec: dict) -> str:
    """A copy of the MLP dump whose ReLU record is ``{family}_7_forward`` with call spec ``spec``."""
    shutil.copytree(base["npu"], dst)
    new_key, lines, done = f"{family}_7_forward", [], False
    for line in open(_pkl(dst)):
        rec = json.loads(line)
        if rec[0].startswith(TARGET + "_"):
            rec[0] = new_key + rec[0][len(TARGET):]
            if not done and len(rec) > 6 and isinstance(rec[6], dict) and "call" in rec[6]:
                rec[6]["call"], done = spec, True
        lines.append(json.dumps(rec))
    assert done, "the target record has no call spec"
    with open(_pkl(dst), "w") as fh:
        fh.write("\n".join(lines) + "\n")
    return new_key


def crafted_package(dst: str, base: dict, family: str, spec: dict, **fields) -> str:
    """The acl package of the ReLU call with its API and call spec replaced."""
    shutil.copytree(base["package"], dst)
    path = os.path.join(dst, "package.json")
    doc = json.load(open(path))
    api_type, _, api_name = family.partition("_")
    doc.update(api=f"{family}_7_forward", api_type=api_type, api_name=api_name, call_index=7, call=spec, **fields)
    with open(path, "w") as fh:
        json.dump(doc, fh)
    return dst


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([REPO_ROOT, os.path.join(REPO_ROOT, "tests"), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    return env


#: run in the bomb's subprocess: the address space capped, then one replay path; prints JSON
_CHILD = textwrap.dedent("""
    import contextlib, io, json, resource, sys
    resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
    import torch
    torch.set_num_threads(1)
    path, what, key = sys.argv[1:4]
    out = {{}}
    try:
        if path == "compare":
            from pytest_ptdbg import compare
            param = json.loads(sys.argv[4])
            r = compare(param, sys.argv[5])
            v = {{x.api: x for x in r.judgement.replay.verdicts}}.get(key)
            out = dict(passed=r.passed, status=str(v.status) if v else None, reason=v.reason if v else "",
                       unusable=list(r.judgement.unusable), notes=list(r.notes) if hasattr(r, "notes") else [])
        else:
            from pytest_ptdbg.cli import main
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                rc = main(["replay", what, "--device", "cpu"])
            out = dict(rc=rc, stderr=err.getvalue())
    except BaseException as exc:
        out = dict(error=type(exc).__name__ + ": " + str(exc)[:300])
    print("RESULT " + json.dumps(out))
""")


def run_capped(tmp_path, path: str, what: str, key: str, *extra: str) -> dict:
    """Run one replay path in a subprocess under RLIMIT_AS; its JSON result, or why it died."""
    proc = subprocess.run([sys.executable, "-c", _CHILD.format(limit=LIMIT), path, what, key, *extra],
                          capture_output=True, text=True, timeout=600, env=_env(), cwd=str(tmp_path))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        return {"error": f"the replay process died (rc {proc.returncode}): {proc.stderr[-600:]}"}
    return json.loads(lines[-1][len("RESULT "):])


# ------------------------------------------------------------------------------ memory bombs

BOMBS = {
    # name: (family, call spec); each would make gigabytes from a [16, 64] record
    "zeros": ("Torch_zeros", {"args": [1100000000], "kwargs": {}}),                      # 4.4 GB fp32
    "repeat": ("Tensor_repeat", {"args": [T, 5000, 5000], "kwargs": {}}),                 # 102 GB
    "new_full": ("Tensor_new_full", {"args": [T, [30000, 30000], 1.0], "kwargs": {}}),    # 7.2 GB fp64
    "einsum": ("Torch_einsum", {"args": ["ab,cd,ef->abcdef", T, T, T], "kwargs": {}}),    # 8.6 GB fp64
}


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_memory_bomb_in_compare_is_an_unusable_record(tmp_path, base, name):
    family, spec = BOMBS[name]
    npu = str(tmp_path / "npu")
    key = crafted_dump(npu, base, family, spec)
    out = tmp_path / "out"
    out.mkdir()
    param = input_param_for(step_paths(npu), step_paths(npu))
    got = run_capped(tmp_path, "compare", "", key, json.dumps(param), str(out))
    assert "error" not in got, got["error"]
    assert got["status"] == "not judged", got
    assert "would make" in got["reason"] and key in got["reason"], got["reason"]
    assert got["passed"] is False, "a refused memory bomb must fail the step"
    assert any(key in u and "would make" in u for u in got["unusable"]), got["unusable"]


@pytest.mark.parametrize("name", ["zeros", "new_full", "einsum"])
def test_memory_bomb_through_ptdbg_replay_is_refused_with_a_message(tmp_path, base, name):
    family, spec = BOMBS[name] if name != "zeros" else ("Torch_zeros", {"args": [1250000000], "kwargs": {}})
    pkg = crafted_package(str(tmp_path / "pkg"), base, family, spec)
    got = run_capped(tmp_path, "replay", pkg, "")
    assert "error" not in got, got["error"]
    assert got["rc"] == 2, got
    err = got["stderr"]
    assert "internal error" not in err and "Traceback" not in err, err
    assert f"{family}_7_forward" in err and "would make" in err and "not replayed" in err, err


def test_a_package_cannot_claim_outputs_its_files_do_not_hold(tmp_path, base):
    """The budget counts each recorded output at most as its file's bytes: a package.json that says
    its output is [1100000000] while the file holds [16, 64] does not raise it."""
    pkg = crafted_package(str(tmp_path / "pkg"), base, "Torch_zeros", {"args": [1100000000], "kwargs": {}})
    path = os.path.join(pkg, "package.json")
    doc = json.load(open(path))
    doc["tensors"]["output.0"]["shape"] = [1100000000]
    with open(path, "w") as fh:
        json.dump(doc, fh)
    got = run_capped(tmp_path, "replay", pkg, "")
    assert "error" not in got, got["error"]
    assert got["rc"] == 2 and "would make" in got["stderr"], got


def test_guard_agrees_with_the_meta_device_and_allocates_nothing():
    """The cheap bounds and the meta pre-run, directly: legitimate sizes pass, bombs are refused
    (each call here would allocate gigabytes if it ran)."""
    from pytest_ptdbg.errors import AllocationRefused
    from pytest_ptdbg.replayer import allocation as A
    from pytest_ptdbg.replayer.allowlist import resolve

    ins = {"input.0": ((16, 64), torch.float32), "input.1": ((64, 32), torch.float32)}
    ok = [("Torch_einsum", {"args": ["ab,bc->ac", T, {"t": "input.1"}]}, [(16, 32)]),
          ("Torch_zeros", {"args": [16, 64]}, [(16, 64)]),
          ("Tensor_repeat", {"args": [T, 2, 3]}, [(32, 192)]),
          ("Torch_matmul", {"args": [T, {"t": "input.1"}]}, [(16, 32)]),
          ("Functional_pad", {"args": [T, [1, 1]]}, [(16, 66)]),
          ("Torch_repeat_interleave", {"args": [T, {"t": "input.6"}], "kwargs": {"dim": 0}}, [(16 * 3, 64)]),
          ("Torch__foreach_add", {"args": [[T, T], [T, {"t": "input.7"}]], "kwargs": {}}, [(16, 64), (16, 64)]),
          ("Functional_conv2d", {"args": [{"t": "input.4"}, {"t": "input.5"}, None, 1, 1]}, [(1, 1, 4, 4)])]
    bad = [("Torch_einsum", {"args": ["ab,cd->abcd", T, {"t": "input.1"}]}, [(16, 32)]),
           ("Torch_zeros", {"args": [40000, 40000]}, [(16, 64)]),
           ("Functional_pad", {"args": [T, [100000000, 0]]}, [(16, 64)]),
           ("Torch_add", {"args": [{"t": "input.2"}, {"t": "input.3"}]}, [(16, 64)]),
           ("Torch_tensor_split", {"args": [T, 10 ** 9]}, [(16, 64)]),
           ("Tensor_expand", {"args": [T, 1000000, 16, 64]}, [(16, 64)]),
           ("Torch_arange", {"args": [0, 2000000000]}, [(16, 64)]),
           ("Torch__foreach_add", {"args": [[{"t": "input.2"}], [{"t": "input.3"}]]}, [(16, 64)]),
           ("Functional_conv2d", {"args": [{"t": "input.4"}, {"t": "input.5"}, None, 1, 30000]}, [(1, 1, 2, 2)]),
           ("Torch_repeat_interleave", {"args": [T, {"t": "input.6"}], "kwargs": {"dim": 0}}, [(16, 64)])]
    ins.update({"input.2": ((100000, 1), torch.float32), "input.3": ((1, 100000), torch.float32),
                "input.4": ((1, 1, 2, 2), torch.float32), "input.5": ((1, 1, 1, 1), torch.float32),
                "input.6": ((16,), torch.int64), "input.7": ((1, 64), torch.float32)})
    shapes, dtype = {k: v[0] for k, v in ins.items()}, lambda k: ins[k][1]
    value = {"input.6": np.full(16, 3, dtype=np.int64)}.get  # repeat_interleave's repeats
    for family, spec, outs in ok:
        api_type, _, name = family.partition("_")
        A.guard_call(resolve(api_type, name), f"{family}_0_forward", spec, shapes, dtype, outs, value)
    value = {"input.6": np.full(16, 10 ** 7, dtype=np.int64)}.get
    for family, spec, outs in bad:
        api_type, _, name = family.partition("_")
        with pytest.raises(AllocationRefused) as info:
            A.guard_call(resolve(api_type, name), f"{family}_0_forward", spec, shapes, dtype, outs, value)
        assert family in str(info.value)


def test_ordinary_calls_replay_exactly_as_without_the_guard(dump_step, monkeypatch):
    """Every call of real example-model steps passes the guard, and the judgement (status,
    reason, ratios, every field) is the same with the guard as without it."""
    from pytest_ptdbg.replayer import allocation
    from pytest_ptdbg.judge.own_error import judge_dump

    for model in ("tiny_gpt", "cnn", "lstm"):
        path = dump_step(model, model).dump_path
        guarded = judge_dump(str(path), device="cpu")
        assert not [v.api for v in guarded.verdicts if v.unusable or "would make" in v.reason]
        with monkeypatch.context() as m:
            m.setattr(allocation, "guard_arrays", lambda *a, **k: None)
            plain = judge_dump(str(path), device="cpu")
        assert [v.to_dict() for v in guarded.verdicts] == [v.to_dict() for v in plain.verdicts], model
        assert [v.ratio for v in guarded.verdicts] == [v.ratio for v in plain.verdicts]


# ------------------------------------------------------------------------- internal errors


@pytest.mark.parametrize("sides", ["npu", "both"])
def test_dropout_p_too_large_for_a_float_is_a_message(tmp_path, base, compare_pair, sides):
    spec = {"args": [T], "kwargs": {"p": 10 ** 400, "training": True}}
    npu, bench = str(tmp_path / "npu"), str(tmp_path / "bench")
    key = crafted_dump(npu, base, "Functional_dropout", spec)
    if sides == "both":
        crafted_dump(bench, base, "Functional_dropout", spec)
    else:
        shutil.copytree(base["npu"], bench)
    result = compare_pair(step_paths(npu), step_paths(bench))
    assert result.judgement.replay is not None, result.notes  # the judgement was not turned off
    v = result.judgement.replay.by_api()[key]
    assert str(v.status) == "not judged" and "p" in v.reason, v.reason
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = ptdbg_main(["compare", npu, bench, "-o", str(tmp_path / "cli"), "-q"])
    assert rc in (0, 1) and "internal error" not in err.getvalue(), err.getvalue()


def _replay_cli(pkg: str, *extra: str):
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        rc = ptdbg_main(["replay", pkg, "--device", "cpu", *extra])
    return rc, err.getvalue()


@pytest.mark.parametrize("content", ["ten_bytes", "ten_byte_array", "float_array"])
def test_bad_rng_state_is_a_message(tmp_path, base, content):
    pkg = crafted_package(str(tmp_path / "pkg"), base, "Functional_dropout", {"args": [T], "kwargs": {"p": 0.5}},
                          rng={"device": "cpu", "file": "rng_state.npy"})
    path = os.path.join(pkg, "rng_state.npy")
    if content == "ten_bytes":
        with open(path, "wb") as fh:
            fh.write(b"\x93NUMPY\x01\x00v\x00")
    else:
        np.save(path, np.arange(10, dtype=np.uint8 if content == "ten_byte_array" else np.float32))
    rc, err = _replay_cli(pkg)
    assert rc == 2 and "Traceback" not in err and "internal error" not in err, err
    assert "rng_state.npy" in err and "Functional_dropout_7_forward" in err, err


def test_package_json_nested_100k_deep_is_a_message(tmp_path, base):
    pkg = crafted_package(str(tmp_path / "pkg"), base, "Torch_relu", {"args": [T], "kwargs": {}})
    path = os.path.join(pkg, "package.json")
    text = open(path).read().rstrip()
    assert text.endswith("}")
    with open(path, "w") as fh:
        fh.write(text[:-1] + ', "deep": ' + "[" * 100000 + "]" * 100000 + "}")
    for extra in ((), ("--script", str(tmp_path / "repro.py"))):
        rc, err = _replay_cli(pkg, *extra)
        assert rc == 2 and "Traceback" not in err and "internal error" not in err, err
        assert "package.json" in err and "nested" in err, err
    assert not os.path.exists(tmp_path / "repro.py")


def test_script_writes_inf_and_nan_as_python(tmp_path, base):
    spec = {"args": [T], "kwargs": {"nan": 0.0, "posinf": float("inf"), "neginf": float("-inf")}}
    pkg = crafted_package(str(tmp_path / "pkg"), base, "Torch_nan_to_num", spec)
    script = str(tmp_path / "repro.py")
    rc, err = _replay_cli(pkg, "--script", script)
    assert rc == 0, err
    text = open(script).read()
    assert "posinf=float('inf')" in text and "neginf=float('-inf')" in text, text
    proc = subprocess.run([sys.executable, script, "--device", "cpu"], capture_output=True, text=True,
                          timeout=300, env=_env(), cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "output.0" in proc.stdout


@pytest.mark.parametrize("planted", ["symlink", "dangling_symlink", "file"])
def test_script_is_written_only_to_a_new_path(tmp_path, base, planted):
    pkg = crafted_package(str(tmp_path / "pkg"), base, "Torch_relu", {"args": [T], "kwargs": {}})
    script, victim = tmp_path / "repro.py", tmp_path / "victim.txt"
    if planted == "symlink":
        victim.write_text("keep me\n")
        os.symlink(victim, script)
    elif planted == "dangling_symlink":
        os.symlink(victim, script)
    else:
        script.write_text("keep me\n")
    rc, err = _replay_cli(pkg, "--script", str(script))
    assert rc == 2 and "Traceback" not in err, err
    assert str(script) in err and ("symbolic link" in err or "existing file" in err), err
    if planted == "dangling_symlink":
        assert not victim.exists(), "the script was written through a symlink"
    else:
        assert (victim if planted == "symlink" else script).read_text() == "keep me\n"
