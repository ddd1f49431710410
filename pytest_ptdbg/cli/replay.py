"""``ptdbg replay PACKAGE --device cpu|cuda|npu [--dtype float64] [--script OUT.py] [--json]``.

Registered by ``pytest_ptdbg/cli/`` through :func:`add_parser`; the handler returns the exit
status: 0 when the call passes (by default: its own error within its budget, the verdict
compare's judgement gives it; with ``--rule dtype|ptdbg``: every replayed tensor passes that
rule), 1 when it fails, 2 when the replay
cannot run (bad arguments, a path that is not a package, an API that cannot be re-run).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Optional, Sequence


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``replay`` subcommand to an ``argparse`` subparsers object (sets ``func``)."""
    from pytest_ptdbg.cli import EXIT_STATUS

    p = subparsers.add_parser(
        "replay", epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter,
        help="run one saved API call again (a reproduction package) and judge the saved result",
        description="Run the API of a reproduction package (written by mode='acl' or "
                    "hook_name='overflow_check') from its saved inputs and judge the saved result as "
                    "compare's judgement does: its own error (against a float64 replay) within its "
                    "budget (a replay in its compute dtype); the compare metrics of every tensor are shown.",
    )
    p.add_argument("package", help="reproduction package directory (holds package.json)")
    p.add_argument("--device", default="cpu", help="cpu, cuda[:i] or npu[:i] (default cpu)")
    p.add_argument("--dtype", default=None,
                   help="cast floating-point inputs first, e.g. float64 for an oracle")
    p.add_argument("--rule", choices=("budget", "dtype", "ptdbg"), default="budget",
                   help="verdict: budget (own error within its budget, as compare judges; default), or a "
                        "per-tensor rule: dtype (assert_close tolerances) or ptdbg")
    p.add_argument("--script", metavar="OUT.py", default=None,
                   help="write a standalone Python script for the package instead of replaying it")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Handler of ``ptdbg replay``."""
    from pytest_ptdbg.repro.runner import ReplayError, replay

    try:
        if args.script:
            from pytest_ptdbg.repro.script import write_script

            path = write_script(args.package, args.script)
            print(f"wrote {path}: python {path} [--device cpu] [--dtype float64]")
            return 0
        result = replay(args.package, device=args.device, dtype=args.dtype, rule=args.rule)
    except BrokenPipeError:
        raise
    except (OSError, ValueError, ReplayError) as exc:
        print(f"ptdbg replay: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    except MemoryError:
        print(f"ptdbg replay: error: {args.package}: out of memory while replaying it", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result.to_dict(), indent=1, default=str))
    else:
        print(result.text())
    return 0 if result.passed else 1


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``replay`` alone (``python -m pytest_ptdbg.cli.replay PACKAGE ...``)."""
    parser = argparse.ArgumentParser(prog="ptdbg")
    sub = parser.add_subparsers(dest="command", required=True)
    add_parser(sub)
    args = parser.parse_args(["replay", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
