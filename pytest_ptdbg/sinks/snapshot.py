"""What a sink keeps of a live call so that it can be packaged later (after the call, or in backward)."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from pytest_ptdbg.replayer import codec
from pytest_ptdbg.repro import package as pkgmod

if TYPE_CHECKING:
    import numpy as np
    import torch

    from pytest_ptdbg.capture.sink import ApiCall


class CallSnapshot:
    """A call's inputs as they were when it started.

    ``copy=True`` copies every input; ``copy=None`` (default) copies what an in-place call
    overwrites (its first argument and an ``out=`` tensor) and keeps the other inputs as detached
    references, remembering their version counters so that a later in-place change (before a
    backward package is written) is noticed. The call spec is encoded when written.
    """

    __slots__ = ("api_type", "api_name", "index", "args", "kwargs", "inputs", "requires_grad", "versions",
                 "stack", "ctx", "rng")

    def __init__(self, call: ApiCall, copy: Optional[bool] = None, rng: Optional[bool] = None) -> None:
        self.api_type, self.api_name, self.index = call.api_type, call.api_name, call.index
        self.args, self.kwargs = tuple(call.args), dict(call.kwargs)
        self.inputs: Dict[str, torch.Tensor] = {}
        self.requires_grad: Dict[str, bool] = {}
        self.versions: Dict[str, int] = {}
        out_key = None
        if call.inplace and "out" in call.kwargs:
            out_key = f"input.{len(call.args) + list(call.kwargs).index('out')}"
        for key, t in codec.flatten_inputs(call.args, call.kwargs):
            self.requires_grad[key] = bool(t.requires_grad)
            d = t.detach()
            if copy or (copy is None and call.inplace and (
                    key == "input.0" or key.startswith("input.0.") or key == out_key)):
                d = d.clone()
            self.inputs[key] = d
            self.versions[key] = d._version
        self.stack = call.stack
        self.ctx = call.ctx
        if rng is None:
            rng = bool(RANDOM.search(call.api_name))
        self.rng = rng_state(device_of(self)) if rng else None

    def modified(self) -> List[str]:
        """Input keys changed in place since the snapshot."""
        return [k for k, t in self.inputs.items() if t._version != self.versions[k]]

    def key(self, direction: str) -> str:
        from pytest_ptdbg.format import records

        return records.api_key(self.api_type, self.api_name, self.index, direction)

    def write(self, out_dir: str, direction: str, output: Any = None,
              backward_input: Optional[Dict[str, Any]] = None,
              backward_output: Optional[Dict[str, Any]] = None, meta: Optional[dict] = None) -> pkgmod.Package:
        """Write the package of this call (``direction``: which API key it reproduces)."""
        tensors: Dict[str, Any] = dict(self.inputs)
        if not codec.flatten_output(output) and self.args and hasattr(self.args[0], "shape"):
            output = self.args[0]  # an in-place API returning nothing (__setitem__): what it changed
        if output is not None:
            tensors.update(dict(codec.flatten_output(output)))
        for io, grads in (("backward_input", backward_input), ("backward_output", backward_output)):
            for idx, g in (grads or {}).items():
                if g is not None:
                    tensors[f"{io}.{idx}"] = g
        meta = dict(meta or {})
        if self.ctx:
            meta.setdefault("ctx", self.ctx)
        changed = self.modified()
        if changed:
            meta["inputs_modified_after_call"] = changed
        spec = codec.encode_call(self.args, self.kwargs)
        return pkgmod.write_package(out_dir, self.key(direction), spec, tensors, self.requires_grad,
                                    self.stack, meta, self.rng)


#: API names that draw random numbers (their generator state is saved with the package)
RANDOM = re.compile(r"dropout|rand|bernoulli|multinomial|normal_|uniform_|exponential_|geometric_|"
                    r"cauchy_|log_normal_|random_|poisson|rrelu|gumbel|fractional_max_pool")


def rng_state(device: str) -> Optional[Tuple[str, np.ndarray]]:
    """``(device type, state as a uint8 numpy array)`` of the generator ``device`` draws from."""
    import torch

    kind = device.split(":")[0]
    try:
        if kind == "cpu":
            return "cpu", torch.get_rng_state().numpy().copy()
        if kind == "cuda":
            return "cuda", torch.cuda.get_rng_state(torch.device(device)).numpy().copy()
        if kind == "npu":  # pragma: no cover - needs torch_npu
            return "npu", torch.npu.get_rng_state(torch.device(device)).numpy().copy()  # type: ignore[attr-defined]
    except Exception:  # pragma: no cover - a generator we cannot read: no state saved
        return None
    return None


def index_str(index: Tuple[int, ...]) -> str:
    """``(1, 0)`` -> ``"1.0"``."""
    return ".".join(str(i) for i in index)


def device_of(snapshot: CallSnapshot) -> str:
    """The device the call ran on (its first tensor input's), ``cpu`` without tensors."""
    for t in snapshot.inputs.values():
        return str(t.device)
    return "cpu"


def base_meta(reason: str, device: str) -> dict:
    import torch

    return {"reason": reason, "device": device, "torch": torch.__version__}
