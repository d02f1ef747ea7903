"""The HTML report's charts as inline SVG, each with labelled axes whose ticks carry their values, and every bar its
value written above it: a figure is read off the page, never only from a hover tooltip.

- `bars`: one bar per category (a latency histogram's bins, the cost of each stage or kind of charge);
- `steps`: a cumulative count over time (successful videos stored), drawn as steps: flat until each finish, then up
  by one. Nothing is drawn before the first finish but the count of 0 along the axis, so the line never suggests
  videos finished before any did.

Tick values are 1, 2 or 5 times a power of ten (the usual "nice numbers"), from 0 to the first tick at or above the
largest value.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable

W, H = 520, 220  # the whole chart, pixels
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 14, 46  # the plot's margins: room for tick labels and axis titles
PLOT_W, PLOT_H = W - LEFT - RIGHT, H - TOP - BOTTOM
TICKS = 5  # about how many steps an axis is cut into


def nice_ticks(top: float, count: int = TICKS, whole: bool = False) -> list[float]:
    """0, s, 2s, ... up to the first multiple of s at or above `top`, where s is 1, 2 or 5 x 10^k and about
    top / count (for a `top` of 0 or less: 0 and 1). `whole`: a count, so s is at least 1 (no tick at 0.5 videos)."""
    if top <= 0:
        return [0.0, 1.0]
    raw = max(top / count, 1.0) if whole else top / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw * (1 - 1e-9))
    n = math.ceil(top / step - 1e-9)
    return [round(i * step, 12) for i in range(n + 1)]


def number(value: float) -> str:
    """A tick's or a bar's value: at most 4 significant digits, no exponent below a million ("0.0005", "150")."""
    if value == 0:
        return "0"
    if abs(value) >= 1e6:
        return f"{value:.3g}"
    digits = max(0, 3 - math.floor(math.log10(abs(value))))
    return f"{value:.{digits}f}".rstrip("0").rstrip(".")


def _y(value: float, top: float) -> float:
    return TOP + PLOT_H * (1 - value / top)


def _frame(chart: str, x_title: str, y_title: str, y_ticks: list[float], x_ticks: list[tuple[float, str]],
           body: str) -> str:
    """The SVG around a plot: both axes, the y ticks (with light grid lines) and x ticks with their labels, the axis
    titles, and `body` (drawn in the plot's coordinates, y from TOP down)."""
    top = y_ticks[-1]
    parts = [(f'<svg class="chart" data-chart="{chart}" width="{W}" height="{H}" viewBox="0 0 {W} {H}" role="img" '
              f'aria-label="{html.escape(y_title)} by {html.escape(x_title)}" font-size="11">')]
    for t in y_ticks:
        y = _y(t, top)
        parts.append(f'<line x1="{LEFT}" x2="{LEFT + PLOT_W}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e4e4e4"/>'
                     f'<text class="tick y" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{number(t)}</text>')
    for x, label in x_ticks:
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{TOP + PLOT_H}" y2="{TOP + PLOT_H + 4}" stroke="#444"/>'
                     f'<text class="tick x" x="{x:.1f}" y="{TOP + PLOT_H + 16}" text-anchor="middle">'
                     f'{html.escape(label)}</text>')
    parts.append(body)
    parts.append(f'<line class="axis" x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{TOP + PLOT_H}" stroke="#444"/>'
                 f'<line class="axis" x1="{LEFT}" x2="{LEFT + PLOT_W}" y1="{TOP + PLOT_H}" y2="{TOP + PLOT_H}" '
                 f'stroke="#444"/>'
                 f'<text class="title x" x="{LEFT + PLOT_W / 2}" y="{H - 6}" text-anchor="middle">'
                 f'{html.escape(x_title)}</text>'
                 f'<text class="title y" transform="translate(14 {TOP + PLOT_H / 2}) rotate(-90)" '
                 f'text-anchor="middle">{html.escape(y_title)}</text></svg>')
    return "".join(parts)


def bars(chart: str, values: list[float], labels: list[str], x_title: str, y_title: str,
         value_text: Callable[[float], str] = number, whole: bool = False) -> str:
    """One bar per label, its value written above it as `value_text` writes it (the text report's format, so the
    page and the text agree). `whole`: the values are counts."""
    ticks = nice_ticks(max(values, default=0.0), whole=whole)
    top = ticks[-1]
    width = PLOT_W / max(len(values), 1)
    body, x_ticks = [], []
    for i, (value, label) in enumerate(zip(values, labels)):
        x, y = LEFT + i * width, _y(value, top)
        body.append(f'<rect x="{x + 3:.1f}" y="{y:.1f}" width="{max(width - 6, 1):.1f}" '
                    f'height="{TOP + PLOT_H - y:.1f}" fill="#4a7bd0"><title>{html.escape(label)}: {value_text(value)}'
                    f'</title></rect><text class="value" x="{x + width / 2:.1f}" y="{y - 3:.1f}" '
                    f'text-anchor="middle">{value_text(value)}</text>')
        x_ticks.append((x + width / 2, label))
    return _frame(chart, x_title, y_title, ticks, x_ticks, "".join(body))


def steps(chart: str, times: list[float], x_title: str, y_title: str) -> str:
    """How many of `times` (seconds from the origin) have passed, over time: 0 until the first, one more at each."""
    times = sorted(times)
    y_ticks = nice_ticks(len(times), whole=True)
    x_values = nice_ticks(times[-1] if times else 0.0)
    top, end = y_ticks[-1], x_values[-1]

    def x(t: float) -> float:
        return LEFT + PLOT_W * t / end

    points = [(x(0.0), _y(0, top))]
    for i, t in enumerate(times):
        points += [(x(t), _y(i, top)), (x(t), _y(i + 1, top))]
    line = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
    marks = "".join(f'<circle cx="{x(t):.1f}" cy="{_y(i + 1, top):.1f}" r="2.5" fill="#2a9d4b">'
                    f'<title>video {i + 1} stored at {number(t)} s</title></circle>' for i, t in enumerate(times))
    body = f'<polyline fill="none" stroke="#2a9d4b" stroke-width="2" points="{line}"/>{marks}'
    return _frame(chart, x_title, y_title, y_ticks, [(x(t), number(t)) for t in x_values], body)
