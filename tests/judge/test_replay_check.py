"""The advisor's replay check on a real model: own error vs error inherited from the inputs.

The "NPU" run of an MLP differs from the bench run in two ways: its first layer's weights carry
relative noise of 1e-6 (so every later API differs a little), and a cast after the last layer
goes through bfloat16 instead of float64 (an API that is imprecise by itself). Between them sits
a badly conditioned softmax over large logits, which amplifies the tiny upstream noise.
"""
from __future__ import annotations


import pytest

from real_dumps import dump_one_step, perturb
import torch
import torch.nn.functional as F

from example_models.models import mlp, train_step
from pytest_ptdbg import PrecisionDebugger
from pytest_ptdbg.judge.replay_check import check_apis, check_suspects, replay_section
from pytest_ptdbg.format import records


SCALE = 1000.0


def _dump(root, npu: bool) -> str:
    cast = torch.bfloat16 if npu else torch.float64

    def prepare(model):
        if npu:
            perturb(model, "fc1.weight", rel=1e-6)
        return [
            model.fc2.register_forward_hook(lambda m, i, o: F.softmax(o * SCALE, dim=-1)),
            model.fc3.register_forward_hook(lambda m, i, o: o.to(cast).to(torch.float32)),
        ]

    return dump_one_step(root, prepare=prepare).rank_dir


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    return _dump(tmp_path_factory.mktemp("npu"), True), _dump(tmp_path_factory.mktemp("bench"), False)


def test_own_and_inherited_errors_are_separated(dumps):
    npu, bench = dumps
    cast, soft_f, soft_b, lin_b = check_apis(
        ["Tensor_to_0_forward", "Functional_softmax_0_forward", "Functional_softmax_0_backward",
         "Functional_linear_1_backward"], npu, bench)
    # the bfloat16 cast: the bench's own call (to float64) on the NPU's inputs disagrees
    assert cast.verdict == "own" and cast.used_bench_call
    assert cast.own_error > 1e-3 and cast.own_error >= 0.9 * cast.observed_error
    assert cast.oracle_error > 1e-3 and cast.bench_oracle_error < 1e-12
    assert "imprecise" in cast.reason
    # the softmax computes exactly what the bench computes from the same inputs, but its output
    # (and its gradient) differs between the runs far more than its inputs did: amplified
    for v in (soft_f, soft_b):
        assert v.verdict == "inherited", v.text()
        assert v.own_error < 1e-9 and v.observed_error > 100 * v.own_error
    assert soft_f.amplification > 5 and "amplifies" in soft_f.reason and "Look upstream" in soft_f.reason
    # a backward suspect is re-run as forward + autograd.grad with the NPU's incoming gradient
    assert lin_b.verdict == "inherited" and lin_b.own_error < 1e-9
    assert set(lin_b.per_tensor) == {"backward_output.0", "backward_output.1", "backward_output.2"}


def test_check_suspects_from_the_advisor(dumps, tmp_path):
    from pytest_ptdbg.api import compare

    npu, bench = dumps
    res = compare({"npu_pkl_path": npu, "bench_pkl_path": bench, "is_print_compare_log": False},
                  str(tmp_path), rule="dtype")
    verdicts = check_suspects(res.advice, npu, bench, bench_device="cpu", top=8)
    by_api = {v.api: v for v in verdicts}
    assert by_api, res.advice.text()
    assert all(v.verdict in ("own", "inherited") for v in verdicts), replay_section(verdicts)
    # the planted cast is the only API with an error of its own; the rest only pass errors on
    assert by_api["Tensor_to_0_forward"].verdict == "own"
    assert [v.api for v in verdicts if v.verdict == "own"] == ["Tensor_to_0_forward"]
    assert any(v.verdict == "inherited" for v in verdicts)
    text = replay_section(verdicts)
    assert text.startswith("Replay check") and len(text.splitlines()) == len(verdicts) + 1


def test_unreplayable_suspects_say_why(dumps, tmp_path):
    npu, bench = dumps
    (missing,) = check_apis(["Functional_conv2d_0_forward"], npu, bench)
    assert missing.verdict == "unknown" and "not in the NPU dump" in missing.reason
    # a statistics-only dump has no tensors to re-run from
    model, batch = mlp()
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "stats"), hook_name="dump", step=[0])
    dbg.configure_hook(mode="api_stack", summary_only=True)
    dbg.start()
    train_step(model, batch)
    dbg.stop()
    dbg.close()
    stats = records.rank_dir(str(tmp_path / "stats"))
    (v,) = check_apis(["Functional_linear_0_forward"], stats)
    assert v.verdict == "unknown" and "summary_only=False" in v.reason
