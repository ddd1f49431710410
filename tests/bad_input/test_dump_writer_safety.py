"""The dump writer under bad conditions: it never breaks the user's step, marks completeness in the
manifest, and never destroys data it was not asked to replace.

Write errors are simulated by wrapping ``os.write`` / ``os.open`` for files under the test's dump
path only (a real 3 MiB tmpfs is used too where this machine lets the test mount one).
"""
import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

from locations import REPO_ROOT
import torch

from example_models import mlp
from pytest_ptdbg import PrecisionDebugger
from pytest_ptdbg.format import records
from pytest_ptdbg.format.manifest import judge_completeness, manifest_path, read_manifest

ROOT = REPO_ROOT
STEPS = 3


def train(dbg=None, steps=STEPS, optimizer="adamw"):
    """A few real training steps of the example MLP (one optimizer across steps); losses and
    final parameters. With ``dbg``: each step is one start/stop segment, then ``dbg.step()``."""
    model, batch = mlp(seed=0)
    opt = (torch.optim.AdamW if optimizer == "adamw" else torch.optim.SGD)(model.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        if dbg is not None:
            dbg.start()
        opt.zero_grad(set_to_none=True)
        loss = model.loss(batch)
        loss.backward()
        opt.step()
        if dbg is not None:
            dbg.stop()
            dbg.step()
        losses.append(loss.detach().clone())
    if dbg is not None:
        dbg.close()
    return losses, [p.detach().clone() for p in model.parameters()]


def assert_bit_identical(a, b):
    for x, y in zip(a[0] + a[1], b[0] + b[1]):
        assert torch.equal(x, y)


def our_warnings(caught):
    return [w for w in caught if "pytest-ptdbg" in str(w.message)]


def consistent_lines(rank_dir, mode="api_stack"):
    """Check what a dump left on disk: only whole lines, each naming whole ``.npy`` files; their count."""
    pkl = os.path.join(rank_dir, records.pkl_name(mode))
    if not os.path.exists(pkl):
        return 0
    with open(pkl, "rb") as f:
        raw = f.read()
    assert raw == b"" or raw.endswith(b"\n"), f"{pkl} ends in a cut line"
    lines = raw.split(b"\n")[:-1]
    data = os.path.join(rank_dir, records.data_dir_name(mode))
    for line in lines:
        rec = json.loads(line)
        if records.is_stack_record(rec):
            continue
        npy = rec[6].get("npy") if len(rec) > 6 else None
        if npy:
            arr = np.load(os.path.join(data, npy), allow_pickle=False)  # whole, or this raises
            assert list(arr.shape) == list(rec[4]), npy
    return len(lines)


class FakeDisk:
    """``os.write`` refuses with ``err`` once ``budget`` bytes went to matching files under ``root``
    (the last accepted write may be short, as on a real full disk)."""

    def __init__(self, monkeypatch, root, kind, budget, err):
        if not os.path.isdir("/proc/self/fd"):
            pytest.skip("needs /proc/self/fd to see which file a descriptor writes")
        self.real = os.write
        self.root = os.path.realpath(root)
        self.kind, self.budget, self.err = kind, budget, err
        self.used = 0
        self.refused = 0
        monkeypatch.setattr(os, "write", self.write)

    def _matches(self, fd):
        try:
            p = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return False
        return p.startswith(self.root) and (self.kind == "any" or p.endswith("." + self.kind))

    def write(self, fd, data):
        if not self._matches(fd):
            return self.real(fd, data)
        room = self.budget - self.used
        if room <= 0:
            self.refused += 1
            raise OSError(self.err, os.strerror(self.err))
        n = self.real(fd, bytes(memoryview(data).cast("B")[:room]))
        self.used += n
        return n


@pytest.mark.parametrize("summary_only, kind, budget, err", [
    (True, "pkl", 6000, errno.ENOSPC),     # statistics only: the .pkl write fails mid-line
    (False, "pkl", 6000, errno.EDQUOT),    # full mode: the .pkl write on the I/O thread fails
    (False, "npy", 20000, errno.EIO),      # full mode: an .npy on the background writer is cut short
    (True, "any", 6000, errno.EACCES),     # everything refused, the manifest too
    (False, "any", 20000, errno.ENOSPC),
], ids=["summary-pkl-ENOSPC", "full-pkl-EDQUOT", "full-npy-EIO", "summary-all-EACCES", "full-all-ENOSPC"])
def test_disk_full_stops_the_dump_once_and_marks_it_incomplete(tmp_path, monkeypatch, summary_only, kind, budget, err):
    """Case 1: a write error inside the step never raises, warns once, keeps training bit-identical,
    leaves no line naming a cut .npy, and every step it hit is judged incomplete."""
    reference = train()
    root = tmp_path / "dump"
    dbg = PrecisionDebugger(dump_path=str(root), step=None)
    dbg.configure_hook(mode="api_stack", summary_only=summary_only)
    disk = FakeDisk(monkeypatch, str(root), kind, budget, err)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = train(dbg)
    monkeypatch.undo()
    assert disk.refused >= 1
    assert_bit_identical(reference, got)
    ours = our_warnings(caught)
    assert len(ours) == 1, [str(w.message) for w in ours]
    assert os.strerror(err) in str(ours[0].message)
    for step in range(STEPS):
        rank_dir = records.rank_dir(str(root), step, 0)
        pkl = os.path.join(rank_dir, "api_stack_dump.pkl")
        n = consistent_lines(rank_dir)
        verdict = judge_completeness(pkl, n, ours=True)
        assert verdict.failed, (step, verdict)
        doc = read_manifest(pkl) if os.path.isdir(rank_dir) else None
        if kind == "any":
            assert doc is None  # the disk refused the manifest too: its absence fails compare
            assert not [f for f in os.listdir(rank_dir) if ".tmp-" in f] if os.path.isdir(rank_dir) else True
        else:
            assert doc["complete"] is False and doc["records"] == n
            assert errno.errorcode[err] in doc["reason"], doc["reason"]


def test_real_full_tmpfs(tmp_path):
    """Case 1 on a real 3 MiB tmpfs (where it can be mounted): full-mode steps fill it; no raise,
    one warning, the same training, whole lines naming whole files, the failed steps incomplete."""
    disk = tmp_path / "disk"
    disk.mkdir()
    try:
        rc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3M", "tmpfs", str(disk)],
                            capture_output=True).returncode
    except OSError:
        rc = 1
    if rc != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        reference = train(steps=6)
        dbg = PrecisionDebugger(dump_path=str(disk / "dump"), step=None)
        dbg.configure_hook(mode="api_stack")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = train(dbg, steps=6)
        assert_bit_identical(reference, got)
        ours = our_warnings(caught)
        assert len(ours) == 1 and "No space left on device" in str(ours[0].message)
        verdicts, docs = [], []
        for step in range(6):
            rank_dir = records.rank_dir(str(disk / "dump"), step, 0)
            pkl = os.path.join(rank_dir, "api_stack_dump.pkl")
            verdicts.append(judge_completeness(pkl, consistent_lines(rank_dir), ours=True))
            docs.append(read_manifest(pkl) if os.path.isdir(rank_dir) else None)
        assert verdicts[0].status == "complete"  # the first step fits
        assert verdicts[-1].failed
        # the step that hit the full disk says so: its manifest was rewritten in place
        assert any(d and d["complete"] is False and "ENOSPC" in d["reason"] for d in docs), docs
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_empty_step_list_means_every_step(tmp_path):
    """Case 2: ``step=[]`` (ptdbg's default) dumps every step, like ``step=None``."""
    for name, steps in (("empty", []), ("none", None)):
        train(PrecisionDebugger(dump_path=str(tmp_path / name), step=steps), steps=2)
        for step in (0, 1):
            pkl = os.path.join(records.rank_dir(str(tmp_path / name), step, 0), "api_stack_dump.pkl")
            assert os.path.getsize(pkl) > 0, (name, step)


def test_rerun_never_touches_a_step_it_does_not_dump(tmp_path):
    """Case 3: a second run over the same path that dumps step 0 only (then calls ``step()``, as a
    training loop does) leaves the first run's step 1 untouched."""
    root = str(tmp_path / "dump")
    train(PrecisionDebugger(dump_path=root, step=None), steps=2)
    step1 = records.rank_dir(root, 1, 0)
    before = {n: open(os.path.join(step1, n), "rb").read() for n in os.listdir(step1)
              if os.path.isfile(os.path.join(step1, n))}
    assert "api_stack_dump.pkl" in before
    rerun = PrecisionDebugger(dump_path=root, step=None)
    model, batch = mlp(seed=1)
    rerun.start()
    model.loss(batch).backward()
    rerun.stop()
    rerun.step()  # the loop moves on, then the program ends without dumping step 1
    rerun.close()
    assert os.path.isdir(step1), "the first run's step 1 was deleted"
    after = {n: open(os.path.join(step1, n), "rb").read() for n in os.listdir(step1)
             if os.path.isfile(os.path.join(step1, n))}
    assert after == before
    pkl1 = os.path.join(step1, "api_stack_dump.pkl")
    assert judge_completeness(pkl1, consistent_lines(step1), ours=True).status == "complete"


HOLDER = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {root!r})
    from pytest_ptdbg import PrecisionDebugger
    dbg = PrecisionDebugger(dump_path={out!r}, step=[0])
    dbg.configure_hook(mode="api_stack", summary_only=True)
    dbg.start()
    torch.relu(torch.ones(3))
    dbg.stop()
    print("holding", flush=True)
    sys.stdin.readline()
""")


def test_one_writer_per_path_step_and_rank(tmp_path):
    """Case 4: a second writer of the same dump path, step and rank (another debugger in this
    process, or another process) is refused at ``start()`` naming the path and the holder's pid;
    the first writer's dump stays whole; a killed holder's stale lock is taken over."""
    root = str(tmp_path / "dump")
    rank_dir = records.rank_dir(root, 0, 0)
    first = PrecisionDebugger(dump_path=root, step=[0])
    first.configure_hook(mode="api_stack", summary_only=True)
    model, batch = mlp(seed=0)
    first.start()
    model.loss(batch).backward()
    first.stop()
    second = PrecisionDebugger(dump_path=root, step=[0])
    with pytest.raises(RuntimeError, match=f"pid {os.getpid()}") as info:
        second.start()
    assert rank_dir in str(info.value)
    first.start()
    model.loss(batch).backward()  # the first writer carries on unharmed
    first.stop()
    first.close()
    pkl = os.path.join(rank_dir, "api_stack_dump.pkl")
    assert judge_completeness(pkl, consistent_lines(rank_dir), ours=True).status == "complete"
    assert sorted(os.listdir(records.step_dir(root, 0))) == ["rank0"]  # the lock is gone

    # another process holds step 0 of a fresh path
    other = str(tmp_path / "other")
    proc = subprocess.Popen([sys.executable, "-c", HOLDER.format(root=ROOT, out=other)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "holding", proc.stderr.read()
        mine = PrecisionDebugger(dump_path=other, step=[0])
        with pytest.raises(RuntimeError, match=f"pid {proc.pid}"):
            mine.start()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        proc.kill()
        proc.wait()
    assert os.path.exists(records.rank_dir(other, 0, 0) + ".lock")  # left by the killed holder
    mine.start()  # the stale lock is taken over
    torch.relu(torch.ones(3))
    mine.stop()
    mine.close()
    assert sorted(os.listdir(records.step_dir(other, 0))) == ["rank0"]


def _write_npy_raises(path, arr):
    raise RuntimeError("simulated failure on the I/O thread")


def _vanish(root):
    import shutil

    shutil.rmtree(os.path.join(root, records.DUMP_DIR_NAME))


@pytest.mark.parametrize("what", ["thread-exception", "vanished-directory", "npy-permission", "pkl-permission"])
def test_other_writer_errors_never_reach_the_step(tmp_path, monkeypatch, what):
    """Case 5: an exception on the background writer, a dump directory deleted mid-step, or a
    permission error: no raise into user code, one warning, the same training, dump incomplete."""
    from pytest_ptdbg.dump import writer

    reference = train()
    root = str(tmp_path / "dump")
    summary = what == "pkl-permission"
    if what == "thread-exception":
        monkeypatch.setattr(writer, "_write_npy_array", _write_npy_raises)
    elif what in ("npy-permission", "pkl-permission"):
        real_open = os.open
        suffix = ".npy" if what == "npy-permission" else ".pkl"

        def refusing_open(path, flags, *a, **k):
            p = os.fspath(path)
            if p.startswith(root) and p.endswith(suffix):
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), p)
            return real_open(path, flags, *a, **k)

        monkeypatch.setattr(os, "open", refusing_open)
    dbg = PrecisionDebugger(dump_path=root, step=None)
    dbg.configure_hook(mode="api_stack", summary_only=summary)
    model, batch = mlp(seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    losses = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(STEPS):
            dbg.start()
            opt.zero_grad(set_to_none=True)
            loss = model.loss(batch)
            dbg.stop()
            if what == "vanished-directory" and step == 0:
                _vanish(root)  # between two segments of one step
            dbg.start()
            loss.backward()
            opt.step()
            dbg.stop()
            dbg.step()
            losses.append(loss.detach().clone())
        dbg.close()
    monkeypatch.undo()
    assert_bit_identical(reference, (losses, [p.detach().clone() for p in model.parameters()]))
    assert len(our_warnings(caught)) == 1, [str(w.message) for w in our_warnings(caught)]
    rank_dir = records.rank_dir(root, 0, 0)
    pkl = os.path.join(rank_dir, "api_stack_dump.pkl")
    n = consistent_lines(rank_dir)
    assert judge_completeness(pkl, n, ours=True).failed or not os.path.exists(pkl)
    if what != "vanished-directory":
        doc = read_manifest(pkl)
        assert doc["complete"] is False and doc["records"] == n, doc
        assert ("EACCES" if "permission" in what else "simulated failure") in doc["reason"]


def test_manifest_marks_each_closed_dump_complete(tmp_path):
    """The manifest is written at every ``stop()`` (a user who never calls ``step()`` has a complete
    dump) and counts exactly the ``.pkl``'s lines after each segment; ``step()`` closes it."""
    root = str(tmp_path / "dump")
    rank_dir = records.rank_dir(root, 0, 0)
    pkl = os.path.join(rank_dir, "api_stack_dump.pkl")
    dbg = PrecisionDebugger(dump_path=root, step=[0])
    model, batch = mlp(seed=0)
    dbg.start()
    loss = model.loss(batch)
    assert judge_completeness(pkl, consistent_lines(rank_dir), ours=True).failed  # not closed yet
    dbg.stop()
    n1 = consistent_lines(rank_dir)
    assert n1 > 0 and read_manifest(pkl) == {**read_manifest(pkl), "records": n1, "complete": True}
    dbg.start()
    loss.backward()
    dbg.stop()
    n2 = consistent_lines(rank_dir)
    assert n2 > n1 and read_manifest(pkl)["records"] == n2
    assert judge_completeness(pkl, n2, ours=True).status == "complete"
    dbg.step()
    dbg.close()
    assert judge_completeness(pkl, consistent_lines(rank_dir), ours=True).status == "complete"
    assert os.path.basename(manifest_path(pkl)) in os.listdir(rank_dir)
