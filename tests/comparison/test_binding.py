"""A call is the same call whatever its spelling: bound arguments and one operation in compare.

Two dumps of one computation, spelled differently on each side (keywords in another order, aliases,
operators, methods), pair every call and pass; a changed argument or a planted kernel fault is still
found on the call it is on.
"""
import torch
import torch.nn.functional as F

from pytest_ptdbg.comparison import schema as S


def _params():
    torch.manual_seed(0)
    p = {"x": torch.randn(4, 8, 16), "w": torch.randn(16), "b": torch.randn(16),
         "lw": torch.randn(16, 16) / 4, "lb": torch.randn(16)}
    for v in p.values():
        v.requires_grad_(True)
    return p


def _positional(p, eps=1e-5):
    h = F.layer_norm(p["x"], (16,), p["w"], p["b"], eps)
    s = F.softmax(h, dim=-1)
    y = s + p["x"]
    z = F.linear(y, p["lw"], p["lb"])
    q = z @ p["lw"]
    d = torch.div(q, 3.0)
    c = torch.cat([d, z], 2)
    c.sum().backward()


def _respelled(p, eps=1e-5):
    h = F.layer_norm(bias=p["b"], input=p["x"], weight=p["w"], normalized_shape=[16], eps=eps)
    s = h.softmax(2)
    y = torch.add(s, p["x"])
    z = F.linear(y, bias=p["lb"], weight=p["lw"])
    q = torch.matmul(z, p["lw"])
    d = q.divide(3.0)
    c = torch.concat((d, z), dim=-1)
    c.sum().backward()


def _step(fn, **kw):
    """The step ``fn`` on fresh seeded parameters made outside the dump."""
    p = _params()
    return lambda: fn(p, **kw)


def _unpaired(r):
    """Tensor rows with one side only (a default argument recorded on one side is not a tensor)."""
    t = r.table
    return t[~t[S.PAIRED] & (t[S.ARG] == "")]


def test_keywords_in_another_order_aliases_and_operators_pair_every_call(dump_step, compare_pair):
    npu = dump_step("npu", _step(_respelled))
    bench = dump_step("bench", _step(_positional))
    r = compare_pair(npu, bench)
    assert _unpaired(r).empty, _unpaired(r)[S.NPU_NAME].tolist()
    assert r.passed
    # the record names stay what each side recorded (ptdbg's names at the CSV boundary)
    names = set(r.table[S.NPU_NAME])
    assert "Tensor_softmax_0_forward_output.0" in names and "Torch_concat_0_forward_output.0" in names


def test_a_changed_argument_passed_by_keyword_is_found_on_its_call(dump_step, compare_pair):
    npu = dump_step("npu", _step(_respelled, eps=1e-2))
    bench = dump_step("bench", _step(_positional))
    r = compare_pair(npu, bench)
    assert not r.passed
    t = r.table
    changed = t[t[S.ARG_CHANGED]]
    assert set(changed[S.API]) == {"Functional_layer_norm_0_forward"}
    assert "eps" in " ".join(changed[S.ERR_MESSAGE])


def _bf16_softmax(orig):
    """Tensor.softmax computing in bf16 inside the kernel: capture sees Tensor.softmax only."""
    def softmax(*args, **kwargs):
        ts = tuple(a for a in args if isinstance(a, torch.Tensor))
        if torch.overrides.has_torch_function(ts):
            return torch.overrides.handle_torch_function(softmax, ts, *args, **kwargs)
        with torch._C.DisableTorchFunction():
            x = args[0]
            return orig(x.to(torch.bfloat16), *args[1:], **kwargs).to(x.dtype)
    softmax.__qualname__ = "Tensor.softmax"
    return softmax


def test_a_kernel_fault_under_other_spellings_is_named(dump_step, compare_pair):
    from real_dumps import patched

    def npu_step():
        with patched(torch.Tensor, "softmax", _bf16_softmax(torch.Tensor.softmax)):
            run()
    run = _step(_respelled)
    npu = dump_step("npu", npu_step)
    bench = dump_step("bench", _step(_positional))
    r = compare_pair(npu, bench)
    assert not r.passed
    assert _unpaired(r).empty
    assert r.first_suspect is not None and r.first_suspect.api == "Tensor_softmax_0_forward", r.first_suspect


def test_numbers_passed_as_one_keyword_list_or_one_by_one_are_the_same_argument(dump_step, compare_pair):
    """``x.view(size=(2, 3, 4))`` records ``input.1.0..2``; ``x.view(2, 3, 4)`` records ``input.1..3``:
    one argument row per number, and no record left on one side (both calls have the key
    ``Tensor_view_0_forward``: each side's records are accounted for on their own side)."""
    torch.manual_seed(0)
    x = torch.randn(2, 12, requires_grad=True)
    npu = dump_step("npu", lambda: x.view(size=(2, 3, 4)).reshape(shape=(6, 4)).sum().backward())
    bench = dump_step("bench", lambda: x.view(2, 3, 4).reshape(6, 4).sum().backward())
    r = compare_pair(npu, bench)
    t = r.table
    assert not (~t[S.PAIRED]).any(), t.loc[~t[S.PAIRED], S.BENCH_NAME].tolist()
    size = t[t[S.ARG] == "size"]
    assert list(size[S.NPU_NAME]) == [f"Tensor_view_0_forward_input.1.{i}" for i in range(3)]
    assert list(size[S.BENCH_NAME]) == [f"Tensor_view_0_forward_input.{i}" for i in (1, 2, 3)]
    assert r.passed


def test_the_replay_takes_the_bench_arguments_only_where_each_slot_holds_the_same_parameter(dump_step, compare_pair):
    """``F.linear(x, bias=b, weight=w)`` records ``input.1`` = bias; ``F.linear(x, w, b)`` records
    ``input.1`` = weight: the bench's call spec would hand the device's bias in as the weight, so the
    judgement replays the device call with its own arguments (and judges it)."""
    torch.manual_seed(0)
    x, w, b = torch.randn(3, 8), torch.randn(4, 8), torch.randn(4)
    for v in (x, w, b):
        v.requires_grad_(True)
    npu = dump_step("npu", lambda: F.linear(x, bias=b, weight=w).tanh().sum().backward())
    bench = dump_step("bench", lambda: F.linear(x, w, b).tanh().sum().backward())
    r = compare_pair(npu, bench)
    assert r.passed
    by_key = {v.key: v for v in r.judgement.replay.verdicts}
    linear, tanh = by_key["Functional_linear_0_forward"], by_key["Tensor_tanh_0_forward"]
    assert linear.status == tanh.status == "within budget"
    assert linear.bench_arguments is False and tanh.bench_arguments is True


def test_a_commutative_call_with_its_operands_the_other_way_round_pairs_operand_with_operand(dump_step,
                                                                                             compare_pair):
    """``h + x + b`` against ``b + (x + h)``: the same bits; each operand's rows (and its gradient's)
    compare it with itself, for operands of one shape (by dataflow and values) and of two (by shape)."""
    torch.manual_seed(0)
    w, x, b = torch.randn(4, 4), torch.randn(3, 4), torch.randn(4)
    for v in (w, x, b):
        v.requires_grad_(True)
    npu = dump_step("npu", lambda: ((x @ w) + x + b).tanh().sum().backward())
    bench = dump_step("bench", lambda: (b + (x + (x @ w))).tanh().sum().backward())
    r = compare_pair(npu, bench)
    t = r.table
    assert t[S.PAIRED].all() and t[S.PASSED].all(), t.loc[~t[S.PASSED], [S.NPU_NAME, S.ERR_MESSAGE]]
    assert r.passed
    rows = dict(zip(t[S.NPU_NAME], t[S.BENCH_NAME]))
    assert rows["Tensor_add_0_forward_input.0"] == "Tensor_add_0_forward_input.1"
    assert rows["Tensor_add_1_backward_output.1"] == "Tensor_add_1_backward_output.0"


def test_operands_of_a_call_that_does_not_commute_are_never_crossed(dump_step, compare_pair):
    torch.manual_seed(0)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    npu = dump_step("npu", lambda: (y - x).sum())
    bench = dump_step("bench", lambda: (x - y).sum())
    r = compare_pair(npu, bench)
    assert not r.passed
    rows = dict(zip(r.table[S.NPU_NAME], r.table[S.BENCH_NAME]))
    assert rows["Tensor_sub_0_forward_input.0"] == "Tensor_sub_0_forward_input.0"


def test_a_parameter_only_one_spelling_has_names_no_suspect(dump_step, compare_pair):
    """``F.softmax`` records ``_stacklevel``; ``torch.softmax`` has no such parameter: the argument row
    on the bench side only belongs to the paired call, not to a call of the bench's own."""
    torch.manual_seed(0)
    x = torch.randn(4, 8, requires_grad=True)
    npu = dump_step("npu", lambda: torch.softmax(x, -1).square().sum().backward())
    bench = dump_step("bench", lambda: F.softmax(x, dim=-1).square().sum().backward())
    for summary in (False, True):
        r = compare_pair(npu, bench, out=f"out{summary}", summary_compare=summary)
        assert r.passed and r.advice.suspects == [], [s.api for s in r.advice.suspects]


def test_comparing_the_same_dumps_twice_gives_the_same_table(dump_step, compare_pair):
    """Binding and the operand order are recomputed for each compare of the same read dumps."""
    from pytest_ptdbg.comparison.table import build_table
    from pytest_ptdbg.dump.reader import read_dump

    torch.manual_seed(0)
    x = torch.randn(3, 4, requires_grad=True)
    # both operands made by recorded calls: the dataflow decides their order
    npu = read_dump(dump_step("npu", lambda: (x.tanh() + x.sigmoid()).square().sum().backward()).pkl)
    bench = read_dump(dump_step("bench", lambda: (x.sigmoid() + x.tanh()).square().sum().backward()).pkl)
    first = build_table(npu, bench)
    second = build_table(npu, bench)
    assert first[S.PASSED].all() and second[S.PASSED].all()
    assert list(first[S.BENCH_NAME]) == list(second[S.BENCH_NAME])


def test_independent_calls_of_other_operations_made_in_another_order_pair(dump_step, compare_pair):
    """``a = x.tanh(); b = x.sigmoid()`` against ``b`` first: no order-preserving alignment keeps
    both; the one-sided calls of one operation and structure on both sides are one call reordered,
    which the compare says (a note) and passes; a call on one side only is still one."""
    torch.manual_seed(0)
    x = torch.randn(3, 4, requires_grad=True)

    def npu_step():
        a = x.tanh()
        b = x.sigmoid()
        (a * b).sum().backward()

    def bench_step():
        b = x.sigmoid()
        a = x.tanh()
        (a * b).sum().backward()
    r = compare_pair(dump_step("npu", npu_step), dump_step("bench", bench_step))
    assert r.table[S.PAIRED].all() and r.passed
    assert any("reordered" in n for n in r.notes), r.notes
    extra = compare_pair(dump_step("npu2", lambda: (x.tanh() * x.sigmoid()).exp().sum().backward()),
                         dump_step("bench2", bench_step), out="out2")
    assert not extra.passed
