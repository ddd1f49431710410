"""The completeness manifest's in-place update (``rewrite_manifest``)."""
import os

import pytest

from pytest_ptdbg.format import manifest


def test_rewrite_in_place_and_a_cut_short_update_is_never_complete(tmp_path):
    pkl = str(tmp_path / "api_stack_dump.pkl")
    open(pkl, "w").close()
    with pytest.raises(FileNotFoundError):
        manifest.rewrite_manifest(pkl, 3)  # none yet: the writer then creates one
    path = manifest.write_manifest(pkl, 0, False, "not closed by stop() or step()")
    ino = os.stat(path).st_ino
    manifest.rewrite_manifest(pkl, 12, True)  # shorter text than before
    doc = manifest.read_manifest(pkl)
    assert (doc["records"], doc["complete"], doc["reason"]) == (12, True, None)
    assert os.stat(path).st_ino == ino  # the same file, updated in place
    manifest.rewrite_manifest(pkl, 7, False, "write error on x: [Errno 28] No space left on device")
    assert manifest.read_manifest(pkl)["complete"] is False
    # a process killed after the new text and before the cut: old bytes follow it
    old = open(path, "rb").read()
    new = manifest.manifest_text(os.path.basename(pkl), 12, True).encode()
    with open(path, "r+b") as f:
        f.write(new)
    assert len(old) > len(new)
    with pytest.raises(ValueError, match="not JSON"):
        manifest.read_manifest(pkl)
