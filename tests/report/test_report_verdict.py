"""Reports say one verdict and no filler (issue 17): the HTML leaves unknown numbers out, and the
session's terminal lines and ``index.html`` read the same first suspect of an entry."""
import math
import re

from pytest_ptdbg.advise.advisor import Advice, Suspect
from pytest_ptdbg.plugin.summary import SessionSummary, entry_line
from pytest_ptdbg.report.html_report import render_html

import synthetic


def _root_cause(**kw):
    base = dict(api="Torch_gelu_0_forward", direction="forward", kind="own", csv_line=5, stack=None,
                input_error=math.nan, output_error=math.nan, growth=math.nan,
                category="changed argument", advice="gelu is called with other arguments.",
                family="Torch_gelu")
    base.update(kw)
    return Suspect(**base)


def test_html_and_text_leave_unknown_errors_out():
    table = synthetic.synthetic_table([synthetic.api("Torch_gelu_0_forward", [0.0], [1e-2])])
    only_out = _root_cause(api="Torch_gelu_1_forward", output_error=4.7e-4)
    adv = Advice(suspects=[_root_cause(), only_out], all_agree=False, n_rows=2, n_compared=2,
                 n_failed=1)
    html = render_html(table, adv)
    body = re.sub(r"<[^>]+>", " ", html.split("</style>")[1])
    assert "n/a" not in body
    assert "4.70e-04 out" in body            # what is known is said
    text = adv.text()
    assert "n/a" not in text and "error 4.70e-04 out" in text


def test_index_html_and_the_terminal_name_the_same_first_suspect(tmp_path):
    suspect = {"api": "VF_lstm_0_forward", "location": "models.py:285", "kind": "unpaired"}
    s = SessionSummary(str(tmp_path), None)
    s.entries = [{"nodeid": "t.py::passes", "verdict": "passed", "first_suspect": suspect},
                 {"nodeid": "t.py::fails", "verdict": "failed", "first_suspect": suspect}]
    s.write_json()
    with open(tmp_path / "index.html", encoding="utf-8") as f:
        rows = re.findall(r"<tr class=\"[a-z]*\">(.*?)</tr>", f.read())
    cells = {re.sub(r"<[^>]+>", "", r.split("</td>")[0]): r for r in rows}
    assert "VF_lstm_0_forward" not in cells["t.py::passes"]
    assert "first suspect: none" in entry_line(s.entries[0])
    assert "VF_lstm_0_forward" in cells["t.py::fails"]
    assert "first suspect: VF_lstm_0_forward" in entry_line(s.entries[1])
