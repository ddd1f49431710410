"""Capture on real models: names, outermost calls, captured references, identity checks, indexing,
the call spec round trip, and backward records equal to independently computed gradients."""
import json
import os
from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import relu as captured_relu  # captured before any debugger starts

from example_models import lstm, mlp, train_step
from pytest_ptdbg import PrecisionDebugger
from pytest_ptdbg.capture import names
from pytest_ptdbg.dump.call_spec import call_json, encode_call, encode_call_json
from pytest_ptdbg.errors import NotReplayable
from pytest_ptdbg.replayer.arguments import decode_call
from pytest_ptdbg.capture.engine import CaptureEngine
from pytest_ptdbg.capture.sink import Sink
from pytest_ptdbg.format import records

CAPTURED_CE = F.cross_entropy


def load_dump(rank_dir, mode="api_stack"):
    """{tensor key: (record, array or None)} and the ordered list of API keys."""
    pkl = os.path.join(rank_dir, records.pkl_name(mode))
    data = os.path.join(rank_dir, records.data_dir_name(mode))
    out, order = {}, []
    with open(pkl) as f:
        for line in f:
            rec = json.loads(line)
            if records.is_stack_record(rec):
                continue
            api = records.parse_name(rec[0]).api_key
            if api not in order:
                order.append(api)
            arr = None
            if len(rec) > 6 and "npy" in rec[6]:
                arr = np.load(os.path.join(data, rec[6]["npy"]), allow_pickle=False)
            out[rec[0]] = (rec, arr)
    return out, order


class Recorder(Sink):
    """A sink that remembers forward keys and backward gradients."""

    def __init__(self):
        self.forward = []
        self.backward = {}

    def start_call(self, call):
        return True

    def end_call(self, call):
        self.forward.append(call.forward_key)

    def on_backward(self, call, io, index, grad):
        self.backward[records.tensor_key(call.backward_key, io, index)] = grad.detach().clone()


def capture(fn):
    rec = Recorder()
    eng = CaptureEngine([rec])
    eng.start()
    try:
        result = fn()
    finally:
        eng.stop()
    return rec, result


# ------------------------------------------------------------------------------------ naming

def test_names_by_identity():
    assert names.classify(F.linear) == ("Functional", "linear")
    assert names.classify(torch.relu) == ("Torch", "relu")
    assert names.classify(torch._VF.lstm) == ("VF", "lstm")
    assert names.classify(torch.Tensor.__getitem__) == ("Tensor", "__getitem__")
    assert names.classify(torch.Tensor.add_) == ("Tensor", "add_")
    assert names.classify(torch.Tensor.size) is None
    assert names.classify(torch.Tensor.dim) is None
    assert names.classify(torch.Tensor.backward) is None
    assert names.is_inplace("Tensor", "add_", (), {})
    assert names.is_inplace("Functional", "relu", (torch.ones(1), True), {})
    assert not names.is_inplace("Functional", "relu", (torch.ones(1),), {"inplace": False})
    assert names.is_inplace("Torch", "add", (), {"out": torch.ones(1)})


def test_a_functional_c_function_is_functional_even_when_the_table_missed_it():
    """The name table is built once, from F's attributes: built while a test (or a library) had
    F.linear patched, it lacks the original, which is still named as F names it."""
    assert names._guess(torch._C._nn.linear) == ("Functional", "linear")
    assert names._guess(torch._C._nn.gelu) == ("Functional", "gelu")


def test_outermost_calls_only_and_no_property_records():
    x = torch.randn(4, 6, requires_grad=True)
    ln = nn.LayerNorm(6)

    def fn():
        y = ln(x)  # F.layer_norm: its inner torch.layer_norm is not seen
        _ = y.shape, y.grad_fn, y.requires_grad, y.dim(), y.size(0)
        return y.sum()

    rec, _ = capture(fn)
    assert rec.forward == ["Functional_layer_norm_0_forward", "Tensor_sum_0_forward"]


def test_captured_references_and_identity_checks_keep_working():
    act = F.gelu
    x = torch.randn(3, 4)

    def fn():
        assert act is F.gelu and F.relu is torch.nn.functional.relu  # nothing was replaced
        a = act(x)
        b = captured_relu(x)
        c = CAPTURED_CE(torch.randn(3, 4), torch.tensor([0, 1, 2]))
        return a, b, c

    rec, (a, b, c) = capture(fn)
    assert rec.forward[0] == "Functional_gelu_0_forward"
    assert rec.forward[1] == "Torch_relu_0_forward"
    assert "Functional_cross_entropy_0_forward" in rec.forward
    assert torch.equal(b, torch.relu(x))


def test_transformer_default_activation_recorded():
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    x = torch.randn(2, 5, 16)
    rec, out = capture(lambda: layer(x).sum())
    assert "Functional_relu_0_forward" in rec.forward  # activation=F.relu bound at construction
    assert "Functional_multi_head_attention_forward_0_forward" in rec.forward
    assert torch.equal(out, layer(x).sum())


INDEXES = [
    lambda t: (t > 0),  # bool mask
    lambda t: torch.tensor([0, 2]),  # index tensor
    lambda t: (slice(1, None), 0),
    lambda t: (Ellipsis, 1),
    lambda t: (None, slice(None, None, 2)),
    lambda t: [0, 1],
    lambda t: (torch.tensor([0, 1]), torch.tensor([1, 2])),
    lambda t: 1,
]


@pytest.mark.parametrize("make_index", INDEXES)
def test_indexing_of_every_kind(make_index):
    torch.manual_seed(0)
    base = torch.randn(3, 4)
    idx = make_index(base)
    plain = base.clone().requires_grad_(True)
    expected = plain[idx]
    expected.sum().backward()

    leaf = base.clone().requires_grad_(True)

    def fn():
        y = leaf[idx]
        y.sum().backward()
        z = base.clone()
        z[idx] = 7.0  # __setitem__ of the same kind
        return y, z

    rec, (y, z) = capture(fn)
    assert torch.equal(y, expected) and torch.equal(leaf.grad, plain.grad)
    ref = base.clone()
    ref[idx] = 7.0
    assert torch.equal(z, ref)
    assert "Tensor___getitem___0_forward" in rec.forward
    assert "Tensor___setitem___0_forward" in rec.forward
    assert "Tensor___getitem___0_backward_output.0" in rec.backward


def test_inplace_on_output_does_not_raise():
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(2, 4)

    def fn():
        y = F.linear(x, w)
        y.add_(1.0)  # user modifies the API's output in place
        F.relu(y, inplace=True)
        y.sum().backward()
        return y

    rec, y = capture(fn)
    ref_w = w.detach().clone().requires_grad_(True)
    r = F.linear(x, ref_w)
    r.add_(1.0)
    F.relu(r, inplace=True)
    r.sum().backward()
    assert torch.equal(y, r)
    assert torch.equal(w.grad, ref_w.grad)
    assert rec.forward == ["Functional_linear_0_forward", "Tensor_add__0_forward", "Functional_relu_0_forward",
                           "Tensor_sum_0_forward"]


# -------------------------------------------------------------------------------- backward

def test_backward_share_of_a_tensor_used_twice():
    torch.manual_seed(0)
    x = torch.randn(4, 3, requires_grad=True)
    w = torch.randn(3, requires_grad=True)

    def fn():
        a = torch.mul(x, w)
        b = torch.tanh(x)
        return (a * 2 + b).sum()

    rec, loss = capture(fn)
    loss.backward()
    # independent: the shares through mul and tanh
    xa = x.detach().clone().requires_grad_(True)
    xb = x.detach().clone().requires_grad_(True)
    wa = w.detach().clone().requires_grad_(True)
    ga, = torch.autograd.grad((torch.mul(xa, wa) * 2).sum(), [xa])
    gb, = torch.autograd.grad(torch.tanh(xb).sum(), [xb])
    bw = rec.backward
    assert torch.allclose(bw["Torch_mul_0_backward_output.0"], ga)
    assert torch.allclose(bw["Torch_tanh_0_backward_output.0"], gb)
    assert torch.allclose(bw["Torch_mul_0_backward_input.0"], torch.full((4, 3), 2.0))
    assert torch.allclose(bw["Torch_mul_0_backward_output.0"] + bw["Torch_tanh_0_backward_output.0"], x.grad)
    assert not torch.allclose(bw["Torch_mul_0_backward_output.0"], x.grad)


def _func_of(api_type, name):
    owner = {"Functional": F, "Torch": torch, "Tensor": torch.Tensor, "VF": torch._VF}[api_type]
    return getattr(owner, name)


def _check_backward_against_autograd(rank_dir, min_apis):
    """Rebuild every API with backward records from its call spec and the saved inputs, and
    compare the recorded gradients with torch.autograd.grad on that single API."""
    dump, order = load_dump(rank_dir, "all")
    checked = 0
    for api in order:
        p = records.parse_name(api)
        if p.direction != "forward":
            continue
        bw_api = records.api_key(p.api_type, p.api_name, p.call_index, "backward")
        grads_in = {k[len(bw_api) + len("_input."):]: torch.from_numpy(a) for k, (r, a) in dump.items()
                    if k.startswith(bw_api + "_input.")}
        grads_out = {k[len(bw_api) + len("_output."):]: torch.from_numpy(a) for k, (r, a) in dump.items()
                     if k.startswith(bw_api + "_output.")}
        if not grads_in or not grads_out:
            continue
        spec = None
        tensors = {}
        for k, (rec, arr) in dump.items():
            if k.startswith(api + "_input."):
                slot = k[len(api) + 1:]
                if "call" in rec[6]:
                    spec = rec[6]["call"]
                if arr is not None:
                    t = torch.from_numpy(arr.copy())
                    if slot[len("input."):] in grads_out:
                        t.requires_grad_(True)
                    tensors[slot] = t
        assert spec is not None, api
        args, kwargs = decode_call(spec, tensors, api=api)
        out = _func_of(p.api_type, p.api_name)(*args, **kwargs)
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        flat = []
        for i, o in enumerate(outs):
            if isinstance(o, (tuple, list)):
                flat += [(f"{i}.{j}", oo) for j, oo in enumerate(o)]
            else:
                flat.append((str(i), o))
        ys = [(o, grads_in[s]) for s, o in flat if s in grads_in]
        leaves = [(s, tensors["input." + s]) for s in grads_out]
        got = torch.autograd.grad([y for y, _ in ys], [t for _, t in leaves], [g for _, g in ys])
        for (s, _), g in zip(leaves, got):
            assert torch.allclose(g, grads_out[s], rtol=1e-5, atol=1e-6), (api, s)
        checked += 1
    assert checked >= min_apis


@pytest.mark.parametrize("factory, min_apis", [(mlp, 6), (lstm, 3)])
def test_backward_records_equal_autograd_grad(tmp_path, factory, min_apis):
    model, batch = factory(seed=0)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), step=[0])
    dbg.configure_hook(mode="all")
    with dbg:
        train_step(model, batch)
    dbg.close()
    _check_backward_against_autograd(records.rank_dir(str(tmp_path), 0, 0), min_apis)


# ------------------------------------------------------------------------------- call spec

CALLS = [
    (F.linear, lambda: ((torch.randn(2, 3), torch.randn(4, 3)), {"bias": torch.randn(4)})),
    (torch.Tensor.__getitem__, lambda: ((torch.randn(3, 4), (slice(None, 2, None), Ellipsis, None)), {})),
    (torch.Tensor.to, lambda: ((torch.randn(2),), {"dtype": torch.float64})),
    (torch.sum, lambda: ((torch.randn(2, 3),), {"dim": (0, 1), "keepdim": True})),
    (torch.cat, lambda: (([torch.randn(2), torch.randn(3)],), {"dim": 0})),
    (torch.clamp, lambda: ((torch.randn(5),), {"min": float("-inf"), "max": 0.5})),
    (torch.zeros, lambda: ((torch.Size([2, 3]),), {"dtype": torch.float16, "device": torch.device("cpu")})),
    (torch.Tensor.contiguous, lambda: ((torch.randn(2, 3),), {"memory_format": torch.contiguous_format})),
]


@pytest.mark.parametrize("func, make", CALLS)
def test_call_spec_round_trip(func, make):
    torch.manual_seed(0)
    args, kwargs = make()
    spec = encode_call(args, kwargs)
    spec = json.loads(json.dumps(spec))  # it is JSON
    tensors = {}

    def collect(v, path):
        if isinstance(v, torch.Tensor):
            tensors["input." + ".".join(map(str, path))] = v
        elif isinstance(v, (list, tuple)):
            for j, x in enumerate(v):
                collect(x, path + (j,))

    for i, a in enumerate(list(args) + list(kwargs.values())):
        collect(a, (i,))
    a2, k2 = decode_call(spec, tensors)
    assert torch.equal(func(*a2, **k2), func(*args, **kwargs))


@pytest.mark.parametrize("func, make", CALLS)
def test_call_spec_json_text_is_the_json_of_the_spec(func, make):
    args, kwargs = make()
    assert encode_call_json(args, kwargs) == json.dumps(encode_call(args, kwargs), separators=(", ", ": "))


def test_call_spec_json_text_of_awkward_values():
    x = torch.ones(2)
    args = (x, [x, (x, 2)], None, True, 3, -0.0, 1e300, float("nan"), "q\"\u00e9", slice(1, None), Ellipsis,
            torch.float16, torch.Size([2]), 2**70)
    kwargs = {"k\n": -1.5, "alpha": float("-inf"), "nested": [[x], ()]}
    text = encode_call_json(args, kwargs)
    assert text == json.dumps(encode_call(args, kwargs), separators=(", ", ": "))
    assert json.loads(text)["args"][1] == [{"t": "input.1.0"}, {"tuple": [{"t": "input.1.1.0"}, 2]}]


def test_call_spec_text_remembered_per_structure_is_the_text_of_each_call():
    """``call_json`` (what the dump writes) remembers the text per argument structure: calls that
    differ only where the text differs (the sign of a zero, 1 vs 1.0 vs True, a strided tensor,
    keyword names and order) each get their own text, called in any order."""
    x = torch.ones(2, 3)
    p = torch.nn.Parameter(torch.ones(2))
    calls = [((x, 1.0), {}), ((x, 1), {}), ((x, True), {}), ((x, 0.0), {}), ((x, -0.0), {}),
             ((x, float("nan")), {}), ((x, float("-inf")), {}), ((x.t(), 1.0), {}), ((x[:, ::2],), {}),
             ((p, "mean"), {}), ((x, None), {}), ((x,), {"dim": 1, "keepdim": True}),
             ((x,), {"keepdim": True, "dim": 1}), ((x,), {"dim": -1, "keepdim": True}), ((x, [1, 2]), {}),
             ((x, 2**70), {}), ((x, 1e-300), {}), ((torch.ones(2).to_sparse(),), {})]
    for order in (calls, calls[::-1], calls + calls):
        for args, kwargs in order:
            assert call_json(args, kwargs) == encode_call_json(args, kwargs), (args, kwargs)
    modes = {"autocast": "torch.bfloat16"}
    assert call_json((x, 1.0), {}, modes) == encode_call_json((x, 1.0), {}, modes) != call_json((x, 1.0), {})


def test_call_spec_unreplayable_values():
    spec = encode_call((object(),), {})
    assert "repr" in spec["args"][0]
    with pytest.raises(NotReplayable, match="repr"):
        decode_call(spec, {})
    with pytest.raises(NotReplayable, match="input.0"):
        decode_call(encode_call((torch.ones(1),), {}), {})


def test_record_counts_for_known_model(tmp_path):
    model, batch = mlp(seed=0)
    dbg = PrecisionDebugger(dump_path=str(tmp_path), step=[0])
    dbg.configure_hook(mode="api_stack", summary_only=True)
    with dbg:
        train_step(model, batch)
    dbg.close()
    fams = Counter()
    seen = set()
    with open(os.path.join(records.rank_dir(str(tmp_path), 0, 0), "api_stack_dump.pkl")) as f:
        for line in f:
            rec = json.loads(line)
            if records.is_stack_record(rec):
                continue
            p = records.parse_name(rec[0])
            if p.api_key not in seen:
                seen.add(p.api_key)
                fams[(p.api_family, p.direction)] += 1
    # MLP: fc1 -> gelu -> fc2 -> relu -> fc3, cross entropy, SGD on 6 parameters
    assert fams[("Functional_linear", "forward")] == 3
    assert fams[("Functional_linear", "backward")] == 3
    assert fams[("Functional_gelu", "forward")] == 1 and fams[("Functional_gelu", "backward")] == 1
    assert fams[("Torch_relu", "forward")] == 1 and fams[("Torch_relu", "backward")] == 1
    assert fams[("Functional_cross_entropy", "forward")] == 1
    assert fams[("Functional_cross_entropy", "backward")] == 1
    assert fams[("Tensor_add_", "forward")] == 6  # SGD updates


def _gradient_records(tmp_path, node_taps, monkeypatch):
    """{key: statistics} of every backward record of a tiny GPT step and of idioms whose input
    gradients pass through several nodes (linear on 1-D and 3-D inputs, an input given back,
    the same tensor twice, a list input, a split output)."""
    import example_models as em

    monkeypatch.setattr(CaptureEngine, "node_taps", node_taps)
    torch.manual_seed(0)
    model, batch = em.tiny_gpt(seed=0)
    w = torch.randn(4, 8, requires_grad=True)
    out = str(tmp_path / ("nodes" if node_taps else "aliases"))
    dbg = PrecisionDebugger(dump_path=out, step=[0])
    dbg.configure_hook(mode="api_stack", summary_only=True)
    dbg.start()
    torch.manual_seed(1)
    train_step(model, batch)
    for _ in range(2):
        x = torch.randn(3, 8, requires_grad=True)
        h = F.linear(x.contiguous().to(torch.float32), w) + F.linear(x[0], w).sum()
        p, q = torch.cat([h * h, h], 0).split(3)
        ((p + q).sum() + F.linear(torch.randn(2, 3, 8), w).sum() + w.contiguous().sum()).backward()
    dbg.stop()
    dbg.close()
    recs = {}
    with open(os.path.join(records.rank_dir(out, 0, 0), records.pkl_name("api_stack"))) as f:
        for line in f:
            rec = json.loads(line)
            if not records.is_stack_record(rec) and "_backward_" in rec[0]:
                recs[rec[0]] = rec[5]
    return recs


def test_node_taps_record_exactly_what_aliases_record(tmp_path, monkeypatch):
    """Input gradients read on the API's own autograd nodes are the records the view_as aliases
    give: the same keys and the same statistics (the same gradients)."""
    nodes = _gradient_records(tmp_path, True, monkeypatch)
    aliases = _gradient_records(tmp_path, False, monkeypatch)
    assert len(nodes) > 200
    assert sorted(nodes) == sorted(aliases)
    assert {k: v for k, v in nodes.items() if aliases[k] != v} == {}


def test_heap_is_frozen_for_the_collector_only_while_capturing(tmp_path):
    """Objects alive at start() are skipped by the cyclic collector until stop() (a full
    collection over torch's heap cost ~270 ms a step); after stop() they are collected as
    before, and a heap someone else froze is left alone."""
    import gc

    model, batch = mlp(seed=0)
    dbg = PrecisionDebugger(dump_path=str(tmp_path / "a"), hook_name="dump", step=None)
    dbg.configure_hook(mode="api_stack", summary_only=True)
    assert gc.get_freeze_count() == 0
    dbg.start()
    frozen = gc.get_freeze_count()
    train_step(model, batch)
    dbg.stop()
    assert frozen > 10000 and gc.get_freeze_count() == 0
    # cyclic garbage made before start() is collected after stop()
    class Node:
        pass
    a, b = Node(), Node()
    a.other, b.other = b, a
    import weakref
    ref = weakref.ref(a)
    del a, b
    dbg.start()
    gc.collect()
    assert ref() is not None  # frozen: not examined while capturing
    dbg.stop()
    gc.collect()
    assert ref() is None
    gc.freeze()  # someone else's frozen heap
    try:
        before = gc.get_freeze_count()
        dbg.start()
        dbg.stop()
        assert gc.get_freeze_count() == before
    finally:
        gc.unfreeze()
    dbg.close()
