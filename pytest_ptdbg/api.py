"""``compare`` and ``compare_distributed``: two dumps in, CSV + advisor + HTML report out. No torch.

ptdbg's interface::

    compare({"npu_pkl_path": ..., "bench_pkl_path": ..., "npu_dump_data_dir": ...,
             "bench_dump_data_dir": ..., "is_print_compare_log": True}, "./output", stack_mode=True)

Paths may also be dump folders (dump_path, step or rank folder, msprobe ``dump.json`` folder); the
record file and data folder are then found inside. Without data folders (keys absent while the
paths name ``.pkl`` files, or empty) the compare uses statistics only ("summary compare").
"""
from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import pandas as pd

from pytest_ptdbg.comparison import schema as S
from pytest_ptdbg.comparison import verdict as V
from pytest_ptdbg.comparison.pairing import Pairing
from pytest_ptdbg.comparison.options import CompareOptions, DumpInput, inputs_from_param, param_from_inputs
from pytest_ptdbg.comparison.rule import Rule
from pytest_ptdbg.comparison.schema import CompareTable
from pytest_ptdbg.comparison.table import build_table
from pytest_ptdbg.dump import reader
from pytest_ptdbg.format import records
from pytest_ptdbg.format.environment import differences as environment_differences
from pytest_ptdbg.runtime import pool
from pytest_ptdbg.runtime.gc_pause import paused_gc
from pytest_ptdbg.runtime.progress import Progress
from pytest_ptdbg.runtime.text import TextEnum
from pytest_ptdbg.judge.passing import passes
from pytest_ptdbg.judge.step import StepJudgement, judge_step, unusable_text
from pytest_ptdbg.report import outputs

if TYPE_CHECKING:  # pragma: no cover
    from pytest_ptdbg.advise.advisor import Advice
    from pytest_ptdbg.comparison.ranks import RankConsistencyResult


@dataclass
class CompareResult:
    """What :func:`compare` produced.

    ``passed`` (default judgement, ``Rule.JUDGE``): ``judgement.passed``: nothing unusable
    (``problems`` empty, no ``_unusable`` row left unclassified) and no root cause (an API over
    its own-error budget, a NaN/Inf of its own, a changed argument, a value-changing call on one
    side only; see ``judge/step.py``). With an explicit ``rule`` ("ptdbg", "dtype"): no row fails
    that rule (``_passed`` all True, which unusable rows never are) and ``problems`` is empty.
    Every entry of ``problems`` is data that could not be used (an unreadable line or file, an
    empty side, a dump cut short, a replay judgement that could not start) and counts against the
    verdict; ``notes`` says what fails nothing (completeness unknown for ptdbg/msprobe dumps, a
    summary compare chosen because a side has no tensors, a replay skipped without torch).
    """

    table: pd.DataFrame
    advice: Optional["Advice"]
    csv_path: str
    advisor_path: Optional[str]
    html_path: Optional[str]
    passed: bool
    problems: List[str] = field(default_factory=list)
    summary_compare: bool = False
    #: the ``input_param`` it was made from (lets ``assert_precision`` compare again with other rules)
    input_param: Dict[str, Any] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)
    #: the default judgement (root causes, unusable data, the replay of every call); also
    #: computed when an explicit ``rule`` decides ``passed``
    judgement: Optional[StepJudgement] = None
    #: the rule that decided ``passed``: ``Rule.JUDGE`` (default), ``Rule.PTDBG`` or ``Rule.DTYPE``
    gate: Rule = Rule.JUDGE
    #: the options it was compared with
    options: Optional[CompareOptions] = None

    @property
    def first_suspect(self):
        return self.advice.first if self.advice is not None and self.advice.suspects else None


@dataclass
class DistributedResult:
    """What :func:`compare_distributed` produced: one :class:`CompareResult` per rank compared.

    Keys are ``(N, N)`` (NPU rank N with bench rank N). ``errors``: ranks not compared (on one side
    only, no ``.pkl``, unreadable), each with a message naming the rank and folder. ``passed``:
    every rank of both sides compared and passed.
    """

    results: Dict[Tuple[int, int], CompareResult]
    diverging: List[Tuple[int, int]]
    first_suspect_rank: Optional[Tuple[int, int]]
    summary: str
    summary_path: str
    errors: Dict[Tuple[int, int], str] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.diverging and not self.errors


def _timestamp() -> str:
    return outputs.timestamp()


def judge_passed(table: pd.DataFrame, problems: List[str]) -> bool:
    """The compare's verdict: every row passes and nothing was unusable (``problems`` empty)."""
    return passes(failing_rows=~CompareTable.of(table)[S.PASSED], problems=problems)


def load_dump(source: DumpInput, side: str) -> reader.Dump:
    """One side's dump (``side``: ``"npu"`` or ``"bench"``, for messages). A data folder that is
    not there is the dump's first problem, and it is read statistics only."""
    data_dir = source.data_dir
    missing = ""
    if data_dir and not os.path.isdir(data_dir):
        missing = f"{data_dir}: {side.upper()} data directory not found (statistics only)"
        data_dir = ""
    dump = reader.read_dump(source.path, data_dir)
    if missing:
        dump.problems.insert(0, missing)
    return dump


def compare(input_param: Dict[str, Any], output_path: str, stack_mode: bool = False,
            auto_analyze: bool = True, fuzzy_match: bool = False, rule: Union[Rule, str, None] = None,
            thresholds: Optional[V.Thresholds] = None, summary_compare: Optional[bool] = None,
            replay_check: bool = True, replay_device: str = "cpu") -> CompareResult:
    """Compare an NPU dump with a bench dump (ptdbg's ``compare``), write the reports, return them.

    Writes ``compare_result_{stem}.csv``, ``advisor_{stem}.txt`` (when ``auto_analyze``; the advice is
    computed and returned in any case, for the HTML report) and ``compare_result_{stem}.html`` into
    ``output_path``; ``stem`` is ``{timestamp}_{4 hex digits}``, new for each compare, and every file
    is created exclusively (never over an existing file or link; see ``report/outputs.py``). An
    output folder that cannot be created or written raises ``outputs.OutputError`` (an OSError)
    before the dumps are read.

    The verdict (``result.passed``): by default (``rule=Rule.JUDGE``, also written ``"judge"`` or
    None) the step fails iff its data are
    unusable or there is a root cause (``judge/step.py``): every call of the NPU dump that holds
    full tensors is replayed on ``replay_device`` from its own recorded inputs against a float64
    oracle and a reference in its compute dtype (``judge.judge_dump``; the bench dump may be
    statistics only), so an API over its own-error budget, a NaN/Inf of its own, a changed
    argument or a value-changing call on one side only fails it. Without full tensors on the NPU
    side (or ``replay_check=False``) root causes are judged from statistics (weaker; the advice
    prints the ``configure_hook`` call that re-dumps the suspects in full). ptdbg's rule always
    fills the CSV's ``Accuracy Reached or Not``; ``rule="ptdbg"`` or ``"dtype"`` makes that rule
    the gate instead (``comparison/verdict.py``). ``summary_compare``: force (True) or forbid (False)
    a statistics-only table; default: when a side has no saved tensors. Problems with the input
    are listed in ``problems`` and the CSV. The replay imports torch; the rest does not.

    This is ptdbg's signature: the arguments become a :class:`CompareOptions` and two
    :class:`DumpInput` (``comparison/options.py``) for :func:`compare_inputs`.
    """
    if not isinstance(input_param, Mapping):
        raise TypeError(f"compare: input_param is ptdbg's dict, not a {type(input_param).__name__}: "
                        "compare({'npu_pkl_path': NPU_PKL_OR_DIR, 'bench_pkl_path': BENCH_PKL_OR_DIR}, OUTPUT_DIR)")
    options = CompareOptions.build(rule=rule, stack_mode=stack_mode, auto_analyze=auto_analyze,
                                   fuzzy_match=fuzzy_match, thresholds=thresholds,
                                   summary_compare=summary_compare, replay_check=replay_check,
                                   replay_device=replay_device,
                                   log=bool(input_param.get("is_print_compare_log", True)))
    result = compare_inputs(*inputs_from_param(input_param), output_path, options)
    result.input_param = dict(input_param)
    return result


@paused_gc()   # a big compare holds ~1e6 small objects: no cyclic GC passes over them (runtime/gc_pause.py)
def compare_inputs(npu: DumpInput, bench: DumpInput, output_path: str, options: CompareOptions) -> CompareResult:
    """Read both dumps and compare them (:func:`compare_dumps`); the output folder is checked
    before they are read, and their records are let go before the reports are written."""
    outputs.prepare_dir(output_path)
    run = _compare_run(load_dump(npu, "npu"), load_dump(bench, "bench"), options)
    result = _finish(run, output_path, options)
    result.input_param = param_from_inputs(npu, bench, options.log)
    return result


@paused_gc()
def compare_dumps(npu: reader.Dump, bench: reader.Dump, output_path: str,
                  options: CompareOptions) -> CompareResult:
    """Compare two read dumps by ``options``, write the reports into ``output_path``, return them."""
    outputs.prepare_dir(output_path)
    return _finish(_compare_run(npu, bench, options), output_path, options)


@dataclass
class _Run:
    """What the compare stage hands to the reports: the table, its judgement, what was unusable
    (``problems``) and worth saying (``notes``)."""

    table: pd.DataFrame
    judged: StepJudgement
    problems: List[str]
    notes: List[str]
    summary: bool
    say: Callable[[str], None]
    #: the device's and the bench's recorded arithmetic environments (``format/environment.py``)
    environments: Tuple[Optional[Dict[str, Any]], Optional[Dict[str, Any]]] = (None, None)


def _sayer(log: bool) -> Callable[[str], None]:
    return (lambda msg: print(f"[ptdbg compare] {msg}", flush=True)) if log else (lambda msg: None)


def _compare_run(npu: reader.Dump, bench: reader.Dump, options: CompareOptions) -> _Run:
    """The table of two dumps and its judgement (the dumps are not kept)."""
    say = _sayer(options.log)
    problems: List[str] = []
    notes: List[str] = []
    for side, dump in (("npu", npu), ("bench", bench)):
        problems.extend(dump.problems)
        notes.extend(dump.notes)
        if not dump.apis:
            problems.append(f"{dump.source}: the {side.upper()} dump holds no usable record: nothing to compare")
    env_diff = environment_differences(npu.environment, bench.environment)
    if env_diff:
        notes.append("arithmetic environments differ (the judgement budgets each call in the mode its "
                     "device recorded): " + "; ".join(f"[{d}]" for d in env_diff[:12]))
    if npu.mode and bench.mode and npu.mode != bench.mode:
        notes.append(f"dumps of different modes: NPU {npu.mode!r} ({npu.source}) vs bench "
                        f"{bench.mode!r} ({bench.source}); calls recorded by one side only are unpaired")
    summary = options.summary_compare
    if summary is None:
        summary = not (npu.has_data and bench.has_data)
        if summary and (npu.has_data or bench.has_data):
            side = "bench" if npu.has_data else "device"
            notes.append(f"the {side} dump has no saved tensors: statistics (summary) compare")
    elif not summary and not (npu.has_data and bench.has_data):
        problems.append("full compare asked for but a dump has no saved tensors: those rows are Nan")
    if summary:  # a statistics compare reads no file: records naming missing files fail it here
        problems.extend(d.missing_data for d in (npu, bench) if d.missing_data and d.has_data)
    say(f"NPU {npu.source}: {len(npu.apis)} APIs, {npu.n_tensors} tensors")
    say(f"bench {bench.source}: {len(bench.apis)} APIs, {bench.n_tensors} tensors")
    say("summary compare (statistics only)" if summary else "full compare (saved tensors)")
    t0 = time.perf_counter()
    table = build_table(npu, bench, summary=summary, stack_mode=options.stack_mode,
                        fuzzy_match=options.fuzzy_match, rule=options.row_rule,
                        thresholds=options.thresholds, problems=problems,
                        progress=say if options.log else None, workers=options.workers)
    say(f"{len(table)} rows in {time.perf_counter() - t0:.2f} s")
    pairing = table.attrs.get("pairing")
    if isinstance(pairing, Pairing):
        if pairing.different_programs:
            say(pairing.programs_text)
        elif pairing.reordered_text:
            notes.append(pairing.reordered_text)   # said as what it is: fails nothing
    judged = _judge(npu, bench, table, problems, notes, options, say)
    return _Run(table, judged, problems, notes, summary, say, (npu.environment, bench.environment))


def _has_call_specs(dump: reader.Dump) -> bool:
    """Whether some record of ``dump`` carries a call spec (``extra["call"]``): replay needs one."""
    return any(isinstance(t.extra, dict) and isinstance(t.extra.get("call"), dict)
               for a in dump.apis if a.direction == records.FORWARD for t in a.tensors[:1])


def _judge(npu: reader.Dump, bench: reader.Dump, table: pd.DataFrame, problems: List[str], notes: List[str],
           options: CompareOptions, say: Callable[[str], None]) -> StepJudgement:
    """The default judgement: the device dump's calls replayed (when its full tensors are read), the
    table's unusable rows, changed arguments and one-sided calls. A statistics compare asked for
    (``summary_compare=True``, ``--summary``) read no tensor."""
    replay_check, device = options.replay_check, options.replay_device
    summary_asked = options.summary_compare is True
    replay = None
    pairing = table.attrs.get("pairing")
    if isinstance(pairing, Pairing) and pairing.different_programs:
        replay_check = False   # nothing to judge call by call: the judgement says why
    if replay_check and npu.has_data and not _has_call_specs(npu):
        notes.append("replay check skipped: the device dump records no call arguments (a dump written "
                     "by ptdbg, msprobe or an older version): judged from statistics")
    elif replay_check and npu.has_data:
        try:
            from pytest_ptdbg.judge.own_error import judge_dump

            replay = judge_dump(npu, bench, device=device, pairs=CompareTable.of(table).api_pairs(), progress=say)
            # calls it could not judge (malformed, out of memory) are unusable data, said with the rest
            problems.extend(unusable_text(v) for v in replay.unusable)
        except ImportError as e:
            notes.append(f"replay check skipped: {e} (it needs torch); judged from statistics")
        except Exception as e:  # noqa: BLE001 - a failed replay must not lose the compare's reports
            # (each call is judged on its own: this is a failure before any call, never a pass)
            problems.append(f"replay check failed: {type(e).__name__}: {e}; no call was judged by replay")
    elif replay_check and summary_asked:
        notes.append("statistics (summary) compare asked for: the tensors were not read, so the calls "
                     "are judged from statistics, not by replay (localisation is weaker)")
    elif replay_check:
        notes.append("the device dump has no full tensors: judged from statistics (localisation is weaker)")
    return judge_step(table, problems, replay)


def _finish(run: _Run, output_path: str, options: CompareOptions) -> CompareResult:
    """Write the reports of a compare (CSV, advisor, HTML), say the verdict, return the result."""
    from pytest_ptdbg.advise.advisor import advise
    from pytest_ptdbg.advise.ranking import apply_judgement
    from pytest_ptdbg.report.csv_report import csv_chunks
    from pytest_ptdbg.report.html_report import render_html

    table, judged, problems, notes, say = run.table, run.judged, run.problems, run.notes, run.say
    gate, tag = options.rule, options.tag
    names = {"csv": ("compare_result", "csv"), "html": ("compare_result", "html")}
    if options.auto_analyze:
        names["advisor"] = ("advisor", "txt")
    outputs.prepare_dir(output_path)
    ts = _timestamp()
    with outputs.ReportSet(output_path, names, tag, options.report_stem or outputs.new_stem(tag, ts), ts) as files:
        csv_path = files.write("csv", csv_chunks(table, options.stack_mode))   # never the whole text at once
        advice = advise(table)
        apply_judgement(advice, judged, table)
        passed = judged.passed if gate is Rule.JUDGE else judge_passed(table, problems)
        advice.passed = passed   # the gate's verdict: every report says it (advise.advisor.decide)
        advisor_path = None
        if options.auto_analyze:
            advisor_path = files.write("advisor", advice.text() + _problems_text(problems, notes))
        html_path = files.write("html", render_html(table, advice, title=f"ptdbg compare {tag}".strip(),
                                                    environments=run.environments))
    n_no = CompareTable.of(table).count(S.ACCURACY, S.NO)
    say(f"{n_no} of {len(table)} rows fail ptdbg's rule; "
        f"{'PASSED' if passed else 'FAILED'} ({'default judgement' if gate is Rule.JUDGE else gate + ' rule'}); "
        f"CSV: {csv_path}")
    for p in problems[:20]:
        say(f"problem: {p}")
    if len(problems) > 20:
        say(f"... and {len(problems) - 20} more problems")
    for p in notes[:20]:
        say(f"note: {p}")
    if options.auto_analyze:
        for line in advice.text().splitlines()[:3]:
            say(line)
    return CompareResult(table, advice, csv_path, advisor_path, html_path, passed, problems, run.summary,
                         notes=notes, judgement=judged, gate=gate, options=options)


def _problems_text(problems: List[str], notes: List[str], limit: int = 20) -> str:
    """The advisor file's tail: the unusable data (which fails the compare) and the notes."""
    lines = []
    if problems:
        lines.append(f"Unusable data ({len(problems)}, the compare fails):")
        lines += [f"  {p}" for p in problems[:limit]]
    if notes:
        lines.append("Notes:")
        lines += [f"  {p}" for p in notes[:limit]]
    return "".join(line + "\n" for line in lines)


class RankState(TextEnum):
    """How one rank's compare ended."""

    OK = "ok"                       #: compared (``RankOutcome.result``)
    ERROR = "error"                 #: not compared (``RankOutcome.error`` says why; the others go on)
    OUTPUT_ERROR = "output_error"   #: the output folder failed: the whole run stops


@dataclass(frozen=True)
class RankJob:
    """One rank to compare: its two dumps, the output folder, the options (tag and stem set)."""

    rank: int
    npu_path: str
    bench_path: str
    output_path: str
    options: CompareOptions


@dataclass(frozen=True)
class RankOutcome:
    """:func:`_compare_rank`'s answer: ``state``, the result (OK) or the message, the seconds taken."""

    rank: int
    state: RankState
    result: Optional[CompareResult]
    error: str
    seconds: float


def _compare_rank(job: RankJob) -> RankOutcome:
    """One rank's compare (in a worker process or inline)."""
    t0 = time.perf_counter()
    try:
        res = compare_inputs(DumpInput(job.npu_path), DumpInput(job.bench_path), job.output_path, job.options)
        return RankOutcome(job.rank, RankState.OK, res, "", time.perf_counter() - t0)
    except outputs.OutputError as e:
        return RankOutcome(job.rank, RankState.OUTPUT_ERROR, None, str(e), time.perf_counter() - t0)
    except (OSError, ValueError) as e:  # one rank that cannot be compared: the others go on
        return RankOutcome(job.rank, RankState.ERROR, None,
                           f"rank{job.rank} ({job.npu_path} vs {job.bench_path}): {e}", time.perf_counter() - t0)


def _rank_results(todo: Sequence[RankJob], workers: int) -> Iterator[RankOutcome]:
    """Each rank's :func:`_compare_rank` as it finishes: in ``workers`` processes (their own logs
    silent: the caller prints one line per rank), or inline with one worker."""
    if workers > 1 and len(todo) > 1:
        todo = [dataclasses.replace(job, options=job.options.replace(log=False)) for job in todo]
    # worker processes of this package only; a rank they cannot compare is compared here
    for _, res in pool.map_unordered(_compare_rank, todo, workers):
        yield res


def compare_distributed(npu_step_dir: str, bench_step_dir: str, output_path: str,
                        **kwargs: Any) -> DistributedResult:
    """Compare two step folders rank by rank: NPU rank N with bench rank N (numeric order).

    Both folders must hold only ``rank<N>`` folders (else ValueError; a missing folder:
    FileNotFoundError). A rank on one side only, or one that cannot be compared (no ``.pkl``,
    unreadable), is an error of that rank in ``errors[(N, N)]``, naming the rank and folder; the
    other ranks are still compared, and the result does not pass. Writes
    ``compare_result_rank{N}-rank{N}_{stem}.csv`` (+ advisor, HTML) per rank and
    ``distributed_summary_{stem}.txt``, all with the run's ``{timestamp}_{hex}`` stem where free,
    each file created exclusively. ``kwargs`` go to :func:`compare` (``stack_mode``, ``rule``,
    ``is_print_compare_log``, ...). Ranks are compared in parallel by ``workers`` processes
    (this one and ``workers - 1`` of ``runtime/pool.py``; default: the CPU count, at most 8;
    ``workers=1``: one by one in this process); each
    finished rank prints one line with the log on, and a progress bar is drawn on a terminal.
    """
    npu_ranks = dict(reader.rank_dirs(npu_step_dir))
    bench_ranks = dict(reader.rank_dirs(bench_step_dir))
    outputs.prepare_dir(output_path)
    ts = _timestamp()
    run_stem = outputs.new_stem("", ts)
    log = bool(kwargs.pop("is_print_compare_log", True))
    workers = kwargs.pop("workers", None)
    options = CompareOptions.build(**kwargs, log=log)   # a bad argument is raised once, here
    results: Dict[Tuple[int, int], CompareResult] = {}
    errors: Dict[Tuple[int, int], str] = {}
    ranks = sorted(set(npu_ranks) | set(bench_ranks))
    todo: List[RankJob] = []
    for rank in ranks:
        pn, pb = npu_ranks.get(rank), bench_ranks.get(rank)
        if pn is None or pb is None:
            have, lack = ("device", "bench") if pb is None else ("bench", "device")
            lack_dir = bench_step_dir if pb is None else npu_step_dir
            errors[(rank, rank)] = (f"rank{rank} is only in the {have} dump ({pn or pb}); the {lack} step "
                                    f"folder {lack_dir} has no rank{rank}")
            continue
        tag = f"rank{rank}-rank{rank}"
        todo.append(RankJob(rank, pn, pb, output_path, options.replace(tag=tag, report_stem=f"{tag}_{run_stem}")))
    n_workers = min(len(todo), max(1, int(workers if workers is not None else pool.default_workers())))
    say = _sayer(log)
    with Progress(len(todo), "compare_distributed") as bar:
        for k, out in enumerate(_rank_results(todo, n_workers), 1):
            rank = out.rank
            if out.state is RankState.OUTPUT_ERROR:
                raise outputs.OutputError(out.error)
            if out.state is RankState.OK and out.result is not None:
                results[(rank, rank)] = out.result
                state = "agrees" if out.result.passed else "diverges"
            else:
                errors[(rank, rank)] = out.error
                state = "not compared"
            say(f"rank{rank}-rank{rank}: {state} ({out.seconds:.1f} s) [{k}/{len(todo)} ranks]")
            bar.update(k, f"rank{rank} {state}")
    results = dict(sorted(results.items()))
    diverging = [k for k, r in results.items() if not r.passed]
    first: Optional[Tuple[int, int]] = None
    first_order = None
    for key in (diverging or list(results)):
        s = results[key].first_suspect
        if s is None:
            continue
        order = getattr(s, "order", 0)
        if first_order is None or order < first_order:
            first, first_order = key, order
    lines = [f"compare_distributed: {len(ranks)} rank(s): NPU {sorted(npu_ranks)} ({npu_step_dir}), "
             f"bench {sorted(bench_ranks)} ({bench_step_dir})"]
    for (a, b), r in results.items():
        s = r.first_suspect
        state = "diverges" if not r.passed else "agrees"
        who = f"; first suspect {s.api} ({s.kind})" if s is not None else ""
        lines.append(f"  rank{a}-rank{b}: {state}{who}; {os.path.basename(r.csv_path)}")
        if not r.passed and r.problems:
            lines.append(f"    problem: {r.problems[0]}")
    for (a, b), e in sorted(errors.items()):
        lines.append(f"  rank{a}-rank{b}: not compared: {e}")
    if diverging:
        lines.append("Diverging ranks: " + ", ".join(f"rank{a}-rank{b}" for a, b in diverging))
    if errors:
        lines.append("Ranks not compared: " + ", ".join(f"rank{a}" for a, _ in sorted(errors)))
    if not diverging and not errors and results:
        lines.append("All ranks agree.")
    else:
        lines.append(f"FAILED: {len(results) - len(diverging)} of {len(ranks)} rank(s) compared and agree.")
    if first is not None:
        s = results[first].first_suspect
        lines.append(f"First suspect (earliest in execution order): rank{first[0]}-rank{first[1]}: {s.api}")
    text = "\n".join(lines) + "\n"
    with outputs.ReportSet(output_path, {"summary": ("distributed_summary", "txt")}, "", run_stem, ts) as files:
        spath = files.write("summary", text)
    if log:
        print(text, end="", flush=True)
    return DistributedResult(results, diverging, first, text, spath, errors)


def check_ranks(step_dir: str, output_path: Optional[str] = None, is_print_compare_log: bool = False,
                **opts: Any) -> "RankConsistencyResult":
    """Check one run's ranks against each other (no bench): see ``comparison/ranks.py``.

    ``step_dir``: a step folder of ``rank<N>`` folders. ``opts``: ``world_size``, ``collectives``,
    ``optimizer``, ``parameters`` (:func:`pytest_ptdbg.comparison.ranks.check_ranks`). With
    ``output_path``, writes ``rank_consistency_{stem}.txt`` (the summary) and ``.json`` (every
    divergence and problem) there; their paths are in ``text_path`` / ``json_path``.
    """
    import json

    from pytest_ptdbg.comparison import ranks

    res = ranks.check_ranks(step_dir, **opts)
    if output_path is not None:
        outputs.prepare_dir(output_path)
        ts = _timestamp()
        names = {"text": ("rank_consistency", "txt"), "json": ("rank_consistency", "json")}
        with outputs.ReportSet(output_path, names, "", outputs.new_stem("", ts), ts) as files:
            res.text_path = files.write("text", res.summary())
            res.json_path = files.write("json", json.dumps(res.to_dict(), indent=1, allow_nan=False) + "\n")
    if is_print_compare_log:
        print(res.summary(), end="", flush=True)
    return res
