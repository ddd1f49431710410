"""One verdict in every output of a pytest session (issue 17): the PASS/FAIL line, the JSON
summary, ``index.html`` and the comparison's own reports say the same first suspect.

The inner session runs the example CNN (conv -> BatchNorm, whose conv bias gradients are zero in
exact arithmetic) under bf16 autocast against the float32 bench: the judgement passes it while
those gradients fail ptdbg's per-tensor rule (cosine ~0.2, relative L2 ~1e3); the MLP with an
extra copy on the device side only (bookkeeping: it passes); and the MLP with other weights on
the device: its inputs differ at the start.
"""
import json
import os
import re

pytest_plugins = ["pytester"]

TESTS = """
import example_models as em
import pytest
from pytest_ptdbg import PrecisionError

@pytest.mark.ptdbg(keep="all")
def test_cnn_bf16(ptdbg_dump):
    model, batch = em.cnn()
    ptdbg_dump(model, batch, step=em.train_step, dtype="bfloat16").assert_precision()

def _with_a_copy(model, batch):
    # the implementation under test copies the first layer's input: a call on its side only
    # that changes no value (bookkeeping)
    handle = model.fc1.register_forward_pre_hook(lambda mod, args: (args[0].clone(),))
    try:
        return em.train_step(model, batch)
    finally:
        handle.remove()

def test_extra_copy(ptdbg_dump):
    model, batch = em.mlp()
    ptdbg_dump.compare_runs(_with_a_copy, em.train_step, model, batch).assert_precision()

def test_other_weights(ptdbg_dump):
    model, batch = em.mlp()
    other, _ = em.mlp(seed=1)   # built before the step: the step itself makes the same calls
    result = ptdbg_dump.compare_runs(lambda m, b: em.train_step(other, b), em.train_step,
                                     model, batch)
    with pytest.raises(PrecisionError) as err:
        result.assert_precision()
    print("MESSAGE<<" + str(err.value) + ">>MESSAGE")
"""


def _rows(index_html):
    out = {}
    for row in re.findall(r"<tr class=\"[a-z]*\">(.*?)</tr>", index_html):
        cells = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td>(.*?)</td>", row)]
        out[cells[0]] = cells
    return out


def test_terminal_json_index_and_reports_say_one_verdict(tester):
    tester.makepyfile(test_v=TESTS)
    dump = tester.path / "dumps"
    res = tester.runpytest("-s", f"--ptdbg-dump-dir={dump}", "--ptdbg-bench=cpu", "--ptdbg-device=cpu")
    res.assert_outcomes(passed=3)
    out = res.stdout.str()
    with open(os.path.join(dump, "ptdbg_summary.json"), encoding="utf-8") as f:
        doc = json.load(f)
    entries = {t["nodeid"].split("::")[1]: t for t in doc["tests"]}
    with open(os.path.join(dump, "index.html"), encoding="utf-8") as f:
        index = _rows(f.read())
    lines = {name: next(line for line in out.splitlines() if line.startswith(("PASS", "FAIL"))
                        and f"::{name}" in line) for name in entries}

    # the passing CNN: no suspect in the JSON, the terminal, index.html or its own reports
    cnn = entries["test_cnn_bf16"]
    assert cnn["verdict"] == "passed" and cnn["first_suspect"] is None and cnn["suspects"] == []
    assert "first suspect: none" in lines["test_cnn_bf16"]
    row = index["test_v.py::test_cnn_bf16"]
    assert row[1] == "passed" and row[4] == "" and row[5] == ""
    with open(cnn["advisor"], encoding="utf-8") as f:
        assert f.read().splitlines()[1] == "Suspect Nodes: None"
    with open(cnn["html"], encoding="utf-8") as f:
        assert "First suspect" not in f.read()
    # its PASS line says what the verdict rested on (the call closest to its own-error budget),
    # not the alarming metrics of a zero gradient's rounding
    worst = cnn["worst"]
    assert worst["ratio"] is not None and 0 < worst["ratio"] <= 1 and "cosine" not in worst
    assert "closest to budget: " in lines["test_cnn_bf16"] and "of its budget)" in lines["test_cnn_bf16"]
    assert "cosine=" not in lines["test_cnn_bf16"] and "rel_l2=" not in lines["test_cnn_bf16"]
    assert "of its budget" in row[3]

    # a copy on the device side only: no suspect in the JSON, the terminal or index.html
    copy = entries["test_extra_copy"]
    assert copy["verdict"] == "passed" and copy["first_suspect"] is None and copy["suspects"] == []
    assert "first suspect: none" in lines["test_extra_copy"]
    row = index["test_v.py::test_extra_copy"]
    assert row[1] == "passed" and row[4] == "" and row[5] == ""

    # the other weights: the same first suspect everywhere, said as inputs that differ
    other = entries["test_other_weights"]
    first = other["first_suspect"]
    assert other["verdict"] == "failed" and first["kind"] == "inputs"
    assert first["category"] == "inputs differ at the start"
    assert f"first suspect: {first['api']} (" in lines["test_other_weights"]
    row = index["test_v.py::test_other_weights"]
    assert row[1] == "failed" and row[4] == first["api"]
    with open(other["advisor"], encoding="utf-8") as f:
        text = f.read()
    assert text.splitlines()[1] == f"Suspect Nodes: {first['api']}"
    with open(other["html"], encoding="utf-8") as f:
        assert f'<b>First suspect:</b> <span class="mono">{first["api"]}</span>' in f.read()
    message = out.split("MESSAGE<<")[1].split(">>MESSAGE")[0]
    assert f"first suspect: {first['api']} (forward, inputs differ at the start)" in message
    assert "seed_all(seed)" in message and "load the same weights" in message
    for wrong in ("wrong by itself", "wrong formula", "n/a", ", own,"):
        assert wrong not in message and wrong not in text, wrong
