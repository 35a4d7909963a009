"""Charts as inline SVG text: line charts and bar charts, no scripts, no fonts to fetch.

Every chart is an ``<svg class="plot" data-plot=NAME>`` with a title, axes with round
ticks, a legend, and optional reference lines (the knee, the peak demand, an SLO bound).
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

PALETTE = ("#3b6fd8", "#d9480f", "#2b8a3e", "#7048e8", "#c2255c", "#0c8599")

Point = tuple[float, float]


@dataclass(frozen=True)
class Line:
    """One series of a line chart."""

    label: str
    points: list[Point]
    color: str = PALETTE[0]
    dashed: bool = False
    markers: bool = True


@dataclass(frozen=True)
class Rule:
    """A reference line across the plot: vertical at x, or horizontal at y."""

    label: str
    value: float
    axis: str = "x"
    color: str = "#667085"


@dataclass(frozen=True)
class Frame:
    """Size and axis labels of a chart."""

    name: str
    title: str
    x_label: str
    y_label: str
    width: int = 520
    height: int = 300
    y_min: float | None = 0.0
    y_max: float | None = None
    x_format: Callable[[float], str] = field(default=lambda v: f"{v:g}")
    y_format: Callable[[float], str] = field(default=lambda v: f"{v:g}")


_LEFT, _RIGHT, _TOP, _BOTTOM = 58, 16, 48, 44


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2, 5 × 10^k steps) covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks = []
    v = first
    while v <= hi + step * 1e-9:
        ticks.append(round(v, 12))
        v += step
    return ticks


def _esc(text: str) -> str:
    return html.escape(text, quote=True)


def _open(frame: Frame) -> list[str]:
    return [
        f'<svg class="plot" data-plot="{_esc(frame.name)}" role="img" '
        f'aria-label="{_esc(frame.title)}" width="{frame.width}" height="{frame.height}" '
        f'viewBox="0 0 {frame.width} {frame.height}">',
        f"<title>{_esc(frame.title)}</title>",
        f'<text x="{_LEFT}" y="18" class="t">{_esc(frame.title)}</text>',
    ]


def _legend(items: Sequence[tuple[str, str, bool]], frame: Frame) -> list[str]:
    out, x = [], float(_LEFT)
    for label, color, dashed in items:
        dash = ' stroke-dasharray="5 3"' if dashed else ""
        out.append(
            f'<line x1="{x:.0f}" y1="33" x2="{x + 16:.0f}" y2="33" stroke="{color}" '
            f'stroke-width="2.5"{dash}/>'
            f'<text x="{x + 20:.0f}" y="37" class="l">{_esc(label)}</text>'
        )
        x += 28 + 6.6 * len(label)
        if x > frame.width - 60:
            break
    return out


def _axes(
    frame: Frame, xs: tuple[float, float], ys: tuple[float, float]
) -> tuple[list[str], Callable[[float], float], Callable[[float], float]]:
    (x0, x1), (y0, y1) = xs, ys
    pw = frame.width - _LEFT - _RIGHT
    ph = frame.height - _TOP - _BOTTOM

    def sx(v: float) -> float:
        return _LEFT + pw * (v - x0) / (x1 - x0)

    def sy(v: float) -> float:
        return _TOP + ph - ph * (v - y0) / (y1 - y0)

    out = [
        f'<rect x="{_LEFT}" y="{_TOP}" width="{pw}" height="{ph}" fill="#fbfcfe" stroke="#d0d5dd"/>'
    ]
    out.extend(
        f'<line x1="{sx(t):.1f}" y1="{_TOP}" x2="{sx(t):.1f}" y2="{_TOP + ph}" '
        f'stroke="#eef0f4"/><text x="{sx(t):.1f}" y="{_TOP + ph + 15}" '
        f'text-anchor="middle" class="k">{_esc(frame.x_format(t))}</text>'
        for t in nice_ticks(x0, x1)
        if x0 - 1e-12 <= t <= x1 + 1e-12
    )
    out.extend(
        f'<line x1="{_LEFT}" y1="{sy(t):.1f}" x2="{_LEFT + pw}" y2="{sy(t):.1f}" '
        f'stroke="#eef0f4"/><text x="{_LEFT - 6}" y="{sy(t) + 4:.1f}" '
        f'text-anchor="end" class="k">{_esc(frame.y_format(t))}</text>'
        for t in nice_ticks(y0, y1)
        if y0 - 1e-12 <= t <= y1 + 1e-12
    )
    out.append(
        f'<text x="{_LEFT + pw / 2:.0f}" y="{frame.height - 8}" text-anchor="middle" '
        f'class="a">{_esc(frame.x_label)}</text>'
        f'<text x="14" y="{_TOP + ph / 2:.0f}" text-anchor="middle" class="a" '
        f'transform="rotate(-90 14 {_TOP + ph / 2:.0f})">{_esc(frame.y_label)}</text>'
    )
    return out, sx, sy


def _span(values: list[float], lo: float | None, hi: float | None) -> tuple[float, float]:
    finite = [v for v in values if math.isfinite(v)]
    a = lo if lo is not None else (min(finite) if finite else 0.0)
    b = hi if hi is not None else (max(finite) * 1.08 if finite else 1.0)
    if b <= a:
        b = a + (abs(a) or 1.0)
    return a, b


_RULE_CHAR_PX, _RULE_LINE_PX = 6.4, 13.0
"""A rule label's width per character and its line height, at 11 px (a little wide: a
label is placed by its estimate, and an estimate too narrow would let two touch)."""

Box = tuple[float, float, float, float]


def _clear(box: Box, placed: list[Box]) -> bool:
    x0, y0, x1, y1 = box
    return all(x1 <= a or b <= x0 or y1 <= c or d <= y0 for a, c, b, d in placed)


def _rule_marks(
    frame: Frame, rules: Sequence[Rule], sx: Callable[[float], float], sy: Callable[[float], float]
) -> list[str]:
    """The rules' lines and labels, each label where it overlaps no label placed before
    it: a vertical rule's beside its line at the top (flipped left of the line at the
    right edge), stepping down a line at a time; a horizontal rule's above its line at
    the right, else below it, else further left."""
    left, right = float(_LEFT), float(frame.width - _RIGHT)
    top, bottom = float(_TOP), float(frame.height - _BOTTOM)
    placed: list[Box] = []
    out = []
    for rule in rules:
        width = _RULE_CHAR_PX * len(rule.label)
        if rule.axis == "x":
            x = sx(rule.value)
            flip = x + 4 + width > right
            x0 = x - 4 - width if flip else x + 4
            baseline = top + 12
            while not _clear((x0, baseline - 10, x0 + width, baseline + 3), placed):
                if baseline + _RULE_LINE_PX > bottom:
                    break
                baseline += _RULE_LINE_PX
            anchor = ' text-anchor="end"' if flip else ""
            tx = x - 4 if flip else x + 4
            line = (
                f'<line x1="{x:.1f}" y1="{top:.0f}" x2="{x:.1f}" y2="{bottom:.0f}" '
                f'stroke="{rule.color}" stroke-width="1.5" stroke-dasharray="4 3"/>'
            )
        else:
            y = sy(rule.value)
            x0, baseline = right - 4 - width, y - 4
            for candidate in (y - 4, y + 13):
                if _clear((x0, candidate - 10, x0 + width, candidate + 3), placed):
                    baseline = candidate
                    break
            else:
                while x0 > left and not _clear((x0, baseline - 10, x0 + width, baseline + 3),
                                               placed):  # fmt: skip
                    x0 -= _RULE_CHAR_PX
            anchor, tx = "", x0
            line = (
                f'<line x1="{left:.0f}" y1="{y:.1f}" x2="{right:.0f}" y2="{y:.1f}" '
                f'stroke="{rule.color}" stroke-width="1.2" stroke-dasharray="2 3"/>'
            )
        placed.append((x0, baseline - 10, x0 + width, baseline + 3))
        out.append(
            f'{line}<text x="{tx:.1f}" y="{baseline:.1f}"{anchor} class="r" '
            f'fill="{rule.color}">{_esc(rule.label)}</text>'
        )
    return out


def line_chart(frame: Frame, lines: Sequence[Line], rules: Sequence[Rule] = ()) -> str:
    """A line chart with markers, a legend and reference rules."""
    pts = [p for line in lines for p in line.points if math.isfinite(p[0]) and math.isfinite(p[1])]
    xr = [p[0] for p in pts] + [r.value for r in rules if r.axis == "x"]
    yr = [p[1] for p in pts] + [r.value for r in rules if r.axis == "y"]
    xs = _span(xr, min(xr) if xr else 0.0, max(xr) * 1.04 if xr else 1.0)
    ys = _span(yr, frame.y_min, frame.y_max)
    out = _open(frame)
    axes, sx, sy = _axes(frame, xs, ys)
    out += axes
    out += _rule_marks(frame, rules, sx, sy)
    for line in lines:
        good = [
            (sx(x), sy(min(max(y, ys[0]), ys[1])))
            for x, y in line.points
            if math.isfinite(x) and math.isfinite(y)
        ]
        if not good:
            continue
        dash = ' stroke-dasharray="6 4"' if line.dashed else ""
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in good)
        out.append(
            f'<polyline class="series" fill="none" stroke="{line.color}" stroke-width="2"'
            f'{dash} points="{path}"/>'
        )
        if line.markers:
            out.extend(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.8" fill="{line.color}"/>' for x, y in good
            )
    out += _legend([(line.label, line.color, line.dashed) for line in lines], frame)
    out.append("</svg>")
    return "".join(out)


def bar_chart(
    frame: Frame, categories: Sequence[str], series: Sequence[tuple[str, list[float | None]]]
) -> str:
    """Grouped vertical bars: one group per category, one bar per series."""
    values = [v for _, vs in series for v in vs if v is not None and math.isfinite(v)]
    ys = _span(values, frame.y_min, frame.y_max)
    n = max(1, len(categories))
    out = _open(replace(frame, height=frame.height + 34))  # room for slanted labels
    axes, _, sy = _axes(frame, (0.0, 1.0), ys)
    out += [a for a in axes if 'text-anchor="middle" class="k"' not in a]
    pw = frame.width - _LEFT - _RIGHT
    group_w = pw / n
    bar_w = group_w * 0.8 / max(1, len(series))
    for i, cat in enumerate(categories):
        gx = _LEFT + group_w * i + group_w * 0.1
        for j, (_, vs) in enumerate(series):
            v = vs[i] if i < len(vs) else None
            if v is None or not math.isfinite(v):
                continue
            top = sy(min(v, ys[1]))
            out.append(
                f'<rect class="series" x="{gx + bar_w * j:.1f}" y="{top:.1f}" '
                f'width="{bar_w - 1:.1f}" height="{max(0.5, sy(ys[0]) - top):.1f}" '
                f'fill="{PALETTE[j % len(PALETTE)]}"><title>{_esc(cat)}: {v:.3g}</title></rect>'
            )
        lx, ly = gx + group_w * 0.4, frame.height - _BOTTOM + 12
        out.append(
            f'<text x="{lx:.1f}" y="{ly:.1f}" text-anchor="end" class="k" '
            f'transform="rotate(-25 {lx:.1f} {ly:.1f})">{_esc(cat[:14])}</text>'
        )
    out += _legend(
        [(name, PALETTE[j % len(PALETTE)], False) for j, (name, _) in enumerate(series)], frame
    )
    out.append("</svg>")
    return "".join(out)
