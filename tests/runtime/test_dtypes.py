"""runtime/dtypes.py: the one table of floating-point facts agrees with torch.finfo."""
import pytest

from pytest_ptdbg.runtime import pool
from pytest_ptdbg.runtime.dtypes import FLOATS, float_facts, short_name

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("name", sorted(FLOATS))
def test_facts_are_torch_finfo(name):
    f, fi = FLOATS[name], torch.finfo(getattr(torch, name))
    assert (f.eps, f.max, f.tiny, f.unit_roundoff) == (fi.eps, fi.max, fi.tiny, fi.eps / 2)
    assert f.subnormal_spacing == fi.tiny * fi.eps


def test_names_and_aliases():
    assert short_name("torch.half") == "float16" and short_name("double") == "float64"
    assert float_facts("torch.bfloat16").mantissa_bits == 7 and float_facts("torch.int64") is None


def test_pool_chunk_ranges_and_inline_map():
    assert pool.chunk_ranges([10] * 8, workers=1, per_worker=4) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert pool.chunk_ranges([1] * 5, workers=1, max_items=2) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
    assert list(pool.map_unordered(abs, [-1, -2], workers=1)) == [(0, 1), (1, 2)]
    assert 1 <= pool.default_workers() <= 8
