"""Goldens the plugin wrote always read back; a crafted or corrupt golden is a failure naming its
file and line, never a traceback and never a pass (issue 18, items 5 and 6)."""
import json

import pytest

from pytest_ptdbg.plugin import golden

pytest_plugins = ["pytester"]

HEAD = golden.header("t.py::t", 0, "api_stack", "cpu")
KEY = "model.ln/layer_norm#0"
CALL = {"k": KEY, "api": "Functional_layer_norm", "args": {"eps": 1e-5},
        "forward": {"output.0": ["float32", [2, 4], [1.5, -1.5, 0.0, 2.8]]}}
OTHER = {"k": "model.fc/linear#0", "api": "Functional_linear", "args": {},
         "forward": {"output.0": ["float32", [2, 4], [1.0, -1.0, 0.0, 2.0]]}}


@pytest.mark.parametrize("sep", ["\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c", "\r"])
def test_line_separators_in_names_read_back(sep):
    lines = [dict(CALL, k=f"model.a{sep}b/linear#0"),
             dict(CALL, k=f"model.a{sep}c/linear#0",
                  forward={"input.input": f"@forward.output.0 model.a{sep}b/linear#0"})]
    text = golden.render(HEAD, lines)
    parsed = golden.parse(text, "g")
    assert parsed.lines == lines
    assert parsed.calls[1].tensors["forward.input.input"]["stats"] == [1.5, -1.5, 0.0, 2.8]


@pytest.mark.parametrize("stat,why", [
    ("NaN", "NaN is not JSON"), ("Infinity", "Infinity is not JSON"),
    ("-Infinity", "-Infinity is not JSON"), ("1e999", "out of range"),
    ('"abc"', "'abc' is not a number"), ('{"a": 1}', 'is not a number'),
    ("[1]", "is not a number")])
def test_crafted_statistics_name_the_line(stat, why):
    text = golden.render(HEAD, [OTHER, CALL]).replace("[1.5,-1.5,", f"[{stat},-1.5,")
    with pytest.raises(golden.GoldenError, match=r"^g:3: ") as exc:
        golden.parse(text, "g")
    assert why in str(exc.value)


@pytest.mark.parametrize("edit,why", [
    (lambda t: t.replace('[2,4]', '[2,-4]'), "not a list of sizes"),
    (lambda t: t.replace('[2,4]', '["2"]'), "not a list of sizes"),
    (lambda t: t.replace('"float32"', '7'), "'dtype' must be a string"),
    (lambda t: t.replace('"args":{"eps":1e-05}', '"args":[1e-05]'), "'args' must be an object"),
    (lambda t: t.replace('"output.0":"', '"output.0":"x').replace(
        '"forward":{"output.0":[', '"forward":{"input.input":"@forward.output.9 model.x/y#0","output.0":['),
     "refers to forward.output.9 of model.x/y#0, which the golden does not hold"),
    # the reference dump names its records after the api and the slots: names only
    (lambda t: t.replace('"Functional_linear"', '"../x y"'), "'api' must be a recorded API name"),
    (lambda t: t.replace('"forward":{"output.0":["float32",[2,4],[1.0',
                         '"forward":{"../output.0":["float32",[2,4],[1.0'), "not a tensor slot"),
])
def test_malformed_lines_name_the_line(edit, why):
    text = edit(golden.render(HEAD, [CALL, OTHER]))
    with pytest.raises(golden.GoldenError, match=r"^g:[23]: ") as exc:
        golden.parse(text, "g")
    assert why in str(exc.value)


def test_a_duplicated_call_line_is_corrupt():
    wrong = dict(CALL, forward={"output.0": ["float32", [2, 4], [123, -123, 5, 999]]})
    text = golden.render(HEAD, [wrong, OTHER, CALL])
    with pytest.raises(golden.GoldenError, match=r"^g:4: corrupt golden: call "
                                                 r"model.ln/layer_norm#0 is "
                                                 r"recorded twice \(first at line 2\)"):
        golden.parse(text, "g")


def test_a_version_1_golden_fails_naming_the_update():
    old = dict(HEAD, version=1)
    text = golden.render(old, [{"k": "model.ln/Functional_layer_norm#0", "t": "forward.output.0",
                                "dtype": "float32", "shape": [2], "stats": [1, 1, 1, 1]}])
    with pytest.raises(golden.GoldenError, match=r"^g:1: a golden of format version 1; .*--ptdbg-update"):
        golden.parse(text, "g")


def test_a_duplicated_member_is_corrupt():
    text = golden.render(HEAD, [OTHER, CALL]).replace('"forward":{', '"forward":{"output.0":[],', 2)
    with pytest.raises(golden.GoldenError, match=r"^g:2: corrupt golden: member 'output.0' appears "
                                                 r"twice"):
        golden.parse(text, "g")
    with pytest.raises(golden.GoldenError, match=r"^g:1: corrupt golden: member 'nodeid'"):
        golden.parse(golden.render(HEAD, []).replace('"nodeid"', '"nodeid":"x","nodeid"'), "g")


# ------------------------------------------------------------------ through the plugin

MODEL = '''
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.add_module("enc\\u2028oder\\x85x\\u2029", nn.Linear(8, 4))   # odd module names
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        return self.head(torch.tanh(getattr(self, "enc\\u2028oder\\x85x\\u2029")(x))).pow(2).mean()


def test_step(ptdbg_dump):
    torch.manual_seed(0)
    model, x = Net(), torch.randn(5, 8)
    ptdbg_dump(model, x, summary_only=True).assert_precision()
'''


@pytest.fixture
def gtester(tester, monkeypatch):
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    tester.makepyfile(test_odd=MODEL)
    return tester


def _golden_file(t):
    (path,) = sorted(t.path.rglob("*.golden.jsonl"))
    return path


def test_a_golden_with_odd_module_names_reads_back(gtester):
    gtester.runpytest("-p", "no:cacheprovider", "--ptdbg-update").assert_outcomes(passed=1)
    assert "\u2028" in _golden_file(gtester).read_text(encoding="utf-8")
    for _ in range(2):  # and no later session calls it unused
        res = gtester.runpytest("-p", "no:cacheprovider")
        res.assert_outcomes(passed=1)
        assert res.ret == 0
        res.stdout.fnmatch_lines(["*ptdbg goldens: 0 created, 0 updated, 1 unchanged, 0 differs, "
                                  "0 missing, 0 unused*"])


def _tensor_line(path):
    rows = path.read_text(encoding="utf-8").split("\n")
    n = next(i for i, r in enumerate(rows) if '"output.0":["float32",[5,4],[' in r)
    return rows, n


_STATS = '"output.0":["float32",[5,4],['



@pytest.mark.parametrize("craft", ["duplicate line", "duplicate member", "NaN", "1e999",
                                   "string", "dict"])
def test_a_corrupt_golden_fails_naming_file_and_line(gtester, craft):
    gtester.runpytest("-p", "no:cacheprovider", "--ptdbg-update").assert_outcomes(passed=1)
    path = _golden_file(gtester)
    rows, n = _tensor_line(path)
    real = json.loads(rows[n])
    if craft == "duplicate line":   # a wrong copy before the real one
        wrong = dict(real, forward=dict(real["forward"], **{"output.0": ["float32", [5, 4], [123, -123, 5, 999]]}))
        rows.insert(n, json.dumps(wrong, separators=(",", ":"), ensure_ascii=False))
    elif craft == "duplicate member":
        rows[n] = rows[n].replace(_STATS, '"output.0":[],' + _STATS)
    else:
        value = {"NaN": "NaN", "1e999": "1e999", "string": '"x"', "dict": '{"v":1}'}[craft]
        rows[n] = rows[n].replace(_STATS, _STATS + f'{value},', 1)
    path.write_text("\n".join(rows), encoding="utf-8")
    res = gtester.runpytest("-p", "no:cacheprovider")
    res.assert_outcomes(failed=1)
    out = res.stdout.str()
    assert "Traceback" not in out and "ValueError" not in out and "TypeError" not in out
    line = n + 2 if craft == "duplicate line" else n + 1
    res.stdout.fnmatch_lines([f"*golden of test_odd.py::test_step is unusable: {path}:{line}: *"])
    assert "PASS" not in out
