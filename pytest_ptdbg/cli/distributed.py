"""``ptdbg compare --distributed`` under a launcher (torchrun): every process compares the rank
folders of its node, process 0 writes one merged report.

A launcher is recognised by ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` in the
environment (torchrun sets them). Each process then

1. joins a ``torch.distributed`` group (gloo, CPU only; ``timeout`` on the init and on every
   collective) and takes the run's report stem from process 0 (one broadcast);
2. compares the ranks it is responsible for (:func:`assign`): by default the ``rank<N>`` folders
   it finds by listing DEVICE_STEP and BENCH_STEP on its own node, split round-robin among the
   node's processes (``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE``); with a rank-path template
   (:func:`template_paths`), ranks ``0..N-1`` split round-robin over all processes;
3. writes its small summary (:func:`rank_summary` per rank) to
   ``distributed_process<P>_<stem>.json`` in the output folder, then sends it to process 0 (one
   gather).

Process 0 merges what it gathered; for a process it did not hear from (the gather timed out or
failed: a process died) it reads that process's JSON file if the output folder is shared, else
names the process's ranks as lost. The expected ranks are ``0..N-1`` (``N``: ``--ranks``, else
the largest rank any process found + 1); a rank nobody compared is a named failure, never a
silent pass. A SIGTERM (the launcher stopping the job because a process died) ends the compare
of a process early: it writes what it has, its unfinished ranks named as interrupted.

Test hook: ``PTDBG_DIST_TEST_EXIT_PROCESS=P`` makes process ``P`` exit with status 1 (``os._exit``)
right after its first rank is compared, as a process killed mid-compare would (tests only).
"""
from __future__ import annotations

import datetime
import glob
import html
import json
import os
import re
import signal
import socket
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
TEST_EXIT_ENV = "PTDBG_DIST_TEST_EXIT_PROCESS"
#: root causes kept per rank in the summary
MAX_CAUSES = 3
#: a process file's rank count beyond this is not believed (the merge lists every rank below it)
MAX_RANKS = 1 << 20

PASSED, FAILED, ERROR, MISSING, LOST, INTERRUPTED = "passed", "failed", "error", "missing", "lost", "interrupted"


class Terminated(BaseException):
    """SIGTERM arrived (the launcher stops the job)."""


def launched(env: Optional[Mapping[str, str]] = None) -> bool:
    """True when a launcher (torchrun and the like) started this process."""
    e: Mapping[str, str] = os.environ if env is None else env
    return all(e.get(k) for k in LAUNCHER_ENV)


@dataclass
class Process:
    """This process in the launcher's job."""

    rank: int
    world: int
    local_rank: int
    local_world: int

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> "Process":
        e: Mapping[str, str] = os.environ if env is None else env
        rank, world = int(e["RANK"]), int(e["WORLD_SIZE"])
        return cls(rank, world, int(e.get("LOCAL_RANK", "0")), int(e.get("LOCAL_WORLD_SIZE", "1")))


# ------------------------------------------------------------------------------------ rank folders

def _rank_folders(step_dir: str) -> Dict[int, str]:
    from pytest_ptdbg.dump import reader

    if not os.path.isdir(step_dir):
        return {}
    try:
        return dict(reader.rank_dirs(step_dir))
    except ValueError as e:
        if "holds no rank<N> folder" in str(e):
            return {}
        raise


def template_paths(template: str, root: str, rank: int) -> List[str]:
    """The folders a rank-path template names for ``rank`` on the side rooted at ``root``.

    ``template`` holds ``{rank}`` and may hold ``{root}`` (DEVICE_STEP, or BENCH_STEP for the bench
    side) and shell wildcards, e.g. ``'{root}/node*/rank{rank}'`` or
    ``'/nodes/*/dump/step0/rank{rank}'`` (then the same for both sides: use ``{root}``).
    """
    pattern = template.replace("{root}", glob.escape(root)).replace("{rank}", str(rank))
    return sorted(p for p in glob.glob(pattern) if os.path.isdir(p))


def template_ranks(template: str, root: str) -> List[int]:
    """Every rank the template finds on one side."""
    pattern = template.replace("{root}", glob.escape(root)).replace("{rank}", "*")
    rx = re.escape(template.replace("{root}", "\0R\0")).replace(re.escape("\0R\0"), re.escape(root))
    rx = rx.replace(re.escape("{rank}"), r"(\d+)").replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
    found = set()
    for p in glob.glob(pattern):
        m = re.fullmatch(rx, p)
        if m and os.path.isdir(p):
            found.add(int(m.group(1)))
    return sorted(found)


@dataclass
class Assignment:
    """The ranks one process compares: ``{rank: (device folder or None, bench folder or None, note)}``."""

    ranks: Dict[int, Tuple[Optional[str], Optional[str], str]]
    #: how many ranks this process found the job to have (its highest rank found + 1): the merge
    #: lists every one of them, even those whose processes were lost before reporting
    n_ranks: int = 0


def assign(proc: Process, npu_step: str, bench_step: str, template: Optional[str] = None,
           n_ranks: Optional[int] = None) -> Assignment:
    """The ranks ``proc`` compares (see the module docstring)."""
    out: Dict[int, Tuple[Optional[str], Optional[str], str]] = {}
    if template is None:
        npu, bench = _rank_folders(npu_step), _rank_folders(bench_step)
        found = sorted(set(npu) | set(bench))
        for rank in found[proc.local_rank::max(1, proc.local_world)]:
            out[rank] = (npu.get(rank), bench.get(rank), "")
        return Assignment(out, found[-1] + 1 if found else 0)
    if n_ranks is None:
        found_all = set(template_ranks(template, npu_step)) | set(template_ranks(template, bench_step))
        n_ranks = max(found_all) + 1 if found_all else 0
    for rank in range(proc.rank, n_ranks, max(1, proc.world)):
        sides: List[Optional[str]] = []
        note = ""
        for root in (npu_step, bench_step):
            paths = template_paths(template, root, rank)
            if len(paths) > 1:
                note = f"rank{rank}: the template names several folders: {paths}"
            sides.append(paths[0] if len(paths) == 1 else None)
        out[rank] = (sides[0], sides[1], note)
    return Assignment(out, n_ranks)


# ------------------------------------------------------------------------------------- summaries

def rank_summary(rank: int, npu: Optional[str], bench: Optional[str], result: Any = None,
                 error: str = "", state: Optional[str] = None, seconds: float = 0.0) -> Dict[str, Any]:
    """A rank's small summary (JSON-ready): verdict, first root causes, first divergent call,
    counts and the paths of its reports; ``result`` a ``CompareResult`` or None."""
    s: Dict[str, Any] = {"rank": rank, "device": npu, "bench": bench, "state": state or ERROR,
                         "error": error, "root_causes": [], "first_call": None, "rows": 0,
                         "failing_rows": 0, "problems": [], "reports": {}, "seconds": round(seconds, 3)}
    if result is None:
        return s
    s["state"] = PASSED if result.passed else FAILED
    s["rows"] = int(len(result.table))
    try:
        from pytest_ptdbg.comparison import schema as S

        s["failing_rows"] = int((~result.table[S.PASSED].astype(bool)).sum())
    except Exception:  # noqa: BLE001 - a count, not the verdict
        s["failing_rows"] = -1
    judgement = getattr(result, "judgement", None)
    causes = list(getattr(judgement, "root_causes", []) or [])
    s["root_causes"] = [{"api": c.api, "detail": _safe(lambda c=c: c.detail), "order": int(c.order)}
                        for c in causes[:MAX_CAUSES]]
    first = result.first_suspect
    if causes:
        c = min(causes, key=lambda c: c.order)
        s["first_call"] = {"api": c.api, "order": int(c.order)}
    elif first is not None and not result.passed:
        s["first_call"] = {"api": first.api, "order": int(getattr(first, "order", 0))}
    s["problems"] = [str(p) for p in result.problems[:MAX_CAUSES]]
    s["reports"] = {k: v for k, v in (("csv", result.csv_path), ("html", result.html_path),
                                      ("advisor", result.advisor_path)) if v}
    return s


def _safe(fn: Any) -> str:
    try:
        return str(fn())
    except Exception as e:  # noqa: BLE001 - text for a report
        return f"({type(e).__name__})"


def compare_assigned(assignment: Assignment, output_path: str, run_stem: str, options: Any,
                     proc: Process, done: List[Dict[str, Any]]) -> None:
    """Compare each assigned rank into ``done`` (appended as they finish, so that an interrupted
    process still has the finished ones)."""
    import time

    from pytest_ptdbg.api import compare_inputs
    from pytest_ptdbg.comparison.options import DumpInput
    from pytest_ptdbg.report import outputs

    die = os.environ.get(TEST_EXIT_ENV)
    log = bool(getattr(options, "log", False))
    options = options.replace(log=False)   # one line per rank below, not every process's compare log
    for rank, (npu, bench, note) in sorted(assignment.ranks.items()):
        if npu is None or bench is None:
            if note:
                err = note
            elif npu is None and bench is None:
                err = f"rank{rank}: no rank folder on either side"
            else:
                have, lack = ("device", "bench") if bench is None else ("bench", "device")
                err = f"rank{rank} is only in the {have} dump ({npu or bench}); the {lack} side has no rank{rank}"
            done.append(rank_summary(rank, npu, bench, error=err, state=MISSING))
            continue
        t0 = time.perf_counter()
        tag = f"rank{rank}-rank{rank}"
        try:
            res = compare_inputs(DumpInput(npu), DumpInput(bench), output_path,
                                 options.replace(tag=tag, report_stem=f"{tag}_{run_stem}"))
            done.append(rank_summary(rank, npu, bench, res, seconds=time.perf_counter() - t0))
        except outputs.OutputError:
            raise
        except (OSError, ValueError) as e:
            done.append(rank_summary(rank, npu, bench, error=f"rank{rank} ({npu} vs {bench}): {e}",
                                     seconds=time.perf_counter() - t0))
        if log:
            print(f"process {proc.rank}: rank{rank}: {done[-1]['state']} ({done[-1]['seconds']:.1f} s)", flush=True)
        if die is not None and int(die) == proc.rank:
            os._exit(1)


def process_file(output_path: str, run_stem: str, process: int) -> str:
    return os.path.join(output_path, f"distributed_process{process}_{run_stem}.json")


def write_process_file(output_path: str, run_stem: str, summary: Dict[str, Any]) -> None:
    """Write a process's summary atomically (rename), so that process 0 never reads half of one."""
    path = process_file(output_path, run_stem, summary["process"])
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(summary, f)
    os.replace(tmp, path)


def read_process_file(output_path: str, run_stem: str, process: int) -> Optional[Dict[str, Any]]:
    try:
        with open(process_file(output_path, run_stem, process), encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


# ------------------------------------------------------------------------------------------ merge

def merge(processes: Dict[int, Optional[Dict[str, Any]]], world: int, n_ranks: Optional[int],
          heard_from: Sequence[int]) -> Dict[str, Any]:
    """The merged summary of every process's summary (None: nothing from that process)."""
    ranks: Dict[int, Dict[str, Any]] = {}
    lost_processes = []
    for p in range(world):
        s = processes.get(p)
        if s is None:
            lost_processes.append(p)
            continue
        for r in s.get("results", []):
            r = dict(r, process=p)
            prev = ranks.get(r["rank"])
            if prev is None or prev["state"] in (MISSING, INTERRUPTED, LOST):
                ranks[r["rank"]] = r
        for rank in s.get("ranks", []):
            if rank not in ranks:
                ranks[rank] = dict(rank_summary(rank, None, None, state=INTERRUPTED,
                                                error=f"process {p} stopped before comparing rank{rank}"
                                                      + (f" ({s['error']})" if s.get("error") else "")), process=p)
    # a missing rank already named by one process may be found by another (several nodes); the
    # ranks the processes found (the highest ones may belong to a process lost before reporting)
    found = [s["n_ranks"] for s in processes.values() if isinstance(s, dict) and type(s.get("n_ranks")) is int
             and 0 <= s["n_ranks"] <= MAX_RANKS]
    n = n_ranks if n_ranks is not None else max([max(ranks) + 1 if ranks else 0] + found)
    for rank in range(n):
        if rank not in ranks:
            if lost_processes:
                err = (f"rank{rank}: not reported by any process (lost with process(es) "
                       f"{', '.join(map(str, lost_processes))}, or its folder is on no node)")
                ranks[rank] = rank_summary(rank, None, None, error=err, state=LOST)
            else:
                ranks[rank] = rank_summary(rank, None, None, state=MISSING,
                                           error=f"rank{rank}: no rank folder on any node, on either side")
    ordered = [ranks[k] for k in sorted(ranks)]
    failing = [r["rank"] for r in ordered if r["state"] != PASSED]
    # a process that failed before or while it compared (its step folder unreadable...): the ranks
    # it would have compared are unknown, so the job cannot pass
    process_errors = {str(p): s["error"] for p, s in sorted(processes.items())
                      if isinstance(s, dict) and s.get("error")}
    first = None
    for r in ordered:
        if r["state"] == FAILED and r["first_call"] is not None:
            if first is None or r["first_call"]["order"] < first["first_call"]["order"]:
                first = r
    return {"world_size": world, "expected_ranks": n,
            "passed": not failing and not lost_processes and not process_errors and n > 0,
            "failing_ranks": failing, "lost_processes": lost_processes, "process_errors": process_errors,
            "gathered_from": sorted(heard_from),
            "first_divergent": ({"rank": first["rank"], "api": first["first_call"]["api"],
                                 "order": first["first_call"]["order"]} if first else None),
            "ranks": ordered}


def _peak_rss_mib() -> Optional[float]:
    """This process's peak resident memory in MiB (None where the platform does not say)."""
    try:
        import resource

        return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)
    except (ImportError, OSError, ValueError):
        return None


def merged_text(m: Dict[str, Any], npu_step: str, bench_step: str) -> str:
    lines = [f"compare --distributed (launcher, {m['world_size']} process(es)): {m['expected_ranks']} rank(s); "
             f"device {npu_step}, bench {bench_step}"]
    for r in m["ranks"]:
        s = r["state"]
        if s == PASSED:
            lines.append(f"  rank{r['rank']}: passed; {r['rows']} rows; {_report_names(r)}")
            continue
        if s == FAILED:
            first = r["first_call"]["api"] if r["first_call"] else "(none)"
            lines.append(f"  rank{r['rank']}: failed; first divergent call {first}; {r['failing_rows']} of "
                         f"{r['rows']} rows fail; {_report_names(r)}")
            for c in r["root_causes"]:
                lines.append(f"    root cause {c['api']}: {c['detail']}")
            for p in r["problems"]:
                lines.append(f"    problem: {p}")
        else:
            lines.append(f"  rank{r['rank']}: {s}: {r['error']}")
    if m["lost_processes"]:
        lines.append("Lost processes (no summary gathered, no file): "
                     + ", ".join(f"process {p}" for p in m["lost_processes"]))
    for p, err in m.get("process_errors", {}).items():
        lines.append(f"Process {p} failed: {err}")
    if m["failing_ranks"]:
        lines.append("Failing ranks: " + ", ".join(f"rank{r}" for r in m["failing_ranks"]))
    f = m["first_divergent"]
    if f:
        lines.append(f"First divergent (earliest in execution order): rank{f['rank']}: {f['api']}")
    lines.append("All ranks agree." if m["passed"] else
                 f"FAILED: {m['expected_ranks'] - len(m['failing_ranks'])} of {m['expected_ranks']} rank(s) pass"
                 + (f"; {len(m.get('process_errors', {}))} process(es) failed" if m.get("process_errors") else "")
                 + ".")
    return "\n".join(lines) + "\n"


def _report_names(r: Dict[str, Any]) -> str:
    return ", ".join(r["reports"].get(k, "") for k in ("csv", "html") if r["reports"].get(k)) or "(no report)"


def merged_html(m: Dict[str, Any], text: str, output_path: str) -> str:
    e = html.escape
    out = os.path.abspath(output_path)
    rows = []
    for r in m["ranks"]:
        links = []
        for k, p in sorted(r["reports"].items()):
            href = os.path.basename(p) if os.path.dirname(os.path.abspath(p)) == out else "file://" + os.path.abspath(p)
            links.append(f'<a href="{e(href, quote=True)}">{e(k)}</a>')
        why = r["first_call"]["api"] if r.get("first_call") else r["error"]
        causes = "<br>".join(e(f"{c['api']}: {c['detail']}") for c in r["root_causes"])
        rows.append(f"<tr class=\"{e(r['state'])}\"><td>rank{r['rank']}</td><td>{e(r['state'])}</td>"
                    f"<td>{e(str(why or ''))}</td><td>{causes}</td><td>{' '.join(links)}</td></tr>")
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>ptdbg compare --distributed</title>"
            "<style>td{border:1px solid #ccc;padding:2px 6px}tr.passed{background:#efe}"
            "tr.failed,tr.missing,tr.lost,tr.error,tr.interrupted{background:#fee}</style></head><body>"
            f"<h1>ptdbg compare --distributed: {'PASSED' if m['passed'] else 'FAILED'}</h1>"
            f"<pre>{e(text)}</pre><table><tr><th>rank</th><th>verdict</th><th>first divergent call / error</th>"
            f"<th>root causes</th><th>reports</th></tr>{''.join(rows)}</table></body></html>\n")


# ------------------------------------------------------------------------------------------- run

def run(npu_step: str, bench_step: str, output_path: str, options: Any, timeout_s: float = 300.0,
        template: Optional[str] = None, n_ranks: Optional[int] = None) -> Tuple[int, Optional[Dict[str, Any]]]:
    """This process's part of a launched distributed compare. Returns ``(status, merged)``:
    process 0 the merged summary and 0 (all pass) or 1; the others ``(0, None)`` once their
    summary is written and sent."""
    import torch.distributed as dist

    from pytest_ptdbg.report import outputs

    proc = Process.from_env()
    timeout = datetime.timedelta(seconds=timeout_s)
    old = signal.getsignal(signal.SIGTERM)

    def _term(signum: int, frame: Any) -> None:
        raise Terminated()

    signal.signal(signal.SIGTERM, _term)
    try:
        outputs.prepare_dir(output_path)
        dist.init_process_group("gloo", timeout=timeout, rank=proc.rank, world_size=proc.world)
        box: List[Any] = [outputs.new_stem("", outputs.timestamp()) if proc.rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        run_stem = str(box[0])
        summary: Dict[str, Any] = {"process": proc.rank, "host": socket.gethostname(), "ranks": [],
                                   "results": [], "error": ""}
        done: List[Dict[str, Any]] = summary["results"]
        try:
            assignment = assign(proc, npu_step, bench_step, template, n_ranks)
            summary["ranks"] = sorted(assignment.ranks)
            summary["n_ranks"] = assignment.n_ranks
            compare_assigned(assignment, output_path, run_stem, options, proc, done)
        except Terminated:
            summary["error"] = "terminated (SIGTERM) before all its ranks were compared"
        except (OSError, ValueError) as e:
            summary["error"] = " ".join(str(e).split())
        summary["peak_rss_mib"] = _peak_rss_mib()
        write_process_file(output_path, run_stem, summary)
        gathered: Optional[List[Any]] = [None] * proc.world if proc.rank == 0 else None
        try:
            dist.gather_object(summary, gathered, dst=0)
        except Terminated:
            gathered = None
        except Exception:  # noqa: BLE001 - a lost process: process 0 reads the files
            gathered = None
        if proc.rank != 0:
            return 0, None
        heard = {p: s for p, s in enumerate(gathered or []) if isinstance(s, dict)}
        heard[0] = summary
        processes: Dict[int, Optional[Dict[str, Any]]] = dict(heard)
        for p in range(proc.world):
            if p not in processes:
                processes[p] = read_process_file(output_path, run_stem, p)
        t0 = time.perf_counter()
        merged = merge(processes, proc.world, n_ranks, sorted(heard))
        text = merged_text(merged, npu_step, bench_step)
        merged["measured"] = {  # what the scale benchmark reads (benchmarks/bench_distributed.py)
            "gathered_bytes": sum(len(json.dumps(v)) for v in processes.values() if v is not None),
            "peak_rss_mib": {str(p): (v or {}).get("peak_rss_mib") for p, v in sorted(processes.items())},
            "merge_s": time.perf_counter() - t0}
        names = {"txt": ("distributed_summary", "txt"), "json": ("distributed_summary", "json"),
                 "html": ("distributed_summary", "html")}
        with outputs.ReportSet(output_path, names, "", run_stem) as files:
            merged["summary_paths"] = dict(files.paths)
            files.write("txt", text)
            files.write("json", json.dumps(merged, indent=1))
            files.write("html", merged_html(merged, text, output_path))
        merged["text"] = text
        return (0 if merged["passed"] else 1), merged
    finally:
        signal.signal(signal.SIGTERM, old)
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - leaving the group never changes the verdict
            pass
