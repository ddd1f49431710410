"""hook_name="overflow_check" on real training steps: the API that first makes NaN/Inf is named."""
from __future__ import annotations

import json
import os

import pytest
import torch

from example_models.models import mlp, tiny_gpt, train_step
from pytest_ptdbg import PrecisionDebugger
from pytest_ptdbg.judge import replay
from pytest_ptdbg.sinks.overflow import (FINITE, INF, INPUTS_NONFINITE, NAN, PRODUCED, SAT, SATURATED,
                                          OverflowDetected, classify, tensor_status)
from pytest_ptdbg.repro.package import load_package
from pytest_ptdbg.format import records


def _run(tmp_path, hooks, overflow_nums=None, batch_fn=None, name="ov"):
    """One MLP training step under overflow_check with forward hooks planted on its layers."""
    model, batch = mlp()
    if batch_fn:
        batch = batch_fn(batch)
    handles = [getattr(model, layer).register_forward_hook(fn) for layer, fn in hooks]
    dbg = PrecisionDebugger(dump_path=str(tmp_path / name), hook_name="overflow_check", step=[0])
    if overflow_nums is not None:
        dbg.configure_hook(overflow_nums=overflow_nums)
    err = None
    dbg.start()
    try:
        train_step(model, batch)
    except OverflowDetected as e:
        err = e
    finally:
        dbg.stop()
        dbg.close()
        for h in handles:
            h.remove()
    rank_dir = records.rank_dir(str(tmp_path / name))
    index = os.path.join(rank_dir, "overflow_check", "overflow.json")
    events = json.load(open(index))["events"] if os.path.exists(index) else []
    return err, events


def _nan_hook(m, i, o):
    return (o - 10.0).log()  # every value of this layer is < 10: log of a negative number is NaN


def _saturate_hook(m, i, o):
    return (o * 1e6).clamp(-65504.0, 65504.0).half().float()  # reaches float16's largest finite value


def test_status_and_classification_by_hand():
    assert tensor_status(torch.tensor([1.0, -2.0])) == FINITE
    assert tensor_status(torch.tensor([float("inf"), float("nan")])) == NAN
    assert tensor_status(torch.tensor([float("-inf")])) == INF
    assert tensor_status(float("-inf")) == INF and tensor_status(2.0) == FINITE
    assert tensor_status(torch.tensor([65504.0, 1.0], dtype=torch.float16)) == SAT
    assert tensor_status(torch.tensor([65504.0], dtype=torch.float32)) == FINITE
    assert tensor_status(torch.tensor([2 ** 31 - 1], dtype=torch.int32)) == FINITE
    assert tensor_status(torch.empty(0)) == FINITE
    assert classify(FINITE, FINITE) is None
    assert classify(FINITE, NAN) == PRODUCED
    assert classify(SAT, INF) == PRODUCED
    assert classify(INF, NAN) == PRODUCED  # inf - inf: NaN made here
    assert classify(INF, INF) == INPUTS_NONFINITE  # an Inf passed on
    assert classify(NAN, NAN) == INPUTS_NONFINITE
    assert classify(FINITE, SAT) == SATURATED
    assert classify(SAT, SAT) is None


def test_planted_nan_in_forward_is_named(tmp_path):
    err, events = _run(tmp_path, [("fc2", _nan_hook)])
    assert err is not None
    (ev,) = events
    assert ev["api"] == "Tensor_log_0_forward" and ev["kind"] == PRODUCED
    msg = str(err)
    assert "Tensor_log_0_forward" in msg and ev["package"] in msg
    assert "rank 0" in msg and "each rank counts its own" in msg
    assert any(f[0].endswith("test_overflow.py") for f in ev["stack"])
    pkg = load_package(ev["package"])
    assert pkg.meta["overflow_kind"] == PRODUCED and pkg.stack
    res = replay(ev["package"])
    assert res.passed and res.identical  # same NaN at the same places


def test_planted_overflow_in_backward_is_named(tmp_path):
    # sqrt(relu(x)) is finite forward, but its gradient 1/(2 sqrt(0)) is infinite where relu cut
    err, events = _run(tmp_path, [("fc1", lambda m, i, o: torch.relu(o).sqrt())])
    assert isinstance(err, OverflowDetected)
    (ev,) = events
    assert ev["api"] == "Tensor_sqrt_0_backward" and ev["kind"] == PRODUCED
    pkg = load_package(ev["package"])
    assert pkg.keys("backward_input") == ["backward_input.0"]
    assert pkg.expected_keys == ["backward_output.0"]
    res = replay(ev["package"])
    assert res.identical, res.text()


def test_overflow_nums_counts_and_all(tmp_path):
    hooks = [("fc1", _saturate_hook), ("fc2", _nan_hook)]
    err, events = _run(tmp_path, hooks, overflow_nums=-1, name="all")
    assert err is None  # -1 records them all and never stops
    assert [(e["api"], e["kind"]) for e in events] == [("Tensor_half_0_forward", SATURATED),
                                                      ("Tensor_log_0_forward", PRODUCED)]
    assert [e["number"] for e in events] == [1, 2]
    err, events = _run(tmp_path, hooks, overflow_nums=2, name="two")
    assert err is not None and "overflow 2 of 2" in str(err) and len(err.events) == 2
    err, events = _run(tmp_path, hooks, overflow_nums=1, name="one")
    assert "Tensor_half_0_forward" in str(err) and len(events) == 1


def test_nan_in_the_data_is_traced_upstream(tmp_path):
    def poison(batch):
        x, y = batch
        x = x.clone()
        x[0, 0] = float("nan")
        return x, y

    err, events = _run(tmp_path, [], batch_fn=poison)
    (ev,) = events
    assert ev["api"] == "Functional_linear_0_forward" and ev["kind"] == INPUTS_NONFINITE
    assert "look upstream" in str(err)


def test_attention_mask_infinity_is_not_an_overflow(tmp_path):
    """tiny_gpt fills its causal mask with -inf on purpose (masked_fill(mask, float("-inf")))."""
    model, batch = tiny_gpt()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "gpt"), hook_name="overflow_check", step=[0])
    dbg.start()
    train_step(model, batch)  # raises OverflowDetected on a false alarm
    dbg.stop()
    dbg.close()
    assert not os.path.exists(os.path.join(records.rank_dir(str(tmp_path / "gpt")),
                                           "overflow_check", "overflow.json"))


def test_bad_overflow_nums(tmp_path):
    from types import SimpleNamespace

    from pytest_ptdbg.sinks.overflow import OverflowSink

    dbg = PrecisionDebugger(dump_path=str(tmp_path / "d"), hook_name="overflow_check", step=[0])
    with pytest.raises(ValueError, match="overflow_nums"):
        dbg.configure_hook(overflow_nums=0)
    with pytest.raises(ValueError, match="overflow_nums"):  # the sink checks too
        OverflowSink(config=SimpleNamespace(overflow_nums=-2), rank_dir=str(tmp_path / "r"))
