"""Issue 20 acceptance, goldens: a respelled model passes its golden; a changed computation fails it.

The plugin's golden flow as a user meets it on a CPU-only machine (pytester, in-process inner
sessions): the golden of the inner test ``test_inner.py::test_step`` is written from the
**original** spelling of the identity model (``idmodel``), then the same test runs a variant
against it (``--ptdbg-golden-ci``: no golden is written). The inner test is ``ptdbg_dump(model,
batch, step=train_step).assert_precision()``, so each pure refactor must pass the original's
golden and each regression must fail it with the changed call named as the culprit.

The golden is created once per process (the first test that needs it runs the creating session)
and copied into each test's own folder: the same test file and node id, so the same golden.
"""
import pytest

from idmodel import REFACTORS, REGRESSIONS

pytest_plugins = ["pytester"]

INNER = '''
import os

import torch

from idmodel import make, train_step

torch.set_num_threads(1)


def test_step(ptdbg_dump):
    model, batch = make(os.environ.get("IDENTITY_VARIANT", ""))
    ptdbg_dump(model, batch, step=train_step).assert_precision()
'''

GOLDEN = "__ptdbg__/test_inner/test_step.golden.jsonl"

_created = {}


def _golden(tester, monkeypatch):
    """The original spelling's golden (bytes), created in ``tester``'s folder the first time."""
    if "bytes" not in _created:
        monkeypatch.setenv("IDENTITY_VARIANT", "")
        res = tester.runpytest("-p", "no:cacheprovider", "--ptdbg-update")
        res.assert_outcomes(passed=1)
        _created["bytes"] = (tester.path / GOLDEN).read_bytes()
    return _created["bytes"]


def _judge(tester, monkeypatch, variant):
    """Run ``variant`` against the original spelling's golden: (outcome counts, output)."""
    tester.makepyfile(test_inner=INNER)
    golden = _golden(tester, monkeypatch)
    path = tester.path / GOLDEN
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(golden)
    monkeypatch.setenv("IDENTITY_VARIANT", variant)
    res = tester.runpytest("-p", "no:cacheprovider", "--ptdbg-golden-ci")
    assert path.read_bytes() == golden            # judged against, never rewritten
    return res.parseoutcomes(), res.stdout.str()


@pytest.mark.parametrize("variant", REFACTORS)
def test_pure_refactor_passes_the_golden_of_the_original_spelling(variant, tester, monkeypatch):
    outcomes, out = _judge(tester, monkeypatch, variant)
    culprit = next((line.strip() for line in out.splitlines() if "culprit: " in line), "")
    assert outcomes.get("passed") == 1, f"{variant} failed its golden: {culprit}\n{out[-3000:]}"


def test_the_original_spelling_passes_its_own_golden(tester, monkeypatch):
    """The control (today's code passes it)."""
    outcomes, out = _judge(tester, monkeypatch, "")
    assert outcomes.get("passed") == 1, out[-3000:]


#: regression -> (the culprit's module path, what its API key contains)
#: where each regression's culprit is: the module path, and the operation (golden keys name calls
#: by operation: ``model.blocks.0/to#0``)
REGRESSION_CULPRITS = {
    "reg_ln_eps": ("model.blocks.0.ln1", ("layer_norm",)),
    "reg_softmax_fp16_nomax": ("model.blocks.0", ("/to#", "/exp#", "/softmax#")),
    "reg_bf16_roundtrip": ("model.blocks.0", ("/to#",)),
    "reg_gelu_tanh": ("model.blocks.0", ("gelu",)),
    "reg_scale_1001": ("model.blocks.0", ("mul",)),
}


@pytest.mark.parametrize("variant", REGRESSIONS)
def test_regression_fails_the_golden_naming_the_changed_call(variant, tester, monkeypatch):
    outcomes, out = _judge(tester, monkeypatch, variant)
    assert outcomes.get("failed") == 1, f"{variant} passed its golden"
    assert "golden check failed" in out, out[-3000:]
    culprit = next((line for line in out.splitlines() if "culprit: " in line), "")
    path, apis = REGRESSION_CULPRITS[variant]
    named = culprit.split("culprit: ", 1)[-1].split(" ", 1)[0]
    assert named.startswith(path + "/") and any(a in named for a in apis), \
        f"{variant}: culprit {named!r}, expected {path}/ with one of {apis}\n{out[-3000:]}"
