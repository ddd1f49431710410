"""Session summary: collect one entry per ``ptdbg_dump`` call, print it, write it as JSON.

Entries travel from the test to the controller on the teardown report (attribute
``ptdbg_entries``, a list of JSON-able dicts), so the same code works with and without xdist.
No torch here.
"""
from __future__ import annotations

import datetime
import html
import json
import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from pytest_ptdbg.plugin.golden import SUMMARY_STATUSES
from pytest_ptdbg.runtime.text import fmt_number

if TYPE_CHECKING:
    import pytest

SUMMARY_NAME = "ptdbg_summary.json"
INDEX_NAME = "index.html"
REPORT_ATTR = "ptdbg_entries"


def entry_line(entry: Dict[str, Any]) -> str:
    """``FAIL  nodeid  worst: API cosine=.. rel_l2=..  first suspect: API (file:line)``."""
    verdict = entry.get("verdict", "?")
    label = {"passed": "PASS", "failed": "FAIL", "skipped": "SKIP",
             "missing-golden": "MISS", "error": "ERR "}.get(verdict, verdict.upper()[:4])
    name = entry.get("nodeid", "?")
    if entry.get("call", 0):
        name += f" (call {entry['call']})"
    if entry.get("golden") and verdict in ("passed", "failed"):
        name += "  vs golden"
    parts = [f"{label}  {name}"]
    if verdict == "skipped" or verdict == "missing-golden" or verdict == "error":
        parts.append(entry.get("reason", ""))
    outcome = entry.get("test_outcome")
    if outcome and verdict in ("passed", "failed") and outcome != verdict:
        parts.append("[expected by the test: it passed]" if verdict == "failed" and
                     outcome == "passed" else f"[test {outcome}]")
    if entry.get("golden_differences"):
        parts.append(f"{entry['golden_differences']} golden record(s) differ")
    for text in entry.get("nonfinite") or ():
        parts.append(text)
    for text in entry.get("notes") or ():
        parts.append(f"({text})")
    worst = entry.get("worst")
    if worst:
        parts.append(worst_text(worst))
    elif verdict in ("passed", "failed"):
        parts.append("worst: none (every compared tensor equal)")
    suspect = entry_suspect(entry)
    if suspect:
        loc = f" ({suspect['location']})" if suspect.get("location") else ""
        parts.append(f"first suspect: {suspect['api']}{loc}")
    elif verdict in ("passed", "failed"):
        parts.append("first suspect: none")
    return "  ".join(p for p in parts if p)


def entry_suspect(entry: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The first suspect of an entry, as the terminal, the JSON and ``index.html`` say it: the
    verdict's (``advise.advisor.decide`` names none for a passing comparison)."""
    return entry.get("first_suspect") if entry.get("verdict") != "passed" else None


def worst_text(worst: Dict[str, Any]) -> str:
    """``worst: TENSOR cosine=.. rel_l2=..`` (per-tensor metrics), or, for a comparison the
    judgement passed, ``closest to budget: API own error .. (x0.33 of its budget)``: what the
    verdict rested on."""
    if worst.get("ratio") is not None:
        own = worst.get("own_error")
        size = f"own error {fmt_number(own, digits=3)} " if own is not None else ""
        return (f"closest to budget: {worst.get('tensor') or worst.get('api')} "
                f"{size}(x{fmt_number(worst['ratio'], digits=2)} of its budget)")
    metrics = " ".join(f"{k}={fmt_number(worst[k], digits=4)}" for k in ("cosine", "max_abs_err", "rel_l2")
                       if worst.get(k) is not None)
    return f"worst: {worst.get('tensor') or worst.get('api')} {metrics}".rstrip()


class SessionSummary:
    """Collects entries from reports; writes the JSON and the terminal section."""

    def __init__(self, dump_root: str, golden_root: Optional[str],
                 run_dir: Optional[str] = None) -> None:
        self.dump_root = dump_root
        self.run_dir = run_dir or dump_root
        self.golden_root = golden_root
        self.entries: List[Dict[str, Any]] = []
        #: unused goldens (their test or call is gone), and those an update removed
        self.unused: List[Dict[str, Any]] = []
        self.removed: List[Dict[str, Any]] = []
        self.unused_fail = True
        self.json_path: Optional[str] = None
        self.index_path: Optional[str] = None

    def add_report(self, report: pytest.TestReport) -> None:
        for entry in getattr(report, REPORT_ATTR, None) or ():
            self.entries.append(dict(entry))

    def counts(self) -> Dict[str, int]:
        out: Dict[str, int] = {}
        for e in self.entries:
            out[e.get("verdict", "?")] = out.get(e.get("verdict", "?"), 0) + 1
        return out

    def golden_counts(self) -> Dict[str, int]:
        """created / updated / unchanged / differs / missing, and unused (or removed) goldens."""
        out = {str(k): 0 for k in SUMMARY_STATUSES}
        for e in self.entries:
            status = e.get("golden_status")
            if status:
                out[status] = out.get(status, 0) + 1
        out["unused"] = len(self.unused)
        out["removed"] = len(self.removed)
        return out

    def skipped(self) -> Dict[str, int]:
        """Why ptdbg tests were skipped: reason -> number of tests."""
        out: Dict[str, int] = {}
        for e in self.entries:
            if e.get("verdict") == "skipped":
                out[e.get("reason", "?")] = out.get(e.get("reason", "?"), 0) + 1
        return out

    def write_json(self) -> Optional[str]:
        if not self.entries and not self.unused and not self.removed:
            return None
        os.makedirs(self.dump_root, exist_ok=True)
        path = os.path.join(self.dump_root, SUMMARY_NAME)
        doc = {
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "dump_dir": self.dump_root,
            "run_dir": self.run_dir,
            "golden_dir": self.golden_root,
            "counts": self.counts(),
            "tests": sorted(self.entries, key=lambda e: (e.get("nodeid", ""), e.get("call", 0))),
            "goldens": self.golden_counts(),
            "unused_goldens": self.unused,
            "removed_goldens": self.removed,
        }
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2, default=str, allow_nan=True)
        os.replace(tmp, path)
        self.json_path = path
        self.index_path = self.write_index()
        return path

    def write_index(self) -> str:
        """``index.html`` beside the JSON: one row per comparison, linking its HTML report."""
        rows = []
        for e in sorted(self.entries, key=lambda e: (e.get("nodeid", ""), e.get("call", 0))):
            link = e.get("html")
            href = os.path.relpath(link, self.dump_root) if link else ""
            first = entry_suspect(e) or {}
            worst = e.get("worst") or {}
            cells = [
                html.escape(e.get("nodeid", "") + (f" (call {e['call']})" if e.get("call") else "")),
                html.escape(e.get("verdict", "")), html.escape(e.get("test_outcome", "")),
                html.escape(worst_text(worst).split(": ", 1)[-1] if worst else ""),
                html.escape(first.get("api", "")), html.escape(first.get("location", "")),
                f'<a href="{html.escape(href)}">report</a>' if href else
                ("" if e.get("kept", True) else "(not kept)"),
            ]
            cls = "bad" if e.get("verdict") not in ("passed", "skipped") else ""
            rows.append(f'<tr class="{cls}">' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
        unused = "".join(f"<li>{html.escape(s['nodeid'])}: {html.escape(s['path'])}</li>"
                        for s in self.unused)
        doc = (
            "<!doctype html><meta charset='utf-8'><title>ptdbg precision summary</title>"
            "<style>body{font-family:sans-serif}td,th{padding:2px 8px;border-bottom:1px solid #ddd;"
            "text-align:left;font-size:13px}tr.bad td{color:#a00}</style>"
            "<h1>ptdbg precision summary</h1>"
            f"<p>{html.escape(', '.join(f'{v} {k}' for k, v in sorted(self.counts().items())))}"
            "</p><table><tr><th>test</th><th>verdict</th><th>test outcome</th><th>worst tensor"
            "</th><th>first suspect</th><th>where</th><th>report</th></tr>" + "".join(rows) +
            "</table>" + (f"<h2>Unused goldens</h2><ul>{unused}</ul>" if unused else ""))
        path = os.path.join(self.dump_root, INDEX_NAME)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(doc)
        os.replace(path + ".tmp", path)
        return path

    def write_terminal(self, tr: pytest.TerminalReporter) -> None:
        if not self.entries and not self.unused and not self.removed:
            return
        tr.write_sep("=", "ptdbg precision summary")
        for entry in sorted(self.entries, key=lambda e: (e.get("nodeid", ""), e.get("call", 0))):
            markup = {"red": True} if entry.get("verdict") in ("failed", "missing-golden",
                                                                "error") else {}
            tr.write_line(entry_line(entry), **markup)
            if entry.get("verdict") != "passed" and entry.get("html"):
                tr.write_line(f"      report: {entry['html']}")
        if self.unused:
            verb = "fail the run" if self.unused_fail else "warning only (--ptdbg-unused=warn)"
            tr.write_line(f"unused goldens (their test or call is gone; --ptdbg-update removes "
                          f"them; {verb}): {len(self.unused)}", red=self.unused_fail,
                          yellow=not self.unused_fail)
            for item in self.unused:
                tr.write_line(f"  {item['nodeid']}  {item['path']}  ({item.get('why', '')})",
                              yellow=True)
        for item in self.removed:
            tr.write_line(f"removed unused golden: {item['path']}")
        counts = ", ".join(f"{v} {k}" for k, v in sorted(self.counts().items()))
        expected = sum(1 for e in self.entries
                       if e.get("verdict") == "failed" and e.get("test_outcome") == "passed")
        if expected:
            counts += f" ({expected} of the failed expected by their test, which passed)"
        if self.entries:
            tr.write_line(f"ptdbg: {len(self.entries)} comparison(s): {counts}; artifacts in "
                          f"{self.run_dir}")
        else:
            tr.write_line("ptdbg: no comparisons")
        g = self.golden_counts()
        if any(g.values()):
            tr.write_line("ptdbg goldens: " + ", ".join(
                f"{g[k]} {k}" for k in (*map(str, SUMMARY_STATUSES), "unused", "removed")))
        skipped = self.skipped()
        if skipped:
            n = sum(skipped.values())
            tr.write_line(f"ptdbg: {n} test(s) skipped: " + "; ".join(
                f"{why} ({k})" for why, k in sorted(skipped.items())), yellow=True)
        if self.json_path:
            tr.write_line(f"ptdbg: session summary {self.json_path}")
        if self.index_path:
            tr.write_line(f"ptdbg: reports index {self.index_path}")
