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
    '["Torch_add_0_forward_input.0", 0, [], "torch.float32", [1], [1, 2, 3, 4], {"npy": "a.npy", "npy": ""}]\n',
    '["Torch_add_0_forward_input.0", 0, [], "torch.float32", [1], [1, 2, 3, 4], {"nan": 0, "npy": "a.npy"}]\n',
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
    assert taken == [True] * 4 + [False] * 9 + [True] * 3


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


@pytest.mark.parametrize("summary_only", [False, True], ids=["full", "statistics"])
def test_real_dump_reads_the_same_without_the_fast_path(dump_step, monkeypatch, summary_only):
    """A real step's records (naming their files, or statistics only: the fused path's two kinds)
    read the same through the fast path as through ``json.loads`` and every check."""
    d = dump_step("d", "tiny_gpt", summary_only=summary_only)
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
        assert (a.stack, a.ctx, a.family, a.order, a.sources) == (b.stack, b.ctx, b.family, b.order, b.sources)
        assert [[getattr(t, f) for f in fields] for t in a.tensors] == [[getattr(t, f) for f in fields]
                                                                         for t in b.tensors]
    assert fast.problems == slow.problems and not fast.problems
    assert fast.has_data == slow.has_data == (not summary_only)
    assert fast.missing_data == slow.missing_data == ""
    assert sum(1 for a in fast.apis if a.sources) > 20   # the dataflow came through
    assert os.path.basename(d.pkl) == records.pkl_name("api_stack")


def test_the_dataflow_moves_to_sources_and_repeated_calls_share_their_spec(dump_step):
    """A call spec's ``"src"`` names the producing call, so it differs from call to call: the
    reader moves it to ``ApiRec.sources`` (the same on the fast and the checked path) and the
    records of the same call made again share one extra object (a real dump, two layers)."""
    d = dump_step("d", "tiny_gpt")
    dump = reader.read_dump(d.pkl)
    with_src = {}
    with open(d.pkl, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            if len(rec) > 6 and isinstance(rec[6].get("call"), dict) and "src" in rec[6]["call"]:
                with_src[rec[0]] = rec[6]
    assert len(with_src) > 20
    by_name = {t.name: (a, t) for a in dump.apis for t in a.tensors}
    specs = {}
    for name, extra in with_src.items():
        a, t = by_name[name]
        call = dict(extra["call"])
        src = call.pop("src")
        assert t.extra["call"] == call and "src" not in t.extra["call"]
        assert {k: v for k, v in t.extra.items() if k not in ("call", "npy")} == \
            {k: v for k, v in extra.items() if k not in ("call", "npy")}
        assert a.sources == {k: tuple(v) for k, v in src.items()}
        specs.setdefault(json.dumps(t.extra, sort_keys=True), set()).add(id(t.extra))
    assert any(len(ids) == 1 for text, ids in specs.items()), "repeated specs are one object"
    # the checked path (a line the fast path declines: a leading space) reads the same spec and sources
    lines = open(d.pkl, encoding="utf-8").read().splitlines(keepends=True)
    slow = d.pkl + ".slow"
    with open(slow, "w", encoding="utf-8") as f:
        f.writelines(" " + x if not x.startswith(" ") else x for x in lines)
    other = reader._read_ptdbg(slow, None)
    assert [(a.key, a.sources, [t.extra for t in a.tensors]) for a in other.apis] == \
        [(a.key, a.sources, [t.extra for t in a.tensors]) for a in dump.apis]


#: tensor records of the writer's form, each odd in one way the fast path must treat as the
#: checked path does: contradictory statistics, a malformed call spec, a context, a dataflow
#: kept inside the spec, a key spelled with an escape, scatter's keyword named "src", ints and
#: bools as statistics, an empty extra, a record without one
_ODD_RECORDS = [
    '["Torch_add_0_forward_input.0", 0, [], "torch.float32", [2], [1.0, 2.0, 0.5, 1.0], {"nan": 0, "inf": 0, '
    '"call": {"args": [{"t": "input.0"}, {"t": "input.1"}], "kwargs": {}}}]',
    '["Torch_add_0_forward_input.1", 0, [], "torch.float32", [2], [1.0, 0.5, 0.75, -1.0], {"nan": 0, "inf": 0}]',
    '["Torch_add_0_forward_output.0", 0, [], "torch.float32", [2], [NaN, 0.5, 0.75, 1.0], {"nan": 0, "inf": 0}]',
    '["Torch_mul_0_forward_input.0", 0, [], "torch.float32", [2], [1.0, 0.5, 0.75, 1.0], {"nan": 0, "inf": 0, '
    '"call": {"args": 3, "kwargs": {}}}]',
    '["Torch_mul_0_forward_output.0", 0, [], "torch.float32", [2], [1.0, 0.5, 0.75, 1.0], {"nan": 0, "inf": 0, '
    '"ctx": "optimizer"}]',
    '["Torch_sub_0_forward_input.0", 0, [], "torch.float32", [2], [1.0, 0.5, 0.75, 1.0], {"nan": 0, "inf": 0, '
    '"call": {"args": [{"t": "input.0"}], "kwargs": {}, "src": {"input.0": ["Torch_mul_0_forward", "output.0"]}}}]',
    '["Torch_sub_0_forward_output.0", 0, [], "torch.float32", [2], [1.0, 0.5, 0.75, 1.0], {"nan": 0, '
    '"\\u006epy": "Torch_sub_0_forward_output.0.npy"}]',
    '["Torch_scatter_0_forward_input.0", 0, [], "torch.float32", [2], [1.0, 0.5, 0.75, 1.0], {"nan": 0, "inf": 0, '
    '"call": {"args": [{"t": "input.0"}, 0, {"t": "input.2"}], "kwargs": {"src": {"t": "input.3"}}, '
    '"src": {"input.0": ["Torch_sub_0_forward", "output.0"]}}}]',
    '["Torch_scatter_0_forward_output.0", 0, [], "torch.int64", [2], [3, 1, 2.0, 3.1622776601683795], '
    '{"nan": 0, "inf": 0}]',
    '["Torch_eq_0_forward_output.0", 0, [], "torch.bool", [2], [true, false, 0.5, 1.0], {"nan": 0, "inf": 0}]',
    '["Torch_eq_0_forward_input.0", 0, [], "torch.float32", [2], [1.0, 0.5, 0.75, 1.0], {}]',
    '["Torch_eq_0_forward_input.1", 0, [], "torch.float32", [2], [1.0, 0.5, 0.75, 1.0]]',
    '["Torch_eq_0_forward_input.2", 0, [], "torch.float32", [], [Infinity, 0.5, 0.75, 1.0], {"nan": 0, "inf": 1}]',
    '["Torch_eq_0_forward_stack_info", [["a.py", 1, "f", "x = a == b"]]]',
    # records naming their data file: there, missing, outside the folder, named twice, a nested "npy"
    '["Torch_div_0_forward_input.0", 0, [], "torch.float32", [2], [1.0, 0.5, 0.75, 1.0], {"nan": 0, "inf": 0, '
    '"rg": true, "npy": "Torch_div_0_forward_input.0.npy", "call": {"args": [{"t": "input.0"}, 2.0], "kwargs": {}, '
    '"src": {"input.0": ["Torch_eq_0_forward", "output.0"]}}}]',
    '["Torch_div_0_forward_input.1", 0, [], "float", [], [2.0, 2.0, 2.0, 2.0], {"nan": 0, "inf": 0}]',
    '["Torch_div_0_forward_output.0", 0, [], "torch.float32", [2], [0.5, 0.25, 0.375, 0.5], {"nan": 0, "inf": 0, '
    '"rg": true, "npy": "Torch_div_0_forward_output.0.npy"}]',
    '["Torch_div_1_forward_output.0", 0, [], "torch.float32", [2], [0.5, 0.25, 0.375, 0.5], {"nan": 0, "inf": 0, '
    '"npy": "../outside.npy"}]',
    '["Torch_div_2_forward_output.0", 0, [], "torch.float32", [2], [0.5, 0.25, 0.375, 0.5], {"nan": 0, "inf": 0, '
    '"npy": "a.npy", "npy": "Torch_div_2_forward_output.0.npy"}]',
    '["Torch_div_3_forward_input.0", 0, [], "torch.float32", [2], [0.5, 0.25, 0.375, 0.5], {"nan": 0, "inf": 0, '
    '"call": {"args": [{"t": "input.0"}], "kwargs": {"npy": "Torch_div_3_forward_input.0.npy"}}}]',
    '["Torch_div_4_forward_input.0", 0, [], "torch.float32", [2], [0.5, 0.25, -0.375, 0.5], {"nan": 0, "inf": 0, '
    '"npy": "Torch_div_4_forward_input.0.npy", "ctx": "optimizer", "call": {"args": 7, "kwargs": {}}}]',
    '["Torch_neg_0_forward_output.0", 0, [], "torch.float32", [2], [0.5, 0.25, 0.375, 0.5], '
    '{"npy": "Torch_neg_0_forward_output.0.npy"}]',
]


def _fields(dump):
    fields = ("name", "api", "io", "index", "direction", "dtype", "shape", "stats", "extra", "line", "data_file",
              "data_problem", "slot")
    return ([(a.key, a.stack, a.ctx, a.family, a.order, a.sources) for a in dump.apis],
            [[getattr(t, f) for f in fields] for a in dump.apis for t in a.tensors],
            [[type(v) for v in t.stats] for a in dump.apis for t in a.tensors], dump.problems, dump.notes)


def test_odd_records_read_the_same_on_the_fast_and_the_checked_path(tmp_path, monkeypatch):
    """Each odd record (those of call 0 twice: the second time, as call 5, its shared part is
    remembered) gives the same records, problems and notes with the fast path as with every line
    through ``json.loads``."""
    pkl = tmp_path / "api_stack_dump.pkl"
    lines = _ODD_RECORDS + [x.replace("_0_forward", "_5_forward") for x in _ODD_RECORDS if "_0_forward" in x]
    pkl.write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "api_stack_dump").mkdir()
    for f in ("Torch_eq_0_forward_input.1", "Torch_div_0_forward_input.0", "Torch_div_1_forward_output.0",
              "Torch_div_2_forward_output.0", "Torch_div_3_forward_input.0", "Torch_div_4_forward_input.0"):
        (tmp_path / "api_stack_dump" / f"{f}.npy").write_bytes(b"")
    fast = reader.read_dump(str(pkl))
    taken = [reader._FastLines().parse_split(x) is not None for x in lines]
    assert sum(taken) >= len(lines) - 6   # the odd records do take the fast path (the stack records not)

    class Never:
        @staticmethod
        def match(line):
            return None

    monkeypatch.setattr(reader, "_RECORD_LINE", Never)
    slow = reader.read_dump(str(pkl))
    assert _fields(fast) == _fields(slow)
    problems = "\n".join(fast.problems)
    for what in ("Torch_add_0_forward_input.1", "Torch_add_0_forward_output.0", "Torch_mul_0_forward_input.0",
                 "Torch_add_5_forward_input.1", "Torch_mul_5_forward_input.0"):
        assert f"record '{what}'" in problems      # negative norm, NaN counted as none, a bad call
    apis = {a.key: a for a in fast.apis}
    assert apis["Torch_mul_0_forward"].ctx == "optimizer"
    assert apis["Torch_sub_5_forward"].sources == {"input.0": ("Torch_mul_5_forward", "output.0")}
    assert apis["Torch_scatter_0_forward"].sources == {"input.0": ("Torch_sub_0_forward", "output.0")}
    sub_out = apis["Torch_sub_0_forward"].tensors[1]
    assert "npy" not in sub_out.extra and sub_out.data_problem   # the escaped key named a file: looked up
    div = apis["Torch_div_0_forward"]
    assert div.tensors[0].data_file and div.tensors[0].extra["npy"] == "Torch_div_0_forward_input.0.npy"
    assert div.sources == {"input.0": ("Torch_eq_0_forward", "output.0")} and "src" not in div.tensors[0].extra["call"]
    assert div.tensors[2].data_file is None and "not found" in div.tensors[2].data_problem
    assert "npy" not in div.tensors[2].extra   # (no call spec: the pooled extra, the name moved to data_file)
    assert "outside the data directory" in apis["Torch_div_1_forward"].tensors[0].data_problem
    assert apis["Torch_div_2_forward"].tensors[0].data_file.endswith("Torch_div_2_forward_output.0.npy")
    assert apis["Torch_div_4_forward"].ctx == "optimizer" and apis["Torch_div_4_forward"].tensors[0].data_file
    assert "record 'Torch_div_4_forward_input.0': malformed call spec" in problems
    assert "7 of the 10 records" in fast.missing_data   # (the file outside is a problem of its own)
    neg = apis["Torch_neg_0_forward"].tensors[0]
    assert neg.extra == {} and neg.extra is apis["Torch_neg_5_forward"].tensors[0].extra  # nothing but the file
