"""The judge's one-pass kernels (judge/budget.py) against hand-computed values and against the
element-wise forms they stand for: the same numbers, bit for bit."""
import math

import numpy as np

from pytest_ptdbg.judge import budget as B

U32, U16 = 2.0 ** -24, 2.0 ** -8


def test_finite_norms_by_hand_in_the_arrays_own_dtypes():
    d = np.array([1.0, 2.0], dtype=np.float32)
    o = np.array([1.0, 0.0])
    r = np.array([2.0, 0.0], dtype=np.float16)
    assert B.finite_norms(d, o, r) == (2.0, 1.0, 1.0, 2)      # ‖(0, 2)‖, ‖(1, 0)‖, ‖(1, 0)‖
    assert B.finite_norms(np.float32(3.0), np.float64(0.0), np.float64(4.0)) == (3.0, 4.0, 0.0, 1)  # 0-d
    for bad in ([np.nan, 0.0], [np.inf, 0.0]):
        assert B.finite_norms(np.array(bad), o, o) is None       # a NaN/Inf: the element-wise check
        assert B.finite_norms(o, o, np.array(bad)) is None
    assert B.finite_norms(o, np.array([1e200, 0.0]), o) is None  # a squared norm overflows: element-wise too
    assert B.finite_norms(np.array([1, 2]), o, o) is None        # integers are not judged by norms


def test_finite_norms_are_the_element_wise_norms_bit_for_bit():
    rng = np.random.default_rng(3)
    o = rng.standard_normal((37, 129))
    d = (o * (1 + 1e-6 * rng.standard_normal(o.shape))).astype(np.float32)
    r = np.asfortranarray((o * (1 + 1e-7 * rng.standard_normal(o.shape))).astype(np.float32))
    own, ref, scale, n = B.finite_norms(d, o, r)
    d64, r64 = d.astype(np.float64), r.astype(np.float64)
    assert own == float(np.linalg.norm((d64 - o).ravel())) and ref == float(np.linalg.norm((r64 - o).ravel()))
    assert scale == float(np.linalg.norm(o.ravel())) and n == o.size
    assert B.check_output("k", d, o, r, "torch.float32", 0.5) == B.judged("k", own, ref, scale, n,
                                                                          "torch.float32", 0.5)


def test_judged_by_hand():
    c = B.judged("output.0", 2.0, 1.0, 1.0, 4, "torch.float32")          # budget max(3 x 1, u x 1)
    assert c.budget == 3.0 and c.ratio == 2.0 / 3.0 and not c.over
    floor = B.judged("output.0", 1e-6, 1e-9, 1.0, 4, "torch.float32", input_rms=2.0)
    assert floor.budget == U32 * 2.0 * 2.0                               # u x s_in x sqrt(4) > u x 1 > 3e-9
    assert B.judged("output.0", 1e-9, 0.0, 1.0, 4, "torch.float32", input_rms=2.0).budget == 0.0  # exact: no floor


def test_input_rms_decided_by_hand():
    # no floor at all without a reference error
    assert B.input_rms_decided(None, 0.0, 1.0, 4, "torch.float32")
    assert not B.input_rms_decided(None, 1e-3, 1.0, 4, "torch.float32")       # no bound known
    # ‖oracle‖ 10 >= bound 4 x sqrt(4) = 8: the floor is u x 10 whatever the RMS below 4
    assert B.input_rms_decided(4.0, 1e-9, 10.0, 4, "torch.bfloat16")
    # bound 6: u x 12 = 12/256 = 0.046875 against 3 x ref
    assert not B.input_rms_decided(6.0, 0.01, 10.0, 4, "torch.bfloat16")       # 0.03 < 0.046875
    assert B.input_rms_decided(6.0, 0.02, 10.0, 4, "torch.bfloat16")           # 0.06 >= 0.046875
    # and then every RMS up to the bound gives the budget the bound gives
    for s in (0.0, 1.0, 5.9, 6.0):
        assert B.judged("o", 0.1, 0.02, 10.0, 4, "torch.bfloat16", s).budget == \
            B.judged("o", 0.1, 0.02, 10.0, 4, "torch.bfloat16", 6.0).budget == 3 * 0.02


def test_rms_bound_by_hand_and_on_data():
    b = B.rms_bound(1.0, 3.0, 4)                     # (1 + 3) / sqrt(4), with room for rounding
    assert 2.0 < b and math.isclose(b, 2.0, rel_tol=2e-6)
    assert B.rms_bound(3.0, 3.0, 4) is None          # |d| may be 0: no positive RMS proven
    assert B.rms_bound(1.0, 1e29, 4) is None         # elements could be masks (>= 1e30)
    assert B.rms_bound(0.0, 1.0, 0) is None
    rng = np.random.default_rng(5)
    o = rng.standard_normal(10_000) * 3
    d = (o + rng.standard_normal(o.size)).astype(np.float32)   # a large own error
    own, _, scale, n = B.finite_norms(d, o, o)
    assert 0.0 < B.rms(d) <= B.rms_bound(own, scale, n) < 1.5 * B.rms(d)


def test_rms_one_pass_is_the_masked_mean_bit_for_bit():
    assert B.rms(np.array([3.0, -4.0], dtype=np.float32)) == math.sqrt(12.5)
    assert B.rms(np.array([3.0, -4.0, -3.4e38], dtype=np.float32)) == math.sqrt(12.5)   # a mask: left out
    assert B.rms(np.array([np.nan])) == 0.0 and B.rms(np.array([], dtype=np.float32)) == 0.0
    rng = np.random.default_rng(7)
    for a in (rng.standard_normal(100_003).astype(np.float32), rng.standard_normal((3, 5)),
              rng.standard_normal(17).astype(np.float16)):
        a64 = a.astype(np.float64).ravel()
        assert B.rms(a) == float(np.sqrt(np.mean(a64 * a64)))


def test_dropout_structure_counted_over_pieces():
    n = 3 * (1 << 15) + 11                           # more than one piece, the last one short
    x = np.linspace(-2.0, 2.0, n).astype(np.float32) + np.float32(3.0)    # no zeros
    out = (x / np.float32(0.75)).astype(np.float32)
    out[::4] = 0.0
    wrong = [5, 1 << 15, (1 << 15) + 1, 2 * (1 << 15) + 7, n - 1]        # each side of the pieces' edges
    out[wrong] = x[wrong]                            # neither 0 nor x / (1 - p)
    c = B.check_dropout("output.0", out, x, 0.25, "torch.float32")
    assert c.own == len(wrong) == 5 and c.scale == n
    assert B.check_dropout("output.0", np.zeros(n, np.float32), x, 1.0, "torch.float32").own == 0
