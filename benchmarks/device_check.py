"""Does pytest-ptdbg work on a real accelerator? The one command a machine with a GPU or NPU runs.

    python benchmarks/device_check.py [--device auto|cuda|npu|cpu] [--out device_check.json] [--fast]
                                      [--keep DIR] [--budget-s 540]

``--device auto`` (the default) imports ``torch_npu`` where it can (an import failure, e.g. no
CANN, is caught and said), then asks ``torch.accelerator`` (``is_available()``,
``current_accelerator()``) for a CUDA or NPU device. With none it prints one line starting
``no accelerator: skipped`` that says what it looked for and why each was not there, and exits 0.
``--device cuda`` / ``--device npu`` ask for that device: missing, the same line, exit 2.
``--device cpu``: the CPU stands in for the device: for testing this script (every row runs with
device = CPU against the CPU bench, so the TF32 rows change nothing and the timings are the CPU's).

What it runs on the device, each a row of one printed table (name, gate, result, time, reason) and
of the JSON file (``--out``), in this order (the first rows matter most; a row that would start
after ``--budget-s`` seconds is reported as ERROR "time budget spent" and the others are not run):

1. the example suite device vs CPU bench, the ``ptdbg_dump`` fixture's engine
   (``pytest_ptdbg/plugin/run.py``): every example model's training step (mlp, cnn, tiny_gpt,
   lstm) with the device's default arithmetic (``suite:<model>:default``), with TF32 off
   (``tf32_off``: ``torch.backends.cuda.matmul.allow_tf32 = False``, ``cudnn.allow_tf32 = False``,
   ``set_float32_matmul_precision("highest")``), with TF32 on (``tf32_on``: ``True``, ``"high"``:
   each matmul and convolution records the TF32 it was allowed, and the judgement budgets it in
   TF32, so it must pass too) and under bf16 autocast against the float32 bench (``bf16``), with
   the default judgement (every call replayed against a float64 oracle). On an NPU the TF32 rows
   also set ``torch.npu.matmul.allow_hf32`` / ``torch.npu.conv.allow_hf32`` where torch_npu has
   them. Every flag is put back afterwards (the JSON says whether they all were);
2. ``dropout``: a model with dropout, device vs CPU: the masks are shared by ``plugin/rng.py``
   (``random="cpu"``), so every call must pair and the step pass;
3. ``adamw_foreach`` / ``adamw_fused``: ``AdamW(foreach=True)`` and ``AdamW(fused=True)`` on the
   device against a for-loop ``AdamW(foreach=False)`` on the CPU bench: the verdict, how many calls
   paired and the root causes;
4. ``planted_fault``: the example suite's planted fault (tiny GPT, softmax of attention layer 1 in
   float16 without max subtraction) on the device against the clean step on the device, dtype rule
   (as the suite's test does); ``planted_fault_vs_bench``: the faulty step on the device against the
   clean step on the CPU bench, default judgement. Each must fail, its first suspect a call of that
   softmax;
5. ``dump_cost``: tiny GPT's training step on the device (persistent AdamW), plain vs statistics
   dump vs full-tensor dump, interleaved rep by rep, the device synchronized around every timed
   step; medians and the ratios to plain from the same run (gate ``info``).

Each row is PASS, FAIL or ERROR (its exception, caught: the other rows go on) with a short reason;
the exit code is 1 when a row of gate ``must`` is not PASS, else 0. ``--fast`` runs the smallest
subset (the suite rows of mlp only, AdamW foreach only, 3 timing reps) — what the tests run with
``--device cpu``. The CPU side runs with ``torch.set_num_threads(1)``. Dumps and reports go to a
temporary folder, deleted at the end, unless ``--keep DIR`` (then the failing rows' HTML reports are
named in the JSON: send them back too).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import torch  # noqa: E402

#: the first words of the line printed when there is no accelerator
SKIP_LINE = "no accelerator: skipped"
MODELS = ("mlp", "cnn", "tiny_gpt", "lstm")
FAST_MODELS = ("mlp",)
SUPPORTED = ("cuda", "npu")
MUST, INFO = "must", "info"
PASS, FAIL, ERROR = "PASS", "FAIL", "ERROR"


# ------------------------------------------------------------------------------- detection

@dataclass
class Detection:
    """Which device to check: ``device`` ("cuda", "npu", "cpu") or None (none found: ``message``
    says what was looked for and why it is not there). ``stand_in``: the CPU plays the device."""

    device: Optional[str]
    message: str
    looked_for: List[str] = field(default_factory=list)
    stand_in: bool = False


def _import_torch_npu() -> Tuple[Optional[Any], str]:
    """``(torch_npu, "")``, or ``(None, why it did not import)`` (without CANN it fails to load)."""
    try:
        return importlib.import_module("torch_npu"), ""
    except Exception as exc:  # ImportError, or OSError/RuntimeError loading CANN's libraries
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return None, f"torch_npu is not importable ({type(exc).__name__}: {first[:200]})"


def _cuda_reason() -> str:
    """Why there is no CUDA device here."""
    try:
        built = torch.backends.cuda.is_built()
    except Exception:  # pragma: no cover - very old torch
        built = False
    if not built:
        return f"no CUDA build (torch {torch.__version__})"
    return "CUDA build, but no CUDA device is visible (torch.cuda.is_available() is False)"


def detect(requested: str = "auto") -> Detection:
    """The device ``requested`` (auto, cuda, npu, cpu) resolves to, found through ``torch_npu``
    (imported first: it registers the NPU as torch's accelerator) and ``torch.accelerator``."""
    requested = (requested or "auto").strip().lower()
    if requested == "cpu":
        return Detection("cpu", "the CPU stands in for the device (--device cpu): for testing this script",
                         ["--device cpu: nothing looked for"], stand_in=True)
    looked: List[str] = []
    _, npu_problem = _import_torch_npu()
    looked.append(f"torch_npu: {npu_problem}" if npu_problem else "torch_npu: imported")
    acc = getattr(torch, "accelerator", None)
    found: Optional[str] = None
    if acc is None:
        looked.append(f"torch.accelerator: missing in torch {torch.__version__} (it needs torch >= 2.6)")
    else:
        try:
            available = bool(acc.is_available())
            current = acc.current_accelerator() if available else None
        except Exception as exc:  # a broken driver: said, never raised
            available, current = False, None
            looked.append(f"torch.accelerator: failed ({type(exc).__name__}: {exc})")
        else:
            kind = getattr(current, "type", None)
            if not available or kind is None:
                looked.append(f"torch.accelerator: none available ({_cuda_reason()}"
                              + ("; no NPU: torch_npu did not import)" if npu_problem else ")"))
            elif kind not in SUPPORTED:
                looked.append(f"torch.accelerator: {kind!r}, which this check does not run on "
                              f"(it runs on {' or '.join(SUPPORTED)})")
            else:
                looked.append(f"torch.accelerator: {kind}")
                found = kind
    if requested not in ("auto",) + SUPPORTED:
        return Detection(None, f"unknown --device {requested!r}: expected auto, cuda, npu or cpu", looked)
    if found is not None and requested in ("auto", found):
        return Detection(found, f"device under test: {found}", looked)
    asked = "" if requested == "auto" else f"{requested} asked for but not found; "
    return Detection(None, f"{SKIP_LINE}: {asked}looked for " + "; ".join(looked), looked)


# ------------------------------------------------------------------------------- flags

def _flag_targets(device_type: str) -> List[Tuple[str, Any, str]]:
    """``(label, object, attribute)`` of the arithmetic flags a row may set (those present)."""
    out = [("torch.backends.cuda.matmul.allow_tf32", torch.backends.cuda.matmul, "allow_tf32"),
           ("torch.backends.cudnn.allow_tf32", torch.backends.cudnn, "allow_tf32")]
    npu = getattr(torch, "npu", None) if device_type == "npu" else None
    for sub in ("matmul", "conv"):
        obj = getattr(npu, sub, None)
        if obj is not None and hasattr(obj, "allow_hf32"):
            out.append((f"torch.npu.{sub}.allow_hf32", obj, "allow_hf32"))
    return out


def flag_state(device_type: str) -> Dict[str, Any]:
    """The arithmetic flags this script may change, as they are now."""
    state: Dict[str, Any] = {}
    for label, obj, attr in _flag_targets(device_type):
        try:
            state[label] = getattr(obj, attr)
        except Exception as exc:  # noqa: BLE001 - a flag a backend refuses to read
            state[label] = f"unreadable ({type(exc).__name__})"
    state["torch.get_float32_matmul_precision()"] = torch.get_float32_matmul_precision()
    return state


@contextlib.contextmanager
def arithmetic(device_type: str, tf32: Optional[bool]) -> Iterator[Dict[str, Any]]:
    """TF32 (and an NPU's HF32) on (True), off (False) or left as they are (None) for the block;
    every flag and the float32 matmul precision are put back afterwards."""
    before = flag_state(device_type)
    targets = _flag_targets(device_type)
    try:
        if tf32 is not None:
            for _, obj, attr in targets:
                setattr(obj, attr, tf32)
            torch.set_float32_matmul_precision("high" if tf32 else "highest")
        yield flag_state(device_type)
    finally:
        for label, obj, attr in targets:
            if isinstance(before.get(label), bool):
                setattr(obj, attr, before[label])
        torch.set_float32_matmul_precision(before["torch.get_float32_matmul_precision()"])


def environment(device: "torch.device") -> Dict[str, Any]:
    """The few facts about the device and its arithmetic this script prints (not the manifest's
    environment record)."""
    env: Dict[str, Any] = {"torch": torch.__version__, "python": platform.python_version(),
                           "device": str(device)}
    if device.type == "cuda":
        env["cuda"] = torch.version.cuda
        try:
            env["device_name"] = torch.cuda.get_device_name(device)
            env["capability"] = ".".join(map(str, torch.cuda.get_device_capability(device)))
        except Exception as exc:  # noqa: BLE001
            env["device_name"] = f"unknown ({type(exc).__name__})"
    if device.type == "npu":
        mod = sys.modules.get("torch_npu")
        env["torch_npu"] = getattr(mod, "__version__", "?")
        try:
            env["device_name"] = torch.npu.get_device_name(device)  # type: ignore[attr-defined]
        except Exception as exc:  # noqa: BLE001
            env["device_name"] = f"unknown ({type(exc).__name__})"
    env.update(flag_state(device.type))
    env["torch.are_deterministic_algorithms_enabled()"] = torch.are_deterministic_algorithms_enabled()
    env["torch.backends.cudnn.deterministic"] = torch.backends.cudnn.deterministic
    env["torch.backends.cudnn.benchmark"] = torch.backends.cudnn.benchmark
    sdp = {}
    for name in ("flash", "mem_efficient", "math", "cudnn"):
        fn = getattr(torch.backends.cuda, f"{name}_sdp_enabled", None)
        if fn is not None:
            try:
                sdp[name] = bool(fn())
            except Exception:  # noqa: BLE001
                pass
    env["sdpa_backends_enabled"] = ",".join(k for k, v in sdp.items() if v) or "none"
    env["cpu_threads"] = torch.get_num_threads()
    return env


def synchronize(device: "torch.device") -> None:
    """Wait for the device's queued work (nothing on the CPU)."""
    if device.type == "cpu":
        return
    acc = getattr(torch, "accelerator", None)
    if acc is not None and hasattr(acc, "synchronize"):
        acc.synchronize(device)
    else:  # pragma: no cover - torch < 2.6
        getattr(torch, device.type).synchronize(device)


# ------------------------------------------------------------------------------- rows

@dataclass
class Row:
    """One line of the table: what ran and how it ended."""

    name: str
    what: str
    gate: str = MUST
    result: str = ""
    reason: str = ""
    seconds: float = 0.0
    details: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Context:
    device: "torch.device"
    bench: "torch.device"
    work: str
    fast: bool
    reps: int
    keep: bool


Check = Callable[[Context], Tuple[str, str, Dict[str, Any]]]


def _settings(**overrides: Any) -> Any:
    from pytest_ptdbg.plugin.options import Settings

    return dataclasses.replace(Settings(device="cpu", bench="cpu", keep="none"), **overrides)


def _result(ctx: Context, name: str, npu: Any, bench: Any, out: str, settings: Any,
            bench_label: str) -> Any:
    """The fixture's verdict on two side runs (``PrecisionResult``: rule, ignore lists, NaN/Inf)."""
    from pytest_ptdbg.plugin.fixture import PrecisionResult
    from pytest_ptdbg.plugin.run import compare_sides, health_problems

    cmp = compare_sides(npu, bench, os.path.join(out, "compare"), settings)
    problems = health_problems(npu.health or {}, bench.health, f"device ({ctx.device})",
                               f"bench ({bench_label})") if npu.health is not None else []
    return PrecisionResult(cmp, settings, nodeid=name, call=0, npu=npu, bench=bench, out_dir=out,
                           bench_label=bench_label, device=str(ctx.device), health=problems)


def run_pair(ctx: Context, name: str, model: Any, batch: Any, device_step: Callable, bench_step: Callable,
             dtype: str = "float32", **overrides: Any) -> Any:
    """``device_step`` on a copy of the model on the device (autocast when ``dtype`` asks) and
    ``bench_step`` on the CPU bench in float32, both under the dump hooks with the same seed and the
    shared CPU random numbers, then the compare: what ``ptdbg_dump(model, batch)`` does."""
    from pytest_ptdbg.plugin.run import preserved_rng, run_model

    settings = _settings(dtype=dtype, **overrides)
    out = os.path.join(ctx.work, name.replace(":", "_"))
    with preserved_rng([ctx.device, ctx.bench]):
        npu = run_model(model, batch, device_step, device=ctx.device, dtype=dtype,
                        dump_path=os.path.join(out, "npu"), settings=settings, summary_only=False)
        bench = run_model(model, batch, bench_step, device=ctx.bench, dtype="float32",
                          dump_path=os.path.join(out, "bench"), settings=settings, summary_only=False)
    return _result(ctx, name, npu, bench, out, settings, str(ctx.bench))


def _pairing(result: Any) -> Dict[str, Any]:
    pairing = result.compare_result.table.attrs.get("pairing")
    if pairing is None:
        return {}
    return {"paired_calls": int(pairing.paired), "calls": int(pairing.calls)}


def describe(result: Any) -> Tuple[str, Dict[str, Any]]:
    """A short reason for a verdict, and the JSON details (root causes, first suspect, reports)."""
    cmp = result.compare_result
    judged = cmp.judgement
    causes = [] if judged is None else [f"{r.api + ' ' if r.api else ''}[{r.cause}]" for r in judged.root_causes]
    first = result.first_suspect
    pair = _pairing(result)
    details: Dict[str, Any] = {
        "passed": result.verdict(), "rows": len(cmp.table), **pair,
        "root_causes": [] if judged is None else [r.to_dict() for r in judged.root_causes[:10]],
        "first_suspect": None if first is None else {"api": first.api, "kind": first.kind,
                                                      "location": first.location},
        "problems": list(cmp.problems[:10]), "nonfinite": list(result.health_problems),
        "worst": result.evaluation.worst, "html": result.html_path,
    }
    paired = f"{pair['paired_calls']}/{pair['calls']} calls paired" if pair else "pairing unknown"
    if result.verdict():
        return f"passed; {paired}; {len(cmp.table)} rows", details
    bits = [paired]
    if causes:
        more = f" (+{len(causes) - 3} more)" if len(causes) > 3 else ""
        bits.append("root causes: " + ", ".join(causes[:3]) + more)
    if first is not None and not causes:
        bits.append(f"first suspect {first.api}")
    bits += [f"problem: {p[:120]}" for p in cmp.problems[:1]]
    bits += [f"NaN/Inf: {p}" for p in result.health_problems[:1]]
    return "failed; " + "; ".join(bits), details


def _verdict_row(result: Any, want_pass: bool = True) -> Tuple[str, str, Dict[str, Any]]:
    reason, details = describe(result)
    ok = result.verdict() == want_pass
    return (PASS if ok else FAIL), reason, details


def suite_check(model_name: str, mode: str) -> Check:
    """One example model's training step, device vs CPU bench, in arithmetic ``mode``
    (default, tf32_off, tf32_on, bf16)."""
    def check(ctx: Context) -> Tuple[str, str, Dict[str, Any]]:
        import example_models as em

        model, batch = em.MODELS[model_name]()
        tf32 = {"tf32_off": False, "tf32_on": True}.get(mode)
        dtype = "bfloat16" if mode == "bf16" else "float32"
        with arithmetic(ctx.device.type, tf32) as flags:
            result = run_pair(ctx, f"suite:{model_name}:{mode}", model, batch, em.train_step,
                              em.train_step, dtype=dtype)
        res, reason, details = _verdict_row(result)
        details["flags"] = flags
        return res, reason, details
    return check


class DropoutMLP(torch.nn.Module):
    """Linear -> GELU -> Dropout(0.5) -> Linear -> F.dropout(0.2) -> Linear: random masks twice."""

    default_lr = 0.1
    optimizer_name = "sgd"

    def __init__(self, d_in: int = 32, hidden: int = 64, n_classes: int = 10) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, hidden)
        self.drop = torch.nn.Dropout(0.5)
        self.fc2 = torch.nn.Linear(hidden, hidden)
        self.fc3 = torch.nn.Linear(hidden, n_classes)

    def forward(self, x: "torch.Tensor", target: Optional["torch.Tensor"] = None) -> "torch.Tensor":
        h = self.drop(torch.nn.functional.gelu(self.fc1(x)))
        h = torch.nn.functional.dropout(torch.relu(self.fc2(h)), 0.2, training=self.training)
        out = self.fc3(h)
        return out if target is None else torch.nn.functional.cross_entropy(out, target)

    def loss(self, batch: Any) -> "torch.Tensor":
        return self(*batch)


def dropout_check(ctx: Context) -> Tuple[str, str, Dict[str, Any]]:
    import example_models as em

    _, batch = em.mlp()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = DropoutMLP()
    result = run_pair(ctx, "dropout", model, batch, em.train_step, em.train_step)
    res, reason, details = _verdict_row(result)
    table = result.compare_result.table
    from pytest_ptdbg.comparison import schema as S

    drop = table[table[S.API].str.lower().str.contains("dropout")]
    unpaired = int((drop[S.BENCH_API] == "").sum())
    details["dropout_rows"], details["dropout_rows_unpaired"] = len(drop), unpaired
    pair = _pairing(result)
    if res == PASS and (len(drop) == 0 or unpaired or pair.get("paired_calls") != pair.get("calls")):
        res = FAIL
        reason = (f"passed but the dropout calls did not all pair: {len(drop)} dropout rows, "
                  f"{unpaired} unpaired; {reason}")
    return res, reason, details


def _adamw_step(**kw: Any) -> Callable:
    def step(model: Any, batch: Any) -> Any:
        import example_models as em

        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, **kw)
        opt.zero_grad(set_to_none=True)
        loss = em.forward_step(model, batch)
        opt.step()
        return loss
    step.__name__ = "adamw_" + "_".join(f"{k}_{v}" for k, v in kw.items())
    return step


def optimizer_check(variant: str) -> Check:
    """``AdamW(<variant>=True)`` on the device against ``AdamW(foreach=False)`` on the CPU bench."""
    def check(ctx: Context) -> Tuple[str, str, Dict[str, Any]]:
        import example_models as em

        model, batch = em.mlp()
        result = run_pair(ctx, f"adamw_{variant}", model, batch, _adamw_step(**{variant: True}),
                          _adamw_step(foreach=False))
        return _verdict_row(result)
    return check


def _planted(model: Any, batch: Any) -> Any:
    """The device under test's "kernel": softmax in float16 without max subtraction, layer 1
    (as ``example_models/test_precision.py``'s ``_plant_fault``)."""
    import example_models as em

    em.set_faulty_softmax(model, layer=1)
    return em.train_step(model, batch)


def _fault_verdict(result: Any) -> Tuple[str, str, Dict[str, Any]]:
    """PASS when the compare failed and its first suspect is a call of layer 1's softmax."""
    from pytest_ptdbg.format.records import parse_name

    reason, details = describe(result)
    if result.verdict():
        return FAIL, "the planted fault was not caught: " + reason, details
    first = result.first_suspect
    if first is None:
        return FAIL, "caught, but no suspect named; " + reason, details
    name = parse_name(first.api)
    # layer 0's softmax makes to #0, exp #0, sum #0, div #0, to #1; layer 1's to #2 (the cast to
    # float16), exp #1, sum #1, div #1, to #3
    layer1 = {"to": (2, 3), "exp": (1,), "sum": (1,), "div": (1,), "__truediv__": (1,)}
    in_softmax = " in softmax: " in (first.location or "")
    named = f"first suspect {first.api} ({first.kind}) at {os.path.basename((first.location or '').split(':')[0])}"
    if name.call_index in layer1.get(name.api_name, ()) and in_softmax:
        return PASS, f"caught; {named}, layer 1's softmax", details
    return FAIL, f"caught, but the {named} is not layer 1's softmax; {reason}", details


def fault_check(ctx: Context) -> Tuple[str, str, Dict[str, Any]]:
    """The example suite's planted fault on the device against the clean step on the device
    (``ptdbg_dump.compare_runs``, dtype rule, the optimizer left out)."""
    import example_models as em
    from pytest_ptdbg.comparison.rule import Rule
    from pytest_ptdbg.plugin.run import preserved_rng, run_side, to_device

    model, batch = em.tiny_gpt()
    settings = _settings(rule=Rule.DTYPE, ignore_optimizer=True)
    out = os.path.join(ctx.work, "planted_fault")
    with preserved_rng([ctx.device]):
        npu = run_side(_planted, to_device((model, batch), ctx.device), device=ctx.device, dtype="float32",
                       dump_path=os.path.join(out, "npu"), settings=settings, summary_only=False)
        bench = run_side(em.train_step, to_device((model, batch), ctx.device), device=ctx.device,
                         dtype="float32", dump_path=os.path.join(out, "bench"), settings=settings,
                         summary_only=False)
    return _fault_verdict(_result(ctx, "planted_fault", npu, bench, out, settings,
                                  f"clean step on {ctx.device}"))


def fault_vs_bench_check(ctx: Context) -> Tuple[str, str, Dict[str, Any]]:
    """The planted fault on the device against the clean step on the CPU bench, default judgement."""
    import example_models as em

    model, batch = em.tiny_gpt()
    return _fault_verdict(run_pair(ctx, "planted_fault_vs_bench", model, batch, _planted, em.train_step))


def cost_check(ctx: Context) -> Tuple[str, str, Dict[str, Any]]:
    """tiny GPT's step on the device: plain vs statistics dump vs full-tensor dump (medians)."""
    import example_models as em
    from pytest_ptdbg import PrecisionDebugger
    from pytest_ptdbg.format import records

    def workload() -> Callable[[], None]:
        model, batch = em.tiny_gpt()
        model = model.to(ctx.device)
        batch = tuple(t.to(ctx.device) for t in batch)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            model.loss(batch).backward()
            opt.step()
        return step

    def timed(run: Callable[[], None]) -> float:
        synchronize(ctx.device)
        t0 = time.perf_counter()
        run()
        synchronize(ctx.device)
        return time.perf_counter() - t0

    class Dumped:
        def __init__(self, out: str, summary_only: bool) -> None:
            self.out = out
            self.dbg = PrecisionDebugger(dump_path=out, hook_name="dump", step=None)
            self.dbg.configure_hook(mode="api_stack", summary_only=summary_only)

        def __call__(self, step: Callable[[], None]) -> float:
            n = self.dbg.current_step

            def run() -> None:
                self.dbg.start()
                step()
                self.dbg.stop()
                self.dbg.step()
            dt = timed(run)
            shutil.rmtree(records.step_dir(self.out, n), ignore_errors=True)
            return dt

    base = os.path.join(ctx.work, "dump_cost")
    variants: Dict[str, Callable[[Callable[[], None]], float]] = {
        "plain": timed, "statistics": Dumped(os.path.join(base, "stats"), True),
        "full": Dumped(os.path.join(base, "full"), False)}
    steps = {k: workload() for k in variants}
    times: Dict[str, List[float]] = {k: [] for k in variants}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)   # tiny GPT's dropout
        for k, runner in variants.items():   # warm-up (kernels, allocator, the debugger's first step)
            runner(steps[k])
        for _ in range(ctx.reps):
            for k, runner in variants.items():
                times[k].append(runner(steps[k]))
    for v in variants.values():
        if isinstance(v, Dumped):
            v.dbg.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = {k: med[k] / med["plain"] for k in ("statistics", "full")}
    details = {"reps": ctx.reps, "median_s": med, "ratio_to_plain": ratio, "times_s": times}
    reason = (f"plain {med['plain'] * 1e3:.1f} ms; statistics {ratio['statistics']:.2f}x; "
              f"full {ratio['full']:.2f}x (medians of {ctx.reps})")
    return PASS, reason, details


def plan(fast: bool) -> List[Tuple[Row, Check]]:
    """The rows to run, most important first."""
    rows: List[Tuple[Row, Check]] = []
    models = FAST_MODELS if fast else MODELS
    modes = (("default", "device defaults, fp32, vs CPU bench", MUST),
             ("tf32_off", "TF32 off (allow_tf32=False, 'highest'), fp32", MUST),
             ("tf32_on", "TF32 on (allow_tf32=True, 'high'), fp32, judged in TF32", MUST),
             ("bf16", "bf16 autocast vs fp32 CPU bench", MUST))
    for mode, what, gate in modes:
        for m in models:
            rows.append((Row(f"suite:{m}:{mode}", f"{m} train step, {what}", gate), suite_check(m, mode)))
    rows.append((Row("dropout", "dropout model, device vs CPU: masks shared, all calls pair"), dropout_check))
    rows.append((Row("adamw_foreach", "AdamW(foreach=True) on device vs for-loop AdamW on CPU"),
                 optimizer_check("foreach")))
    if not fast:
        rows.append((Row("adamw_fused", "AdamW(fused=True) on device vs for-loop AdamW on CPU"),
                     optimizer_check("fused")))
    rows.append((Row("planted_fault", "tiny GPT, fp16 softmax fault in layer 1 vs clean on device, dtype "
                     "rule: caught, suspect named"), fault_check))
    rows.append((Row("planted_fault_vs_bench", "the same fault on device vs clean CPU bench, default "
                     "judgement: caught, suspect named"), fault_vs_bench_check))
    rows.append((Row("dump_cost", "tiny GPT step: plain vs statistics vs full dump", INFO), cost_check))
    return rows


def run_rows(ctx: Context, todo: List[Tuple[Row, Check]], budget_s: float,
             say: Callable[[str], None] = print) -> List[Row]:
    """Run every row; an exception is the row's ERROR, the others go on; after ``budget_s`` seconds
    the rows not started are ERROR "time budget spent"."""
    t_start = time.perf_counter()
    done: List[Row] = []
    for row, check in todo:
        if time.perf_counter() - t_start > budget_s:
            row.result, row.reason = ERROR, f"not run: the time budget ({budget_s:.0f} s) was spent"
            done.append(row)
            continue
        t0 = time.perf_counter()
        try:
            row.result, row.reason, row.details = check(ctx)
        except Exception as exc:  # noqa: BLE001 - one row's failure is its own, the others go on
            row.result = ERROR
            row.reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"
            row.details = {"traceback": traceback.format_exc(limit=8)}
        row.seconds = time.perf_counter() - t0
        say(f"[device_check] {row.name}: {row.result} ({row.seconds:.1f} s) {row.reason}")
        done.append(row)
    return done


def table_text(rows: List[Row], width: int = 110) -> str:
    """The one table: name, gate, result, time, what and reason."""
    n = max([len("name")] + [len(r.name) for r in rows])
    lines = [f"{'name':<{n}}  gate  result  time(s)  what / reason", "-" * min(width + n, 160)]
    for r in rows:
        lines.append(f"{r.name:<{n}}  {r.gate:<4}  {r.result:<6}  {r.seconds:7.1f}  {r.what}")
        lines.append(f"{'':<{n}}  {'':<4}  {'':<6}  {'':>7}    -> {r.reason}")
    return "\n".join(lines)


def verdict(rows: List[Row]) -> Tuple[bool, List[str]]:
    """Whether every ``must`` row passed, and the names of those that did not."""
    bad = [r.name for r in rows if r.gate == MUST and r.result != PASS]
    return not bad, bad


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description="pytest-ptdbg on a real device: one command, one table "
                                "(see the module docstring)")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "npu", "cpu"],
                   help="device under test (default auto: NPU through torch_npu, else torch.accelerator's "
                        "CUDA device). cpu: the CPU stands in for the device: for testing this script")
    p.add_argument("--out", default="device_check.json", help="the JSON results (default %(default)s)")
    p.add_argument("--fast", action="store_true", help="the smallest subset (mlp only, AdamW foreach only)")
    p.add_argument("--keep", default="", help="keep the dumps and reports in this folder (default: a "
                   "temporary folder, deleted)")
    p.add_argument("--budget-s", type=float, default=540.0,
                   help="start no row after this many seconds (default %(default)s)")
    p.add_argument("--reps", type=int, default=0, help="timing reps of dump_cost (default 7, --fast 3)")
    args = p.parse_args(argv)

    found = detect(args.device)
    if found.device is None:
        print(found.message, flush=True)
        return 0 if args.device == "auto" and found.message.startswith(SKIP_LINE) else 2
    torch.set_num_threads(1)
    device = torch.device(found.device, 0) if found.device != "cpu" else torch.device("cpu")
    print(f"[device_check] {found.message}", flush=True)
    before = flag_state(device.type)
    env = environment(device)
    for k, v in env.items():
        print(f"[device_check] env {k} = {v}", flush=True)
    work = os.path.abspath(args.keep) if args.keep else tempfile.mkdtemp(prefix="ptdbg_device_check_")
    os.makedirs(work, exist_ok=True)
    reps = args.reps or (3 if args.fast else 7)
    ctx = Context(device=device, bench=torch.device("cpu"), work=work, fast=args.fast, reps=reps,
                  keep=bool(args.keep))
    t0 = time.perf_counter()
    try:
        rows = run_rows(ctx, plan(args.fast), args.budget_s)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if not args.keep:   # the reports went with the temporary folder: name none
        for r in rows:
            if "html" in r.details:
                r.details["html"] = None
    after = flag_state(device.type)
    ok, bad = verdict(rows)
    print()
    print(table_text(rows))
    restored = before == after
    if not restored:
        print(f"[device_check] WARNING: flags not restored: before {before}, after {after}")
    status = "PASSED" if ok else f"FAILED ({', '.join(bad)})"
    print(f"\n[device_check] {status}: {sum(r.result == PASS for r in rows)} of {len(rows)} rows PASS; "
          f"{time.perf_counter() - t0:.0f} s on {device}{' (CPU standing in)' if found.stand_in else ''}")
    report = {"device": str(device), "stand_in": found.stand_in, "detection": found.looked_for,
              "fast": args.fast, "environment": env, "flags_restored": restored, "passed": ok,
              "not_passed": bad, "seconds": time.perf_counter() - t0,
              "kept": work if args.keep else None,
              "rows": [dataclasses.asdict(r) for r in rows]}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1, default=str)
    print(f"[device_check] results: {os.path.abspath(args.out)}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
