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
