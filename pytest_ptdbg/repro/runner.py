"""Run one saved API call again and compare the result with what was saved.

``replay(package_dir, device="cpu", dtype=None)`` loads a reproduction package (see
``package.py``), rebuilds the call from its saved inputs on ``device`` (optionally with every
floating-point input and floating ``dtype=`` argument cast to ``dtype``, e.g. ``"float64"`` for an
oracle), runs it (forward; for a
backward package, forward then ``autograd.grad`` with the saved incoming gradient) and compares
each result with the saved one using the compare stage's metrics and verdict rule. Inputs are the
same on both sides, so whatever differs is this API's own doing.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple, Union

import numpy as np

from pytest_ptdbg.errors import NotReplayable, ReplayRefused
from pytest_ptdbg.judge.verdicts import CallVerdict, Status
from pytest_ptdbg.runtime.text import fmt_number
from pytest_ptdbg.replayer import codec
from pytest_ptdbg.replayer.allowlist import torch_dtype
from pytest_ptdbg.replayer.engine import check_device, parse_dtype, resolve_api
from pytest_ptdbg.repro import package as pkgmod
from pytest_ptdbg.repro.package import Package
from pytest_ptdbg.errors import ReplayError

__all__ = ["replay", "replay_package", "run_package", "resolve_api", "ReplayResult", "TensorCheck",
           "ReplayError", "ReplayRefused"]


# ---------------------------------------------------------------------------------------------
# running


def load_tensor(pkg: Package, key: str, device: Any, dtype: Any = None) -> Any:
    """Tensor ``key`` of ``pkg`` on ``device``, in its recorded dtype (or ``dtype`` when floating)."""
    import torch

    arr = pkg.load_array(key)
    t = torch.from_numpy(np.ascontiguousarray(arr))
    want = torch_dtype(pkg.tensors[key].dtype)
    if want is not None and t.dtype != want:
        t = t.to(want)
    if dtype is not None and t.is_floating_point():
        t = t.to(dtype)
    return t.to(device)


class _PackageArrays(Mapping):
    """The package's saved arrays by key, each read when the replay first asks for it."""

    def __init__(self, pkg: Package) -> None:
        self._pkg = pkg
        self._keys = list(pkg.tensors)
        self._loaded: Dict[str, np.ndarray] = {}

    def __contains__(self, key: object) -> bool:  # no load (Mapping's default would load)
        return key in self._keys

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self._keys:
            raise KeyError(key)
        if key not in self._loaded:
            self._loaded[key] = np.ascontiguousarray(self._pkg.load_array(key))
        return self._loaded[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def run_package(pkg: Package, device: Any = "cpu", dtype: Any = None) -> Dict[str, Any]:
    """Run the package's call by the replay engine (:func:`pytest_ptdbg.replayer.engine.replay_call`,
    the judgement's rules); returns ``{key: tensor}`` for forward outputs (``output.*``) and, for a
    backward package, the produced gradients (``backward_output.*``). ``dtype`` float64 is the
    oracle; another dtype casts the floating inputs and floating ``dtype=`` arguments. The API and
    its arguments go through the allowlist first (``pytest_ptdbg/replayer/``): ReplayRefused,
    nothing run."""
    import torch

    from pytest_ptdbg.replayer.engine import replay_call

    dev = check_device(str(device))
    dt = parse_dtype(dtype)
    p = pkg.parsed
    func = resolve_api(p.api_type, p.api_name, pkg.api)  # ReplayRefused unless allowlisted
    guard_package(func, pkg)  # AllocationRefused: it would make more than its recorded outputs
    backward = p.direction == "backward"
    oracle = dt == torch.float64
    try:
        done = replay_call(func, pkg.api, pkg.call, _PackageArrays(pkg), {k: i.dtype for k, i in pkg.tensors.items()},
                           dev, oracle=oracle, cast=None if oracle else dt, cast_args=True, backward=backward,
                           requires_grad={k for k, i in pkg.tensors.items() if i.requires_grad},
                           draws=lambda: _same_draws(pkg, dev))
    except ReplayRefused:
        raise
    except NotReplayable as exc:
        raise ReplayError(str(exc)) from None
    if backward and not done.leaves:
        raise ReplayError(f"{pkg.api}: no input requires grad; nothing to differentiate")
    if backward and not done.differentiated:
        raise ReplayError(f"{pkg.api}: no output that requires grad has a saved incoming gradient "
                          f"(backward_input.*); nothing to differentiate")
    return done.tensors


def guard_package(func: Callable, pkg: Package) -> None:
    """Refuse (AllocationRefused, before anything is loaded or run) a package whose call would
    make more elements than its recorded outputs (``output.*``, and the gradients arriving at them,
    ``backward_input.*``) allow; each output counted at most as many elements as its file has
    bytes, so a ``package.json`` cannot claim outputs its files do not hold."""
    import os

    from pytest_ptdbg.replayer.allocation import FLOOR, guard_call

    shapes, outputs = {}, []
    for key, info in pkg.tensors.items():
        io = key.split(".", 1)[0]
        if io == "input":
            shapes[key] = info.shape
        elif io in ("output", "backward_input"):
            try:
                size = os.stat(pkg.file_path(key)).st_size
            except (OSError, ValueError):
                size = 0
            outputs.append((min(math.prod(info.shape), size),))

    def value(key: str) -> Any:
        info = pkg.tensors.get(key)
        return pkg.load_array(key) if info is not None and math.prod(info.shape) <= FLOOR else None

    def dtype(key: str) -> Any:
        name = pkg.tensors[key].dtype
        return torch_dtype(name) or _nptorch_dtype(name)

    guard_call(func, pkg.api, pkg.call, shapes, dtype, outputs, value)


def _nptorch_dtype(name: str) -> Any:
    import torch

    try:
        return torch.from_numpy(np.empty(0, dtype=np.dtype(name.split(".", 1)[-1]))).dtype
    except (TypeError, ValueError):
        return torch.float32


@contextlib.contextmanager
def _same_draws(pkg: Package, dev: Any) -> Iterator[None]:
    """Run with the generator state saved before the original call (random APIs such as dropout)
    when the package has one for this device type; the caller's generator state is restored."""
    import torch

    saved = pkg.rng_state()
    if saved is None or saved[0] != dev.type or dev.type not in ("cpu", "cuda"):
        yield
        return
    state = torch.from_numpy(np.ascontiguousarray(saved[1]))
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []):
        try:
            if dev.type == "cpu":
                torch.set_rng_state(state)
            else:
                torch.cuda.set_rng_state(state, dev)
        except (RuntimeError, TypeError, ValueError) as exc:
            raise ReplayError(f"{pkg.api}: its random generator state ({pkgmod.RNG_FILE}, {state.numel()} "
                              f"bytes) is not a {dev.type} generator state: {' '.join(str(exc).split())}") from None
        yield


# ---------------------------------------------------------------------------------------------
# comparing


@dataclass
class TensorCheck:
    """The comparison of one replayed tensor with the saved one."""

    key: str
    dtype: str
    replay_dtype: str
    shape: Tuple[int, ...]
    cosine: float
    max_abs_err: float
    max_rel_err: float
    one_thousandth: float
    five_thousandths: float
    rel_l2: float
    passed: bool
    message: str = ""
    #: bit for bit the same values (NaN where NaN), compared in the saved dtype
    identical: bool = False


@dataclass
class ReplayResult:
    """What a replay found: one :class:`TensorCheck` per compared tensor and, under the
    ``"budget"`` rule, the judgement's verdict of the call (:attr:`verdict`)."""

    package: str
    api: str
    device: str
    dtype: Optional[str]
    checks: List[TensorCheck]
    outputs: Dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    #: ``"budget"`` (the judgement's own error against its budget), ``"dtype"`` or ``"ptdbg"``
    #: (the compare stage's per-tensor rule)
    rule: str = "dtype"
    #: the call's verdict by :func:`pytest_ptdbg.judge.own_error.judge_call` (rule ``"budget"``)
    verdict: Optional[CallVerdict] = None

    @property
    def by_budget(self) -> bool:
        """Whether the verdict is the budget's: rule ``"budget"`` and the judgement judged the call
        (or found it unusable); otherwise the per-tensor rule decides."""
        v = self.verdict
        return self.rule == "budget" and v is not None and (v.status != Status.NOT_JUDGED or v.unusable)

    @property
    def passed(self) -> bool:
        if self.by_budget:
            assert self.verdict is not None
            return self.verdict.status == Status.WITHIN
        return all(c.passed for c in self.checks)

    @property
    def identical(self) -> bool:
        return bool(self.checks) and all(c.identical for c in self.checks)

    @property
    def worst(self) -> Optional[TensorCheck]:
        """The check with the largest relative L2 error (failed checks first)."""
        if not self.checks:
            return None
        return max(self.checks, key=lambda c: (not c.passed, _nan_low(c.rel_l2), _nan_low(c.max_abs_err)))

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k not in ("outputs", "verdict")}
        d["verdict"] = self.verdict.to_dict() if self.verdict is not None else None
        d["by_budget"] = self.by_budget
        d["passed"] = self.passed
        d["identical"] = self.identical
        return d

    def text(self) -> str:
        """A short table for the console."""
        how = f"on {self.device}" + (f" in {self.dtype}" if self.dtype else "")
        if self.by_budget:
            head = f"replay of {self.api} {how}: " + ("PASSED" if self.passed else "FAILED") + (
                " (the replay is identical to the saved result)" if self.identical else "")
        else:
            head = f"replay of {self.api} {how}: " + (
                "identical to the saved result" if self.identical else "PASSED" if self.passed else "FAILED")
        lines = [head]
        v = self.verdict
        if self.by_budget and v is not None:
            word = "could not be judged" if v.unusable else v.status.value
            lines.append(f"verdict (compare's judgement): {word}: {v.text().split(': ', 1)[-1]}")
        elif self.rule == "budget" and v is not None:
            lines.append(f"not judged by the budget ({v.reason}); verdict by the per-tensor dtype rule")
        ok = "ok" if not self.by_budget else "ok (dtype rule)"
        lines.append(f"{'tensor':<22} {'dtype':<15} {'cosine':>10} {'max abs err':>12} "
                     f"{'max rel err':>12} {'rel L2':>10}  {ok}")
        for c in self.checks:
            lines.append(f"{c.key:<22} {c.dtype:<15} {fmt_number(c.cosine):>10} {fmt_number(c.max_abs_err):>12} "
                         f"{fmt_number(c.max_rel_err):>12} {fmt_number(c.rel_l2):>10}  {'yes' if c.passed else 'NO'}"
                         + (f"  {c.message}" if c.message else ""))
        return "\n".join(lines)


def _nan_low(x: float) -> float:
    return -1.0 if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def compare_tensor(key: str, expected: np.ndarray, expected_dtype: str, actual: Any,
                   rule: Optional[str] = None) -> TensorCheck:
    """Compare a replayed tensor with the saved array using ``comparison.metrics``/``comparison.verdict``."""
    from pytest_ptdbg.repro import checks as _metrics

    act = codec.to_numpy(actual)
    replay_dtype = str(actual.dtype)
    if tuple(act.shape) != tuple(expected.shape):
        return TensorCheck(key, expected_dtype, replay_dtype, tuple(expected.shape), math.nan, math.nan,
                           math.nan, math.nan, math.nan, math.nan, False,
                           f"shape {list(act.shape)} differs from the saved {list(expected.shape)}")
    m = _metrics.pair_metrics(expected, act, expected_dtype, replay_dtype, rule)
    same = expected.dtype == act.dtype and bool(np.array_equal(expected, act, equal_nan=expected.dtype.kind in "fc"))
    return TensorCheck(key, expected_dtype, replay_dtype, tuple(expected.shape), identical=same, **m)


def judge_package(pkg: Package, device: Any = "cpu") -> CallVerdict:
    """The package's call judged as compare judges it (:func:`pytest_ptdbg.judge.own_error.judge_call`:
    its own error, saved result against a float64 replay, within its budget, a replay in its
    compute dtype): the verdict of the package's direction."""
    from pytest_ptdbg.judge.own_error import judge_call

    fwd, bwd = pkgmod.package_records(pkg)
    verdicts = judge_call(fwd, bwd, device=device)
    return next((v for v in verdicts if v.direction == pkg.direction), verdicts[0])


RULES = ("budget", "dtype", "ptdbg")


def replay_package(pkg: Package, device: Any = "cpu", dtype: Any = None, rule: str = "dtype",
                   against: Optional[Dict[str, np.ndarray]] = None) -> ReplayResult:
    """Replay a loaded package; compare with its saved results (or with ``against``). Rule
    ``"budget"``: also judge the call by its own error against its budget (:func:`judge_package`),
    which then decides; the per-tensor checks use the ``"dtype"`` rule."""
    if rule not in RULES:
        raise ValueError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")
    per_tensor = "dtype" if rule == "budget" else rule
    produced = run_package(pkg, device, dtype)
    checks: List[TensorCheck] = []
    keys = list(against) if against is not None else pkg.expected_keys
    for key in keys:
        expected = against[key] if against is not None else pkg.load_array(key)
        exp_dtype = pkg.tensors[key].dtype if key in pkg.tensors else str(expected.dtype)
        if key not in produced:
            checks.append(TensorCheck(key, exp_dtype, "", tuple(expected.shape), math.nan, math.nan, math.nan,
                                      math.nan, math.nan, math.nan, False, "the replay did not produce it"))
            continue
        checks.append(compare_tensor(key, expected, exp_dtype, produced[key], per_tensor))
    dt = parse_dtype(dtype)
    verdict = judge_package(pkg, device) if rule == "budget" and against is None else None
    return ReplayResult(pkg.path, pkg.api, str(device), str(dt).replace("torch.", "") if dt else None, checks,
                        {k: codec.to_numpy(v) for k, v in produced.items()}, rule, verdict)


def replay(package_dir: str, device: str = "cpu", dtype: Union[str, Any, None] = None,
           rule: str = "budget") -> ReplayResult:
    """Load the reproduction package in ``package_dir``, run its API on ``device`` from the saved
    inputs (floating inputs and floating dtype arguments cast to ``dtype`` if given) and compare
    with the saved result.

    ``rule``: ``"budget"`` (default: the verdict compare's judgement gives this call, its own error
    against its budget, :func:`judge_package`; a call the judgement does not judge by value, such as
    a random one, falls back to ``"dtype"``), or a ``comparison.verdict`` rule for every tensor:
    ``"dtype"`` (the assert_close tolerances of the lower-precision side) or ``"ptdbg"`` (ptdbg's
    loose rule).
    Raises FileNotFoundError/ValueError for a bad package, ReplayRefused (a ValueError) before any
    call when its API is not in the judge's allowlist or an argument is not data, ReplayError when
    it cannot run.
    """
    return replay_package(pkgmod.load_package(package_dir), device, dtype, rule)
