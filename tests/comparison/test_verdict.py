import numpy as np
import pytest

from pytest_ptdbg.comparison import metrics as M
from pytest_ptdbg.comparison import verdict as V


def pm(cos, mae, compared=10, **kw):
    return M.PairMetrics(cosine=cos, max_abs_err=mae, compared=compared, size=compared, **kw)


@pytest.mark.parametrize("cos, mae, expected", [
    (0.99, 0.5, "Yes"),           # cosine not below 0.99
    (0.98999, 0.001, "Yes"),      # MaxAbsErr not above 0.001
    (0.98999, 0.0011, "No"),
    (0.90, 0.0, "Yes"),
    (0.89999, 0.0, "No"),         # cosine < 0.9 alone fails
    (1.0, 1.0, "Yes"),
    (1.0, 1.0001, "No"),          # MaxAbsErr > 1 alone fails
    (float("nan"), 0.5, "Yes"),   # undefined cosine (scalar) takes no part
    (float("nan"), 1.5, "No"),
])
def test_ptdbg_rule_boundaries(cos, mae, expected):
    assert V.full_verdict(pm(cos, mae)) == expected


def test_mismatches_and_nothing_to_compare():
    assert V.full_verdict(pm(1.0, 0.0, nan_mismatch=True)) == "No"
    assert V.full_verdict(M.PairMetrics(shape_mismatch=True)) == "No"
    assert V.full_verdict(pm(float("nan"), float("nan"), compared=0)) == ""
    assert V.full_verdict(pm(float("nan"), float("nan"), compared=0), rule="dtype") == ""


def test_custom_thresholds():
    th = V.Thresholds(cosine=0.9999, max_abs=1e-6)
    assert V.full_verdict(pm(0.9998, 1e-5), th=th) == "No"
    assert V.full_verdict(pm(0.9998, 1e-5)) == "Yes"
    with pytest.raises(ValueError, match="unknown verdict rule"):
        V.full_verdict(pm(1, 0), rule="nope")


def test_tolerance_of_lower_precision_side():
    assert V.tolerance("torch.bfloat16", "torch.float32") == (1.6e-2, 1e-5)
    assert V.tolerance("torch.float32", "torch.float16") == (1e-3, 1e-5)
    assert V.tolerance("torch.float32", "torch.float32") == (1.3e-6, 1e-5)
    assert V.tolerance("torch.float64", "torch.float64") == (1e-7, 1e-7)
    assert V.tolerance("torch.int64", "torch.int64") == (0.0, 0.0)


def test_dtype_rule_fraction_boundary():
    assert V.full_verdict(pm(1, 0, compared=100, tol_fail=0), rule="dtype") == "Yes"
    assert V.full_verdict(pm(1, 0, compared=100, tol_fail=1), rule="dtype") == "No"
    th = V.Thresholds(max_fail_fraction=0.01)
    assert V.full_verdict(pm(1, 0, compared=100, tol_fail=1), rule="dtype", th=th) == "Yes"
    assert V.full_verdict(pm(1, 0, compared=100, tol_fail=2), rule="dtype", th=th) == "No"


def _bf16(a):
    """Round float32 to bfloat16 precision (keep the top 16 bits, round to nearest even)."""
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def test_bf16_device_passes_dtype_rule_but_not_ptdbg():
    rng = np.random.default_rng(0)
    b = (500 * rng.standard_normal(4096)).astype(np.float32)
    n = _bf16(b)
    rtol, atol = V.tolerance("torch.bfloat16", "torch.float32")
    m = M.compare_arrays(n, b, tol=(atol, rtol))
    assert V.full_verdict(m, "torch.bfloat16", "torch.float32", rule="dtype") == "Yes"
    assert V.full_verdict(m) == "No"                     # MaxAbsErr > 1 on values of ~500
    rtol, atol = V.tolerance("torch.float32", "torch.float32")
    m32 = M.compare_arrays(n, b, tol=(atol, rtol))       # the same error claimed as fp32 fails
    assert V.full_verdict(m32, "torch.float32", "torch.float32", rule="dtype") == "No"


def test_summary_ptdbg_rule_boundary():
    b = [1.0, -1.0, 0.5, 2.0]
    assert V.summary_verdict([1.5, -1.0, 0.5, 2.0], b) == ("Yes", False)      # rel diff 0.5
    assert V.summary_verdict([1.51, -1.0, 0.5, 2.0], b) == ("No", False)
    assert V.summary_verdict([1.0, -1.0, 0.5, 3.0], b) == ("Yes", False)      # l2: 0.5 * 2.0
    assert V.summary_verdict([1.0, -1.0, 0.5, 3.01], b) == ("No", False)
    # a mean near zero is judged against the tensor's range, not against itself
    assert V.summary_verdict([1.0, -1.0, -1e-9, 2.0], [1.0, -1.0, 1e-9, 2.0]) == ("Yes", False)
    assert V.summary_verdict(b, b, npu_nonfinite=1) == ("No", True)
    assert V.summary_verdict([float("nan"), -1, 0.5, 2], b) == ("No", True)
    assert V.summary_verdict([], []) == ("", False)


def test_summary_dtype_rule_boundary():
    b = [2.0, -2.0, 0.0, 4.0]
    bound = 1e-5 + 1.6e-2 * 2.0            # atol + rtol * max(|max|, |min|)
    ok = V.summary_verdict([2.0 + bound, -2.0, 0.0, 4.0], b, shape=[16], npu_dtype="torch.bfloat16",
                           bench_dtype="torch.float32", rule="dtype")
    bad = V.summary_verdict([2.0 + 1.01 * bound, -2.0, 0.0, 4.0], b, shape=[16],
                            npu_dtype="torch.bfloat16", bench_dtype="torch.float32", rule="dtype")
    assert ok == ("Yes", False) and bad == ("No", False)
    l2_bound = 1e-5 * 4 + 1.6e-2 * 4.0     # atol * sqrt(N) + rtol * |l2|
    assert V.summary_verdict([2, -2, 0, 4 + 0.99 * l2_bound], b, shape=[16], npu_dtype="torch.bfloat16",
                             rule="dtype")[0] == "Yes"
    assert V.summary_verdict([2, -2, 0, 4 + 1.01 * l2_bound], b, shape=[16], npu_dtype="torch.bfloat16",
                             rule="dtype")[0] == "No"


# ---------------------------------------------------------------- many summary rows at once

def _rows_one_by_one(n, b, nnf, bnf, rule, sizes, dtypes):
    from pytest_ptdbg.comparison import verdict as V

    out = []
    for i in range(len(n)):
        shape = (int(sizes[i]),)
        out.append(V.summary_verdict(list(n[i]), list(b[i]), int(nnf[i]), int(bnf[i]), shape,
                                     dtypes[i][0], dtypes[i][1], rule))
    return out


def test_summary_verdicts_hand_computed():
    import numpy as np

    from pytest_ptdbg.comparison import verdict as V

    nan, inf = float("nan"), float("inf")
    # bench max 2, min -4: scale 4, limit 0.5 * 4 = 2 for max/min/mean; l2norm limit 0.5 * |b l2|
    b = [[2.0, -4.0, 0.0, 10.0]] * 6
    n = [[3.9, -4.0, 0.0, 10.0],     # |dmax| 1.9 <= 2: Yes
         [4.1, -4.0, 0.0, 10.0],     # 2.1 > 2: No
         [2.0, -4.0, 0.0, 15.1],     # |dl2| 5.1 > 5: No
         [nan, -4.0, 0.0, 10.0],     # NaN against a finite max: mismatch, No
         [2.0, -4.0, 0.0, 10.0],     # equal statistics but NaN counts differ: No
         [2.0, -4.0, 0.0, 14.9]]     # 4.9 <= 5: Yes
    nnf, bnf = [0, 0, 0, 1, 3, 0], [0, 0, 0, 0, 0, 0]
    codes, mism = V.summary_verdicts(np.array(n), np.array(b), np.array(nnf), np.array(bnf))
    assert [V.VERDICT_TEXT[c] for c in codes] == ["Yes", "No", "No", "No", "No", "Yes"]
    assert mism.tolist() == [False, False, False, True, True, False]
    # nothing finite on either side, at the same places: nothing to compare
    codes, mism = V.summary_verdicts(np.array([[nan, inf, nan, inf]]), np.array([[nan, inf, nan, inf]]),
                                     np.array([2]), np.array([2]))
    assert V.VERDICT_TEXT[codes[0]] == "" and not mism[0]
    # dtype rule, fp16: rtol 1e-3, atol 1e-5; scale 100 -> bound 1e-5 + 0.1 for max/min/mean;
    # l2norm over 10000 elements: 1e-5 * 100 + 1e-3 * 50 = 0.051
    b = np.array([[100.0, 1.0, 1.0, 50.0]] * 3)
    n = np.array([[100.1, 1.0, 1.0, 50.0], [100.2, 1.0, 1.0, 50.0], [100.0, 1.0, 1.0, 50.052]])
    codes, _ = V.summary_verdicts(n, b, np.zeros(3), np.zeros(3), "dtype", rtol=np.full(3, 1e-3),
                                  atol=np.full(3, 1e-5), sizes=np.full(3, 10000.0))
    assert [V.VERDICT_TEXT[c] for c in codes] == ["Yes", "No", "No"]


def test_summary_verdicts_equal_the_row_by_row_rule():
    import numpy as np

    from pytest_ptdbg.comparison import metrics as M
    from pytest_ptdbg.comparison import verdict as V

    rng = np.random.default_rng(7)
    m = 4000
    b = rng.standard_normal((m, 4)) * 10.0 ** rng.integers(-8, 8, (m, 1))
    n = b * (1 + rng.choice([0.0, 1e-7, 1e-3, 0.3, 0.6, 2.0], (m, 1)) * rng.standard_normal((m, 4)))
    special = rng.random((m, 4))
    n[special < 0.02] = np.nan
    b[special > 0.985] = np.inf
    n[(special > 0.97) & (special < 0.975)] = -np.inf
    b[rng.random(m) < 0.05] = 0.0
    same = rng.random(m) < 0.05
    n[same] = b[same]                   # identical statistics, Inf included
    nnf = rng.integers(0, 2, m) * (rng.random(m) < 0.05)
    bnf = np.where(rng.random(m) < 0.9, nnf, 1 - nnf)
    sizes = rng.integers(0, 10 ** 6, m).astype(float)
    n[:20] = b[:20] = [np.nan, np.inf, np.nan, -np.inf]   # nothing finite to compare
    bnf[:20] = nnf[:20]
    dtypes = [("torch.float16", "torch.float32")] * m
    for rule in ("ptdbg", "dtype"):
        want = _rows_one_by_one(n, b, nnf, bnf, rule, sizes, dtypes)
        tol = V.tolerance(*dtypes[0])
        codes, mism = V.summary_verdicts(n, b, nnf, bnf, rule, rtol=np.full(m, tol[0]), atol=np.full(m, tol[1]),
                                         sizes=sizes)
        assert [(V.VERDICT_TEXT[c], bool(x)) for c, x in zip(codes, mism)] == want
        assert len({w[0] for w in want}) == 3      # the data reach all three verdicts
    diffs, rel = M.summary_diffs_rel_l2(n, b)
    for i in range(m):
        want_d = M.summary_diffs(list(n[i]), list(b[i]))
        assert [repr(x) for x in diffs[i].tolist()] == [repr(x) for x in want_d]
        assert repr(rel[i].item()) == repr(M.summary_rel_l2(list(n[i]), list(b[i])))
