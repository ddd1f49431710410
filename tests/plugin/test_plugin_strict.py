"""Strict by default, with pytester: a failing comparison never asserted fails the test; NaN/Inf the
bench does not show fails; the loss of tuple/dict/ModelOutput outputs is found (and a step that
cannot run backward says so); a non-module model gets a message; junit properties point only to
files that exist; a marker typo prints its error once."""
import re

import pytest

pytest_plugins = ["pytester"]

FLIPPED = """
import pytest
from netlib import make, train_step
from pytest_ptdbg import PrecisionError

def flipped(model, batch):
    return train_step(model, tuple(-b for b in batch))

def test_forgot_to_assert(ptdbg_dump):
    model, batch = make()
    ptdbg_dump.compare_runs(flipped, train_step, model, batch)

def test_expects_the_failure(ptdbg_dump):
    model, batch = make()
    ptdbg_dump.compare_runs(flipped, train_step, model, batch).expect_failure()

def test_raises(ptdbg_dump):
    model, batch = make()
    result = ptdbg_dump.compare_runs(flipped, train_step, model, batch)
    with pytest.raises(PrecisionError):
        result.assert_precision()

def test_expect_failure_of_a_pass_fails(ptdbg_dump):
    model, batch = make()
    ptdbg_dump.compare_runs(train_step, train_step, model, batch).expect_failure()
"""


def test_unasserted_failure_fails_the_test(tester):
    tester.makepyfile(test_s=FLIPPED)
    res = tester.runpytest("-p", "no:cacheprovider")
    res.assert_outcomes(passed=2, failed=2)
    res.stdout.fnmatch_lines([
        "*test_forgot_to_assert*",
        "*1 precision comparison(s) failed and the test never asserted them*",
        "*first suspect: *neg*"])
    res.stdout.fnmatch_lines(["FAILED test_s.py::test_forgot_to_assert*",
                              "FAILED test_s.py::test_expect_failure_of_a_pass_fails*"],
                             consecutive=False)
    out = res.stdout.str()
    assert "expected to fail but passed" in out
    assert "[expected by the test: it passed]" in out


MODELS = """
import torch
import torch.nn as nn
from transformers.modeling_outputs import CausalLMOutput


class Base(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.kind = kind

    def forward(self, x):
        logits = self.fc(x)
        loss = logits.pow(2).mean()
        if self.kind == "tuple":
            return loss, logits
        if self.kind == "dict":
            return {"logits": logits, "loss": loss}
        if self.kind == "modeloutput":
            return CausalLMOutput(loss=loss, logits=logits)
        return logits


def make(kind):
    torch.manual_seed(0)
    return Base(kind), (torch.randn(5, 4),)
"""


def test_loss_from_tuple_dict_modeloutput_and_loss_fn(tester):
    pytest.importorskip("transformers")
    tester.makepyfile(outs=MODELS)
    tester.makepyfile(test_l="""
        import pytest
        from outs import make

        @pytest.mark.parametrize("kind", ["tuple", "dict", "modeloutput"])
        def test_backward_runs(ptdbg_dump, kind):
            result = ptdbg_dump(*make(kind))
            assert (result.table["_direction"] == "backward").any(), kind
            assert not result.notes
            result.assert_precision()

        def test_loss_fn(ptdbg_dump):
            result = ptdbg_dump(*make("logits"), loss_fn=lambda out: out.sum())
            assert (result.table["_direction"] == "backward").any()
            result.assert_precision()

        def test_logits_only_says_forward_only(ptdbg_dump):
            result = ptdbg_dump(*make("logits"))
            assert not (result.table["_direction"] == "backward").any()
            assert "not a scalar loss" in result.notes[0]
            result.assert_precision()
    """)
    res = tester.runpytest("-p", "no:cacheprovider", "--ptdbg-dump-dir=d")
    res.assert_outcomes(passed=5)
    out = res.stdout.str()
    assert "PtdbgWarning: test_l.py::test_logits_only_says_forward_only: forward only: the " \
           "output is a tensor of shape [5, 3], not a scalar loss" in out
    res.stdout.fnmatch_lines(["PASS  test_l.py::test_logits_only_says_forward_only  (forward only: *"])


def test_non_module_model_gets_a_message(tester):
    tester.makepyfile(test_f="""
        import torch

        def my_function(x):
            return x.sum()

        def test_function(ptdbg_dump):
            ptdbg_dump(my_function, (torch.ones(3),))
    """)
    res = tester.runpytest("-p", "no:cacheprovider")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*model must be a torch.nn.Module (got function 'my_function')*"
                              "compare_runs(run, reference, *args)*"])
    assert "AttributeError" not in res.stdout.str()


def test_junit_report_property_only_for_kept_files(tester):
    tester.makepyfile(test_j=FLIPPED.split("def test_forgot")[0] + """
def test_pass(ptdbg_dump):
    model, batch = make()
    ptdbg_dump(model, batch).assert_precision()

def test_fail(ptdbg_dump):
    model, batch = make()
    ptdbg_dump.compare_runs(flipped, train_step, model, batch).assert_precision()
""")
    res = tester.runpytest("-p", "no:cacheprovider", "--junitxml=out.xml", "--ptdbg-dump-dir=d")
    res.assert_outcomes(passed=1, failed=1)
    xml = (tester.path / "out.xml").read_text()
    reports = re.findall(r'name="ptdbg_report" value="([^"]+)"', xml)
    assert len(reports) == 1 and reports[0].endswith(".html")
    assert (tester.path / reports[0]).is_file()
    passing = xml.split('name="test_pass"')[1].split("</testcase>")[0]
    assert "ptdbg_report" not in passing and 'name="ptdbg_verdict" value="passed"' in passing


def test_marker_typo_error_is_printed_once(tester):
    tester.makepyfile(test_m="""
        import pytest
        from netlib import make

        @pytest.mark.ptdbg(cosin=0.9)
        def test_typo(ptdbg_dump):
            ptdbg_dump(*make()).assert_precision()
    """)
    res = tester.runpytest("-p", "no:cacheprovider", "-rf")
    res.assert_outcomes(failed=1)
    out = res.stdout.str()
    assert out.count("unknown argument(s) 'cosin'") == 1, out


def test_nonfinite_on_the_device_side_only_fails(tester):
    tester.makepyfile(test_n="""
        import torch
        import torch.nn as nn

        def make(scale):
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 1))
            return model, (torch.randn(3, 4) * scale,)

        def step(model, batch):
            loss = model(*batch).pow(2).mean()
            loss.backward()
            return loss.detach()

        def test_overflow_in_float16_on_the_device_only(ptdbg_dump):
            # fp16 autocast overflows (|x| ~ 1e5 > 65504); the float32 bench does not
            ptdbg_dump(*make(1e5), step=step, dtype="float16", rule="dtype",
                       rtol=1.0, atol=1e9).assert_precision()

        def test_nan_on_both_sides_is_the_bench_showing_the_same(ptdbg_dump):
            model, batch = make(1.0)
            with torch.no_grad():
                model[1].bias.fill_(float("nan"))
            ptdbg_dump(model, batch, step=step).assert_precision()
    """)
    res = tester.runpytest("-p", "no:cacheprovider")
    res.assert_outcomes(passed=1, failed=1)
    res.stdout.fnmatch_lines(["*NaN/Inf check failed: the loss is NaN/Inf on the device (cpu "
                              "float16) side, finite on the bench (cpu) side*"])
