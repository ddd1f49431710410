"""``mode="acl"``: save the one API in ``scope`` as a reproduction package and re-run it alone.

``configure_hook(mode="acl", scope=["Tensor_permute_1_forward"], acl_config="./dump.json")``
(plus ``backward_input=[...npy]`` for a ``_backward`` scope). ``acl_config`` is the Ascend ACL dump
config of the reference workflow::

    {"dump": {"dump_list": [], "dump_path": "/abs/or/relative/dir", "dump_mode": "all",
              "dump_op_switch": "on"}}

(the fields may also sit at the top level). A relative ``dump_path`` is taken relative to the
config file's directory. The package goes to ``{dump_path}/step{N}/rank{R}/{scope}/`` and the
re-run's comparison with the recorded result to ``rerun.json`` beside it.

Where ``torch_npu`` imports and the call ran on an NPU, the re-run happens under the device's
kernel-level dump (``torch_npu.npu.init_dump()``, ``set_dump(acl_config)``, ``finalize_dump()``),
as ptdbg did; elsewhere it runs on the call's own device. Only the outermost API is captured
(``F.batch_norm`` calling ``torch.batch_norm`` is one call), so the kernel dump is set up once.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from pytest_ptdbg.capture.sink import Sink
from pytest_ptdbg.errors import SinkUsageError
from pytest_ptdbg.format import records
from pytest_ptdbg.replayer import codec
from pytest_ptdbg.repro import package as pkgmod
from pytest_ptdbg.sinks.snapshot import CallSnapshot, base_meta, device_of

__all__ = ["AclConfig", "load_acl_config", "AclSink", "load_backward_input"]

DUMP_MODES = ("input", "output", "all")
OP_SWITCHES = ("on", "off")


@dataclass(frozen=True)
class AclConfig:
    """The validated content of an ``acl_config`` file (``dump.json``)."""

    path: str
    dump_path: str
    dump_list: Tuple[Any, ...]
    dump_mode: str
    dump_op_switch: str


def load_acl_config(path: Any) -> AclConfig:
    """Read and validate ``dump.json``; errors name the file and the missing or bad field."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise ValueError(f"acl_config must be the path of a dump.json file, got {path!r}")
    path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"acl_config {path}: file not found (a dump.json with dump_list, dump_path, "
                                "dump_mode and dump_op_switch)")
    try:
        with open(path) as fh:
            doc = json.load(fh)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"acl_config {path}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"acl_config {path}: the top level must be an object with a 'dump' object")
    body, prefix = (doc["dump"], "dump.") if "dump" in doc else (doc, "")
    if not isinstance(body, dict):
        raise ValueError(f"acl_config {path}: field 'dump' must be an object")
    missing = [f for f in ("dump_list", "dump_path", "dump_mode", "dump_op_switch") if f not in body]
    if missing:
        raise ValueError(
            f"acl_config {path}: missing field{'s' if len(missing) > 1 else ''} "
            + ", ".join(repr(prefix + m) for m in missing)
            + ' (expected {"dump": {"dump_list": [], "dump_path": "DIR", "dump_mode": "all", '
              '"dump_op_switch": "on"}})'
        )
    if not isinstance(body["dump_list"], list):
        raise ValueError(f"acl_config {path}: field '{prefix}dump_list' must be a list (may be empty)")
    dump_path = body["dump_path"]
    if not isinstance(dump_path, str) or not dump_path.strip():
        raise ValueError(f"acl_config {path}: field '{prefix}dump_path' must be a non-empty directory path")
    mode = body["dump_mode"]
    if mode not in DUMP_MODES:
        raise ValueError(f"acl_config {path}: field '{prefix}dump_mode' is {mode!r}; allowed: {', '.join(DUMP_MODES)}")
    switch = body["dump_op_switch"]
    if switch not in OP_SWITCHES:
        raise ValueError(f"acl_config {path}: field '{prefix}dump_op_switch' is {switch!r}; allowed: on, off")
    target = dump_path if os.path.isabs(dump_path) else os.path.join(os.path.dirname(path), dump_path)
    target = os.path.abspath(target)
    try:
        os.makedirs(target, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"acl_config {path}: field '{prefix}dump_path' {target!r} cannot be created "
                         f"({exc.strerror})") from None
    if not os.access(target, os.W_OK):
        raise ValueError(f"acl_config {path}: field '{prefix}dump_path' {target!r} is not writable")
    return AclConfig(path, target, tuple(body["dump_list"]), mode, switch)


_BWD_FILE = re.compile(r"_backward_input((?:\.\d+)+)\.npy$")


def load_backward_input(paths: List[str], scope: str) -> Dict[str, np.ndarray]:
    """The saved incoming gradients, keyed by output index (``"0"``, ``"1.0"``).

    A file named like the dump's ``..._backward_input.1.npy`` gives its own index; otherwise the
    i-th file is output i. Errors name the missing or unreadable file.
    """
    if not paths:
        raise ValueError(f"mode='acl' with backward scope {scope!r} needs backward_input=[...npy] "
                         "(the gradients arriving at the API, from a dump)")
    out: Dict[str, np.ndarray] = {}
    for i, p in enumerate(paths):
        path = os.path.abspath(os.fspath(p))
        if not os.path.isfile(path):
            raise FileNotFoundError(f"backward_input[{i}] {path}: file not found")
        try:
            arr = np.load(path, allow_pickle=False)
        except ValueError as exc:
            raise ValueError(f"backward_input[{i}] {path}: not a plain .npy array ({exc})") from None
        m = _BWD_FILE.search(os.path.basename(path))
        idx = m.group(1).strip(".") if m else str(i)
        if idx in out:
            raise ValueError(f"backward_input[{i}] {path}: a second gradient for output {idx}")
        out[idx] = arr
    return out


@contextlib.contextmanager
def kernel_dump(acl: AclConfig, device: str) -> Iterator[bool]:
    """The NPU's kernel-level dump around the re-run when torch_npu is there; yields whether it is on."""
    if not device.startswith("npu"):
        yield False
        return
    try:
        import torch_npu  # noqa: F401
    except ImportError:  # pragma: no cover - an npu device implies torch_npu
        yield False
        return
    torch_npu.npu.init_dump()  # pragma: no cover - needs an Ascend device
    try:  # pragma: no cover
        torch_npu.npu.set_dump(acl.path)
        yield True
        torch_npu.npu.synchronize()
    finally:  # pragma: no cover
        torch_npu.npu.finalize_dump()


def _place(rank_dir: Optional[str]) -> List[str]:
    """``["step0", "rank0"]`` from a rank directory (empty when it does not look like one)."""
    if not rank_dir:
        return []
    rank = os.path.basename(os.path.normpath(rank_dir))
    step = os.path.basename(os.path.dirname(os.path.normpath(rank_dir)))
    if re.fullmatch(r"rank\d+", rank) and re.fullmatch(r"step\d+", step):
        return [step, rank]
    return []


class AclSink(Sink):
    """Packages the single API named by ``config.scope[0]`` and re-runs it (see the module docstring)."""

    def __init__(self, config: Any, rank_dir: Optional[str] = None) -> None:
        scope = list(getattr(config, "scope", None) or [])
        if len(scope) != 1 or not isinstance(scope[0], str):
            raise ValueError(f"mode='acl' needs exactly one API in scope, e.g. ['Tensor_permute_1_forward'], "
                             f"got scope={scope!r}")
        try:
            target = records.parse_name(scope[0])
        except ValueError:
            raise ValueError(f"mode='acl': scope {scope[0]!r} is not an API name like "
                             "'Functional_conv2d_1_forward' or 'Functional_conv2d_1_backward'") from None
        if target.io is not None:
            raise ValueError(f"mode='acl': scope {scope[0]!r} names a tensor; give the API, e.g. {target.api_key!r}")
        self.target = target
        self.scope = target.api_key
        self.acl = load_acl_config(getattr(config, "acl_config", None))
        self.backward = target.direction == "backward"
        self.grad_files = [os.path.abspath(os.fspath(p)) for p in (getattr(config, "backward_input", None) or [])]
        self.grads = load_backward_input(list(getattr(config, "backward_input", None) or []), self.scope) \
            if self.backward else {}
        self.wants_backward = False
        self.out_dir = os.path.join(self.acl.dump_path, *_place(rank_dir), self.scope)
        self.package: Optional[pkgmod.Package] = None
        self.rerun: Optional[Any] = None
        self._snap: Optional[CallSnapshot] = None
        self._warned = False

    def start_call(self, call: Any) -> bool:
        if self.package is not None:
            return False
        t = self.target
        if call.api_type != t.api_type or call.api_name != t.api_name or call.index != t.call_index:
            return False
        self._snap = CallSnapshot(call, copy=True, rng=True)
        return True

    def end_call(self, call: Any) -> None:
        snap = self._snap
        if snap is None:
            return
        self._snap = None
        device = device_of(snap)
        meta = base_meta("acl", device)
        meta["acl_config"] = self.acl.path
        grads = None
        if self.backward:
            grads = self._check_grads(call.output)
            meta["backward_input_files"] = self.grad_files
        pkg = snap.write(self.out_dir, self.target.direction, call.output, backward_input=grads, meta=meta)
        from pytest_ptdbg.errors import ReplayRefused

        try:
            self._rerun(pkg, snap, call, grads, meta, device)
        except ReplayRefused as exc:  # not in the judge's allowlist: the package stays, unrun
            self.package, self.rerun = pkg, None
            with open(os.path.join(pkg.path, "rerun.json"), "w") as fh:
                json.dump({"kernel_dump": False, "device": device, "note": f"not replayed: {exc}"}, fh, indent=1)
            print(f"ptdbg acl: {self.scope} saved in {pkg.path}, not replayed: {exc}", file=sys.stderr)

    def _rerun(self, pkg: Any, snap: Any, call: Any, grads: Any, meta: dict, device: Any) -> None:
        from pytest_ptdbg.repro.runner import replay_package, run_package

        with kernel_dump(self.acl, device) as on:
            if self.backward:
                # forward + backward(grad) on the call's device gives the gradients it produces
                produced = run_package(pkg, device)
                bwd = {k[len("backward_output."):]: v for k, v in produced.items() if k.startswith("backward_output.")}
                pkg = snap.write(self.out_dir, "backward", call.output, backward_input=grads,
                                 backward_output=bwd, meta=meta)
                result = None
            else:
                result = replay_package(pkg, device)
        self.package = pkg
        self.rerun = result
        with open(os.path.join(pkg.path, "rerun.json"), "w") as fh:
            doc = {"kernel_dump": bool(on), "device": device,
                   "note": ("backward: backward_output.* are the gradients of this re-run with the given "
                            "backward_input") if self.backward else "forward re-run compared with the recorded output"}
            if result is not None:
                doc["result"] = result.to_dict()
            json.dump(doc, fh, indent=1, default=str)
        print(f"ptdbg acl: {self.scope} saved as a reproduction package in {pkg.path} "
              f"(replay it with: ptdbg replay {pkg.path})", file=sys.stderr)

    def _check_grads(self, output: Any) -> Dict[str, Any]:
        outs = dict(codec.flatten_output(output))
        for idx, arr in self.grads.items():
            o = outs.get("output." + idx)
            if o is None:
                raise SinkUsageError(f"mode='acl' {self.scope}: backward_input for output {idx} given, but the API "
                                 f"has outputs {sorted(outs) or 'none'}")
            if tuple(arr.shape) != tuple(o.shape):
                raise SinkUsageError(f"mode='acl' {self.scope}: backward_input for output {idx} has shape "
                                 f"{list(arr.shape)}, the output has {list(o.shape)}")
        return {idx: (arr, str(outs["output." + idx].dtype)) for idx, arr in self.grads.items()}

    def close(self) -> None:
        self._snap = None
        if self.package is None and not self._warned:
            self._warned = True
            print(f"ptdbg acl: {self.scope} was not called while the debugger ran; nothing was saved "
                  f"(check the name and call index in a dump)", file=sys.stderr)
