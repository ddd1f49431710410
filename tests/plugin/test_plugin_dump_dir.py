"""``--ptdbg-dump-dir=D`` removes only what pytest-ptdbg wrote there, never through a link
(issue 18, item 3)."""
import os
import subprocess
import sys

import pytest

import pytest_ptdbg

pytest_plugins = ["pytester"]

NO_FIXTURE = "def test_plain():\n    assert True\n"
WITH_FIXTURE = """
from netlib import make

def test_dumped(ptdbg_dump):
    model, batch = make()
    ptdbg_dump(model, batch, keep="all").assert_precision()
"""


def _user_files(d, outside):
    """What a user keeps in (and links from) the dump directory."""
    (d / "index.html").write_text("<p>my index</p>")
    (d / "ptdbg_summary.json").write_text('{"mine": true}')
    (d / "logs").mkdir()
    (d / "notes").mkdir()
    (d / "notes" / "empty").mkdir()
    # outside D, reached through a link: a folder that looks like ours, and an empty one
    (outside / "marked").mkdir(parents=True)
    (outside / "marked" / ".ptdbg-artifacts").write_text("x")
    (outside / "marked" / "precious.bin").write_bytes(b"\0" * 10)
    (outside / "empty").mkdir()
    os.symlink(outside, d / "link")


def _intact(d, outside, top_files=True):
    if top_files:
        assert (d / "index.html").read_text() == "<p>my index</p>"
        assert (d / "ptdbg_summary.json").read_text() == '{"mine": true}'
    assert (d / "logs").is_dir() and (d / "notes" / "empty").is_dir()
    assert (outside / "marked" / "precious.bin").read_bytes() == b"\0" * 10
    assert (outside / "empty").is_dir() and (d / "link").is_symlink()


def test_a_session_without_the_fixture_deletes_nothing(tester, tmp_path):
    """A plain ``pytest --ptdbg-dump-dir=D`` (no --basetemp, as a user runs it)."""
    d, outside = tmp_path / "D", tmp_path / "outside"
    d.mkdir()
    _user_files(d, outside)
    tester.makepyfile(test_plain=NO_FIXTURE)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(pytest_ptdbg.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]),
               PYTEST_ADDOPTS="")
    for _ in range(2):
        res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              f"--ptdbg-dump-dir={d}", "test_plain.py"], cwd=tester.path,
                             env=env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stdout + res.stderr
        _intact(d, outside)
    tester.runpytest(f"--ptdbg-dump-dir={d}").assert_outcomes(passed=1)   # and in-process
    _intact(d, outside)


def test_the_next_session_removes_only_what_the_last_one_wrote(tester, tmp_path):
    d, outside = tmp_path / "D", tmp_path / "outside"
    d.mkdir()
    _user_files(d, outside)
    os.remove(d / "index.html")            # these two names are the plugin's own outputs
    os.remove(d / "ptdbg_summary.json")
    tester.makepyfile(test_dumped=WITH_FIXTURE, test_plain=NO_FIXTURE)
    tester.runpytest(f"--ptdbg-dump-dir={d}").assert_outcomes(passed=2)
    assert (d / "ptdbg_summary.json").is_file() and (d / "index.html").is_file()
    assert (d / "test_dumped.py" / "test_dumped" / ".ptdbg-artifacts").is_file()
    tester.runpytest(f"--ptdbg-dump-dir={d}", "test_plain.py").assert_outcomes(passed=1)
    # the earlier session's summary, index and test folders are gone; the user's are not
    assert not (d / "ptdbg_summary.json").exists() and not (d / "index.html").exists()
    assert not (d / "test_dumped.py").exists()
    _intact(d, outside, top_files=False)


def test_a_user_folder_in_the_way_of_a_test_folder_is_not_deleted(tester, tmp_path):
    d = tmp_path / "D"
    (d / "test_dumped.py" / "test_dumped").mkdir(parents=True)
    (d / "test_dumped.py" / "test_dumped" / "mine.txt").write_text("keep me")
    tester.makepyfile(test_dumped=WITH_FIXTURE)
    res = tester.runpytest(f"--ptdbg-dump-dir={d}")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*was not written by pytest-ptdbg*left alone*"])
    assert (d / "test_dumped.py" / "test_dumped" / "mine.txt").read_text() == "keep me"


def test_old_runs_under_the_default_root_lose_only_what_the_plugin_wrote(tmp_path):
    """The shared default root keeps the last few ``run-*`` folders; an older one is cleared of
    the plugin's marked test folders only: a user's file in it stays (with its folder), and a
    ``run-*`` link is never followed (before: ``shutil.rmtree`` of every older run)."""
    from pytest_ptdbg.plugin import ARTIFACT_MARK, KEEP_RUNS, _new_run_dir

    root = tmp_path / "root"
    outside = tmp_path / "outside"
    (outside / "marked").mkdir(parents=True)
    (outside / "marked" / ARTIFACT_MARK).write_text("")
    (outside / "marked" / "precious.bin").write_text("keep")
    runs = []
    for i in range(KEEP_RUNS + 2):
        run = root / f"run-2026010{i}-000000-{i}"
        (run / "test_a" / "compare").mkdir(parents=True)
        (run / "test_a" / ARTIFACT_MARK).write_text("")
        runs.append(run)
    (runs[0] / "notes.txt").write_text("the user's")           # a user's file in the oldest run
    for i, run in enumerate(runs):
        os.utime(run, (1000 + i, 1000 + i))                     # oldest first
    os.symlink(outside, root / "run-00000000-000000-0", target_is_directory=True)  # oldest of all

    new = _new_run_dir(str(root))

    assert new.startswith(str(root / "run-"))
    assert (runs[0] / "notes.txt").read_text() == "the user's"   # kept, and so is its folder
    assert not (runs[0] / "test_a").exists()                      # the plugin's folder went
    assert not runs[1].exists() and not runs[2].exists()          # emptied by that: removed
    assert all(r.exists() for r in runs[-(KEEP_RUNS - 1):])       # the newest are kept whole
    assert (outside / "marked" / "precious.bin").read_text() == "keep"
    assert (root / "run-00000000-000000-0").is_symlink()
