"""The reader's fast path for record lines (``reader._FastLines``): exactly ``json.loads`` or None."""
import json
import os

import pytest

from pytest_ptdbg.dump import reader
from pytest_ptdbg.format import records


ODD = [
    '["Torch_add_0_forward_input.0", 0, [], "torch.float32", [2, 3], [1.5, -2, 0.25, 3e-05], {"nan": 0}]\n',
    '["Torch_add_0_forward_input.0", 1, [], "torch.float32", [2, 3], [NaN, Infinity, -Infinity, 1]]\n',
    '["Torch_add_0_forward_input.0", 0, [], "<class \'int\'>", [], [], {}]\n',
    '["Torch_add_0_forward_input.0", 0, [], "torch.float32", [], [1, 2, 3, 4], {"call": {"args": [{"t": "input.0"}, '
    '{"float": "nan"}], "kwargs": {"eps": 1e-05}}, "npy": "x.npy"}]\n',
    '["Torch_add_0_forward_input.0", 0, [], "torch.float32", [2], [1, 2, 3, 4], {"a": 1}, {"b": 2}]\n',  # 8 fields
    '["Torch_add_0_forward_input.0", 0, [], "torch.float32", [01], [1, 2, 3, 4]]\n',                    # bad JSON
    '["Torch_add_0_forward_input.0", 0, [], "torch.float32", [1], [1, 2, 3, 4], {"a": [}]\n',           # bad JSON
    '["Torch_add_0_forward_input.0", 0, [], "torch.float32", [1], [1, 2,, 4]]\n',                        # bad JSON
    '["Torch_add_\\u0030_forward_input.0", 0, [], "torch.float32", [1], [1, 2, 3, 4]]\n',                # an escape
    '["Torch_add_0_forward_input.0", 0, [], "torch.float32", [1], [1, 2, 3, 4], ' + "[" * 70 + "]" * 70 + "]\n",
    '["Torch_add_0_forward_input.0", 0, [], "torch.float32", [1], [1, 2, 3, 4], {"a": ' + "[" * 70 + "]" * 70 + "}]\n",
    '["Torch_add_0_forward_stack_info", [["a.py", 1, "f", "x"]]]\n',
    '  ["Torch_add_0_forward_input.0", 0, [], "torch.float32", [1], [1, 2, 3, 4]]\n',
    '["Torch_add_0_forward_input.0", 0, [], "torch.float32", [1], [1, 2, 3, 4]]',                        # no newline
]


@pytest.mark.parametrize("line", ODD)
def test_fast_path_is_json_loads_or_declines(line):
    fast = reader._FastLines()
    got = fast.parse(line)
    if got is None:
        assert not fast.hit
        return
    assert fast.hit
    assert got == json.loads(line)
    assert [type(v) for v in got[5]] == [type(v) for v in json.loads(line)[5]]   # 1 stays an int
    depth_ok = reader.nesting_ok(json.loads(line), reader.MAX_DEPTH)
    assert depth_ok


def test_the_writers_form_takes_the_fast_path_and_the_rest_declines():
    taken = [reader._FastLines().parse(line) is not None for line in ODD]
    assert taken == [True] * 4 + [False] * 9 + [True]


def test_too_deep_extra_is_left_to_the_checked_path():
    line = ODD[10]
    assert reader._FastLines().parse(line) is None
    assert not reader.nesting_ok(json.loads(line), reader.MAX_DEPTH)


def test_every_line_of_a_real_dump_parses_as_json_loads(dump_step):
    d = dump_step("d", "tiny_gpt")
    fast = reader._FastLines()
    n_fast = 0
    with open(d.pkl, encoding="utf-8") as f:
        for line in f:
            got = fast.parse(line)
            if got is not None:
                n_fast += 1
                assert got == json.loads(line)
    assert n_fast > 1000    # the writer's tensor records all take the fast path


def test_real_dump_reads_the_same_without_the_fast_path(dump_step, monkeypatch):
    d = dump_step("d", "tiny_gpt")
    fast = reader.read_dump(d.rank_dir)

    class Never:
        @staticmethod
        def match(line):
            return None

    monkeypatch.setattr(reader, "_RECORD_LINE", Never)
    slow = reader.read_dump(d.rank_dir)
    assert [a.key for a in fast.apis] == [a.key for a in slow.apis]
    fields = ("name", "api", "io", "index", "direction", "dtype", "shape", "stats", "extra", "line", "data_file",
              "data_problem", "slot")
    for a, b in zip(fast.apis, slow.apis):
        assert (a.stack, a.ctx, a.family, a.order) == (b.stack, b.ctx, b.family, b.order)
        assert [[getattr(t, f) for f in fields] for t in a.tensors] == [[getattr(t, f) for f in fields]
                                                                         for t in b.tensors]
    assert fast.problems == slow.problems and fast.has_data and slow.has_data
    assert os.path.basename(d.pkl) == records.pkl_name("api_stack")
