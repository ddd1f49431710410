"""Dumps of real training steps for tests: one ``example_models`` step under ``PrecisionDebugger``.

``dump_one_step(path, "mlp", ...)`` is the one way tests make such a dump; the variations tests need
(statistics only, a weight perturbation, forward hooks, a patched function) are its arguments.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterable, Optional

import torch

import example_models as em
from pytest_ptdbg import PrecisionDebugger
from pytest_ptdbg.format import records


@dataclass(frozen=True)
class StepDump:
    """Where one dumped step lives."""

    dump_path: str
    rank_dir: str
    pkl: str
    data_dir: str

    def input_param(self, bench: "StepDump", with_data: bool = True) -> dict:
        """``compare()``'s ``input_param`` with this dump as the device side."""
        p = {"npu_pkl_path": self.pkl, "bench_pkl_path": bench.pkl, "is_print_compare_log": False}
        if with_data:
            p.update(npu_dump_data_dir=self.data_dir, bench_dump_data_dir=bench.data_dir)
        return p


def step_paths(dump_path: str, step: int = 0, rank: int = 0, mode: str = "api_stack") -> StepDump:
    """The paths of one step and rank of ``dump_path``."""
    dump_path = str(dump_path)
    return StepDump(dump_path, records.rank_dir(dump_path, step, rank),
                    records.pkl_path(dump_path, step, rank, mode), records.data_path(dump_path, step, rank, mode))


def perturb(model: torch.nn.Module, param: str, rel: float = 0.0, add: float = 0.0, seed: int = 1) -> None:
    """Perturb one parameter in place: ``w *= 1 + rel·N(0,1)`` and/or ``w += add·N(0,1)`` (seeded)."""
    w = dict(model.named_parameters())[param]
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        if rel:
            w.mul_(1 + rel * torch.randn(w.shape, generator=g))
        if add:
            w.add_(add * torch.randn(w.shape, generator=g))


def dump_one_step(path: Any, model: str = "mlp", *, seed: int = 0, summary_only: bool = False,
                  prepare: Optional[Callable[[torch.nn.Module], Optional[Iterable[Any]]]] = None,
                  around: Optional[Callable[[], ContextManager]] = None) -> StepDump:
    """Dump one training step (forward, backward, optimizer) of ``example_models.MODELS[model]``.

    ``prepare(model)`` runs before the step (perturb weights, register hooks) and may return handles
    to ``remove()`` afterwards; ``around()`` is a context entered around the step (a patched kernel).
    The debugger is closed at the end, so the dump is complete (its manifest written) and unlocked.
    """
    m, batch = em.MODELS[model](seed=seed)
    handles = list(prepare(m) or ()) if prepare else []
    try:
        dbg = PrecisionDebugger(dump_path=str(path), hook_name="dump", step=[0])
        dbg.configure_hook(mode="api_stack", summary_only=summary_only)
        with (around() if around else contextlib.nullcontext()):
            dbg.start()
            try:
                em.train_step(m, batch)
            finally:
                dbg.stop()
        dbg.close()
    finally:
        for h in handles:
            h.remove()
    return step_paths(path)


def dump_step(path: Any, step: Callable[[], Any]) -> StepDump:
    """Dump ``step()`` (a user-written forward and backward of any model) in full, as
    :func:`dump_one_step` dumps an ``example_models`` step; the debugger is closed at the end."""
    dbg = PrecisionDebugger(dump_path=str(path), hook_name="dump", step=[0])
    dbg.configure_hook(mode="api_stack")
    dbg.start()
    try:
        step()
    finally:
        dbg.stop()
    dbg.close()
    return step_paths(path)


@contextlib.contextmanager
def patched(owner: Any, name: str, value: Any):
    """``owner.name = value`` for the block (a faulty kernel the capture sees as the original)."""
    saved = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, saved)


def relu_times(k: float) -> Callable[[Any], Any]:
    """A relu patched to scale its output by ``k`` inside the kernel: capture sees relu only
    (use as ``patched(torch, "relu", relu_times(1.001)(torch.relu))``)."""
    def make(orig: Any) -> Any:
        def relu(*args: Any, **kwargs: Any) -> Any:
            ts = tuple(a for a in args if isinstance(a, torch.Tensor))
            if torch.overrides.has_torch_function(ts):
                return torch.overrides.handle_torch_function(relu, ts, *args, **kwargs)
            out = orig(*args, **kwargs)
            with torch._C.DisableTorchFunction():
                return out * k
        relu.__module__ = "torch"
        return relu
    return make
