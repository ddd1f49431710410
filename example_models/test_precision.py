"""The example precision suite: what a user's precision regression tests look like.

Run it against the CPU bench (the README's main job)::

    pytest example_models --ptdbg-bench=cpu

- every example model's training step (forward, backward, optimizer step) in float32: on a
  machine without an accelerator (device and bench both the CPU) it is judged against its
  golden, committed in ``example_models/__ptdbg__/`` (``pytest example_models --ptdbg-update``
  writes the ones that changed); with an accelerator, against the CPU bench;
- bf16 autocast on the device under test against the float32 bench, for all four models, with
  default settings (every call replayed against a float64 oracle decides: a step fails only on a
  root cause);
- the same bf16 run under the dtype-aware rule with bf16 tolerances, and judged with float32's
  tolerances it fails at the first bf16 op (that is the format, not a bug);
- a planted precision fault (a softmax computed in float16 without max subtraction, in attention
  layer 1 of the tiny GPT) is caught and localised: the test asserts the failure and its suspect,
  so the suite stays green while showing what a failure looks like (its HTML report is kept).
"""
import pytest

import example_models as em
from pytest_ptdbg import PrecisionError
from pytest_ptdbg.format.records import parse_name

MODELS = ["mlp", "cnn", "tiny_gpt", "lstm"]


@pytest.mark.parametrize("name", MODELS)
def test_train_step_matches_bench_fp32(ptdbg_dump, name):
    model, batch = em.MODELS[name]()
    result = ptdbg_dump(model, batch, step=em.train_step, dtype="float32")
    result.assert_precision()


@pytest.mark.parametrize("name", MODELS)
def test_bf16_autocast_with_default_settings(ptdbg_dump, name):
    model, batch = em.MODELS[name]()
    result = ptdbg_dump(model, batch, step=em.train_step, dtype="bfloat16")
    result.assert_precision()


# bf16 tolerances (assert_close's rtol for bf16) for every tensor: under autocast the float32
# tensors downstream of a bf16 op carry bf16-sized errors too; a few elements near zero may
# exceed them (5%); the optimizer's first AdamW/SGD update is left out (it normalises tiny
# gradient differences into full-size steps).
@pytest.mark.ptdbg(rule="dtype", rtol=1.6e-2, atol=1e-3, max_fail_fraction=0.05,
                   ignore_optimizer=True)
@pytest.mark.parametrize("name", ["mlp", "lstm"])
def test_bf16_autocast_within_dtype_tolerances(ptdbg_dump, name):
    model, batch = em.MODELS[name]()
    result = ptdbg_dump(model, batch, step=em.train_step, dtype="bfloat16")
    result.assert_precision()
    if name == "mlp":  # the same run judged with float32's tolerances fails, at the first bf16 op
        with pytest.raises(PrecisionError, match="reduced-precision"):
            result.assert_precision(rtol=1.3e-6, atol=1e-5, max_fail_fraction=0.0)


def _plant_fault(model, batch):
    """The device under test's "kernel": softmax in float16 without max subtraction, layer 1."""
    em.set_faulty_softmax(model, layer=1)
    return em.train_step(model, batch)


@pytest.mark.ptdbg(rule="dtype", ignore_optimizer=True, keep="all")
def test_planted_softmax_fault_is_caught_and_localised(ptdbg_dump):
    model, batch = em.tiny_gpt()
    result = ptdbg_dump.compare_runs(_plant_fault, em.train_step, model, batch, dtype="float32")

    assert not result.passed
    with pytest.raises(PrecisionError) as failure:
        result.assert_precision()
    first = result.first_suspect
    # where: the softmax of the faulty layer. Layer 0's softmax makes the calls to #0, exp #0,
    # sum #0, div #0, to #1; layer 1's makes to #2 (the cast to float16), exp #1, sum #1, div #1,
    # to #3 (forward or backward, whichever the advisor ranks first)
    name = parse_name(first.api)
    layer1 = {"to": (2, 3), "exp": (1,), "sum": (1,), "div": (1,), "__truediv__": (1,)}
    assert name.call_index in layer1.get(name.api_name, ()), first.api
    assert "models.py" in first.location and " in softmax: " in first.location
    message = str(failure.value)
    assert f"first suspect: {first.api}" in message
    assert result.html_path and result.html_path in message
