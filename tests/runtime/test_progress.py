import io

from pytest_ptdbg.runtime.progress import Progress, is_terminal


def test_progress_draws_only_where_enabled():
    s = io.StringIO()
    assert not is_terminal(s)
    with Progress(4, "compare", stream=s) as p:        # not a terminal: nothing at all
        for k in range(1, 5):
            p.update(k, f"rank{k}")
    assert s.getvalue() == ""
    s = io.StringIO()
    with Progress(4, "compare", enabled=True, stream=s, width=8) as p:
        p.update(1, "rank0", force=True)
        p.update(4, "rank3")
    text = s.getvalue()
    assert "\rcompare [##......] 1/4 rank0" in text and "\rcompare [########] 4/4 rank3" in text
    assert text.endswith("\n")
