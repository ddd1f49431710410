"""The planted faults and the clean pairs of the diagnosis benchmark.

A :class:`Fault` is one wrong call at one call site of one architecture's training step:
``where`` is ``"below capture"`` (the recorded call's output, or the gradients it produces, are
wrong for its recorded inputs, like a faulty device kernel) or ``"user code"`` (a changed line of
model code: an argument, a dtype, an extra call, a gradient hook). ``family`` is the API family
(``{Type}_{name}``) the fault is planted on; the exact API key (with its call index) is found by
the runner from the dumps. ``plant()`` gives a fresh :class:`Plant` (``layer`` and ``mode``, a
context manager) for one run.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F

from benchmarks.faults import rewrites as R
from benchmarks.faults.planting import BelowCapture, Site, UserCode

__all__ = ["Fault", "Plant", "CleanPair", "FAULTS", "CLEAN_PAIRS", "FAST_FAULTS", "FAST_CLEAN"]


@dataclass
class Plant:
    """One run's planted fault: ``layer`` ``"below"`` or ``"user"``, and its mode."""

    layer: str
    mode: Any

    @property
    def record(self):
        return self.mode.record


@dataclass(frozen=True)
class Fault:
    """One planted single-call fault."""

    id: str
    arch: str
    family: str  # planted API family, e.g. "Functional_softmax"
    direction: str  # "forward" | "backward"
    where: str  # "below capture" | "user code"
    size: str  # nominal size: "1e-3", "nan", "inf", or what the code change is
    target: Callable[[], Any]
    occurrence: int = 0
    match: Optional[Callable[[tuple, dict], bool]] = None
    rewrite: Optional[Callable[..., Any]] = None  # user code only
    #: the device side's spelling (``spellings.SPELLINGS``; "" the bench's): the fault runs on
    #: ``"fp32+kw"``... and ``family`` is the respelled API's; a user-code ``target`` is the
    #: model's own spelling, a below-capture one the respelled callable
    spelling: str = ""

    def devices(self, base: Tuple[str, ...]) -> List[str]:
        """The device settings this fault runs on: ``base``, respelled when it has a spelling."""
        return [f"{d}+{self.spelling}" if self.spelling else d for d in base]

    def plant(self) -> Plant:
        """A fresh plant (new call counter and record) for one run."""
        site = Site(self.target, self.occurrence, self.match)
        if self.where == "below capture":
            size: Any = self.size if self.size in ("nan", "inf") else float(self.size)
            return Plant("below", BelowCapture(site, self.id, size, self.direction))
        return Plant("user", UserCode(site, self.id, self.rewrite))


@dataclass(frozen=True)
class CleanPair:
    """A device run that should agree with the bench: architecture and device setting."""

    id: str
    arch: str
    device: str  # a key of dumps.DEVICES
    what: str


T = torch.Tensor


def _below(id, arch, family, target, occ, size, direction="forward", match=None) -> Fault:
    return Fault(id, arch, family, direction, "below capture", size, target, occ, match)


def _user(id, arch, family, target, occ, size, rewrite, direction="forward", match=None) -> Fault:
    return Fault(id, arch, family, direction, "user code", size, target, occ, match, rewrite)


def _spelled(spelling: str, fault: Fault) -> Fault:
    return replace(fault, spelling=spelling)


def _eq(pos: int, value: Any) -> Callable[[tuple, dict], bool]:
    return lambda a, k: len(a) > pos and isinstance(a[pos], float) and a[pos] == value


FAULTS: List[Fault] = [
    # ---------------------------------------------------------------- below capture (kernels)
    _below("mlp-linear1-fwd-1e-3", "mlp", "Functional_linear", lambda: F.linear, 1, "1e-3"),
    _below("mlp-linear0-bwd-1e-2", "mlp", "Functional_linear", lambda: F.linear, 0, "1e-2", "backward"),
    _below("cnn-conv1-fwd-1e-3", "cnn", "Functional_conv2d", lambda: F.conv2d, 1, "1e-3"),
    _below("cnn-conv0-bwd-nan", "cnn", "Functional_conv2d", lambda: F.conv2d, 0, "nan", "backward"),
    _below("cnn-bn0-fwd-1e-2", "cnn", "Functional_batch_norm", lambda: F.batch_norm, 0, "1e-2"),
    _below("gpt-matmul2-fwd-1e-4", "tiny_gpt", "Tensor_matmul", lambda: T.matmul, 2, "1e-4"),
    _below("gpt-ln2-fwd-inf", "tiny_gpt", "Functional_layer_norm", lambda: F.layer_norm, 2, "inf"),
    _below("gpt-emb0-bwd-1e-2", "tiny_gpt", "Functional_embedding", lambda: F.embedding, 0, "1e-2", "backward"),
    _below("gpt-addcdiv3-opt-1e-3", "tiny_gpt", "Tensor_addcdiv_", lambda: T.addcdiv_, 3, "1e-3"),
    _below("gpt-gelu1-bwd-1e-4", "tiny_gpt", "Functional_gelu", lambda: F.gelu, 1, "1e-4", "backward"),
    _below("nll-logsoftmax-fwd-1e-3", "mlp_nll", "Functional_log_softmax", lambda: F.log_softmax, 0, "1e-3"),
    _below("nll-silu-bwd-1e-2", "mlp_nll", "Functional_silu", lambda: F.silu, 0, "1e-2", "backward"),
    _below("gpt2-softmax1-fwd-1e-2", "gpt2", "Functional_softmax", lambda: F.softmax, 1, "1e-2"),
    _below("gpt2-addmm3-fwd-1e-3", "gpt2", "Torch_addmm", lambda: torch.addmm, 3, "1e-3"),
    _below("gpt2-ln4-bwd-nan", "gpt2", "Functional_layer_norm", lambda: F.layer_norm, 4, "nan", "backward"),
    _below("gpt2-ce-bwd-1e-3", "gpt2", "Functional_cross_entropy", lambda: F.cross_entropy, 0, "1e-3", "backward"),
    _below("gpt2-lerp2-opt-1e-2", "gpt2", "Tensor_lerp_", lambda: T.lerp_, 2, "1e-2"),
    _below("llama-sdpa1-fwd-1e-3", "llama", "Functional_scaled_dot_product_attention",
           lambda: F.scaled_dot_product_attention, 1, "1e-3"),
    _below("llama-rsqrt2-fwd-1e-2", "llama", "Torch_rsqrt", lambda: torch.rsqrt, 2, "1e-2"),
    _below("llama-cos0-fwd-inf", "llama", "Tensor_cos", lambda: T.cos, 0, "inf"),
    _below("llama-silu0-fwd-1e-4", "llama", "Functional_silu", lambda: F.silu, 0, "1e-4"),
    _below("llama-emb0-fwd-1e-3", "llama", "Functional_embedding", lambda: F.embedding, 0, "1e-3"),
    _below("llama-getitem-fwd-1e-3", "llama", "Tensor___getitem__", lambda: T.__getitem__, 5, "1e-3"),
    _below("bert-gelu1-fwd-1e-3", "bert", "Functional_gelu", lambda: F.gelu, 1, "1e-3"),
    _below("bert-softmax0-bwd-1e-3", "bert", "Functional_softmax", lambda: F.softmax, 0, "1e-3", "backward"),
    _below("vit-conv0-fwd-1e-2", "vit", "Functional_conv2d", lambda: F.conv2d, 0, "1e-2"),
    _below("vit-sdpa0-bwd-1e-3", "vit", "Functional_scaled_dot_product_attention",
           lambda: F.scaled_dot_product_attention, 0, "1e-3", "backward"),
    _below("vit-ln3-fwd-1e-1", "vit", "Functional_layer_norm", lambda: F.layer_norm, 3, "1e-1"),
    _below("t5-softmax2-fwd-nan", "t5", "Functional_softmax", lambda: F.softmax, 2, "nan"),
    _below("t5-mean1-fwd-1e-3", "t5", "Tensor_mean", lambda: T.mean, 1, "1e-3"),
    _below("t5-pow0-bwd-1e-3", "t5", "Tensor_pow", lambda: T.pow, 0, "1e-3", "backward"),
    _below("bert-ln2-fwd-1e-3", "bert", "Functional_layer_norm", lambda: F.layer_norm, 2, "1e-3"),
    _below("bert-linear3-bwd-1e-3", "bert", "Functional_linear", lambda: F.linear, 3, "1e-3", "backward"),
    _below("llama-ce-fwd-1e-3", "llama", "Functional_cross_entropy", lambda: F.cross_entropy, 0, "1e-3"),
    # -------------------------------------------------------------------------- user code
    _user("mlp-gelu-tanh", "mlp", "Functional_gelu", lambda: F.gelu, 0, "gelu tanh form",
          R.set_args(approximate="tanh")),
    _user("mlp-ce-smoothing", "mlp", "Functional_cross_entropy", lambda: F.cross_entropy, 0,
          "label_smoothing 1e-3", R.set_args(label_smoothing=1e-3)),
    _user("mlp-linear2-bf16-cast", "mlp", "Tensor_to", lambda: F.linear, 2, "input cast to bf16",
          R.cast_first_input(torch.bfloat16)),
    _user("cnn-bn1-eps", "cnn", "Functional_batch_norm", lambda: F.batch_norm, 1, "eps 1e-5 -> 1e-3",
          R.set_args(eps=1e-3)),
    _user("cnn-conv1-bf16-cast", "cnn", "Tensor_to", lambda: F.conv2d, 1, "input cast to bf16",
          R.cast_first_input(torch.bfloat16)),
    _user("gpt-softmax-fp16-nomax", "tiny_gpt", "Tensor_to", lambda: T.exp, 1,
          "softmax in fp16, no max subtraction", R.cast_first_input(torch.float16, back=False)),
    _user("gpt-ln1-eps", "tiny_gpt", "Functional_layer_norm", lambda: F.layer_norm, 1,
          "eps 1e-5 -> 1e-3", R.set_args(eps=1e-3)),
    _user("gpt-emb-grad-drop", "tiny_gpt", "Functional_embedding", lambda: F.embedding, 0,
          "1% of gradient dropped by a hook", R.grad_hook("drop", 0.01), "backward"),
    _user("gpt-addcdiv5-lr", "tiny_gpt", "Tensor_addcdiv_", lambda: T.addcdiv_, 5,
          "one parameter's step 1e-3 larger", R.scale_arg("value", 1.001, 3)),
    _user("nll-logsoftmax-bf16", "mlp_nll", "Functional_log_softmax", lambda: F.log_softmax, 0,
          "log_softmax in bf16", R.softmax_in(torch.bfloat16)),
    _user("gpt2-softmax0-fp16-nomax", "gpt2", "Tensor_to", lambda: F.softmax, 0,
          "softmax in fp16, no max subtraction", R.softmax_no_max(torch.float16)),
    _user("gpt2-ln4-eps", "gpt2", "Functional_layer_norm", lambda: F.layer_norm, 4,
          "eps 1e-5 -> 1e-3", R.set_args(eps=1e-3)),
    _user("gpt2-wte-grad-drop", "gpt2", "Functional_embedding", lambda: F.embedding, 0,
          "1% of gradient dropped by a hook", R.grad_hook("drop", 0.01), "backward"),
    _user("gpt2-addmm2-grad-scale", "gpt2", "Torch_addmm", lambda: torch.addmm, 2,
          "gradient scaled by 1+1e-3 by a hook", R.grad_hook("scale", 1e-3), "backward"),
    _user("llama-rotary-phase", "llama", "Tensor_add", lambda: T.cos, 0, "rotary phase off by 1e-3",
          R.add_to_input(1e-3)),
    _user("llama-rms1-eps", "llama", "Tensor_add", lambda: T.add, 1, "RMSNorm eps 1e-6 -> 1e-4",
          R.replace_arg(1, 1e-4), match=_eq(1, 1e-6)),
    _user("llama-rms2-mean-bf16", "llama", "Tensor_mean", lambda: T.mean, 2, "RMSNorm mean in bf16",
          R.with_kwargs(dtype=torch.bfloat16)),
    _user("llama-sdpa0-scale", "llama", "Functional_scaled_dot_product_attention",
          lambda: F.scaled_dot_product_attention, 0, "attention scale off by 1e-3", R.sdpa_scale(1.001)),
    _user("llama-adamw3-eps", "llama", "Tensor_add_", lambda: T.add_, 3, "AdamW eps 1e-8 -> 1e-6",
          R.replace_arg(1, 1e-6), match=_eq(1, 1e-8)),
    _user("bert-gelu0-tanh", "bert", "Functional_gelu", lambda: F.gelu, 0, "gelu tanh form",
          R.set_args(approximate="tanh")),
    _user("bert-softmax1-fp16", "bert", "Functional_softmax", lambda: F.softmax, 1, "softmax in fp16",
          R.softmax_in(torch.float16)),
    _user("vit-ln1-eps", "vit", "Functional_layer_norm", lambda: F.layer_norm, 1, "eps 1e-12 -> 1e-3",
          R.set_args(eps=1e-3)),
    _user("vit-conv0-bf16-cast", "vit", "Tensor_to", lambda: F.conv2d, 0, "input cast to bf16",
          R.cast_first_input(torch.bfloat16)),
    _user("t5-softmax3-fp16-nomax", "t5", "Tensor_to", lambda: F.softmax, 3,
          "softmax in fp16, no max subtraction", R.softmax_no_max(torch.float16)),
    _user("t5-rms3-eps", "t5", "Tensor_add", lambda: T.add, 3, "T5 RMSNorm eps 1e-6 -> 1e-4",
          R.replace_arg(1, 1e-4), match=_eq(1, 1e-6)),
    _user("vit-gelu0-tanh", "vit", "Functional_gelu", lambda: F.gelu, 0, "gelu tanh form",
          R.set_args(approximate="tanh")),
    _user("t5-softmax1-bf16", "t5", "Functional_softmax", lambda: F.softmax, 1, "softmax in bf16",
          R.softmax_in(torch.bfloat16)),
] + [
    # ------------------------------------- issue 20: the device spells its calls otherwise
    # "kw": keyword arguments where the bench passes them positionally (benchmarks/faults/spellings.py)
    _spelled("kw", f) for f in [
        _below("spell-kw-mlp-linear1-fwd-1e-3", "mlp", "Functional_linear", lambda: F.linear, 1, "1e-3"),
        _below("spell-kw-mlp-linear0-bwd-1e-2", "mlp", "Functional_linear", lambda: F.linear, 0, "1e-2",
               "backward"),
        _user("spell-kw-mlp-gelu-tanh", "mlp", "Functional_gelu", lambda: F.gelu, 0, "gelu tanh form",
              R.set_args(approximate="tanh")),
        _user("spell-kw-mlp-linear2-bf16-cast", "mlp", "Tensor_to", lambda: F.linear, 2, "input cast to bf16",
              R.cast_first_input(torch.bfloat16)),
        _below("spell-kw-gpt-add2-fwd-1e-3", "tiny_gpt", "Tensor_add", lambda: T.add, 2, "1e-3"),
        _below("spell-kw-gpt2-addmm3-fwd-1e-3", "gpt2", "Torch_addmm", lambda: torch.addmm, 3, "1e-3"),
        _user("spell-kw-gpt2-ln4-eps", "gpt2", "Functional_layer_norm", lambda: F.layer_norm, 4,
              "eps 1e-5 -> 1e-3", R.set_args(eps=1e-3)),
        _user("spell-kw-bert-gelu0-tanh", "bert", "Functional_gelu", lambda: F.gelu, 0, "gelu tanh form",
              R.set_args(approximate="tanh")),
    ]
] + [
    # "ns": another namespace or form (torch.softmax for F.softmax, torch.add for x + y,
    # torch.matmul for a @ b, torch.layer_norm for the module's F.layer_norm)
    _spelled("ns", f) for f in [
        _below("spell-ns-gpt-matmul2-fwd-1e-4", "tiny_gpt", "Torch_matmul", lambda: torch.matmul, 2, "1e-4"),
        _below("spell-ns-gpt-add2-fwd-1e-3", "tiny_gpt", "Torch_add", lambda: torch.add, 2, "1e-3"),
        _user("spell-ns-gpt-ln1-eps", "tiny_gpt", "Torch_layer_norm", lambda: F.layer_norm, 1,
              "eps 1e-5 -> 1e-3", R.set_args(eps=1e-3)),
        _below("spell-ns-gpt2-softmax1-fwd-1e-2", "gpt2", "Torch_softmax", lambda: torch.softmax, 1, "1e-2"),
        _user("spell-ns-gpt2-softmax0-fp16-nomax", "gpt2", "Tensor_to", lambda: F.softmax, 0,
              "softmax in fp16, no max subtraction", R.softmax_no_max(torch.float16)),
        _user("spell-ns-bert-softmax1-fp16", "bert", "Torch_softmax", lambda: F.softmax, 1, "softmax in fp16",
              R.softmax_in(torch.float16)),
        _below("spell-ns-bert-ln2-fwd-1e-3", "bert", "Torch_layer_norm", lambda: torch.layer_norm, 2, "1e-3"),
        _below("spell-ns-bert-matmul1-bwd-1e-3", "bert", "Tensor_matmul", lambda: T.matmul, 1, "1e-3",
               "backward"),
    ]
]

CLEAN_PAIRS: List[CleanPair] = [
    CleanPair("mlp-fp32-noise", "mlp", "fp32", "1e-6 weight noise"),
    CleanPair("mlp-bf16", "mlp", "bf16", "bf16 autocast"),
    CleanPair("mlp-fp16", "mlp", "fp16", "fp16 autocast"),
    CleanPair("cnn-fp32-noise", "cnn", "fp32", "1e-6 weight noise"),
    CleanPair("cnn-bf16", "cnn", "bf16", "bf16 autocast"),
    CleanPair("gpt-same-dropout", "tiny_gpt", "same", "identical run, seeded dropout"),
    CleanPair("gpt-fp32-noise", "tiny_gpt", "fp32", "1e-6 weight noise, seeded dropout"),
    CleanPair("gpt-bf16", "tiny_gpt", "bf16", "bf16 autocast, seeded dropout"),
    CleanPair("gpt-fp16", "tiny_gpt", "fp16", "fp16 autocast, seeded dropout"),
    CleanPair("nll-fp32-noise", "mlp_nll", "fp32", "1e-6 weight noise"),
    CleanPair("empty-same", "empty_mlp", "same", "torch.empty buffer, identical run"),
    CleanPair("empty-fp32-noise", "empty_mlp", "fp32", "torch.empty buffer, 1e-6 weight noise"),
    CleanPair("gpt2-fp32-noise", "gpt2", "fp32", "1e-6 weight noise"),
    CleanPair("gpt2-bf16", "gpt2", "bf16", "bf16 autocast"),
    CleanPair("llama-fp32-noise", "llama", "fp32", "1e-6 weight noise"),
    CleanPair("llama-bf16", "llama", "bf16", "bf16 autocast"),
    CleanPair("llama-fp16", "llama", "fp16", "fp16 autocast"),
    CleanPair("bert-fp32-noise", "bert", "fp32", "1e-6 weight noise"),
    CleanPair("bert-bf16", "bert", "bf16", "bf16 autocast"),
    CleanPair("vit-fp32-noise", "vit", "fp32", "1e-6 weight noise"),
    CleanPair("vit-bf16", "vit", "bf16", "bf16 autocast"),
    CleanPair("t5-fp32-noise", "t5", "fp32", "1e-6 weight noise"),
    CleanPair("t5-bf16", "t5", "bf16", "bf16 autocast"),
    # issue 20: pure respellings of the bench's calls (benchmarks/faults/spellings.py)
    CleanPair("spell-kw-mlp-same", "mlp", "same+kw", "keyword arguments, identical run"),
    CleanPair("spell-kw-mlp-fp32", "mlp", "fp32+kw", "keyword arguments, 1e-6 weight noise"),
    CleanPair("spell-kw-gpt-same", "tiny_gpt", "same+kw", "keyword arguments, identical run"),
    CleanPair("spell-kw-gpt-bf16", "tiny_gpt", "bf16+kw", "keyword arguments, bf16 autocast"),
    CleanPair("spell-ns-gpt-same", "tiny_gpt", "same+ns", "other namespaces, identical run"),
    CleanPair("spell-ns-gpt-fp32", "tiny_gpt", "fp32+ns", "other namespaces, 1e-6 weight noise"),
    CleanPair("spell-ns-gpt-bf16", "tiny_gpt", "bf16+ns", "other namespaces, bf16 autocast"),
    CleanPair("spell-kw-gpt2-same", "gpt2", "same+kw", "keyword arguments, identical run"),
    CleanPair("spell-ns-gpt2-same", "gpt2", "same+ns", "other namespaces, identical run"),
    CleanPair("spell-ns-gpt2-bf16", "gpt2", "bf16+ns", "other namespaces, bf16 autocast"),
    CleanPair("spell-kw-bert-fp32", "bert", "fp32+kw", "keyword arguments, 1e-6 weight noise"),
    CleanPair("spell-ns-bert-same", "bert", "same+ns", "other namespaces, identical run"),
    CleanPair("spell-kw-llama-same", "llama", "same+kw", "keyword arguments, identical run"),
    CleanPair("spell-ns-llama-bf16", "llama", "bf16+ns", "other namespaces, bf16 autocast"),
    # issue 22: the device's AdamW fused or foreach, the bench's one call per parameter
    CleanPair("opt-fused-mlp-fp32", "mlp", "fp32@fused", "AdamW(fused=True), 1e-6 weight noise"),
    CleanPair("opt-foreach-mlp-fp32", "mlp", "fp32@foreach", "AdamW(foreach=True), 1e-6 weight noise"),
    CleanPair("opt-fused-gpt-bf16", "tiny_gpt", "bf16@fused", "AdamW(fused=True), bf16 autocast"),
    CleanPair("opt-foreach-gpt-same", "tiny_gpt", "same@foreach", "AdamW(foreach=True), identical run"),
    CleanPair("opt-fused-cnn-same", "cnn", "same@fused", "AdamW(fused=True), identical run"),
]

#: the --fast subset (example models only)
FAST_FAULTS = ["mlp-linear1-fwd-1e-3", "mlp-linear0-bwd-1e-2", "gpt-softmax-fp16-nomax", "mlp-gelu-tanh",
               "cnn-conv0-bwd-nan"]
FAST_CLEAN = ["mlp-fp32-noise", "gpt-bf16", "gpt-same-dropout", "empty-same", "opt-fused-mlp-fp32",
              "opt-foreach-gpt-same"]
