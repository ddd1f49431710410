import json
import os

import numpy as np
import pytest

from pytest_ptdbg.dump import reader
from pytest_ptdbg.format import records
from pytest_ptdbg.format.manifest import write_manifest
from pytest_ptdbg.dump.npy import NpyStream, load_npy

import dumps
from locations import DATA_DIR


@pytest.fixture()
def mlp_dump(tmp_path):
    dumps.write_dump(str(tmp_path / "d"), dumps.mlp_apis())
    return tmp_path / "d"


def test_locate_from_any_level(mlp_dump):
    rank = records.rank_dir(str(mlp_dump), 0, 0)
    for p in (mlp_dump, mlp_dump / records.DUMP_DIR_NAME, records.step_dir(str(mlp_dump), 0), rank,
              os.path.join(rank, "api_stack_dump.pkl")):
        loc = reader.locate(str(p))
        assert loc.path == os.path.join(rank, "api_stack_dump.pkl")
        assert loc.data_dir == os.path.join(rank, "api_stack_dump") and loc.layout == "ptdbg"


def test_locate_errors_name_the_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        reader.locate(str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="empty"):
        reader.locate(str(tmp_path / "empty"))
    for r in (0, 1):
        dumps.write_dump(str(tmp_path / "two"), dumps.mlp_apis(), rank=r)
    with pytest.raises(ValueError, match="2 ranks.*compare_distributed"):
        reader.locate(str(tmp_path / "two"))


def test_groups_by_api_in_first_appearance_order(tmp_path):
    a0 = "Functional_linear_0_backward"
    lines = [
        records.tensor_record("Torch_relu_0_forward_input.0", "torch.float32", [2], [1, 0, 0.5, 1]),
        records.tensor_record(a0 + "_input.0", "torch.float32", [2], [1, 0, 0.5, 1]),
        records.tensor_record("Torch_relu_0_backward_input.0", "torch.float32", [2], [1, 0, 0.5, 1]),
        records.tensor_record(a0 + "_output.1", "torch.float32", [2], [1, 0, 0.5, 1], {"ctx": "optimizer"}),
        records.stack_record(a0, [["m.py", 3, "f", "y = lin(x)"]]),
        records.tensor_record("Torch_relu_0_forward_output.0", "torch.float32", [2], [1, 0, 0.5, 1]),
    ]
    pkl = tmp_path / "api_stack_dump.pkl"
    pkl.write_text("".join(records.encode_line(r) for r in lines))
    write_manifest(str(pkl), len(lines))
    d = reader.read_dump(str(pkl))
    assert [a.key for a in d.apis] == ["Torch_relu_0_forward", a0, "Torch_relu_0_backward"]
    lin = d.apis[1]
    assert [t.slot for t in lin.tensors] == ["input.0", "output.1"]
    assert lin.stack == [["m.py", 3, "f", "y = lin(x)"]] and lin.ctx == "optimizer"
    assert lin.family == "Functional_linear" and lin.direction == "backward" and lin.order == 1
    assert d.mode == "api_stack" and not d.has_data and d.problems == []


def test_truncated_and_corrupt_lines_are_reported_and_skipped(mlp_dump):
    pkl = reader.locate(str(mlp_dump)).path
    text = open(pkl).read().splitlines(keepends=True)
    text.insert(3, "this is not json\n")
    text.append(text[0][: len(text[0]) // 2])       # an interrupted last line
    open(pkl, "w").write("".join(text))
    d = reader.read_dump(str(mlp_dump))
    assert any(p.startswith(f"{pkl}:4: corrupt") for p in d.problems)
    assert any(p.startswith(f"{pkl}:{len(text)}: truncated") for p in d.problems)
    assert d.n_tensors == sum(len(a.tensors) for a in dumps.mlp_apis())


def test_bad_records_name_file_line_and_record(tmp_path):
    pkl = tmp_path / "api_stack_dump.pkl"
    good = records.tensor_record("Torch_relu_0_forward_input.0", "torch.float32", [2], [1, 0, 0.5, 1])
    pkl.write_text(
        json.dumps(["Torch_relu_0_forward_input.1", 0, [], "torch.float32", "two", []]) + "\n"
        + json.dumps(["nonsense", 0, [], "torch.float32", [2], []]) + "\n"
        + records.encode_line(good))
    d = reader.read_dump(str(pkl))
    assert any(":1:" in p and "Torch_relu_0_forward_input.1" in p and "shape" in p for p in d.problems)
    assert any(":2:" in p and "nonsense" in p for p in d.problems)
    assert d.n_tensors == 1


def test_record_names_cannot_leave_the_data_dir(tmp_path):
    rank = tmp_path / "rank0"
    (rank / "api_stack_dump").mkdir(parents=True)
    (tmp_path / "secret.npy").write_bytes(b"x")
    recs = [
        records.tensor_record("Torch_relu_0_forward_input.0", "torch.float32", [2], [1, 0, 0.5, 1],
                              {"npy": "../../secret.npy"}),
        ["Torch_x/../../secret_0_forward_input.0", 0, [], "torch.float32", [2], [1, 0, 0.5, 1]],
    ]
    (rank / "api_stack_dump.pkl").write_text("".join(records.encode_line(r) for r in recs))
    d = reader.read_dump(str(rank))
    ts = [t for a in d.apis for t in a.tensors]
    assert all(t.data_file is None for t in ts)
    assert len([p for p in d.problems if "outside" in p or "unsafe" in p]) == 2


def test_npy_checks_shape_and_refuses_pickles(tmp_path):
    p = tmp_path / "a.npy"
    np.save(p, np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match=r"a.npy.*\[2, 3\].*'rec'.*\[3, 2\]"):
        NpyStream(str(p), "rec", (3, 2), "torch.float32")
    with pytest.raises(ValueError, match="dtype"):
        load_npy(str(p), "rec", (2, 3), "torch.int64")
    assert load_npy(str(p), "rec", (2, 3), "torch.bfloat16").shape == (2, 3)  # bf16 saved as float32
    np.save(tmp_path / "o.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="never unpickled"):
        NpyStream(str(tmp_path / "o.npy"), "obj")
    with pytest.raises(ValueError):
        load_npy(str(tmp_path / "o.npy"), "obj")
    raw = p.read_bytes()
    (tmp_path / "t.npy").write_bytes(raw[:-8])
    with pytest.raises(ValueError, match="truncated"):
        NpyStream(str(tmp_path / "t.npy"), "rec", (2, 3))


MSPROBE = os.path.join(DATA_DIR, "msprobe")


@pytest.mark.skipif(not os.path.isdir(MSPROBE), reason="no msprobe sample")
def test_reads_msprobe_dump_json():
    d = reader.read_dump(os.path.join(MSPROBE, "mlp_tensor"))
    assert d.layout == "msprobe" and d.has_data and not d.problems
    lin = d.apis[0]
    assert lin.key == "Functional.linear.0.forward" and lin.family == "Functional_linear"
    assert [t.slot for t in lin.tensors] == ["input.0", "input.1", "input.2", "output.0"]
    assert lin.stack[0][1] == 134 and lin.stack[0][2] == "forward"
    bwd = next(a for a in d.apis if a.key == "Functional.linear.0.backward")
    assert [t.slot for t in bwd.tensors] == ["input.0", "output.0", "output.2"]   # None grads skipped
    s = reader.read_dump(os.path.join(MSPROBE, "mlp_statistics_fp32"))
    assert not s.has_data and len(s.apis) == len(d.apis)


def test_msprobe_pt_tensors_load_with_weights_only(tmp_path):
    torch = pytest.importorskip("torch")
    from pytest_ptdbg.dump.npy import load_pt

    t = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    torch.save(t, tmp_path / "x.pt")
    a = load_pt(str(tmp_path / "x.pt"), "x", (2, 3), "torch.bfloat16")
    assert a.dtype == np.float32 and a.tolist() == [[0, 1, 2], [3, 4, 5]]
    torch.save({"not": "a tensor"}, tmp_path / "y.pt")
    with pytest.raises(ValueError, match="y.pt.*'y'"):
        load_pt(str(tmp_path / "y.pt"), "y")


def test_ptdbg_dump_without_extra_expects_files_for_tensors_only(tmp_path):
    """ptdbg's own records have no ``extra``: a Python number needs no file, a tensor does."""
    rank = tmp_path / "rank0"
    (rank / "api_stack_dump").mkdir(parents=True)
    recs = [
        ["Torch_arange_0_forward_input.0", 0, [], "<class 'int'>", [], [8, 8, 8, 8]],
        ["Torch_mul_0_forward_input.1", 0, [], "float", [], [0.5, 0.5, 0.5, 0.5]],
        ["Torch_mul_0_forward_input.0", 0, [], "torch.float32", [], [2.0, 2.0, 2.0, 2.0]],
        ["Torch_mul_0_forward_output.0", 0, [], "torch.float32", [2], [1.0, 1.0, 1.0, 1.4]],
    ]
    (rank / "api_stack_dump.pkl").write_text("".join(records.encode_line(r) for r in recs))
    np.save(rank / "api_stack_dump" / "Torch_mul_0_forward_input.1.npy", np.array(0.5))  # used when there
    d = reader.read_dump(str(rank))
    by = {t.name: t for a in d.apis for t in a.tensors}
    assert by["Torch_arange_0_forward_input.0"].data_file is None
    assert by["Torch_arange_0_forward_input.0"].data_problem == ""
    assert by["Torch_mul_0_forward_input.1"].data_file.endswith("Torch_mul_0_forward_input.1.npy")
    for name in ("Torch_mul_0_forward_input.0", "Torch_mul_0_forward_output.0"):
        assert by[name].data_file is None and "not found" in by[name].data_problem and name in by[name].data_problem


def test_symlinks_are_followed_inside_the_data_dir_only(tmp_path):
    """Decision: a symbolic link in the data dir is read when its target resolves inside the data
    dir (e.g. a deduplicated copy), refused - with a problem naming the record - when it leads out."""
    rank = tmp_path / "rank0"
    ddir = rank / "api_stack_dump"
    (ddir / "sub").mkdir(parents=True)
    arr = np.arange(2, dtype=np.float32)
    np.save(ddir / "sub" / "real.npy", arr)
    np.save(tmp_path / "outside.npy", arr)
    os.symlink(ddir / "sub" / "real.npy", ddir / "Torch_relu_0_forward_input.0.npy")
    os.symlink(tmp_path / "outside.npy", ddir / "Torch_relu_0_forward_output.0.npy")
    os.symlink("sub/../../../outside.npy", ddir / "Torch_relu_1_forward_output.0.npy")
    recs = [records.tensor_record(f"Torch_relu_{k}_forward_{io}.0", "torch.float32", [2], [1, 0, 0.5, 1],
                                  {"npy": f"Torch_relu_{k}_forward_{io}.0.npy"})
            for k, io in ((0, "input"), (0, "output"), (1, "output"))]
    (rank / "api_stack_dump.pkl").write_text("".join(records.encode_line(r) for r in recs))
    write_manifest(str(rank / "api_stack_dump.pkl"), len(recs))
    d = reader.read_dump(str(rank))
    inside, out0, out1 = [t for a in d.apis for t in a.tensors]
    assert inside.data_file and load_npy(inside.data_file, inside.name, (2,)).tolist() == [0, 1]
    assert out0.data_file is None and out1.data_file is None
    assert len(d.problems) == 2 and all("symbolic link" in p and "outside" in p for p in d.problems)
    assert any(out0.name in p for p in d.problems) and any(out1.name in p for p in d.problems)


def test_msprobe_keyword_tensor_is_named_input_dot_name(tmp_path):
    """msprobe names a keyword-argument tensor by its keyword (``input.weight``), not by position."""
    import json

    t = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4], "Max": 1.0, "Min": 0.0,
         "Mean": 0.5, "Norm": 1.2}
    doc = {"task": "statistics", "data": {"Functional.layer_norm.0.forward": {
        "input_args": [t, [{"type": "int", "value": 4}]],
        "input_kwargs": {"weight": t, "bias": None, "eps": {"type": "float", "value": 1e-5}},
        "output": [t]}}}
    (tmp_path / "dump.json").write_text(json.dumps(doc))
    d = reader.read_dump(str(tmp_path / "dump.json"))
    ln = d.apis[0]
    assert [x.slot for x in ln.tensors] == ["input.0", "input.1.0", "input.weight", "input.eps", "output.0"]
    assert ln.tensors[0].extra["call"] == {"args": [{"t": "input.0"}, [4]],
                                           "kwargs": {"weight": {"t": "input.weight"}, "bias": None, "eps": 1e-5}}


def test_repeated_values_are_shared_and_extras_stay_dicts(tmp_path):
    """A big step's records share their dtype, shape and extra objects; an empty extra is a dict."""
    rank = tmp_path / "rank0"
    rank.mkdir()
    recs = [["Torch_relu_%d_forward_input.0" % k, 0, [], "torch.float32", [2, 3], [1.0, 0.0, 0.5, 1.0], {}]
            for k in range(3)]
    recs += [["Torch_relu_%d_forward_output.0" % k, 0, [], "torch.float32", [], [1.0] * 4,
              {"nan": 0, "inf": 0, "rg": True}] for k in range(3)]
    (rank / "all_dump.pkl").write_text("".join(records.encode_line(r) for r in recs))
    d = reader.read_dump(str(rank / "all_dump.pkl"), data_dir="")
    ts = [t for a in d.apis for t in a.tensors]
    assert all(type(t.extra) is dict for t in ts)
    ins = [t for t in ts if t.io == "input"]
    outs = [t for t in ts if t.io == "output"]
    assert ins[0].shape is ins[2].shape and ins[0].dtype is outs[1].dtype and ins[0].extra == {}
    assert outs[0].extra is outs[2].extra and outs[0].extra == {"nan": 0, "inf": 0, "rg": True}
    assert outs[1].shape == () and [t.slot for t in ins] == ["input.0"] * 3


def test_a_line_json_cannot_convert_is_skipped_as_corrupt(mlp_dump):
    # json.loads raises a plain ValueError (no .msg) for an integer past Python's digit limit
    pkl = reader.locate(str(mlp_dump)).path
    text = open(pkl).read().splitlines(keepends=True)
    text.insert(3, '["Torch_relu_0_forward_input.0", 0, [], "torch.float32", [2], [' + "1" * 5000 + ']]\n')
    open(pkl, "w").write("".join(text))
    d = reader.read_dump(str(mlp_dump))
    assert any(p.startswith(f"{pkl}:4: corrupt") and "digits" in p for p in d.problems)
    assert d.n_tensors == sum(len(a.tensors) for a in dumps.mlp_apis())
