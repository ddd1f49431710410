"""An inline SVG line plot of error along execution order, log scale (no plotting library).

``error_plot(series, ...)`` draws one panel: x = API call in execution order, y = error on a
log10 axis; values <= 0 sit on the floor, non-finite values (NaN/Inf appeared) on the ceiling
as triangles; failing calls get a red ring; marked calls get a labelled vertical line, and the
part from ``shade_from`` on is shaded so the point where the two runs part stands out.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape
from typing import List, Optional, Sequence, Tuple

#: (colour, label) of each series, in drawing order
PALETTE = ("#2563eb", "#ea580c", "#059669", "#7c3aed")


@dataclass
class Series:
    label: str
    values: Sequence[Optional[float]]  # one per call; None or NaN = unknown (gap), inf = NaN/Inf appeared
    colour: str = ""


@dataclass
class Mark:
    index: int
    label: str
    colour: str = "#b91c1c"


@dataclass
class PlotData:
    names: Sequence[str]
    series: List[Series]
    failing: Sequence[bool] = ()
    marks: List[Mark] = field(default_factory=list)
    shade_from: Optional[int] = None  # shade from this call on (where the runs part)


def _decades(values: Sequence[Sequence[Optional[float]]]) -> Tuple[int, int]:
    pos = [v for s in values for v in s if v is not None and math.isfinite(v) and v > 0]
    if not pos:
        return -8, 0
    lo = max(-16, math.floor(math.log10(min(pos))))
    hi = max(0, math.ceil(math.log10(max(pos))))
    if hi - lo < 2:
        lo = hi - 2
    return lo, hi


def _tip_value(v: Optional[float]) -> str:
    return f"{v:.2e}" if isinstance(v, float) and math.isfinite(v) else f"{v}"


def _nice_step(n: int, target: int = 10) -> int:
    raw = max(1, n / target)
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * mag >= raw:
            return int(m * mag)
    return int(10 * mag)


def error_plot(data: PlotData, title: str, width: int = 1180, height: int = 300,
               x_label: str = "API call, in execution order") -> str:
    """The SVG text of one panel."""
    n = len(data.names)
    ml, mr, mt, mb = 64, 16, 34, 44
    pw, ph = width - ml - mr, height - mt - mb
    out: List[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="100%" role="img" aria-label="{escape(title)}" class="plot">',
        f'<text x="{ml}" y="20" class="ptitle">{escape(title)}</text>',
    ]
    if n == 0:
        out.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" class="muted">'
                   "no calls in this direction</text></svg>")
        return "".join(out)
    lo, hi = _decades([s.values for s in data.series])
    step = 1 if hi - lo <= 10 else 2
    lo = hi - step * math.ceil((hi - lo) / step)  # ticks from the floor to the ceiling

    def xs(i: float) -> float:
        return ml + (pw * (i + 0.5) / n)

    def ys(v: float) -> float:
        if not math.isfinite(v):
            return mt
        lv = math.log10(v) if v > 0 else lo
        lv = min(max(lv, lo), hi)
        return mt + ph * (hi - lv) / (hi - lo)

    # shaded region after the first mark, frame, grid
    if data.shade_from is not None:
        x0 = xs(data.shade_from) - pw / n / 2
        out.append(f'<rect x="{x0:.1f}" y="{mt}" width="{ml + pw - x0:.1f}" height="{ph}" '
                   'fill="#fee2e2" opacity="0.55"/>')
    out.append(f'<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#cbd5e1"/>')
    for d in range(lo, hi + 1, step):
        y = ys(10.0 ** d)
        out.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        lab = "0 / \u2264" if d == lo else ""
        out.append(f'<text x="{ml - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">'
                   f'{lab}1e{d}</text>')
    xstep = _nice_step(n)
    for i in range(0, n, xstep):
        x = xs(i)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{mt + ph}" y2="{mt + ph + 4}" stroke="#94a3b8"/>')
        out.append(f'<text x="{x:.1f}" y="{mt + ph + 16}" text-anchor="middle" class="tick">{i}</text>')
    out.append(f'<text x="{ml + pw / 2}" y="{height - 8}" text-anchor="middle" class="axis">'
               f'{escape(x_label)}</text>')
    out.append(f'<text x="14" y="{mt + ph / 2}" text-anchor="middle" class="axis" '
               f'transform="rotate(-90 14 {mt + ph / 2})">error (log)</text>')

    # series: polylines broken at unknown and non-finite values
    for k, s in enumerate(data.series):
        colour = s.colour or PALETTE[k % len(PALETTE)]
        seg: List[str] = []
        segs: List[List[str]] = []
        for i, v in enumerate(s.values):
            if v is None or not math.isfinite(v):  # unknown: a gap; NaN/Inf: a triangle
                if seg:
                    segs.append(seg)
                seg = []
                continue
            seg.append(f"{xs(i):.1f},{ys(v):.1f}")
        if seg:
            segs.append(seg)
        for sg in segs:
            if len(sg) == 1:
                cx, cy = sg[0].split(",")
                out.append(f'<circle cx="{cx}" cy="{cy}" r="2" fill="{colour}"/>')
            else:
                out.append(f'<polyline points="{" ".join(sg)}" fill="none" stroke="{colour}" '
                           'stroke-width="1.5" stroke-linejoin="round"/>')
        # non-finite on the ceiling
        for i, v in enumerate(s.values):
            if v is not None and isinstance(v, float) and math.isinf(v):
                x = xs(i)
                out.append(f'<path d="M{x - 5:.1f},{mt + 9} L{x + 5:.1f},{mt + 9} L{x:.1f},{mt + 1} Z" '
                           f'fill="#b91c1c"><title>{escape(data.names[i])}: NaN/Inf</title></path>')

    # failing calls: red rings (with a tooltip); hover targets for all calls when few
    fail_idx = [i for i, f in enumerate(data.failing) if f][:2000]
    for i in fail_idx:
        at_i = [s.values[i] for s in data.series]
        known = [v for v in at_i if v is not None and not math.isnan(v)]
        v = max(known) if known else float("nan")
        if not math.isfinite(v):  # unknown, or NaN/Inf (already a red triangle)
            continue
        out.append(f'<circle cx="{xs(i):.1f}" cy="{ys(v):.1f}" r="3.5" fill="none" stroke="#dc2626" '
                   f'stroke-width="1.3"><title>{escape(data.names[i])} (fails)</title></circle>')
    if n <= 3000:
        w = pw / n
        for i, name in enumerate(data.names):
            tip = ", ".join(f"{s.label} {_tip_value(s.values[i])}" for s in data.series)
            out.append(f'<rect x="{xs(i) - w / 2:.1f}" y="{mt}" width="{w:.2f}" height="{ph}" '
                       f'class="hover"><title>#{i} {escape(name)}: {escape(tip)}</title></rect>')

    # marks: dashed vertical line + label
    for j, m in enumerate(sorted(data.marks, key=lambda m: m.index)):
        x = xs(m.index)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{mt}" y2="{mt + ph}" stroke="{m.colour}" '
                   'stroke-width="1.6" stroke-dasharray="5 3"/>')
        anchor = "start" if x < ml + pw * 0.7 else "end"
        dx = 5 if anchor == "start" else -5
        ly = mt + 24 + 16 * (j % 3)
        out.append(f'<text x="{x + dx:.1f}" y="{ly}" text-anchor="{anchor}" class="mark" '
                   f'fill="{m.colour}">{escape(m.label)}</text>')

    # legend
    lx: float = ml + pw
    items = [(s.colour or PALETTE[k % len(PALETTE)], s.label) for k, s in enumerate(data.series)]
    for colour, label in reversed(items):
        tw = 8 + 6.6 * len(label)
        lx -= tw + 22
        out.append(f'<line x1="{lx:.1f}" x2="{lx + 16:.1f}" y1="16" y2="16" stroke="{colour}" '
                   'stroke-width="2.5"/>')
        out.append(f'<text x="{lx + 20:.1f}" y="20" class="legend">{escape(label)}</text>')
    lx -= 80
    out.append(f'<circle cx="{lx + 6:.1f}" cy="16" r="3.5" fill="none" stroke="#dc2626" stroke-width="1.3"/>')
    out.append(f'<text x="{lx + 14:.1f}" y="20" class="legend">fails</text>')
    out.append("</svg>")
    return "".join(out)
