"""TF32/HF32: the float32 precision a device's flags allow a matmul or convolution is recorded per
call and per dump, and the judgement budgets each call in that mode.

A convolution computed with TF32-rounded operands (emulated on this CPU below capture, as a GPU with
cuDNN's default ``allow_tf32`` computes it) passes when the run recorded TF32 as allowed (the
device's flags mocked as cuDNN's defaults), and is the root cause, named as a TF32 computation in a
strict-float32 run, when it recorded strict float32 (this CPU's own flags). The device side of the
flags (CUDA, Ascend) is read through mocks of torch's flags."""
import json
import os

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402

import example_models as em  # noqa: E402

# setting oneDNN's float32 precision on a CPU build warns that only Intel GPUs accelerate it
pytestmark = pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN:UserWarning")
from pytest_ptdbg import PrecisionDebugger, compare, seed_all  # noqa: E402
from pytest_ptdbg.dump.call_spec import math_modes  # noqa: E402
from pytest_ptdbg.errors import ReplayRefused  # noqa: E402
from pytest_ptdbg.format import records  # noqa: E402
from pytest_ptdbg.format.environment import differences, fp32_words  # noqa: E402
from pytest_ptdbg.replayer.modes import MathModes, recorded_modes  # noqa: E402
from pytest_ptdbg.runtime import environment as E  # noqa: E402
from pytest_ptdbg.runtime.reduced_fp32 import FP32_APIS, api_family, round_mantissa  # noqa: E402


# --------------------------------------------------------------------------- the rounding itself

def test_round_mantissa_rounds_to_nearest_ties_to_even_by_hand():
    u = 2.0 ** -10  # TF32's spacing at 1.0
    x = torch.tensor([1.0, 1 + u / 2, 1 + 3 * u / 2, 1 + u / 2 + 2 ** -20, -(1 + 3 * u / 2), 0.0, -0.0,
                      float("inf"), float("nan"), 3.0e38, 1.0e-40], dtype=torch.float32)
    r = round_mantissa(x, "tf32")
    assert r[0] == 1.0
    assert r[1] == 1.0                      # a tie goes to the even mantissa (1.0)
    assert r[2] == 1 + 2 * u                # a tie between 1+u (odd) and 1+2u (even)
    assert r[3] == 1 + u                    # just above the tie: up
    assert r[4] == -(1 + 2 * u)             # negatives round by magnitude
    assert r[5] == 0.0 and r[6] == 0.0 and str(float(r[6])) == "-0.0"
    assert torch.isinf(r[7]) and torch.isnan(r[8])
    assert float(r[9]) == pytest.approx(3.0e38, rel=2 ** -10)
    assert float(r[10]) == pytest.approx(1.0e-40, rel=1e-2)  # subnormals keep their leading bits
    # HF32 keeps 11 bits, bf16 7: 1 + 2^-11 survives HF32, not TF32; bf16 rounding is torch's own
    h = torch.tensor([1 + 2.0 ** -11], dtype=torch.float32)
    assert round_mantissa(h, "hf32") == h and round_mantissa(h, "tf32") == 1.0
    y = torch.randn(1000)
    assert torch.equal(round_mantissa(y, "bf16"), y.to(torch.bfloat16).float())
    # as hardware: at most half a TF32 unit off, and already-representable values unchanged
    assert float(((round_mantissa(y, "tf32") - y).abs() / y.abs()).max()) <= 2.0 ** -11
    assert torch.equal(round_mantissa(round_mantissa(y, "tf32"), "tf32"), round_mantissa(y, "tf32"))
    assert round_mantissa(torch.ones(2, dtype=torch.float64), "tf32").dtype == torch.float64


def test_the_families_and_product_operands_of_matmuls_and_convolutions():
    assert api_family("Functional", "conv2d") == "conv" and api_family("Functional", "linear") == "matmul"
    assert api_family("Tensor", "__matmul__") == "matmul" and api_family("VF", "lstm") == "rnn"
    assert api_family("Functional", "relu") is None and api_family("Torch", "add") is None
    assert FP32_APIS[("Torch", "addmm")][1] == ((1, "mat1"), (2, "mat2"))  # the bias is not rounded
    assert FP32_APIS[("Functional", "linear")][1] == ((0, "input"), (1, "weight"))


# ------------------------------------------------------------------- reading the device's flags

class _Flags:
    """Mocks ``torch.<path>`` reads of ``runtime/environment.py`` (``_attr``)."""

    def __init__(self, monkeypatch, values):
        monkeypatch.setattr(E, "_attr", lambda path: values.get(path))


def test_cuda_defaults_allow_tf32_convolutions_and_strict_matmuls(monkeypatch):
    # torch's defaults: cudnn.conv.fp32_precision "tf32" (allow_tf32 True), matmul "none" -> ieee
    _Flags(monkeypatch, {"backends.cudnn.conv.fp32_precision": "tf32", "backends.cudnn.fp32_precision": "none",
                         "backends.cuda.matmul.fp32_precision": "none", "backends.cuda.fp32_precision": None,
                         "backends.fp32_precision": "none"})
    assert E.fp32_mode("conv", "cuda") == "tf32"
    assert E.fp32_mode("matmul", "cuda") == ""


def test_float32_matmul_precision_high_allows_tf32_matmuls(monkeypatch):
    _Flags(monkeypatch, {"backends.cuda.matmul.fp32_precision": "tf32", "backends.fp32_precision": "none"})
    assert E.fp32_mode("matmul", "cuda") == "tf32"
    # the global setting is inherited where the op and backend say "none"
    _Flags(monkeypatch, {"backends.cuda.matmul.fp32_precision": "none", "backends.fp32_precision": "tf32"})
    assert E.fp32_mode("matmul", "cuda") == "tf32"


def test_an_older_torch_is_read_through_the_legacy_flags(monkeypatch):
    _Flags(monkeypatch, {"backends.cuda.matmul.allow_tf32": False, "get_float32_matmul_precision": "high",
                         "backends.cudnn.allow_tf32": False})
    assert E.fp32_mode("matmul", "cuda") == "tf32" and E.fp32_mode("conv", "cuda") == ""
    _Flags(monkeypatch, {"backends.cuda.matmul.allow_tf32": False, "get_float32_matmul_precision": "medium"})
    assert E.fp32_mode("matmul", "cuda") == "bf16"
    _Flags(monkeypatch, {})
    assert E.fp32_mode("conv", "cuda") == ""  # nothing readable: strict


def test_ascend_hf32_flags_are_read_where_torch_npu_is_imported(monkeypatch):
    import sys
    import types

    monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
    npu = types.SimpleNamespace(conv=types.SimpleNamespace(allow_hf32=True),
                                matmul=types.SimpleNamespace(allow_hf32=False))
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    assert E.fp32_mode("conv", "npu") == "hf32" and E.fp32_mode("matmul", "npu") == ""
    monkeypatch.delitem(sys.modules, "torch_npu")
    assert E.fp32_mode("conv", "npu") == ""  # no torch_npu: nothing to read


def test_a_flag_that_raises_reads_as_unknown_never_into_the_step(monkeypatch):
    class Refusing:
        @property
        def allow_tf32(self):
            raise RuntimeError("mix of legacy and new APIs")

    monkeypatch.setattr(torch.backends.cuda, "matmul", Refusing())
    assert E._attr("backends.cuda.matmul.allow_tf32") is None
    env = E.arithmetic_environment()
    assert json.loads(json.dumps(env))["fp32"]["cpu"]["conv"] in ("ieee", "tf32", "bf16")


# ------------------------------------------------------------------- recorded per call, per dump

def test_a_float32_convolution_records_the_reduced_format_its_device_allows():
    x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 3, 3)
    old = torch.backends.mkldnn.conv.fp32_precision
    try:
        torch.backends.mkldnn.conv.fp32_precision = "bf16"   # oneDNN's bf16 for float32 (AMX CPUs)
        assert math_modes((x, w), {}, "conv") == {"fp32": "bf16"}
        assert math_modes((x, w), {}, None) is None           # not a product: no mode
        assert math_modes((x.double(), w.double()), {}, "conv") is None  # float64: no reduced format
        with torch.autocast("cpu", dtype=torch.bfloat16):   # autocast decides the dtype instead
            assert math_modes((x, w), {}, "conv") == {"autocast": "torch.bfloat16"}
        torch.backends.mkldnn.conv.fp32_precision = "tf32"   # oneDNN's TF32 runs on Intel GPUs only:
        assert math_modes((x, w), {}, "conv") is None         # a CPU computes the call in float32
    finally:
        torch.backends.mkldnn.conv.fp32_precision = old
    assert math_modes((x, w), {}, "conv") is None  # strict float32: nothing recorded (dumps unchanged)


@pytest.mark.parametrize("raw", [{"fp32": "fp8"}, {"fp32": True}, {"fp32": "__import__('os')"}])
def test_a_crafted_fp32_mode_is_refused_naming_it(raw):
    with pytest.raises(ReplayRefused, match="modes"):
        recorded_modes({"args": [], "kwargs": {}, "modes": raw}, "Functional_conv2d_0_forward")
    assert recorded_modes({"modes": {"fp32": "tf32"}}, "x") == MathModes(fp32="tf32")


def test_environment_differences_name_the_float32_mode_in_words():
    dev = {"accelerator": {"type": "cuda", "name": "NVIDIA H200", "capability": "9.0"},
           "fp32": {"cpu": {"matmul": "ieee", "conv": "ieee", "rnn": "ieee"},
                    "cuda": {"matmul": "ieee", "conv": "tf32", "rnn": "tf32"}},
           "versions": {"torch": "2.13.0+cu128"}, "computed_on": ["cuda"]}
    bench = {"accelerator": None, "fp32": {"cpu": {"matmul": "ieee", "conv": "ieee", "rnn": "ieee"}},
             "versions": {"torch": "2.13.0+cpu"}, "computed_on": ["cpu"]}
    assert fp32_words(dev) == "TF32 convolutions and RNNs allowed" and fp32_words(bench) == "strict float32"
    diff = differences(dev, bench)
    assert diff[0] == "device: device NVIDIA H200 (cuda, capability 9.0); bench cpu"
    assert "float32: device TF32 convolutions and RNNs allowed; bench strict float32" in diff
    assert "versions torch: device 2.13.0+cu128; bench 2.13.0+cpu" in diff
    assert differences(bench, bench) == [] and differences(None, bench) == []


# -------------------------------------------------- a TF32 convolution judged in its recorded mode

class _RoundGrad(torch.autograd.Function):
    """Identity forward; the gradient arriving is rounded to TF32 (the backward products round it)."""

    @staticmethod
    def forward(ctx, t):
        return t.view_as(t)

    @staticmethod
    def backward(ctx, g):
        return round_mantissa(g, "tf32")


def _st(t):
    return t + (round_mantissa(t, "tf32") - t).detach()


class _TF32Convolutions(TorchFunctionMode):
    """Below capture: every float32 conv2d computes as cuDNN does with TF32 (operands and incoming
    gradients rounded to 10 mantissa bits, float32 accumulation): a correct kernel in that mode."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.conv2d:
            out = func(_st(args[0]), _st(args[1]), *args[2:], **kwargs)
            return _RoundGrad.apply(out)
        return func(*args, **kwargs)


def _cudnn_default_flags(family, device_type):
    """The flags of a CUDA device with cuDNN's defaults, read for this CPU's calls (the device
    mocked): float32 convolutions may compute in TF32, matmuls are strict."""
    return "tf32" if family == "conv" else ""


def _dump(path, tf32_kernel: bool, allow: bool):
    """One CNN step; ``tf32_kernel``: its convolutions compute in TF32 (below capture, as cuDNN
    does); ``allow``: the dump reads the device's flags as cuDNN's defaults (TF32 convolutions
    allowed), else as this CPU's (strict float32)."""
    import pytest_ptdbg.dump.call_spec as CS

    seed_all(0)
    model, batch = em.cnn(seed=0)
    dbg = PrecisionDebugger(dump_path=str(path), step=[0])
    dbg.configure_hook(mode="api_stack")
    with pytest.MonkeyPatch.context() as mp:
        if allow:
            mp.setattr(CS, "fp32_mode", _cudnn_default_flags)
            mp.setattr(E, "fp32_mode", _cudnn_default_flags)
        if tf32_kernel:
            with _TF32Convolutions():
                dbg.start()
                em.train_step(model, batch)
                dbg.stop()
        else:
            dbg.start()
            em.train_step(model, batch)
            dbg.stop()
    dbg.close()
    return records.rank_dir(str(path), 0)


@pytest.fixture(scope="module")
def tf32_dumps(tmp_path_factory):
    root = tmp_path_factory.mktemp("tf32")
    return {"bench": _dump(root / "bench", False, False), "allowed": _dump(root / "allowed", True, True),
            "strict": _dump(root / "strict", True, False), "root": root}


def test_a_tf32_convolution_passes_where_the_run_allowed_tf32(tf32_dumps):
    d = tf32_dumps
    with open(os.path.join(d["allowed"], "api_stack_dump.manifest.json")) as f:
        env = json.load(f)["environment"]
    assert env["fp32"]["cpu"]["conv"] == "tf32" and env["computed_on"] == ["cpu"]
    r = compare({"npu_pkl_path": d["allowed"], "bench_pkl_path": d["bench"]}, str(d["root"] / "out-allowed"))
    assert r.passed, [rc.detail for rc in r.judgement.root_causes]
    judged = [v for v in r.judgement.replay.verdicts if "conv2d" in v.api]
    assert len(judged) >= 4 and all(v.ratio <= 1 for v in judged)   # forward and backward, in TF32
    note = " ".join(r.notes)
    assert "float32: device TF32 convolutions allowed; bench strict float32" in note
    with open(r.html_path) as f:  # the report shows both environments side by side, the difference marked
        html = f.read()
    section = html[html.index("Arithmetic environments"):]
    assert ('<tr class="differs"><td>float32 matmul/conv/RNN</td><td class="mono">TF32 convolutions allowed'
            '</td><td class="mono">strict float32</td></tr>') in section


def test_a_tf32_convolution_in_a_strict_float32_run_is_the_root_cause_named_as_tf32(tf32_dumps):
    d = tf32_dumps
    r = compare({"npu_pkl_path": d["strict"], "bench_pkl_path": d["bench"]}, str(d["root"] / "out-strict"))
    assert not r.passed
    causes = r.judgement.root_causes
    assert causes and all("conv2d" in rc.api for rc in causes)
    first = causes[0]
    assert first.api == "Functional_conv2d_0_forward" and first.matches_dtype == "tf32"
    assert "computed in TF32" in first.detail and "strict float32" in first.detail
    assert str(first.category) == "reduced-precision kernel"
    assert "TF32" in r.advice.first.advice and "allow_tf32" in r.advice.first.advice
    backward = [rc for rc in causes if rc.direction == "backward"]
    assert backward and all(rc.matches_dtype == "tf32" for rc in backward)


def test_a_strict_float32_convolution_still_passes_where_tf32_was_allowed(tf32_dumps, tmp_path):
    """Allowed, not required: a device that computes in strict float32 anyway is within budget."""
    d = tf32_dumps
    plain_allowed = _dump(tmp_path / "plain-allowed", False, True)
    r = compare({"npu_pkl_path": plain_allowed, "bench_pkl_path": d["bench"]}, str(tmp_path / "out"))
    assert r.passed
