import random

import pytest

from pytest_ptdbg.comparison.pairing import ApiSig, align, compatible, dtype_class


def sig(family, k, shape=(4,), dtype="float", direction="forward", slots=("input.0", "output.0")):
    return ApiSig(family, direction, k, tuple(sorted((s, dtype, tuple(shape)) for s in slots)))


def seq(names, **kw):
    """Signatures with call indices counted per family, as a dump numbers them."""
    count = {}
    out = []
    for n in names:
        fam, _, shape = n.partition(":")
        k = count.get(fam, 0)
        count[fam] = k + 1
        out.append(sig(fam, k, shape=(int(shape),) if shape else (4,), **kw))
    return out


def paired(steps):
    return [(i, j) for i, j in steps if i is not None and j is not None]


def test_identical_sequences_pair_one_to_one():
    s = seq(["A", "B", "A", "C"])
    assert align(s, s) == [(0, 0), (1, 1), (2, 2), (3, 3)]


def test_extra_call_on_npu_does_not_shift_the_rest():
    npu = seq(["lin", "to", "relu", "to", "lin", "to", "soft"])
    bench = seq(["lin", "relu", "to", "lin", "to", "soft"])
    steps = align(npu, bench)
    assert (1, None) in steps                 # the extra cast is listed unpaired
    assert paired(steps) == [(0, 0), (2, 1), (3, 2), (4, 3), (5, 4), (6, 5)]


def test_missing_call_on_npu_and_device_specific_api():
    npu = seq(["A", "NPU_fused", "B", "C"])
    bench = seq(["A", "X", "B", "C", "D"])
    steps = align(npu, bench)
    assert paired(steps) == [(0, 0), (2, 2), (3, 3)]
    assert (1, None) in steps and (None, 1) in steps and steps[-1] == (None, 4)
    # unpaired steps sit where the alignment puts them: between A and B
    assert steps.index((None, 1)) < steps.index((2, 2))


def test_structure_must_be_compatible():
    assert compatible(sig("A", 0, dtype="float"), sig("A", 0, dtype="float"))
    assert dtype_class("torch.bfloat16") == dtype_class("torch.float32") == "float"
    assert dtype_class("torch.int64") == "int" and dtype_class("torch.bool") == "bool"
    assert not compatible(sig("A", 0, shape=(4,)), sig("A", 0, shape=(5,)))
    assert not compatible(sig("A", 0, dtype="float"), sig("A", 0, dtype="int"))
    assert not compatible(sig("A", 0), sig("A", 0, direction="backward"))
    # a gradient missing on one side still pairs (the common slots agree)
    assert compatible(sig("A", 0, slots=("input.0", "output.0", "output.1")), sig("A", 0))
    # a changed shape (same slots and dtype classes) still pairs, weakly, where nothing better is
    # left: the table reports "shape changed" on one row instead of two unpaired calls
    npu = [sig("A", 0, shape=(4,)), sig("B", 0)]
    bench = [sig("A", 0, shape=(8,)), sig("B", 0)]
    assert align(npu, bench) == [(0, 0), (1, 1)]
    # ...but a compatible partner wins over a weak one
    npu = [sig("A", 0, shape=(4,)), sig("A", 1, shape=(8,))]
    bench = [sig("A", 0, shape=(8,))]
    assert align(npu, bench) == [(0, None), (1, 0)]
    # ...and several weak pairs never outweigh one compatible pair
    npu = [sig("A", 0, shape=(4,)), sig("A", 1, shape=(3,)), sig("A", 2, shape=(8,))]
    bench = [sig("A", 0, shape=(8,)), sig("A", 1, shape=(5,)), sig("A", 2, shape=(6,))]
    assert align(npu, bench) == [(0, None), (1, None), (2, 0), (None, 1), (None, 2)]
    # a changed dtype class never pairs
    assert align([sig("A", 0, dtype="int")], [sig("A", 0, dtype="float")]) == [(0, None), (None, 0)]


def test_call_index_breaks_ties_unless_fuzzy():
    npu = [sig("to", 1)]
    bench = [sig("to", 0), sig("to", 1)]
    assert paired(align(npu, bench)) == [(0, 1)]
    assert paired(align(npu, bench, fuzzy=True)) == [(0, 0)]   # order only


@pytest.mark.parametrize("seed, windowed", [(0, False), (1, False), (2, False), (3, True)])
def test_long_sequence_with_random_insertions_and_deletions(seed, windowed, monkeypatch):
    if windowed:  # align by sliding windows, as for a gap too long for one table
        from pytest_ptdbg.comparison import pairing

        monkeypatch.setattr(pairing, "DP_LIMIT", 10_000)
        monkeypatch.setattr(pairing, "WINDOW", 60)
    rng = random.Random(seed)
    fams = [f"f{i}" for i in range(12)]
    base = [f"{rng.choice(fams)}:{rng.choice([4, 8])}" for _ in range(400)]
    drop = set(rng.sample(range(len(base)), 15))
    bench_names = [n for k, n in enumerate(base) if k not in drop]
    bench_origin = [k for k in range(len(base)) if k not in drop]
    npu_names, npu_origin = [], []
    for k, n in enumerate(base):
        if rng.random() < 0.04:
            npu_names.append("extra_cast")
            npu_origin.append(None)
        npu_names.append(n)
        npu_origin.append(k)
    steps = align(seq(npu_names), seq(bench_names))
    got = {(npu_origin[i], bench_origin[j]) for i, j in paired(steps)}
    # a deleted call next to an identical one is ambiguous: either may pair; anything else is wrong
    wrong = [(a, b) for a, b in got
             if a != b and not all(base[k] == base[a] or k in drop for k in range(min(a, b), max(a, b) + 1))]
    assert not wrong
    # every original call present on both sides is paired
    assert len(got) == len(base) - len(drop)
    # every index of both sides appears exactly once
    assert sorted(i for i, _ in steps if i is not None) == list(range(len(npu_names)))
    assert sorted(j for _, j in steps if j is not None) == list(range(len(bench_names)))


def test_an_extra_non_tensor_argument_neither_unpairs_nor_weakens_a_pair():
    """x.sum(-1, keepdim=False) records one more Python-number argument than x.sum(-1); the calls
    have the same tensor structure, so the pairing is exactly that of identical calls."""
    from types import SimpleNamespace as NS

    from pytest_ptdbg.comparison.pairing import signature

    def api(k, scalars):
        ts = [NS(slot="input.0", param="", dtype="torch.float32", shape=(4, 3)),
              NS(slot="output.0", param="", dtype="torch.float32", shape=(4,))]
        ts += [NS(slot=f"input.{i + 1}", param="", dtype=d, shape=()) for i, d in enumerate(scalars)]
        return NS(family="Tensor_sum", op="", direction="forward", call_index=k, tensors=ts)

    a = [signature(api(0, ["int", "bool"])), signature(api(1, ["int"]))]
    b = [signature(api(0, ["int"])), signature(api(1, ["<class 'int'>", "bool"]))]
    assert a[0] == b[0] and a[1] == b[1]
    assert align(a, b) == [(0, 0), (1, 1)]
    # a 0-d *tensor* is part of the structure
    t0 = api(0, [])
    t0.tensors.append(NS(slot="input.1", param="", dtype="torch.float32", shape=()))
    assert signature(t0) != signature(api(0, []))
