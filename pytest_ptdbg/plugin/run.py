"""Run a step on two sides under the dump hooks and compare them (the engine of ``ptdbg_dump``).

Imports torch; the plugin imports this module only when a test uses the fixture.

How the two sides are kept comparable:

- each side gets its own ``copy.deepcopy`` of the model (same weights, the caller's model is left
  untouched) and its own copy of the inputs, moved to that side's device;
- ``seed_all(seed)`` runs right before each side's step, and (``random="cpu"``, the default)
  dropout masks and ``torch.rand``/``randn``/``bernoulli``/``uniform_``/``normal_`` draw from one
  CPU generator seeded alike on both sides (``plugin/rng.py``), so a CUDA/NPU side gets the same
  masks as the CPU bench. The caller's RNG state is restored after;
- the device under test runs under ``torch.autocast(device_type, dtype)`` when a dtype other
  than float32 is asked for; the bench always runs in float32 without autocast.
"""
from __future__ import annotations

import copy
import os
import random
import shutil
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch

from pytest_ptdbg.format import records
from pytest_ptdbg.plugin.options import Settings

#: the dump mode when a test asks for none (``Settings.mode``)
DUMP_MODE = "api_stack"
_TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def to_device(obj: Any, device: Any) -> Any:
    """A copy of ``obj`` (tensor, module, or tuple/list/dict of them) on ``device``; never shares
    storage with ``obj`` (modules are deep-copied)."""
    if isinstance(obj, torch.nn.Module):
        return copy.deepcopy(obj).to(device)
    if isinstance(obj, torch.Tensor):
        out = obj.detach().to(device, copy=True)
        if obj.requires_grad and out.is_floating_point():
            out.requires_grad_(True)
        return out
    if isinstance(obj, dict):
        return type(obj)((k, to_device(v, device)) for k, v in obj.items())
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(to_device(v, device) for v in obj))
    if isinstance(obj, (tuple, list)):
        return type(obj)(to_device(v, device) for v in obj)
    return obj


def forward(model: Any, inputs: Any) -> Any:
    """``model(**inputs)`` for a dict, ``model(*inputs)`` for a tuple/list, else ``model(inputs)``."""
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def extract_loss(out: Any, loss_fn: Optional[Callable[[Any], Any]] = None) -> Tuple[Any, str]:
    """The scalar loss of a model's output and, when there is none, why: a tensor, a dict's (or a
    Hugging Face ``ModelOutput``'s) ``loss``, a tuple's or list's first element, or
    ``loss_fn(output)`` when given. Returns ``(loss or None, reason)``."""
    if loss_fn is not None:
        loss = loss_fn(out)
        where = "loss_fn(output)"
    elif isinstance(out, torch.Tensor):
        loss, where = out, "the output"
    elif isinstance(out, dict) or hasattr(out, "keys") and hasattr(out, "__getitem__"):
        keys = list(out.keys())
        if "loss" not in keys or out["loss"] is None:
            return None, (f"the model returned a {type(out).__name__} without a 'loss' "
                          f"(keys: {', '.join(map(str, keys)) or 'none'}); pass loss_fn= or step=")
        loss, where = out["loss"], f"the {type(out).__name__}'s 'loss'"
    elif isinstance(out, (tuple, list)) and out:
        loss, where = out[0], f"the {type(out).__name__}'s first element"
    else:
        return None, (f"the model returned {type(out).__name__}, not a loss tensor, a dict with "
                      "'loss' or a tuple starting with the loss; pass loss_fn= or step=")
    if not isinstance(loss, torch.Tensor):
        return None, f"{where} is a {type(loss).__name__}, not a tensor; pass loss_fn= or step="
    if loss.numel() != 1:
        return None, (f"{where} is a tensor of shape {list(loss.shape)}, not a scalar loss; "
                      "pass loss_fn= (e.g. lambda out: out.sum()) or step=")
    if not loss.requires_grad:
        return loss, (f"{where} does not require grad (no parameter takes part, or the model ran "
                      "under torch.no_grad)")
    return loss, ""


class DefaultStep:
    """Forward, then ``backward()`` of the loss (:func:`extract_loss`) when there is one that
    requires grad. After a call, ``loss`` and ``no_backward`` (why backward did not run)."""

    def __init__(self, loss_fn: Optional[Callable[[Any], Any]] = None) -> None:
        self.loss_fn = loss_fn
        self.loss: Any = None
        self.no_backward = ""

    def __call__(self, model: Any, inputs: Any) -> Any:
        out = forward(model, inputs)
        self.loss, self.no_backward = extract_loss(out, self.loss_fn)
        if self.loss is not None and not self.no_backward:
            self.loss.backward()
        return out


def default_step(model: Any, inputs: Any) -> Any:
    """Forward, then ``backward()`` of the loss when the output has one (see :func:`extract_loss`)."""
    return DefaultStep()(model, inputs)


def _nonfinite(t: Any) -> int:
    if not isinstance(t, torch.Tensor) or not (t.is_floating_point() or t.is_complex()):
        return 0
    return int((~torch.isfinite(t.detach())).sum().item())


def health(model: Any, loss: Any) -> Dict[str, Any]:
    """NaN/Inf after a step: in the loss, in each parameter's gradient and value (names only)."""
    out: Dict[str, Any] = {"loss": _nonfinite(loss) if isinstance(loss, torch.Tensor) else 0,
                           "grads": [], "params": []}
    if isinstance(model, torch.nn.Module):
        for name, p in model.named_parameters():
            if p.grad is not None and _nonfinite(p.grad):
                out["grads"].append(name)
            if _nonfinite(p):
                out["params"].append(name)
    return out


def health_problems(device: Dict[str, Any], bench: Optional[Dict[str, Any]],
                    device_label: str = "device", bench_label: str = "bench") -> list:
    """What is non-finite on the device side and not on the bench (None: no bench to show it)."""
    bench = bench or {"loss": 0, "grads": [], "params": []}
    out = []
    if device.get("loss") and not bench.get("loss"):
        out.append(f"the loss is NaN/Inf on the {device_label} side, finite on the "
                   f"{bench_label} side")
    for what, label in (("grads", "gradients"), ("params", "updated parameters")):
        names = [n for n in device.get(what, []) if n not in set(bench.get(what, []))]
        if names:
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            out.append(f"NaN/Inf in the {label} of {shown} on the {device_label} side, not on the "
                       f"{bench_label} side")
    return out


@contextmanager
def preserved_rng(devices: List[Any]) -> Iterator[None]:
    """Restore python, numpy and torch RNG states (CPU and the given CUDA devices) afterwards."""
    py_state = random.getstate()
    np_state: Any = None
    try:
        import numpy as np
        np_state = np.random.get_state()
    except Exception:  # pragma: no cover - numpy is a dependency
        pass
    cuda = sorted({d.index or 0 for d in devices if d.type == "cuda"})
    det = torch.are_deterministic_algorithms_enabled()
    hashseed = os.environ.get("PYTHONHASHSEED")
    cudnn = getattr(torch.backends, "cudnn", None)
    cudnn_flags = (cudnn.deterministic, cudnn.benchmark) if cudnn is not None else None
    try:
        with torch.random.fork_rng(devices=cuda):
            yield
    finally:
        random.setstate(py_state)
        if np_state is not None:
            np.random.set_state(np_state)
        if torch.are_deterministic_algorithms_enabled() != det:
            torch.use_deterministic_algorithms(det)
        if cudnn is not None and cudnn_flags is not None:
            cudnn.deterministic, cudnn.benchmark = cudnn_flags
        if hashseed is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = hashseed


@dataclass
class SideRun:
    """One side's dump: where its ``.pkl`` and data directory are."""

    dump_path: str
    pkl_path: str
    data_dir: Optional[str]
    output: Any = None
    #: NaN/Inf after the step (``health``); None when not looked at (``compare_runs``)
    health: Optional[Dict[str, Any]] = None
    #: why no backward ran ("" when it did)
    no_backward: str = ""
    #: api key -> stable call key (``callkeys.py``), for goldens
    keys: Optional[Dict[str, str]] = None


def locate_dump(dump_path: str, summary_only: bool, mode: str = DUMP_MODE) -> SideRun:
    """The ``.pkl`` (and data dir) of step 0 under ``dump_path``, written in dump ``mode``; the
    lowest rank if several."""
    step = records.step_dir(dump_path, 0)
    names = os.listdir(step) if os.path.isdir(step) else []  # no glob: test ids contain [ ]
    ranks = [os.path.join(step, n) for n in sorted(
        (n for n in names if n.startswith("rank") and n[4:].isdigit()), key=lambda n: int(n[4:]))]
    pkl = os.path.join(ranks[0], records.pkl_name(mode)) if ranks else ""
    if not pkl or not os.path.isfile(pkl):
        raise FileNotFoundError(
            f"no dump was written under {step} (expected rank*/{records.pkl_name(mode)}): "
            "did the step call any PyTorch API (of those the dump mode selects)?")
    data = os.path.join(ranks[0], records.data_dir_name(mode))
    return SideRun(dump_path, pkl, None if summary_only or not os.path.isdir(data) else data)


def run_side(fn: Callable[..., Any], args: tuple, *, device: Any, dtype: str, dump_path: str,
             settings: Settings, summary_only: bool, keys: Any = None) -> SideRun:
    """Seed, then run ``fn(*args)`` under the debugger (and autocast when ``dtype`` asks);
    ``keys`` (a ``callkeys.CallKeys``) notes the stable key of every recorded call."""
    __tracebackhide__ = True
    from pytest_ptdbg import PrecisionDebugger, seed_all

    if os.path.exists(dump_path):
        shutil.rmtree(dump_path)
    debugger = PrecisionDebugger(dump_path=dump_path, hook_name="dump", step=[0])
    debugger.configure_hook(mode=settings.mode, scope=list(settings.scope),
                            api_list=list(settings.api_list),
                            filter_switch=settings.filter_switch, summary_only=summary_only)
    amp = (torch.autocast(device.type, dtype=_TORCH_DTYPES[dtype])
           if dtype != "float32" else nullcontext())
    from pytest_ptdbg.plugin.rng import CpuRandom

    rnd = CpuRandom(settings.seed) if settings.random == "cpu" else nullcontext()
    seed_all(settings.seed, mode=settings.deterministic)
    with rnd, amp:
        debugger.start()
        attached = False
        if keys is not None:
            from pytest_ptdbg.plugin.callkeys import attach

            attached = attach(debugger, keys)
        try:
            with (keys if attached else nullcontext()):
                output = fn(*args)
        finally:
            debugger.close()
    side = locate_dump(dump_path, summary_only, settings.mode)
    side.output = output
    if attached:
        side.keys = dict(keys.keys)
    return side


def run_model(model: Any, inputs: Any, step: Optional[Callable[[Any, Any], Any]], *, device: Any,
              dtype: str, dump_path: str, settings: Settings, summary_only: bool,
              loss_fn: Optional[Callable[[Any], Any]] = None) -> SideRun:
    """``step(copy of model on device, copy of inputs on device)`` under the debugger; the side
    run notes NaN/Inf in the loss, gradients and parameters afterwards, and why no backward ran."""
    __tracebackhide__ = True
    from pytest_ptdbg.plugin.callkeys import CallKeys

    runner = DefaultStep(loss_fn) if step is None else step
    side_model = copy.deepcopy(model).to(device)
    side_inputs = to_device(inputs, device)
    side = run_side(runner, (side_model, side_inputs), device=device, dtype=dtype,
                    dump_path=dump_path, settings=settings, summary_only=summary_only,
                    keys=CallKeys(side_model))
    if isinstance(runner, DefaultStep):
        loss, side.no_backward = runner.loss, runner.no_backward
    else:
        loss, why = extract_loss(side.output, loss_fn) if side.output is not None else (None, "")
        params = list(side_model.parameters())
        if params and all(p.grad is None for p in params):
            side.no_backward = ("the step left every parameter without a gradient (it ran no "
                                "backward)")
    side.health = health(side_model, loss)
    return side


def compare_sides(npu: SideRun, bench: SideRun, out_dir: str, settings: Settings) -> Any:
    """``compare()`` of the two sides into ``out_dir`` with the rule and thresholds of settings."""
    __tracebackhide__ = True
    from pytest_ptdbg.api import compare_inputs
    from pytest_ptdbg.comparison.options import DumpInput
    from pytest_ptdbg.plugin.compat import compare_options

    os.makedirs(out_dir, exist_ok=True)
    # each side's own tensors: a statistics-only side (a golden) makes it a statistics compare
    # of the tensors, and lets compare() judge the device side's calls on their own data
    return compare_inputs(DumpInput(npu.pkl_path, npu.data_dir or ""), DumpInput(bench.pkl_path, bench.data_dir or ""),
                          out_dir, compare_options(settings))
