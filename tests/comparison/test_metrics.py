import math

import numpy as np
import pytest

from pytest_ptdbg.comparison import metrics as M
from pytest_ptdbg.dump.npy import NpyStream


def test_hand_computed_values():
    n, b = np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 4.0])
    m = M.compare_arrays(n, b)
    assert m.cosine == pytest.approx(17 / math.sqrt(14 * 21), rel=1e-12)
    assert m.max_abs_err == 1.0
    assert m.max_rel_err == 0.25
    assert m.one_thousandth == pytest.approx(2 / 3) and m.five_thousandths == pytest.approx(2 / 3)
    assert m.rel_l2 == pytest.approx(1 / math.sqrt(21))
    assert not m.nan_mismatch and m.compared == 3 and m.message == ""


def test_thresholds_are_strict_pass_fractions():
    b = np.array([1000.0, 1000.0, 1000.0, 1000.0])
    n = b + np.array([0.5, 0.999, 1.0, 4.0])    # r = 0.0005, 0.000999, 0.001, 0.004
    m = M.compare_arrays(n, b)
    assert m.one_thousandth == 0.5               # r < 0.001: the first two only
    assert m.five_thousandths == 1.0


def test_zero_bench_uses_dtype_eps():
    n = np.array([1e-3, 1.0], dtype=np.float32)
    b = np.array([0.0, 1.0], dtype=np.float32)
    m = M.compare_arrays(n, b)
    assert m.max_rel_err == pytest.approx(float(np.float32(1e-3)) / np.finfo(np.float32).eps, rel=1e-9)
    assert M.compare_arrays(n, b, eps=M.dtype_eps("torch.float16")).max_rel_err == pytest.approx(
        float(np.float32(1e-3)) / 2 ** -10, rel=1e-9)
    assert M.dtype_eps("torch.bfloat16") == 2 ** -7
    both_zero = M.compare_arrays(np.zeros(3, np.float32), np.zeros(3, np.float32))
    assert both_zero.max_rel_err == 0.0 and both_zero.one_thousandth == 1.0


def test_cosine_special_cases():
    assert M.cosine(np.zeros(4), np.zeros(4)) == 1.0
    m = M.compare_arrays(np.zeros(4), np.ones(4))
    assert math.isnan(m.cosine) and "NPU side" in m.message and m.max_abs_err == 1.0
    m = M.compare_arrays(np.ones(4), np.zeros(4))
    assert math.isnan(m.cosine) and "bench side" in m.message and m.rel_l2 == math.inf
    assert M.cosine(np.array([1.0, 0.0]), np.array([-1.0, 0.0])) == -1.0


def test_scalar_and_empty():
    m = M.compare_arrays(np.array(3.0), np.array(2.0))
    assert math.isnan(m.cosine) and "scalar" in m.message
    assert m.max_abs_err == 1.0 and m.max_rel_err == 0.5 and m.compared == 1
    e = M.compare_arrays(np.zeros((0, 3)), np.zeros((0, 3)))
    assert e.size == 0 and e.compared == 0 and "empty" in e.message and math.isnan(e.max_abs_err)


def test_int_and_bool():
    m = M.compare_arrays(np.array([1, 2, 3], np.int64), np.array([1, 2, 5], np.int64))
    assert m.max_abs_err == 2.0 and m.max_rel_err == 0.4 and m.one_thousandth == pytest.approx(2 / 3)
    m = M.compare_arrays(np.array([True, False, True]), np.array([True, True, True]))
    assert m.max_abs_err == 1.0 and m.one_thousandth == pytest.approx(2 / 3)
    m = M.compare_arrays(np.array([1, 0]), np.array([1, 0]))
    assert m.max_rel_err == 0.0   # b == 0 and n == 0: 0 / eps


def test_nan_inf_positions():
    n = np.array([1.0, np.nan, np.inf, 2.0])
    b = np.array([1.0, np.nan, np.inf, 2.5])
    m = M.compare_arrays(n, b)
    assert not m.nan_mismatch and m.compared == 2 and m.max_abs_err == 0.5
    assert m.npu_nonfinite == 2 and m.bench_nonfinite == 2 and "same positions" in m.message
    m = M.compare_arrays(np.array([1.0, np.nan, 2.0]), np.array([1.0, 1.0, np.nan]))
    assert m.nan_mismatch and "do not match" in m.message
    m = M.compare_arrays(np.array([np.inf, 1.0]), np.array([-np.inf, 1.0]))
    assert m.nan_mismatch                     # Inf signs differ
    m = M.compare_arrays(np.full(5, np.nan), np.full(5, np.nan))
    assert not m.nan_mismatch and m.compared == 0 and "no finite element" in m.message


def test_shape_mismatch():
    m = M.compare_arrays(np.zeros((2, 3)), np.zeros((3, 2)))
    assert m.shape_mismatch and "Unmatched" in m.message and math.isnan(m.cosine)


def test_tolerance_count_at_boundaries():
    m = M.compare_arrays(np.array([0.5, 0.25]), np.array([0.0, 0.0]), tol=(0.25, 0.0))
    assert m.tol_fail == 1                      # |d| == atol passes, above fails
    m = M.compare_arrays(np.array([5.0, 6.0]), np.array([4.0, 4.0]), tol=(0.0, 0.25))
    assert m.tol_fail == 1                      # |d| == rtol * |b| passes


def _reference(n, b, eps):
    n, b = n.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    keep = np.isfinite(n) & np.isfinite(b)
    n, b = n[keep], b[keep]
    d = np.abs(n - b)
    den = np.where(b == 0, eps, np.abs(b))
    r = d / den
    return (n @ b / np.linalg.norm(n) / np.linalg.norm(b), d.max(), r.max(), np.mean(r < 1e-3),
            np.linalg.norm(n - b) / np.linalg.norm(b))


def test_chunked_equals_plain_numpy(tmp_path):
    rng = np.random.default_rng(0)
    size = 3 * M.CHUNK + 123
    b = rng.standard_normal(size).astype(np.float32)
    b[::97] = 0
    n = (b + 1e-3 * rng.standard_normal(size)).astype(np.float32)
    n[2 * M.CHUNK + 5] = b[2 * M.CHUNK + 5] = np.nan   # a NaN in a later chunk, same place
    ref = _reference(n, b, float(np.finfo(np.float32).eps))
    m = M.compare_arrays(n, b)
    got = (m.cosine, m.max_abs_err, m.max_rel_err, m.one_thousandth, m.rel_l2)
    assert got == pytest.approx(ref, rel=1e-9)
    assert m.npu_nonfinite == 1 and not m.nan_mismatch
    np.save(tmp_path / "n.npy", n)
    np.save(tmp_path / "b.npy", b)
    with NpyStream(str(tmp_path / "n.npy")) as sn, NpyStream(str(tmp_path / "b.npy")) as sb:
        s = M.compare_streams(sn, sb, float(np.finfo(np.float32).eps))
    assert (s.cosine, s.max_abs_err, s.max_rel_err, s.one_thousandth, s.rel_l2) == pytest.approx(ref, rel=1e-9)


def test_block_size_does_not_change_values(monkeypatch):
    """Sums are added per CHUNK in order, so reading BLOCK elements at a time changes no bit."""
    rng = np.random.default_rng(1)
    size = 2 * M.BLOCK + 3 * M.CHUNK + 77
    b = rng.standard_normal(size).astype(np.float32)
    b[rng.random(size) < 0.5] = 0                     # half-zero bench (ReLU-like): eps denominators
    n = (b + 1e-4 * rng.standard_normal(size)).astype(np.float32)
    n[M.BLOCK + 9] = b[M.BLOCK + 9] = np.inf          # same-place Inf in the second block
    ref = _reference(np.delete(n, M.BLOCK + 9), np.delete(b, M.BLOCK + 9), float(np.finfo(np.float32).eps))
    big = M.compare_arrays(n, b, tol=(1e-5, 1e-3))
    monkeypatch.setattr(M, "BLOCK", M.CHUNK)
    small = M.compare_arrays(n, b, tol=(1e-5, 1e-3))
    assert big == small
    assert big.npu_nonfinite == 1 and not big.nan_mismatch and big.compared == size - 1
    got = (big.cosine, big.max_abs_err, big.max_rel_err, big.one_thousandth, big.rel_l2)
    assert got == pytest.approx(ref, rel=1e-9)


def test_summary_diffs():
    d = M.summary_diffs([3.0, -1.0, 0.5, 2.0], [2.0, -1.0, 0.25, "Nan"])
    assert d[:3] == (1.0, 0.0, 0.25) and math.isnan(d[3])
    assert M.summary_rel_l2([1, 1, 1, 3.0], [1, 1, 1, 2.0]) == 0.5
    assert math.isnan(M.summary_rel_l2([], [1, 1, 1, 2.0]))


def test_cosine_is_computed_from_the_dot_product():
    """n = b·1e-15 points the same way as b: cosine 1 (the old ‖n−b‖² formula gave 0.78)."""
    b = np.array([3.0, -1.0, 2.0, 0.5])
    assert M.compare_arrays(b * 1e-15, b).cosine == pytest.approx(1.0, abs=1e-15)
    assert M.compare_arrays(b, b * 1e15).cosine == pytest.approx(1.0, abs=1e-15)
    # hand-computed: n = (1, 2), b = (2, 1): n·b = 4, ‖n‖‖b‖ = 5
    assert M.compare_arrays(np.array([1.0, 2.0]) * 1e-12, np.array([2.0, 1.0])).cosine == pytest.approx(0.8, rel=1e-15)
    rng = np.random.default_rng(3)
    x = rng.standard_normal(3 * M.BLOCK + 5).astype(np.float32)
    assert M.compare_arrays(x, x).cosine == 1.0                        # exactly, not 0.9999999999999998
    assert M.compare_arrays(x, x.copy()).cosine == 1.0
    assert M.cosine_from_sums(-4.0, 4.0, 4.0, 16.0) == -1.0
    assert M.cosine_from_sums(1e300, 1e300, 1e300, 1.0) == pytest.approx(1.0)   # no overflow in ‖n‖‖b‖


def test_zero_bench_in_16_bit_dtypes_uses_float32_eps():
    """ptdbg and msprobe read fp16/bf16 tensors as float32 and add float32's eps where b == 0."""
    f32 = float(np.finfo(np.float32).eps)
    for d in ("torch.bfloat16", "torch.float16", "torch.float32", "torch.half"):
        assert M.zero_eps(d) == f32
    assert M.zero_eps("torch.float64") == float(np.finfo(np.float64).eps)
    assert M.zero_eps("torch.int64") == float(np.finfo(np.float64).eps)
    n = np.array([2.0 ** -10, 1.0], dtype=np.float16)
    b = np.array([0.0, 1.0], dtype=np.float16)
    # |n - b| / eps32 where b == 0: 2^-10 / 2^-23 = 2^13 (not 2^-10 / 2^-10 = 1 with fp16's eps)
    assert M.compare_arrays(n, b).max_rel_err == 2.0 ** 13
