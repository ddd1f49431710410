"""The ``ptdbg_dump`` fixture object and the result it returns.

Imported lazily by the plugin (this module imports torch through ``plugin/run.py``).
"""
from __future__ import annotations

import os
import shutil
from typing import Any, Callable, Dict, List, Optional

import pytest

from pytest_ptdbg.plugin import golden
from pytest_ptdbg.plugin import options as plugin_options
from pytest_ptdbg.runtime.device import DeviceUnavailable, resolve_device
from pytest_ptdbg.judge.passing import passes
from pytest_ptdbg.plugin.options import Settings
from pytest_ptdbg.plugin.run import SideRun, compare_sides, health_problems, preserved_rng, \
    run_model, run_side, to_device


class PrecisionResult:
    """What ``ptdbg_dump(...)`` returns: the comparison of one step, device under test vs bench
    (or vs the test's golden).

    ``table`` (pandas, one row per tensor pair), ``advice`` / ``suspects`` / ``first_suspect``,
    ``csv_path`` / ``advisor_path`` / ``html_path``, ``passed`` (the verdict under this test's
    rule, thresholds and ignore lists, the golden's checks and the NaN/Inf check),
    ``assert_precision(**thresholds)`` and ``expect_failure()``. A failing result that the test
    neither asserts nor expects to fail (nor reads ``passed`` of) fails the test.
    """

    def __init__(self, compare_result: Any, settings: Settings, *, nodeid: str, call: int,
                 npu: SideRun, bench: SideRun, out_dir: str, bench_label: str,
                 device: str, golden_path: Optional[str] = None, golden_check: Any = None,
                 health: Optional[List[str]] = None, notes: Optional[List[str]] = None) -> None:
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
        #: the golden's own checks (``golden_check.GoldenCheck``), None without a golden
        self.golden_check = golden_check
        #: NaN/Inf on the device side that the bench does not show
        self.health_problems: List[str] = list(health or [])
        #: what the test should know (e.g. why no backward ran); never a failure by itself
        self.notes: List[str] = list(notes or [])
        self.evaluation = evaluate(self)
        self.asserted = False

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

    def verdict(self) -> bool:
        """The verdict, without counting as the test looking at it."""
        return passes(problems=self.health_problems,
                      checks=(self.evaluation.passed, self.golden_check is None or self.golden_check.passed))

    @property
    def passed(self) -> bool:
        """The verdict; reading it counts as the test deciding on the result itself."""
        self.asserted = True
        return self.verdict()

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
        """Fail the test with the advisor's text unless every compared API is within tolerance
        (and, against a golden, every golden record agrees; no NaN/Inf the bench lacks).

        Keyword arguments override this test's settings: threshold names (``cosine=0.98``,
        ``rtol=...``), ``rule``, ``ignore=[...]``, ``only=[...]``, ``ignore_optimizer=True``.
        """
        __tracebackhide__ = True
        from pytest_ptdbg.plugin.assertions import assert_precision

        self.asserted = True
        assert_precision(self, **thresholds)
        return self

    def expect_failure(self) -> "PrecisionResult":
        """Declare that this comparison must fail (a planted fault): raises AssertionError when
        it passes; the test stays green when it fails."""
        __tracebackhide__ = True
        self.asserted = True
        if self.verdict():
            raise AssertionError(f"{self.nodeid}: the comparison was expected to fail but passed "
                                 f"({self.device} vs {self.bench_label})")
        return self

    def __repr__(self) -> str:
        first = self.first_suspect
        return (f"<PrecisionResult {self.nodeid} {'passed' if self.verdict() else 'failed'}"
                f"{'' if first is None else ' first suspect ' + first.api}>")


def _same_device(a: Any, b: Any) -> bool:
    return a.type == b.type and (a.index or 0) == (b.index or 0)


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
        self._node._ptdbg_fixture = self

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
            error = str(exc)
        pytest.fail(error, pytrace=False)  # outside the except: the error is printed once

    def _device(self, name: str, role: str) -> Any:
        """The device ``name`` resolves to. Missing: ``auto`` skips the test; a device named
        explicitly (and every bench) fails it: a CI job asking for an NPU it lacks is red."""
        __tracebackhide__ = True
        try:
            return resolve_device(name)
        except DeviceUnavailable as exc:
            error = str(exc)
        entry = {"nodeid": self._node.nodeid, "call": self._calls, "reason": f"{role}: {error}"}
        self._entries.append(entry)
        if name == "auto":
            entry["verdict"] = "skipped"
            pytest.skip(f"ptdbg {role} {error}")
        entry["verdict"] = "error"
        pytest.fail(f"ptdbg: the {role} {name!r} was asked for explicitly but is not "
                    f"available: {error}", pytrace=False)

    @property
    def device(self) -> Any:
        """The resolved device under test (skips the test when ``auto`` finds none)."""
        __tracebackhide__ = True
        return self._device(self.settings().device, "device under test")

    def _test_dir(self, call: int) -> str:
        __tracebackhide__ = True
        path = os.path.join(self._state.test_root(), golden.node_relpath(self._node.nodeid, call))
        if os.path.lexists(path):
            ours = not os.path.islink(path) and os.path.isdir(path) and \
                os.path.isfile(os.path.join(path, self._mark_name))
            if not ours:
                pytest.fail(f"ptdbg: {path} exists and was not written by pytest-ptdbg (no "
                            f"{self._mark_name} marker in it); it is left alone: choose another "
                            "--ptdbg-dump-dir or move it", pytrace=False)
            shutil.rmtree(path)
        os.makedirs(path)
        with open(os.path.join(path, self._mark_name), "w", encoding="utf-8") as f:
            f.write(self._node.nodeid + "\n")
        return path

    # ------------------------------------------------------------------ the two entry points
    def __call__(self, model: Any, inputs: Any = (), step: Optional[Callable[[Any, Any], Any]] = None,
                 loss_fn: Optional[Callable[[Any], Any]] = None,
                 **overrides: Any) -> PrecisionResult:
        """Run ``step(model, inputs)`` (default: forward, and backward of the loss) on a copy of
        the model on the device under test and on the bench, under the dump hooks, with the
        same seeds, and compare. When device and bench are the same device in the same dtype
        (a CPU-only machine), the fresh run is judged against the test's golden instead.

        The loss of the default step: the output tensor, a dict's / ``ModelOutput``'s
        ``loss``, a tuple's first element, or ``loss_fn(output)``."""
        __tracebackhide__ = True
        import torch

        settings = self.settings(**overrides)
        if not isinstance(model, torch.nn.Module):
            what = getattr(model, "__name__", None) or type(model).__name__
            pytest.fail(f"ptdbg_dump(model, ...): model must be a torch.nn.Module (got "
                        f"{type(model).__name__} {what!r}). To check a function, wrap it in an "
                        "nn.Module, or compare two callables with "
                        "ptdbg_dump.compare_runs(run, reference, *args).", pytrace=False)
        device = self._device(settings.device, "device under test")
        bench_device = self._device(settings.bench, "bench")
        call = self._calls
        self._calls += 1
        use_golden = (settings.golden != plugin_options.GOLDEN_OFF and settings.dtype == "float32"
                      and _same_device(device, bench_device))
        out = self._test_dir(call)
        with preserved_rng([device, bench_device]):
            npu = run_model(model, inputs, step, device=device, dtype=settings.dtype,
                            dump_path=os.path.join(out, "npu"), settings=settings,
                            summary_only=settings.summary_only, loss_fn=loss_fn)
            if use_golden:
                return self._against_golden(npu, out, settings, call, str(device))
            bench = run_model(model, inputs, step, device=bench_device, dtype="float32",
                              dump_path=os.path.join(out, "bench"), settings=settings,
                              summary_only=settings.summary_only, loss_fn=loss_fn)
        dtype = "" if settings.dtype == "float32" else f" {settings.dtype}"
        problems = health_problems(npu.health or {}, bench.health, f"device ({device}{dtype})",
                                   f"bench ({bench_device})")
        notes = [f"forward only: {npu.no_backward}"] if npu.no_backward else []
        return self._finish_call(npu, bench, out, settings, call, str(bench_device), str(device),
                                 None, health=problems, notes=notes)

    def _against_golden(self, npu: SideRun, out: str, settings: Settings, call: int,
                        device: str) -> PrecisionResult:
        """The fresh run against the test's golden: created when missing (and the test fails,
        unless updating), rewritten on update only when the judgement sees a change."""
        __tracebackhide__ = True
        from pytest_ptdbg.plugin import golden_check

        state = self._state
        nodeid = self._node.nodeid
        rootdir = str(self._request.config.rootpath)
        gpath = golden.golden_path(nodeid, call, rootdir, settings.golden)
        fresh = golden_check.golden_lines(npu.pkl_path, npu.keys or {})
        head = golden.header(nodeid, call, settings.mode, device.split(":")[0])
        text = golden.render(head, fresh.lines)
        problems = health_problems(npu.health or {}, None, f"device ({device})", "golden")
        notes = [f"forward only: {npu.no_backward}"] if npu.no_backward else []
        base = {"nodeid": nodeid, "call": call, "golden": gpath}
        update = settings.update_golden
        if not os.path.isfile(gpath):
            if problems:
                self._entries.append(dict(base, verdict="error", golden_status=golden.GoldenStatus.MISSING,
                                          reason="NaN/Inf: no golden written"))
                pytest.fail(f"no golden written for {nodeid}: " + "; ".join(problems),
                            pytrace=False)
            if not update and state.golden_ci:
                self._entries.append(dict(base, verdict="missing-golden", golden_status=golden.GoldenStatus.MISSING,
                                          reason=f"no golden at {gpath}"))
                pytest.fail(golden.missing_message(nodeid, gpath, ci=True), pytrace=False)
            golden.write(gpath, text)
            if not update:
                self._entries.append(dict(base, verdict="missing-golden", golden_status=golden.GoldenStatus.CREATED,
                                          reason=f"golden created: {gpath}"))
                pytest.fail(golden.missing_message(nodeid, gpath, ci=False), pytrace=False)
            status = golden.GoldenStatus.CREATED
        else:
            status = golden.GoldenStatus.UNCHANGED
        error = ""
        try:
            ref = golden.read(gpath)
        except golden.GoldenError as exc:
            error = str(exc)
        if not error and (ref.nodeid != nodeid or ref.header.get("call") != call):
            error = (f"{gpath}:1: this golden belongs to {ref.nodeid} (call "
                     f"{ref.header.get('call')}), not to {nodeid} (call {call})")
        if error and not update:
            self._entries.append(dict(base, verdict="error", golden_status=golden.GoldenStatus.UNREADABLE,
                                      reason=error))
            pytest.fail(f"golden of {nodeid} is unusable: {error}\n  rewrite it with: "
                        f"pytest --ptdbg-update '{nodeid}'", pytrace=False)
        if error:
            golden.write(gpath, text)
            ref, status = golden.read(gpath), golden.GoldenStatus.UPDATED
        result = self._judge_golden(npu, ref, fresh, out, settings, call, device, gpath,
                                    problems, notes)
        if update and status is golden.GoldenStatus.UNCHANGED and (ref.header != head or not result.verdict()):
            if problems:
                pytest.fail(f"golden of {nodeid} not updated: " + "; ".join(problems),
                            pytrace=False)
            golden.write(gpath, text)
            status = golden.GoldenStatus.UPDATED
            self._forget(result)
            result = self._judge_golden(npu, golden.read(gpath), fresh, out, settings, call,
                                        device, gpath, problems, notes)
        self._entries[-1]["golden_status"] = status if update or status is not golden.GoldenStatus.UNCHANGED else (
            golden.GoldenStatus.UNCHANGED if result.verdict() else golden.GoldenStatus.DIFFERS)
        return result

    def _judge_golden(self, npu: SideRun, ref: Any, fresh: Any, out: str, settings: Settings,
                      call: int, device: str, gpath: str, problems: List[str],
                      notes: List[str]) -> PrecisionResult:
        __tracebackhide__ = True
        from pytest_ptdbg.plugin import golden_check

        n = len([d for d in os.listdir(out) if d.startswith("golden_ref")])
        ref_dump = os.path.join(out, f"golden_ref{n or ''}")
        pkl = golden_check.write_reference_dump(ref, fresh, ref_dump, settings.mode)
        bench = SideRun(ref_dump, pkl, None)
        gcheck = golden_check.check(ref, fresh, ignore=settings.ignore, only=settings.only,
                                    ignore_optimizer=settings.ignore_optimizer)
        rel = os.path.relpath(gpath, str(self._request.config.rootpath))
        return self._finish_call(npu, bench, out, settings, call, f"golden {rel}", device, gpath,
                                 golden_check=gcheck, health=problems, notes=notes)

    def _forget(self, result: PrecisionResult) -> None:
        """Drop a result replaced by a second judgement (after a golden update)."""
        if result in self.results:
            i = self.results.index(result)
            del self.results[i]
        self._entries.pop()
        self._dirs.pop()
        props = self._node.user_properties
        suffix = f"_{result.call}" if result.call else ""
        props[:] = [p for p in props if p[0] not in (f"ptdbg_verdict{suffix}",
                                                     f"ptdbg_first_suspect{suffix}")]

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
                     bench_label: str, device: str, gpath: Optional[str], golden_check: Any = None,
                     health: Optional[List[str]] = None,
                     notes: Optional[List[str]] = None) -> PrecisionResult:
        __tracebackhide__ = True
        import warnings

        cmp = compare_sides(npu, bench, os.path.join(out, "compare"), settings)
        result = PrecisionResult(cmp, settings, nodeid=self._node.nodeid, call=call, npu=npu,
                                 bench=bench, out_dir=out, bench_label=bench_label, device=device,
                                 golden_path=gpath, golden_check=golden_check, health=health,
                                 notes=notes)
        for note in result.notes:
            warnings.warn(PtdbgWarning(f"{self._node.nodeid}: {note}"), stacklevel=2)
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
        return result

    def unasserted(self) -> List[PrecisionResult]:
        """Failing results the test neither asserted nor expected to fail."""
        return [r for r in self.results if not r.asserted and not r.verdict()]

    def finish(self, reports: Dict[str, Any]) -> None:
        """Teardown: apply ``keep`` (failed/all/none) to the artifact folders, note the outcome;
        the junit property ``ptdbg_report`` only for reports that are kept."""
        test_failed = any(getattr(r, "failed", False) for r in reports.values())
        outcome = "failed" if test_failed else ("skipped" if any(
            getattr(r, "skipped", False) for r in reports.values()) else "passed")
        if any(hasattr(r, "wasxfail") for r in reports.values()):
            outcome = "xfailed" if outcome == "skipped" else "xpassed"
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
            elif entry.get("html") and os.path.isfile(entry["html"]):
                suffix = f"_{entry['call']}" if entry.get("call") else ""
                self._node.user_properties.append((f"ptdbg_report{suffix}", entry["html"]))


class PtdbgWarning(UserWarning):
    """Something a precision test should know that fails nothing (e.g. no backward ran)."""


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
    gcheck = result.golden_check
    suspect = None if first is None else {
        "api": first.api, "kind": first.kind, "category": first.category,
        "location": first.location, "direction": first.direction}
    if gcheck is not None and gcheck.culprit is not None and (suspect is None or ev.passed):
        c = gcheck.culprit
        suspect = {"api": c.key, "kind": c.kind, "category": "golden", "location": gcheck.location,
                   "direction": ""}
    return {
        "nodeid": result.nodeid,
        "call": result.call,
        "verdict": "passed" if result.verdict() else "failed",
        "device": result.device,
        "bench": result.bench_label,
        "dtype": s.dtype,
        "rule": s.rule,
        "thresholds": dict(s.thresholds),
        "worst": ev.worst,
        "first_suspect": suspect,
        "suspects": [x.api for x in ev.advice.root_causes][:10],   # none when it passed
        "n_failed_rows": ev.n_failed,
        "golden_differences": None if gcheck is None else len(gcheck.differences),
        "nonfinite": list(result.health_problems),
        "notes": list(result.notes),
        "csv": result.csv_path,
        "advisor": result.advisor_path,
        "html": result.html_path,
        "dump_dir": result.out_dir,
        "golden": result.golden_path,
    }
