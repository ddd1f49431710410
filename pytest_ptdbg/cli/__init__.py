"""The ``ptdbg`` console command: ``compare``, ``parse`` and subcommands registered by other stages.

Subcommands live in :data:`SUBCOMMANDS` (name -> ``(module:function, kind, help)``) and are imported
only when invoked, so ``ptdbg compare`` never imports torch. ``kind`` is ``"add_parser"`` (the
function adds its own subparser and sets ``func``) or ``"main"`` (the function takes the remaining
argv and returns an exit status). A registered module that is missing is skipped.

Exit status (:data:`EXIT_STATUS`, printed by ``ptdbg --help``): 0 compared and agreed; 1 compared and
found a precision problem, or the dumps hold unusable data (``passed`` is False); 2 the command could
not run (bad arguments, a missing path or one that is not a dump, an unwritable output folder, an
internal error). Errors are printed as one line naming the file.
"""
from __future__ import annotations

import argparse
import importlib
import os
import stat
import sys
import traceback
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

#: the exit statuses of every ``ptdbg`` command
EXIT_OK, EXIT_FAILED, EXIT_ERROR = 0, 1, 2
EXIT_STATUS = """exit status (compare, compare --distributed, check-ranks, parse, replay):
  0  compared and agreed (parse: the records were found and read cleanly)
  1  compared and found a precision problem, or the dumps hold unusable data
     (incomplete dump, unreadable records or files, a rank missing on one side)
  2  the command could not run: bad arguments, a path that does not exist or is
     not a dump (e.g. /dev/null), an output folder that cannot be written"""

#: name -> (target "module:function", kind, one-line help)
SUBCOMMANDS: Dict[str, Tuple[str, str, str]] = {
    "compare": ("pytest_ptdbg.cli:add_compare_parser", "add_parser",
                "compare two dumps API by API and name the API that first loses precision"),
    "parse": ("pytest_ptdbg.cli:add_parse_parser", "add_parser",
              "print the stack and statistics of the records of one API"),
    "check-ranks": ("pytest_ptdbg.cli:add_check_ranks_parser", "add_parser",
                    "check that one run's ranks agree (collective outputs, updated parameters)"),
    "replay": ("pytest_ptdbg.cli.replay:add_parser", "add_parser",
               "run one saved API call again and compare with the saved result"),
    "demo": ("pytest_ptdbg.cli.demo:main", "main", "dump one training step of an example model"),
}


def register(name: str, target: str, kind: str = "add_parser", help: str = "") -> None:
    """Register a subcommand (``target`` is ``"module:function"``; see the module docstring)."""
    if kind not in ("add_parser", "main"):
        raise ValueError(f"register({name!r}): kind must be 'add_parser' or 'main', got {kind!r}")
    SUBCOMMANDS[name] = (target, kind, help)


def _resolve(target: str) -> Optional[Callable[..., Any]]:
    mod, _, fn = target.partition(":")
    try:
        m = importlib.import_module(mod)
    except ModuleNotFoundError as e:
        if e.name and (mod == e.name or mod.startswith(e.name + ".")):
            return None  # the stage is not installed/built: skip it
        raise
    return getattr(m, fn, None)


def add_compare_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("compare", help=SUBCOMMANDS["compare"][2], epilog=EXIT_STATUS,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Compare an NPU (device under test) dump with a bench dump. A dump "
                                   "directory (dump_path, step or rank folder), a .pkl or an msprobe "
                                   "dump.json is enough: the records and tensors are found inside.")
    p.add_argument("npu", help="NPU dump: folder, .pkl or dump.json")
    p.add_argument("bench", help="bench dump: folder, .pkl or dump.json")
    p.add_argument("-o", "--output", default="./output", help="output folder (default ./output)")
    p.add_argument("--summary", action="store_true", help="compare statistics only (no tensors read)")
    p.add_argument("--fuzzy", action="store_true", help="ignore call indices when pairing (fuzzy_match)")
    from pytest_ptdbg.comparison.rule import Rule

    p.add_argument("--rule", choices=[str(r) for r in Rule], default=str(Rule.JUDGE),
                   help="verdict: judge (default: every call replayed against a float64 oracle; "
                        "fails on a root cause or unusable data), or the per-tensor rules ptdbg "
                        "(ptdbg's cosine/abs error) and dtype (assert_close tolerances)")
    p.add_argument("--stack", action="store_true", help="add NPU_Stack_Info to the CSV (stack_mode)")
    p.add_argument("--distributed", action="store_true",
                   help="NPU and bench are step folders of rank<N> folders: compare rank by rank")
    p.add_argument("--ranks", type=int, default=None, metavar="N",
                   help="--distributed under a launcher: the job had ranks 0..N-1 (default: the largest "
                        "rank found + 1); a rank no process compares fails")
    p.add_argument("--rank-path-template", default=None, metavar="TEMPLATE",
                   help="--distributed under a launcher: where rank folders are, e.g. "
                        "'{root}/node*/rank{rank}' ({root}: NPU, or BENCH for the bench side; shell "
                        "wildcards allowed); ranks 0..N-1 are then split over all processes")
    p.add_argument("--dist-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="--distributed under a launcher: timeout of the process group's start and of "
                        "each collective (default 300)")
    p.add_argument("--no-replay", action="store_true",
                   help="do not replay the calls from the saved inputs: judge from statistics "
                        "(no torch needed)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the result line")
    p.set_defaults(func=run_compare)
    return p


def step_folder(path: str) -> str:
    """The step folder (holding ``rank<N>`` folders) of a dump_path, ``ptdbg_dump_v4.0`` or step folder.

    Raises ValueError naming the steps when there are several to choose from.
    """
    import re

    from pytest_ptdbg.format import records

    inner = os.path.join(path, records.DUMP_DIR_NAME)
    if os.path.isdir(inner):
        path = inner
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: no such directory" if not os.path.exists(path)
                                else f"{path}: not a directory (--distributed needs a step folder or dump_path)")
    steps = sorted(e for e in os.listdir(path)
                   if re.fullmatch(r"step\d+", e) and os.path.isdir(os.path.join(path, e)))
    if len(steps) > 1:
        raise ValueError(f"{path}: several steps ({', '.join(steps)}); pass the step folder to compare")
    return os.path.join(path, steps[0]) if steps else path


def check_input(path: str) -> str:
    """``path`` if it can hold a dump (a folder, or a ``.pkl`` / ``.json`` regular file), else an
    error naming it: FileNotFoundError when missing, ValueError otherwise.

    Refuses devices, pipes and sockets (``/dev/null``) before anything reads them.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file or directory") from None
    except OSError as exc:
        raise ValueError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise ValueError(f"{path}: not a dump (neither a file nor a folder)")
    if stat.S_ISREG(mode) and not path.endswith((".pkl", ".json")):
        raise ValueError(f"{path}: not a dump (expected a ptdbg .pkl, an msprobe dump.json or a dump folder)")
    return path


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def run_compare(args: argparse.Namespace) -> int:
    from pytest_ptdbg.api import compare_distributed, compare_inputs
    from pytest_ptdbg.comparison.options import CompareOptions, DumpInput

    try:
        options = CompareOptions(stack_mode=args.stack, fuzzy_match=args.fuzzy, rule=args.rule,
                                 replay_check=not args.no_replay, log=not args.quiet,
                                 summary_compare=True if args.summary else None)
        if args.distributed and _launched():
            return _run_launched(args, options)
        for path in (args.npu, args.bench):
            check_input(path)
        if args.distributed:
            kw = {"stack_mode": options.stack_mode, "fuzzy_match": options.fuzzy_match, "rule": options.rule,
                  "replay_check": options.replay_check, "summary_compare": options.summary_compare}
            res = compare_distributed(step_folder(args.npu), step_folder(args.bench), args.output,
                                      is_print_compare_log=options.log, **kw)
            if args.quiet:
                print(res.summary, end="")
            return EXIT_OK if res.passed else EXIT_FAILED
        if args.summary:
            sides = DumpInput(args.npu, ""), DumpInput(args.bench, "")
        else:  # a .pkl or dump.json given: its data folder beside it, as for a dump folder
            from pytest_ptdbg.dump.reader import locate

            # None: not found
            sides = DumpInput(args.npu, locate(args.npu).data_dir), DumpInput(args.bench, locate(args.bench).data_dir)
        r = compare_inputs(sides[0], sides[1], args.output, options)
    except BrokenPipeError:
        raise
    except (OSError, ValueError) as e:
        print(f"ptdbg compare: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_ERROR
    first = r.first_suspect
    state = "PASSED" if r.passed else "FAILED"
    who = f"; first suspect: {first.api}" if first is not None else ""
    why = f"; problem: {r.problems[0]}" if not r.passed and r.problems else ""
    if not r.passed and r.advice is not None and r.advice.programs:
        why = f"; {r.advice.programs}{why}"
    print(f"ptdbg compare: {state}: {len(r.table)} rows{who}{why}; {r.csv_path}")
    return EXIT_OK if r.passed else EXIT_FAILED


def add_check_ranks_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("check-ranks", help=SUBCOMMANDS["check-ranks"][2], epilog=EXIT_STATUS,
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Check one data-parallel run's ranks against each other (no bench): the "
                                   "outputs of all_reduce, broadcast and all_gather, the optimizer's tensors "
                                   "and the updated parameters must be identical on every rank. Names the "
                                   "first rank, call and tensor that differ from the others, and by how much.")
    p.add_argument("step_dir", help="step folder of rank<N> folders (or a dump_path holding one step)")
    p.add_argument("-o", "--output", default="./output", help="output folder (default ./output)")
    p.add_argument("--world-size", type=int, default=None,
                   help="ranks the step must hold (default: inferred from the folders and all_gather)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the result line")
    p.set_defaults(func=run_check_ranks)
    return p


def run_check_ranks(args: argparse.Namespace) -> int:
    from pytest_ptdbg.api import check_ranks

    try:
        if args.world_size is not None and args.world_size < 1:
            raise ValueError(f"--world-size {args.world_size}: must be at least 1")
        check_input(args.step_dir)
        res = check_ranks(step_folder(args.step_dir), args.output, world_size=args.world_size)
    except BrokenPipeError:
        raise
    except (OSError, ValueError) as e:
        print(f"ptdbg check-ranks: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_ERROR
    if args.quiet:
        first = res.first
        who = f"; first divergence: rank{first.rank} {first.api} {first.slot}" if first is not None else ""
        why = f"; problem: {res.problems[0]}" if res.problems else ""
        print(f"ptdbg check-ranks: {'PASSED' if res.passed else 'FAILED'}{who}{why}; {res.text_path}")
    else:
        print(res.summary(), end="")
        print(f"reports: {res.text_path} {res.json_path}")
    return EXIT_OK if res.passed else EXIT_FAILED


def _launched() -> bool:
    from pytest_ptdbg.cli.distributed import launched

    return launched()


def _run_launched(args: argparse.Namespace, options: Any) -> int:
    """``compare --distributed`` in one process of a launcher's job (``cli/distributed.py``)."""
    from pytest_ptdbg.cli import distributed

    template = args.rank_path_template
    if template is not None and "{rank}" not in template:
        raise ValueError(f"--rank-path-template {template!r}: must hold {{rank}}")
    npu, bench = args.npu, args.bench
    if template is None:   # this node's step folders; a node without one has no rank to compare
        npu, bench = (step_folder(p) if os.path.isdir(p) else p for p in (npu, bench))
    try:
        status, merged = distributed.run(npu, bench, args.output, options, timeout_s=args.dist_timeout,
                                         template=template, n_ranks=args.ranks)
    except RuntimeError as e:   # the process group could not start (torch.distributed's errors)
        print(f"ptdbg compare: error: --distributed: {_one_line(e)}", file=sys.stderr)
        return EXIT_ERROR
    if merged is not None:
        print(merged["text"], end="", flush=True)
    return status


def add_parse_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("parse", help=SUBCOMMANDS["parse"][2], epilog=EXIT_STATUS,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pkl", help=".pkl, dump.json or dump folder")
    p.add_argument("api", help="API key prefix, e.g. Torch_batch_norm_1_forward")
    p.set_defaults(func=run_parse)
    return p


def run_parse(args: argparse.Namespace) -> int:
    from pytest_ptdbg.parsing import parse

    problems: list = []
    try:
        check_input(args.pkl)
        found = parse(args.pkl, args.api, problems=problems)
    except BrokenPipeError:
        raise
    except (OSError, ValueError) as e:
        print(f"ptdbg parse: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_OK if found and not problems else EXIT_FAILED


def build_parser(only: Optional[str] = None) -> argparse.ArgumentParser:
    """The parser; with ``only``, import just that subcommand (others are listed, not imported)."""
    parser = argparse.ArgumentParser(prog="ptdbg", description="pytest-ptdbg: dump, compare, replay.",
                                     epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-V", "--version", action="store_true",
                        help="print the version of pytest-ptdbg and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (target, kind, help_) in SUBCOMMANDS.items():
        if only is not None and name == only and kind == "add_parser":
            fn = _resolve(target)
            if fn is not None:
                fn(sub)
                continue
        p = sub.add_parser(name, help=help_, add_help=False)
        p.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``ptdbg``; returns the exit status."""
    try:
        return _main(argv)
    except BrokenPipeError:  # output piped into ``head`` and the like: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def _main(argv: Optional[Sequence[str]]) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["--version"], ["-V"]):
        from pytest_ptdbg import __version__

        print(f"ptdbg (pytest-ptdbg) {__version__}")
        return EXIT_OK
    cmd = argv[0] if argv and not argv[0].startswith("-") else None
    if cmd is not None and cmd in SUBCOMMANDS and SUBCOMMANDS[cmd][1] == "main":
        fn = _resolve(SUBCOMMANDS[cmd][0])
        if fn is None:
            print(f"ptdbg: the {cmd!r} command is not available in this installation", file=sys.stderr)
            return 2
        return int(fn(argv[1:]) or 0)
    parser = build_parser(cmd)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    func = getattr(args, "func", None)
    if func is None:
        print(f"ptdbg: the {args.command!r} command is not available in this installation", file=sys.stderr)
        return EXIT_ERROR
    try:
        return int(func(args) or 0)
    except (BrokenPipeError, KeyboardInterrupt):
        raise
    except Exception as exc:  # a bug, not a verdict: never exit 1 ("precision problem") for it
        traceback.print_exc()
        print(f"ptdbg {args.command}: internal error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
