"""Dumps of real training steps for tests: one ``example_models`` step under ``PrecisionDebugger``.

``dump_one_step(path, "mlp", ...)`` is the one way tests make such a dump; the variations tests need
(statistics only, a weight perturbation, forward hooks, a patched function) are its arguments.
``dump_user_step(path, step)`` dumps a step a test writes itself. The ``dump_step`` fixture of
``tests/conftest.py`` calls either into the test's ``tmp_path``.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager, Dict, Iterable, Optional

import torch

import example_models as em
from locations import StepDump, step_paths
from pytest_ptdbg import PrecisionDebugger

__all__ = ["StepDump", "dump_one_step", "dump_user_step", "kernel_times", "patched", "perturb", "relu_times", "seeded",
           "step_paths"]


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
                  around: Optional[Callable[[], ContextManager]] = None,
                  model_kw: Optional[Dict[str, Any]] = None, hook: Optional[Dict[str, Any]] = None) -> StepDump:
    """Dump one training step (forward, backward, optimizer) of ``example_models.MODELS[model]``.

    ``prepare(model)`` runs before the step (perturb weights, register hooks) and may return handles
    to ``remove()`` afterwards; ``around()`` is a context entered around the step (a patched kernel,
    a seeded RNG). ``model_kw``: more arguments of the model's builder (``batch_size=2``...);
    ``hook``: ``configure_hook`` arguments in place of ``mode="api_stack"`` (``mode="acl"``...).
    The debugger is closed at the end, so the dump is complete (its manifest written) and unlocked.
    """
    m, batch = em.MODELS[model](seed=seed, **(model_kw or {}))
    handles = list(prepare(m) or ()) if prepare else []
    try:
        dbg = PrecisionDebugger(dump_path=str(path), hook_name="dump", step=[0])
        dbg.configure_hook(**{"mode": "api_stack", "summary_only": summary_only, **(hook or {})})
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


def dump_user_step(path: Any, step: Callable[[], Any], *, summary_only: bool = False) -> StepDump:
    """Dump ``step()`` (a user-written forward and backward of any model), as :func:`dump_one_step`
    dumps an ``example_models`` step; the debugger is closed at the end."""
    dbg = PrecisionDebugger(dump_path=str(path), hook_name="dump", step=[0])
    dbg.configure_hook(mode="api_stack", summary_only=summary_only)
    dbg.start()
    try:
        step()
    finally:
        dbg.stop()
    dbg.close()
    return step_paths(path)


@contextlib.contextmanager
def patched(owner: Any, name: str, value: Any):
    """``owner.name = value`` for the block (a faulty kernel the capture sees as the original).

    On a class, what its own ``__dict__`` held is put back as it was (a staticmethod stays one;
    an inherited attribute is deleted again), not what ``getattr`` gives."""
    missing = object()
    own = isinstance(owner, type)
    saved = owner.__dict__.get(name, missing) if own else getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if saved is missing:
            delattr(owner, name)
        else:
            setattr(owner, name, saved)


@contextlib.contextmanager
def seeded(seed: int = 0):
    """torch's global RNG seeded as the block starts (``around=lambda: seeded(0)``: the same
    dropout masks in every dump)."""
    torch.manual_seed(seed)
    yield


def kernel_times(k: float, module: str = "torch") -> Callable[[Any], Any]:
    """A kernel patched to scale its output by ``k`` inside it: capture sees the API only, named
    as ``module``'s (use as ``patched(F, "linear", kernel_times(1 + 5e-7, "torch.nn.functional")(F.linear))``)."""
    def make(orig: Any) -> Any:
        def kernel(*args: Any, **kwargs: Any) -> Any:
            ts = tuple(a for a in args if isinstance(a, torch.Tensor))
            if torch.overrides.has_torch_function(ts):
                return torch.overrides.handle_torch_function(kernel, ts, *args, **kwargs)
            out = orig(*args, **kwargs)
            with torch._C.DisableTorchFunction():
                return out * k
        kernel.__module__ = module
        kernel.__name__ = kernel.__qualname__ = orig.__name__
        return kernel
    return make


def relu_times(k: float) -> Callable[[Any], Any]:
    """A relu patched to scale its output by ``k`` inside the kernel: capture sees relu only
    (use as ``patched(torch, "relu", relu_times(1.001)(torch.relu))``)."""
    return kernel_times(k, "torch")
