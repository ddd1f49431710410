"""Every Python block of README.md runs from a plain install (issue 18, item 1).

Each block runs in a temporary directory of its own, in a fresh interpreter whose ``sys.path`` holds
this checkout's ``pytest_ptdbg`` package (as an install puts it in site-packages) and nothing else
of the repository: no ``example_models``, no ``tests``. A block with a test function runs under
pytest (the plugin loads from its entry point), as the README says: the first run on a CPU-only
machine writes the golden and fails with ``golden created; run again``, the second passes.
A block the README marks ``<!-- readme-snippet: not runnable (why) -->`` on the line before it is
left out; only a few may be.
"""
import os
import re
import subprocess
import sys

import pytest

import pytest_ptdbg

README = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "README.md")
MARK = re.compile(r"<!--\s*readme-snippet:\s*not runnable\s*\((?P<why>[^)]+)\)\s*-->")
FENCE = re.compile(r"^```(?P<lang>[A-Za-z0-9_-]*)\s*$")
MAX_UNRUNNABLE = 3


def blocks(text):
    """``(line, language, code, why-not-runnable or None)`` of every fenced block."""
    out, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, j = i, i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        prev = lines[start - 1] if start else ""
        mark = MARK.search(prev)
        out.append((start + 1, m.group("lang").lower(), "\n".join(lines[start + 1:j]) + "\n",
                    mark.group("why") if mark else None))
        i = j + 1
    return out


def _python_blocks():
    with open(README, encoding="utf-8") as f:
        return [b for b in blocks(f.read()) if b[1] in ("python", "py", "pytest")]


def test_readme_blocks_found_and_few_marked():
    found = _python_blocks()
    assert len([b for b in found if b[3] is None]) >= 1
    assert len([b for b in found if b[3] is not None]) <= MAX_UNRUNNABLE
    assert any("ptdbg_dump" in b[2] and b[3] is None for b in found), \
        "the plugin's example must be runnable"


@pytest.fixture
def install(tmp_path):
    """A site folder holding only this checkout's package, and the environment that uses it."""
    site = tmp_path / "site"
    site.mkdir()
    os.symlink(os.path.dirname(os.path.abspath(pytest_ptdbg.__file__)), site / "pytest_ptdbg")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTEST_ADDOPTS", "CI", "PYTEST_XDIST_WORKER",
                        "PYTEST_XDIST_WORKER_COUNT", "PYTEST_CURRENT_TEST")}
    env["PYTHONPATH"] = str(site)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _run(args, cwd, env):
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_install_has_no_repository_on_its_path(tmp_path, install):
    probe = ("import importlib.util, sys, pytest_ptdbg\n"
             "assert importlib.util.find_spec('example_models') is None, 'example_models found'\n"
             "assert importlib.util.find_spec('tests') is None or 'site-packages' in "
             "str(importlib.util.find_spec('tests').origin)\n"
             f"assert pytest_ptdbg.__file__.startswith({str(tmp_path / 'site')!r}), "
             "pytest_ptdbg.__file__\n")
    res = _run(["-c", probe], tmp_path, install)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("line,lang,code,why", _python_blocks(),
                         ids=lambda v: f"line{v}" if isinstance(v, int) else "")
def test_readme_block_runs(tmp_path, install, line, lang, code, why):
    if why is not None:
        pytest.skip(f"README.md:{line} is marked not runnable: {why}")
    work = tmp_path / "work"
    work.mkdir()
    if re.search(r"^def test_", code, re.M):
        (work / "test_readme_block.py").write_text(code, encoding="utf-8")
        args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "test_readme_block.py",
                f"--ptdbg-dump-dir={tmp_path / 'dumps'}"]
        first = _run(args, work, install)
        out = first.stdout + first.stderr
        if first.returncode != 0:  # a CPU-only machine: the golden is written, then judged
            assert "golden created; run again" in out, f"README.md:{line}:\n{out[-4000:]}"
            second = _run(args, work, install)
            out = second.stdout + second.stderr
            assert second.returncode == 0, f"README.md:{line} (second run):\n{out[-4000:]}"
        assert " passed" in out, out[-2000:]
    else:
        (work / "readme_block.py").write_text(code, encoding="utf-8")
        res = _run(["readme_block.py"], work, install)
        assert res.returncode == 0, f"README.md:{line}:\n{(res.stdout + res.stderr)[-4000:]}"
