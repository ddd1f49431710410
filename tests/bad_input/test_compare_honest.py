"""A compare never passes on data it could not use.

Dumps of a real model's train step (example_models' MLP, SGD) are written by ``PrecisionDebugger``
(full tensors and statistics only), copied and corrupted one way per test; ptdbg v4 dumps are
hand-written in ptdbg's documented format (no ``extra``, no manifest). Every case must give
``passed=False`` with the file/record named, or - where the data is fine - pass with a note.
"""
import json
import os
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest

from comparing import input_param_for, run_compare
from locations import REPO_ROOT
from real_dumps import dump_one_step
import torch

import example_models as em
from pytest_ptdbg import PrecisionError, assert_precision, compare
from pytest_ptdbg.plugin.assertions import evaluate
from pytest_ptdbg.format import records
from pytest_ptdbg.format.manifest import write_manifest

ROOT = REPO_ROOT
#: an output of the model's last layer (fc3) and its file
LAST = "Functional_linear_2_forward_output.0"
RELU = "Torch_relu_0_forward_output.0"


def _complete_lines(pkl):
    with open(pkl, "rb") as f:
        return sum(1 for ln in f if ln.endswith(b"\n") and ln.strip())


def close_manifest(pkl):
    """Write the manifest as the dump writer does when a step is closed (counting the lines now
    in the file): a test's corruption then fails for what it corrupted, not for the manifest."""
    write_manifest(pkl, _complete_lines(pkl))


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("honest"))
    for kind, summary in (("full", False), ("stat", True)):
        for side in ("npu", "bench"):
            close_manifest(dump_one_step(os.path.join(root, f"{side}_{kind}"), summary_only=summary).pkl)
    return root


class Side:
    def __init__(self, base):
        self.rank = records.rank_dir(base, 0, 0)
        self.pkl = os.path.join(self.rank, "api_stack_dump.pkl")
        self.data = os.path.join(self.rank, "api_stack_dump")

    def npy(self, name):
        return os.path.join(self.data, name + ".npy")

    def lines(self):
        with open(self.pkl, encoding="utf-8") as f:
            return f.readlines()

    def write_lines(self, lines, manifest=True):
        with open(self.pkl, "w", encoding="utf-8") as f:
            f.writelines(lines)
        if manifest:
            close_manifest(self.pkl)

    def edit_record(self, name, fn):
        out = []
        for ln in self.lines():
            rec = json.loads(ln)
            if rec[0] == name:
                fn(rec)
                ln = records.encode_line(rec)
            out.append(ln)
        self.write_lines(out)


@pytest.fixture()
def pair(made, tmp_path, request):
    """Copies of the NPU and bench dumps of one kind ("full" or "stat")."""
    kind = getattr(request, "param", "full")
    npu, bench = str(tmp_path / "npu"), str(tmp_path / "bench")
    shutil.copytree(os.path.join(made, f"npu_{kind}"), npu)
    shutil.copytree(os.path.join(made, f"bench_{kind}"), bench)
    return Side(npu), Side(bench), kind, tmp_path


def run(npu, bench, kind, tmp_path, **kw):
    """Compare the two sides of one ``kind`` ("stat": with no data folder named)."""
    full = kind == "full"
    kw.setdefault("replay_check", False)
    return run_compare(npu.pkl, bench.pkl, tmp_path / "out", npu_data=npu.data if full else "",
                       bench_data=bench.data if full else "", **kw)


def problem_names(result, what):
    return any(what in p for p in result.problems)


both = pytest.mark.parametrize("pair", ["full", "stat"], indirect=True)


# ------------------------------------------------------------------------ control

@both
def test_control_the_same_run_twice_passes(pair):
    """The control: two clean dumps of the same run agree (nothing below fails by accident)."""
    npu, bench, kind, tmp = pair
    r = run(npu, bench, kind, tmp)
    assert r.passed and not r.problems and len(r.table) > 20 and r.notes == []


# ------------------------------------------------------------------------ a side unusable

@both
def test_empty_npu_pkl_fails_naming_the_file(pair):
    npu, bench, kind, tmp = pair
    open(npu.pkl, "w").close()
    r = run(npu, bench, kind, tmp)
    assert not r.passed and problem_names(r, npu.pkl)


def test_empty_bench_pkl_fails_naming_the_file(pair):
    npu, bench, kind, tmp = pair
    bench.write_lines([])
    r = run(npu, bench, kind, tmp)
    assert not r.passed and problem_names(r, bench.pkl) and problem_names(r, "no usable record")


def test_random_bytes_as_npu_pkl_fail(pair):
    npu, bench, kind, tmp = pair
    with open(npu.pkl, "wb") as f:
        f.write(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())
    r = run(npu, bench, kind, tmp)
    assert not r.passed and problem_names(r, npu.pkl)


def test_utf16_npu_pkl_fails(pair):
    npu, bench, kind, tmp = pair
    text = "".join(npu.lines())
    with open(npu.pkl, "wb") as f:
        f.write(text.encode("utf-16"))
    r = run(npu, bench, kind, tmp)
    assert not r.passed and problem_names(r, npu.pkl)


def test_python_pickle_as_npu_pkl_fails_and_is_never_unpickled(pair):
    npu, bench, kind, tmp = pair
    recs = [json.loads(ln) for ln in npu.lines()]
    with open(npu.pkl, "wb") as f:
        pickle.dump(recs, f)
    r = run(npu, bench, kind, tmp)
    assert not r.passed and problem_names(r, npu.pkl)


def test_npy_file_as_npu_pkl_fails(pair):
    npu, bench, kind, tmp = pair
    np.save(npu.pkl + ".npy", np.arange(1000, dtype=np.float32))
    os.replace(npu.pkl + ".npy", npu.pkl)
    r = run(npu, bench, kind, tmp)
    assert not r.passed and problem_names(r, npu.pkl)


def test_dev_null_as_input_is_a_clear_error_naming_it(pair):
    npu, bench, kind, tmp = pair
    with pytest.raises(ValueError, match="/dev/null"):
        compare(input_param_for("/dev/null", bench.pkl), str(tmp / "out"))


@both
def test_dump_cut_short_by_a_kill_fails_naming_the_file(pair):
    """19 of the lines a closed dump had (its manifest counts them all): cut short, not a pass."""
    npu, bench, kind, tmp = pair
    lines = npu.lines()
    assert len(lines) > 40
    npu.write_lines(lines[:19], manifest=False)
    r = run(npu, bench, kind, tmp)
    assert not r.passed and any(npu.pkl in p and "cut short" in p for p in r.problems)


def test_dump_never_closed_has_no_manifest_and_fails(pair):
    """A dump of this project without its manifest (killed before stop()) is incomplete."""
    npu, bench, kind, tmp = pair
    os.unlink(npu.pkl[:-4] + ".manifest.json")
    r = run(npu, bench, kind, tmp)
    assert not r.passed and any(npu.pkl in p and "manifest" in p for p in r.problems)


def test_pkl_line_nested_100k_deep_is_named_not_a_recursion_error(pair):
    npu, bench, kind, tmp = pair
    lines = npu.lines()
    npu.write_lines(lines[:3] + ["[" * 100_000 + "]" * 100_000 + "\n"] + lines[3:])
    r = run(npu, bench, kind, tmp)
    assert not r.passed and any(f"{npu.pkl}:4:" in p and "nested" in p for p in r.problems)


# ------------------------------------------------------------------------ a data file unusable

def _missing(path, arr):
    os.unlink(path)


def _truncated(path, arr):
    with open(path, "rb+") as f:
        f.truncate(os.path.getsize(path) - 8)


def _zero_bytes(path, arr):
    open(path, "wb").close()


def _wrong_shape(path, arr):
    os.unlink(path)   # a hard link may share the bench's inode
    np.save(path, arr[:, :-1])


def _int_for_float(path, arr):
    os.unlink(path)
    np.save(path, arr.astype(np.int64))


@pytest.mark.parametrize("corrupt", [_missing, _truncated, _zero_bytes, _wrong_shape, _int_for_float],
                         ids=["missing", "truncated", "zero_bytes", "wrong_shape", "int_for_float"])
def test_unusable_npy_is_a_failing_row_naming_the_file(pair, corrupt):
    npu, bench, kind, tmp = pair
    path = npu.npy(LAST)
    arr = np.load(path)
    corrupt(path, arr)
    r = run(npu, bench, kind, tmp)
    row = r.table[r.table["NPU Name"] == LAST].iloc[0]
    assert row["Accuracy Reached or Not"] == "No" and not row["_passed"]
    assert path in row["Err_message"] and problem_names(r, path) and not r.passed


def test_fifo_in_place_of_npy_fails_at_once(pair):
    """A FIFO is refused by stat before any open: the compare does not hang."""
    npu, bench, kind, tmp = pair
    path = npu.npy(LAST)
    os.unlink(path)
    os.mkfifo(path)
    param = input_param_for(npu.pkl, bench.pkl, npu_data=npu.data, bench_data=bench.data)
    code = ("from pytest_ptdbg import compare; "
            f"r = compare({param!r}, {str(tmp / 'out')!r}); "   # replay check on: it reads files too
            f"assert not r.passed and any({path!r} in p for p in r.problems), r.problems; print('ok')")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0 and "ok" in p.stdout, p.stderr


@pytest.mark.parametrize("fortran", [True, False], ids=["fortran_order", "c_order"])
def test_npy_header_claiming_100000x100000_fails_without_memory_error(pair, fortran):
    """200-byte files whose headers (and records, on both sides) claim 80 GB: checked against the
    file's size before anything is allocated; the row fails naming the file."""
    npu, bench, kind, tmp = pair
    for side in (npu, bench):
        path = side.npy(LAST)
        os.unlink(path)
        hdr = {"descr": "<f8", "fortran_order": fortran, "shape": (100000, 100000)}
        with open(path, "wb") as f:
            np.lib.format.write_array_header_1_0(f, hdr)
            f.write(b"\0" * (200 - f.tell()))
        side.edit_record(LAST, lambda rec: rec.__setitem__(4, [100000, 100000]))
    r = run(npu, bench, kind, tmp, replay_check=True)   # the replay check reads suspects' files too
    assert not r.passed and problem_names(r, npu.npy(LAST))
    row = r.table[r.table["NPU Name"] == LAST].iloc[0]
    assert row["Accuracy Reached or Not"] == "No" and "truncated" in row["Err_message"]


# ------------------------------------------------------------------------ changed calls

@both
def test_output_shape_change_pairs_the_call_and_fails(pair):
    """fc3's output [16, 10] became [16, 9]: one row says "shape changed", not two unpaired calls."""
    npu, bench, kind, tmp = pair
    npu.edit_record(LAST, lambda rec: rec.__setitem__(4, [16, 9]))
    if kind == "full":
        path = npu.npy(LAST)
        arr = np.load(path)
        os.unlink(path)
        np.save(path, arr[:, :9])
    r = run(npu, bench, kind, tmp)
    row = r.table[r.table["NPU Name"] == LAST].iloc[0]
    assert row["Bench Name"] == LAST and row["_paired"]
    assert row["Accuracy Reached or Not"] == "No" and "shape changed" in row["Err_message"]
    assert "[16, 9]" in row["Err_message"] and "[16, 10]" in row["Err_message"]
    assert not r.passed


@both
def test_dtype_class_change_fails(pair):
    """relu's output recorded as int64 on the NPU: never compared as if it were the float one."""
    npu, bench, kind, tmp = pair
    npu.edit_record(RELU, lambda rec: rec.__setitem__(3, "torch.int64"))
    if kind == "full":
        path = npu.npy(RELU)
        arr = np.load(path)
        os.unlink(path)
        np.save(path, arr.astype(np.int64))
    r = run(npu, bench, kind, tmp)
    rows = r.table[r.table["NPU Name"] == RELU]
    assert not r.passed and (rows["Accuracy Reached or Not"] == "No").all() and len(rows)


@both
def test_call_on_one_side_only_fails(made, dump_step, pair):
    """The device under test makes one extra call (a real torch call in its step): unpaired fails."""
    npu, bench, kind, tmp = pair
    model, batch = em.mlp(seed=0)

    def extra_step():
        torch.tanh(batch[0])
        return em.train_step(model, batch)

    extra = dump_step("extra", extra_step, summary_only=kind == "stat")
    close_manifest(extra.pkl)
    r = run(Side(extra.dump_path), bench, kind, tmp)
    extra = r.table[r.table["_api"] == "Torch_tanh_0_forward"]
    assert len(extra) and not extra["_paired"].any() and (extra["Accuracy Reached or Not"] == "No").all()
    assert not r.passed


def test_all_zero_npu_output_against_nonzero_bench_fails(pair):
    """Cosine is undefined when one side is all zeros: that must not read as "Yes"."""
    npu, bench, kind, tmp = pair
    path = npu.npy(LAST)
    arr = np.load(path)
    os.unlink(path)
    np.save(path, np.zeros_like(arr))
    r = run(npu, bench, kind, tmp)
    row = r.table[r.table["NPU Name"] == LAST].iloc[0]
    assert row["Accuracy Reached or Not"] == "No" and "all zeros on the NPU side" in row["Err_message"]
    assert not r.passed
    # re-judged from the table under other ptdbg thresholds it still fails
    with pytest.raises(PrecisionError):
        assert_precision(r, cosine=0.5, max_abs_hard=100.0)


def test_unusable_rows_never_rejudge_to_pass(pair):
    """assert_precision with any thresholds, on a result with a missing file or an empty side."""
    npu, bench, kind, tmp = pair
    os.unlink(npu.npy(LAST))
    r = run(npu, bench, kind, tmp)
    loose = dict(cosine=-1.0, cosine_hard=-1.0, max_abs=1e9, max_abs_hard=1e9)
    with pytest.raises(PrecisionError):
        assert_precision(r, **loose)
    assert not evaluate(r, rule="dtype", rtol=1e9, atol=1e9).passed
    # the message says so, and offers no tolerance that "would have passed"
    with pytest.raises(PrecisionError) as exc:
        assert_precision(r)
    assert "unusable data" in str(exc.value) and "would have passed with" not in str(exc.value)
    bench.write_lines([])
    empty = run_compare(npu.pkl, bench.pkl, tmp / "o2", npu_data="", bench_data="", replay_check=False)
    assert not evaluate(empty).passed and not evaluate(empty, **loose).passed


# ------------------------------------------------------------------------ ptdbg v4 as ptdbg writes it

def _v4(base, out_value, with_data):
    """A ptdbg v4 dump: conv2d with a single output named without index, a Python int scalar
    (``"<class 'int'>"``, shape ``"[]"``, ``1`` in the 2nd field), stacks, no extra, no manifest."""
    rank = records.rank_dir(base, 0, 0)
    data = os.path.join(rank, "api_stack_dump")
    os.makedirs(data)
    x = np.arange(1 * 1 * 4 * 4, dtype=np.float32).reshape(1, 1, 4, 4) / 10
    y = x + np.float32(out_value)

    def st(a):
        return [float(a.max()), float(a.min()), float(a.mean()), float(np.sqrt((a.astype(np.float64) ** 2).sum()))]

    recs = [
        ["Functional_conv2d_0_forward_input.0", 0, [], "torch.float32", [1, 1, 4, 4], st(x)],
        ["Functional_conv2d_0_forward_input.1", 1, [], "<class 'int'>", "[]", [2, 2, 2, 2]],
        ["Functional_conv2d_0_forward_output", 0, [], "torch.float32", [1, 1, 4, 4], st(y)],
        ["Functional_conv2d_0_forward_stack_info", [["model.py", 3, "forward", "y = F.conv2d(x, w, 2)"]]],
    ]
    with open(os.path.join(rank, "api_stack_dump.pkl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)
    if with_data:
        np.save(os.path.join(data, "Functional_conv2d_0_forward_input.0.npy"), x)
        np.save(os.path.join(data, "Functional_conv2d_0_forward_output.npy"), y)
    return os.path.join(rank, "api_stack_dump.pkl"), (data if with_data else "")


@pytest.mark.parametrize("with_data", [True, False], ids=["full", "stat"])
def test_ptdbg_v4_output_differing_by_5_fails_and_names_the_api(tmp_path, compare_pair, with_data):
    npu = _v4(str(tmp_path / "npu"), 5.0, with_data)
    bench = _v4(str(tmp_path / "bench"), 0.0, with_data)
    r = compare_pair(npu[0], bench[0], npu_data=npu[1], bench_data=bench[1], replay_check=False)
    names = set(r.table["NPU Name"])
    assert {"Functional_conv2d_0_forward_output", "Functional_conv2d_0_forward_input.1"} <= names
    row = r.table[r.table["NPU Name"] == "Functional_conv2d_0_forward_output"].iloc[0]
    assert row["Accuracy Reached or Not"] == "No" and not r.passed and r.problems == []
    assert r.first_suspect is not None and r.first_suspect.api == "Functional_conv2d_0_forward"
    with open(r.advisor_path) as f:
        assert "Suspect Nodes: None" not in f.read()


@pytest.mark.parametrize("with_data", [True, False], ids=["full", "stat"])
def test_ptdbg_v4_identical_dumps_pass_with_completeness_unknown_noted(tmp_path, compare_pair, with_data):
    npu = _v4(str(tmp_path / "npu"), 0.0, with_data)
    bench = _v4(str(tmp_path / "bench"), 0.0, with_data)
    r = compare_pair(npu[0], bench[0], npu_data=npu[1], bench_data=bench[1], replay_check=False)
    assert len(r.table) == 3 and r.table["_paired"].all()
    assert r.passed and r.problems == []
    assert any(npu[0] in n and "completeness unknown" in n for n in r.notes)
    with open(r.advisor_path) as f:
        assert "completeness unknown" in f.read()


def test_cli_compare_of_an_empty_npu_pkl_exits_1_not_passed(pair, capsys):
    """``ptdbg compare`` on an empty NPU ``.pkl`` is FAILED (exit 1), not PASSED."""
    from pytest_ptdbg.cli import main

    npu, bench, kind, tmp = pair
    open(npu.pkl, "w").close()
    code = main(["compare", npu.pkl, bench.pkl, "-o", str(tmp / "cli"), "--no-replay"])
    out = capsys.readouterr().out
    assert code == 1 and "FAILED" in out and npu.pkl in out
