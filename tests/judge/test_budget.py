"""The judge's numerical kernels (judge/budget.py) and tables, against hand-computed values."""
import math

import numpy as np

from pytest_ptdbg.judge import budget as B
from pytest_ptdbg.judge import not_judged as NJ
from pytest_ptdbg.judge.own_error import changed_arguments, lowered_precision


def test_own_error_and_budget_by_hand():
    o = np.array([3.0, 4.0])                      # ‖oracle‖ = 5
    r = o + np.array([0.0, 1e-6])                 # reference error 1e-6
    d = o + np.array([0.0, 4e-6])                 # own error 4e-6
    c = B.check_output("output.0", d, o, r, "torch.float32")
    assert math.isclose(c.own, 4e-6, rel_tol=1e-9) and math.isclose(c.reference, 1e-6, rel_tol=1e-9)
    assert c.scale == 5.0
    assert math.isclose(c.budget, 3e-6, rel_tol=1e-9) and c.over and math.isclose(c.ratio, 4 / 3, rel_tol=1e-9)
    assert math.isclose(c.relative, 4e-6 / 5, rel_tol=1e-9)
    # within 3x the reference: not over
    assert not B.check_output("output.0", o + np.array([0.0, 2e-6]), o, r, "torch.float32").over


def test_floor_is_one_rounding_at_the_inputs_scale_and_none_for_exact_results():
    o = np.array([1e-11, -1e-11])                 # a mathematically-zero bias gradient
    r = np.array([2e-12, 0.0])
    d = np.array([3e-11, -3e-11])                 # 20x the reference, far below input rounding
    c = B.check_output("backward_output.2", d, o, r, "torch.float32", input_rms=1e-3)
    assert math.isclose(c.budget, 2.0 ** -24 * 1e-3 * math.sqrt(2)) and not c.over
    exact = B.check_output("output.0", o * 1.0000001, o, o.copy(), "torch.bfloat16", input_rms=1.0)
    assert exact.budget == 0.0 and exact.over     # getitem/cat: a correct kernel is exact


def test_nonfinite_origin_only_where_the_replays_have_none():
    o = np.array([1.0, -np.inf, 2.0])             # masked_fill(-inf): every replay has it
    assert not B.check_output("o", o.copy(), o, o.copy(), "torch.float32").nonfinite_origin
    d = np.array([1.0, -np.inf, np.nan])
    c = B.check_output("o", d, o, o.copy(), "torch.float32")
    assert c.nonfinite_origin and c.ratio == math.inf


def test_unit_roundoff_and_masks():
    assert B.unit_roundoff("torch.bfloat16") == 2.0 ** -8 and B.unit_roundoff("float16") == 2.0 ** -11
    assert B.rms(np.array([3.0, -4.0, -3.4e38, np.inf])) == math.sqrt(12.5)   # finfo.min masks left out


def test_dropout_structure():
    x = np.array([1.0, 2.0, -3.0, 0.5])
    assert B.check_dropout("o", np.array([0.0, 4.0, -6.0, 0.0]), x, 0.5, "torch.float32").own == 0
    assert B.check_dropout("o", np.array([0.0, 4.0, -5.0, 0.0]), x, 0.5, "torch.float32").own == 1
    tiny = np.array([3.0398e-06], dtype=np.float64)   # float16 subnormal range rounds absolutely
    assert B.check_dropout("o", np.array([3.3975e-06]), tiny, 0.1, "torch.float16").own == 0


def test_index_ties_and_duplicates():
    v = np.array([[1.0, 5.0, 5.0], [2.0, 0.0, 1.0]])
    ok = B.check_indices("output.1", np.array([2, 0]), np.array([1, 0]), v, 1)   # a tie: 5 == 5
    assert ok.own == 0 and "ties" in ok.note
    bad = B.check_indices("output.1", np.array([0, 0]), np.array([1, 0]), v, 1)
    assert bad.own == 1
    assert B.has_duplicates(np.array([[0, 1], [0, 0]]), 0)          # column 0 repeats along dim 0
    assert not B.has_duplicates(np.array([[0, 1], [1, 0]]), 0)


def test_not_judged_table():
    assert NJ.special_of("Torch_empty").treatment == NJ.Treatment.UNINITIALISED
    assert NJ.special_of("Tensor_normal_").treatment == NJ.Treatment.RANDOM
    sdpa = NJ.special_of("Functional_scaled_dot_product_attention")
    assert NJ.probability_arg(sdpa, {"args": [1, 2, 3], "kwargs": {}}) == 0.0
    assert NJ.probability_arg(sdpa, {"args": [1, 2, 3, None, 0.1], "kwargs": {}}) == 0.1
    drop = NJ.special_of("Functional_dropout")
    assert NJ.probability_arg(drop, {"args": [{"t": "input.0"}], "kwargs": {"p": 0.2}}) == 0.2
    assert NJ.dim_arg(NJ.special_of("Tensor_topk"), {"args": ["x", 3], "kwargs": {}}) == -1
    assert NJ.special_of("Functional_linear") is None


def test_changed_arguments_and_lowered_precision():
    a = {"args": [{"t": "input.0"}, [32], None, None, 1e-05], "kwargs": {"_stacklevel": 3}}
    b = {"args": [{"t": "input.0"}, [32], None, None, 0.001], "kwargs": {}}
    assert changed_arguments(a, b) == ["argument 4: 1e-05 vs 0.001"]
    to16 = {"args": [{"t": "input.0"}, {"dtype": "torch.float16"}], "kwargs": {}}
    to32 = {"args": [{"t": "input.0"}, {"dtype": "torch.float32"}], "kwargs": {}}
    assert changed_arguments(to16, to32) == []                       # dtypes are judged apart
    assert lowered_precision(to16, to32, seen={"torch.float32"})      # a new, lower precision
    assert not lowered_precision(to16, to32, seen={"torch.float16"})  # follows the data (autocast)
    mean16 = {"args": [{"t": "input.0"}, -1], "kwargs": {"dtype": {"dtype": "torch.bfloat16"}}}
    assert lowered_precision(mean16, {"args": [{"t": "input.0"}, -1], "kwargs": {}}, seen={"torch.bfloat16"})
