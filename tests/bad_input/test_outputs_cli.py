"""Bad input for the outputs and the command line: colliding and planted report names, formulas in
CSV cells, script in the HTML report, exit codes, and compare_distributed's rank pairing.

Dumps are real: one training step of ``example_models.mlp`` under ``PrecisionDebugger``; a rank
folder is a copy of rank0. Each good dump gets its completeness manifest written explicitly.
"""
import csv
import itertools
import json
import os
import secrets
import shutil
import subprocess
import sys
import time

import pytest

from comparing import input_param_for
from real_dumps import dump_one_step, perturb

torch = pytest.importorskip("torch")

from pytest_ptdbg import compare_distributed  # noqa: E402
from pytest_ptdbg import api  # noqa: E402
from pytest_ptdbg.format import records  # noqa: E402
from pytest_ptdbg.format.manifest import write_manifest  # noqa: E402

TS = "20260101000000"
CLI = "import sys; from pytest_ptdbg.cli import main; sys.exit(main(sys.argv[1:]))"


def _pkl(root, rank=0):
    return os.path.join(records.rank_dir(str(root), 0, rank), "api_stack_dump.pkl")


def _seal(pkl):
    """Write the manifest of a finished (or edited) dump: every line counted."""
    with open(pkl, encoding="utf-8") as f:
        write_manifest(pkl, records=sum(1 for _ in f))


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    root = tmp_path_factory.mktemp("outputs_cli")
    sides = {"a": None, "b": None, "bad": lambda m: perturb(m, "fc1.weight", add=0.2)}
    for name, prepare in sides.items():
        _seal(dump_one_step(root / name, prepare=prepare).pkl)
    return {name: root / name for name in sides}


def _copy(src, dst, ranks=(0,)):
    """A dump_path holding ``src``'s rank0 as each of ``ranks``; returns its step folder."""
    for r in ranks:
        shutil.copytree(records.rank_dir(str(src), 0, 0), records.rank_dir(str(dst), 0, r))
    return records.step_dir(str(dst), 0)


def _run(*args, timeout=180):
    return subprocess.run([sys.executable, "-c", CLI, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def _fixed_names(monkeypatch):
    """Every compare in the same second, and random suffixes aaaa, b000, b001, ... in that order."""
    monkeypatch.setattr(api, "_timestamp", lambda: TS)
    tokens = itertools.chain(["aaaa"], (f"b{i:03x}" for i in itertools.count()))
    monkeypatch.setattr(secrets, "token_hex", lambda n=None: next(tokens))


# ------------------------------------------------------------------------------------------ outputs

_RACER = """
import json, os, sys, time
from pytest_ptdbg import compare
from pytest_ptdbg import api
api._timestamp = lambda: {ts!r}
open(sys.argv[3], "w").close()
while not os.path.exists(sys.argv[4]):
    time.sleep(0.001)
r = compare(json.loads(sys.argv[1]), sys.argv[2], replay_check=False)
print(json.dumps([r.passed, r.csv_path, r.advisor_path, r.html_path]))
"""


def test_four_compares_into_one_folder_in_one_second_keep_four_report_sets(real, tmp_path):
    """Four processes compare into one folder at the same instant: four whole report sets, and
    each process names the CSV holding its own rows (a failing compare's CSV has failing rows)."""
    out, go = tmp_path / "out", tmp_path / "go"
    sides = [real["a"], real["a"], real["bad"], real["bad"]]
    procs = [subprocess.Popen([sys.executable, "-c", _RACER.format(ts=TS), json.dumps(input_param_for(npu, real["b"])),
                               str(out), str(tmp_path / f"ready{i}"), str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, npu in enumerate(sides)]
    deadline = time.time() + 120
    while not all(os.path.exists(tmp_path / f"ready{i}") for i in range(4)) and time.time() < deadline:
        time.sleep(0.01)
    go.touch()
    res = []
    for p in procs:
        o, e = p.communicate(timeout=180)
        assert p.returncode == 0, e
        res.append(json.loads(o.strip().splitlines()[-1]))
    assert [r[0] for r in res] == [True, True, False, False]
    for i in range(3):   # csv, advisor, html: four distinct files each
        assert len({r[i + 1] for r in res}) == 4
    assert len(os.listdir(out)) == 12
    for passed, csv_path, advisor_path, html_path in res:
        stem = os.path.basename(csv_path)[len("compare_result_"):-len(".csv")]
        assert advisor_path.endswith(f"advisor_{stem}.txt") and html_path.endswith(f"compare_result_{stem}.html")
        with open(csv_path, newline="", encoding="utf-8") as f:
            verdicts = [row["Accuracy Reached or Not"] for row in csv.DictReader(f)]
        assert ("No" in verdicts) == (not passed), csv_path


def test_symlinks_planted_at_report_names_are_never_followed(real, tmp_path, compare_pair, monkeypatch):
    """Links planted at the advisor and HTML names a compare would take are left alone: their
    target keeps its content and the compare takes a new suffix for all its files."""
    _fixed_names(monkeypatch)
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    planted = [f"advisor_{TS}.txt", f"compare_result_{TS}.html",
               f"advisor_{TS}_aaaa.txt", f"compare_result_{TS}_aaaa.html"]
    for name in planted:
        os.symlink(victim, out / name)
    r = compare_pair(real["a"], real["b"], replay_check=False)
    assert victim.read_text() == "precious\n"
    assert all(os.path.islink(out / n) for n in planted)
    for p in (r.csv_path, r.advisor_path, r.html_path):
        assert not os.path.islink(p) and os.path.getsize(p) > 0 and f"_{TS}_b000." in os.path.basename(p)
    assert not os.path.exists(out / f"compare_result_{TS}_aaaa.csv")   # the set moved together


def test_symlink_planted_at_distributed_summary_is_never_followed(real, tmp_path, monkeypatch):
    """A link at the distributed summary's name is not written through."""
    _fixed_names(monkeypatch)
    npu, bench = _copy(real["a"], tmp_path / "npu"), _copy(real["b"], tmp_path / "bench")
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    for name in (f"distributed_summary_{TS}.txt", f"distributed_summary_{TS}_aaaa.txt"):
        os.symlink(victim, out / name)
    res = compare_distributed(npu, bench, str(out), is_print_compare_log=False, replay_check=False)
    assert victim.read_text() == "precious\n"
    assert not os.path.islink(res.summary_path) and open(res.summary_path).read() == res.summary


def test_two_distributed_compares_in_one_second_keep_both_summaries(real, tmp_path, monkeypatch):
    """distributed_summary_* is unique per run, not overwritten by the next run in the same second."""
    monkeypatch.setattr(api, "_timestamp", lambda: TS)
    out = tmp_path / "out"
    good = compare_distributed(_copy(real["a"], tmp_path / "n1"), _copy(real["b"], tmp_path / "b1"), str(out),
                               is_print_compare_log=False, replay_check=False)
    bad = compare_distributed(_copy(real["bad"], tmp_path / "n2"), _copy(real["b"], tmp_path / "b2"), str(out),
                              is_print_compare_log=False, replay_check=False)
    assert good.summary_path != bad.summary_path
    assert open(good.summary_path).read() == good.summary and open(bad.summary_path).read() == bad.summary
    assert len([n for n in os.listdir(out) if n.startswith("distributed_summary_")]) == 2


def _rewrite(pkl, edit):
    """Apply ``edit(record) -> record`` to every record line of ``pkl``, then reseal it."""
    with open(pkl, encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    with open(pkl, "w", encoding="utf-8") as f:
        for rec in lines:
            f.write(json.dumps(edit(rec)) + "\n")
    _seal(pkl)


def test_formula_in_a_dtype_field_is_escaped_in_the_csv_and_numbers_stay_numbers(real, tmp_path, compare_pair):
    """A dump's text fields that a spreadsheet would run (=, +, -, @ first) get a leading quote;
    negative statistics and a text field that reads as a number are written unchanged."""
    npu = tmp_path / "npu"
    shutil.copytree(real["a"], npu)
    evil = {"Functional_linear_0_forward_input.0": '=HYPERLINK("http://evil.example","x")',
            "Functional_linear_0_forward_input.1": "@SUM(1+1)*cmd|' /C calc'!A0",
            "Functional_linear_0_forward_input.2": "-2+3+cmd|' /C calc'!A0",
            "Functional_linear_0_forward_output.0": "-0.5"}

    def edit(rec):
        if rec[0] in evil:
            rec[3] = evil[rec[0]]
        return rec

    _rewrite(_pkl(npu), edit)
    r = compare_pair(npu, real["b"], replay_check=False)
    with open(r.csv_path, newline="", encoding="utf-8") as f:
        rows = {row["NPU Name"]: row for row in csv.DictReader(f)}
    for name, value in evil.items():
        want = value if name.endswith("output.0") else "'" + value
        assert rows[name]["NPU Tensor Dtype"] == want
    row = rows["Functional_linear_0_forward_input.0"]
    assert float(row["NPU min"]) < 0 and row["NPU min"].startswith("-")    # a number, not escaped
    assert all(not cell.startswith(("=", "+", "@")) for row in rows.values() for cell in row.values())


def test_script_in_api_name_and_stack_frame_is_escaped_in_the_html(real, tmp_path, compare_pair):
    """Guard (the HTML report already escaped these): an API name and a stack frame holding
    ``<script>`` appear escaped, never as markup."""
    npu = tmp_path / "npu"
    shutil.copytree(real["bad"], npu)
    tag = "<script>alert(1)</script>"

    def edit(rec):
        rec[0] = rec[0].replace("Functional_linear_0_", f"Functional_x{tag}_0_")
        if isinstance(rec[1], list):
            rec[1] = [[fr[0], fr[1], tag, tag] for fr in rec[1]]
        return rec

    _rewrite(_pkl(npu), edit)
    r = compare_pair(npu, real["b"], replay_check=False)
    html = open(r.html_path, encoding="utf-8").read()
    assert r.first_suspect is not None and tag in r.first_suspect.api
    assert "<script" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


# ------------------------------------------------------------------------------------------ the CLI

def test_cli_dev_null_as_a_dump_exits_2_naming_it(real, tmp_path):
    """/dev/null is not a dump: exit 2 (could not run), one line naming it, no traceback."""
    r = _run("compare", "/dev/null", real["b"], "-o", tmp_path / "out")
    assert r.returncode == 2 and "/dev/null" in r.stderr and "Traceback" not in r.stderr
    r = _run("compare", real["a"], "/dev/null", "-o", tmp_path / "out")
    assert r.returncode == 2 and "/dev/null" in r.stderr and "Traceback" not in r.stderr


def test_cli_a_file_that_is_not_a_dump_exits_2_naming_it(real, tmp_path):
    """A text file given as the NPU dump is not a dump: exit 2 naming it (not a compare that passes)."""
    notes = tmp_path / "notes.txt"
    notes.write_text("loss went up after the upgrade\n")
    r = _run("compare", notes, real["b"], "-o", tmp_path / "out")
    assert r.returncode == 2 and str(notes) in r.stderr and "Traceback" not in r.stderr
    assert not os.path.exists(tmp_path / "out")


def test_cli_parse_of_dev_null_exits_2_naming_it():
    """ptdbg parse /dev/null: exit 2 naming the file."""
    r = _run("parse", "/dev/null", "Functional")
    assert r.returncode == 2 and "/dev/null" in r.stderr and "Traceback" not in r.stderr


def test_cli_unwritable_output_folder_exits_2_naming_it(real, tmp_path):
    """An output folder that cannot be created (its parent is a file) is exit 2, naming the folder,
    not 1 ("precision problem")."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = blocker / "out"
    r = _run("compare", real["a"], real["b"], "-o", out)
    assert r.returncode == 2 and str(out) in r.stderr and "Traceback" not in r.stderr
    r = _run("compare", records.step_dir(str(real["a"]), 0), records.step_dir(str(real["b"]), 0),
             "--distributed", "-o", out)
    assert r.returncode == 2 and str(out) in r.stderr and "Traceback" not in r.stderr


def test_cli_parse_of_a_dump_with_a_corrupt_line_exits_1(real, tmp_path):
    """parse finds the record but the dump holds an unreadable line: exit 1, the line named."""
    npu = tmp_path / "npu"
    shutil.copytree(real["a"], npu)
    pkl = _pkl(npu)
    with open(pkl, encoding="utf-8") as f:
        lines = f.readlines()
    lines[20] = "{garbage\n"
    with open(pkl, "w", encoding="utf-8") as f:
        f.writelines(lines)
    r = _run("parse", npu, "Functional_linear_0_forward_input.0")
    assert r.returncode == 1 and "Functional_linear_0_forward_input.0" in r.stdout
    assert f"{pkl}:21" in r.stderr


def test_cli_help_documents_the_exit_codes():
    """ptdbg --help (and compare --help) list the exit codes 0, 1 and 2."""
    for args in (["--help"], ["compare", "--help"]):
        r = _run(*args)
        assert r.returncode == 0
        text = " ".join(r.stdout.split())
        assert "exit status" in text and "0 compared and agreed" in text
        assert "1 compared and found a precision problem" in text and "2 the command could not run" in text


def test_cli_distributed_with_a_rank_missing_on_one_side_exits_1_naming_it(real, tmp_path):
    """Ranks {0, 1} against {0}: rank 0 still compared, rank 1 named as a failure, exit 1 (not 2)."""
    npu = _copy(real["a"], tmp_path / "npu", ranks=(0, 1))
    bench = _copy(real["b"], tmp_path / "bench", ranks=(0,))
    r = _run("compare", npu, bench, "--distributed", "-o", tmp_path / "out", "-q", "--no-replay")
    assert r.returncode == 1, r.stderr
    assert "rank0-rank0: agrees" in r.stdout and "rank1" in r.stdout and os.path.join(npu, "rank1") in r.stdout
    assert "All ranks agree." not in r.stdout


# ------------------------------------------------------------------------------- compare_distributed

def test_distributed_pairs_ranks_by_number_not_position(real, tmp_path):
    """NPU ranks {0, 1} and bench ranks {0, 2}: only rank 0 pairs; rank 1 and rank 2 are failures
    naming their folders, never compared with each other."""
    npu = _copy(real["a"], tmp_path / "npu", ranks=(0, 1))
    bench = _copy(real["b"], tmp_path / "bench", ranks=(0, 2))
    res = compare_distributed(npu, bench, str(tmp_path / "out"), is_print_compare_log=False, replay_check=False)
    assert list(res.results) == [(0, 0)] and res.results[(0, 0)].passed
    assert not res.passed and sorted(res.errors) == [(1, 1), (2, 2)]
    assert os.path.join(npu, "rank1") in res.errors[(1, 1)] and os.path.join(bench, "rank2") in res.errors[(2, 2)]
    assert "All ranks agree." not in res.summary


def test_distributed_rank_folder_without_pkl_never_says_all_ranks_agree(real, tmp_path):
    """A bench rank folder whose .pkl is gone fails naming the rank; the summary never says
    "All ranks agree." even though every compared rank agrees."""
    npu = _copy(real["a"], tmp_path / "npu", ranks=(0, 1))
    bench = _copy(real["b"], tmp_path / "bench", ranks=(0, 1))
    os.remove(os.path.join(bench, "rank1", "api_stack_dump.pkl"))
    res = compare_distributed(npu, bench, str(tmp_path / "out"), is_print_compare_log=False, replay_check=False)
    assert res.results[(0, 0)].passed and not res.passed
    assert "All ranks agree." not in res.summary and "All ranks agree." not in open(res.summary_path).read()
    assert "rank1" in res.errors[(1, 1)] and os.path.join(bench, "rank1") in res.errors[(1, 1)]


def test_distributed_unequal_rank_sets_still_compare_the_common_ranks(real, tmp_path):
    """NPU ranks {0, 1, 2} against bench {0, 1}: ranks 0 and 1 compared, rank 2 a named failure
    (no exception that hides the ranks that could be compared)."""
    npu = _copy(real["a"], tmp_path / "npu", ranks=(0, 1, 2))
    bench = _copy(real["b"], tmp_path / "bench", ranks=(0, 1))
    res = compare_distributed(npu, bench, str(tmp_path / "out"), is_print_compare_log=False, replay_check=False)
    assert list(res.results) == [(0, 0), (1, 1)] and all(r.passed for r in res.results.values())
    assert list(res.errors) == [(2, 2)] and "only in the device dump" in res.errors[(2, 2)]
    assert not res.passed and "All ranks agree." not in res.summary
