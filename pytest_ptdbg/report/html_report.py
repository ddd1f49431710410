"""A self-contained HTML report: suspects first, then error along execution order, then rows.

No network and no JavaScript: styles and the SVG plots (:mod:`.svg_plot`) are inline; stacks
fold with ``<details>``; hovering a point shows the API (SVG ``<title>``).
"""
from __future__ import annotations

import datetime as _dt
from html import escape
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pandas as pd

from pytest_ptdbg.advise import advice_text as at
from pytest_ptdbg.advise.advisor import MIN_GROWTH, PASS_FRACTION_NOTE, Advice, Suspect
from pytest_ptdbg.comparison import schema
from pytest_ptdbg.format.environment import compute_device, fp32_words
from pytest_ptdbg.runtime.text import fmt_error, fmt_number
from pytest_ptdbg.report.outputs import write_new
from pytest_ptdbg.report.svg_plot import Mark, PlotData, Series, error_plot

MAX_FAILING_ROWS = 300

_CSS = """
:root{--fg:#0f172a;--muted:#64748b;--line:#e2e8f0;--bad:#b91c1c;--good:#15803d;--card:#f8fafc}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);margin:0;background:#fff}
main{max-width:1240px;margin:0 auto;padding:20px 28px 48px}
h1{font-size:22px;margin:0 0 4px}
h2{font-size:17px;margin:28px 0 10px;border-bottom:1px solid var(--line);padding-bottom:4px}
.muted{color:var(--muted)} .small{font-size:12px}
.banner{border-radius:8px;padding:12px 16px;margin:14px 0;font-size:15px}
.banner.bad{background:#fef2f2;border:1px solid #fecaca;color:#7f1d1d}
.banner.good{background:#f0fdf4;border:1px solid #bbf7d0;color:#14532d}
.chips{display:flex;flex-wrap:wrap;gap:8px;margin:8px 0 4px}
.chip{background:var(--card);border:1px solid var(--line);border-radius:999px;padding:3px 11px;font-size:13px}
.chip b{font-variant-numeric:tabular-nums}
.card{border:1px solid var(--line);border-left:5px solid #94a3b8;border-radius:8px;padding:12px 16px;margin:10px 0;
  background:#fff}
.card.own{border-left-color:#dc2626} .card.nonfinite{border-left-color:#7f1d1d}
.card.unpaired{border-left-color:#d97706} .card.inherited{border-left-color:#94a3b8}
.card.inputs{border-left-color:#2563eb} .b-inputs{background:#dbeafe;color:#1e40af}
.card h3{margin:0 0 6px;font-size:15px;font-family:ui-monospace,SFMono-Regular,Menlo,monospace;
  word-break:break-all}
.badge{display:inline-block;font:600 11px system-ui,sans-serif;text-transform:uppercase;letter-spacing:.03em;
  border-radius:4px;padding:1px 6px;margin-left:6px;vertical-align:2px}
.b-own{background:#fee2e2;color:#991b1b} .b-nonfinite{background:#7f1d1d;color:#fff}
.b-unpaired{background:#fef3c7;color:#92400e} .b-inherited{background:#e2e8f0;color:#334155}
.b-origin{background:#fee2e2;color:#991b1b} .b-latent{background:#fee2e2;color:#991b1b}
.b-amplifier{background:#ffedd5;color:#9a3412} .b-sensitive{background:#f1f5f9;color:#475569}
.card.amplifier{border-left-color:#fb923c} .card.sensitive{border-left-color:#cbd5e1}
.b-dir{background:#e0e7ff;color:#3730a3} .b-cat{background:#ecfeff;color:#155e75}
.facts{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:6px 0}
.facts dt{color:var(--muted)} .facts dd{margin:0}
.mono,code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:12.5px}
pre{background:var(--card);border:1px solid var(--line);border-radius:6px;padding:8px 10px;overflow-x:auto;
  margin:6px 0 0}
details summary{cursor:pointer;color:#1d4ed8;margin-top:6px}
.advice{margin:8px 0 0;padding:8px 12px;background:#fffbeb;border-radius:6px;border:1px solid #fde68a}
table.rows{border-collapse:collapse;width:100%;font-size:12.5px}
table.rows th,table.rows td{border-bottom:1px solid var(--line);padding:4px 6px;text-align:left;vertical-align:top}
table.rows th{background:var(--card);position:sticky;top:0}
table.rows tr.differs td{background:#fff4e5}
table.rows td.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums;
  font-family:ui-monospace,monospace}
table.rows td.name{font-family:ui-monospace,monospace;word-break:break-all}
.plot{display:block;margin:6px 0 14px;border:1px solid var(--line);border-radius:8px;background:#fff}
.plot .grid{stroke:#eef2f7} .plot .tick{font-size:11px;fill:#64748b}
.plot .axis{font-size:12px;fill:#475569} .plot .ptitle{font-size:14px;font-weight:600;fill:#0f172a}
.plot .legend{font-size:12px;fill:#334155}
.plot .mark{font-size:12px;font-weight:600;paint-order:stroke;stroke:#fff;stroke-width:3px;stroke-linejoin:round}
.plot .hover{fill:transparent} .plot .hover:hover{fill:#0f172a;fill-opacity:.06}
.plot .muted{fill:#94a3b8}
footer{margin-top:30px;color:var(--muted);font-size:12px}
"""


def api_series(table: pd.DataFrame, direction: str, optimizer: Optional[bool] = None
               ) -> Tuple[List[str], np.ndarray, np.ndarray, np.ndarray]:
    """Per API of ``direction`` (NPU side, execution order): names, 1-cosine, relative error, failing.

    ``optimizer``: True keeps only calls made inside ``Optimizer.step``, False leaves them out,
    None keeps all. Each value is the largest over the API's output tensors; NaN when none was
    compared, inf when NaN/Inf positions differ.
    """
    t = schema.CompareTable.of(table)
    sel = t[schema.DIRECTION] == direction
    if optimizer is not None:
        in_opt = t[schema.CTX] == schema.OPTIMIZER
        sel = sel & (in_opt if optimizer else ~in_opt)
    sel = sel & ((t[schema.NPU_NAME] != "") | t[schema.PAIRED])
    if not sel.any():
        return [], np.array([]), np.array([]), np.array([], dtype=bool)
    paired = t[schema.PAIRED][sel]
    out = (t[schema.IO][sel] == schema.OUTPUT) & paired
    cos = t[schema.COSINE][sel]   # all NaN in a summary compare (no such column)
    one_minus = np.clip(1.0 - cos, 0.0, None)
    one_minus = np.where(out, np.where(one_minus < 1e-15, 0.0, one_minus), np.nan)  # float64 ulps
    rel = np.where(out, np.abs(t[schema.REL_L2][sel]), np.nan)
    nanm = t[schema.NAN_MISMATCH][sel] & out
    one_minus = np.where(nanm, np.inf, one_minus)
    rel = np.where(nanm, np.inf, rel)
    fail = out & ~t[schema.PASSED][sel]
    frame = pd.DataFrame({"api": t[schema.API][sel], "order": t.floats(schema.ORDER)[sel],
                          "c": one_minus, "r": rel, "f": fail})
    g = frame.groupby("api", sort=False).agg(order=("order", "min"), c=("c", "max"),
                                              r=("r", "max"), f=("f", "any"))
    g = g.sort_values("order", kind="stable")
    return list(g.index), g["c"].to_numpy(float), g["r"].to_numpy(float), g["f"].to_numpy(bool)


def _plot(table: pd.DataFrame, advice: Advice, direction: str, optimizer: bool = False) -> str:
    names, c, r, f = api_series(table, direction, optimizer)
    if optimizer and not names:
        return ""
    pos = {n: i for i, n in enumerate(names)}
    marks: List[Mark] = []
    for k, s in enumerate(advice.root_causes, 1):
        if s.direction == direction and s.api in pos and len(marks) < 3:
            colour = "#b91c1c" if k == 1 else "#9333ea"
            marks.append(Mark(pos[s.api], f"#{k} {s.api}", colour))
    series = [Series("1 \u2212 cosine", list(c)), Series("relative error (L2)", list(r))]
    if schema.is_summary(table) or not np.isfinite(c).any():  # summary compare: no cosine
        series = series[1:]
    first = advice.first
    shade = pos.get(first.api) if first is not None and first.direction == direction else None
    data = PlotData(names=names, series=series, failing=list(f), marks=marks, shade_from=shade)
    if optimizer:
        return error_plot(data, "Optimizer step: error of each call's outputs vs the bench",
                          x_label="optimizer API call, in execution order")
    return error_plot(data, f"{direction.capitalize()}: error of each call's outputs vs the bench",
                      x_label=f"{direction} API call, in execution order")


def _chip(label: str, value: object) -> str:
    return f'<span class="chip">{escape(label)} <b>{escape(str(value))}</b></span>'


def _suspect_card(rank: int, s: Suspect) -> str:
    kind_label = {"own": "own error", "nonfinite": "NaN/Inf appears", "unpaired":
                  f"only on the {at.side_word(s.side) or 'one'} side", "inherited": "inherited",
                  "inputs": "inputs differ at the start"}.get(s.kind, s.kind)
    kind_label = {"amplifier": "amplifies earlier error", "latent": "origin, passes its dtype",
                  "sensitive": "branch flips"}.get(s.role, kind_label)
    facts = [("where", f'<span class="mono">{escape(s.location)}</span>'),
             ("CSV line", str(s.csv_line))]
    err = s.error_text(arrow="\u2192")   # only what is known
    if err:
        facts.insert(0, ("error", escape(err[len("error "):])))
    if s.ctx:
        facts.append(("context", escape(s.ctx)))
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
    stack = at.format_stack(s.stack)
    st = (f"<details><summary>call stack ({len(s.stack or [])} frames)</summary>"
          f"<pre>{escape(stack)}</pre></details>") if stack else ""
    return (f'<div class="card {s.kind} {s.role}"><h3>#{rank} {escape(s.api)}'
            f'<span class="badge b-{s.role or s.kind}">{escape(kind_label)}</span>'
            f'{_replay_badge(s)}<span class="badge b-dir">{escape(s.direction)}</span>'
            f'<span class="badge b-cat">{escape(s.category)}</span></h3>'
            f'<dl class="facts">{dl}</dl><div class="advice">{escape(s.advice)}</div>{st}</div>')


def _replay_badge(s: Suspect) -> str:
    label = {"own": "replay: own error", "inherited": "replay: inherited",
             "unknown": "replay: not re-run"}.get(getattr(s, "replay", ""), "")
    cls = {"own": "b-own", "inherited": "b-inherited"}.get(s.replay, "b-sensitive")
    return f'<span class="badge {cls}">{escape(label)}</span>' if label else ""


def _replay_html(advice: Advice) -> str:
    """The replay check's verdicts (empty when it did not run)."""
    verdicts = getattr(advice, "replay", None) or []
    if not verdicts:
        return ""
    rows = []
    for v in verdicts:
        cells = [f'<td class="name">{escape(v.api)}</td>', f"<td>{escape(v.verdict)}</td>",
                 f'<td class="num">{escape(fmt_error(v.own_error))}</td>',
                 f'<td class="num">{escape(fmt_error(v.observed_error))}</td>',
                 f'<td class="num">{escape(fmt_error(v.oracle_error))}</td>',
                 f"<td>{escape(v.reason)}</td>"]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return ("<h2>Replay check</h2><p class=\"muted\">Each suspect re-run alone on the bench device "
            "from the device-under-test's own inputs: an API whose result still differs is imprecise "
            "by itself; one the re-run reproduces only passes on (or amplifies) a difference of its "
            "inputs.</p>"
            '<table class="rows"><thead><tr><th>API</th><th>verdict</th><th>error on identical inputs</th>'
            "<th>error between the runs</th><th>vs float64 oracle</th><th>why</th></tr></thead>"
            f"<tbody>{''.join(rows)}</tbody></table>")


def _known(text: str) -> str:
    """An unknown number is left blank, never written as filler."""
    return "" if text == "n/a" else text


def _inherited_row(s: Suspect) -> str:
    badge = {"negligible": ' <span class="badge b-sensitive">negligible</span>'}.get(s.role, "")
    if s.kind == "unpaired":
        badge += f' <span class="badge b-unpaired">only on the {escape(at.side_word(s.side))} side</span>'
    elif s.replay == "inherited":
        badge += ' <span class="badge b-inherited">within budget on replay</span>'
    cells = [f'<td class="name">{escape(s.api)}{badge}</td>',
             f'<td class="num">{s.csv_line or ""}</td>',
             f'<td class="num">{escape(_known(fmt_error(s.input_error)))}</td>',
             f'<td class="num">{escape(_known(fmt_error(s.output_error)))}</td>',
             f'<td class="num">{escape(_known(s.growth_text))}</td>',
             f'<td class="mono">{escape(s.location)}</td>']
    return "<tr>" + "".join(cells) + "</tr>"


def _failing_rows(table: pd.DataFrame) -> str:
    t = schema.CompareTable.of(table)
    bad = np.flatnonzero(t[schema.PAIRED] & ~t[schema.PASSED])
    if len(bad) == 0:
        return '<p class="muted">No row fails.</p>'
    metric = schema.SUMMARY_DIFF_COLUMNS if t.summary else schema.METRIC_COLUMNS
    cols = [schema.NPU_NAME, schema.BENCH_NAME] + metric + [schema.ERR_MESSAGE]
    fractions = (schema.ONE_THOUSANDTH, schema.FIVE_THOUSANDTHS)
    head = "".join(f"<th>{escape(c)}{' (pass fraction)' if c in fractions else ''}</th>" for c in ["line"] + cols)
    cells_of = {c: t.objects(c) for c in cols}
    body = []
    for i in bad[:MAX_FAILING_ROWS]:
        cells = [f'<td class="num">{i + 2}</td>']
        for c in cols:
            cls = "name" if c in (schema.NPU_NAME, schema.BENCH_NAME) else ("" if c == schema.ERR_MESSAGE else "num")
            cells.append(f'<td class="{cls}">{escape(_known(fmt_number(cells_of[c][i])))}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    more = (f'<p class="muted">... and {len(bad) - MAX_FAILING_ROWS} more failing rows in the CSV.</p>'
            if len(bad) > MAX_FAILING_ROWS else "")
    return f'<table class="rows"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>{more}'


def _environment_rows(device: Optional[Dict[str, Any]], bench: Optional[Dict[str, Any]]) -> List[tuple]:
    """``(what, device's, bench's)`` of the two runs' arithmetic environments, a few rows."""
    def row(env: Optional[Dict[str, Any]], get: Any) -> str:
        if not env:
            return "not recorded"
        try:
            v = get(env)
        except (AttributeError, KeyError, TypeError):
            v = None
        return "not recorded" if v is None else str(v)

    def acc(env: Dict[str, Any]) -> Any:
        a = env.get("accelerator")
        return f"{a.get('name') or a.get('type')} ({a.get('type')})" if isinstance(a, dict) else "none"

    def flag(name: str) -> Any:
        return lambda env: (env.get("flags") or {}).get(name)

    items = [("computed on", compute_device), ("accelerator", acc), ("float32 matmul/conv/RNN", fp32_words),
             ("torch", lambda env: env["versions"]["torch"]),
             ("CUDA", lambda env: env["versions"].get("cuda") or "none"),
             ("torch_npu / CANN", lambda env: (f"{env['versions']['torch_npu']} / {env['versions'].get('cann')}"
                                               if env["versions"].get("torch_npu") else "none")),
             ("deterministic algorithms", flag("deterministic_algorithms")),
             ("cuDNN benchmark", flag("cudnn.benchmark")),
             ("autocast at start", lambda env: ", ".join(f"{k}: {v}" for k, v in env["autocast"].items()) or "off")]
    return [(what, row(device, get), row(bench, get)) for what, get in items]


def _environment_html(environments: Optional[Tuple[Any, Any]]) -> str:
    if not environments or not any(environments):
        return ""
    marked = ' class="differs"'
    rows = "".join(
        f'<tr{marked if d != b else ""}><td>{escape(w)}</td><td class="mono">{escape(d)}</td>'
        f'<td class="mono">{escape(b)}</td></tr>' for w, d, b in _environment_rows(*environments))
    return ("<h2>Arithmetic environments</h2><p class=\"muted small\">What each run's manifest recorded; "
            "the judgement budgets each call in the float32 mode its device allowed. Rows that differ "
            "are marked.</p>"
            '<table class="rows"><thead><tr><th></th><th>device</th><th>bench</th></tr></thead>'
            f"<tbody>{rows}</tbody></table>")


def render_html(table: pd.DataFrame, advice: Advice, title: str = "pytest-ptdbg compare report",
                sources: Optional[Dict[str, str]] = None,
                environments: Optional[Tuple[Any, Any]] = None) -> str:
    """The report's HTML text (``environments``: the device's and the bench's recorded arithmetic
    environments, shown side by side)."""
    decision = advice.decision   # the verdict and first suspect every output says
    first = decision.first
    if first is None and advice.n_compared == 0:
        banner = ('<div class="banner bad"><b>Nothing was compared.</b> No tensor of the device dump '
                  "has a partner in the bench dump: check the paths, the dump mode and the step.</div>")
    elif first is None and decision.passed and not advice.suspects and not advice.n_failed:
        banner = ('<div class="banner good"><b>Everything agrees.</b> Every compared tensor matches '
                  "the bench under the verdict rule; no API lost precision.</div>")
    elif first is None and decision.passed:
        banner = (f'<div class="banner good"><b>Passed.</b> {escape(advice.passed_text())}</div>')
    elif first is None:
        banner = ('<div class="banner bad"><b>Failed.</b> No call is a suspect: the data could not '
                  "be used (see the advisor file and the CSV's Err_message).</div>")
    else:
        what = {"own": "loses precision here", "nonfinite": "first produces NaN/Inf",
                "unpaired": "exists on one side only",
                "inputs": "already receives inputs that differ at the start (the data, the "
                          "weights or the random state differ)",
                "inherited": "already receives differing inputs"}.get(first.kind, first.kind)
        what = {"latent": "creates the error that fails later (within its own dtype's tolerance)",
                "sensitive": "flips a few elements on tiny input differences",
                "negligible": "fails the rule with a negligible difference"}.get(first.role, what)
        banner = (f'<div class="banner bad"><b>First suspect:</b> <span class="mono">'
                  f"{escape(first.api)}</span> {escape(what)}. Kind: {escape(first.category)}. "
                  f'At <span class="mono">{escape(first.location)}</span>.</div>')
    chips = "".join([
        _chip("tensor rows", advice.n_rows), _chip("compared", advice.n_compared),
        _chip("verdict", "passed" if decision.passed else "failed"),
        _chip("failing rows", advice.n_failed),
        _chip("suspects", 0 if decision.passed else max(advice.n_root_causes, len(decision.root_causes))),
        _chip("inherited", advice.n_inherited), _chip("unpaired calls", advice.n_unpaired),
        _chip("mode", "summary (statistics)" if schema.is_summary(table) else "full tensors"),
    ])
    src = ""
    if sources:
        src = "".join(f'<div class="small muted">{escape(k)}: <span class="mono">{escape(v)}</span></div>'
                      for k, v in sources.items())
    roots = decision.root_causes
    cards = "".join(_suspect_card(i, s) for i, s in enumerate(roots, 1)) or \
        '<p class="muted">No suspect.</p>'
    inh = [s for s in advice.suspects if s.kind == "inherited"]
    inh_html = ""
    if decision.passed and advice.suspects:
        rows = "".join(_inherited_row(s) for s in advice.suspects)
        inh_html = (
            "<h2>Differences the verdict explains</h2><p class=\"muted\">The comparison passed: "
            "these calls differ from the bench, but pass on differences they received, stay "
            "within their own-error budget, or run on one side only as bookkeeping. Not root "
            "causes.</p>"
            '<table class="rows"><thead><tr><th>API</th><th>line</th><th>input error</th>'
            "<th>output error</th><th>growth</th><th>where</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>")
    elif inh:
        rows = "".join(_inherited_row(s) for s in inh)
        more = advice.n_inherited - len(inh)
        inh_html = (
            "<h2>Inherited errors</h2><p class=\"muted\">These calls fail only because their inputs "
            "already differ; their own error growth is small. Not root causes. Calls marked "
            "negligible fail the rule with an error at noise level.</p>"
            '<table class="rows"><thead><tr><th>API</th><th>line</th><th>input error</th>'
            "<th>output error</th><th>growth</th><th>where</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>"
            + (f'<p class="muted">... and {more} more.</p>' if more > 0 else ""))
    plots = (_plot(table, advice, schema.FORWARD) + _plot(table, advice, schema.BACKWARD)
             + _plot(table, advice, schema.FORWARD, optimizer=True))
    now = _dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title><style>{_CSS}</style></head>
<body><main>
<h1>{escape(title)}</h1><div class="small muted">generated {now} by pytest-ptdbg</div>{src}
{banner}<div class="chips">{chips}</div>
<h2>Suspects, most likely root cause first</h2>{cards}
{_replay_html(advice)}
<h2>Where the two runs part</h2>
<p class="muted small">Each point is one API call, in execution order; the value is the largest error
among its outputs (1 &minus; cosine and relative L2 error, log scale). Red rings fail the verdict,
dashed lines mark the suspects, triangles on the top edge are NaN/Inf that the bench does not have.
Hover a point for its name.</p>
{plots}
{inh_html}
{_environment_html(environments)}
<h2>Failing rows</h2>{_failing_rows(table)}
<footer><p>{escape(PASS_FRACTION_NOTE)}</p>
<p>An API's error is the largest of 1 &minus; cosine and the relative L2 error over its tensors; its
growth is output error / input error (backward: the incoming gradient and the forward tensors of the
same call count as inputs). "Own error" needs a failing output and growth &ge; {MIN_GROWTH:g}.</p></footer>
</main></body></html>
"""


def write_html(table: pd.DataFrame, advice: Advice, path: str,
               title: str = "pytest-ptdbg compare report",
               sources: Optional[Dict[str, str]] = None) -> str:
    """Write the self-contained HTML report to a new file ``path`` (never over an existing file or
    link); returns ``path``."""
    return write_new(path, render_html(table, advice, title, sources))
