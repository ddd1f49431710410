"""Reproduction packages: one API call saved as data so that it can be run again on its own.

A package is a directory holding ``package.json`` and one ``.npy`` per tensor (never pickle)::

    package.json
        format, version        "ptdbg-replay-package", 1
        api                    the API key it reproduces, e.g. "Functional_conv2d_1_backward"
        api_type, api_name, call_index, direction
        call                   {"args": [...], "kwargs": {...}}: the call spec of docs/DESIGN.md
        tensors                {key: {"file", "dtype", "shape", "requires_grad"}}
        stack                  [[file, line, function, code], ...] of the original call
        meta                   free-form: reason ("acl", "overflow", ...), device, torch version...
    input.0.npy ...            forward inputs (indexed as capture indexes them)
    output.0.npy ...           forward outputs
    backward_input.0.npy ...   gradient arriving at output 0 (backward packages)
    backward_output.0.npy ...  gradient produced for input 0 (backward packages)

Tensor keys follow the dump's suffixes (``input.1.0``: element 0 of the list argument 1). A
bfloat16 tensor is stored as float32; the ``dtype`` entry is authoritative.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from pytest_ptdbg.format import records
from pytest_ptdbg.replayer.codec import encode_call, flatten_inputs, flatten_output, tensor_refs, to_numpy

PACKAGE_FILE = "package.json"
RNG_FILE = "rng_state.npy"
FORMAT = "ptdbg-replay-package"
VERSION = 1

_KEY = re.compile(r"^(input|output|backward_input|backward_output)(\.\d+)+$")


@dataclass
class TensorInfo:
    """One saved tensor of a package."""

    key: str
    file: str
    dtype: str
    shape: Tuple[int, ...]
    requires_grad: bool = False

    def to_json(self) -> dict:
        return {"file": self.file, "dtype": self.dtype, "shape": list(self.shape),
                "requires_grad": self.requires_grad}


@dataclass
class Package:
    """A loaded reproduction package (see the module docstring)."""

    path: str
    api: str
    call: dict
    tensors: Dict[str, TensorInfo]
    stack: List[list] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    #: ``{"device": "cpu", "file": "rng_state.npy"}``: the generator state before the call
    #: (random ops such as dropout replay the same draws on that device type)
    rng: Optional[dict] = None

    @property
    def parsed(self) -> records.ParsedName:
        return records.parse_name(self.api)

    @property
    def direction(self) -> str:
        return self.parsed.direction

    def keys(self, io: str) -> List[str]:
        """Tensor keys of one kind (``input``, ``output``, ``backward_input``...), in index order."""
        found = [k for k in self.tensors if k.split(".", 1)[0] == io]
        return sorted(found, key=lambda k: tuple(int(p) for p in k.split(".")[1:]))

    @property
    def expected_keys(self) -> List[str]:
        """What a replay is compared against: the outputs (forward) or produced gradients (backward)."""
        return self.keys("output" if self.direction == "forward" else "backward_output")

    def file_path(self, key: str) -> str:
        info = self._info(key)
        if os.path.isabs(info.file):
            return info.file
        return records.safe_data_path(self.path, info.file[: -len(".npy")])

    def load_array(self, key: str) -> np.ndarray:
        """The saved array of ``key`` (bf16 comes back as float32); checks its shape."""
        path = self.file_path(key)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{self.api}: tensor {key!r} has no data file {path}")
        if path.endswith(".pt"):  # msprobe dumps: torch.load(weights_only=True)
            from pytest_ptdbg.dump.npy import load_pt

            arr = load_pt(path, key)
        else:  # regular file, header checked against the package's shape and the file's size first
            from pytest_ptdbg.dump.npy import load_npy

            arr = load_npy(path, key, self.tensors[key].shape)
        info = self.tensors[key]
        if tuple(arr.shape) != tuple(info.shape):
            raise ValueError(
                f"{path}: shape {list(arr.shape)} does not match the package's {list(info.shape)} for {key!r}"
            )
        return arr

    def _info(self, key: str) -> TensorInfo:
        try:
            return self.tensors[key]
        except KeyError:
            raise KeyError(f"package {self.path} ({self.api}) has no tensor {key!r}") from None

    def to_json(self) -> dict:
        p = self.parsed
        return {
            "format": FORMAT,
            "version": VERSION,
            "api": self.api,
            "api_type": p.api_type,
            "api_name": p.api_name,
            "call_index": p.call_index,
            "direction": p.direction,
            "call": self.call,
            "tensors": {k: v.to_json() for k, v in self.tensors.items()},
            "stack": self.stack,
            "meta": self.meta,
            **({"rng": self.rng} if self.rng else {}),
        }

    def rng_state(self) -> Optional[Tuple[str, np.ndarray]]:
        """``(device type, state bytes)`` saved before the call, or None."""
        if not self.rng:
            return None
        path = records.safe_data_path(self.path, RNG_FILE[:-4])
        if not os.path.exists(path):
            raise FileNotFoundError(f"{self.api}: random generator state {path} is missing")
        from pytest_ptdbg.dump.npy import load_npy

        try:
            state = load_npy(path, RNG_FILE)
        except (ValueError, OSError, EOFError) as exc:
            raise ValueError(f"{self.api}: random generator state {path} is unreadable: {exc}") from None
        if state.dtype != np.uint8 or state.ndim != 1:
            raise ValueError(f"{self.api}: random generator state {path} must be a 1-D uint8 array, "
                             f"got {state.dtype} of shape {list(state.shape)}")
        return str(self.rng.get("device", "cpu")), state


# ---------------------------------------------------------------------------------------------
# writing


def write_package(
    out_dir: str,
    api: str,
    call: dict,
    tensors: Mapping[str, Any],
    requires_grad: Optional[Mapping[str, bool]] = None,
    stack: Optional[List[list]] = None,
    meta: Optional[dict] = None,
    rng: Optional[Tuple[str, np.ndarray]] = None,
) -> Package:
    """Write a package to ``out_dir`` (replaced as a whole if it exists) and return it.

    ``rng``: ``(device type, generator state)`` taken before the call, for random APIs.

    ``tensors`` maps tensor keys (``input.0``...) to torch tensors or numpy arrays (a numpy array
    may be given as ``(array, "torch.bfloat16")`` to record the original dtype).
    """
    records.parse_name(api)  # validates
    requires_grad = dict(requires_grad or {})
    for ref in tensor_refs(call):
        if ref not in tensors:
            raise ValueError(f"{api}: call spec refers to tensor {ref!r} that is not given")
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".pkg-", dir=parent)
    infos: Dict[str, TensorInfo] = {}
    try:
        for key, value in tensors.items():
            if not _KEY.match(key):
                raise ValueError(f"{api}: bad tensor key {key!r} (expected e.g. 'input.0', 'backward_input.0')")
            if isinstance(value, tuple):
                arr, dtype = value
            elif isinstance(value, np.ndarray):
                arr, dtype = value, f"numpy.{value.dtype}"
            else:
                arr, dtype = to_numpy(value), str(value.dtype)
                requires_grad.setdefault(key, bool(value.requires_grad))
            fname = records.data_file_name(key)
            np.save(os.path.join(tmp, fname), np.asarray(arr), allow_pickle=False)
            infos[key] = TensorInfo(key, fname, dtype, tuple(int(s) for s in np.shape(arr)),
                                    bool(requires_grad.get(key, False)))
        rng_doc = None
        if rng is not None:
            np.save(os.path.join(tmp, RNG_FILE), np.asarray(rng[1], dtype=np.uint8), allow_pickle=False)
            rng_doc = {"device": str(rng[0]), "file": RNG_FILE}
        pkg = Package(os.path.abspath(out_dir), api, call, infos, [list(f) for f in (stack or [])],
                      dict(meta or {}), rng_doc)
        with open(os.path.join(tmp, PACKAGE_FILE), "w") as fh:
            json.dump(pkg.to_json(), fh, indent=1, allow_nan=True)
            fh.write("\n")
        if os.path.exists(out_dir):
            old = tmp + ".old"
            os.rename(out_dir, old)
            os.rename(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return pkg


def package_call(
    out_dir: str,
    api: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    output: Any = None,
    backward_input: Optional[Mapping[str, Any]] = None,
    backward_output: Optional[Mapping[str, Any]] = None,
    stack: Optional[List[list]] = None,
    meta: Optional[dict] = None,
    requires_grad: Optional[Mapping[str, bool]] = None,
) -> Package:
    """Package a live call: its arguments, output and (backward) gradients.

    ``backward_input``/``backward_output`` map indices like ``"0"`` or ``"1.0"`` to gradients
    (arriving at output i / produced for input j). ``requires_grad`` overrides the flags read
    from the input tensors (useful when inputs were saved as detached copies).
    """
    tensors: Dict[str, Any] = {}
    rg: Dict[str, bool] = {}
    for k, t in flatten_inputs(args, kwargs):
        tensors[k] = t
        rg[k] = bool(t.requires_grad)
    rg.update(requires_grad or {})
    if output is not None:
        for k, t in flatten_output(output):
            tensors[k] = t
    for io, grads in (("backward_input", backward_input), ("backward_output", backward_output)):
        for idx, g in (grads or {}).items():
            if g is not None:
                tensors[f"{io}.{idx}"] = g
    return write_package(out_dir, api, encode_call(args, kwargs), tensors, rg, stack, meta)


# ---------------------------------------------------------------------------------------------
# reading


def _field(doc: Mapping[str, Any], name: str, kind: type, path: str) -> Any:
    if name not in doc:
        raise ValueError(f"{path}: missing field {name!r}")
    value = doc[name]
    if not isinstance(value, kind):
        raise ValueError(f"{path}: field {name!r} must be {kind.__name__}, got {type(value).__name__}")
    return value


def load_package(package_dir: str) -> Package:
    """Read ``package_dir/package.json``; raises FileNotFoundError/ValueError naming the problem."""
    path = os.path.join(package_dir, PACKAGE_FILE)
    if not os.path.isdir(package_dir):
        raise FileNotFoundError(f"reproduction package not found: {package_dir} is not a directory")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{package_dir} is not a reproduction package: {PACKAGE_FILE} is missing")
    doc = _read_json(path)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{path}: not a ptdbg reproduction package (field 'format' must be {FORMAT!r})")
    version = doc.get("version", 0)
    if type(version) is not int:
        raise ValueError(f"{path}: field 'version' must be an integer, got {str(version)[:40]!r}")
    if version > VERSION:
        raise ValueError(f"{path}: package version {version} is newer than this reader ({VERSION})")
    api = _field(doc, "api", str, path)
    records.parse_name(api)
    call = _field(doc, "call", dict, path)
    infos: Dict[str, TensorInfo] = {}
    for key, t in _field(doc, "tensors", dict, path).items():
        where = f"{path}: tensor {key!r}"
        if not _KEY.fullmatch(key) or not isinstance(t, dict):
            raise ValueError(f"{where}: bad tensor entry")
        fname = _field(t, "file", str, where)
        records.safe_data_path(package_dir, fname[:-4] if fname.endswith(".npy") else fname)
        if not fname.endswith(".npy") or os.path.isabs(fname):
            raise ValueError(f"{where}: field 'file' must be a .npy file name inside the package")
        shape = _field(t, "shape", list, where)
        if not all(type(n) is int and 0 <= n < 2 ** 63 for n in shape) or len(shape) > 64:
            raise ValueError(f"{where}: field 'shape' must be a list of at most 64 non-negative integers")
        infos[key] = TensorInfo(key, fname, _field(t, "dtype", str, where), tuple(shape),
                                bool(t.get("requires_grad", False)))
    for ref in tensor_refs(call):
        if not isinstance(ref, str) or ref not in infos:
            raise ValueError(f"{path}: call refers to tensor {str(ref)[:60]!r}, which the package does not hold")
    rng = doc.get("rng")
    if rng is not None and (not isinstance(rng, dict) or rng.get("file") != RNG_FILE):
        raise ValueError(f"{path}: field 'rng' must be {{'device': ..., 'file': {RNG_FILE!r}}}")
    stack, meta = doc.get("stack") or [], doc.get("meta") or {}
    if not isinstance(stack, list) or not isinstance(meta, dict):
        raise ValueError(f"{path}: fields 'stack' and 'meta' must be a list and an object")
    return Package(os.path.abspath(package_dir), api, call, infos, stack, meta, rng)


#: a package.json larger than this is refused (a call spec and a stack are a few KB)
MAX_JSON_BYTES = 16 << 20


def _read_json(path: str) -> Any:
    """``package.json`` parsed, as a regular file of bounded size and nesting (the dump reader's
    :data:`~pytest_ptdbg.dump.reader.MAX_DEPTH`): ValueError naming the file otherwise."""
    from pytest_ptdbg.dump.npy import open_regular
    from pytest_ptdbg.dump.reader import MAX_DEPTH, nesting_ok

    with open_regular(path, PACKAGE_FILE) as fh:
        raw = fh.read(MAX_JSON_BYTES + 1)
    if len(raw) > MAX_JSON_BYTES:
        raise ValueError(f"{path}: larger than {MAX_JSON_BYTES >> 20} MiB: not a reproduction package")
    try:
        text = raw.decode("utf-8")
        brackets = text.count("[") + text.count("{")
        doc = json.loads(text)
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    except RecursionError:
        raise ValueError(f"{path}: JSON nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not nesting_ok(doc, MAX_DEPTH, brackets):
        raise ValueError(f"{path}: JSON nested deeper than {MAX_DEPTH} levels")
    return doc


def package_records(pkg: Package) -> Tuple[Any, Optional[Any]]:
    """The package's call as the dump's records (``dump.reader.ApiRec``: its forward, with the call
    spec and the saved tensors, and its backward for a backward package), so that the judgement
    judges it as it judges a call of a dump."""
    from pytest_ptdbg.dump.reader import ApiRec, TensorRec

    p = pkg.parsed

    def rec(direction: str) -> Any:
        return ApiRec(records.api_key(p.api_type, p.api_name, p.call_index, direction), p.api_type, p.api_name,
                      p.call_index, direction, 0, stack=pkg.stack or None)

    def tensor(owner: Any, key: str, io: str, extra: dict) -> Any:
        info = pkg.tensors[key]
        index = tuple(int(i) for i in key.split(".")[1:])
        slot = f"{io}." + ".".join(str(i) for i in index)
        return TensorRec(f"{owner.key}_{slot}", owner.key, io, index, owner.direction, info.dtype,
                         tuple(info.shape), [], extra, 0, data_file=pkg.file_path(key), slot=slot)

    fwd = rec("forward")
    first = True
    for io in ("input", "output"):
        for key in pkg.keys(io):
            extra: Dict[str, Any] = {"rg": True} if io == "input" and pkg.tensors[key].requires_grad else {}
            if first:
                extra["call"] = pkg.call
                first = False
            fwd.tensors.append(tensor(fwd, key, io, extra))
    if p.direction != "backward":
        return fwd, None
    bwd = rec("backward")
    for io in ("input", "output"):
        for key in pkg.keys("backward_" + io):
            bwd.tensors.append(tensor(bwd, key, io, {}))
    return fwd, bwd
