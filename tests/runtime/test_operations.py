"""One operation per API whatever its spelling, and arguments bound to torch's own signatures."""
import pytest

from pytest_ptdbg.runtime.operations import NO_DEFAULT, bind, operation, signatures


@pytest.mark.parametrize("spellings, op", [
    ([("Functional", "softmax"), ("Torch", "softmax"), ("Tensor", "softmax")], "softmax"),
    ([("Tensor", "__add__"), ("Tensor", "__radd__"), ("Torch", "add"), ("Tensor", "add"), ("Tensor", "add_"),
      ("Tensor", "__iadd__")], "add"),
    ([("Tensor", "__matmul__"), ("Torch", "matmul"), ("Tensor", "matmul")], "matmul"),
    ([("Torch", "divide"), ("Torch", "true_divide"), ("Tensor", "div"), ("Tensor", "__truediv__"),
      ("Tensor", "divide")], "div"),
    ([("Torch", "multiply"), ("Tensor", "__mul__"), ("Tensor", "__rmul__"), ("Tensor", "multiply")], "mul"),
    ([("Torch", "concat"), ("Torch", "concatenate"), ("Torch", "cat")], "cat"),
    ([("Torch", "clip"), ("Tensor", "clamp"), ("Tensor", "clip_")], "clamp"),
    ([("Tensor", "__neg__"), ("Torch", "negative"), ("Torch", "neg")], "neg"),
    ([("Functional", "sigmoid"), ("Torch", "sigmoid"), ("Tensor", "sigmoid")], "sigmoid"),
])
def test_every_spelling_of_an_operation_is_that_operation(spellings, op):
    assert {operation(*s).name for s in spellings} == {op}


def test_a_reflected_operator_that_does_not_commute_swaps_its_operands():
    assert operation("Tensor", "__rpow__").swapped and operation("Tensor", "__rtruediv__").swapped
    assert not operation("Tensor", "__radd__").swapped       # 2 + x is x + 2, bit for bit
    assert operation("Tensor", "__rsub__").name == "rsub"     # torch.rsub(x, y) is y - x


def test_distinct_operations_stay_distinct():
    names = {operation(*s).name for s in [("Torch", "add"), ("Torch", "sub"), ("Tensor", "__getitem__"),
                                          ("Tensor", "__setitem__"), ("Functional", "gelu"),
                                          ("Distributed", "all_reduce"), ("NPU", "npu_rms_norm")]}
    assert len(names) == 7
    assert operation("Distributed", "all_reduce").name == "Distributed_all_reduce"


def _is_tensor(v):
    if isinstance(v, str):
        return v.startswith("T")
    return False if isinstance(v, (int, float, tuple)) else None


def _bound(api, args, kwargs=None):
    b = bind(*api, args, kwargs or {}, _is_tensor)
    assert b is not None, api
    return b


def test_positional_and_keyword_arguments_bind_to_the_same_parameters():
    pos = _bound(("Functional", "layer_norm"), ["T0", (16,), "T2", "T3", 1e-5])
    kw = _bound(("Functional", "layer_norm"), [], {"bias": "T3", "input": "T0", "weight": "T2",
                                                   "normalized_shape": (16,)})
    assert pos.values == kw.values == {"input": "T0", "normalized_shape": (16,), "weight": "T2", "bias": "T3",
                                       "eps": 1e-5}
    assert pos.source["bias"] == 3 and kw.source["bias"] == "bias"
    assert "eps" in pos.given and "eps" not in kw.given


def test_a_builtin_binds_to_its_aten_schema_with_defaults_filled():
    b = _bound(("Functional", "linear"), ["T0"], {"bias": "T2", "weight": "T1"})
    assert b.values == {"input": "T0", "weight": "T1", "bias": "T2"}
    g = _bound(("Functional", "gelu"), ["T0"])
    assert g.values == {"input": "T0", "approximate": "none"} and g.given == ["input"]
    s = _bound(("Torch", "add"), ["T0", "T1"])
    assert s.values == {"input": "T0", "other": "T1", "alpha": 1}


def test_the_overload_follows_what_the_arguments_hold():
    assert set(_bound(("Torch", "max"), ["T0", 1]).values) == {"input", "dim", "keepdim"}
    assert set(_bound(("Torch", "max"), ["T0", "T1"]).values) == {"input", "other"}


def test_the_remaining_positional_numbers_fill_a_list_parameter():
    a = _bound(("Tensor", "view"), ["T0", 2, 3])
    b = _bound(("Tensor", "view"), ["T0", (2, 3)])
    assert a.values == b.values == {"input": "T0", "size": (2, 3)}
    assert a.packed == "size" and not b.packed


def test_a_dunder_binds_as_its_operation_and_a_swapped_one_with_its_operands_swapped():
    assert _bound(("Tensor", "__add__"), ["T0", "T1"]).values == {"input": "T0", "other": "T1", "alpha": 1}
    p = _bound(("Tensor", "__rpow__"), ["T0", 2.0])     # 2.0 ** x
    assert p.values == {"input": 2.0, "exponent": "T0"} and p.source == {"input": 1, "exponent": 0}


def test_signatures_come_from_torch_and_an_unknown_api_has_none():
    (ln,) = signatures("Functional", "layer_norm")
    assert [p.name for p in ln] == ["input", "normalized_shape", "weight", "bias", "eps"]
    assert ln[0].default is NO_DEFAULT and ln[4].default == 1e-5
    assert signatures("Torch", "no_such_api_xyz") == ()
    assert bind("Torch", "no_such_api_xyz", ["T0"], {}) is None
    assert bind("Functional", "linear", ["T0"], {"no_such_param": 1}) is None


def test_the_alias_table_is_what_the_installed_torch_documents():
    from pytest_ptdbg.runtime.operations import derive_aliases
    from pytest_ptdbg.runtime.torch_aliases import ALIASES

    assert derive_aliases() == ALIASES, "regenerate with: python -m pytest_ptdbg.runtime.operations"


def test_naming_an_operation_needs_no_torch():
    import subprocess
    import sys

    code = ("import sys; from pytest_ptdbg.runtime.operations import operation; "
            "assert operation('Torch', 'divide').name == 'div'; assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_name_from_a_dump_is_looked_up_without_running_lazy_attributes(monkeypatch):
    """``torch.__getattr__`` imports submodules on first access: a recorded name never triggers it."""
    import torch

    called = []
    real = getattr(torch, "__getattr__", None)

    def spy(name):
        called.append(name)
        if real is None:
            raise AttributeError(name)
        return real(name)
    monkeypatch.setattr(torch, "__getattr__", spy, raising=False)
    assert signatures("Torch", "onnx_no_such_lazy_name") == ()
    assert signatures("Torch", "../x") == ()
    assert called == []
    (sig,) = signatures("Torch", "einsum")[:1]   # a Python function of torch: its own signature
    assert sig[0].name == "equation"


def test_the_signature_table_is_what_the_installed_torch_gives():
    """runtime/torch_signatures.py holds, for every API capture can record, exactly the signatures
    torch itself gives (decoded: defaults, tuples vs lists, inf, flags), for the installed version."""
    import json

    from pytest_ptdbg.capture.signature_table import recordable_apis
    from pytest_ptdbg.runtime import operations as O
    from pytest_ptdbg.runtime import torch_signatures as T

    hint = "regenerate with: python -m pytest_ptdbg.capture.signature_table > pytest_ptdbg/runtime/torch_signatures.py"
    assert T.TORCH_VERSION == O._installed_torch(), hint
    table = json.loads(T.SIGNATURES_JSON)
    # (the name table can hold more APIs in a process that imported more of torch: those ask torch)
    keys = [k for k in recordable_apis() if f"{k[0]}.{k[1]}" in table]
    assert len(keys) == len(table) > 1000, hint
    assert table == O.derive_signatures(keys), hint
    for t, n in keys:  # decoding gives back the very objects torch's answer holds
        got = O._static_signatures(t, n)
        want = O._torch_signatures(t, n)
        assert repr(got) == repr(want), (t, n)
        assert [[type(p.default) for p in s] for s in got] == [[type(p.default) for p in s] for s in want], (t, n)


def test_a_statistics_compare_imports_no_torch(tmp_path):
    """Binding the recorded calls of a real dump reads the table: a statistics compare in a fresh
    process never imports torch (2 s and ~150 MiB otherwise)."""
    import subprocess
    import sys
    import textwrap

    from real_dumps import dump_one_step

    npu = dump_one_step(tmp_path / "npu", "tiny_gpt", summary_only=True)
    bench = dump_one_step(tmp_path / "bench", "mlp", summary_only=True)  # (another model: any verdict)
    code = textwrap.dedent(f"""
        import sys
        from pytest_ptdbg import compare
        r = compare({{"npu_pkl_path": {str(npu.rank_dir)!r}, "bench_pkl_path": {str(bench.rank_dir)!r}}},
                    {str(tmp_path / "out")!r}, replay_check=False)
        assert r.csv_path, r
        print("torch imported:", "torch" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "torch imported: False" in out.stdout, out.stdout[-2000:]
