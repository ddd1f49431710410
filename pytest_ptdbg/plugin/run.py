"""Run a step on two sides under the dump hooks and compare them (the engine of ``ptdbg_dump``).

Imports torch; the plugin imports this module only when a test uses the fixture.

How the two sides are kept comparable:

- each side gets its own ``copy.deepcopy`` of the model (same weights, the caller's model is left
  untouched) and its own copy of the inputs, moved to that side's device;
- ``seed_all(seed)`` runs right before each side's step, and (``random="cpu"``, the default)
  dropout masks and ``torch.rand``/``randn``/``bernoulli``/``uniform_``/``normal_`` draw from one
  CPU generator seeded alike on both sides (``plugin_random``), so a CUDA/NPU side gets the same
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
from typing import Any, Callable, Dict, Iterator, List, Optional

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


def default_step(model: Any, inputs: Any) -> Any:
    """Forward (``model(*inputs)`` / ``model(**inputs)`` / ``model(inputs)``), then ``backward()``
    when the output is a scalar tensor that requires grad. Returns the output."""
    if isinstance(inputs, dict):
        out = model(**inputs)
    elif isinstance(inputs, (tuple, list)):
        out = model(*inputs)
    else:
        out = model(inputs)
    if isinstance(out, torch.Tensor) and out.numel() == 1 and out.requires_grad:
        out.backward()
    return out


@contextmanager
def preserved_rng(devices: List[Any]) -> Iterator[None]:
    """Restore python, numpy and torch RNG states (CPU and the given CUDA devices) afterwards."""
    py_state = random.getstate()
    try:
        import numpy as np
        np_state = np.random.get_state()
    except Exception:  # pragma: no cover - numpy is a dependency
        np, np_state = None, None
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
        if np is not None:
            np.random.set_state(np_state)
        if torch.are_deterministic_algorithms_enabled() != det:
            torch.use_deterministic_algorithms(det)
        if cudnn_flags is not None:
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
             settings: Settings, summary_only: bool) -> SideRun:
    """Seed, then run ``fn(*args)`` under the debugger (and autocast when ``dtype`` asks)."""
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
        try:
            output = fn(*args)
        finally:
            debugger.close()
    side = locate_dump(dump_path, summary_only, settings.mode)
    side.output = output
    return side


def run_model(model: Any, inputs: Any, step: Optional[Callable[[Any, Any], Any]], *, device: Any,
              dtype: str, dump_path: str, settings: Settings, summary_only: bool) -> SideRun:
    """``step(copy of model on device, copy of inputs on device)`` under the debugger."""
    __tracebackhide__ = True
    step = step or default_step
    side_model = copy.deepcopy(model).to(device)
    side_inputs = to_device(inputs, device)
    return run_side(step, (side_model, side_inputs), device=device, dtype=dtype,
                    dump_path=dump_path, settings=settings, summary_only=summary_only)


def compare_sides(npu: SideRun, bench: SideRun, out_dir: str, settings: Settings) -> Any:
    """``compare()`` of the two sides into ``out_dir`` with the rule and thresholds of settings."""
    __tracebackhide__ = True
    from pytest_ptdbg.plugin.compat import call_compare

    os.makedirs(out_dir, exist_ok=True)
    full = npu.data_dir is not None and bench.data_dir is not None
    params: Dict[str, Any] = {
        "npu_pkl_path": npu.pkl_path,
        "bench_pkl_path": bench.pkl_path,
        "npu_dump_data_dir": npu.data_dir if full else None,
        "bench_dump_data_dir": bench.data_dir if full else None,
        "is_print_compare_log": False,
    }
    return call_compare(params, out_dir, settings)
