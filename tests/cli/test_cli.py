"""The ptdbg console command end to end (in a subprocess: start-up and imports as a user gets them)."""
import os
import subprocess
import sys

import pandas as pd
import pytest

from pytest_ptdbg import cli
from pytest_ptdbg.format import records

import dumps


def run(*args, check_no_torch=False):
    code = ("import sys; from pytest_ptdbg.cli import main; rc = main(sys.argv[1:]); "
            + ("assert 'torch' not in sys.modules, 'torch imported'; " if check_no_torch else "")
            + "sys.exit(rc)")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    dumps.write_dump(str(root / "npu"), dumps.mlp_apis(noise=1e-6))
    dumps.write_dump(str(root / "bad"), dumps.mlp_apis(fault="forward", fault_scale=0.5))
    dumps.write_dump(str(root / "bench"), dumps.mlp_apis())
    return root


def test_compare_passes_and_fails_with_exit_status(pair, tmp_path):
    ok = run("compare", str(pair / "npu"), str(pair / "bench"), "-o", str(tmp_path / "a"), check_no_torch=True)
    assert ok.returncode == 0, ok.stderr
    assert "PASSED" in ok.stdout
    bad = run("compare", str(records.rank_dir(str(pair / "bad"), 0, 0)), str(records.step_dir(str(pair / "bench"), 0)),
              "-o", str(tmp_path / "b"), "--rule", "dtype", "--stack")
    assert bad.returncode == 1 and "first suspect: Torch_relu_0_forward" in bad.stdout
    csv = [f for f in os.listdir(tmp_path / "b") if f.endswith(".csv")]
    assert "NPU_Stack_Info" in pd.read_csv(tmp_path / "b" / csv[0]).columns
    pkl = os.path.join(records.rank_dir(str(pair / "npu"), 0, 0), "api_stack_dump.pkl")
    r = run("compare", pkl, str(pair / "bench"), "-o", str(tmp_path / "c"), "-q")
    assert r.returncode == 0, r.stderr
    csv = [f for f in os.listdir(tmp_path / "c") if f.endswith(".csv")]
    assert "Cosine" in pd.read_csv(tmp_path / "c" / csv[0]).columns   # data found beside the .pkl


def test_summary_compare_never_imports_torch(pair, tmp_path):
    r = run("compare", str(pair / "bad"), str(pair / "bench"), "-o", str(tmp_path), "--summary", "-q",
            check_no_torch=True)
    assert r.returncode in (0, 1), r.stderr
    csv = [f for f in os.listdir(tmp_path) if f.endswith(".csv")]
    assert "Max diff" in pd.read_csv(tmp_path / csv[0]).columns


def test_summary_compare_of_full_dumps_says_why_it_judged_from_statistics(dump_step, tmp_path):
    """Both dumps hold full tensors (a real MLP step); ``--summary`` reads none. The advisor and
    the log say the statistics compare was asked for, never that the device dump has no tensors,
    and both sides of two CPU runs are the device and the bench, not an NPU."""
    dev = dump_step("device", "mlp", seed=0)
    bench = dump_step("bench", "mlp", seed=0)
    assert os.listdir(dev.data_dir)       # it has them
    r = run("compare", dev.dump_path, bench.dump_path, "-o", str(tmp_path / "out"), "--summary")
    assert r.returncode == 0, r.stderr
    advisor = [f for f in os.listdir(tmp_path / "out") if f.startswith("advisor")]
    with open(tmp_path / "out" / advisor[0], encoding="utf-8") as f:
        text = f.read()
    for said in (text, r.stdout):
        assert "dump has no full tensors" not in said and "NPU dump" not in said
        assert "statistics (summary) compare asked for" in said
    assert "Suspect Nodes: None" in text


def test_parse_and_bad_input(pair):
    r = run("parse", str(pair / "npu"), "Torch_relu_0_forward", check_no_torch=True)
    assert r.returncode == 0 and "[Torch_relu_0_forward_output.0][dtype: torch.float32]" in r.stdout
    r = run("compare", str(pair / "nowhere"), str(pair / "bench"), "-o", str(pair / "x"))
    assert r.returncode == 2 and "nowhere" in r.stderr


def test_registry_lists_lazily_and_skips_missing_modules(capsys):
    assert {"compare", "parse", "replay", "demo"} <= set(cli.SUBCOMMANDS)
    cli.register("ghost", "pytest_ptdbg.no_such_module:add_parser", help="not built")
    try:
        assert cli.main(["ghost"]) == 2
        assert "not available" in capsys.readouterr().err
        with pytest.raises(SystemExit):
            cli.main(["--help"])
        assert "ghost" in capsys.readouterr().out
    finally:
        del cli.SUBCOMMANDS["ghost"]
    with pytest.raises(ValueError):
        cli.register("x", "a:b", kind="other")


def test_distributed_compare_takes_dump_paths(tmp_path):
    for name, fault in (("npu", "forward"), ("bench", None)):
        for rank in (0, 1):
            dumps.write_dump(str(tmp_path / name), dumps.mlp_apis(fault=fault if rank == 1 else None,
                                                                  fault_scale=0.5), rank=rank)
    res = run("compare", str(tmp_path / "npu"), str(tmp_path / "bench"), "-o", str(tmp_path / "out"),
              "--distributed", "--rule", "dtype")
    assert res.returncode == 1, res.stderr
    assert "rank1" in res.stdout
    csvs = sorted(f for f in os.listdir(tmp_path / "out") if f.endswith(".csv"))
    assert [c.split("_")[2] for c in csvs] == ["rank0-rank0", "rank1-rank1"]


def test_step_folder_names_the_steps_when_ambiguous(tmp_path):
    dumps.write_dump(str(tmp_path / "d"), dumps.mlp_apis(), step=0)
    dumps.write_dump(str(tmp_path / "d"), dumps.mlp_apis(), step=1)
    with pytest.raises(ValueError, match="step0, step1"):
        cli.step_folder(str(tmp_path / "d"))
    assert cli.step_folder(str(records.step_dir(str(tmp_path / "d"), 1))).endswith("step1")


def test_output_into_a_closed_pipe_stops_quietly(pair):
    pkl = os.path.join(records.rank_dir(str(pair / "npu"), 0, 0), "api_stack_dump.pkl")
    code = ("import sys; from pytest_ptdbg.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.Popen([sys.executable, "-c", code, "parse", pkl, "Functional"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader went away before the first line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and "BrokenPipeError" not in err and "Traceback" not in err


def test_version():
    from pytest_ptdbg import __version__

    r = run("--version", check_no_torch=True)
    assert r.returncode == 0 and r.stdout.strip() == f"ptdbg (pytest-ptdbg) {__version__}"


def test_demo_runs_from_a_normal_install(tmp_path):
    """The package alone (as pip installs it, without the repository's example_models/ and
    without the source checkout on sys.path): ``ptdbg demo`` dumps its own packaged model."""
    import shutil

    import pytest_ptdbg

    site = tmp_path / "site"
    shutil.copytree(os.path.dirname(pytest_ptdbg.__file__), site / "pytest_ptdbg",
                    ignore=shutil.ignore_patterns("__pycache__"))
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, PYTHONPATH=str(site))
    code = "import sys; from pytest_ptdbg.cli import main; sys.exit(main(sys.argv[1:]))"
    r = subprocess.run([sys.executable, "-c", code, "demo", "--summary-only"], cwd=work, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "example_models" not in r.stdout + r.stderr
    assert "one training step of the demo model tiny_gpt" in r.stdout
    assert (work / "ptdbg-report" / records.DUMP_DIR_NAME).is_dir()   # the README's name
    r = subprocess.run([sys.executable, "-c", "import example_models"], cwd=work, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0     # the check above really ran without the example suite


def test_demo_writes_where_the_readme_says():
    """The README names the report folder ``ptdbg-report`` (its main job's --ptdbg-dump-dir and
    ``ptdbg demo``); the demo's default and its --help say the same (it wrote ``ptdbg_report``)."""
    from pytest_ptdbg.cli import demo

    readme = open(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "README.md"), encoding="utf-8").read()
    demo_line = next(line for line in readme.splitlines() if line.startswith("ptdbg demo"))
    assert "./ptdbg-report" in demo_line and "--ptdbg-dump-dir=ptdbg-report" in readme
    assert demo.DEFAULT_OUT == "ptdbg-report"
    assert demo.build_parser().parse_args([]).out == "ptdbg-report"
    assert "./ptdbg-report" in demo.build_parser().format_help()
