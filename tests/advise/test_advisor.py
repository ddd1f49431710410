"""The advisor's logic on hand-built compare tables: root cause vs inherited, ranking, kinds."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from locations import TESTS_DIR

from pytest_ptdbg.advise import advice_text as at
from pytest_ptdbg.advise.advisor import advise, row_errors
from synthetic import api, synthetic_table

NOISE = 1e-6
USER_STACK = [
    ["/usr/lib/python3/site-packages/torch/nn/modules/linear.py", 125, "forward", "return F.linear(x)"],
    ["/home/me/proj/model.py", 42, "forward", "h = self.fc2(x)"],
    ["/home/me/proj/train.py", 10, "main", "loss = model(x)"],
]


def _names(advice, kind=None):
    return [s.api for s in advice.suspects if kind is None or s.kind == kind]


def test_row_error_is_max_of_one_minus_cosine_and_rel_l2():
    t = synthetic_table([api("Torch_add_0_forward", [0.0, 1e-6], [2e-2])])
    t["Cosine"] = t["Cosine"].astype(object)
    t.loc[0, "Cosine"] = 0.5  # 1 - cos = 0.5 beats rel_l2 = 0
    t.loc[1, "Cosine"] = "Nan"  # text from the metric columns: ignored, rel_l2 used
    err = row_errors(t)
    assert err[0] == pytest.approx(0.5)
    assert err[1] == pytest.approx(1e-6)
    assert err[2] == pytest.approx(2e-2, rel=1e-3)


def test_row_error_unknown_measure_falls_back_to_verdict_and_nan_mismatch_is_inf():
    t = synthetic_table([api("Torch_add_0_forward", [0.0], [2e-2, 0.0], nan_out=[1])])
    t["Cosine"] = np.nan
    t.loc[0, "_rel_l2"] = np.nan
    t.loc[1, "_rel_l2"] = np.nan  # failing, no measure (e.g. shape mismatch) -> 1.0
    err = row_errors(t)
    assert err[0] == 0.0 and err[1] == 1.0 and math.isinf(err[2])


def test_root_cause_not_first_failing_row():
    # noise everywhere; linear_1 introduces 1e-2; everything after it inherits and fails too
    t = synthetic_table([
        api("Functional_linear_0_forward", [NOISE, NOISE], [NOISE]),
        api("Functional_gelu_0_forward", [NOISE], [2 * NOISE]),
        api("Functional_linear_1_forward", [2 * NOISE, NOISE], [1e-2], stack=USER_STACK),
        api("Torch_relu_0_forward", [1e-2], [1.2e-2]),
        api("Functional_linear_2_forward", [1.2e-2, NOISE], [1.5e-2]),
        api("Functional_cross_entropy_0_forward", [1.5e-2, 0.0], [3e-2]),
    ])
    adv = advise(t)
    first = adv.first
    assert first.api == "Functional_linear_1_forward"
    assert first.kind == "own" and first.direction == "forward"
    assert first.csv_line == 7 + 2  # 3 + 2 + 2 rows before its output row; header is line 1
    assert first.growth == pytest.approx(1e-2 / 2e-6, rel=1e-3)
    assert first.category == at.NONDETERMINISTIC
    assert "/home/me/proj/model.py:42" in first.location
    assert set(_names(adv, "inherited")) == {
        "Torch_relu_0_forward", "Functional_linear_2_forward", "Functional_cross_entropy_0_forward"}
    assert _names(adv, "own") == ["Functional_linear_1_forward"]
    assert not adv.all_agree
    txt = adv.text()
    head = txt.splitlines()[:3]
    assert head[0] == "Line: 9"
    assert head[1] == "Suspect Nodes: Functional_linear_1_forward"
    assert head[2].startswith("Expert Advice: ")
    assert "Inherited errors" in txt and "Torch_relu_0_forward" in txt
    assert "pass fractions" in txt


def test_backward_own_error_is_judged_on_incoming_gradient_and_forward_tensors():
    t = synthetic_table([
        api("Functional_linear_0_forward", [NOISE, NOISE], [NOISE]),
        api("Torch_tanh_0_forward", [NOISE], [NOISE]),
        api("Functional_mse_loss_0_forward", [NOISE, 0.0], [NOISE]),
        api("Functional_mse_loss_0_backward", [0.0], [NOISE]),
        api("Torch_tanh_0_backward", [NOISE], [5e-3]),  # planted: its backward is wrong
        api("Functional_linear_0_backward", [5e-3], [5e-3, 5e-3, 5e-3]),
    ])
    adv = advise(t)
    assert adv.first.api == "Torch_tanh_0_backward"
    assert adv.first.kind == "own"
    assert "gradient" in adv.first.advice and "backward" in adv.first.advice
    assert _names(adv, "inherited") == ["Functional_linear_0_backward"]


def test_backward_of_a_forward_fault_is_inherited_not_own():
    # forward fault in tanh; its backward reads the wrong forward output: inherited, not own
    t = synthetic_table([
        api("Torch_tanh_0_forward", [0.0], [1e-2]),
        api("Functional_mse_loss_0_forward", [1e-2, 0.0], [2e-2]),
        api("Functional_mse_loss_0_backward", [0.0], [2e-2]),
        api("Torch_tanh_0_backward", [0.0], [2e-2]),
    ])
    adv = advise(t)
    assert _names(adv, "own") == ["Torch_tanh_0_forward"]
    assert "Torch_tanh_0_backward" in _names(adv, "inherited")
    assert "Functional_mse_loss_0_backward" in _names(adv, "inherited")


def test_nan_first_appearing_ranks_first_and_downstream_nan_is_inherited():
    t = synthetic_table([
        api("Functional_linear_0_forward", [NOISE], [5e-2]),  # an own error, but no NaN
        api("Torch_exp_0_forward", [5e-2], [6e-2]),
        api("Torch_log_0_forward", [6e-2], [0.0], nan_out=[0]),  # NaN appears here
        api("Torch_sum_0_forward", [0.0], [0.0], nan_in=[0], nan_out=[0]),
    ])
    adv = advise(t)
    assert adv.first.api == "Torch_log_0_forward"
    assert adv.first.kind == "nonfinite"
    assert adv.first.category == at.NONFINITE and "NaN" in adv.first.advice
    assert math.isinf(adv.first.growth)
    assert adv.suspects[1].api == "Functional_linear_0_forward"
    assert "Torch_sum_0_forward" in _names(adv, "inherited")
    json.dumps(adv.to_dict(), allow_nan=False)  # JSON-able, strictly


def test_own_suspects_ranked_by_growth():
    t = synthetic_table([
        api("Torch_matmul_0_forward", [NOISE], [5e-3]),      # x5e3
        api("Torch_add_0_forward", [5e-3], [1e-1]),          # x20
        api("Torch_softmax_0_forward", [1e-1], [1e-1]),      # inherited
        api("Torch_sum_0_forward", [1e-1], [0.0]),           # passes: not listed
        api("Torch_mul_0_forward", [0.0], [3e-2]),            # x3e5: inputs exactly equal
    ])
    adv = advise(t)
    assert _names(adv, "own") == ["Torch_mul_0_forward", "Torch_matmul_0_forward", "Torch_add_0_forward"]
    assert _names(adv, "inherited") == ["Torch_softmax_0_forward"]
    assert "Torch_sum_0_forward" not in _names(adv)
    one = advise(t, top=1)
    assert one.suspects[0].api == "Torch_mul_0_forward"
    assert len(one.root_causes) == 1 and one.n_root_causes == 3
    assert "3 suspect call(s)" in one.text()


def test_noise_crossing_the_threshold_is_not_an_own_suspect():
    # a strict rule fails rows whose error only grew x1.5 from inputs: inherited, not own
    t = synthetic_table([
        api("Torch_add_0_forward", [2e-6], [3e-6], threshold=2.5e-6),
        api("Torch_mul_0_forward", [3e-6], [3e-6], threshold=2.5e-6),
    ])
    adv = advise(t)
    assert _names(adv, "own") == []
    assert adv.first.kind == "inherited" and adv.first.role == "negligible"
    assert adv.first.category == at.NEGLIGIBLE and "noise" in adv.first.advice
    assert adv.n_inherited == 2
    assert advise(t, min_growth=1.2).first.api == "Torch_add_0_forward"
    # a significant error that nothing recorded created: the inputs differ at the start
    t2 = synthetic_table([api("Torch_add_0_forward", [2e-3], [3e-3]),
                          api("Torch_mul_0_forward", [3e-3], [3e-3])])
    first = advise(t2).first
    assert first.kind == "inputs" and first.category == at.INPUTS_DIFFER


def test_clean_table_says_everything_agrees():
    t = synthetic_table([
        api("Functional_linear_0_forward", [NOISE, NOISE], [NOISE]),
        api("Functional_linear_0_backward", [0.0], [NOISE, NOISE, NOISE]),
    ])
    adv = advise(t)
    assert adv.suspects == [] and adv.first is None and adv.all_agree
    txt = adv.text()
    assert txt.splitlines()[:2] == ["Line: None", "Suspect Nodes: None"]
    assert "agree" in txt.splitlines()[2]
    assert adv.to_dict()["first"] is None


def test_optimizer_context_gets_optimizer_advice():
    t = synthetic_table([
        api("Functional_linear_0_backward", [0.0], [NOISE]),
        api("Torch__foreach_add__0_forward", [NOISE, NOISE], [4e-2], ctx="optimizer"),
    ])
    adv = advise(t)
    assert adv.first.api == "Torch__foreach_add__0_forward"
    assert adv.first.category == at.OPTIMIZER and adv.first.ctx == "optimizer"
    assert "lr" in adv.first.advice
    assert "optimizer step" in adv.text()


def test_unpaired_call_before_the_first_error_is_a_suspect():
    t = synthetic_table([
        api("Torch_relu_0_forward", [0.0], [0.0]),
        api("Tensor_to_0_forward", [0.0], [0.0], side="npu", dtype="torch.bfloat16"),
        api("Torch_matmul_0_forward", [3e-3, 0.0], [3e-3]),
        api("Torch_softmax_0_forward", [3e-3], [3e-3]),
        api("Tensor_contiguous_0_forward", [0.0], [0.0], side="bench"),
    ])
    adv = advise(t)
    assert adv.first.api == "Tensor_to_0_forward"
    assert adv.first.kind == "unpaired" and adv.first.side == "NPU"
    assert adv.first.category == at.UNPAIRED
    assert adv.first.csv_line == 4
    assert _names(adv, "inherited") == ["Torch_matmul_0_forward", "Torch_softmax_0_forward"]
    late = [s for s in adv.suspects if s.api == "Tensor_contiguous_0_forward"]
    assert late and late[0].side == "bench" and adv.suspects[-1] is late[0]
    assert adv.n_unpaired == 2


def test_unpaired_only_with_agreeing_tensors_still_reports_them():
    t = synthetic_table([
        api("Torch_relu_0_forward", [0.0], [0.0]),
        api("NPU_npu_fast_gelu_0_forward", [0.0], [0.0], side="npu"),
    ])
    adv = advise(t)
    assert adv.all_agree  # every compared tensor agrees...
    assert adv.first.kind == "unpaired"  # ...but a call has no partner


@pytest.mark.parametrize("key, kw, category, needle", [
    ("Functional_dropout_0_forward", {}, at.RANDOM, "seed"),
    ("Torch_rand_0_forward", {}, at.RANDOM, "eval"),
    ("Functional_batch_norm_0_forward", {}, at.BATCH_NORM, "running"),
    ("Distributed_all_reduce_0_forward", {}, at.COLLECTIVE, "compare_distributed"),
    ("Torch_matmul_0_forward", {"dtype": "torch.bfloat16"}, at.LOW_PRECISION, "bfloat16"),
    ("Functional_conv2d_0_backward", {}, at.NONDETERMINISTIC, "seed_all(mode=True)"),
    ("Functional_layer_norm_0_forward", {"dtype": "torch.float16"}, at.LOW_PRECISION, "float16"),
    ("Functional_log_softmax_0_forward", {}, at.REDUCTION, "accumulat"),
    ("Tensor___mul___0_forward", {}, at.COMPUTATION, "scope=[\"Tensor___mul___0_forward\"]"),
])
def test_category_and_advice_fit_the_api(key, kw, category, needle):
    adv = advise(synthetic_table([api(key, [0.0], [5e-2], **kw)]))
    assert adv.first.category == category
    assert needle in adv.first.advice


def test_missing_columns_are_named():
    t = synthetic_table([api("Torch_add_0_forward")]).drop(columns=["_passed"])
    with pytest.raises(ValueError, match="_passed"):
        advise(t)


def test_user_frame_skips_torch_and_tool_frames():
    stack = [["/x/site-packages/pytest_ptdbg/capture/hooks.py", 1, "wrapper", "f()"]] + USER_STACK
    assert at.user_frame(stack)[0] == "/home/me/proj/model.py"
    assert at.user_frame(None) is None
    assert at.format_frame(None) == "(no stack recorded)"


def test_advisor_does_not_import_torch():
    code = (f"import sys; sys.path.insert(0, {TESTS_DIR!r}); "
            "from pytest_ptdbg.advise.advisor import advise; "
            "from synthetic import synthetic_table, api; "
            "advise(synthetic_table([api('Torch_add_0_forward', [0.0], [1.0])])); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_amplifier_ranks_after_the_origin_it_received_error_from():
    # B grows its input error x5000, more than A's x1000, but its input error came from A
    t = synthetic_table([
        api("Torch_mul_0_forward", [1e-6], [1e-3], threshold=1e-4),             # A: origin
        api("Torch_exp_0_forward", [1e-3], [1e-3], threshold=1e-4),             # inherited
        api("Tensor_addcdiv__0_forward", [1e-3], [5.0], ctx="optimizer"),       # B: amplifier
        api("Torch_tanh_0_forward", [1e-6], [2e-4], threshold=1e-4),            # C: independent origin
    ])
    adv = advise(t)
    assert _names(adv, "own") == ["Torch_mul_0_forward", "Torch_tanh_0_forward",
                                  "Tensor_addcdiv__0_forward"]
    assert [s.role for s in adv.root_causes] == ["origin", "origin", "amplifier"]
    assert "amplifies" in adv.suspects[2].advice


def test_latent_origin_passing_its_own_tolerance_explains_a_later_failure():
    # a cast to float16 passes float16's tolerance; the float32 call after it fails with error
    # it only received: the cast is where the error was created
    t = synthetic_table([
        api("Torch_matmul_0_forward", [0.0, 0.0], [0.0]),
        api("Tensor_to_0_forward", [0.0], [2.4e-4], threshold=1e-3, dtype="torch.float16",
            bench_dtype="torch.float32"),
        api("Tensor_exp_0_forward", [2.4e-4], [5e-4], threshold=1e-3, dtype="torch.float16",
            bench_dtype="torch.float32"),
        api("Tensor_to_1_forward", [5e-4], [5e-4], threshold=1e-6),   # back to float32: fails
        api("Torch_add_0_forward", [5e-4, 0.0], [5e-4], threshold=1e-6),
        api("Torch_sigmoid_0_forward", [0.0], [1e-5], threshold=1e-3),  # passes, unrelated size
    ])
    adv = advise(t)
    first = adv.first
    assert first.api == "Tensor_to_0_forward" and first.kind == "own" and first.role == "latent"
    assert first.category == at.LOW_PRECISION and "Tensor_to_1_forward" in first.advice
    assert first.csv_line == 3 + 2 + 1  # its output row (it passes: the row of its largest error)
    assert _names(adv, "inherited") == ["Tensor_to_1_forward", "Torch_add_0_forward"]
    assert adv.suspects[1].advice.startswith("The error is inherited (from Tensor_to_0_forward)")
    # no failure to explain: a passing call with growth is never a suspect
    quiet = synthetic_table([api("Tensor_to_0_forward", [0.0], [2.4e-4], threshold=1e-3)])
    assert advise(quiet).suspects == []


def test_shape_mismatch_output_is_an_own_error_and_says_so():
    t = synthetic_table([api("Torch_matmul_0_forward", [0.0, 0.0], [0.0])])
    t.loc[2, ["Cosine", "_rel_l2", "_passed", "Err_message"]] = [
        np.nan, np.nan, False, "shape mismatch (Unmatched): NPU [4, 8] vs bench [8, 4]"]
    adv = advise(t)
    assert adv.first.kind == "own" and adv.first.output_error == 1.0
    assert adv.first.advice.startswith("The shapes differ from the bench (shape mismatch")


def test_nothing_compared_is_not_agreement():
    empty = synthetic_table([api("Torch_add_0_forward")]).iloc[0:0]
    adv = advise(empty)
    assert not adv.all_agree and adv.first is None
    assert "Nothing was compared" in adv.text()
    only_npu = advise(synthetic_table([api("Torch_add_0_forward", side="npu")]))
    assert not only_npu.all_agree and only_npu.first.kind == "unpaired"


def test_relu_gradient_flipping_a_few_elements_ranks_after_a_real_origin():
    # parameter noise moves a few pre-activations across 0: relu's gradient flips there
    t = synthetic_table([
        api("Functional_linear_0_forward", [NOISE, NOISE], [NOISE]),
        api("Functional_relu_0_forward", [NOISE], [NOISE]),
        api("Torch_mul_0_forward", [NOISE], [3e-3]),                 # the real fault, x3000
        api("Functional_relu_0_backward", [NOISE], [8e-3]),          # x8000, but only flips
    ])
    t.loc[t["NPU Name"] == "Functional_relu_0_backward_output.0", "One Thousandth Err Ratio"] = 0.999
    adv = advise(t)
    assert [(s.api, s.role) for s in adv.root_causes] == [
        ("Torch_mul_0_forward", "origin"), ("Functional_relu_0_backward", "sensitive")]
    relu = adv.root_causes[1]
    assert relu.category == at.DISCONTINUOUS and "0.10% of the elements" in relu.advice
    # when most elements are off, it is not a flip: plain ranking by growth
    t.loc[t["NPU Name"] == "Functional_relu_0_backward_output.0", "One Thousandth Err Ratio"] = 0.2
    assert advise(t).first.api == "Functional_relu_0_backward"


def test_text_stack_frames_are_understood():
    frames = ['File "/x/site-packages/torch/nn/functional.py", line 9, in linear, \n return f(x)',
              "File /proj/net.py, line 31, in forward, \n y = F.linear(x, w)"]
    assert at.as_frames(frames)[1] == ["/proj/net.py", 31, "forward", "y = F.linear(x, w)"]
    assert at.format_frame(at.user_frame(frames)) == "/proj/net.py:31 in forward: y = F.linear(x, w)"


def test_two_independent_origins_are_both_origins():
    # B comes after A, but its inputs carry only noise: it did not receive A's error
    t = synthetic_table([
        api("Torch_mul_0_forward", [NOISE], [1e-2]),
        api("Torch_exp_0_forward", [1e-2], [1e-2]),
        api("Torch_tanh_0_forward", [2 * NOISE], [5e-3]),
    ])
    adv = advise(t)
    assert [(s.api, s.role) for s in adv.root_causes] == [
        ("Torch_mul_0_forward", "origin"), ("Torch_tanh_0_forward", "origin")]
