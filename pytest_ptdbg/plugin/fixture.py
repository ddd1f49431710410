"""The ``ptdbg_dump`` fixture object and the result it returns.

Imported lazily by the plugin (this module imports torch through ``plugin_run``).
"""
from __future__ import annotations

import os
import shutil
from typing import Any, Callable, Dict, List, Optional

import pytest

from pytest_ptdbg.plugin import golden
from pytest_ptdbg.plugin import options as plugin_options
from pytest_ptdbg.runtime.device import DeviceUnavailable, resolve_device
from pytest_ptdbg.plugin.options import Settings
from pytest_ptdbg.plugin.run import SideRun, compare_sides, locate_dump, preserved_rng, run_model, \
    run_side, to_device


class PrecisionResult:
    """What ``ptdbg_dump(...)`` returns: the comparison of one step, device under test vs bench.

    ``table`` (pandas, one row per tensor pair), ``advice`` / ``suspects`` / ``first_suspect``,
    ``csv_path`` / ``advisor_path`` / ``html_path``, ``passed`` (the verdict under this test's
    rule, thresholds and ignore lists) and ``assert_precision(**thresholds)``.
    """

    def __init__(self, compare_result: Any, settings: Settings, *, nodeid: str, call: int,
                 npu: SideRun, bench: SideRun, out_dir: str, bench_label: str,
                 device: str, golden_path: Optional[str] = None) -> None:
        from pytest_ptdbg.plugin.assertions import evaluate

        self.compare_result = compare_result
        self.settings = settings
        self.nodeid = nodeid
        self.call = call
        self.npu = npu
        self.bench = bench
        self.out_dir = out_dir
        self.bench_label = bench_label
        self.device = device
        self.golden_path = golden_path
        self.evaluation = evaluate(self)

    # the comparison
    @property
    def table(self) -> Any:
        return self.compare_result.table

    @property
    def advice(self) -> Any:
        return self.evaluation.advice

    @property
    def suspects(self) -> List[Any]:
        return list(self.evaluation.advice.suspects)

    @property
    def first_suspect(self) -> Any:
        return self.evaluation.first_suspect

    @property
    def passed(self) -> bool:
        return self.evaluation.passed

    @property
    def csv_path(self) -> Optional[str]:
        return getattr(self.compare_result, "csv_path", None)

    @property
    def advisor_path(self) -> Optional[str]:
        return getattr(self.compare_result, "advisor_path", None)

    @property
    def html_path(self) -> Optional[str]:
        return getattr(self.compare_result, "html_path", None)

    @property
    def outputs(self) -> tuple:
        """What the step returned on the device under test and on the bench (None for goldens)."""
        return self.npu.output, self.bench.output

    def recompare(self, settings: Settings) -> Any:
        """The comparison again with other rule/thresholds (into a new folder beside the first)."""
        n = len([d for d in os.listdir(self.out_dir) if d.startswith("compare")])
        return compare_sides(self.npu, self.bench, os.path.join(self.out_dir, f"compare{n}"),
                             settings)

    def assert_precision(self, **thresholds: Any) -> "PrecisionResult":
        """Fail the test with the advisor's text unless every compared API is within tolerance.

        Keyword arguments override this test's settings: threshold names (``cosine=0.98``,
        ``rtol=...``), ``rule``, ``ignore=[...]``, ``only=[...]``, ``ignore_optimizer=True``.
        """
        __tracebackhide__ = True
        from pytest_ptdbg.plugin.assertions import assert_precision

        assert_precision(self, **thresholds)
        return self

    def __repr__(self) -> str:
        first = self.first_suspect
        return (f"<PrecisionResult {self.nodeid} {'passed' if self.passed else 'failed'}"
                f"{'' if first is None else ' first suspect ' + first.api}>")


class PtdbgDump:
    """The fixture: ``ptdbg_dump(model, inputs, step=None, **settings) -> PrecisionResult``."""

    def __init__(self, request: Any, state: Any, mark_name: str) -> None:
        self._request = request
        self._state = state
        self._mark_name = mark_name
        self._node = request.node
        self._calls = 0
        self.results: List[PrecisionResult] = []
        self._entries: List[Dict[str, Any]] = []
        self._dirs: List[tuple] = []  # (dir, settings, entry)
        self._node._ptdbg_entries = self._entries

    # ------------------------------------------------------------------ settings and devices
    def settings(self, **overrides: Any) -> Settings:
        """This test's settings: ``overrides`` > marker > command line / ini > defaults."""
        __tracebackhide__ = True
        try:
            marker = plugin_options.marker_overrides(self._node)
            s = plugin_options.per_test(self._state.settings, marker,
                                        f"@pytest.mark.ptdbg on {self._node.nodeid}")
            return plugin_options.per_test(s, overrides, "ptdbg_dump(...)")
        except ValueError as exc:
            pytest.fail(str(exc), pytrace=False)

    def _device(self, name: str, role: str) -> Any:
        __tracebackhide__ = True
        try:
            return resolve_device(name)
        except DeviceUnavailable as exc:
            self._entries.append({"nodeid": self._node.nodeid, "call": self._calls,
                                  "verdict": "skipped", "reason": f"{role}: {exc}"})
            pytest.skip(f"ptdbg {role} {exc}")

    @property
    def device(self) -> Any:
        """The resolved device under test (skips the test when it is not available)."""
        __tracebackhide__ = True
        return self._device(self.settings().device, "device under test")

    def _test_dir(self, call: int) -> str:
        path = os.path.join(self._state.test_root(), golden.node_relpath(self._node.nodeid, call))
        if os.path.exists(path):
            shutil.rmtree(path)
        os.makedirs(path)
        with open(os.path.join(path, self._mark_name), "w", encoding="utf-8") as f:
            f.write(self._node.nodeid + "\n")
        return path

    # ------------------------------------------------------------------ the two entry points
    def __call__(self, model: Any, inputs: Any = (), step: Optional[Callable[[Any, Any], Any]] = None,
                 **overrides: Any) -> PrecisionResult:
        """Run ``step(model, inputs)`` (default: forward, and backward of a scalar loss) on a copy
        of the model on the device under test and on the bench, under the dump hooks, with the
        same seeds, and compare. With ``--ptdbg-golden`` the bench is the recorded golden."""
        __tracebackhide__ = True
        settings = self.settings(**overrides)
        device = self._device(settings.device, "device under test")
        call = self._calls
        self._calls += 1
        nodeid = self._node.nodeid
        golden_root = settings.golden
        gpath = golden.golden_dir(golden_root, nodeid, call) if golden_root else None
        if gpath and not settings.update_golden and not golden.has_golden(gpath):
            self._entries.append({"nodeid": nodeid, "call": call, "verdict": "missing-golden",
                                  "reason": f"no golden at {gpath}", "golden": gpath})
            pytest.fail(golden.missing_message(nodeid, golden_root, gpath), pytrace=False)
        bench_device = None
        if not gpath or settings.update_golden:
            bench_device = self._device(settings.bench, "bench")
        out = self._test_dir(call)
        golden_full = settings.golden_full
        if gpath and not settings.update_golden:
            golden_full = bool(golden.read_meta(gpath).get("full", False))
        with preserved_rng([device] + ([bench_device] if bench_device is not None else [])):
            npu_summary = settings.summary_only or bool(gpath and not golden_full)
            npu = run_model(model, inputs, step, device=device, dtype=settings.dtype,
                            dump_path=os.path.join(out, "npu"), settings=settings,
                            summary_only=npu_summary)
            if gpath and settings.update_golden:
                staging = f"{gpath}.tmp-{os.getpid()}"
                try:
                    run_model(model, inputs, step, device=bench_device, dtype="float32",
                              dump_path=staging, settings=settings,
                              summary_only=not settings.golden_full)
                    golden.strip_stacks(staging)
                    golden.commit(staging, gpath, {
                        "nodeid": nodeid, "call": call, "bench": str(bench_device),
                        "full": settings.golden_full, "seed": settings.seed,
                        "mode": settings.mode})
                finally:
                    golden.remove_tree(staging)
            if gpath:
                meta = golden.read_meta(gpath)
                bench = locate_dump(gpath, summary_only=not meta.get("full", False),
                                    mode=meta.get("mode", "api_stack"))
                bench_label = f"golden ({meta.get('bench', '?')})"
            else:
                bench = run_model(model, inputs, step, device=bench_device, dtype="float32",
                                  dump_path=os.path.join(out, "bench"), settings=settings,
                                  summary_only=settings.summary_only)
                bench_label = str(bench_device)
        return self._finish_call(npu, bench, out, settings, call, bench_label, str(device), gpath)

    def compare_runs(self, run: Callable[..., Any], reference: Callable[..., Any], *args: Any,
                     **overrides: Any) -> PrecisionResult:
        """Compare two implementations on the device under test: ``run(*args)`` (a fused kernel,
        a refactor, ``torch.compile``, a model with a planted fault) against ``reference(*args)``.

        Each side gets its own copy of ``args`` on the device under test (tensors copied, modules
        deep-copied, containers walked) and the same seed; ``run`` goes under autocast when a
        dtype is set, ``reference`` never. Goldens are not used here.
        """
        __tracebackhide__ = True
        settings = self.settings(**overrides)
        device = self._device(settings.device, "device under test")
        call = self._calls
        self._calls += 1
        out = self._test_dir(call)
        with preserved_rng([device]):
            npu = run_side(run, to_device(args, device), device=device, dtype=settings.dtype,
                           dump_path=os.path.join(out, "npu"), settings=settings,
                           summary_only=settings.summary_only)
            bench = run_side(reference, to_device(args, device), device=device, dtype="float32",
                             dump_path=os.path.join(out, "bench"), settings=settings,
                             summary_only=settings.summary_only)
        label = f"{getattr(reference, '__name__', 'reference')} on {device}"
        under_test = f"{getattr(run, '__name__', 'run')} on {device}"
        return self._finish_call(npu, bench, out, settings, call, label, under_test, None)

    # ------------------------------------------------------------------ bookkeeping
    def _finish_call(self, npu: SideRun, bench: SideRun, out: str, settings: Settings, call: int,
                     bench_label: str, device: str, gpath: Optional[str]) -> PrecisionResult:
        __tracebackhide__ = True
        cmp = compare_sides(npu, bench, os.path.join(out, "compare"), settings)
        result = PrecisionResult(cmp, settings, nodeid=self._node.nodeid, call=call, npu=npu,
                                 bench=bench, out_dir=out, bench_label=bench_label, device=device,
                                 golden_path=gpath)
        self.results.append(result)
        entry = summary_entry(result)
        self._entries.append(entry)
        self._dirs.append((out, settings, entry))
        suffix = f"_{call}" if call else ""
        props = self._node.user_properties
        props.append((f"ptdbg_verdict{suffix}", entry["verdict"]))
        first = entry.get("first_suspect")
        props.append((f"ptdbg_first_suspect{suffix}",
                      f"{first['api']} at {first['location']}" if first else ""))
        if entry.get("html"):
            props.append((f"ptdbg_report{suffix}", entry["html"]))
        return result

    def finish(self, reports: Dict[str, Any]) -> None:
        """Teardown: apply ``keep`` (failed/all/none) to the artifact folders, note the outcome."""
        test_failed = any(getattr(r, "failed", False) for r in reports.values())
        outcome = "failed" if test_failed else ("skipped" if any(
            getattr(r, "skipped", False) for r in reports.values()) else "passed")
        for entry in self._entries:
            entry["test_outcome"] = outcome
        for path, settings, entry in self._dirs:
            keep = settings.keep == "all" or (
                settings.keep == "failed" and (test_failed or entry["verdict"] != "passed"))
            entry["kept"] = keep
            if not keep:
                shutil.rmtree(path, ignore_errors=True)
                _remove_empty_parents(path, self._state.test_root())
                for key in ("csv", "advisor", "html", "dump_dir"):
                    entry[key] = None


def _remove_empty_parents(path: str, root: str) -> None:
    parent = os.path.dirname(path)
    root = os.path.abspath(root)
    while os.path.abspath(parent).startswith(root + os.sep):
        try:
            os.rmdir(parent)
        except OSError:
            return
        parent = os.path.dirname(parent)


def summary_entry(result: PrecisionResult) -> Dict[str, Any]:
    """The JSON-able line of the session summary for one comparison."""
    ev = result.evaluation
    first = ev.first_suspect
    s = result.settings
    return {
        "nodeid": result.nodeid,
        "call": result.call,
        "verdict": "passed" if ev.passed else "failed",
        "device": result.device,
        "bench": result.bench_label,
        "dtype": s.dtype,
        "rule": s.rule,
        "thresholds": dict(s.thresholds),
        "worst": ev.worst,
        "first_suspect": None if first is None else {
            "api": first.api, "kind": first.kind, "category": first.category,
            "location": first.location, "direction": first.direction},
        "suspects": [x.api for x in ev.advice.suspects if x.kind != "inherited"][:10],
        "n_failed_rows": ev.n_failed,
        "csv": result.csv_path,
        "advisor": result.advisor_path,
        "html": result.html_path,
        "dump_dir": result.out_dir,
        "golden": result.golden_path,
    }
