import os

from pytest_ptdbg import parse
from pytest_ptdbg.format import records

import dumps
from comparing import input_param_for


def test_parse_prints_stack_and_statistics(tmp_path, capsys):
    dumps.write_dump(str(tmp_path), dumps.mlp_apis())
    pkl = os.path.join(records.rank_dir(str(tmp_path), 0, 0), "api_stack_dump.pkl")
    found = parse(pkl, "Torch_relu_0_forward")
    out = capsys.readouterr().out
    assert [f["name"] for f in found] == ["Torch_relu_0_forward_input.0", "Torch_relu_0_forward_output.0"]
    assert "Stack Info of Torch_relu_0_forward:" in out
    assert "File model.py, line 12, in forward" in out and "x = f(x)" in out
    f = found[0]
    assert (f"[Torch_relu_0_forward_input.0][dtype: torch.float32][shape: [8, 16]]"
            f"[max: {f['max']}][min: {f['min']}][mean: {f['mean']}]") in out
    assert "Torch_relu_0_backward" not in out


def test_parse_tensor_prefix_and_no_match(tmp_path, capsys):
    dumps.write_dump(str(tmp_path), dumps.mlp_apis())
    found = parse(str(tmp_path), "Functional_linear_1_backward_output.1")
    assert [f["name"] for f in found] == ["Functional_linear_1_backward_output.1"]
    assert parse(str(tmp_path), "Torch_nothing") == []
    assert "no record" in capsys.readouterr().out


def test_parse_name_works_whatever_was_imported_first(tmp_path, capsys):
    import pytest_ptdbg
    import pytest_ptdbg.comparison.table  # noqa: F401  (binds the package attribute "compare")
    import pytest_ptdbg.parsing  # noqa: F401

    dumps.write_dump(str(tmp_path), dumps.mlp_apis())
    assert pytest_ptdbg.parse(str(tmp_path), "Torch_relu_0_forward")
    r = pytest_ptdbg.compare(input_param_for(str(tmp_path), str(tmp_path)), str(tmp_path / "out"))
    assert r.passed
