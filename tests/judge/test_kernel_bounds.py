"""The budget's bounds for any correct kernel (issue 22), against hand-computed values.

``budget.order_bound`` (a sum of n terms in any order), ``budget.libm_bound`` (a libm-style
function within 2 ulp), ``budget.accumulator_roundoff`` and their use by ``budget.judged``;
``algorithms.kernel_bound`` on small call records (a linear, a sum, a softmax, an exp).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_ptdbg.judge import algorithms as A
from pytest_ptdbg.judge import budget as B

U32 = 2.0 ** -24


def test_accumulator_roundoff_is_float32s_for_half_precisions():
    assert B.accumulator_roundoff("torch.bfloat16") == U32
    assert B.accumulator_roundoff("torch.float16") == U32
    assert B.accumulator_roundoff("torch.float32") == U32
    assert B.accumulator_roundoff("torch.float64") == 2.0 ** -53


def test_order_bound_hand_computed():
    # 2 x sqrt(16 - 1) x 2**-24 x 3.0
    assert B.order_bound(16, U32, 3.0) == pytest.approx(2 * math.sqrt(15) * U32 * 3.0, rel=1e-15)
    assert B.order_bound(5, 0.5, 2.0, units=1.0) == pytest.approx(2.0, rel=1e-15)   # sqrt(4) x 0.5 x 2
    assert B.order_bound(1, U32, 3.0) == 0.0        # one term: nothing added
    assert B.order_bound(100, U32, 0.0) == 0.0
    assert B.order_bound(100, U32, math.inf) == 0.0  # no magnitude known: no bound


def test_libm_bound_hand_computed():
    assert B.libm_bound(10.0, U32) == pytest.approx(2 * 2 * U32 * 10.0, rel=1e-15)   # 2 ulp <= 4u|x|
    assert B.libm_bound(0.0, U32) == 0.0


def test_judged_takes_the_kernel_bound_as_the_least_budget():
    # reference error 1e-7 -> 3e-7; floor 1 u x 1.0 = 6e-8; a kernel bound of 1e-6 decides
    c = B.judged("output.0", 8e-7, 1e-7, 1.0, 4, "torch.float32", kernels=1e-6)
    assert c.budget == 1e-6 and not c.over and c.ratio == pytest.approx(0.8)
    old = B.judged("output.0", 8e-7, 1e-7, 1.0, 4, "torch.float32")
    assert old.budget == pytest.approx(3e-7) and old.over
    # a smaller kernel bound changes nothing
    assert B.judged("output.0", 8e-7, 1e-7, 1.0, 4, "torch.float32", kernels=1e-9).budget == pytest.approx(3e-7)


def _norm(arrays):
    return lambda k: float(np.linalg.norm(np.asarray(arrays[k], dtype=np.float64)))


def test_kernel_bound_of_a_linear_forward_and_its_gradients():
    x = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)      # 2 rows, K = 2
    w = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]], dtype=np.float32)   # 3 outputs
    g = np.ones((2, 3), dtype=np.float32)
    arrays = {"input.0": x, "input.1": w, "output.0": x @ w.T, "backward_input.0": g}
    spec = {"args": [{"t": "input.0"}, {"t": "input.1"}], "kwargs": {}}
    # spread^2 = sum_k |x[:, k]|^2 |w[:, k]|^2 = (1+9)(1+0+1) + (4+16)(0+4+1) = 20 + 100
    got = A.kernel_bound("linear", spec, arrays, _norm(arrays), "output.0", 5.0, "torch.float32")
    assert got == pytest.approx(2 * math.sqrt(1) * U32 * (5.0 + math.sqrt(120.0)), rel=1e-12)
    # the same under bf16 autocast: the accumulator is float32
    assert A.kernel_bound("linear", spec, arrays, _norm(arrays), "output.0", 5.0, "torch.bfloat16") == got
    # dX = G @ W over the 3 outputs: spread^2 = sum_j |g[:, j]|^2 |w[j, :]|^2 = 2 x (1 + 4 + 2) = 14
    dx = A.kernel_bound("linear", spec, arrays, _norm(arrays), "backward_output.0", 1.0, "torch.float32")
    assert dx == pytest.approx(2 * math.sqrt(2) * U32 * (1.0 + math.sqrt(14.0)), rel=1e-12)
    # dW = G^T @ X over the 2 rows: spread^2 = sum_i |g[i, :]|^2 |x[i, :]|^2 = 3 x 5 + 3 x 25 = 90
    dw = A.kernel_bound("linear", spec, arrays, _norm(arrays), "backward_output.1", 1.0, "torch.float32")
    assert dw == pytest.approx(2 * math.sqrt(1) * U32 * (1.0 + math.sqrt(90.0)), rel=1e-12)


def test_kernel_bound_of_a_sum_a_mean_and_an_exp():
    x = np.arange(1.0, 9.0, dtype=np.float32).reshape(2, 4)
    spec = {"args": [{"t": "input.0"}, 1], "kwargs": {}}
    arrays = {"input.0": x, "output.0": x.sum(1)}
    nx = float(np.linalg.norm(x))
    s = A.kernel_bound("sum", spec, arrays, _norm(arrays), "output.0", 30.0, "torch.float32")
    assert s == pytest.approx(2 * math.sqrt(3) * U32 * (30.0 + nx), rel=1e-12)
    arrays["output.0"] = x.mean(1)
    m = A.kernel_bound("mean", spec, arrays, _norm(arrays), "output.0", 7.0, "torch.float32")
    assert m == pytest.approx(2 * math.sqrt(3) * U32 * (7.0 + nx / 4), rel=1e-12)
    e = A.kernel_bound("exp", {"args": [{"t": "input.0"}]}, arrays, _norm(arrays), "output.0", 9.0, "torch.float32")
    assert e == pytest.approx(4 * U32 * 9.0, rel=1e-15)
    assert A.kernel_bound("relu", spec, arrays, _norm(arrays), "output.0", 9.0, "torch.float32") == 0.0


def test_kernel_bound_of_a_softmax_is_relative_and_a_log_softmax_absolute():
    y = np.full((3, 8), 1 / 8, dtype=np.float32)
    spec = {"args": [{"t": "input.0"}, -1], "kwargs": {}}
    arrays = {"input.0": np.zeros((3, 8), np.float32), "output.0": y}
    got = A.kernel_bound("softmax", spec, arrays, _norm(arrays), "output.0", 0.6, "torch.float32")
    assert got == pytest.approx(2 * math.sqrt(7) * U32 * 0.6, rel=1e-12)
    arrays["output.0"] = np.log(y)
    got = A.kernel_bound("log_softmax", spec, arrays, _norm(arrays), "output.0", 10.0, "torch.float32")
    assert got == pytest.approx(2 * math.sqrt(7) * U32 * math.sqrt(24), rel=1e-12)


def test_kernel_bound_never_raises_for_arguments_it_does_not_understand():
    arrays = {"input.0": np.ones((2, 2), np.float32), "output.0": np.ones(2, np.float32)}
    assert A.kernel_bound("linear", {"args": [{"t": "input.0"}]}, arrays, _norm(arrays), "output.0", 1.0,
                          "torch.float32") == 0.0
    assert A.kernel_bound("softmax", {"args": [{"t": "input.0"}, "x"]}, arrays, _norm(arrays), "output.0", 1.0,
                          "torch.float32") == 0.0


def test_kernel_bound_of_a_mean_cross_entropy():
    logits = np.zeros((4, 10), np.float32)
    arrays = {"input.0": logits, "input.1": np.zeros(4, np.int64), "output.0": np.float32(2.3)}
    spec = {"args": [{"t": "input.0"}, {"t": "input.1"}], "kwargs": {}}
    got = A.kernel_bound("cross_entropy", spec, arrays, _norm(arrays), "output.0", 2.3, "torch.float32")
    # each row's log-sum-exp over 10 classes (absolutely), then the mean of 4 positive losses (relatively)
    assert got == pytest.approx(2 * math.sqrt(9) * U32 * 1.0 + 2 * math.sqrt(3) * U32 * 2.3, rel=1e-12)
