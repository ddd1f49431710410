import json
import os

import pytest

from pytest_ptdbg.format import records


@pytest.mark.parametrize(
    "name, expected",
    [
        ("Functional_conv2d_1_backward_input.0", ("Functional", "conv2d", 1, "backward", "input", (0,))),
        ("Tensor___getitem___0_forward_output.2.1", ("Tensor", "__getitem__", 0, "forward", "output", (2, 1))),
        ("Torch_batch_norm_12_forward", ("Torch", "batch_norm", 12, "forward", None, None)),
        ("Tensor.__getitem__.0.forward.input.0", ("Tensor", "__getitem__", 0, "forward", "input", (0,))),
        ("Distributed.all_reduce.3.forward", ("Distributed", "all_reduce", 3, "forward", None, None)),
        ("Tensor_add__0_forward_output.0", ("Tensor", "add_", 0, "forward", "output", (0,))),
    ],
)
def test_parse_name_from_the_right(name, expected):
    p = records.parse_name(name)
    assert (p.api_type, p.api_name, p.call_index, p.direction, p.io, p.index) == expected


def test_round_trip():
    key = records.tensor_key(records.api_key("Tensor", "__setitem__", 3, "backward"), "output", (1, 0))
    assert key == "Tensor___setitem___3_backward_output.1.0"
    assert records.parse_name(key).key == key


def test_bad_name_is_named():
    with pytest.raises(ValueError, match="Functional_conv2d"):
        records.parse_name("Functional_conv2d")


def test_line_round_trip_with_nan():
    rec = records.tensor_record("Torch_relu_0_forward_output.0", "torch.float32", [2, 3],
                                [float("nan"), 0.0, 1.0, 2.0], {"nan": 1})
    back = json.loads(records.encode_line(rec))
    assert back[0] == rec[0] and back[4] == [2, 3] and back[6] == {"nan": 1}


@pytest.mark.parametrize("bad", ["../x", "a/b", "..", ""])
def test_data_paths_never_leave_the_dir(tmp_path, bad):
    with pytest.raises(ValueError):
        records.safe_data_path(str(tmp_path), bad)
    assert records.safe_data_path(str(tmp_path), "Torch_relu_0_forward_output.0").startswith(str(tmp_path))
