"""One verdict, said the same way in every output of compare() (issue 17), on real dumps.

* a clean CNN (conv -> BatchNorm) under bf16 autocast against its float32 bench: the bias
  gradients of the convs are zero in exact arithmetic, so their rounding fails ptdbg's per-tensor
  rule (cosine ~0.2, relative L2 ~1e3) while every call is within its own-error budget on
  replay: the judgement passes, and the advisor text, the HTML and the JSON name no suspect;
* an extra copy on the device side only (bookkeeping): the run passes, the call is no suspect;
  a value-changing cast on the device side only fails, said "device", not "NPU";
* two runs with different seeds: the inputs differ at the start, said as such (no "own error",
  no "wrong by itself", no "n/a" filler);
* a changed argument (gelu's approximate="tanh") found by the judgement only: no
  ``error n/a in -> n/a out (n/a)`` line.
"""
import json
import re

import pytest
import torch
import torch.nn.functional as F

from comparing import run_compare
from pytest_ptdbg.advise import advice_text as at
from pytest_ptdbg import PrecisionError, assert_precision
from real_dumps import dump_one_step, patched


def _bf16():
    return torch.autocast("cpu", dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def cnn_bf16(tmp_path_factory):
    root = tmp_path_factory.mktemp("cnn_bf16")
    dev = dump_one_step(root / "device", "cnn", seed=0, around=_bf16)
    bench = dump_one_step(root / "bench", "cnn", seed=0)
    return run_compare(dev, bench, root / "out")


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    root = tmp_path_factory.mktemp("seeds")
    dev = dump_one_step(root / "device", "mlp", seed=0)
    bench = dump_one_step(root / "bench", "mlp", seed=1)
    return run_compare(dev, bench, root / "out")


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def _text_of_html(html):
    return re.sub(r"<[^>]+>", " ", html.split("<style>")[0] + html.split("</style>")[-1])


def test_a_passing_judgement_names_no_suspect_anywhere(cnn_bf16):
    r = cnn_bf16
    table = r.table
    zero_bias = table[table["NPU Name"].astype(str).str.match(r"Functional_conv2d_\d_backward_output\.2")]
    # the bias gradients really fail ptdbg's per-tensor rule, and the judgement still passes
    assert len(zero_bias) == 2 and (~zero_bias["_passed"].astype(bool)).all()
    assert r.passed and r.judgement.passed and r.judgement.replay is not None
    assert r.first_suspect is None and r.advice.first is None and r.advice.root_causes == []
    from pytest_ptdbg.advise.advisor import decide

    d = decide(r.advice)
    assert d.passed and d.first is None
    text = _read(r.advisor_path)
    assert text.splitlines()[:2] == ["Line: None", "Suspect Nodes: None"]
    assert "Fix the root cause" not in text and "Ranked suspects" not in text
    assert "passes the judgement" in text and "zero in exact arithmetic" in text
    # the calls behind the failing rows are listed as differences the verdict explains
    explained = text.split("Differences the verdict explains")[1].split("Judgement:")[0]
    assert "Functional_conv2d_0_backward" in explained and "Functional_conv2d_1_backward" in explained
    assert "0 suspect call(s)" in text
    html = _read(r.html_path)
    assert "First suspect" not in html and 'class="banner good"' in html
    assert "No suspect." in html and "Differences the verdict explains" in html
    assert '<div class="card' not in html
    doc = json.loads(json.dumps(r.advice.to_dict()))
    assert doc["passed"] is True and doc["first"] is None and doc["n_root_causes"] == 0


def test_the_same_advice_with_a_failing_gate_names_its_first_suspect(cnn_bf16):
    """decide() is the one place: under a gate that fails the same table, the top suspect is named
    (in the text, the HTML and the JSON alike)."""
    from pytest_ptdbg.report.html_report import render_html
    import dataclasses

    failed = dataclasses.replace(cnn_bf16.advice, passed=False)
    first = failed.first
    assert first is not None and first.api.startswith("Functional_conv2d_")
    assert failed.text().splitlines()[1] == f"Suspect Nodes: {first.api}"
    assert failed.to_dict()["first"] == first.api
    assert f"<b>First suspect:</b> <span class=\"mono\">{first.api}</span>" in \
        render_html(cnn_bf16.table, failed)


def test_a_copy_on_the_device_side_only_is_no_suspect_of_a_passing_run(dump_step, compare_pair):
    def extra_copy(model):
        first = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
        return [first.register_forward_pre_hook(lambda mod, args: (args[0].clone(),))]

    dev = dump_step("device", "mlp", seed=0, prepare=extra_copy)
    bench = dump_step("bench", "mlp", seed=0)
    r = compare_pair(dev, bench)
    assert r.advice.n_unpaired == 1 and r.passed
    assert r.first_suspect is None and r.advice.root_causes == []
    text = _read(r.advisor_path)
    assert "Suspect Nodes: None" in text and "Ranked suspects" not in text
    assert "Tensor_clone_0_forward" in text.split("Differences the verdict explains")[1]
    assert "NPU" not in text.replace("NPU Name", "")  # both sides are CPUs
    assert "only on the device side" in text
    html = _read(r.html_path)
    assert "First suspect" not in html and '<div class="card' not in html


def test_a_cast_on_the_device_side_only_is_said_device_not_npu(dump_step, compare_pair):
    def lossy_cast(model):
        first = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
        return [first.register_forward_pre_hook(lambda mod, args: (args[0].half().float(),))]

    dev = dump_step("device", "mlp", seed=0, prepare=lossy_cast)
    bench = dump_step("bench", "mlp", seed=0)
    r = compare_pair(dev, bench)
    assert not r.passed and r.first_suspect.api == "Tensor_half_0_forward"
    assert r.first_suspect.kind == "unpaired"
    text = _read(r.advisor_path)
    assert "only on the device side" in text and "This call runs only on the device side (value-changing" in text
    # ptdbg's CSV column names keep ptdbg's spelling; nothing else says NPU of two CPUs
    assert "NPU" not in text.replace("NPU max", "").replace("NPU min", "")
    html = _text_of_html(_read(r.html_path))
    assert "only on the device side" in html
    assert "NPU" not in re.sub(r"NPU (Name|max|min|mean|l2norm|Tensor \w+)", "", html)


def test_inputs_that_differ_at_the_start_are_said_as_such(seeds):
    r = seeds
    assert not r.passed
    (cause,) = r.judgement.root_causes
    assert str(cause.cause) == "inputs differ at the start"
    first = r.first_suspect
    assert first.api == cause.api and first.kind == "inputs"
    assert first.category == at.INPUTS_DIFFER and first.fault == "inputs differ at the start"
    for words in ("the data, the initial weights or the random state differ", "seed_all(seed)",
                  "load the same weights"):
        assert words in first.advice
    text = _read(r.advisor_path)
    assert text.splitlines()[1] == f"Suspect Nodes: {first.api}"
    for wrong in ("wrong by itself", "wrong formula", "n/a", "own error;"):
        assert wrong not in text, wrong
    assert f"1. {first.api}  [inputs differ at the start; forward]" in text
    html = _read(r.html_path)
    assert "inputs differ at the start" in html and "n/a" not in _text_of_html(html)
    assert "wrong by itself" not in html
    with pytest.raises(PrecisionError) as err:
        assert_precision(r)
    msg = str(err.value)
    assert f"first suspect: {first.api} (forward, inputs differ at the start)" in msg
    assert "wrong by itself" not in msg and "n/a" not in msg and ", own," not in msg


def test_a_changed_argument_found_by_the_judgement_writes_no_unknown_numbers(dump_step, compare_pair):
    gelu = F.gelu
    tanh = patched(F, "gelu", lambda x, approximate="none": gelu(x, approximate="tanh"))
    dev = dump_step("device", "tiny_gpt", seed=0, around=lambda: tanh)
    bench = dump_step("bench", "tiny_gpt", seed=0)
    r = compare_pair(dev, bench)
    first = r.first_suspect
    assert not r.passed and "_gelu_0_forward" in first.api and first.fault == "changed argument"
    assert "approximate" in first.advice
    text = _read(r.advisor_path)
    assert "n/a" not in text, [line for line in text.splitlines() if "n/a" in line]
    html = _text_of_html(_read(r.html_path))
    assert "n/a" not in html
