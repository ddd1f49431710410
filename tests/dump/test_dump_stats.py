import math

import pytest
import torch

from pytest_ptdbg.dump.stats import StatsCache, scalar_stats, tensor_stats


def test_float_stats_hand_computed():
    st = tensor_stats(torch.tensor([[3.0, -4.0], [0.0, 1.0]]))
    assert st.dtype == "torch.float32" and st.shape == (2, 2)
    assert st.stats == [3.0, -4.0, 0.0, math.sqrt(26.0)]
    assert (st.nan, st.inf) == (0, 0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_measured_in_float32(dtype):
    # 300 * 300 overflows float16 if the square sum were done in float16
    x = torch.full((4,), 300.0, dtype=dtype)
    st = tensor_stats(x)
    assert st.dtype == str(dtype)
    assert st.stats[3] == pytest.approx(600.0)
    assert st.stats[2] == pytest.approx(300.0)
    assert (st.nan, st.inf) == (0, 0)


def test_nan_and_inf_are_counted():
    x = torch.tensor([1.0, float("nan"), float("inf"), float("-inf"), 2.0])
    st = tensor_stats(x)
    assert (st.nan, st.inf) == (1, 2)
    assert math.isnan(st.stats[0]) or math.isinf(st.stats[0])


def test_inf_only():
    st = tensor_stats(torch.tensor([1.0, float("inf")]))
    assert (st.nan, st.inf) == (0, 1)
    assert st.stats[0] == math.inf and st.stats[1] == 1.0


def test_integer_and_bool_stats():
    st = tensor_stats(torch.tensor([1, 2, 3, 6], dtype=torch.int32))
    assert st.stats == [6, 1, 3.0, math.sqrt(1 + 4 + 9 + 36)]
    assert isinstance(st.stats[0], int)
    b = tensor_stats(torch.tensor([True, False, True, True]))
    assert b.dtype == "torch.bool"
    assert b.stats[:3] == [True, False, 0.75]


def test_empty_noncontiguous_and_grad_tensors():
    assert tensor_stats(torch.empty(0, 3)).stats == []
    x = torch.arange(12.0).reshape(3, 4).t()  # not contiguous
    st = tensor_stats(x)
    assert st.stats[:3] == [11.0, 0.0, 5.5]
    assert st.stats[3] == pytest.approx(math.sqrt(sum(i * i for i in range(12))), rel=1e-6)  # float32 norm
    w = torch.ones(3, requires_grad=True) * 2  # has a grad_fn
    assert tensor_stats(w).stats == [2.0, 2.0, 2.0, math.sqrt(12.0)]


def test_large_tensor_matches_float64():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 300, generator=g)
    st = tensor_stats(x)
    d = x.double()
    ref = [d.max().item(), d.min().item(), d.mean().item(), d.norm().item()]
    assert st.stats[:2] == ref[:2]
    assert st.stats[2] == pytest.approx(ref[2], abs=1e-6)
    assert st.stats[3] == pytest.approx(ref[3], rel=1e-6)


def test_scalar_stats():
    assert scalar_stats(2).stats == [2, 2, 2, 2]
    assert scalar_stats(-1.5).stats == [-1.5, -1.5, -1.5, 1.5]
    assert scalar_stats(True).dtype == "bool"
    assert scalar_stats(float("nan")).nan == 1
    assert scalar_stats("x") is None and scalar_stats(None) is None


def test_recent_tensors_are_kept_for_the_next_hook():
    c = StatsCache(keep_recent=2)
    g = torch.randn(8)
    first = c.stats(g.view(8))  # the hook's object dies at once; the memory lives on as g
    assert c.stats(g.view(2, 4).view(8)) is first


def test_cache_hits_views_and_misses_after_inplace():
    c = StatsCache()
    x = torch.arange(6.0)
    a = c.stats(x)
    assert c.stats(x) is a and c.hits == 1
    assert c.stats(x.view(6)) is a  # another object over the same memory
    x.add_(1)  # in-place: version changes
    b = c.stats(x)
    assert b.stats[0] == 6.0 and c.misses == 2
    y = x.view(2, 3)  # different shape: its own entry
    assert c.stats(y).shape == (2, 3)


def test_single_element_tensors():
    assert tensor_stats(torch.tensor(2.5)).stats == [2.5, 2.5, 2.5, 2.5]
    assert tensor_stats(torch.tensor([-3.0], dtype=torch.bfloat16)).stats == [-3.0, -3.0, -3.0, 3.0]
    st = tensor_stats(torch.tensor(float("-inf")))
    assert (st.nan, st.inf) == (0, 1)
    assert tensor_stats(torch.tensor(float("nan"))).nan == 1


def test_parameter_grad_stays_cached_while_the_parameter_holds_it():
    c = StatsCache(keep_recent=0)  # only the parameter keeps an entry alive here
    w = torch.randn(4, requires_grad=True)
    g = torch.arange(4.0)
    hook_obj = g.view(4)  # autograd's object in the hook; it dies before the optimizer runs
    first = c.grad_stats(hook_obj, w)
    del hook_obj
    w.grad = g
    assert c.stats(w.grad) is first and c.hits == 1
    w.grad.mul_(2)  # changed in place: measured again
    assert c.stats(w.grad).stats[0] == 6.0
    w2 = torch.randn(4, requires_grad=True)
    h = torch.ones(4)
    c.grad_stats(h.view(4), w2)
    w2.grad = None  # the parameter let go of the memory: the entry is no longer trusted
    misses = c.misses
    c.stats(h)
    assert c.misses == misses + 1


def test_scalar_stats_are_shared_per_value_and_keep_the_sign_of_zero():
    assert scalar_stats(0.25) is scalar_stats(0.25)
    assert scalar_stats(1).dtype == "int" and scalar_stats(True).dtype == "bool"  # 1 == True: not one key
    assert str(scalar_stats(-0.0).stats[0]) == "-0.0" and str(scalar_stats(0.0).stats[0]) == "0.0"
    assert scalar_stats(float("nan")).nan == 1


def test_full_cache_forgets_dead_entries_first():
    c = StatsCache(size=8, keep_recent=0)
    kept = [torch.full((2,), float(i)) for i in range(3)]
    first = [c.stats(t) for t in kept]
    for r in range(3):  # batches of tensors that die after being measured overflow the cache
        batch = [torch.full((3 + r,), float(i)) for i in range(4)]
        for t in batch:
            c.stats(t)
        del batch
    hits = c.hits
    assert [c.stats(t) for t in kept] == first and c.hits == hits + 3  # the live ones still hit


def test_batch_stats_hand_computed_and_as_tensor_stats():
    """Many small tensors measured in one batch: the same statistics as one by one (max/min
    exact, sums in float64), NaN/Inf counted only where a statistic is not finite."""
    from pytest_ptdbg.dump.stats import batch_stats

    ts = [
        torch.tensor([[3.0, -4.0], [0.0, 1.0]]),
        torch.full((4,), 300.0, dtype=torch.float16),  # its square sum overflows float16
        torch.tensor([1.0, float("nan"), float("inf"), float("-inf"), 2.0]),
        torch.tensor(-2.5, dtype=torch.float64),
        torch.tensor([1.0, float("inf")]),
        torch.arange(12.0).reshape(3, 4).t().clone(),  # a non-contiguous layout kept by clone
        torch.tensor([-3.0], dtype=torch.bfloat16),
    ]
    got = batch_stats(ts, [str(t.dtype) for t in ts], [tuple(t.shape) for t in ts])
    assert got[0].stats == [3.0, -4.0, 0.0, math.sqrt(26.0)] and (got[0].nan, got[0].inf) == (0, 0)
    assert got[0].dtype == "torch.float32" and got[0].shape == (2, 2)
    assert got[1].stats == [300.0, 300.0, 300.0, 600.0]
    assert (got[2].nan, got[2].inf) == (1, 2)
    assert got[3].stats == [-2.5, -2.5, -2.5, 2.5] and got[3].shape == ()
    assert got[4].stats[0] == math.inf and got[4].stats[1] == 1.0 and (got[4].nan, got[4].inf) == (0, 1)
    assert got[5].stats[:3] == [11.0, 0.0, 5.5]
    assert got[5].stats[3] == pytest.approx(math.sqrt(sum(i * i for i in range(12))), rel=1e-12)
    assert got[6].stats == [-3.0, -3.0, -3.0, 3.0] and got[6].dtype == "torch.bfloat16"
    for t, st in zip(ts, got):
        ref = tensor_stats(t)
        assert (ref.dtype, ref.shape, ref.nan, ref.inf) == (st.dtype, st.shape, st.nan, st.inf)
        for a, b in zip(ref.stats, st.stats):
            assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-6)


def test_batch_columns_group_shapes_without_changing_order_or_values():
    """Snapshots concatenated per shape class (1-D, same trailing dims, 0-d stacked, and mixes of
    them) give every tensor its own elements in row-major order: the same columns as measuring
    each tensor's ``reshape(-1)`` alone, bit for bit."""
    from pytest_ptdbg.dump.stats import _concat, batch_stat_columns

    g = torch.Generator().manual_seed(3)
    batches = [
        [torch.randn(n, generator=g) for n in (5, 1, 7, 64)],  # one cat
        [torch.randn(n, 3, generator=g) for n in (2, 4)] + [torch.randn(3, 2, generator=g).t()],
        [torch.tensor(1.5), torch.tensor(-2.0), torch.tensor(0.25)],  # one stack
        [torch.tensor(4.0), torch.randn(2, 2, generator=g), torch.randn(6, generator=g),
         torch.randn(3, 2, generator=g).t().clone(), torch.tensor([7.0, -8.0])],
    ]
    for ts in batches:
        flat, counts = _concat(ts)
        assert torch.equal(flat, torch.cat([t.reshape(-1) for t in ts]))
        assert counts.tolist() == [t.numel() for t in ts]
        mx, mn, mean, l2, nan, inf, ok = batch_stat_columns(ts)
        for i, t in enumerate(ts):
            alone = batch_stat_columns([t])  # a batch of one: the tensor's elements alone
            assert [c[i] for c in (mx, mn, mean, l2, nan, inf, ok)] == [c[0] for c in alone]
            a = t.reshape(-1).double()
            assert mx[i] == float(t.max()) and mn[i] == float(t.min())
            assert mean[i] == pytest.approx(float(a.sum()) / t.numel(), rel=1e-12, abs=1e-15)
            assert l2[i] == pytest.approx(math.sqrt(float((a * a).sum())), rel=1e-12)
            assert (nan[i], inf[i], ok[i]) == (0, 0, True)
    # hand-computed: [1, 2, 3] and [NaN, -inf, 1] in one batch
    mx, mn, mean, l2, nan, inf, ok = batch_stat_columns(
        [torch.tensor([1.0, 2.0, 3.0]), torch.tensor([float("nan"), float("-inf"), 1.0])])
    assert (mx[0], mn[0], mean[0], l2[0], ok[0]) == (3.0, 1.0, 2.0, math.sqrt(14.0), True)
    assert (nan[1], inf[1], ok[1]) == (1, 1, False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_large_tensors_are_measured_in_chunks_hand_computed(dtype):
    """A tensor past ``CHUNKED_MIN`` is read chunk by chunk; the chunk boundary (one extreme
    value in the last, short chunk) changes nothing: hand-computed statistics."""
    from pytest_ptdbg.dump import stats as S

    n = S.CHUNKED_MIN + S.CHUNK // 2 + 3
    x = torch.full((n,), 0.5, dtype=dtype)
    x[-1] = -2.0
    x[S.CHUNK] = 4.0  # first element of the second chunk
    st = tensor_stats(x)
    total = 0.5 * (n - 2) - 2.0 + 4.0
    assert st.stats[:2] == [4.0, -2.0]
    assert st.stats[2] == pytest.approx(total / n, rel=1e-12)
    assert st.stats[3] == pytest.approx(math.sqrt(0.25 * (n - 2) + 4.0 + 16.0), rel=1e-12)
    assert (st.nan, st.inf) == (0, 0)


def test_chunked_norm_is_accurate_and_nonfinite_falls_back():
    """Chunk sums added in float64: the norm of 3 M float32 values within 1e-6 of float64 (one
    float32 dot product over the whole tensor was 2e-6 off here, 2e-4 at 51 M elements); NaN and
    Inf are counted as for any tensor."""
    g = torch.Generator().manual_seed(0)
    y = torch.randn(3 << 20, generator=g) * 3 + 1
    d = y.double()
    st = tensor_stats(y)
    assert st.stats[3] == pytest.approx(math.sqrt(float((d * d).sum())), rel=1e-6)
    assert st.stats[2] == pytest.approx(float(d.mean()), rel=1e-6)
    y[12345] = float("nan")
    y[(2 << 20) + 7] = float("inf")
    st = tensor_stats(y)
    assert (st.nan, st.inf) == (1, 1) and math.isnan(st.stats[0])
    big = torch.full((2 << 20,), 3e18)  # finite, but its float32 square sum overflows
    st = tensor_stats(big)
    assert st.stats[3] == pytest.approx(3e18 * math.sqrt(2 << 20), rel=1e-6) and (st.nan, st.inf) == (0, 0)
