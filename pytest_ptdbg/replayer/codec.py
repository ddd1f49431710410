"""The call spec's codec: API call values <-> the JSON call spec of docs/DESIGN.md, as data only.

``encode_call`` (capture's encoder), ``decode_call`` (the replay's data-only decoder,
:mod:`pytest_ptdbg.replayer.arguments`, over tensors loaded on demand), ``tensor_refs`` (the tensor
keys a spec names), ``flatten_output``/``flatten_inputs`` (tensors keyed as capture keys them) and
``to_numpy``. Shared by the dump's judgement, reproduction packages and the capture sinks.
"""
from __future__ import annotations

from typing import Any, Callable, List, Mapping, Sequence, Tuple

import numpy as np

__all__ = ["encode_call", "decode_call", "tensor_refs", "flatten_output", "flatten_inputs", "to_numpy"]


# ---------------------------------------------------------------------------------------------
# call spec (docs/DESIGN.md): values <-> JSON


def encode_call(args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict:
    """The call spec of ``args``/``kwargs`` (capture's encoder, ``dump/call_spec.py``)."""
    from pytest_ptdbg.dump import call_spec

    return call_spec.encode_call(tuple(args), kwargs)


class _LazyTensors(Mapping):
    """``{key: tensor}`` that loads each tensor when the decoder asks for it."""

    def __init__(self, keys: Sequence[str], load: Callable[[str], Any]) -> None:
        self._keys = list(keys)
        self._load = load

    def __contains__(self, key: object) -> bool:  # no load (Mapping's default would load)
        return key in self._keys

    def __getitem__(self, key: str) -> Any:
        if key not in self._keys:
            raise KeyError(key)
        return self._load(key)

    def __iter__(self):
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def decode_call(spec: Mapping[str, Any], keys: Sequence[str], tensor: Callable[[str], Any],
                where: str = "call", device: Any = None) -> Tuple[list, dict]:
    """``(args, kwargs)`` rebuilt from a call spec as data only (the judge's decoder,
    ``pytest_ptdbg/replayer/arguments.py``); ``where`` is the record's API key (its string rules
    apply), ``tensor(key)`` supplies the tensors among ``keys``, devices become ``device``.
    Raises ReplayRefused or NotReplayable (ValueErrors) naming ``where`` and the argument."""
    from pytest_ptdbg.replayer.arguments import decode_call as judged

    args, kwargs = judged(spec, _LazyTensors(keys, tensor), where, device)
    return list(args), kwargs


def tensor_refs(spec: Any) -> List[str]:
    """Every tensor key a call spec refers to, in order."""
    out: List[str] = []

    def walk(v: Any) -> None:
        if isinstance(v, list):
            for x in v:
                walk(x)
        elif isinstance(v, dict):
            if set(v) == {"t"}:
                out.append(v["t"])
            else:
                for x in v.values():
                    walk(x)

    walk(spec)
    return out


def _walk(value: Any, prefix: str) -> List[Tuple[str, Any]]:
    """``(key, leaf)`` pairs: lists/tuples add an index level, as in capture's ``iter_tensors``."""
    out: List[Tuple[str, Any]] = []
    for i, v in enumerate(value):
        k = f"{prefix}.{i}"
        if isinstance(v, (list, tuple)) and not hasattr(v, "shape"):
            out.extend(_walk(v, k))
        else:
            out.append((k, v))
    return out


def flatten_output(output: Any, prefix: str = "output") -> List[Tuple[str, Any]]:
    """``(key, tensor)`` for every tensor of an API's return value (``output.0``, ``output.1.0``...)."""
    import torch

    value = list(output) if isinstance(output, (list, tuple)) and not hasattr(output, "shape") else [output]
    return [(k, v) for k, v in _walk(value, prefix) if isinstance(v, torch.Tensor)]


def flatten_inputs(args: Sequence[Any], kwargs: Mapping[str, Any]) -> List[Tuple[str, Any]]:
    """``(key, tensor)`` for every tensor input, keyed ``input.i[.j]`` (kwargs after args)."""
    import torch

    items = list(args) + list(kwargs.values())
    return [(k, v) for k, v in _walk(items, "input") if isinstance(v, torch.Tensor)]


def to_numpy(t: Any) -> np.ndarray:
    """A CPU numpy copy of a tensor; dtypes numpy lacks (bf16, fp8) become float32."""
    import torch

    t = t.detach()
    if t.is_complex():
        return t.cpu().resolve_conj().numpy().copy()
    if t.dtype.is_floating_point and t.dtype not in (torch.float16, torch.float32, torch.float64):
        t = t.float()
    return t.cpu().resolve_neg().contiguous().numpy().copy()
