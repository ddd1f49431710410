"""What kind of API a suspect is, and plain-English advice for it.

No torch, no pandas: pure functions over names, dtypes and numbers, so the advisor and the
reports can share them. :func:`categorize` picks one category per suspect (the most specific
first) and :func:`advice_for` writes the advice paragraph.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence, Tuple

from pytest_ptdbg.judge.not_judged import random_families
from pytest_ptdbg.runtime.text import fmt_error, fmt_growth
from pytest_ptdbg.runtime.dtypes import FLOATS, short_name
from pytest_ptdbg.judge.finding import Cause

# ---------------------------------------------------------------------------- categories

NONFINITE = "NaN/Inf first appearing"
UNPAIRED = Cause.UNPAIRED.value            # the judgement's words, where they are the same
OPTIMIZER = "optimizer update"
COLLECTIVE = "collective communication"
RANDOM = "random op"
BATCH_NORM = "batch_norm running statistics"
LOW_PRECISION = "reduced-precision compute"
NONDETERMINISTIC = "non-deterministic kernel"
REDUCTION = "reduction or normalisation"
INHERITED = "inherited error"
INPUTS_DIFFER = Cause.INPUTS_DIFFER.value
NEGLIGIBLE = "negligible difference"
DISCONTINUOUS = "branch flip (discontinuous op)"
COMPUTATION = "computation"

_BATCH_NORM_OPS = {"batch_norm", "native_batch_norm", "sync_batch_norm", "cudnn_batch_norm",
                   "_batch_norm_impl_index", "batch_norm_stats", "batch_norm_elemt"}
_REDUCTION_OPS = {
    "sum", "nansum", "mean", "nanmean", "prod", "cumsum", "cumprod", "softmax", "log_softmax",
    "softmin", "layer_norm", "group_norm", "instance_norm", "rms_norm", "local_response_norm",
    "norm", "vector_norm", "matrix_norm", "frobenius_norm", "nuclear_norm", "var", "std",
    "var_mean", "std_mean", "logsumexp", "logcumsumexp", "cross_entropy", "nll_loss",
    "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div", "binary_cross_entropy",
    "binary_cross_entropy_with_logits", "normalize", "cosine_similarity", "pairwise_distance",
    "cdist", "dist", "trace", "ctc_loss", "poisson_nll_loss", "gaussian_nll_loss",
    "margin_ranking_loss", "soft_margin_loss", "multilabel_soft_margin_loss",
    "scaled_dot_product_attention", "batch_norm", "native_batch_norm", "sync_batch_norm",
}
_NONDETERMINISTIC_OPS = {
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
    "convolution", "_convolution", "conv_tbc", "matmul", "mm", "bmm", "addmm", "addbmm",
    "baddbmm", "addmv", "mv", "linear", "bilinear", "einsum", "tensordot", "index_add",
    "scatter_add", "scatter", "scatter_reduce", "index_put", "put", "index_copy", "embedding",
    "embedding_bag", "ctc_loss", "nll_loss", "interpolate", "upsample", "upsample_bilinear",
    "upsample_nearest", "grid_sample", "max_pool1d", "max_pool2d", "max_pool3d",
    "adaptive_max_pool2d", "avg_pool2d", "avg_pool3d", "adaptive_avg_pool2d",
    "adaptive_avg_pool3d", "lstm", "gru", "rnn_tanh", "rnn_relu",
    "scaled_dot_product_attention", "cumsum", "histc", "bincount", "kthvalue", "median",
    "gather", "index_select", "take_along_dim",
}
#: ops whose output (or gradient) jumps at a threshold: a tiny input difference flips a branch
_DISCONTINUOUS_OPS = {
    "relu", "relu6", "threshold", "hardtanh", "hardsigmoid", "hardswish", "hardshrink",
    "softshrink", "leaky_relu", "prelu", "clamp", "clip", "clamp_min", "clamp_max", "max", "min",
    "maximum", "minimum", "fmax", "fmin", "amax", "amin", "where", "abs", "sign", "sgn", "floor",
    "ceil", "round", "trunc", "frac", "argmax", "argmin", "sort", "argsort", "topk", "kthvalue",
    "median", "mode", "max_pool1d", "max_pool2d", "max_pool3d", "adaptive_max_pool1d",
    "adaptive_max_pool2d", "adaptive_max_pool3d", "max_pool1d_with_indices",
    "max_pool2d_with_indices", "gt", "lt", "ge", "le", "eq", "ne", "greater", "less",
    "heaviside", "bucketize", "searchsorted", "histc", "unique", "nonzero", "masked_select",
}
_LOW_PRECISION = {d: (short_name(d), FLOATS[short_name(d)].unit_roundoff)
                  for d in ("torch.float16", "torch.bfloat16", "float16", "bfloat16", "torch.half")}


#: the advice for a step whose inputs differ at the start (the advisor's and the judgement's)
INPUTS_DIFFER_ADVICE = (
    "Its inputs already differ from the bench before any recorded call differed: the data, the "
    "initial weights or the random state differ between the two runs (another seed, other "
    "weights, unseeded data), or something not recorded (an in-place write, a copy from another "
    "device) changed them. No call computed wrongly. Seed both runs the same way "
    "(seed_all(seed)), load the same weights (the same checkpoint or state_dict) and feed the "
    "same batch, then compare again.")


def op_name(family: str) -> str:
    """The bare operator of ``{Type}_{api}``: ``Tensor___matmul___`` -> ``matmul``."""
    name = family.split("_", 1)[1] if "_" in family else family
    name = name.strip("_").lower()
    name = re.sub(r"^(npu_|native_)", "", name) if name not in _BATCH_NORM_OPS else name
    return name


#: the bare operators of the random APIs (``judge/not_judged.py``'s table; any ``*dropout`` too)
_RANDOM_OPS = frozenset(op_name(f) for f in random_families())


def _low_precision(dtypes: Iterable[str]) -> Optional[Tuple[str, float]]:
    for d in dtypes:
        hit = _LOW_PRECISION.get(str(d))
        if hit:
            return hit
    return None


def categorize(family: str, kind: str, ctx: str = "",
               npu_dtypes: Sequence[str] = (), bench_dtypes: Sequence[str] = ()) -> str:
    """The one category that best explains a suspect, most specific first."""
    op = op_name(family)
    if kind == "nonfinite":
        return NONFINITE
    if kind == "unpaired":
        return UNPAIRED
    if kind == "inherited":
        return INHERITED
    if kind == "inputs":
        return INPUTS_DIFFER
    if ctx == "optimizer":
        return OPTIMIZER
    if family.startswith("Distributed"):
        return COLLECTIVE
    if op in _RANDOM_OPS or op.endswith("dropout"):
        return RANDOM
    if op in _BATCH_NORM_OPS:
        return BATCH_NORM
    if _low_precision(list(npu_dtypes) + list(bench_dtypes)):
        return LOW_PRECISION
    if op in _DISCONTINUOUS_OPS:
        return DISCONTINUOUS
    if op in _NONDETERMINISTIC_OPS or op.startswith(("conv", "upsample")):
        return NONDETERMINISTIC
    if op in _REDUCTION_OPS or op.endswith(("_loss", "norm")):
        return REDUCTION
    return COMPUTATION


# ----------------------------------------------------------------------------------- stacks

_LIB_MARKERS = (
    f"{os.sep}torch{os.sep}", f"{os.sep}pytest_ptdbg{os.sep}", f"{os.sep}_pytest{os.sep}",
    f"{os.sep}pluggy{os.sep}", f"{os.sep}torch_npu{os.sep}", f"{os.sep}msprobe{os.sep}",
    f"{os.sep}ptdbg_ascend{os.sep}",
)


def _is_library_frame(path: str) -> bool:
    if path.startswith("<"):
        return True
    p = path.replace("/", os.sep)
    if any(m in p for m in _LIB_MARKERS):
        # user tests of this project live in tests/, example_models/: not library frames
        return f"{os.sep}tests{os.sep}" not in p and f"{os.sep}example_models{os.sep}" not in p
    return False


_FRAME_TEXT = re.compile(r'^\s*File\s+"?(?P<file>[^",]+)"?,\s*line\s+(?P<line>\d+),\s*in\s+'
                         r'(?P<func>[^,\n]+),?\s*(?P<code>.*)$', re.S)


def as_frames(stack: object) -> list:
    """``[[file, line, function, code], ...]`` from a stored stack; text frames
    (``'File "a.py", line 3, in f, \n code'``) are parsed, anything else is dropped."""
    if not isinstance(stack, (list, tuple)):
        return []
    out = []
    for f in stack:
        if isinstance(f, (list, tuple)) and len(f) >= 3:
            out.append(list(f))
        elif isinstance(f, str):
            m = _FRAME_TEXT.match(f)
            if m:
                out.append([m["file"].strip(), int(m["line"]), m["func"].strip(), m["code"].strip()])
    return out


def user_frame(stack: Optional[Sequence[Sequence[object]]]) -> Optional[Sequence[object]]:
    """The first frame of ``stack`` outside torch and this tool (``[file, line, function, code]``).

    Frames are taken in the order the dump stored them (innermost first, as ptdbg does).
    Falls back to the first frame when every frame belongs to a library.
    """
    if not stack:
        return None
    frames = as_frames(stack)
    for f in frames:
        if not _is_library_frame(str(f[0])):
            return f
    return frames[0] if frames else None


def format_frame(frame: Optional[Sequence[object]]) -> str:
    """``path:line in function: code``."""
    if not frame:
        return "(no stack recorded)"
    code = str(frame[3]).strip() if len(frame) > 3 and frame[3] else ""
    text = f"{frame[0]}:{frame[1]} in {frame[2]}"
    return f"{text}: {code}" if code else text


def format_stack(stack: Optional[Sequence[Sequence[object]]]) -> str:
    """The whole stack, one ``File "..", line N, in f`` + code pair per frame (Python's layout)."""
    if not stack:
        return ""
    out = []
    for f in as_frames(stack):
        out.append(f'File "{f[0]}", line {f[1]}, in {f[2]}')
        if len(f) > 3 and f[3]:
            out.append(f"    {str(f[3]).strip()}")
    return "\n".join(out)


# ----------------------------------------------------------------------------------- advice

def side_word(side: str) -> str:
    """A dump side in words: ``"device"`` for ptdbg's ``"NPU"`` (the device under test, whatever
    it is: a CPU, a GPU), ``"bench"`` otherwise; "" when unknown. ptdbg's CSV column names
    (``NPU Name``, ``NPU max``) keep its spelling."""
    if not side:
        return ""
    return "device" if str(side).upper() == "NPU" else str(side)


def _where(direction: str) -> Tuple[str, str]:
    if direction == "backward":
        return "the gradient arriving at it (and its forward tensors)", "the gradients it produces"
    return "its inputs", "its outputs"


@dataclass(frozen=True)
class AdviceFacts:
    """What :func:`advice_for` says its advice about: one suspect's category, kind, call and errors.

    ``role``: the suspect's role (``"latent"``, ``"amplifier"``, ...); ``explains``: for a latent
    origin, the later call whose failure it explains; ``summary``: a statistics-only compare;
    ``flip``: the fraction of elements whose comparison flipped (None: unknown)."""

    category: str
    kind: str
    family: str
    direction: str
    input_error: float
    output_error: float
    growth: float
    npu_dtypes: Sequence[str] = ()
    bench_dtypes: Sequence[str] = ()
    side: str = ""
    upstream: str = ""
    role: str = ""
    flip: Optional[float] = None
    api: str = ""
    explains: str = ""
    summary: bool = False


def advice_for(facts: AdviceFacts) -> str:
    """Plain-English advice for one suspect: what happened, why it may happen, what to try."""
    category, kind, family, direction = facts.category, facts.kind, facts.family, facts.direction
    input_error, output_error, growth = facts.input_error, facts.output_error, facts.growth
    npu_dtypes, bench_dtypes, side, upstream = facts.npu_dtypes, facts.bench_dtypes, facts.side, facts.upstream
    role, flip, api, explains, summary = facts.role, facts.flip, facts.api, facts.explains, facts.summary
    op = op_name(family)
    ins, outs = _where(direction)
    Ins = ins[0].upper() + ins[1:]
    what = ""
    if kind == "own" and role == "latent":
        later = explains or "a later call"
        what = (f"{Ins} agree with the bench (error {fmt_error(input_error)}) but {outs} do not "
                f"(error {fmt_error(output_error)}, {fmt_growth(growth)}). ")
        if category != LOW_PRECISION:
            what += (f"Its outputs still pass the verdict, yet the error it creates here is what "
                     f"makes {later} fail later. ")
    elif kind == "own" and role == "amplifier":
        what = (f"{Ins} already differ (error {fmt_error(input_error)}, from an earlier suspect) and "
                f"this call amplifies that error {fmt_growth(growth)} (to {fmt_error(output_error)}): "
                "it is ill-conditioned for these inputs (cancellation, division by small values, "
                "or an update such as Adam's first step g/|g| that turns tiny differences into "
                "large ones). Fix the earlier suspect first. ")
    elif kind == "own" and category == DISCONTINUOUS:
        what = (f"{Ins} agree closely with the bench (error {fmt_error(input_error)}) but {outs} "
                f"do not (error {fmt_error(output_error)}, {fmt_growth(growth)}). ")
    elif kind == "own":
        if input_error < 1e-5:
            what = (f"{Ins} agree with the bench (error {fmt_error(input_error)}) "
                    f"but {outs} do not (error {fmt_error(output_error)}, {fmt_growth(growth)}): "
                    "the precision is lost inside this call. ")
        else:
            what = (f"{Ins} differ only slightly (error {fmt_error(input_error)}), "
                    f"{outs} much more (error {fmt_error(output_error)}, {fmt_growth(growth)}): "
                    "this call adds or strongly amplifies the error. ")
    if direction == "backward" and kind == "own" and role != "amplifier" and input_error < 1e-4:
        what += "Only its backward is wrong: the forward agrees. "
    key = api or f"{family}_<k>_{direction}"
    replay = (f"To reproduce this call alone: dump it with configure_hook(mode=\"acl\", "
              f"scope=[\"{key}\"], acl_config=...) and run `ptdbg replay PACKAGE` (it judges the "
              "saved call by the same own-error budget as compare's judgement).")
    lp = _low_precision(list(npu_dtypes) + list(bench_dtypes))

    if category == NONFINITE:
        return (f"NaN or Inf first appears in {outs} while {ins} are finite (and match the bench). "
                "Typical causes: overflow in a reduced-precision dtype (float16 max 65504), exp of a "
                "large value, log or sqrt of zero or a negative number, division by zero. Check the "
                "input ranges (NPU max/min in the CSV), subtract the max before exp, add an eps, or "
                "compute this op in float32. The overflow_check hook stops at the first such call.")
    if category == UNPAIRED:
        where = f"the {side_word(side)} side" if side else "one side"
        return (f"This call exists only on {where}: a device-specific API, an extra cast or copy, or "
                "a different code path. Check its stack; if it changes values (a cast to a lower "
                "precision, a fused kernel), the errors after it start here.")
    if category == INPUTS_DIFFER:
        return INPUTS_DIFFER_ADVICE
    if category == NEGLIGIBLE:
        if summary:
            return (f"It agrees with the bench to {fmt_error(output_error)} (of its range), yet fails "
                    "the rule: in a statistics-only compare a statistic near zero (e.g. the mean of "
                    "a gradient) gives a large relative difference for a tiny absolute one. Compare "
                    "full tensors, or use the dtype-aware rule; it is not a precision problem.")
        return (f"It differs from the bench by only {fmt_error(output_error)}, about the noise the "
                "run carries, yet fails the rule: the tolerance is stricter than that noise (e.g. "
                "float32's rtol 1.3e-6 after many ops). Loosen the tolerance for it (or ignore "
                "it); it is not where precision is lost.")
    if category == INHERITED:
        src = f" (from {upstream})" if upstream else ""
        if math.isinf(input_error):
            return (f"The error is inherited{src}: {ins} already hold NaN/Inf where the bench does "
                    "not, and it passes them on. Fix the root cause upstream, not this call.")
        return (f"The error is inherited{src}: {ins} already differ by {fmt_error(input_error)} and "
                f"{outs} differ by about as much ({fmt_error(output_error)}, {fmt_growth(growth)}). "
                "Fix the root cause upstream, not this call.")
    tail = {
        OPTIMIZER: ("This is part of the optimizer step. Compare the hyper-parameters (lr, weight "
                    "decay, betas, eps, momentum), the implementation (foreach / fused / for-loop), "
                    "loss or gradient scaling and clipping, and that both runs start from the same "
                    "optimizer state."),
        COLLECTIVE: ("This is a collective: it combines tensors from several ranks, so compare every "
                     "rank (compare_distributed). Reduction order differs between backends and "
                     "world sizes; check world size, reduce op, and that each rank received the "
                     "same shard."),
        RANDOM: ("This op draws random numbers, and the two runs do not draw the same ones. Seed both "
                 "runs the same way (seed_all(seed, mode=True)) or switch it off for the comparison "
                 "(model.eval(), p=0 for dropout); random streams rarely match across devices."),
        BATCH_NORM: ("batch_norm in training mode normalises with the batch statistics and updates "
                     "running_mean / running_var. Compare with training=False (model.eval()) or "
                     "with fixed statistics; check momentum, eps and whether the running statistics "
                     "were the same at the start."),
        DISCONTINUOUS: (f"{op} jumps at a threshold (its value or its gradient): an input that "
                        "differs by a rounding error next to the threshold takes the other branch, "
                        "so a few elements differ completely while the rest agree"
                        + (f" (here {flip:.2%} of the elements differ by more than 0.1%)"
                           if flip is not None and not math.isnan(flip) else "")
                        + ". That is sensitivity, not lost precision: if the elements that flip "
                        "are few, loosen the check for this op (ignore it, or max_fail_fraction) "
                        "rather than chase it; if many flip, look upstream for what moved its "
                        "inputs."),
        NONDETERMINISTIC: (f"{op} may use non-deterministic kernels (atomic adds, algorithm choice "
                           "by shape) whose summation order varies from run to run. Re-run both "
                           "sides with seed_all(mode=True) (deterministic algorithms): if the "
                           "difference goes away it was ordering noise; if not, the kernel itself "
                           "is less precise. " + replay),
        REDUCTION: (f"{op} reduces or normalises many values: accumulation order and accumulation "
                    "precision matter, and large dynamic range or cancellation (x - mean) loses "
                    "digits. Accumulate in float32 (or float64 for the check), subtract the max "
                    "before exp, and compare the input ranges."),
        COMPUTATION: (f"Check {op}'s implementation on the device: a different algorithm, an "
                      "implicit cast, or an in-place write. " + replay),
    }
    if category == LOW_PRECISION and lp:
        name, u = lp
        if role == "latent":
            later = explains or "a later call"
            return what + (f"It computes in {name} (unit roundoff {u:.1e}) on at least one side and "
                           f"stays within {name}'s tolerance, but the rounding it adds travels on "
                           f"and {later} fails the tolerance of its own dtype. If that is the "
                           f"expected cost of {name}, accept it; otherwise keep this op and the "
                           "calls after it in float32, or make them robust (subtract the max "
                           "before exp, accumulate in float32).")
        return what + (f"It computes in {name} (unit roundoff {u:.1e}) on at least one side. An "
                       f"error of a few times {u:.0e} per op is the format, not a bug: judge it with "
                       "the dtype-aware rule. If it is much larger, keep this op in float32 "
                       "(exclude it from autocast, or .float() around it).")
    text = what + tail.get(category, tail[COMPUTATION])
    if lp and category != LOW_PRECISION:
        text += f" It also runs in {lp[0]} on at least one side."
    return text
